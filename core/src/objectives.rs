//! Multi-objective experiments (knob extension `objectives`): reading each listed metric from a
//! trial's final result, and the Pareto front of an experiment's trials.
//!
//! A trial reports its final result as a dict (`nni.report_final_result({"accuracy": 0.9,
//! "latency_ms": 12})`, `KNOB_FINAL {...}`, any protocol); each entry of `objectives` names one
//! of its keys. An entry with a `constraint` (`"<= 0"`, `">= 0.5"`) is a constraint, not an
//! objective: a trial that violates it is infeasible and never on the front. The arithmetic
//! (dominance, hypervolume) is `knob_plugin_api::objectives`, shared with the tuners.

use knob_plugin_api::metric::parse_lenient;
use knob_plugin_api::objectives::{default_reference, hypervolume, pareto_front};
use knob_plugin_api::Outcome;
use serde::Serialize;
use serde_json::Value;

use crate::config::{ConstraintOp, ObjectiveConfig};
use crate::store::{Direction, TrialStatus};

/// Why a final result gives no outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum OutcomeProblem {
    /// The result is an object without this key (or not an object at all when several
    /// objectives are listed).
    Missing { metric: String, listed: Vec<String> },
    /// The result is no object (a number, a list) while several objectives are listed: it is
    /// not one entry that is missing, but the dict. `reported` is the result as JSON.
    NotADict {
        reported: String,
        listed: Vec<String>,
    },
    /// The result or one of its entries cannot be read as a number.
    Unreadable(String),
}

impl std::fmt::Display for OutcomeProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `nni.report_final_result({"a": ..., "b": ...})` for the listed metrics.
        let example = |listed: &[String]| {
            let entries: Vec<String> = listed.iter().map(|m| format!("{m:?}: ...")).collect();
            format!("nni.report_final_result({{{}}})", entries.join(", "))
        };
        match self {
            OutcomeProblem::Missing { metric, listed } => write!(
                f,
                "final result has no {metric:?} entry (objectives lists {}); report a dict with every listed metric, e.g. {}",
                listed.join(", "),
                example(listed)
            ),
            OutcomeProblem::NotADict { reported, listed } => write!(
                f,
                "final result {reported} is not a dict of the objectives (objectives lists {}); report a dict with every listed metric, e.g. {}",
                listed.join(", "),
                example(listed)
            ),
            OutcomeProblem::Unreadable(reason) => f.write_str(reason),
        }
    }
}

/// How "best" is judged, the one rule of every surface that names a best trial (the manager's
/// progress and `knob create`'s summary, the store's `best_trials` and so the API, `--head`,
/// `knob top` and the notifications, and the dashboard through the API's `ranks`): a trial
/// ranks only when it ended SUCCEEDED with a finite final value and, with `objectives`, every
/// listed metric of its result reads as a finite number and every constraint is met. Then the
/// better value wins, and a tie goes to the earlier trial ([`best_first`]).
///
/// A final counts only once the trial succeeded: one that then exits non-zero, or is killed,
/// had been the "best" of the progress line and the e-mail while the store's list named
/// another. An infeasible result is never the best, whatever its first objective (Optuna's
/// `best_trials` leaves such trials out too), nor is one with a NaN in an objective other than
/// the first: neither is a configuration a user can take.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranking {
    pub direction: Direction,
    /// The experiment's `objectives` (empty without them: the final value alone decides).
    objectives: Vec<ObjectiveConfig>,
}

impl Ranking {
    pub fn new(direction: Direction, objectives: &[ObjectiveConfig]) -> Ranking {
        Ranking {
            direction,
            objectives: objectives.to_vec(),
        }
    }

    /// The ranking of a stored config (the JSON form the store keeps).
    pub fn of_config(config: &Value) -> Ranking {
        Ranking::new(Direction::of_config(config), &of_config(config))
    }

    /// Whether a trial ranks: see [`Ranking`]. `value` is its final's number (None: no final,
    /// or one without a usable number), `raw` the final as reported.
    pub fn ranks(&self, status: TrialStatus, value: Option<f64>, raw: Option<&str>) -> bool {
        status == TrialStatus::Succeeded && self.result_ranks(value, raw)
    }

