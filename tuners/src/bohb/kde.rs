//! BOHB's configuration generator (NNI's `CG_BOHB`, from HpBandSter; Falkner et al. 2018).
//!
//! Results are kept per budget. Once a budget has at least `min_points` results, they are
//! split by loss into the best `max(min_points, top_n_percent % of them)` ("good") and the next
//! `max(min_points, (100 - top_n_percent) % of them)` ("bad"); each set becomes a product-kernel
//! density (statsmodels' `KDEMultivariate`, `normal_reference` bandwidths `1.06 σ n^(-1/(4+d))`,
//! at least `min_bandwidth`) when it has more points than dimensions. A budget's results are
//! dropped once a larger budget has a model (as NNI does), and configurations come from the
//! model of the largest budget: `num_samples` candidates drawn around good points (continuous
//! dimensions from a normal of `bandwidth_factor` times the bandwidth, truncated to the unit
//! interval; a categorical keeps its value with probability `1 - bandwidth`), the one with the
//! smallest `bad(x) / good(x)` wins. A fraction `random_fraction`, and every draw before a model
//! exists, is a random point of the space.
//!
//! Coordinates are the unit cube of `common::unit_cube` (ConfigSpace's vector form: ordered
//! parameters in [0, 1], choices by index). Departures from NNI: the categorical kernel divides
//! by the number of choices less one (statsmodels counts the values present in the data, which
//! divides by zero when the good points agree); inactive dimensions of nested choices are
//! filled from another point, or at random, as NNI's `impute_conditional_data`.

use std::collections::BTreeMap;

use knob_plugin_api::space::SeededRng;
use rand::Rng;

use crate::common::normal_tail::normal_cdf_precise;
use crate::common::quantile::standard_normal_quantile;
use crate::common::unit_cube::{Axis, UnitCube};

/// The model settings (BOHB's classArgs).
#[derive(Debug, Clone)]
pub(crate) struct KdeSettings {
    pub(crate) min_points: usize,
    pub(crate) top_n_percent: usize,
    pub(crate) num_samples: usize,
    pub(crate) random_fraction: f64,
    pub(crate) bandwidth_factor: f64,
    pub(crate) min_bandwidth: f64,
}

#[derive(Debug, Clone)]
struct Density {
    data: Vec<Vec<f64>>,
    bandwidths: Vec<f64>,
}

#[derive(Debug, Clone)]
struct Model {
    good: Density,
    bad: Density,
}

/// Results per budget and the models built from them.
#[derive(Debug, Clone, Default)]
pub(crate) struct KdeModels {
    observations: BTreeMap<u64, Vec<(Vec<f64>, f64)>>,
    models: BTreeMap<u64, Model>,
}

impl KdeModels {
    pub(crate) fn has_model(&self) -> bool {
        !self.models.is_empty()
    }

    /// Adds a result (`point` in unit-cube coordinates, NaN where inactive) and refits the
    /// budget's model (NNI's `new_result`).
    pub(crate) fn observe(
        &mut self,
        cube: &UnitCube,
        settings: &KdeSettings,
        point: Vec<f64>,
        budget: u64,
        loss: f64,
        rng: &mut SeededRng,
    ) {
        if self.models.keys().next_back().is_some_and(|&b| b > budget) {
            return;
        }
        let observations = self.observations.entry(budget).or_default();
        observations.push((point, loss));
        let n = observations.len();
        if n < settings.min_points {
            return;
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| observations[a].1.total_cmp(&observations[b].1));
        let n_good = settings.min_points.max(settings.top_n_percent * n / 100);
        let n_bad = settings
            .min_points
            .max((100 - settings.top_n_percent) * n / 100);
        let pick = |range: std::ops::Range<usize>| -> Vec<Vec<f64>> {
            order[range.start.min(n)..range.end.min(n)]
                .iter()
                .map(|&i| observations[i].0.clone())
                .collect()
        };
        let good = pick(0..n_good);
        let bad = pick(n_good..n_good + n_bad);
        let dims = cube.len();
        if good.len() <= dims || bad.len() <= dims {
            return;
        }
        let good = Density::fit(cube, impute(cube, good, rng), settings.min_bandwidth);
        let bad = Density::fit(cube, impute(cube, bad, rng), settings.min_bandwidth);
        self.models.insert(budget, Model { good, bad });
    }

