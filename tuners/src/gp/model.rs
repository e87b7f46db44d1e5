//! The Gaussian process: a Matérn kernel with one length scale per dimension (ARD), a signal
//! variance and a noise variance, fitted by maximizing the log marginal likelihood plus weak
//! log-normal priors (which keep a fit on a handful of points from running off to extreme length
//! scales); then the posterior mean and standard deviation anywhere.
//!
//! Inputs are [`UnitCube`](crate::common::unit_cube::UnitCube) points. The squared distance is
//! `Σ sᵢ / ℓᵢ²` with `sᵢ` per dimension: `(a - b)²` for ordered coordinates, `0` or `1` (same or
//! different index) for categorical ones, and for nested-choice sub-parameters `0` when both
//! points lack the dimension and `1` when only one has it. Targets are standardized (zero mean,
//! unit variance) by the caller.

use rand::Rng;

use crate::common::lbfgs;
use crate::common::linalg::Cholesky;
use knob_plugin_api::space::standard_normal;

/// Matérn's ν: how smooth the modelled function is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Smoothness {
    /// ν = 1/2: the exponential kernel, continuous but rough.
    Half,
    /// ν = 3/2: once differentiable.
    ThreeHalves,
    /// ν = 5/2: twice differentiable, the usual choice for hyperparameter surfaces.
    FiveHalves,
}

impl Smoothness {
    /// `k(r²)` and `dk/d(r²)` for unit signal variance.
    fn kernel(self, r2: f64) -> (f64, f64) {
        let r = r2.sqrt();
        match self {
            Smoothness::Half => {
                let e = (-r).exp();
                // The derivative is infinite at r = 0, where every sᵢ is 0: report 0 so the
                // product with sᵢ in the gradient is 0, not NaN.
                (e, if r > 0.0 { -e / (2.0 * r) } else { 0.0 })
            }
            Smoothness::ThreeHalves => {
                let sr = 3f64.sqrt() * r;
                let e = (-sr).exp();
                ((1.0 + sr) * e, -1.5 * e)
            }
            Smoothness::FiveHalves => {
                let sr = 5f64.sqrt() * r;
                let e = (-sr).exp();
                ((1.0 + sr + 5.0 * r2 / 3.0) * e, -5.0 / 6.0 * (1.0 + sr) * e)
            }
        }
    }
}

/// What one dimension contributes to the squared distance before its length scale.
pub(crate) fn squared_difference(a: f64, b: f64, categorical: bool) -> f64 {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => 0.0,
        (true, false) | (false, true) => 1.0,
        _ if categorical => f64::from(u8::from(a != b)),
        _ => (a - b) * (a - b),
    }
}

/// Fitted kernel hyperparameters, on the log scale they are optimized on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hyperparameters {
    pub(crate) log_length_scales: Vec<f64>,
    pub(crate) log_signal_variance: f64,
    /// The noise variance is `noise_floor + exp(log_extra_noise)`.
    pub(crate) log_extra_noise: f64,
}

/// The prior's centre and spread for each log hyperparameter, in `Hyperparameters` order.
fn prior(dims: usize) -> Vec<(f64, f64)> {
    // Typical length scales grow like √d in the unit cube: points are farther apart.
    let length = ((0.5 * (dims.max(1) as f64).sqrt()).ln(), 1.5);
    let mut out = vec![length; dims];
    out.push((0.0, 1.5));
    out.push(((1e-4f64).ln(), 3.0));
    out
}

/// Where each log hyperparameter is clamped after the fit, in `Hyperparameters` order.
fn limits(dims: usize) -> Vec<(f64, f64)> {
    let mut out = vec![((1e-3f64).ln(), (1e3f64).ln()); dims];
    out.push(((1e-3f64).ln(), (1e3f64).ln()));
    out.push(((1e-12f64).ln(), (10f64).ln()));
    out
}

/// The training data's pairwise per-dimension differences, computed once per fit.
struct Distances {
    n: usize,
    /// `per_dim[i][a * n + b]` is `sᵢ` between points a and b.
    per_dim: Vec<Vec<f64>>,
}

impl Distances {
    fn new(points: &[Vec<f64>], categorical: &[bool]) -> Distances {
        let n = points.len();
        let per_dim = (0..categorical.len())
            .map(|i| {
                let mut s = vec![0.0; n * n];
                for a in 0..n {
                    for b in 0..a {
                        let d = squared_difference(points[a][i], points[b][i], categorical[i]);
                        s[a * n + b] = d;
                        s[b * n + a] = d;
                    }
                }
                s
            })
            .collect();
        Distances { n, per_dim }
    }

    fn r2(&self, a: usize, b: usize, inverse_length2: &[f64]) -> f64 {
        self.per_dim
            .iter()
            .zip(inverse_length2)
            .map(|(s, w)| s[a * self.n + b] * w)
            .sum()
    }
}