    /// Whether a stored trial ranks.
    pub fn ranks_row(&self, trial: &crate::store::TrialRow) -> bool {
        self.ranks(trial.status, trial.final_value, trial.final_raw.as_deref())
    }

    /// Whether a final result may rank once its trial succeeds (what [`Ranking::ranks`] asks
    /// besides the status).
    pub fn result_ranks(&self, value: Option<f64>, raw: Option<&str>) -> bool {
        let Some(value) = value else {
            return false;
        };
        if self.objectives.is_empty() {
            return outcome_ranks(value, None);
        }
        match raw.map(|raw| outcome(&self.objectives, raw)) {
            Some(Ok(outcome)) => outcome_ranks(value, Some(&outcome)),
            _ => false,
        }
    }

    /// Whether a result's number alone does not say whether it ranks (the experiment lists
    /// objectives, so each result as reported is read): the store cannot filter them in SQL.
    pub fn reads_results(&self) -> bool {
        !self.objectives.is_empty()
    }

    /// The order of two ranking trials, `(final value, sequence)`, best first.
    pub fn best_first(&self, a: (f64, u64), b: (f64, u64)) -> std::cmp::Ordering {
        best_first(self.direction, a, b)
    }
}

/// Whether a final result may rank, read already: `value` is its number, `outcome` (with
/// `objectives`) every listed metric. The manager asks this when the final arrives, and
/// [`Ranking::result_ranks`] after reading a stored one: one rule for both.
pub fn outcome_ranks(value: f64, outcome: Option<&Outcome>) -> bool {
    value.is_finite()
        && outcome.is_none_or(|o| o.values.iter().all(|v| v.is_finite()) && o.is_feasible())
}

/// The order of two ranking trials, `(final value, sequence)`, best first in `direction`; of
/// two equal values the earlier trial (the lower sequence) first, whichever reported first:
/// the manager, the store and the dashboard all name the same trial then.
pub fn best_first(direction: Direction, a: (f64, u64), b: (f64, u64)) -> std::cmp::Ordering {
    let by_value = match direction {
        Direction::Maximize => b.0.total_cmp(&a.0),
        Direction::Minimize => a.0.total_cmp(&b.0),
    };
    by_value.then(a.1.cmp(&b.1))
}

/// Whether a final result (as reported) meets every constraint of `objectives`: true without
/// constraints, false for a result that cannot be read as every listed metric.
pub fn meets_constraints(objectives: &[ObjectiveConfig], raw: &str) -> bool {
    !objectives.iter().any(|o| o.constraint.is_some())
        || outcome(objectives, raw).is_ok_and(|o| o.is_feasible())
}

/// Whether these objectives make a multi-objective experiment: several objectives, or any
/// constraint. One plain objective is a single-objective experiment on that metric.
pub fn is_multi_objective(objectives: &[ObjectiveConfig]) -> bool {
    objectives.iter().filter(|o| o.constraint.is_none()).count() > 1
        || objectives.iter().any(|o| o.constraint.is_some())
}

/// Why a tuner that takes one objective cannot run an experiment with `objectives`.
pub fn single_objective_refusal(name: &str, objectives: &[ObjectiveConfig]) -> String {
    let count = |constraints: bool| {
        objectives
            .iter()
            .filter(|o| o.constraint.is_some() == constraints)
            .count()
    };
    let (goals, constraints) = (count(false), count(true));
    let plural = |n: usize, noun: &str| match n {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    };
    let listed = match constraints {
        0 => plural(goals, "objective"),
        n => format!(
            "{} and {}",
            plural(goals, "objective"),
            plural(n, "constraint")
        ),
    };
    format!(
        "tuner {name} optimises a single objective, and objectives lists {listed}; use NSGA2, TPE or Random, or a tuner that takes objectives"
    )
}

