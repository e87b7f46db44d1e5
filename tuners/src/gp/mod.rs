//! GPTuner: Bayesian optimization with a Gaussian process, after NNI's `GPTuner`
//! (`nni/algorithms/hpo/gp_tuner`), with the same classArgs and defaults except where noted.
//!
//! Each suggestion after the cold start:
//! 1. the observed results (losses: values negated under `maximize`; NaN and +∞ as the worst
//!    finite one) are compressed by `ln(1 + (loss - best) / (median - best))`, which keeps
//!    their order and the shape near the best but tames heavy tails (one loss 1000× the others
//!    would otherwise flatten the whole model), then standardized, in an order that does not
//!    depend on when they arrived;
//! 2. a Matérn kernel (ν = `nu`) with one length scale per dimension, a signal variance and a
//!    noise variance of at least `alpha` are fitted by maximizing the marginal likelihood
//!    ([`model`]);
//! 3. trials still running join the data as a *constant liar*: each pretends to have returned
//!    the mean observed loss, so the model is certain there and parallel suggestions spread out;
//! 4. the acquisition (`utility`: EI, UCB or PI) is maximized over `selection_num_warm_up`
//!    candidates (default 2000, at most 1000000) and a pattern search from the best `selection_num_starting_points`
//!    ([`acquisition`]), and the best candidate not handed out before (after rounding integers
//!    and q-types) is the suggestion.
//!
//! Parameters live in [`UnitCube`] coordinates: every type NNI has is supported (NNI's GPTuner
//! takes only numeric choices and the uniform family): log types in log space, the normal family
//! through its distribution function (searched within ±3 σ of the mean:
//! [`acquisition::GAUSSIAN_SEARCH_Z`]), integers and q-types rounded on decoding, choices (any
//! JSON values) and nested choices through a categorical kernel term.
//!
//! Differences from NNI: the kernel has a length scale per dimension and a fitted signal and noise
//! variance (NNI: one length scale, noise fixed to `alpha`); `xi` is in standard deviations of
//! the observed values (NNI: in the values' units); the acquisition defaults to 2 000 random
//! candidates and 10 pattern searches (NNI: 100 000 and 250 L-BFGS-B runs, which take seconds per
//! suggestion); `seed` is accepted; imported trials with value 0 are used (NNI skips them).
//!
//! Determinism: suggestion number `k` (imported trials count) draws from its own random stream
//! ([`seeding::stream`]), and the model sees its data sorted by parameters, so a resumed run that
//! imported the first `k` results suggests what an uninterrupted one would have.

mod acquisition;
mod model;

use std::collections::BTreeMap;

use knob_plugin_api::space::{SearchSpace, SeededRng};
use knob_plugin_api::{log, parse_class_args, Generated, ImportedTrial, PluginError, Tuner};
use serde::Deserialize;
use serde_json::Value;

use crate::common::args::{optimize_mode, OptimizeMode};
use crate::common::history::canonical;
use crate::common::observed::loss;
use crate::common::seed::{seed, seed_or_entropy, step_rng, SeedNotice};
use crate::common::unit_cube::{Axis, UnitCube};
use crate::common::unseen::Unseen;
use acquisition::{ranked_candidates, sort_best_first, Acquisition, Utility};
use model::{GaussianProcess, Smoothness};

const NAME: &str = "GPTuner";
/// The most `selection_num_warm_up`: every warm-up candidate is held and scored at once, so a
/// larger count asks for gigabytes; ten times NNI's default (100000).
const MAX_WARM_UP: u64 = 1_000_000;
/// More observations than this are thinned before fitting: the fit costs O(n³) per step.
const MAX_TRAINING_POINTS: usize = 256;
/// Hyperparameter fits from random starts, besides the one from the prior's centre, while the
/// data are small enough for them to be cheap; bigger data pin the likelihood's optimum down
/// anyway.
const FIT_RESTARTS: usize = 2;
const FIT_RESTARTS_UP_TO_POINTS: usize = 128;
/// Rounded candidates rescored before taking the best unseen one.
const SNAPPED_CANDIDATES: usize = 32;

