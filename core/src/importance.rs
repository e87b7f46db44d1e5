//! Hyperparameter importance: fANOVA (Hutter, Hoos and Leyton-Brown, "An Efficient Approach for
//! Assessing Hyperparameter Importance", ICML 2014) over a random forest, the method of Optuna's
//! `FanovaImportanceEvaluator` and of optuna-dashboard's importance chart.
//!
//! 1. Each parameter becomes one dimension of the unit cube: a number is scaled to [0, 1] between
//!    the smallest and largest value the trials used (after a log for `loguniform` and
//!    `qloguniform`); a choice of k options takes the k equal intervals of [0, 1], in the order
//!    the search space lists them.
//! 2. A random forest of regression trees (CART, squared error; [`TREES`] trees, each grown on a
//!    bootstrap sample of the trials, every parameter considered at every split, leaves of one
//!    trial allowed, depth at most [`MAX_DEPTH`]) predicts the final result.
//! 3. A tree cuts the cube into boxes with one prediction each. Under the uniform distribution on
//!    the cube, its variance is Σ vol(box)·(value − mean)². A parameter's marginal, the
//!    prediction averaged over every other parameter, is a step function of that parameter
//!    alone; its variance over the parameter, divided by the tree's variance, is the share of
//!    the tree's variance that parameter explains by itself.
//! 4. Each parameter's share is averaged over the trees (trees that predict a constant are left
//!    out) and the shares are scaled to sum to 1, as Optuna reports them.
//!
//! Pure and synchronous: the API runs it on a blocking thread, the trees in parallel.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Trees in the forest (Optuna's default).
pub const TREES: usize = 64;
/// The deepest a tree grows (Optuna's default).
pub const MAX_DEPTH: usize = 64;

/// How a parameter maps to its dimension of the unit cube.
#[derive(Clone, Debug, PartialEq)]
pub enum Scale {
    /// A number, scaled linearly (or on a log scale) between the smallest and largest value seen.
    Number { log: bool },
    /// One of `options` options, each an equal interval.
    Choice { options: usize },
}

/// One trial's parameter, as fANOVA reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Number(f64),
    /// The index of the option chosen.
    Choice(usize),
}

/// Why a parameter gets no importance.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Skipped {
    #[error("every trial used the same value")]
    Constant,
    #[error("a value is not a positive number, which a log scale needs")]
    NotPositive,
}

/// Each parameter's share of the variance of the final result (summing to 1, or all 0 when the
/// forest predicts a constant), or why it has none. `rows` holds one trial each: its
/// parameters, in the order of `scales`, and its final result.
pub fn fanova(
    scales: &[Scale],
    rows: &[(Vec<Value>, f64)],
    seed: u64,
) -> Vec<Result<f64, Skipped>> {
    let mut result: Vec<Result<f64, Skipped>> = vec![Ok(0.0); scales.len()];
    // Each row's point in the unit cube, over the parameters that vary.
    let mut dims: Vec<usize> = Vec::new();
    let mut columns: Vec<Vec<f64>> = Vec::new();
    for (index, scale) in scales.iter().enumerate() {
        match encode(scale, rows.iter().map(|(values, _)| values[index])) {
            Ok(column) => {
                dims.push(index);
                columns.push(column);
            }
            Err(skipped) => result[index] = Err(skipped),
        }
    }
    if dims.is_empty() || rows.len() < 2 {
        return result;
    }
    let points: Vec<Vec<f64>> = (0..rows.len())
        .map(|row| columns.iter().map(|column| column[row]).collect())
        .collect();
    // Shares are ratios of variances, so the targets' unit does not matter: they are brought to
    // at most 1 in magnitude, by a power of two (exact), because the variance of finals near
    // f64's limit (1e200) overflows to inf and made every share 0 or NaN. The power is applied
    // in two halves since 2^-1024 itself is out of range.
    let largest = rows.iter().map(|(_, y)| y.abs()).fold(0.0, f64::max);
    let exponent = if largest > 0.0 && largest.is_finite() {
        largest.log2().ceil() as i32
    } else {
        0
    };
    let (half, rest) = (
        2f64.powi(-(exponent / 2)),
        2f64.powi(-(exponent - exponent / 2)),
    );
    let targets: Vec<f64> = rows.iter().map(|(_, y)| y * half * rest).collect();
    let shares = forest_shares(&points, &targets, dims.len(), seed);
    for (share, &index) in shares.into_iter().zip(&dims) {
        result[index] = Ok(share);
    }
    result
}