/// Reads every listed metric from a final result as sent (`raw`, NNI's JSON with NaN allowed).
/// A plain number is accepted only when a single metric is listed.
pub fn outcome(objectives: &[ObjectiveConfig], raw: &str) -> Result<Outcome, OutcomeProblem> {
    let value = parse_lenient(raw).map_err(OutcomeProblem::Unreadable)?;
    let listed = || objectives.iter().map(|o| o.metric.clone()).collect();
    if objectives.len() > 1 && !value.is_object() {
        // A long list is cut: the line names the problem, not the whole report.
        let mut reported = match &value {
            Value::String(s) if s == knob_plugin_api::metric::NAN => "NaN".to_string(),
            Value::String(s) if s == knob_plugin_api::metric::INF => "Infinity".to_string(),
            Value::String(s) if s == knob_plugin_api::metric::NEG_INF => "-Infinity".to_string(),
            other => other.to_string(),
        };
        if reported.chars().count() > 60 {
            reported = reported.chars().take(57).collect::<String>() + "...";
        }
        return Err(OutcomeProblem::NotADict {
            reported,
            listed: listed(),
        });
    }
    let mut values = Vec::with_capacity(objectives.len());
    for objective in objectives {
        let entry = match &value {
            Value::Object(map) => map.get(&objective.metric),
            scalar if objectives.len() == 1 => Some(scalar),
            _ => None,
        };
        let Some(entry) = entry else {
            return Err(OutcomeProblem::Missing {
                metric: objective.metric.clone(),
                listed: listed(),
            });
        };
        let number = knob_plugin_api::metric::default_value(&entry.to_string()).map_err(|_| {
            OutcomeProblem::Unreadable(format!(
                "final result's {:?} entry is not a number: {entry}",
                objective.metric
            ))
        })?;
        values.push(number);
    }
    Ok(outcome_of_values(objectives, values))
}

/// The number an intermediate result stands for in an experiment with `objectives` (what the
/// store records and an assessor judges): its `"default"` entry where it has one, else the first
/// objective's entry (the first listed without a constraint, as a final's recorded number is),
/// else a plain number as in any experiment. A trial reports its objectives as one dict, with no
/// `"default"`, intermediates and final alike.
pub fn intermediate_value(objectives: &[ObjectiveConfig], raw: &str) -> Result<f64, String> {
    let value = parse_lenient(raw)?;
    let first = objectives.iter().find(|o| o.constraint.is_none());
    let (Value::Object(map), Some(first)) = (&value, first) else {
        return knob_plugin_api::metric::default_value(raw);
    };
    if map.contains_key("default") {
        return knob_plugin_api::metric::default_value(raw);
    }
    let entry = map.get(&first.metric).ok_or_else(|| {
        format!(
            "intermediate result has neither a \"default\" nor an {:?} entry (the first objective)",
            first.metric
        )
    })?;
    knob_plugin_api::metric::default_value(&entry.to_string()).map_err(|_| {
        format!(
            "intermediate result's {:?} entry is not a number: {entry}",
            first.metric
        )
    })
}

/// The outcome of values already read, one per listed objective, in order.
pub fn outcome_of_values(objectives: &[ObjectiveConfig], values: Vec<f64>) -> Outcome {
    let values: Vec<f64> = values
        .into_iter()
        .map(|v| if v.is_finite() { v } else { f64::NAN })
        .collect();
    let mut losses = Vec::new();
    let mut violations = Vec::new();
    for (objective, &value) in objectives.iter().zip(&values) {
        match &objective.constraint {
            Some(constraint) => violations.push(match constraint.op {
                ConstraintOp::AtMost => value - constraint.bound,
                ConstraintOp::AtLeast => constraint.bound - value,
            }),
            None => losses.push(match objective.direction() {
                Direction::Minimize => value,
                Direction::Maximize => -value,
            }),
        }
    }
    Outcome {
        values,
        losses,
        violations,
    }
}

