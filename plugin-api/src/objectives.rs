//! Multi-objective results: what a tuner that takes vector objectives receives, and the
//! arithmetic of Pareto dominance that the host (the `pareto` field, `knob experiment pareto`)
//! and the tuners (NSGA2, multi-objective TPE) share.
//!
//! Every point here is in "loss" form: each objective to be minimised (a maximised objective is
//! negated by the host), plus the violations of the constraints, where a value `<= 0` means the
//! constraint holds (Optuna's `constraints_func` convention). Dominance between points with
//! constraints is Optuna's constrained domination: a feasible point dominates an infeasible one,
//! of two infeasible points the smaller total violation dominates, and two feasible points
//! compare by their losses.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A trial's final result as a tuner that takes objectives sees it. Built by the host from the
/// experiment's `objectives` (in the order the config lists them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Every listed metric as the trial reported it, constraints included, in config order
    /// (NaN, JSON `null`, for a non-finite report).
    #[serde(with = "nan_vec")]
    pub values: Vec<f64>,
    /// The objectives (the entries without a constraint), each as a number to minimise: a
    /// `maximize` objective negated. NaN when the trial reported NaN for it.
    #[serde(with = "nan_vec")]
    pub losses: Vec<f64>,
    /// One per constraint entry: how far the constraint is violated (`<= 0`: it holds).
    #[serde(with = "nan_vec")]
    pub violations: Vec<f64>,
}

impl Outcome {
    /// The outcome of objectives that are all minimised, `losses`, and constraints with these
    /// `violations`: its values are the losses, then the violations (config order).
    pub fn minimised(losses: &[f64], violations: &[f64]) -> Outcome {
        Outcome {
            values: losses.iter().chain(violations).copied().collect(),
            losses: losses.to_vec(),
            violations: violations.to_vec(),
        }
    }

    /// Whether every loss is a number (a trial that reported NaN is no point at all).
    pub fn is_complete(&self) -> bool {
        self.losses.iter().all(|v| v.is_finite()) && self.violations.iter().all(|v| !v.is_nan())
    }

    pub fn is_feasible(&self) -> bool {
        self.violations.iter().all(|&v| v <= 0.0)
    }

    /// The sum of the positive violations (0 for a feasible point).
    pub fn total_violation(&self) -> f64 {
        total_violation(&self.violations)
    }
}

/// The sum of the positive parts of `violations`; NaN counts as infinitely violated.
pub fn total_violation(violations: &[f64]) -> f64 {
    violations
        .iter()
        .map(|&v| {
            if v.is_nan() {
                f64::INFINITY
            } else {
                v.max(0.0)
            }
        })
        .sum()
}

/// `a` dominates `b`: no worse in every loss and better in one (minimisation).
pub fn dominates(a: &[f64], b: &[f64]) -> bool {
    let mut better = false;
    for (x, y) in a.iter().zip(b) {
        if x > y {
            return false;
        }
        if x < y {
            better = true;
        }
    }
    better
}

/// Optuna's constrained domination (see the module documentation).
pub fn constrained_dominates(a: &Outcome, b: &Outcome) -> bool {
    match (a.is_feasible(), b.is_feasible()) {
        (true, false) => true,
        (false, true) => false,
        (false, false) => a.total_violation() < b.total_violation(),
        (true, true) => dominates(&a.losses, &b.losses),
    }
}

