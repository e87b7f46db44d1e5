//! knob's TPE density: one Parzen mixture over whole points (multivariate TPE, as Optuna 4+),
//! so that a good region's coordinates are proposed together rather than each on its own; and
//! the same kernels one dimension at a time ([`suggest_independent`], Optuna's independent TPE,
//! its default with several objectives).
//!
//! Each finished trial is one component: a product, over the dimensions active in the point, of
//! a kernel centred on the trial's value; the prior is one more component. A dimension the trial
//! did not have (a parameter of another nested-choice option) takes the prior's kernel in that
//! component, so the mixture is a proper density over the tree-shaped space. Kernels:
//!
//! - numeric dimensions: a normal truncated to the dimension's range, with the neighbour-distance
//!   bandwidth of hyperopt and Optuna (the larger gap to the next lower and higher value) clipped
//!   to `[range / min(100, 1 + kernels), range]`; integers and linear q-types widen the range by
//!   half a step on each side so the end values are not under-weighted;
//! - categorical dimensions: the trial's index with mass 1, every index with `prior_weight /
//!   kernels`, normalised (Optuna 4+).

use knob_plugin_api::space::{standard_normal, DimKind, SeededRng};
use rand::Rng;

use super::{Model, Settings};
use crate::common::numeric::{encoded_step, log_sum_exp, normal_mass, snap, LN_SQRT_2PI};

/// A fitted mixture: log weights per component (trials in the order given, then the prior),
/// and per dimension the kernels of every component.
#[derive(Debug)]
pub(super) struct Mixture {
    log_weights: Vec<f64>,
    cumulative: Vec<f64>,
    dims: Vec<Kernels>,
}

#[derive(Debug)]
enum Kernels {
    Numeric {
        mus: Vec<f64>,
        inv_sigmas: Vec<f64>,
        sigmas: Vec<f64>,
        /// `-ln σ - ln √(2π) - ln Z`, Z the kernel's mass inside the bounds.
        log_norms: Vec<f64>,
        bounds: Option<(f64, f64)>,
    },
    Categorical {
        size: usize,
        /// `log_probs[component * size + index]`.
        log_probs: Vec<f64>,
        probs: Vec<f64>,
    },
}

impl Mixture {
    /// Fits the mixture to `points` (encoded vectors, NaN where inactive) with their `weights`.
    pub(super) fn fit(
        model: &Model,
        settings: &Settings,
        points: &[&[f64]],
        weights: &[f64],
    ) -> Mixture {
        let kernels = points.len() + 1;
        let dims = (0..model.encoding.len())
            .map(|d| fit_dim(model, settings, d, points, kernels))
            .collect();
        Mixture::with_weights(settings, weights, dims)
    }

    /// The components' weights (`weights`, then the prior's), normalised, around fitted kernels.
    fn with_weights(settings: &Settings, weights: &[f64], dims: Vec<Kernels>) -> Mixture {
        let kernels = weights.len() + 1;
        let mut w: Vec<f64> = weights.to_vec();
        w.push(if weights.is_empty() {
            1.0
        } else {
            settings.prior_weight
        });
        let total: f64 = w.iter().sum();
        let w: Vec<f64> = if total > 0.0 && total.is_finite() {
            w.iter().map(|x| x / total).collect()
        } else {
            vec![1.0 / kernels as f64; kernels]
        };
        let mut cumulative = Vec::with_capacity(kernels);
        let mut acc = 0.0;
        for x in &w {
            acc += x;
            cumulative.push(acc);
        }
        Mixture {
            log_weights: w.iter().map(|x| x.ln()).collect(),
            cumulative,
            dims,
        }
    }