/// One trial's place in the experiment's results, for export, `knob experiment pareto` and the
/// API.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParetoEntry {
    pub trial_id: String,
    /// Each listed metric as reported, in config order: null when absent, not a number, NaN or
    /// ±Infinity (JSON has no spelling for those; `reported` keeps them).
    pub values: Vec<Option<f64>>,
    /// Each listed metric as reported, NaN and ±Infinity included (None: absent or not a
    /// number): what `knob experiment pareto --all` shows, rather than a blank for both.
    #[serde(skip)]
    pub reported: Vec<Option<f64>>,
    /// It meets every constraint (true without constraints). A constraint whose metric is
    /// missing or not a finite number is not met: nothing says the trial kept to it.
    pub feasible: bool,
    /// Every listed metric is a finite number. A trial that is not complete is never on the
    /// front, whatever it meets: it is no point of the objective space.
    pub complete: bool,
    pub pareto: bool,
}

/// The Pareto front of finished trials: `(trial id, final result as sent)` for each trial with
/// a final. Only complete and feasible trials are on the front; the others have `values` of
/// what could be read.
pub fn pareto_entries(
    objectives: &[ObjectiveConfig],
    finals: &[(String, String)],
) -> Vec<ParetoEntry> {
    let reported: Vec<Vec<Option<f64>>> = finals
        .iter()
        .map(|(_, raw)| reported_values(objectives, raw))
        .collect();
    let outcome_of = |values: &[Option<f64>]| {
        outcome_of_values(
            objectives,
            values.iter().map(|v| v.unwrap_or(f64::NAN)).collect(),
        )
    };
    // A NaN violation (the metric missing or not finite) is no constraint met.
    let meets = |values: &[Option<f64>]| outcome_of(values).is_feasible();
    let complete = |values: &[Option<f64>]| values.iter().all(|v| v.is_some_and(f64::is_finite));
    // The front is taken among the complete, feasible trials only (`pareto_front` leaves the
    // others out too); an incomplete one is not handed over at all.
    let candidates: Vec<(usize, Outcome)> = reported
        .iter()
        .enumerate()
        .filter(|(_, values)| complete(values) && meets(values))
        .map(|(i, values)| (i, outcome_of(values)))
        .collect();
    let points: Vec<&Outcome> = candidates.iter().map(|(_, o)| o).collect();
    let front: Vec<usize> = pareto_front(&points)
        .into_iter()
        .map(|k| candidates[k].0)
        .collect();
    finals
        .iter()
        .zip(reported)
        .enumerate()
        .map(|(i, ((trial_id, _), reported))| ParetoEntry {
            trial_id: trial_id.clone(),
            values: reported
                .iter()
                .map(|v| v.filter(|v| v.is_finite()))
                .collect(),
            feasible: meets(&reported),
            complete: complete(&reported),
            pareto: front.contains(&i),
            reported,
        })
        .collect()
}

/// Each listed metric of a final result as sent, NaN and ±Infinity as reported; None for one
/// absent or not a number (a plain number is the metric when only one is listed).
fn reported_values(objectives: &[ObjectiveConfig], raw: &str) -> Vec<Option<f64>> {
    let value = parse_lenient(raw).ok();
    objectives
        .iter()
        .map(|o| {
            let entry = match value.as_ref()? {
                Value::Object(map) => map.get(&o.metric)?,
                scalar if objectives.len() == 1 => scalar,
                _ => return None,
            };
            knob_plugin_api::metric::default_value(&entry.to_string()).ok()
        })
        .collect()
}

/// The `objectives` of a stored config (the JSON form the store keeps); empty without them.
pub fn of_config(config: &Value) -> Vec<ObjectiveConfig> {
    config
        .get("objectives")
        .and_then(|list| serde_json::from_value(list.clone()).ok())
        .unwrap_or_default()
}

