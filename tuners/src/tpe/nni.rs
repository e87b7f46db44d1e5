//! NNI 3.0's TPE (`nni/algorithms/hpo/tpe_tuner.py`), one parameter at a time: each parameter
//! has its own history (the trials in which it was active), its own split into good and bad
//! trials, and its own choice among `n_ei_candidates` draws from the good density.
//!
//! Reproduced as NNI does it, quirks included: `randint` is categorical; a numeric parameter's
//! prior is `normal(mid, high - low)` for the uniform family; the good density is normalised by
//! the mixture's mass inside the range (`p_accept`); linear-forgetting weights are assigned in
//! order of loss, not of age (NNI computes them on the loss-sorted split); lies of the constant
//! liar count towards `n_startup_jobs` and the split.

use knob_plugin_api::space::{standard_normal, DimKind, SeededRng};
use rand::Rng;

use super::{Model, Settings};
use crate::common::numeric::{log_sum_exp, normal_cdf, LN_SQRT_2PI};

/// A point drawn one parameter at a time; `history` is `(encoded point, loss)` in arrival order,
/// lies of running trials last.
pub(super) fn suggest(
    model: &Model,
    settings: &Settings,
    rng: &mut SeededRng,
    history: &[(&[f64], f64)],
) -> Vec<f64> {
    let mut point: Vec<f64> = Vec::with_capacity(model.encoding.len());
    for (d, dim) in model.encoding.dims().iter().enumerate() {
        if !model.is_active(d, &point) {
            point.push(f64::NAN);
            continue;
        }
        let param_history: Vec<(f64, f64)> = history
            .iter()
            .filter(|(p, _)| !p[d].is_nan())
            .map(|(p, loss)| (p[d], *loss))
            .collect();
        let x = match dim.kind() {
            _ if param_history.len() < settings.n_startup_jobs => prior_draw(dim.kind(), rng),
            DimKind::Categorical { size } | DimKind::Integer { size } => {
                suggest_categorical(settings, rng, &param_history, size as usize)
            }
            DimKind::Unit => {
                suggest_normal(settings, rng, &param_history, 0.5, 1.0, Some((0.0, 1.0)))
            }
            DimKind::Gaussian => suggest_normal(settings, rng, &param_history, 0.0, 1.0, None),
        };
        point.push(x);
    }
    point
}

/// NNI's `random_tuner.suggest_parameter` in the encoding.
fn prior_draw(kind: DimKind, rng: &mut SeededRng) -> f64 {
    match kind {
        DimKind::Categorical { size } | DimKind::Integer { size } => rng.gen_range(0..size) as f64,
        DimKind::Unit => rng.gen(),
        DimKind::Gaussian => standard_normal(rng),
    }
}

/// NNI's `split_history`: values of the `min(ceil(gamma √n), linear_forgetting)` lowest losses
/// (ties in arrival order), then the rest, both in order of loss.
fn split_history(settings: &Settings, history: &[(f64, f64)]) -> (Vec<f64>, Vec<f64>) {
    let n_below = settings.n_below(history.len());
    let mut order: Vec<usize> = (0..history.len()).collect();
    order.sort_by(|&a, &b| history[a].1.total_cmp(&history[b].1));
    let values: Vec<f64> = order.iter().map(|&i| history[i].0).collect();
    let n_below = n_below.min(values.len());
    (values[..n_below].to_vec(), values[n_below..].to_vec())
}

/// NNI's `linear_forgetting_weights`: 1 for the last `linear_forgetting`, a ramp from `1/n`
/// before them.
pub(super) fn linear_forgetting_weights(linear_forgetting: usize, n: usize) -> Vec<f64> {
    if n < linear_forgetting || n == 0 {
        return vec![1.0; n];
    }
    let ramp_len = n - linear_forgetting;
    let start = 1.0 / n as f64;
    let mut weights: Vec<f64> = (0..ramp_len)
        .map(|i| {
            if ramp_len == 1 {
                start
            } else {
                start + (1.0 - start) * i as f64 / (ramp_len - 1) as f64
            }
        })
        .collect();
    weights.extend(std::iter::repeat_n(1.0, linear_forgetting));
    weights
}