    /// The mixture of dimension `d` alone, over the `points` where `d` is active (with their
    /// `weights`): Optuna's independent (univariate) Parzen estimator of one parameter.
    fn fit_one(
        model: &Model,
        settings: &Settings,
        d: usize,
        points: &[&[f64]],
        weights: &[f64],
    ) -> Mixture {
        let (active, active_weights): (Vec<&[f64]>, Vec<f64>) = points
            .iter()
            .zip(weights)
            .filter(|(p, _)| !p[d].is_nan())
            .map(|(p, w)| (*p, *w))
            .unzip();
        let kernels = fit_dim(model, settings, d, &active, active.len() + 1);
        Mixture::with_weights(settings, &active_weights, vec![kernels])
    }

    /// The index of a component drawn by weight.
    fn component(&self, rng: &mut SeededRng) -> usize {
        let u: f64 = rng.gen::<f64>() * self.cumulative.last().copied().unwrap_or(1.0);
        self.cumulative
            .iter()
            .position(|&c| u < c)
            .unwrap_or(self.cumulative.len() - 1)
    }

    /// Draws `count` encoded points (already snapped to values trials can receive).
    pub(super) fn sample(&self, model: &Model, rng: &mut SeededRng, count: usize) -> Vec<Vec<f64>> {
        (0..count).map(|_| self.sample_one(model, rng)).collect()
    }

    fn sample_one(&self, model: &Model, rng: &mut SeededRng) -> Vec<f64> {
        let component = self.component(rng);
        let mut point: Vec<f64> = Vec::with_capacity(self.dims.len());
        for (d, kernels) in self.dims.iter().enumerate() {
            if !model.is_active(d, &point) {
                point.push(f64::NAN);
                continue;
            }
            point.push(kernels.draw(model, d, component, rng));
        }
        point
    }

    /// The log density of an encoded point (its active dimensions).
    pub(super) fn log_pdf(&self, point: &[f64], scratch: &mut Vec<f64>) -> f64 {
        scratch.clear();
        scratch.extend_from_slice(&self.log_weights);
        for (kernels, &x) in self.dims.iter().zip(point) {
            if !x.is_nan() {
                kernels.add_log_pdf(x, scratch);
            }
        }
        log_sum_exp(scratch)
    }
}

impl Kernels {
    /// A value of dimension `d` from the kernel of `component`, snapped to what trials receive.
    fn draw(&self, model: &Model, d: usize, component: usize, rng: &mut SeededRng) -> f64 {
        match self {
            Kernels::Numeric {
                mus,
                sigmas,
                bounds,
                ..
            } => {
                let (mu, sigma) = (mus[component], sigmas[component]);
                let raw = truncated_normal(rng, mu, sigma, *bounds);
                let dim = &model.encoding.dims()[d];
                snap(&model.types[d], dim.kind(), raw)
            }
            Kernels::Categorical { size, probs, .. } => {
                let row = &probs[component * size..(component + 1) * size];
                let mut u: f64 = rng.gen();
                let mut chosen = size - 1;
                for (k, p) in row.iter().enumerate() {
                    if u < *p {
                        chosen = k;
                        break;
                    }
                    u -= p;
                }
                chosen as f64
            }
        }
    }

    /// Adds each component's log density of `x` to `acc` (one entry per component).
    fn add_log_pdf(&self, x: f64, acc: &mut [f64]) {
        match self {
            Kernels::Numeric {
                mus,
                inv_sigmas,
                log_norms,
                ..
            } => {
                for (((acc, mu), inv), norm) in
                    acc.iter_mut().zip(mus).zip(inv_sigmas).zip(log_norms)
                {
                    let z = (x - mu) * inv;
                    *acc += norm - 0.5 * z * z;
                }
            }
            Kernels::Categorical {
                size, log_probs, ..
            } => {
                let k = x as usize;
                for (c, acc) in acc.iter_mut().enumerate() {
                    *acc += log_probs[c * size + k];
                }
            }
        }
    }
}

