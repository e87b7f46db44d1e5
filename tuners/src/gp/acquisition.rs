//! Acquisition functions and their maximization over the unit cube.
//!
//! The model predicts standardized *losses* (lower is better, whatever `optimize_mode` says).
//! Maximization: score `warm_up` candidates (three quarters drawn from the prior, one quarter
//! perturbations of the best observed points), then refine the best `starting_points` of them
//! by a pattern search (continuous coordinates step up and down with a halving step, integers
//! by whole values, categorical ones try every value). A normal-family coordinate is searched
//! within [`GAUSSIAN_SEARCH_Z`] standard deviations of its mean.

use rand::Rng;

use super::model::GaussianProcess;
use crate::common::normal_tail::{
    log_expected_improvement_factor, log_normal_cdf, normal_cdf_precise,
};
use crate::common::unit_cube::{Axis, UnitCube};
use knob_plugin_api::space::standard_normal;

/// How far from its mean, in standard deviations, the search takes a normal-family parameter.
/// In the cube its prior is uniform on `[0, 1]`, whose faces are the encoding's ±10 σ; an
/// acquisition, most uncertain far from the data, is often best on a face, and half of GP's
/// suggestions were 10 σ out (a dropout of -0.2, a learning rate of 22). ±3 σ holds 99.7 % of
/// the prior; the cold start's draws from the prior still go as far as the prior does.
pub(crate) const GAUSSIAN_SEARCH_Z: f64 = 3.0;

/// NNI's `utility` classArg.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Utility {
    /// `ei`: expected improvement over the best observed loss, compared by its logarithm so
    /// that it still ranks points where it is astronomically small.
    ExpectedImprovement,
    /// `ucb`: `-(mean - kappa · sd)`, the lower confidence bound of the loss.
    UpperConfidenceBound,
    /// `poi`: probability of improvement, compared by its logarithm.
    ProbabilityOfImprovement,
}

/// One acquisition function over a fitted model: larger is more worth trying.
pub(crate) struct Acquisition<'a> {
    pub(crate) model: &'a GaussianProcess,
    pub(crate) utility: Utility,
    pub(crate) kappa: f64,
    pub(crate) xi: f64,
    /// The best (lowest) standardized loss observed.
    pub(crate) best: f64,
}

impl Acquisition<'_> {
    pub(crate) fn value(&self, x: &[f64]) -> f64 {
        let (mean, sd) = self.model.predict(x);
        let sd = sd.max(1e-12);
        let improvement = self.best - mean - self.xi;
        match self.utility {
            Utility::ExpectedImprovement => {
                sd.ln() + log_expected_improvement_factor(improvement / sd)
            }
            Utility::ProbabilityOfImprovement => log_normal_cdf(improvement / sd),
            Utility::UpperConfidenceBound => -(mean - self.kappa * sd),
        }
    }
}

/// Candidates scored by `acquisition`, best first: the refined starting points and the rest of
/// the warm-up set. `incumbents` are observed points, best first, to perturb.
pub(crate) fn ranked_candidates<R: Rng + ?Sized>(
    acquisition: &Acquisition,
    cube: &UnitCube,
    incumbents: &[Vec<f64>],
    warm_up: usize,
    starting_points: usize,
    rng: &mut R,
) -> Vec<(f64, Vec<f64>)> {
    let local = if incumbents.is_empty() {
        0
    } else {
        warm_up / 4
    };
    let mut candidates: Vec<Vec<f64>> = (0..warm_up - local)
        .map(|_| {
            let mut point = cube.sample(rng);
            confine(cube, &mut point);
            point
        })
        .collect();
    for i in 0..local {
        let mut point = incumbents[i % incumbents.len().min(5)].clone();
        perturb(cube, &mut point, 0.05 + 0.15 * rng.gen::<f64>(), rng);
        candidates.push(point);
    }
    let mut scored: Vec<(f64, Vec<f64>)> = candidates
        .into_iter()
        .map(|x| (acquisition.value(&x), x))
        .collect();
    sort_best_first(&mut scored);
    let refined: Vec<(f64, Vec<f64>)> = scored
        .iter()
        .take(starting_points)
        .map(|(value, x)| pattern_search(acquisition, cube, x.clone(), *value, rng))
        .collect();
    scored.extend(refined);
    sort_best_first(&mut scored);
    scored
}