fn categorical_probabilities(settings: &Settings, values: &[f64], size: usize) -> Vec<f64> {
    let weights = linear_forgetting_weights(settings.linear_forgetting, values.len());
    let mut counts = vec![settings.prior_weight; size];
    for (v, w) in values.iter().zip(weights) {
        counts[*v as usize] += w;
    }
    let total: f64 = counts.iter().sum();
    if total > 0.0 {
        counts.iter().map(|c| c / total).collect()
    } else {
        vec![1.0 / size as f64; size]
    }
}

fn suggest_categorical(
    settings: &Settings,
    rng: &mut SeededRng,
    history: &[(f64, f64)],
    size: usize,
) -> f64 {
    let (below, above) = split_history(settings, history);
    let p_below = categorical_probabilities(settings, &below, size);
    let p_above = categorical_probabilities(settings, &above, size);
    // np.argmax: the first of equal maxima.
    let mut best: Option<(f64, usize)> = None;
    for _ in 0..settings.n_ei_candidates {
        let mut u: f64 = rng.gen();
        let mut sample = size - 1;
        for (k, p) in p_below.iter().enumerate() {
            if u < *p {
                sample = k;
                break;
            }
            u -= p;
        }
        let score = p_below[sample].ln() - p_above[sample].ln();
        if best.is_none_or(|(s, _)| score > s) {
            best = Some((score, sample));
        }
    }
    best.map_or(0.0, |(_, sample)| sample as f64)
}

/// NNI's `adaptive_parzen_normal`: `(weights, mus, sigmas)` sorted by mu, the prior among them.
fn adaptive_parzen_normal(
    settings: &Settings,
    values: &[f64],
    prior_mu: f64,
    prior_sigma: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut mus: Vec<f64> = values.to_vec();
    mus.push(prior_mu);
    let mut order: Vec<usize> = (0..mus.len()).collect();
    order.sort_by(|&a, &b| mus[a].total_cmp(&mus[b]));
    let sorted: Vec<f64> = order.iter().map(|&i| mus[i]).collect();
    let prior_index = sorted.partition_point(|&m| m < prior_mu);
    let n = sorted.len();
    let mut sigmas = match n {
        1 => vec![prior_sigma],
        2 => {
            let mut s = vec![prior_sigma * 0.5; 2];
            s[prior_index] = prior_sigma;
            s
        }
        _ => {
            let mut s = Vec::with_capacity(n);
            s.push(sorted[1] - sorted[0]);
            for i in 1..n - 1 {
                s.push((sorted[i] - sorted[i - 1]).max(sorted[i + 1] - sorted[i]));
            }
            s.push(sorted[n - 1] - sorted[n - 2]);
            s[prior_index] = prior_sigma;
            s
        }
    };
    let magic = (n + 1).min(100) as f64;
    for s in &mut sigmas {
        *s = s.clamp(prior_sigma / magic, prior_sigma);
    }
    let mut unsorted_weights = linear_forgetting_weights(settings.linear_forgetting, n - 1);
    unsorted_weights.push(settings.prior_weight);
    let weights: Vec<f64> = order.iter().map(|&i| unsorted_weights[i]).collect();
    let total: f64 = weights.iter().sum();
    let weights = if total > 0.0 {
        weights.iter().map(|w| w / total).collect()
    } else {
        vec![1.0 / n as f64; n]
    };
    (weights, sorted, sigmas)
}