/// Optuna's independent TPE (its default for several objectives): each active dimension in turn
/// gets its own good and bad mixtures over the points that have it, `n_ei_candidates` draws from
/// the good one, and the draw with the largest log ratio, so each coordinate is chosen on its
/// own evidence. `below` and `above` come with their weights, as for [`Mixture::fit`].
pub(super) fn suggest_independent(
    model: &Model,
    settings: &Settings,
    rng: &mut SeededRng,
    (below, below_weights): (&[&[f64]], &[f64]),
    (above, above_weights): (&[&[f64]], &[f64]),
) -> Vec<f64> {
    let mut point: Vec<f64> = Vec::with_capacity(model.encoding.len());
    let mut scratch = Vec::new();
    let log_pdf = |mixture: &Mixture, x: f64, scratch: &mut Vec<f64>| {
        scratch.clear();
        scratch.extend_from_slice(&mixture.log_weights);
        mixture.dims[0].add_log_pdf(x, scratch);
        log_sum_exp(scratch)
    };
    for d in 0..model.encoding.len() {
        if !model.is_active(d, &point) {
            point.push(f64::NAN);
            continue;
        }
        let good = Mixture::fit_one(model, settings, d, below, below_weights);
        let bad = Mixture::fit_one(model, settings, d, above, above_weights);
        // np.argmax: the first of equal maxima.
        let mut best: Option<(f64, f64)> = None;
        for _ in 0..settings.n_ei_candidates {
            let component = good.component(rng);
            let x = good.dims[0].draw(model, d, component, rng);
            let score = log_pdf(&good, x, &mut scratch) - log_pdf(&bad, x, &mut scratch);
            let score = if score.is_nan() {
                f64::NEG_INFINITY
            } else {
                score
            };
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, x));
            }
        }
        point.push(best.map_or(f64::NAN, |(_, x)| x));
    }
    point
}

/// The kernels of dimension `d`: one per point (the prior's where the point lacks `d`), then the
/// prior's.
fn fit_dim(
    model: &Model,
    settings: &Settings,
    d: usize,
    points: &[&[f64]],
    kernels: usize,
) -> Kernels {
    let dim = &model.encoding.dims()[d];
    let values: Vec<f64> = points.iter().map(|p| p[d]).collect();
    match dim.kind() {
        DimKind::Categorical { size } => {
            let size = size as usize;
            let spread = settings.prior_weight / kernels as f64;
            let mut probs = Vec::with_capacity(kernels * size);
            for &v in &values {
                if v.is_nan() {
                    probs.extend(std::iter::repeat_n(1.0 / size as f64, size));
                } else {
                    let total = 1.0 + spread * size as f64;
                    probs.extend(
                        (0..size)
                            .map(|k| (spread + if k == v as usize { 1.0 } else { 0.0 }) / total),
                    );
                }
            }
            probs.extend(std::iter::repeat_n(1.0 / size as f64, size));
            Kernels::Categorical {
                size,
                log_probs: probs.iter().map(|p| p.ln()).collect(),
                probs,
            }
        }
        kind => {
            let half_step = encoded_step(&model.types[d], kind).map_or(0.0, |s| s / 2.0);
            let (bounds, prior_mu, width) = match kind {
                DimKind::Gaussian => (None, 0.0, 1.0),
                _ => {
                    let (lo, hi) = kind.range();
                    let (lo, hi) = (lo - half_step, hi + half_step);
                    (Some((lo, hi)), (lo + hi) / 2.0, hi - lo)
                }
            };
            let min_sigma = width / (1.0 + kernels as f64).min(100.0);
            let mut sigmas = neighbour_sigmas(&values, bounds, width, settings.consider_endpoints);
            for s in &mut sigmas {
                *s = s.clamp(min_sigma, width);
            }
            let mut mus = values;
            for (mu, sigma) in mus.iter_mut().zip(&mut sigmas) {
                if mu.is_nan() {
                    *mu = prior_mu;
                    *sigma = width;
                }
            }
            mus.push(prior_mu);
            sigmas.push(width);
            let log_norms = mus
                .iter()
                .zip(&sigmas)
                .map(|(&mu, &sigma)| {
                    let mass = bounds.map_or(1.0, |(lo, hi)| normal_mass(mu, sigma, lo, hi));
                    -sigma.ln() - LN_SQRT_2PI - mass.max(1e-300).ln()
                })
                .collect();
            Kernels::Numeric {
                inv_sigmas: sigmas.iter().map(|s| 1.0 / s).collect(),
                mus,
                sigmas,
                log_norms,
                bounds,
            }
        }
    }
}

