//! Multi-objective TPE: which finished trials count as good when each has an [`Outcome`] (an
//! experiment with `objectives`), as Optuna 4's `TPESampler` decides it.
//!
//! - Feasible trials first, by non-dominated rank: whole ranks go below (good) while they fit
//!   in `n_below`; the rank that does not fit is cut by greedy hypervolume subset selection
//!   (Optuna's `_solve_hssp`) against that rank's worst point pushed out by a tenth, so the
//!   good trials spread along the front instead of crowding one end.
//! - Infeasible trials only fill what is left of `n_below`, the least violated first; with
//!   enough feasible trials they are all above (Optuna's constrained TPE).
//! - Trials with an incomplete outcome (a NaN objective) are always above.
//! - With `good_weights: rank` (knob's default, `mod.rs`) each whole rank is ordered by greedy
//!   hypervolume contribution as well, so the good trials come best first for their weights.
//! - With `good_weights: hypervolume` the good trials are weighed by their hypervolume
//!   contribution among the good ones (the loss of hypervolume when each is left out, over the
//!   largest); the others, infeasible ones included, get `EPS` (Optuna 3-4's
//!   `_calculate_weights_below_for_multi_objective`).

use knob_plugin_api::objectives::{
    hypervolume, hypervolume_subset, non_dominated_ranks, pareto_front,
};
use knob_plugin_api::Outcome;

/// Optuna's floor for weights and reference coordinates.
const EPS: f64 = 1e-12;

/// The indices of `outcomes` that count as good, best first: `n_below` of them (fewer when
/// fewer are usable). See the module documentation for the order. With `order_ranks`, each whole
/// rank is listed in greedy hypervolume order too (its own hypervolume subset selection of all
/// its points), for rank weights; otherwise in the order of [`non_dominated_ranks`].
pub(super) fn split(outcomes: &[&Outcome], n_below: usize, order_ranks: bool) -> Vec<usize> {
    let complete: Vec<usize> = (0..outcomes.len())
        .filter(|&i| outcomes[i].is_complete())
        .collect();
    let (feasible, mut infeasible): (Vec<usize>, Vec<usize>) = complete
        .into_iter()
        .partition(|&i| outcomes[i].is_feasible());
    let mut below = Vec::with_capacity(n_below);
    let feasible_points: Vec<&Outcome> = feasible.iter().map(|&i| outcomes[i]).collect();
    for rank in non_dominated_ranks(&feasible_points) {
        let room = n_below - below.len();
        if room == 0 {
            break;
        }
        let losses = || -> Vec<Vec<f64>> {
            rank.iter()
                .map(|&k| feasible_points[k].losses.clone())
                .collect()
        };
        if rank.len() <= room {
            if order_ranks && rank.len() > 1 {
                let losses = losses();
                let reference = tie_break_reference(&losses);
                below.extend(
                    hypervolume_subset(&losses, &reference, rank.len())
                        .into_iter()
                        .map(|j| feasible[rank[j]]),
                );
            } else {
                below.extend(rank.iter().map(|&k| feasible[k]));
            }
            continue;
        }
        let losses = losses();
        let reference = tie_break_reference(&losses);
        below.extend(
            hypervolume_subset(&losses, &reference, room)
                .into_iter()
                .map(|j| feasible[rank[j]]),
        );
        break;
    }
    infeasible.sort_by(|&a, &b| {
        outcomes[a]
            .total_violation()
            .total_cmp(&outcomes[b].total_violation())
    });
    let room = n_below - below.len();
    below.extend(infeasible.into_iter().take(room));
    below
}

/// Optuna's reference point for a set of losses: the worst of each coordinate, a tenth further
/// out (`max(1.1 w, 0.9 w)`, which is further for negative values too), `EPS` where that is 0.
fn tie_break_reference(losses: &[Vec<f64>]) -> Vec<f64> {
    let d = losses.first().map_or(0, Vec::len);
    (0..d)
        .map(|m| {
            let worst = losses
                .iter()
                .map(|l| l[m])
                .fold(f64::NEG_INFINITY, f64::max);
            let r = (1.1 * worst).max(0.9 * worst);
            if r == 0.0 {
                EPS
            } else {
                r
            }
        })
        .collect()
}