/// A parameter's values as coordinates in [0, 1].
fn encode(scale: &Scale, values: impl Iterator<Item = Value>) -> Result<Vec<f64>, Skipped> {
    match scale {
        Scale::Choice { options } => {
            let k = (*options).max(1) as f64;
            let column: Vec<f64> = values
                .map(|v| match v {
                    Value::Choice(i) => (i as f64 + 0.5) / k,
                    Value::Number(x) => x,
                })
                .collect();
            let first = column.first().copied().unwrap_or(0.0);
            if column.iter().all(|&x| x == first) {
                return Err(Skipped::Constant);
            }
            Ok(column)
        }
        Scale::Number { log } => {
            let mut column = Vec::new();
            for value in values {
                let x = match value {
                    Value::Number(x) => x,
                    Value::Choice(i) => i as f64,
                };
                if *log && x <= 0.0 {
                    return Err(Skipped::NotPositive);
                }
                column.push(if *log { x.ln() } else { x });
            }
            let low = column.iter().copied().fold(f64::INFINITY, f64::min);
            let high = column.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if high <= low || !(high - low).is_finite() {
                return Err(Skipped::Constant);
            }
            Ok(column
                .into_iter()
                .map(|x| (x - low) / (high - low))
                .collect())
        }
    }
}

/// A node of a regression tree: a split, or a leaf when `feature` is `None`.
struct Node {
    feature: Option<usize>,
    threshold: f64,
    left: usize,
    right: usize,
    value: f64,
}

/// Each dimension's share of the forest's variance, averaged over the trees and scaled to sum
/// to 1. The trees are grown in parallel, each from its own seed, so the result does not depend
/// on the number of threads.
fn forest_shares(points: &[Vec<f64>], targets: &[f64], d: usize, seed: u64) -> Vec<f64> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(TREES);
    let per_tree: Vec<Option<Vec<f64>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || {
                    (thread..TREES)
                        .step_by(threads)
                        .map(|tree| {
                            let mut rng = StdRng::seed_from_u64(
                                seed ^ (tree as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                            );
                            let sample: Vec<usize> = (0..points.len())
                                .map(|_| rng.gen_range(0..points.len()))
                                .collect();
                            let nodes = grow(points, targets, sample, d);
                            (tree, tree_shares(&nodes, d))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<(usize, Option<Vec<f64>>)> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect();
        all.sort_by_key(|(tree, _)| *tree);
        all.into_iter().map(|(_, shares)| shares).collect()
    });
    let mut mean = vec![0.0; d];
    let mut counted = 0usize;
    for shares in per_tree.into_iter().flatten() {
        for (m, s) in mean.iter_mut().zip(shares) {
            *m += s;
        }
        counted += 1;
    }
    let total: f64 = mean.iter().sum();
    if counted == 0 || total <= 0.0 {
        return vec![0.0; d];
    }
    mean.into_iter().map(|m| m / total).collect()
}

/// Grows one CART regression tree on the rows in `sample` (with repeats: a bootstrap sample).
fn grow(points: &[Vec<f64>], targets: &[f64], sample: Vec<usize>, d: usize) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::new();
    // (node index, its rows, depth)
    let mut pending: Vec<(usize, Vec<usize>, usize)> = Vec::new();
    nodes.push(leaf(targets, &sample));
    pending.push((0, sample, 0));
    while let Some((index, rows, depth)) = pending.pop() {
        if rows.len() < 2 || depth >= MAX_DEPTH {
            continue;
        }
        let Some((feature, threshold)) = best_split(points, targets, &rows, d) else {
            continue;
        };
        let (left_rows, right_rows): (Vec<usize>, Vec<usize>) = rows
            .into_iter()
            .partition(|&r| points[r][feature] <= threshold);
        let left = nodes.len();
        nodes.push(leaf(targets, &left_rows));
        let right = nodes.len();
        nodes.push(leaf(targets, &right_rows));
        let node = &mut nodes[index];
        node.feature = Some(feature);
        node.threshold = threshold;
        node.left = left;
        node.right = right;
        pending.push((left, left_rows, depth + 1));
        pending.push((right, right_rows, depth + 1));
    }
    nodes
}

