//! The CMA-ES update (Hansen, "The CMA Evolution Strategy: A Tutorial", 2016): one search
//! distribution `N(m, σ² C)` over the unit cube `[0, 1]^d`, sampled by [`Strategy::sample`] and
//! updated from a ranked generation by [`Strategy::tell`], with the tutorial's default
//! constants (positive weights only), and the tutorial's stopping conditions for restarts.

use knob_plugin_api::space::standard_normal;
use rand::Rng;

use crate::common::linalg::symmetric_eigen;

/// Draws outside the unit cube tried again before the last one is clipped into it.
const RESAMPLES_INSIDE: usize = 10;
/// Below this spread (in units of a parameter's range) the search has converged.
const TOLERANCE_X: f64 = 1e-6;
/// Losses within this of each other over the recent generations: nothing more to learn here.
const TOLERANCE_LOSS: f64 = 1e-12;
/// A covariance more elongated than this is numerically useless.
const MAX_CONDITION: f64 = 1e14;

/// One search distribution and its evolution paths.
#[derive(Debug, Clone)]
pub(crate) struct Strategy {
    dims: usize,
    population: usize,
    weights: Vec<f64>,
    mu_eff: f64,
    c_sigma: f64,
    d_sigma: f64,
    c_c: f64,
    c_1: f64,
    c_mu: f64,
    /// `E‖N(0, I)‖`.
    chi_n: f64,
    mean: Vec<f64>,
    sigma: f64,
    covariance: Vec<f64>,
    /// `C = B diag(D²) Bᵀ`: eigenvectors in columns, and the square roots of the eigenvalues.
    basis: Vec<f64>,
    scales: Vec<f64>,
    path_sigma: Vec<f64>,
    path_c: Vec<f64>,
    generations: u64,
    /// The best loss of each generation, for the flat-fitness stop.
    recent_best: Vec<f64>,
}

impl Strategy {
    /// A distribution centred at `mean` with step size `sigma` and identity covariance, sampling
    /// `population` points per generation (λ).
    pub(crate) fn new(mean: Vec<f64>, sigma: f64, population: usize) -> Strategy {
        let dims = mean.len();
        let d = dims.max(1) as f64;
        let lambda = population.max(2);
        let mu = lambda / 2;
        let raw: Vec<f64> = (1..=mu)
            .map(|i| ((lambda as f64 + 1.0) / 2.0).ln() - (i as f64).ln())
            .collect();
        let total: f64 = raw.iter().sum();
        let weights: Vec<f64> = raw.iter().map(|w| w / total).collect();
        let mu_eff = 1.0 / weights.iter().map(|w| w * w).sum::<f64>();
        let c_sigma = (mu_eff + 2.0) / (d + mu_eff + 5.0);
        let d_sigma = 1.0 + 2.0 * (((mu_eff - 1.0) / (d + 1.0)).sqrt() - 1.0).max(0.0) + c_sigma;
        let c_c = (4.0 + mu_eff / d) / (d + 4.0 + 2.0 * mu_eff / d);
        let c_1 = 2.0 / ((d + 1.3).powi(2) + mu_eff);
        let c_mu =
            (1.0 - c_1).min(2.0 * (mu_eff - 2.0 + 1.0 / mu_eff) / ((d + 2.0).powi(2) + mu_eff));
        let mut identity = vec![0.0; dims * dims];
        for i in 0..dims {
            identity[i * dims + i] = 1.0;
        }
        Strategy {
            dims,
            population: lambda,
            weights,
            mu_eff,
            c_sigma,
            d_sigma,
            c_c,
            c_1,
            c_mu,
            chi_n: d.sqrt() * (1.0 - 1.0 / (4.0 * d) + 1.0 / (21.0 * d * d)),
            mean,
            sigma,
            covariance: identity.clone(),
            basis: identity,
            scales: vec![1.0; dims],
            path_sigma: vec![0.0; dims],
            path_c: vec![0.0; dims],
            generations: 0,
            recent_best: Vec::new(),
        }
    }