/// The weights of the good trials `below` (as [`split`] returned them) in the good density:
/// each feasible one's hypervolume contribution among the feasible good ones over the largest
/// contribution (at least `EPS`), `EPS` for an infeasible one; all 1 with at most one feasible
/// good trial.
pub(super) fn below_weights(outcomes: &[&Outcome], below: &[usize]) -> Vec<f64> {
    let feasible: Vec<usize> = (0..below.len())
        .filter(|&k| outcomes[below[k]].is_feasible())
        .collect();
    let mut weights: Vec<f64> = (0..below.len())
        .map(|k| {
            if outcomes[below[k]].is_feasible() {
                1.0
            } else {
                EPS
            }
        })
        .collect();
    if feasible.len() <= 1 {
        return weights;
    }
    let losses: Vec<Vec<f64>> = feasible
        .iter()
        .map(|&k| outcomes[below[k]].losses.clone())
        .collect();
    let reference = tie_break_reference(&losses);
    let refs: Vec<&Outcome> = feasible.iter().map(|&k| outcomes[below[k]]).collect();
    let front = pareto_front(&refs);
    let front_losses: Vec<Vec<f64>> = front.iter().map(|&j| losses[j].clone()).collect();
    let total = hypervolume(&front_losses, &reference);
    if !total.is_finite() {
        return weights;
    }
    let mut contributions = vec![0.0; feasible.len()];
    for (f, &j) in front.iter().enumerate() {
        let others: Vec<Vec<f64>> = front_losses
            .iter()
            .enumerate()
            .filter(|&(g, _)| g != f)
            .map(|(_, l)| l.clone())
            .collect();
        contributions[j] = total - hypervolume(&others, &reference);
    }
    let largest = contributions.iter().copied().fold(0.0, f64::max).max(EPS);
    for (j, &k) in feasible.iter().enumerate() {
        weights[k] = (contributions[j] / largest).max(EPS);
    }
    weights
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_of(points: &[Outcome], n_below: usize) -> Vec<usize> {
        let refs: Vec<&Outcome> = points.iter().collect();
        split(&refs, n_below, false)
    }

    /// Rank 0 is {0, 1}; rank 1 is {2, 4, 5} ([0.6, 6] and [6, 0.6] are dominated by rank 0),
    /// of which two must be chosen for `n_below` 4. Against rank 1's reference (1.1 x its worst,
    /// (6.6, 6.6)), [2, 2] alone covers the most (4.6^2 = 21.16, against 3.6 for either end).
    #[test]
    fn the_rank_that_does_not_fit_is_cut_by_hypervolume_contribution() {
        let points = [
            Outcome::minimised(&[0.5, 1.5], &[]),
            Outcome::minimised(&[1.5, 0.5], &[]),
            Outcome::minimised(&[2.0, 2.0], &[]),
            Outcome::minimised(&[3.0, 2.1], &[]),
            Outcome::minimised(&[0.6, 6.0], &[]),
            Outcome::minimised(&[6.0, 0.6], &[]),
        ];
        // [3, 2.1] is dominated by [2, 2]: it is rank 2, not a candidate.
        assert!(!split_of(&points, 4).contains(&3));
        let below = split_of(&points, 4);
        assert_eq!(&below[..2], &[0, 1]);
        assert_eq!(below[2], 2);
        // Then [0.6, 6] and [6, 0.6] add the same (1.4 x 0.6 beside [2, 2]): either may come.
        assert!(below[3] == 4 || below[3] == 5, "{below:?}");
        // With room for the whole of rank 1, rank 2 is cut next.
        assert_eq!(split_of(&points, 5)[..5], [0, 1, 2, 4, 5]);
        assert_eq!(split_of(&points, 6).len(), 6);
        assert_eq!(split_of(&points, 0), Vec::<usize>::new());
        // Whole ranks only when they fit exactly.
        assert_eq!(split_of(&points, 2), vec![0, 1]);
    }

    /// With `order_ranks`, a whole rank comes in greedy hypervolume order: on the front
    /// x + y = 1 against (1.1, 1.1), the middle first, then the points that add most beside it.
    #[test]
    fn whole_ranks_come_in_hypervolume_order_when_asked() {
        let points: Vec<Outcome> = [0.0, 0.1, 0.2, 0.5, 1.0]
            .iter()
            .map(|&x| Outcome::minimised(&[x, 1.0 - x], &[]))
            .chain([Outcome::minimised(&[2.0, 2.0], &[])])
            .collect();
        let refs: Vec<&Outcome> = points.iter().collect();
        // The whole front fits in 5 and is ordered; unordered it comes as non_dominated_ranks
        // lists it.
        assert_eq!(split(&refs, 5, true)[..3], [3, 2, 4]);
        let mut unordered = split(&refs, 5, false);
        unordered.sort_unstable();
        assert_eq!(unordered, vec![0, 1, 2, 3, 4]);
        // The dominated [2, 2] comes last either way.
        assert_eq!(split(&refs, 6, true)[5], 5);
    }

    #[test]
    fn the_subset_spreads_along_the_rank() {
        // Five points on the front x + y = 1, reference (1.1, 1.1). Alone, the middle [0.5, 0.5]
        // covers the most (0.36); beside it [0.2, 0.8] adds 0.09 (0.1 adds 0.08, either end
        // 0.05); beside those two the far end [1, 0] adds 0.05 where 0 and 0.1 add 0.02 each:
        // the third good trial is taken far from the first two, not next to them.
        let points: Vec<Outcome> = [0.0, 0.1, 0.2, 0.5, 1.0]
            .iter()
            .map(|&x| Outcome::minimised(&[x, 1.0 - x], &[]))
            .collect();
        assert_eq!(split_of(&points, 3), vec![3, 2, 4]);
    }

    #[test]
    fn infeasible_and_incomplete_trials_only_fill_what_is_left() {
        let points = [
            Outcome::minimised(&[0.0, 0.0], &[0.5]), // best losses, infeasible
            Outcome::minimised(&[3.0, 3.0], &[0.0]), // feasible (0 holds)
            Outcome::minimised(&[f64::NAN, 1.0], &[-1.0]), // incomplete
            Outcome::minimised(&[4.0, 1.0], &[-1.0]),
            Outcome::minimised(&[0.0, 0.0], &[0.1]), // infeasible, less violated
        ];
        assert_eq!(split_of(&points, 2), vec![1, 3]);
        // With room for more, the least violated comes next; the incomplete one never.
        assert_eq!(split_of(&points, 3), vec![1, 3, 4]);
        assert_eq!(split_of(&points, 5), vec![1, 3, 4, 0]);
    }

    #[test]
    fn weights_follow_hypervolume_contributions() {
        let points = [
            Outcome::minimised(&[1.0, 3.0], &[]),
            Outcome::minimised(&[2.0, 2.0], &[]),
            Outcome::minimised(&[3.0, 1.0], &[]),
            Outcome::minimised(&[3.0, 3.0], &[]), // dominated: no contribution
            Outcome::minimised(&[0.0, 0.0], &[1.0]), // infeasible
        ];
        let refs: Vec<&Outcome> = points.iter().collect();
        let w = below_weights(&refs, &[0, 1, 2, 3, 4]);
        // Reference (3.3, 3.3): left out, [2, 2] loses 1 x 1; either end loses 1 x 0.3.
        assert!((w[1] - 1.0).abs() < 1e-9, "{w:?}");
        assert!(
            (w[0] - 0.3).abs() < 1e-9 && (w[2] - 0.3).abs() < 1e-9,
            "{w:?}"
        );
        assert_eq!(w[3], EPS);
        assert_eq!(w[4], EPS);
        assert_eq!(below_weights(&refs, &[1]), vec![1.0]);
    }
}