fn leaf(targets: &[f64], rows: &[usize]) -> Node {
    let value = rows.iter().map(|&r| targets[r]).sum::<f64>() / rows.len().max(1) as f64;
    Node {
        feature: None,
        threshold: 0.0,
        left: 0,
        right: 0,
        value,
    }
}

/// The split of `rows` that leaves the least squared error, as (feature, threshold between two
/// neighbouring values); `None` when no split lowers it (all targets equal, or all points the
/// same).
// A feature is a column of every point, not an element of one slice: the range loop is the
// clear way to walk them.
#[allow(clippy::needless_range_loop)]
fn best_split(
    points: &[Vec<f64>],
    targets: &[f64],
    rows: &[usize],
    d: usize,
) -> Option<(usize, f64)> {
    let n = rows.len() as f64;
    let sum: f64 = rows.iter().map(|&r| targets[r]).sum();
    let sum_sq: f64 = rows.iter().map(|&r| targets[r] * targets[r]).sum();
    let parent = sum_sq - sum * sum / n;
    if parent <= 1e-12 * sum_sq.abs().max(1e-300) {
        return None;
    }
    let mut best: Option<(f64, usize, f64)> = None;
    let mut order: Vec<usize> = rows.to_vec();
    for feature in 0..d {
        order.sort_by(|&a, &b| points[a][feature].total_cmp(&points[b][feature]));
        let (mut left_sum, mut left_sq) = (0.0, 0.0);
        for i in 0..order.len() - 1 {
            let y = targets[order[i]];
            left_sum += y;
            left_sq += y * y;
            let (x, next) = (points[order[i]][feature], points[order[i + 1]][feature]);
            if x == next {
                continue;
            }
            let left_n = (i + 1) as f64;
            let right_n = n - left_n;
            let right_sum = sum - left_sum;
            let error = (left_sq - left_sum * left_sum / left_n)
                + (sum_sq - left_sq - right_sum * right_sum / right_n);
            if best.is_none_or(|(e, _, _)| error < e) {
                best = Some((error, feature, (x + next) / 2.0));
            }
        }
    }
    best.filter(|(error, _, _)| *error < parent)
        .map(|(_, feature, threshold)| (feature, threshold))
}