/// Fast non-dominated sorting (Deb et al. 2002) under [`constrained_dominates`]: the indices of
/// `points`, rank by rank, the first rank being the non-dominated ones. Incomplete points
/// ([`Outcome::is_complete`]) are left out.
pub fn non_dominated_ranks(points: &[&Outcome]) -> Vec<Vec<usize>> {
    let ids: Vec<usize> = (0..points.len())
        .filter(|&i| points[i].is_complete())
        .collect();
    let mut dominated_by_count = vec![0usize; points.len()];
    let mut dominates_list: Vec<Vec<usize>> = vec![Vec::new(); points.len()];
    for (k, &i) in ids.iter().enumerate() {
        for &j in &ids[k + 1..] {
            if constrained_dominates(points[i], points[j]) {
                dominates_list[i].push(j);
                dominated_by_count[j] += 1;
            } else if constrained_dominates(points[j], points[i]) {
                dominates_list[j].push(i);
                dominated_by_count[i] += 1;
            }
        }
    }
    let mut ranks = Vec::new();
    let mut current: Vec<usize> = ids
        .iter()
        .copied()
        .filter(|&i| dominated_by_count[i] == 0)
        .collect();
    while !current.is_empty() {
        let mut next = Vec::new();
        for &i in &current {
            for &j in &dominates_list[i] {
                dominated_by_count[j] -= 1;
                if dominated_by_count[j] == 0 {
                    next.push(j);
                }
            }
        }
        next.sort_unstable();
        ranks.push(std::mem::replace(&mut current, next));
    }
    ranks
}

/// The Pareto front: the indices of the complete, feasible points that no other feasible point
/// dominates (duplicates of a front point are on it too).
pub fn pareto_front(points: &[&Outcome]) -> Vec<usize> {
    let feasible: Vec<usize> = (0..points.len())
        .filter(|&i| points[i].is_complete() && points[i].is_feasible())
        .collect();
    feasible
        .iter()
        .copied()
        .filter(|&i| {
            !feasible
                .iter()
                .any(|&j| dominates(&points[j].losses, &points[i].losses))
        })
        .collect()
}

/// The hypervolume dominated by `points` (losses, minimised) and bounded by `reference`: the
/// measure of the set of points that some point of `points` dominates and that dominate
/// `reference`. Points not strictly better than the reference in every coordinate add nothing.
/// Exact, by slicing along the last coordinate (HSO); fine for the few hundred points and two to
/// four objectives of an experiment.
pub fn hypervolume(points: &[Vec<f64>], reference: &[f64]) -> f64 {
    let inside: Vec<&[f64]> = points
        .iter()
        .map(Vec::as_slice)
        .filter(|p| {
            p.len() == reference.len()
                && p.iter().zip(reference).all(|(x, r)| x.is_finite() && x < r)
        })
        .collect();
    hso(inside, reference)
}

fn hso(mut points: Vec<&[f64]>, reference: &[f64]) -> f64 {
    let d = reference.len();
    if points.is_empty() || d == 0 {
        return 0.0;
    }
    if d == 1 {
        let best = points.iter().map(|p| p[0]).fold(f64::INFINITY, f64::min);
        return reference[0] - best;
    }
    if d == 2 {
        points.sort_by(|a, b| a[0].total_cmp(&b[0]).then(a[1].total_cmp(&b[1])));
        let mut volume = 0.0;
        let mut last_y = reference[1];
        for p in points {
            if p[1] < last_y {
                volume += (reference[0] - p[0]) * (last_y - p[1]);
                last_y = p[1];
            }
        }
        return volume;
    }
    // Slices along the last coordinate: between consecutive values, the cross-section is the
    // (d-1)-dimensional hypervolume of the points at or below the slice.
    points.sort_by(|a, b| a[d - 1].total_cmp(&b[d - 1]));
    let mut volume = 0.0;
    let mut slice: Vec<&[f64]> = Vec::with_capacity(points.len());
    for (k, p) in points.iter().enumerate() {
        slice.push(&p[..d - 1]);
        let upper = points.get(k + 1).map_or(reference[d - 1], |q| q[d - 1]);
        let depth = upper - p[d - 1];
        if depth > 0.0 {
            volume += depth * hso(slice.clone(), &reference[..d - 1]);
        }
    }
    volume
}