/// Per value (NaN for inactive ones, which get NaN): the larger distance to its neighbours among
/// the active values, the range's ends counting as neighbours of a lone value, and with
/// `endpoints` of the lowest and highest values too (Optuna's `consider_endpoints`; without it,
/// the extremes get the gap to their one neighbour). A lone value of an unbounded dimension gets
/// `width`.
fn neighbour_sigmas(
    values: &[f64],
    bounds: Option<(f64, f64)>,
    width: f64,
    endpoints: bool,
) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).filter(|&i| !values[i].is_nan()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut sigmas = vec![f64::NAN; values.len()];
    match order.len() {
        0 => {}
        1 => {
            let x = values[order[0]];
            sigmas[order[0]] = bounds.map_or(width, |(lo, hi)| (x - lo).max(hi - x));
        }
        m => {
            for (rank, &i) in order.iter().enumerate() {
                let x = values[i];
                let left = (rank > 0).then(|| x - values[order[rank - 1]]);
                let right = (rank + 1 < m).then(|| values[order[rank + 1]] - x);
                // With `endpoints`, the range's ends are the outer neighbours of the extremes.
                let (left, right) = match bounds {
                    Some((lo, hi)) if endpoints => (left.or(Some(x - lo)), right.or(Some(hi - x))),
                    _ => (left, right),
                };
                sigmas[i] = match (left, right) {
                    (Some(l), Some(r)) => l.max(r),
                    (Some(l), None) => l,
                    (None, Some(r)) => r,
                    (None, None) => width,
                };
            }
        }
    }
    sigmas
}

/// A normal draw inside `bounds`, by rejection (kernels keep most of their mass inside: their
/// centre is inside and their width at most the range's), clamped after 64 misses.
fn truncated_normal(rng: &mut SeededRng, mu: f64, sigma: f64, bounds: Option<(f64, f64)>) -> f64 {
    let Some((lo, hi)) = bounds else {
        return mu + sigma * standard_normal(rng);
    };
    for _ in 0..64 {
        let x = mu + sigma * standard_normal(rng);
        if (lo..=hi).contains(&x) {
            return x;
        }
    }
    mu.clamp(lo, hi)
}

#[cfg(test)]
mod tests {
    use super::neighbour_sigmas;

    /// Values 0.4, 0.5, 0.7 in [0, 1]: the middle one takes its larger gap (0.2) either way; the
    /// extremes take the gap to their neighbour (0.1, 0.2), or with endpoints the larger of that
    /// and the gap to their end of the range (0.4 to 0, 0.3 to 1). Inactive values stay NaN.
    #[test]
    fn endpoints_widen_only_the_extremes() {
        let values = [0.7, f64::NAN, 0.4, 0.5];
        let without = neighbour_sigmas(&values, Some((0.0, 1.0)), 1.0, false);
        let with = neighbour_sigmas(&values, Some((0.0, 1.0)), 1.0, true);
        let close = |a: &[f64], b: [f64; 4]| {
            a.iter()
                .zip(b)
                .all(|(x, y)| (x.is_nan() && y.is_nan()) || (x - y).abs() < 1e-12)
        };
        assert!(close(&without, [0.2, f64::NAN, 0.1, 0.2]), "{without:?}");
        assert!(close(&with, [0.3, f64::NAN, 0.4, 0.2]), "{with:?}");
        // Unbounded (a normal dimension): no ends to count.
        let free = neighbour_sigmas(&values, None, 1.0, true);
        assert!(close(&free, [0.2, f64::NAN, 0.1, 0.2]), "{free:?}");
    }
}