fn suggest_normal(
    settings: &Settings,
    rng: &mut SeededRng,
    history: &[(f64, f64)],
    prior_mu: f64,
    prior_sigma: f64,
    clip: Option<(f64, f64)>,
) -> f64 {
    let (below, above) = split_history(settings, history);
    let (weights, mus, sigmas) = adaptive_parzen_normal(settings, &below, prior_mu, prior_sigma);
    let samples = gmm1(settings.n_ei_candidates, rng, &weights, &mus, &sigmas, clip);
    let below_llik = gmm1_lpdf(&samples, &weights, &mus, &sigmas, clip);
    let (weights, mus, sigmas) = adaptive_parzen_normal(settings, &above, prior_mu, prior_sigma);
    let above_llik = gmm1_lpdf(&samples, &weights, &mus, &sigmas, clip);
    let mut best = 0;
    for i in 1..samples.len() {
        if below_llik[i] - above_llik[i] > below_llik[best] - above_llik[best] {
            best = i;
        }
    }
    samples[best]
}

/// NNI's `gmm1`: draws from the mixture, keeping those inside `clip`, until there are `count`.
fn gmm1(
    count: usize,
    rng: &mut SeededRng,
    weights: &[f64],
    mus: &[f64],
    sigmas: &[f64],
    clip: Option<(f64, f64)>,
) -> Vec<f64> {
    let mut samples = Vec::with_capacity(count);
    let mut tries = 0;
    while samples.len() < count {
        let mut u: f64 = rng.gen();
        let mut k = weights.len() - 1;
        for (i, w) in weights.iter().enumerate() {
            if u < *w {
                k = i;
                break;
            }
            u -= w;
        }
        let x = mus[k] + sigmas[k] * standard_normal(rng);
        tries += 1;
        match clip {
            Some((lo, hi)) if !(lo..=hi).contains(&x) => {
                // The prior alone keeps over a third of its mass inside, so this only guards
                // against a pathological mixture.
                if tries > 1000 * count {
                    samples.push(x.clamp(lo, hi));
                }
            }
            _ => samples.push(x),
        }
    }
    samples
}

/// NNI's `gmm1_lpdf`: the mixture's log density, divided by its mass inside `clip`.
fn gmm1_lpdf(
    samples: &[f64],
    weights: &[f64],
    mus: &[f64],
    sigmas: &[f64],
    clip: Option<(f64, f64)>,
) -> Vec<f64> {
    const EPS: f64 = 1e-12;
    let p_accept = clip.map_or(1.0, |(lo, hi)| {
        weights
            .iter()
            .zip(mus.iter().zip(sigmas))
            .map(|(w, (mu, s))| {
                let s = s.max(EPS);
                w * (normal_cdf((hi - mu) / s) - normal_cdf((lo - mu) / s))
            })
            .sum()
    });
    let log_coefs: Vec<f64> = weights
        .iter()
        .zip(sigmas)
        .map(|(w, s)| w.ln() - s.ln() - LN_SQRT_2PI - p_accept.ln())
        .collect();
    let mut terms = vec![0.0; mus.len()];
    samples
        .iter()
        .map(|x| {
            for (t, ((mu, s), c)) in terms.iter_mut().zip(mus.iter().zip(sigmas).zip(&log_coefs)) {
                let z = (x - mu) / s.max(EPS);
                *t = -0.5 * z * z + c;
            }
            log_sum_exp(&terms)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::linear_forgetting_weights;

    #[test]
    fn linear_forgetting_matches_numpy() {
        assert_eq!(linear_forgetting_weights(25, 3), vec![1.0; 3]);
        // np.concatenate([np.linspace(1/28, 1, 3), np.ones(25)])
        let w = linear_forgetting_weights(25, 28);
        assert_eq!(w.len(), 28);
        assert!((w[0] - 1.0 / 28.0).abs() < 1e-15);
        assert!((w[1] - (1.0 / 28.0 + 1.0) / 2.0).abs() < 1e-15);
        assert_eq!(w[2], 1.0);
        assert_eq!(&w[3..], &[1.0; 25]);
    }
}