/// Sorts by score, best first; equal scores keep their order, so the result is deterministic.
pub(crate) fn sort_best_first(scored: &mut [(f64, Vec<f64>)]) {
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
}

/// Moves `point` a little: ordered coordinates by `N(0, scale²)`, each categorical one to a
/// random value with probability `1 / dims`.
fn perturb<R: Rng + ?Sized>(cube: &UnitCube, point: &mut [f64], scale: f64, rng: &mut R) {
    let dims = cube.len().max(1) as f64;
    for (i, axis) in cube.axes().iter().enumerate() {
        if point[i].is_nan() {
            continue;
        }
        match *axis {
            Axis::Continuous { .. } => point[i] += scale * standard_normal(rng),
            Axis::Integer { .. } => {
                let resolution = axis.resolution();
                let moved = point[i] + scale.max(resolution) * standard_normal(rng);
                point[i] = (moved / resolution).round() * resolution;
            }
            Axis::Categorical { .. } => {
                if rng.gen::<f64>() < 1.0 / dims {
                    point[i] = cube.sample_axis(i, rng);
                }
            }
        }
    }
    cube.repair(point, rng);
    confine(cube, point);
}

/// Clamps the normal-family coordinates of `point` to ±[`GAUSSIAN_SEARCH_Z`] σ.
fn confine(cube: &UnitCube, point: &mut [f64]) {
    let (low, high) = (
        normal_cdf_precise(-GAUSSIAN_SEARCH_Z),
        normal_cdf_precise(GAUSSIAN_SEARCH_Z),
    );
    for (x, axis) in point.iter_mut().zip(cube.axes()) {
        if *axis == (Axis::Continuous { gaussian: true }) && !x.is_nan() {
            *x = x.clamp(low, high);
        }
    }
}

/// Coordinate pattern search from `start`: first improvement per coordinate, the step halved
/// after a sweep without one, until the step is below 1e-4 or the evaluation budget is spent.
fn pattern_search<R: Rng + ?Sized>(
    acquisition: &Acquisition,
    cube: &UnitCube,
    start: Vec<f64>,
    start_value: f64,
    rng: &mut R,
) -> (f64, Vec<f64>) {
    const FIRST_STEP: f64 = 0.1;
    let (mut x, mut best) = (start, start_value);
    let budget = 40 * cube.len() + 60;
    let mut evaluations = 0;
    let mut step = FIRST_STEP;
    while step >= 1e-4 && evaluations < budget {
        let mut improved = false;
        for (i, axis) in cube.axes().iter().enumerate() {
            if x[i].is_nan() {
                continue;
            }
            let moves: Vec<f64> = match *axis {
                Axis::Continuous { .. } => vec![x[i] + step, x[i] - step],
                Axis::Integer { .. } => {
                    let resolution = axis.resolution();
                    let by = (step / resolution).round().max(1.0) * resolution;
                    vec![x[i] + by, x[i] - by]
                }
                // Every other value, but only while the step is coarse: it does not shrink.
                Axis::Categorical { size } if step == FIRST_STEP => {
                    (0..size).map(|v| v as f64).filter(|&v| v != x[i]).collect()
                }
                Axis::Categorical { .. } => Vec::new(),
            };
            for coordinate in moves {
                let mut y = x.clone();
                y[i] = coordinate;
                cube.repair(&mut y, rng);
                confine(cube, &mut y);
                if y[i] == x[i] {
                    continue;
                }
                evaluations += 1;
                let value = acquisition.value(&y);
                if value > best {
                    (x, best) = (y, value);
                    improved = true;
                    break;
                }
            }
        }
        if !improved {
            step /= 2.0;
        }
    }
    (best, x)
}