/// The Pareto entries of an experiment's succeeded trials with a final result, in the order
/// they ended
/// (empty without `objectives`).
pub fn of_state(state: &crate::store::ExperimentState) -> (Vec<ObjectiveConfig>, Vec<ParetoEntry>) {
    let objectives = of_config(&state.config);
    if objectives.is_empty() {
        return (objectives, Vec::new());
    }
    // In the order they ended, so that the hypervolume history reads as time goes.
    let mut succeeded: Vec<&crate::store::TrialState> = state
        .trials
        .iter()
        .filter(|t| t.status == crate::store::TrialStatus::Succeeded)
        .collect();
    succeeded.sort_by_key(|t| (t.ended_ms(), t.sequence));
    let finals: Vec<(String, String)> = succeeded
        .iter()
        .filter_map(|t| Some((t.trial_id.clone(), t.final_metric()?.raw.clone())))
        .collect();
    let entries = pareto_entries(&objectives, &finals);
    (objectives, entries)
}

/// The hypervolume of the feasible trials' objectives (constraints left out) after each trial,
/// in the order given, against the objectives' `reference` values, and for an objective without
/// one the worst value of it among the feasible trials (pushed out by a tenth of its range). In the
/// objectives' own units: each value is the volume of the region of objective space the trials
/// so far dominate, bounded by the reference point.
pub fn hypervolume_history(
    objectives: &[ObjectiveConfig],
    entries: &[ParetoEntry],
) -> (Option<Vec<f64>>, Vec<f64>) {
    let losses = |entry: &ParetoEntry| -> Option<Vec<f64>> {
        if !(entry.feasible && entry.complete) {
            return None;
        }
        let values: Vec<f64> = entry.values.iter().map(|v| v.unwrap_or(f64::NAN)).collect();
        Some(outcome_of_values(objectives, values).losses)
    };
    let points: Vec<Option<Vec<f64>>> = entries.iter().map(losses).collect();
    let seen: Vec<Vec<f64>> = points.iter().flatten().cloned().collect();
    let configured: Vec<Option<f64>> = objectives
        .iter()
        .filter(|o| o.constraint.is_none())
        .map(|o| {
            o.reference.map(|r| match o.direction() {
                Direction::Minimize => r,
                Direction::Maximize => -r,
            })
        })
        .collect();
    // Each objective's own `reference` where it has one, the default for the others.
    let reference: Option<Vec<f64>> = if configured.iter().all(Option::is_some) {
        configured.iter().copied().collect()
    } else {
        default_reference(&seen).map(|defaults| {
            configured
                .iter()
                .zip(defaults)
                .map(|(given, default)| given.unwrap_or(default))
                .collect()
        })
    };
    let Some(reference) = reference else {
        return (None, vec![0.0; entries.len()]);
    };
    let history = running_hypervolume(points, &reference);
    // The reference point in the objectives' own units, as a user would write it.
    let shown = objectives
        .iter()
        .filter(|o| o.constraint.is_none())
        .zip(&reference)
        .map(|(o, &r)| match o.direction() {
            Direction::Minimize => r,
            Direction::Maximize => -r,
        })
        .collect();
    (Some(shown), history)
}