/// Fits the hyperparameters to `points` and standardized `targets`: L-BFGS on the negative log
/// posterior from the prior's centre and from `restarts` draws from the prior, best kept.
pub(crate) fn fit<R: Rng + ?Sized>(
    points: &[Vec<f64>],
    targets: &[f64],
    categorical: &[bool],
    smoothness: Smoothness,
    noise_floor: f64,
    restarts: usize,
    rng: &mut R,
) -> Hyperparameters {
    let dims = categorical.len();
    let distances = Distances::new(points, categorical);
    let prior = prior(dims);
    let objective = |theta: &[f64]| {
        negative_log_posterior(theta, &distances, targets, smoothness, noise_floor, &prior)
    };
    let mut starts = vec![prior.iter().map(|(m, _)| *m).collect::<Vec<f64>>()];
    for _ in 0..restarts {
        starts.push(
            prior
                .iter()
                .map(|(m, sd)| m + sd * standard_normal(rng))
                .collect(),
        );
    }
    let best = starts
        .into_iter()
        .map(|start| lbfgs::minimize(objective, start, 60))
        .filter(|m| m.value.is_finite())
        .min_by(|a, b| a.value.total_cmp(&b.value));
    let theta = best.map_or_else(|| prior.iter().map(|(m, _)| *m).collect(), |m| m.x);
    let theta: Vec<f64> = theta
        .iter()
        .zip(limits(dims))
        .map(|(t, (low, high))| t.clamp(low, high))
        .collect();
    Hyperparameters {
        log_length_scales: theta[..dims].to_vec(),
        log_signal_variance: theta[dims],
        log_extra_noise: theta[dims + 1],
    }
}

/// `-(log marginal likelihood + log prior)` and its gradient.
fn negative_log_posterior(
    theta: &[f64],
    distances: &Distances,
    targets: &[f64],
    smoothness: Smoothness,
    noise_floor: f64,
    prior: &[(f64, f64)],
) -> (f64, Vec<f64>) {
    let n = distances.n;
    let dims = distances.per_dim.len();
    let inverse_length2: Vec<f64> = theta[..dims].iter().map(|t| (-2.0 * t).exp()).collect();
    let signal = theta[dims].exp();
    let extra_noise = theta[dims + 1].exp();
    let noise = noise_floor + extra_noise;
    let mut kernel = vec![0.0; n * n];
    let mut slope = vec![0.0; n * n];
    for a in 0..n {
        kernel[a * n + a] = signal + noise;
        for b in 0..a {
            let (k, dk) = smoothness.kernel(distances.r2(a, b, &inverse_length2));
            kernel[a * n + b] = signal * k;
            kernel[b * n + a] = signal * k;
            slope[a * n + b] = signal * dk;
        }
    }
    let Some(cholesky) = Cholesky::factor(&kernel, n) else {
        return (f64::INFINITY, vec![0.0; theta.len()]);
    };
    let mut alpha = targets.to_vec();
    cholesky.solve(&mut alpha);
    let data_fit: f64 = targets.iter().zip(&alpha).map(|(y, a)| y * a).sum();
    let log_likelihood = -0.5 * data_fit
        - 0.5 * cholesky.log_det()
        - 0.5 * n as f64 * (2.0 * std::f64::consts::PI).ln();

    // d(log likelihood)/dθ = ½ tr(W ∂K/∂θ) with W = ααᵀ - K⁻¹.
    let inverse = cholesky.inverse();
    let w = |a: usize, b: usize| alpha[a] * alpha[b] - inverse[a * n + b];
    let mut gradient = vec![0.0; theta.len()];
    let mut trace_w = 0.0;
    let mut signal_term = 0.0;
    for a in 0..n {
        trace_w += w(a, a);
        signal_term += w(a, a) * signal;
        for b in 0..a {
            let wab = w(a, b);
            // Both triangles: the factor ½ cancels the 2.
            signal_term += 2.0 * wab * kernel[a * n + b];
            let g = wab * slope[a * n + b];
            for (i, s) in distances.per_dim.iter().enumerate() {
                // ∂r²/∂ln ℓᵢ = -2 sᵢ / ℓᵢ².
                gradient[i] += g * -2.0 * s[a * n + b] * inverse_length2[i];
            }
        }
    }
    gradient[dims] = 0.5 * signal_term;
    gradient[dims + 1] = 0.5 * extra_noise * trace_w;

    let mut log_prior = 0.0;
    for (j, (mean, sd)) in prior.iter().enumerate() {
        let z = (theta[j] - mean) / sd;
        log_prior -= 0.5 * z * z;
        gradient[j] -= z / sd;
    }
    (
        -(log_likelihood + log_prior),
        gradient.iter().map(|g| -g).collect(),
    )
}

/// A Gaussian process conditioned on its training points: ready to predict.
#[derive(Debug, Clone)]
pub(crate) struct GaussianProcess {
    points: Vec<Vec<f64>>,
    categorical: Vec<bool>,
    inverse_length2: Vec<f64>,
    signal: f64,
    smoothness: Smoothness,
    cholesky: Cholesky,
    /// `K⁻¹ y`.
    weights: Vec<f64>,
}