/// GP-based Bayesian optimization; see the module documentation.
#[derive(Debug)]
pub struct GpTuner {
    settings: Settings,
    seed: u64,
    /// A drawn seed's log line, said once the tuner is asked for parameters.
    seed_notice: SeedNotice,
    cube: Option<UnitCube>,
    unseen: Unseen,
    /// Every result, as (parameters, loss): lower is better; +∞ for a NaN value.
    observations: Vec<(Value, f64)>,
    /// Parameters handed out whose result has not come, by parameter id.
    pending: BTreeMap<u64, Value>,
    /// Suggestions made plus trials imported: the number of the next suggestion.
    suggestions: u64,
}

#[derive(Debug, Clone)]
struct Settings {
    mode: OptimizeMode,
    utility: Utility,
    kappa: f64,
    xi: f64,
    smoothness: Smoothness,
    alpha: f64,
    cold_start_num: u64,
    warm_up: usize,
    starting_points: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpArgs {
    #[serde(default, deserialize_with = "optimize_mode")]
    optimize_mode: Option<OptimizeMode>,
    utility: Option<String>,
    kappa: Option<f64>,
    xi: Option<f64>,
    nu: Option<f64>,
    alpha: Option<f64>,
    cold_start_num: Option<u64>,
    selection_num_warm_up: Option<u64>,
    selection_num_starting_points: Option<u64>,
    #[serde(default, deserialize_with = "seed")]
    seed: Option<u64>,
}

impl GpTuner {
    /// The seed in use, given or drawn: `classArgs: {seed: <it>}` replays this run.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

/// A classArg check that failed, worded as `parse_class_args` words its own errors.
fn invalid_arg(message: impl std::fmt::Display) -> PluginError {
    PluginError::new(format!("classArgs of {NAME}: {message}"))
}

fn settings(args: &GpArgs) -> Result<Settings, PluginError> {
    let utility = match args.utility.as_deref().unwrap_or("ei") {
        "ei" => Utility::ExpectedImprovement,
        "ucb" => Utility::UpperConfidenceBound,
        "poi" => Utility::ProbabilityOfImprovement,
        other => {
            return Err(invalid_arg(format!(
                "utility must be \"ei\", \"ucb\" or \"poi\", got {other:?}"
            )))
        }
    };
    let smoothness = match args.nu.unwrap_or(2.5) {
        0.5 => Smoothness::Half,
        1.5 => Smoothness::ThreeHalves,
        2.5 => Smoothness::FiveHalves,
        other => {
            return Err(invalid_arg(format!(
                "nu must be 0.5, 1.5 or 2.5 (the Matérn kernels with a closed form), got {other}"
            )))
        }
    };
    let non_negative = |name: &str, value: Option<f64>, default: f64| match value {
        None => Ok(default),
        Some(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Some(v) => Err(invalid_arg(format!(
            "{name} must be a number >= 0, got {v}"
        ))),
    };
    let alpha = match args.alpha {
        None => 1e-6,
        Some(a) if a.is_finite() && a > 0.0 => a,
        Some(a) => return Err(invalid_arg(format!("alpha must be > 0, got {a}"))),
    };
    let warm_up = args.selection_num_warm_up.unwrap_or(2000);
    if !(1..=MAX_WARM_UP).contains(&warm_up) {
        return Err(invalid_arg(format!(
            "selection_num_warm_up must be a whole number from 1 to {MAX_WARM_UP}, got {warm_up}"
        )));
    }
    Ok(Settings {
        mode: args.optimize_mode.unwrap_or(OptimizeMode::Maximize),
        utility,
        kappa: non_negative("kappa", args.kappa, 5.0)?,
        xi: non_negative("xi", args.xi, 0.0)?,
        smoothness,
        alpha,
        cold_start_num: args.cold_start_num.unwrap_or(10),
        warm_up: warm_up as usize,
        starting_points: usize::try_from(args.selection_num_starting_points.unwrap_or(10))
            .unwrap_or(usize::MAX),
    })
}

impl Tuner for GpTuner {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args: GpArgs = parse_class_args(NAME, class_args)?;
        let settings = settings(&args)?;
        if args.optimize_mode.is_none() {
            log::info("GPTuner: optimize_mode not given; maximizing, as NNI's GPTuner does");
        }
        let (seed, seed_notice) = seed_or_entropy(NAME, args.seed);
        Ok(GpTuner {
            settings,
            seed,
            seed_notice,
            cube: None,
            unseen: Unseen::default(),
            observations: Vec::new(),
            pending: BTreeMap::new(),
            suggestions: 0,
        })
    }

    /// Takes the new space; results whose parameters do not fit it stop informing the model.
    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        self.cube = Some(UnitCube::new(space));
        self.unseen.reset_grid();
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        self.seed_notice.log_once();
        let Some(cube) = &self.cube else {
            return Err(PluginError::new(format!(
                "{NAME}: asked for parameters before it was given a search space"
            )));
        };
        let number = self.suggestions;
        self.suggestions += 1;
        let mut rng = step_rng(self.seed, number);
        let candidates = if number >= self.settings.cold_start_num {
            model_candidates(
                &self.settings,
                cube,
                &self.observations,
                &self.pending,
                &mut rng,
            )
        } else {
            Vec::new()
        };
        let picked = self.unseen.pick(NAME, cube.space(), &mut rng, candidates);
        Ok(match picked {
            Some(params) => {
                self.pending.insert(parameter_id, params.clone());
                Generated::Parameters(params)
            }
            None => Generated::NoMore,
        })
    }

    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        value: f64,
    ) -> Result<(), PluginError> {
        self.pending.remove(&parameter_id);
        self.unseen.insert(parameters);
        self.observations
            .push((parameters.clone(), loss(value, self.settings.mode)));
        Ok(())
    }