/// Each dimension's share of one tree's variance over the unit cube; `None` for a tree that
/// predicts a constant.
fn tree_shares(nodes: &[Node], d: usize) -> Option<Vec<f64>> {
    // Every leaf's box and value.
    let mut leaves: Vec<(Vec<f64>, Vec<f64>, f64)> = Vec::new();
    let mut cuts: Vec<Vec<f64>> = vec![vec![0.0, 1.0]; d];
    let mut stack = vec![(0usize, vec![0.0; d], vec![1.0; d])];
    while let Some((index, low, high)) = stack.pop() {
        let node = &nodes[index];
        match node.feature {
            None => leaves.push((low, high, node.value)),
            Some(f) => {
                let t = node.threshold.clamp(low[f], high[f]);
                cuts[f].push(t);
                let mut left_high = high.clone();
                left_high[f] = t;
                let mut right_low = low.clone();
                right_low[f] = t;
                stack.push((node.left, low, left_high));
                stack.push((node.right, right_low, high));
            }
        }
    }
    let volume =
        |low: &[f64], high: &[f64]| low.iter().zip(high).map(|(l, h)| h - l).product::<f64>();
    let mean: f64 = leaves.iter().map(|(l, h, v)| volume(l, h) * v).sum();
    let variance: f64 = leaves
        .iter()
        .map(|(l, h, v)| volume(l, h) * (v - mean) * (v - mean))
        .sum();
    if variance <= 1e-14 * mean.abs().max(1.0).powi(2) {
        return None;
    }
    let mut shares = Vec::with_capacity(d);
    for (f, points) in cuts.iter_mut().enumerate() {
        points.sort_by(f64::total_cmp);
        points.dedup();
        let intervals = points.len() - 1;
        // The marginal on each interval of dimension f: the sum over the leaves whose box spans
        // it of value × (the box's volume in the other dimensions), added as a difference array.
        let mut delta = vec![0.0; intervals + 1];
        for (low, high, value) in &leaves {
            let width = high[f] - low[f];
            if width <= 0.0 {
                continue;
            }
            let weight = value * volume(low, high) / width;
            let from = points.partition_point(|&p| p < low[f]);
            let to = points.partition_point(|&p| p < high[f]);
            delta[from] += weight;
            delta[to] -= weight;
        }
        let mut marginal = 0.0;
        let mut explained = 0.0;
        for k in 0..intervals {
            marginal += delta[k];
            let length = points[k + 1] - points[k];
            explained += length * (marginal - mean) * (marginal - mean);
        }
        shares.push(explained / variance);
    }
    Some(shares)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// y = 10·a + b, c unused: a explains nearly all, c nothing.
    #[test]
    fn a_dominant_parameter_ranks_first_and_an_unused_one_last() {
        let mut rng = StdRng::seed_from_u64(1);
        let rows: Vec<(Vec<Value>, f64)> = (0..300)
            .map(|_| {
                let (a, b, c) = (rng.gen::<f64>(), rng.gen::<f64>(), rng.gen_range(0..3));
                (
                    vec![Value::Number(a), Value::Number(b), Value::Choice(c)],
                    10.0 * a + b,
                )
            })
            .collect();
        let scales = [
            Scale::Number { log: false },
            Scale::Number { log: false },
            Scale::Choice { options: 3 },
        ];
        let shares: Vec<f64> = fanova(&scales, &rows, 0)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert!(shares[0] > 0.9, "{shares:?}");
        assert!(shares[1] > shares[2], "{shares:?}");
        assert!(shares[2] < 0.01, "{shares:?}");
        assert!(
            (shares.iter().sum::<f64>() - 1.0).abs() < 1e-9,
            "{shares:?}"
        );
    }

    #[test]
    fn a_constant_parameter_is_skipped_and_a_log_scale_needs_positive_values() {
        let rows: Vec<(Vec<Value>, f64)> = (0..20)
            .map(|i| {
                let x = i as f64 / 20.0;
                (
                    vec![Value::Number(x), Value::Number(1.0), Value::Number(x - 0.5)],
                    x,
                )
            })
            .collect();
        let scales = [
            Scale::Number { log: false },
            Scale::Number { log: false },
            Scale::Number { log: true },
        ];
        let result = fanova(&scales, &rows, 0);
        assert_eq!(result[0], Ok(1.0));
        assert_eq!(result[1], Err(Skipped::Constant));
        assert_eq!(result[2], Err(Skipped::NotPositive));
    }

    #[test]
    fn the_same_seed_gives_the_same_answer() {
        let rows: Vec<(Vec<Value>, f64)> = (0..50)
            .map(|i| {
                let (a, b) = ((i * 7 % 50) as f64, (i * 13 % 50) as f64);
                (vec![Value::Number(a), Value::Number(b)], a * a + b)
            })
            .collect();
        let scales = [Scale::Number { log: false }, Scale::Number { log: false }];
        assert_eq!(fanova(&scales, &rows, 7), fanova(&scales, &rows, 7));
    }
}
