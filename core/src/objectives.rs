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
use crate::store::Direction;

/// Why a final result gives no outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum OutcomeProblem {
    /// The result is an object without this key (or not an object at all when several
    /// objectives are listed).
    Missing { metric: String, listed: Vec<String> },
    /// The result or one of its entries cannot be read as a number.
    Unreadable(String),
}

impl std::fmt::Display for OutcomeProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutcomeProblem::Missing { metric, listed } => write!(
                f,
                "final result has no {metric:?} entry (objectives lists {}); report a dict with every listed metric, e.g. nni.report_final_result({{{}}})",
                listed.join(", "),
                listed
                    .iter()
                    .map(|m| format!("{m:?}: ..."))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            OutcomeProblem::Unreadable(reason) => f.write_str(reason),
        }
    }
}

/// How "best" is judged: the direction, and the constraints a trial must meet to be ranked at
/// all. An infeasible trial is never the best, whatever its first objective (Optuna's
/// `best_trials` leaves such trials out too): the summary, `--head`, the API's best trials and
/// the new-best notifications would otherwise name a configuration that breaks a constraint.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranking {
    pub direction: Direction,
    /// The objectives when any is a constraint; empty otherwise (every result ranks).
    constrained: Vec<ObjectiveConfig>,
}

impl Ranking {
    pub fn new(direction: Direction, objectives: &[ObjectiveConfig]) -> Ranking {
        let constrained = if objectives.iter().any(|o| o.constraint.is_some()) {
            objectives.to_vec()
        } else {
            Vec::new()
        };
        Ranking {
            direction,
            constrained,
        }
    }

    /// The ranking of a stored config (the JSON form the store keeps).
    pub fn of_config(config: &Value) -> Ranking {
        Ranking::new(Direction::of_config(config), &of_config(config))
    }

    /// Whether a final result (as reported) may rank: it meets every constraint.
    pub fn ranks(&self, final_raw: Option<&str>) -> bool {
        self.constrained.is_empty()
            || final_raw.is_some_and(|raw| meets_constraints(&self.constrained, raw))
    }

    /// Whether some results may not rank (the experiment has constraints).
    pub fn has_constraints(&self) -> bool {
        !self.constrained.is_empty()
    }
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
    /// Each listed metric as reported (null when absent or not a number), in config order.
    pub values: Vec<Option<f64>>,
    pub feasible: bool,
    pub pareto: bool,
}

/// The Pareto front of finished trials: `(trial id, final result as sent)` for each trial with
/// a final. Trials whose result lacks a metric have `values` of what could be read and are
/// neither feasible nor on the front.
pub fn pareto_entries(
    objectives: &[ObjectiveConfig],
    finals: &[(String, String)],
) -> Vec<ParetoEntry> {
    let outcomes: Vec<Option<Outcome>> = finals
        .iter()
        .map(|(_, raw)| outcome(objectives, raw).ok())
        .collect();
    let complete: Vec<(usize, &Outcome)> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| o.as_ref().map(|o| (i, o)))
        .collect();
    let points: Vec<&Outcome> = complete.iter().map(|(_, o)| *o).collect();
    let front: Vec<usize> = pareto_front(&points)
        .into_iter()
        .map(|k| complete[k].0)
        .collect();
    finals
        .iter()
        .zip(&outcomes)
        .enumerate()
        .map(|(i, ((trial_id, raw), outcome))| ParetoEntry {
            trial_id: trial_id.clone(),
            values: match outcome {
                Some(o) => o
                    .values
                    .iter()
                    .map(|v| v.is_finite().then_some(*v))
                    .collect(),
                None => partial_values(objectives, raw),
            },
            feasible: outcome
                .as_ref()
                .is_some_and(|o| o.is_complete() && o.is_feasible()),
            pareto: front.contains(&i),
        })
        .collect()
}

fn partial_values(objectives: &[ObjectiveConfig], raw: &str) -> Vec<Option<f64>> {
    let value = parse_lenient(raw).ok();
    objectives
        .iter()
        .map(|o| {
            let entry = value.as_ref()?.as_object()?.get(&o.metric)?;
            knob_plugin_api::metric::default_value(&entry.to_string())
                .ok()
                .filter(|v| v.is_finite())
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
        if !entry.feasible {
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
        assert!(matches!(
            outcome(&objectives(), "0.5"),
            Err(OutcomeProblem::Missing { .. })
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
        assert!(!entries[3].feasible && !entries[4].feasible);
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
        assert!(ranking.has_constraints());
        assert!(ranking.ranks(Some(
            r#"{"accuracy": 0.9, "latency_ms": 20, "memory_over": 0}"#
        )));
        assert!(!ranking.ranks(Some(
            r#"{"accuracy": 0.99, "latency_ms": 1, "memory_over": 3}"#
        )));
        assert!(!ranking.ranks(Some(r#"{"accuracy": 0.95}"#)));
        assert!(!ranking.ranks(None));
        let plain = Ranking::new(Direction::Maximize, &objectives()[..2]);
        assert!(!plain.has_constraints() && plain.ranks(None));
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