    /// λ, the number of points per generation.
    pub(crate) fn population(&self) -> usize {
        self.population
    }

    /// A draw from `N(m, σ² C)` inside the unit cube: draws outside are redrawn a few times,
    /// then clipped.
    pub(crate) fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Vec<f64> {
        let mut x = Vec::new();
        for _ in 0..RESAMPLES_INSIDE {
            let z: Vec<f64> = (0..self.dims).map(|_| standard_normal(rng)).collect();
            x = (0..self.dims)
                .map(|i| {
                    let bdz: f64 = (0..self.dims)
                        .map(|k| self.basis[i * self.dims + k] * self.scales[k] * z[k])
                        .sum();
                    self.mean[i] + self.sigma * bdz
                })
                .collect();
            if x.iter().all(|v| (0.0..=1.0).contains(v)) {
                return x;
            }
        }
        x.iter().map(|v| v.clamp(0.0, 1.0)).collect()
    }

    /// `point` pulled towards the mean until its Mahalanobis distance is plausible for a draw, so
    /// that a point this distribution did not sample (an imported trial) cannot wreck the update
    /// (Hansen, "Injecting External Solutions Into CMA-ES", 2011).
    pub(crate) fn clip_injected(&self, point: &[f64]) -> Vec<f64> {
        let y: Vec<f64> = point
            .iter()
            .zip(&self.mean)
            .map(|(x, m)| (x - m) / self.sigma)
            .collect();
        let norm = self.whiten(&y).iter().map(|v| v * v).sum::<f64>().sqrt();
        let d = self.dims as f64;
        let limit = d.sqrt() + 2.0 * d / (d + 2.0);
        let factor = if norm > limit { limit / norm } else { 1.0 };
        y.iter()
            .zip(&self.mean)
            .map(|(y, m)| m + self.sigma * factor * y)
            .collect()
    }

    /// `C^(-1/2) y`.
    fn whiten(&self, y: &[f64]) -> Vec<f64> {
        let n = self.dims;
        let projected: Vec<f64> = (0..n)
            .map(|k| (0..n).map(|i| self.basis[i * n + k] * y[i]).sum::<f64>() / self.scales[k])
            .collect();
        (0..n)
            .map(|i| (0..n).map(|k| self.basis[i * n + k] * projected[k]).sum())
            .collect()
    }