/// The hypervolume of the points so far after each point (`None`: no point added then).
///
/// Only the non-dominated points so far are kept, and the volume is computed again only when a
/// point joins them: a dominated point adds no volume. Computing it over every point after each
/// trial made the API's `/pareto` cost grow with the cube of the trials (and faster with three
/// objectives or more), far past what a dashboard can wait for on a long experiment.
fn running_hypervolume(points: Vec<Option<Vec<f64>>>, reference: &[f64]) -> Vec<f64> {
    let covers = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| x <= y);
    let mut front: Vec<Vec<f64>> = Vec::new();
    let mut volume = 0.0;
    points
        .into_iter()
        .map(|point| {
            if let Some(point) = point {
                if !front.iter().any(|kept| covers(kept, &point)) {
                    front.retain(|kept| !covers(&point, kept));
                    front.push(point);
                    volume = hypervolume(&front, reference);
                }
            }
            volume
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Constraint;

    fn objectives() -> Vec<ObjectiveConfig> {
        vec![
            ObjectiveConfig::new("accuracy", Some(Direction::Maximize), None),
            ObjectiveConfig::new("latency_ms", Some(Direction::Minimize), None),
            ObjectiveConfig::new(
                "memory_over",
                None,
                Some(Constraint {
                    op: ConstraintOp::AtMost,
                    bound: 0.0,
                }),
            ),
        ]
    }

    #[test]
    fn an_outcome_reads_every_listed_key_and_names_a_missing_one() {
        let o = outcome(
            &objectives(),
            r#"{"accuracy": 0.9, "latency_ms": 12, "memory_over": -1, "other": "x"}"#,
        )
        .unwrap();
        assert_eq!(o.values, vec![0.9, 12.0, -1.0]);
        assert_eq!(o.losses, vec![-0.9, 12.0]);
        assert_eq!(o.violations, vec![-1.0]);
        let missing = outcome(&objectives(), r#"{"accuracy": 0.9, "memory_over": 0}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(
            missing,
            r#"final result has no "latency_ms" entry (objectives lists accuracy, latency_ms, memory_over); report a dict with every listed metric, e.g. nni.report_final_result({"accuracy": ..., "latency_ms": ..., "memory_over": ...})"#
        );
        // A plain number where several objectives are listed: the dict is what is missing,
        // not one entry (it said `has no "accuracy" entry`).
        assert_eq!(
            outcome(&objectives(), "0.5").unwrap_err().to_string(),
            r#"final result 0.5 is not a dict of the objectives (objectives lists accuracy, latency_ms, memory_over); report a dict with every listed metric, e.g. nni.report_final_result({"accuracy": ..., "latency_ms": ..., "memory_over": ...})"#
        );
        assert!(outcome(&objectives(), "NaN")
            .unwrap_err()
            .to_string()
            .starts_with("final result NaN is not a dict of the objectives"));
        assert!(matches!(
            outcome(&objectives(), "[1, 2, 3]"),
            Err(OutcomeProblem::NotADict { .. })
        ));
        assert!(matches!(
            outcome(
                &objectives(),
                r#"{"accuracy": "high", "latency_ms": 1, "memory_over": 0}"#
            ),
            Err(OutcomeProblem::Unreadable(_))
        ));
    }

    #[test]
    fn an_intermediate_stands_for_its_default_else_the_first_objective() {
        let read = |raw| intermediate_value(&objectives(), raw);
        assert_eq!(read(r#"{"latency_ms": 3.0, "accuracy": 0.5}"#), Ok(0.5));
        assert_eq!(read(r#"{"accuracy": 0.5}"#), Ok(0.5));
        assert_eq!(read(r#"{"default": 0.25, "accuracy": 0.5}"#), Ok(0.25));
        assert_eq!(read("0.75"), Ok(0.75));
        assert!(read(r#"{"accuracy": NaN}"#).unwrap().is_nan());
        // A constraint listed first is not the first objective.
        let mut constrained = objectives();
        constrained.rotate_right(1);
        assert_eq!(
            intermediate_value(&constrained, r#"{"memory_over": 1, "accuracy": 0.5}"#),
            Ok(0.5)
        );
        assert_eq!(
            read(r#"{"latency_ms": 3.0}"#),
            Err(r#"intermediate result has neither a "default" nor an "accuracy" entry (the first objective)"#.into())
        );
        assert_eq!(
            read(r#"{"accuracy": "high"}"#),
            Err(r#"intermediate result's "accuracy" entry is not a number: "high""#.into())
        );
        assert_eq!(
            read(r#"{"default": "high", "accuracy": 0.5}"#),
            Err(r#"metric "{\"default\": \"high\", \"accuracy\": 0.5}" is not a number"#.into())
        );
    }

    #[test]
    fn the_front_holds_feasible_non_dominated_trials_only() {
        let finals = [
            (
                "a",
                r#"{"accuracy": 0.9, "latency_ms": 20, "memory_over": 0}"#,
            ),
            (
                "b",
                r#"{"accuracy": 0.8, "latency_ms": 10, "memory_over": -5}"#,
            ),
            (
                "c",
                r#"{"accuracy": 0.7, "latency_ms": 15, "memory_over": -5}"#,
            ), // dominated by b
            (
                "d",
                r#"{"accuracy": 0.99, "latency_ms": 1, "memory_over": 3}"#,
            ), // infeasible
            ("e", r#"{"accuracy": 0.95}"#), // incomplete
        ];
        let finals: Vec<(String, String)> = finals
            .iter()
            .map(|(id, raw)| (id.to_string(), raw.to_string()))
            .collect();
        let entries = pareto_entries(&objectives(), &finals);
        let front: Vec<&str> = entries
            .iter()
            .filter(|e| e.pareto)
            .map(|e| e.trial_id.as_str())
            .collect();
        assert_eq!(front, ["a", "b"]);
        assert!(!entries[3].feasible && entries[3].complete);
        assert!(!entries[4].complete && !entries[4].pareto);
        assert_eq!(entries[4].values, vec![Some(0.95), None, None]);
        let (reference, history) = hypervolume_history(&objectives(), &entries);
        let reference = reference.unwrap();
        // Worst feasible: accuracy 0.7, latency 20, pushed out by a tenth of the range.
        assert!((reference[0] - 0.68).abs() < 1e-9 && (reference[1] - 21.0).abs() < 1e-9);
        assert!(history.windows(2).all(|w| w[0] <= w[1]), "{history:?}");
        assert!(history[0] > 0.0);
        // One objective's own reference is taken, the other's defaults as before.
        let mut latency_given = objectives();
        latency_given[1].reference = Some(40.0);
        let (reference, _) = hypervolume_history(&latency_given, &entries);
        let reference = reference.unwrap();
        assert!((reference[0] - 0.68).abs() < 1e-9, "{reference:?}");
        assert_eq!(reference[1], 40.0);
    }

    #[test]
    fn a_result_that_breaks_a_constraint_does_not_rank() {
        let ranking = Ranking::new(Direction::Maximize, &objectives());
        let ranks = |raw| ranking.ranks(TrialStatus::Succeeded, Some(0.9), raw);
        assert!(ranks(Some(
            r#"{"accuracy": 0.9, "latency_ms": 20, "memory_over": 0}"#
        )));
        assert!(!ranks(Some(
            r#"{"accuracy": 0.99, "latency_ms": 1, "memory_over": 3}"#
        )));
        assert!(!ranks(Some(r#"{"accuracy": 0.95}"#)));
        assert!(!ranks(None));
        let plain = Ranking::new(Direction::Maximize, &[]);
        assert!(plain.ranks(TrialStatus::Succeeded, Some(1.0), None));
    }

    #[test]
    fn only_a_succeeded_trial_with_every_objective_finite_ranks() {
        let two = &objectives()[..2];
        let ranking = Ranking::new(Direction::Maximize, two);
        let good = r#"{"accuracy": 0.9, "latency_ms": 20}"#;
        assert!(ranking.ranks(TrialStatus::Succeeded, Some(0.9), Some(good)));
        // A final the trial reported before failing, or being killed or stopped, never ranks.
        for status in [
            TrialStatus::Failed,
            TrialStatus::UserCanceled,
            TrialStatus::SysCanceled,
            TrialStatus::EarlyStopped,
            TrialStatus::Running,
        ] {
            assert!(!ranking.ranks(status, Some(0.9), Some(good)), "{status:?}");
        }
        // The first objective fine, another NaN, infinite or missing: it does not rank.
        for raw in [
            r#"{"accuracy": 0.9, "latency_ms": NaN}"#,
            r#"{"accuracy": 0.9, "latency_ms": Infinity}"#,
            r#"{"accuracy": 0.9, "latency_ms": -Infinity}"#,
            r#"{"accuracy": 0.9}"#,
        ] {
            assert!(
                !ranking.ranks(TrialStatus::Succeeded, Some(0.9), Some(raw)),
                "{raw}"
            );
        }
        // No usable number at all.
        let plain = Ranking::new(Direction::Minimize, &[]);
        for value in [None, Some(f64::NAN), Some(f64::INFINITY)] {
            assert!(!plain.ranks(TrialStatus::Succeeded, value, Some("NaN")));
        }
    }

    #[test]
    fn the_better_value_comes_first_and_a_tie_goes_to_the_earlier_trial() {
        use std::cmp::Ordering::{Greater, Less};
        assert_eq!(best_first(Direction::Maximize, (2.0, 5), (1.0, 1)), Less);
        assert_eq!(best_first(Direction::Minimize, (2.0, 5), (1.0, 1)), Greater);
        for direction in [Direction::Maximize, Direction::Minimize] {
            assert_eq!(best_first(direction, (1.0, 1), (1.0, 5)), Less);
            assert_eq!(best_first(direction, (1.0, 5), (1.0, 1)), Greater);
        }
    }

    #[test]
    fn a_trial_with_a_non_finite_objective_is_never_on_the_front() {
        let constrained = objectives();
        let finals: Vec<(String, String)> = [
            (
                "nan",
                r#"{"accuracy": NaN, "latency_ms": 1, "memory_over": -1}"#,
            ),
            (
                "inf",
                r#"{"accuracy": 0.5, "latency_ms": -Infinity, "memory_over": -1}"#,
            ),
            (
                "ok",
                r#"{"accuracy": 0.5, "latency_ms": 30, "memory_over": -1}"#,
            ),
            (
                "nan-limit",
                r#"{"accuracy": 0.9, "latency_ms": 1, "memory_over": NaN}"#,
            ),
            ("missing", r#"{"accuracy": 0.9, "memory_over": 0}"#),
        ]
        .iter()
        .map(|(id, raw)| (id.to_string(), raw.to_string()))
        .collect();
        let entries = pareto_entries(&constrained, &finals);
        let summary: Vec<(&str, bool, bool, bool)> = entries
            .iter()
            .map(|e| (e.trial_id.as_str(), e.feasible, e.complete, e.pareto))
            .collect();
        // `feasible` says only whether the constraints are met; a constraint whose metric is
        // NaN is not.
        assert_eq!(
            summary,
            [
                ("nan", true, false, false),
                ("inf", true, false, false),
                ("ok", true, true, true),
                ("nan-limit", false, false, false),
                ("missing", true, false, false),
            ]
        );
        // JSON has null for what was not a finite number; `reported` keeps what was sent.
        assert_eq!(entries[0].values, vec![None, Some(1.0), Some(-1.0)]);
        assert!(entries[0].reported[0].unwrap().is_nan());
        assert_eq!(entries[1].reported[1], Some(f64::NEG_INFINITY));
        assert_eq!(entries[4].reported, vec![Some(0.9), None, Some(0.0)]);
        let json = serde_json::to_value(&entries[1]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"trial_id": "inf", "values": [0.5, null, -1.0], "feasible": true, "complete": false, "pareto": false})
        );
        // The hypervolume counts the complete, feasible trial only.
        let (reference, history) = hypervolume_history(&constrained, &entries);
        assert!(reference.is_some());
        assert_eq!(history[0], 0.0);
    }

    #[test]
    fn the_running_hypervolume_is_that_of_every_point_so_far() {
        // A small deterministic generator: three objectives, some points dominated, some
        // repeated, some outside the reference box, some missing (infeasible trials).
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 1000) as f64 / 100.0
        };
        let points: Vec<Option<Vec<f64>>> = (0..120)
            .map(|i| match i % 7 {
                0 => None,
                3 => Some(vec![5.0, 5.0, 5.0]),
                _ => Some(vec![next(), next(), next()]),
            })
            .collect();
        let reference = [9.0, 9.0, 9.0];
        let running = running_hypervolume(points.clone(), &reference);
        let mut so_far = Vec::new();
        for (point, got) in points.into_iter().zip(&running) {
            so_far.extend(point);
            let every = hypervolume(&so_far, &reference);
            assert!(
                (every - got).abs() < 1e-9 * every.max(1.0),
                "{every} != {got}"
            );
        }
        assert!(running.last().unwrap() > &0.0);
    }
}