impl GaussianProcess {
    /// Conditions on `points` with `targets` under `hyper`. The kernel matrix gets more jitter
    /// until it factors (duplicated points with almost no noise make it singular).
    pub(crate) fn condition(
        points: Vec<Vec<f64>>,
        targets: &[f64],
        categorical: Vec<bool>,
        hyper: &Hyperparameters,
        smoothness: Smoothness,
        noise_floor: f64,
    ) -> Option<GaussianProcess> {
        let n = points.len();
        let inverse_length2: Vec<f64> = hyper
            .log_length_scales
            .iter()
            .map(|t| (-2.0 * t).exp())
            .collect();
        let signal = hyper.log_signal_variance.exp();
        let noise = noise_floor + hyper.log_extra_noise.exp();
        let distances = Distances::new(&points, &categorical);
        let mut kernel = vec![0.0; n * n];
        for a in 0..n {
            for b in 0..a {
                let k = signal * smoothness.kernel(distances.r2(a, b, &inverse_length2)).0;
                kernel[a * n + b] = k;
                kernel[b * n + a] = k;
            }
        }
        let mut jitter = 0.0;
        let cholesky = loop {
            for a in 0..n {
                kernel[a * n + a] = signal + noise + jitter;
            }
            if let Some(c) = Cholesky::factor(&kernel, n) {
                break c;
            }
            jitter = if jitter == 0.0 { 1e-10 } else { jitter * 100.0 };
            if jitter > signal {
                return None;
            }
        };
        let mut weights = targets.to_vec();
        cholesky.solve(&mut weights);
        Some(GaussianProcess {
            points,
            categorical,
            inverse_length2,
            signal,
            smoothness,
            cholesky,
            weights,
        })
    }

    /// The posterior mean and standard deviation of the latent function at `x`.
    pub(crate) fn predict(&self, x: &[f64]) -> (f64, f64) {
        let mut k: Vec<f64> = self
            .points
            .iter()
            .map(|p| {
                let r2: f64 = p
                    .iter()
                    .zip(x)
                    .zip(&self.categorical)
                    .zip(&self.inverse_length2)
                    .map(|(((a, b), c), w)| squared_difference(*a, *b, *c) * w)
                    .sum();
                self.signal * self.smoothness.kernel(r2).0
            })
            .collect();
        let mean: f64 = k.iter().zip(&self.weights).map(|(a, b)| a * b).sum();
        self.cholesky.solve_lower(&mut k);
        let explained: f64 = k.iter().map(|v| v * v).sum();
        let variance = (self.signal - explained).max(0.0);
        (mean, variance.sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knob_plugin_api::space::seeded_rng;

    #[test]
    fn the_gradient_matches_finite_differences() {
        let points: Vec<Vec<f64>> = (0..7)
            .map(|i| {
                let t = f64::from(i) / 6.0;
                vec![t, (3.0 * t).sin().abs(), f64::from(i % 3)]
            })
            .collect();
        let targets: Vec<f64> = points.iter().map(|p| p[0] * 2.0 - p[1] + p[2]).collect();
        let distances = Distances::new(&points, &[false, false, true]);
        let prior = prior(3);
        for smoothness in [
            Smoothness::Half,
            Smoothness::ThreeHalves,
            Smoothness::FiveHalves,
        ] {
            let theta = [-0.7, 0.2, 0.4, 0.3, -3.0];
            let f = |t: &[f64]| {
                negative_log_posterior(t, &distances, &targets, smoothness, 1e-6, &prior)
            };
            let (_, gradient) = f(&theta);
            for j in 0..theta.len() {
                let h = 1e-6;
                let mut up = theta;
                up[j] += h;
                let mut down = theta;
                down[j] -= h;
                let numeric = (f(&up).0 - f(&down).0) / (2.0 * h);
                assert!(
                    (numeric - gradient[j]).abs() < 1e-4 * numeric.abs().max(1.0),
                    "{smoothness:?} θ{j}: analytic {} numeric {numeric}",
                    gradient[j]
                );
            }
        }
    }

    #[test]
    fn a_fit_interpolates_a_smooth_function() {
        let points: Vec<Vec<f64>> = (0..12).map(|i| vec![f64::from(i) / 11.0]).collect();
        let targets: Vec<f64> = points.iter().map(|p| (6.0 * p[0]).sin()).collect();
        let hyper = fit(
            &points,
            &targets,
            &[false],
            Smoothness::FiveHalves,
            1e-6,
            2,
            &mut seeded_rng(1),
        );
        let gp = GaussianProcess::condition(
            points,
            &targets,
            vec![false],
            &hyper,
            Smoothness::FiveHalves,
            1e-6,
        )
        .unwrap();
        let (mean, sd) = gp.predict(&[0.5]);
        assert!((mean - 3f64.sin()).abs() < 0.05, "{mean} {sd} {hyper:?}");
        assert!(sd < 0.1);
    }
}