    /// Updates the distribution from a generation's points and losses (lower is better; at
    /// least one). Uses the best `λ/2` of them.
    pub(crate) fn tell(&mut self, generation: &[(Vec<f64>, f64)]) {
        let n = self.dims;
        let mut ranked: Vec<&(Vec<f64>, f64)> = generation.iter().collect();
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
        self.recent_best.push(ranked[0].1);
        let worst = ranked[ranked.len() - 1].1;
        self.generations += 1;
        if n == 0 {
            return;
        }
        // Fewer points than μ (a generation cut short): renormalize the weights over them.
        let used = self.weights.len().min(ranked.len());
        let total: f64 = self.weights[..used].iter().sum();
        let weights: Vec<f64> = self.weights[..used].iter().map(|w| w / total).collect();
        let steps: Vec<Vec<f64>> = ranked[..used]
            .iter()
            .map(|(x, _)| {
                x.iter()
                    .zip(&self.mean)
                    .map(|(x, m)| (x - m) / self.sigma)
                    .collect()
            })
            .collect();
        let step: Vec<f64> = (0..n)
            .map(|i| weights.iter().zip(&steps).map(|(w, y)| w * y[i]).sum())
            .collect();
        for (m, y) in self.mean.iter_mut().zip(&step) {
            *m += self.sigma * y;
        }

        let whitened = self.whiten(&step);
        let sigma_gain = (self.c_sigma * (2.0 - self.c_sigma) * self.mu_eff).sqrt();
        for (p, w) in self.path_sigma.iter_mut().zip(&whitened) {
            *p = (1.0 - self.c_sigma) * *p + sigma_gain * w;
        }
        let path_norm = self.path_sigma.iter().map(|v| v * v).sum::<f64>().sqrt();
        let decay = 1.0 - (1.0 - self.c_sigma).powf(2.0 * self.generations as f64);
        // h_σ: the rank-one path only grows while the step-size path is not unusually long
        // (a step size still catching up would otherwise inflate C along it).
        let moderate_path = path_norm / decay.sqrt() < (1.4 + 2.0 / (n as f64 + 1.0)) * self.chi_n;
        let h_sigma = f64::from(u8::from(moderate_path));
        let c_gain = (self.c_c * (2.0 - self.c_c) * self.mu_eff).sqrt();
        for (p, y) in self.path_c.iter_mut().zip(&step) {
            *p = (1.0 - self.c_c) * *p + h_sigma * c_gain * y;
        }
        let delta = (1.0 - h_sigma) * self.c_c * (2.0 - self.c_c);
        let keep = 1.0 + self.c_1 * delta - self.c_1 - self.c_mu;
        for a in 0..n {
            for b in 0..=a {
                let rank_mu: f64 = weights
                    .iter()
                    .zip(&steps)
                    .map(|(w, y)| w * y[a] * y[b])
                    .sum();
                let value = keep * self.covariance[a * n + b]
                    + self.c_1 * self.path_c[a] * self.path_c[b]
                    + self.c_mu * rank_mu;
                self.covariance[a * n + b] = value;
                self.covariance[b * n + a] = value;
            }
        }
        let exponent = (self.c_sigma / self.d_sigma) * (path_norm / self.chi_n - 1.0);
        // A step size beyond the cube's size only produces clipped points.
        self.sigma = (self.sigma * exponent.min(1.0).exp()).min(1.0);
        if worst == ranked[0].1 {
            // Flat fitness (rounded parameters all landed on equal losses): widen the search.
            self.sigma = (self.sigma * (0.2 + self.c_sigma / self.d_sigma).exp()).min(1.0);
        }
        let (values, vectors) = symmetric_eigen(&self.covariance, n);
        self.basis = vectors;
        self.scales = values.iter().map(|v| v.max(1e-20).sqrt()).collect();
    }

    /// Why this run should restart, if it should: converged, degenerate, or flat.
    pub(crate) fn stop_reason(&self) -> Option<&'static str> {
        if self.dims == 0 {
            return None;
        }
        let spread = (0..self.dims)
            .map(|i| self.covariance[i * self.dims + i].sqrt())
            .fold(0.0, f64::max);
        if self.sigma * spread < TOLERANCE_X {
            return Some("the search distribution has shrunk to a point");
        }
        let (low, high) = self
            .scales
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(l, h), s| (l.min(*s), h.max(*s)));
        if (high / low).powi(2) > MAX_CONDITION {
            return Some("the covariance matrix is ill-conditioned");
        }
        let window = 10 + (30 * self.dims).div_ceil(self.population);
        if self.recent_best.len() >= window {
            let recent = &self.recent_best[self.recent_best.len() - window..];
            let (low, high) = recent
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
                    (l.min(*v), h.max(*v))
                });
            if high - low < TOLERANCE_LOSS {
                return Some("the best loss has not changed for many generations");
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knob_plugin_api::space::seeded_rng;

    #[test]
    fn converges_on_a_rotated_ellipsoid() {
        let f = |x: &[f64]| {
            let (a, b) = (x[0] - 0.3, x[1] - 0.6);
            (a + b).powi(2) + 100.0 * (a - b).powi(2)
        };
        let mut rng = seeded_rng(4);
        let mut strategy = Strategy::new(vec![0.5, 0.5], 0.2, 6);
        for _ in 0..150 {
            let generation: Vec<(Vec<f64>, f64)> = (0..strategy.population())
                .map(|_| {
                    let x = strategy.sample(&mut rng);
                    let loss = f(&x);
                    (x, loss)
                })
                .collect();
            strategy.tell(&generation);
        }
        assert!(f(&strategy.mean) < 1e-10, "{:?}", strategy.mean);
    }
}