    fn trial_end(&mut self, parameter_id: u64, _status: &str) -> Result<(), PluginError> {
        self.pending.remove(&parameter_id);
        Ok(())
    }

    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        for trial in trials {
            self.unseen.insert(&trial.parameters);
            // One without a result was handed out all the same, but taught the model nothing.
            if trial.is_result() {
                self.observations.push((
                    trial.parameters.clone(),
                    loss(trial.value, self.settings.mode),
                ));
            }
            self.suggestions += 1;
        }
        log::info(&format!(
            "{NAME}: imported {} trials; the model now has {} results",
            trials.len(),
            self.observations.len()
        ));
        Ok(())
    }
}

/// Standardized training data, sorted by parameters.
struct TrainingSet {
    points: Vec<Vec<f64>>,
    targets: Vec<f64>,
}

/// The model's candidates, most promising first (rounded as a trial receives them); none while
/// there are fewer than two results.
fn model_candidates(
    settings: &Settings,
    cube: &UnitCube,
    observations: &[(Value, f64)],
    pending: &BTreeMap<u64, Value>,
    rng: &mut SeededRng,
) -> Vec<Value> {
    let Some(data) = training_set(cube, observations) else {
        return Vec::new();
    };
    let categorical: Vec<bool> = cube
        .axes()
        .iter()
        .map(|a| matches!(a, Axis::Categorical { .. }))
        .collect();
    let s = settings;
    let hyper = model::fit(
        &data.points,
        &data.targets,
        &categorical,
        s.smoothness,
        s.alpha,
        if data.points.len() <= FIT_RESTARTS_UP_TO_POINTS {
            FIT_RESTARTS
        } else {
            0
        },
        rng,
    );
    log::debug(&format!("{NAME}: fitted {hyper:?}"));
    let mut points = data.points.clone();
    let mut targets = data.targets.clone();
    for params in pending.values() {
        if let Ok(point) = cube.encode(params) {
            points.push(point);
            targets.push(0.0);
        }
    }
    let Some(model) =
        GaussianProcess::condition(points, &targets, categorical, &hyper, s.smoothness, s.alpha)
    else {
        log::warn(&format!(
            "{NAME}: the kernel matrix is singular; drawing at random"
        ));
        return Vec::new();
    };
    let mut incumbents: Vec<(f64, Vec<f64>)> = data
        .targets
        .iter()
        .map(|t| -t)
        .zip(data.points.iter().cloned())
        .collect();
    sort_best_first(&mut incumbents);
    let incumbents: Vec<Vec<f64>> = incumbents.into_iter().map(|(_, x)| x).collect();
    let acquisition = Acquisition {
        model: &model,
        utility: s.utility,
        kappa: s.kappa,
        xi: s.xi,
        best: data.targets.iter().copied().fold(f64::INFINITY, f64::min),
    };
    let ranked = ranked_candidates(
        &acquisition,
        cube,
        &incumbents,
        s.warm_up,
        s.starting_points,
        rng,
    );
    // Rounding moves a candidate: rescore the rounded best few, then take whatever is unseen.
    let mut snapped: Vec<(f64, Value)> = ranked
        .iter()
        .take(SNAPPED_CANDIDATES)
        .filter_map(|(_, x)| {
            let (params, point) = cube.snap(x).ok()?;
            Some((acquisition.value(&point), params))
        })
        .collect();
    // Stable: equal scores keep the ranking's order.
    snapped.sort_by(|a, b| b.0.total_cmp(&a.0));
    let rest = ranked
        .iter()
        .skip(SNAPPED_CANDIDATES)
        .filter_map(|(_, x)| cube.decode(x).ok());
    snapped.into_iter().map(|(_, p)| p).chain(rest).collect()
}