/// Greedy hypervolume subset selection: `k` indices of `points` chosen one at a time, each the
/// one adding the most hypervolume to those chosen before (Optuna's `_solve_hssp`, which TPE
/// uses from 4.0 to break ties within the last rank it splits).
pub fn hypervolume_subset(points: &[Vec<f64>], reference: &[f64], k: usize) -> Vec<usize> {
    let mut chosen: Vec<usize> = Vec::with_capacity(k);
    let mut chosen_points: Vec<Vec<f64>> = Vec::with_capacity(k);
    let mut base = 0.0;
    while chosen.len() < k.min(points.len()) {
        let mut best: Option<(usize, f64)> = None;
        for (i, p) in points.iter().enumerate() {
            if chosen.contains(&i) {
                continue;
            }
            chosen_points.push(p.clone());
            let gain = hypervolume(&chosen_points, reference) - base;
            chosen_points.pop();
            if best.is_none_or(|(_, g)| gain > g) {
                best = Some((i, gain));
            }
        }
        let Some((i, gain)) = best else { break };
        chosen.push(i);
        chosen_points.push(points[i].clone());
        base += gain;
    }
    chosen
}

/// A reference point for [`hypervolume`] when none is given: the worst value of each coordinate
/// among `points`, pushed out by 10% of the range (at least a little), so that the extreme
/// points of a front count too.
pub fn default_reference(points: &[Vec<f64>]) -> Option<Vec<f64>> {
    let first = points.iter().find(|p| p.iter().all(|x| x.is_finite()))?;
    let d = first.len();
    let mut worst = first.clone();
    let mut best = first.clone();
    for p in points
        .iter()
        .filter(|p| p.len() == d && p.iter().all(|x| x.is_finite()))
    {
        for i in 0..d {
            worst[i] = worst[i].max(p[i]);
            best[i] = best[i].min(p[i]);
        }
    }
    Some(
        worst
            .iter()
            .zip(&best)
            .map(|(w, b)| {
                let span = (w - b).abs().max(w.abs() * 1e-3).max(1e-9);
                w + 0.1 * span
            })
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------------
// How an outcome crosses the ABI: in the parameters text of `receive_trial_result`, as
// `{"$knob_objectives": {"parameters": {...}, "outcome": {...}}}`, and only to a tuner whose
// library said it takes objectives (`PluginModule::tuner_takes_objectives`), so no tuner built
// before objectives ever sees it. It cannot be a trial's parameters: `SearchSpace::parse`
// refuses a top-level parameter of that name.

pub(crate) const ENVELOPE_KEY: &str = "$knob_objectives";

/// The JSON text of parameters with their outcome (the host sends it; a plugin only unwraps).
#[cfg(feature = "host")]
pub(crate) fn wrap(parameters: &Value, outcome: &Outcome) -> String {
    let mut inner = serde_json::Map::new();
    inner.insert("parameters".into(), parameters.clone());
    inner.insert(
        "outcome".into(),
        serde_json::to_value(outcome).unwrap_or(Value::Null),
    );
    let mut outer = serde_json::Map::new();
    outer.insert(ENVELOPE_KEY.into(), Value::Object(inner));
    Value::Object(outer).to_string()
}

/// Splits what the host sent into parameters and outcome (`None` for plain parameters).
pub(crate) fn unwrap(value: Value) -> Result<(Value, Option<Outcome>), String> {
    let Value::Object(mut outer) = value else {
        return Ok((value, None));
    };
    if outer.len() != 1 || !outer.contains_key(ENVELOPE_KEY) {
        return Ok((Value::Object(outer), None));
    }
    let Some(Value::Object(mut inner)) = outer.remove(ENVELOPE_KEY) else {
        return Err(format!("{ENVELOPE_KEY} is not an object"));
    };
    let parameters = inner.remove("parameters").unwrap_or(Value::Null);
    let outcome = inner
        .remove("outcome")
        .ok_or_else(|| format!("{ENVELOPE_KEY} has no outcome"))?;
    let outcome: Outcome =
        serde_json::from_value(outcome).map_err(|e| format!("{ENVELOPE_KEY}: {e}"))?;
    Ok((parameters, Some(outcome)))
}

/// JSON has no NaN: serde_json writes it as `null`, which `f64` refuses to read back.
mod nan_vec {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(values: &[f64], serializer: S) -> Result<S::Ok, S::Error> {
        let values: Vec<Option<f64>> = values.iter().map(|v| v.is_finite().then_some(*v)).collect();
        values.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<f64>, D::Error> {
        Ok(Vec::<Option<f64>>::deserialize(deserializer)?
            .into_iter()
            .map(|v| v.unwrap_or(f64::NAN))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_front_is_the_feasible_non_dominated_points() {
        let points = [
            Outcome::minimised(&[1.0, 4.0], &[]),
            Outcome::minimised(&[2.0, 2.0], &[]),
            Outcome::minimised(&[3.0, 3.0], &[]), // dominated by [2, 2]
            Outcome::minimised(&[4.0, 1.0], &[]),
            Outcome::minimised(&[f64::NAN, 0.0], &[]), // incomplete
        ];
        let refs: Vec<&Outcome> = points.iter().collect();
        assert_eq!(pareto_front(&refs), vec![0, 1, 3]);
        assert_eq!(non_dominated_ranks(&refs), vec![vec![0, 1, 3], vec![2]]);
        // An infeasible point is never on the front, however good, and is ranked after every
        // feasible one; the less violated of two infeasible points ranks first.
        let points = [
            Outcome::minimised(&[0.0, 0.0], &[0.5]),
            Outcome::minimised(&[2.0, 2.0], &[0.0]),
            Outcome::minimised(&[3.0, 1.0], &[-1.0]),
            Outcome::minimised(&[0.0, 0.0], &[0.1]),
        ];
        let refs: Vec<&Outcome> = points.iter().collect();
        assert_eq!(pareto_front(&refs), vec![1, 2]);
        assert_eq!(
            non_dominated_ranks(&refs),
            vec![vec![1, 2], vec![3], vec![0]]
        );
    }

    #[test]
    fn hypervolume_is_exact_in_two_and_three_dimensions() {
        let reference = [4.0, 4.0];
        let points = vec![vec![1.0, 3.0], vec![2.0, 2.0], vec![3.0, 1.0]];
        // 3x1 + 2x1 + 1x1 strips = 6.
        assert_eq!(hypervolume(&points, &reference), 6.0);
        // A point outside the reference box adds nothing.
        let mut more = points.clone();
        more.push(vec![5.0, 0.0]);
        assert_eq!(hypervolume(&more, &reference), 6.0);
        // A unit cube corner at the origin against (1, 1, 1): the whole cube.
        assert_eq!(hypervolume(&[vec![0.0, 0.0, 0.0]], &[1.0, 1.0, 1.0]), 1.0);
        // Two boxes in 3-D overlapping in a 0.5 x 0.5 x 1 block: 1 + 1 - 0.25... by hand:
        // [0,1]x[0,0.5]x[0,1] ∪ [0,0.5]x[0,1]x[0,1] = 0.5 + 0.5 - 0.25 = 0.75.
        let v = hypervolume(
            &[vec![0.0, 0.5, 0.0], vec![0.5, 0.0, 0.0]],
            &[1.0, 1.0, 1.0],
        );
        assert!((v - 0.75).abs() < 1e-12, "{v}");
    }

    #[test]
    fn subset_selection_takes_the_largest_contributions_first() {
        let points = vec![
            vec![0.0, 3.0],
            vec![1.0, 1.0],
            vec![1.1, 1.1],
            vec![3.0, 0.0],
        ];
        let chosen = hypervolume_subset(&points, &[4.0, 4.0], 2);
        // [1,1] alone is worth 9; then [0,3] or [3,0] add 1 each, [1.1,1.1] adds nothing.
        assert_eq!(chosen[0], 1);
        assert!(chosen[1] == 0 || chosen[1] == 3, "{chosen:?}");
    }

    #[test]
    fn an_outcome_crosses_in_the_parameters_text_and_nothing_else_is_mistaken_for_one() {
        let outcome = Outcome::minimised(&[1.0, f64::NAN], &[-0.5]);
        let text = wrap(&serde_json::json!({"x": 1}), &outcome);
        let (parameters, back) = unwrap(serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(parameters, serde_json::json!({"x": 1}));
        let back = back.unwrap();
        assert_eq!(back.losses[0], 1.0);
        assert!(back.losses[1].is_nan());
        let plain = serde_json::json!({"x": 1, "$knob_objectives": 2});
        assert_eq!(unwrap(plain.clone()).unwrap(), (plain, None));
    }
}