    /// A point from the largest budget's model; `None` when there is no model yet.
    pub(crate) fn propose(
        &self,
        cube: &UnitCube,
        settings: &KdeSettings,
        rng: &mut SeededRng,
    ) -> Option<Vec<f64>> {
        let model = self.models.values().next_back()?;
        let axes = cube.axes();
        let mut best: Option<(f64, Vec<f64>)> = None;
        for _ in 0..settings.num_samples {
            let datum = &model.good.data[rng.gen_range(0..model.good.data.len())];
            let candidate: Vec<f64> = datum
                .iter()
                .zip(&model.good.bandwidths)
                .zip(axes)
                .map(|((&m, &bw), axis)| {
                    let bw = bw.max(settings.min_bandwidth);
                    match *axis {
                        Axis::Categorical { size } => {
                            if rng.gen::<f64>() < 1.0 - bw {
                                m
                            } else {
                                rng.gen_range(0..size.max(1)) as f64
                            }
                        }
                        _ => truncated_normal(m, settings.bandwidth_factor * bw, rng),
                    }
                })
                .collect();
            let good = model.good.pdf(axes, &candidate);
            let bad = model.bad.pdf(axes, &candidate);
            let ratio = bad.max(1e-32) / good.max(1e-32);
            if !ratio.is_finite() {
                if good.is_finite() {
                    return Some(candidate);
                }
                continue;
            }
            if best.as_ref().is_none_or(|(b, _)| ratio < *b) {
                best = Some((ratio, candidate));
            }
        }
        best.map(|(_, point)| point)
    }
}

impl Density {
    fn fit(cube: &UnitCube, data: Vec<Vec<f64>>, min_bandwidth: f64) -> Density {
        let n = data.len() as f64;
        let dims = cube.len();
        let factor = 1.06 * n.powf(-1.0 / (4.0 + dims as f64));
        let bandwidths = (0..dims)
            .map(|d| {
                let mean = data.iter().map(|x| x[d]).sum::<f64>() / n;
                let var = data.iter().map(|x| (x[d] - mean).powi(2)).sum::<f64>() / n;
                (factor * var.sqrt()).max(min_bandwidth)
            })
            .collect();
        Density { data, bandwidths }
    }

    /// statsmodels' `KDEMultivariate.pdf`: the mean over data of the product of the kernels,
    /// Gaussian ones divided by their bandwidth.
    fn pdf(&self, axes: &[Axis], x: &[f64]) -> f64 {
        let norm: f64 = axes
            .iter()
            .zip(&self.bandwidths)
            .filter(|(axis, _)| !matches!(axis, Axis::Categorical { .. }))
            .map(|(_, &h)| h)
            .product();
        let total: f64 = self
            .data
            .iter()
            .map(|datum| {
                let mut k = 1.0;
                for ((&xi, &x), (axis, &h)) in
                    datum.iter().zip(x).zip(axes.iter().zip(&self.bandwidths))
                {
                    k *= match *axis {
                        Axis::Categorical { size } => {
                            if xi.round() == x.round() {
                                1.0 - h
                            } else if size > 1 {
                                h / (size - 1) as f64
                            } else {
                                0.0
                            }
                        }
                        _ => {
                            let z = (xi - x) / h;
                            (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
                        }
                    };
                }
                k
            })
            .sum();
        total / self.data.len() as f64 / norm
    }
}

/// Fills each NaN (inactive) coordinate from a point where that dimension is set, else with a
/// random value of the axis.
fn impute(cube: &UnitCube, mut data: Vec<Vec<f64>>, rng: &mut SeededRng) -> Vec<Vec<f64>> {
    for d in 0..cube.len() {
        let donors: Vec<f64> = data.iter().map(|x| x[d]).filter(|v| !v.is_nan()).collect();
        for point in &mut data {
            if point[d].is_nan() {
                point[d] = if donors.is_empty() {
                    cube.sample_axis(d, rng)
                } else {
                    donors[rng.gen_range(0..donors.len())]
                };
            }
        }
    }
    data
}

/// A draw from the normal `N(mean, sd)` restricted to [0, 1], by inverting its CDF.
fn truncated_normal(mean: f64, sd: f64, rng: &mut SeededRng) -> f64 {
    let lo = normal_cdf_precise((0.0 - mean) / sd);
    let hi = normal_cdf_precise((1.0 - mean) / sd);
    if hi - lo <= 1e-12 {
        return mean.clamp(0.0, 1.0);
    }
    let u = lo + rng.gen::<f64>() * (hi - lo);
    (mean + sd * standard_normal_quantile(u)).clamp(0.0, 1.0)
}