/// The observations as model inputs: parameters that fit the space, sorted by their canonical
/// text (arrival order must not matter), non-finite losses replaced by the worst (or for -∞ the
/// best) finite one, at most [`MAX_TRAINING_POINTS`], standardized. `None` below two points.
fn training_set(cube: &UnitCube, observations: &[(Value, f64)]) -> Option<TrainingSet> {
    let mut rows: Vec<(String, f64, Vec<f64>)> = observations
        .iter()
        .filter_map(|(params, loss)| Some((canonical(params), *loss, cube.encode(params).ok()?)))
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let finite: Vec<f64> = rows.iter().map(|r| r.1).filter(|l| l.is_finite()).collect();
    if rows.len() < 2 || finite.is_empty() {
        return None;
    }
    let worst = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let best = finite.iter().copied().fold(f64::INFINITY, f64::min);
    for row in &mut rows {
        if !row.1.is_finite() {
            row.1 = if row.1 == f64::NEG_INFINITY {
                best
            } else {
                worst
            };
        }
    }
    if rows.len() > MAX_TRAINING_POINTS {
        rows = thin(rows);
    }
    compress_tail(&mut rows);
    let n = rows.len() as f64;
    let mean = rows.iter().map(|r| r.1).sum::<f64>() / n;
    let variance = rows.iter().map(|r| (r.1 - mean).powi(2)).sum::<f64>() / n;
    let scale = if variance > 0.0 { variance.sqrt() } else { 1.0 };
    Some(TrainingSet {
        targets: rows.iter().map(|r| (r.1 - mean) / scale).collect(),
        points: rows.into_iter().map(|r| r.2).collect(),
    })
}

/// `loss → ln(1 + (loss - best) / (median - best))`: order-preserving, close to linear near the
/// best, logarithmic in the tail. Scale-free, so it does not depend on the losses' units.
fn compress_tail(rows: &mut [(String, f64, Vec<f64>)]) {
    let mut losses: Vec<f64> = rows.iter().map(|r| r.1).collect();
    losses.sort_by(f64::total_cmp);
    let best = losses[0];
    let spread = losses[losses.len() / 2] - best;
    if spread > 0.0 {
        for row in rows {
            row.1 = ((row.1 - best) / spread).ln_1p();
        }
    }
}

/// Keeps the best half of [`MAX_TRAINING_POINTS`] and an even spread of the rest, in order.
fn thin(rows: Vec<(String, f64, Vec<f64>)>) -> Vec<(String, f64, Vec<f64>)> {
    let mut by_loss: Vec<usize> = (0..rows.len()).collect();
    by_loss.sort_by(|&a, &b| rows[a].1.total_cmp(&rows[b].1).then(a.cmp(&b)));
    let best = MAX_TRAINING_POINTS / 2;
    let mut keep = vec![false; rows.len()];
    by_loss[..best].iter().for_each(|&i| keep[i] = true);
    let rest: Vec<usize> = (0..rows.len()).filter(|&i| !keep[i]).collect();
    let wanted = MAX_TRAINING_POINTS - best;
    for k in 0..wanted {
        keep[rest[k * rest.len() / wanted]] = true;
    }
    rows.into_iter()
        .zip(keep)
        .filter_map(|(row, kept)| kept.then_some(row))
        .collect()
}
