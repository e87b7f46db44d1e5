//! TPE, the Tree-structured Parzen Estimator (Bergstra et al. 2011), NNI's default tuner.
//!
//! Two variants behind one classArgs surface (NNI's `optimize_mode`, `seed`, `tpe_args`):
//!
//! - `variant: "nni"` is NNI 3.0's `TpeTuner` (see `nni.rs`): parameters modelled one at a
//!   time, `n_below = min(ceil(gamma √n), linear_forgetting)`, 20 random start-up trials;
//! - `variant: "knob"`, the default (see `joint.rs`), models whole points (multivariate TPE,
//!   Falkner et al. 2018; Optuna 4+), counts the best `ceil(good_fraction n)` trials as good
//!   (`good_fraction` 0.2, capped at `linear_forgetting`; Watanabe 2023 finds a linear split
//!   better than √n), weighs them by rank (`good_weights: rank`: the best few shape the good
//!   density most), treats `randint` as ordered, and starts after 10 random trials. On the
//!   quality harness, see `benches/README.md` for how both variants compare with Optuna 5.0.
//!
//! Every NNI `tpe_args` key keeps its NNI meaning in both variants; giving `gamma` selects NNI's
//! √n split. knob adds `multivariate`, `good_fraction`, `good_weights` (`age`: NNI's and
//! Optuna's equal weights with linear forgetting; `rank`) and Optuna's `consider_endpoints`
//! (knob's kernels, `joint.rs`: the extreme values' bandwidth reaches the range's ends; false
//! with one objective, as Optuna, true with several).
//!
//! Multi-objective (an experiment with `objectives`; see `multi.rs`), as Optuna 5's `TPESampler`
//! with several objectives: `ceil(0.1 n)` of the `n` finished trials are good (no cap; knob takes
//! `ceil(0.125 n)` with three or more objectives, see below), chosen by
//! non-dominated rank, the rank that does not fit cut by hypervolume subset selection,
//! infeasible trials good only when too few are feasible; and each parameter is chosen on its
//! own (`joint::suggest_independent`, Optuna's independent TPE, its default with several
//! objectives; `multivariate: true` for the joint model). Unlike Optuna 5, whose good trials
//! weigh alike (`good_weights: equal`), knob weighs them by rank as with one objective
//! (`good_weights: rank`, the default): best first by non-dominated rank, each rank in greedy
//! hypervolume order (the order of hypervolume subset selection), the k-th of m weighing
//! `(m - k)^2`; `good_weights: hypervolume` weighs them by hypervolume contribution (Optuna 3-4).
//! Also unlike Optuna 5's default, the kernels consider the endpoints (`consider_endpoints`,
//! true with several objectives): the lowest value's bandwidth is at least its distance to the
//! range's low end (the highest's to the high end), so the search reaches a bound while the
//! good values are still away from it; chosen on held-out seeds of the quality harness, where
//! the ZDT problems' distance variables are optimal at the bound (`benches/README.md`). With
//! three or more objectives, whose front is a surface, knob counts `ceil(0.125 n)` trials good
//! instead of Optuna's `ceil(0.1 n)` (`good_fraction` sets both), chosen there too, on the
//! 3-objective DTLZ2: a higher median, at the cost of a rarer collapse onto one plane of the
//! front (2 in 100 held-out runs; 0.2 collapses often).
//! One objective with constraints keeps the single-objective model and split. Running trials
//! count as bad (Optuna's constant liar) unless `constant_liar_type` is null. `variant: nni`
//! models one objective and refuses such an experiment.
//!
//! Parallel trials: each running trial enters the model with a made-up loss (the constant
//! liar: best, worst or mean loss so far; `worst` by default, NNI's `best` under `variant:
//! nni`), so concurrent suggestions spread out. No point is
//! handed out twice (`Unseen`). Each suggestion draws from its own stream `step_rng(seed,
//! step)`, so a run resumed with `import_data` continues exactly as the uninterrupted run would.

mod joint;
mod multi;
mod nni;

use knob_plugin_api::space::{Encoding, ParamType, SearchSpace};
use knob_plugin_api::{
    log, parse_class_args, Generated, ImportedTrial, Outcome, PluginError, Tuner,
};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::common::args::{optimize_mode, OptimizeMode};
use crate::common::observed::{encode_imported, loss, reencode, Observation};
use crate::common::running::RunningTrials;
use crate::common::seed::{seed, seed_or_entropy, step_rng, SeedNotice};
use crate::common::unseen::Unseen;

const NAME: &str = "TPE";
/// The most `tpe_args.n_ei_candidates`: every candidate of a suggestion is held and scored at
/// once, so a larger count asks for gigabytes (24 bytes a candidate and parameter) and takes
/// seconds a suggestion; NNI's and Optuna's default is 24.
const MAX_EI_CANDIDATES: u64 = 100_000;

/// The TPE tuner; see the module docs.
#[derive(Debug)]
pub struct TpeTuner {
    seed: u64,
    /// A drawn seed's log line, said once the tuner is asked for parameters.
    seed_notice: SeedNotice,
    mode: OptimizeMode,
    settings: Settings,
    model: Option<Model>,
    /// Finished trials in the order their results arrived.
    finished: Vec<Observation>,
    running: RunningTrials,
    /// Imported before a search space arrived; encoded once one does.
    pending_import: Vec<ImportedTrial>,
    /// Points handed out or imported so far: the index of the next suggestion's random stream.
    steps: u64,
    unseen: Unseen,
}

/// The algorithm's settings after the variant's defaults and the user's `tpe_args`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    liar: Option<Liar>,
    n_startup_jobs: usize,
    n_ei_candidates: usize,
    linear_forgetting: usize,
    prior_weight: f64,
    split: Split,
    multivariate: bool,
    good_weights: GoodWeights,
    /// Optuna's `consider_endpoints`: the bandwidth of a dimension's lowest and highest value is
    /// the larger of the gap to its neighbour and the gap to the range's end, not the neighbour
    /// gap alone (`joint::fit_dim`). The value in use: `front_endpoints` with several
    /// objectives, false (Optuna's default) otherwise.
    consider_endpoints: bool,
    /// With several objectives: the split (Optuna 5's `ceil(0.1 n)`, not capped; with three or
    /// more objectives `front_split_many`), whether the model is joint (`multivariate: true`) or
    /// one dimension at a time (Optuna 5's default), and how the good trials are weighed.
    front_split: Split,
    /// The split with three or more objectives (knob: `ceil(0.125 n)`; Optuna: as with two),
    /// whose front is a surface rather than a curve: a few more good trials to cover it. Chosen
    /// on held-out seeds of the quality harness's 3-objective DTLZ2 (`benches/README.md`).
    front_split_many: Split,
    front_multivariate: bool,
    front_weights: FrontWeights,
    /// With several objectives, `consider_endpoints` (knob: true; Optuna: false): the extremes'
    /// kernels reach the range's ends, where optima of the distance variables often lie.
    front_endpoints: bool,
    /// NNI 3.0's TPE, which models one objective.
    variant_nni: bool,
}

/// How the good trials of a multi-objective experiment are weighed in the good density.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrontWeights {
    /// Optuna 5's: all the same.
    Equal,
    /// Optuna 3.x-4.x's: by hypervolume contribution among the good trials (`multi.rs`).
    Hypervolume,
    /// knob's rank weights over the good trials best first (non-dominated rank, each rank in
    /// greedy hypervolume order): the k-th of m weighs `(m - k)^2`.
    Rank,
}

/// How the good trials are weighted in the good density.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GoodWeights {
    /// NNI's and Optuna's: equal, except that with more than `linear_forgetting` good trials the
    /// oldest get less.
    Age,
    /// knob's: the k-th best of m good trials weighs `(m - k)^2` (k from 0), so the best few
    /// shape where candidates are drawn, like the recombination weights of CMA-ES.
    Rank,
}

/// `tpe_args.good_weights`: `age` and `rank` for one objective, `equal` and `hypervolume` for
/// several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum GoodWeightsArg {
    Age,
    Rank,
    Equal,
    Hypervolume,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Split {
    /// NNI and hyperopt: `ceil(gamma √n)` good trials.
    Sqrt(f64),
    /// Optuna: `ceil(fraction n)` good trials.
    Linear(f64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Liar {
    Best,
    Worst,
    Mean,
}

impl Settings {
    /// How many of `n` trials count as good.
    fn n_below(&self, n: usize) -> usize {
        let below = match self.split {
            Split::Sqrt(gamma) => (gamma * (n as f64).sqrt()).ceil(),
            Split::Linear(fraction) => (fraction * n as f64).ceil(),
        };
        (below.max(0.0) as usize).min(self.linear_forgetting)
    }

    /// How many of `n` trials count as good with `objectives` (two or more) objectives (no cap,
    /// as Optuna).
    fn n_below_front(&self, n: usize, objectives: usize) -> usize {
        let split = if objectives >= 3 {
            self.front_split_many
        } else {
            self.front_split
        };
        let below = match split {
            Split::Sqrt(gamma) => (gamma * (n as f64).sqrt()).ceil(),
            Split::Linear(fraction) => (fraction * n as f64).ceil(),
        };
        below.max(0.0) as usize
    }
}

/// The good points, their weights in the good density, and the bad points.
type Groups<'a> = (Vec<&'a [f64]>, Vec<f64>, Vec<&'a [f64]>);

/// The search space with what the algorithms look up per dimension.
#[derive(Debug)]
pub(crate) struct Model {
    space: SearchSpace,
    encoding: Encoding,
    types: Vec<ParamType>,
}

impl Model {
    fn new(space: &SearchSpace) -> Model {
        Model {
            space: space.clone(),
            encoding: space.encoding(),
            types: space
                .all_parameters()
                .into_iter()
                .map(|p| p.param_type().clone())
                .collect(),
        }
    }

    /// Whether dimension `d` exists in a point whose dimensions before `d` are `partial`.
    fn is_active(&self, d: usize, partial: &[f64]) -> bool {
        self.encoding.dims()[d]
            .condition()
            .is_none_or(|c| partial[c.dim] == c.option as f64)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TpeClassArgs {
    #[serde(default, deserialize_with = "optimize_mode")]
    optimize_mode: Option<OptimizeMode>,
    #[serde(default, deserialize_with = "seed")]
    seed: Option<u64>,
    #[serde(default)]
    variant: Option<Variant>,
    #[serde(default)]
    tpe_args: Option<TpeArgs>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Variant {
    Knob,
    Nni,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TpeArgs {
    #[serde(default, deserialize_with = "liar")]
    constant_liar_type: Option<Option<Liar>>,
    n_startup_jobs: Option<u64>,
    n_ei_candidates: Option<u64>,
    linear_forgetting: Option<u64>,
    prior_weight: Option<f64>,
    gamma: Option<f64>,
    multivariate: Option<bool>,
    good_fraction: Option<f64>,
    good_weights: Option<GoodWeightsArg>,
    consider_endpoints: Option<bool>,
}

/// `constant_liar_type`: "best", "worst", "mean", or null / "none" for no liar (NNI's `None`).
/// The good trials' weights by rank: the k-th best (from 0) of m weighs (m − k)². `best_first`
/// lists the good trials' indices (into `trials` finished ones) best first; the weights come in
/// the order of `arrival`, the same indices in the order the points are given.
fn rank_weights(
    best_first: &[usize],
    arrival: impl Iterator<Item = usize>,
    trials: usize,
) -> Vec<f64> {
    let mut rank = vec![0; trials];
    for (r, &i) in best_first.iter().enumerate() {
        rank[i] = r;
    }
    arrival
        .map(|i| ((best_first.len() - rank[i]) as f64).powi(2))
        .collect()
}

fn liar<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Option<Liar>>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(Some(None)),
        Some(Value::String(s)) => match s.to_lowercase().as_str() {
            "best" => Ok(Some(Some(Liar::Best))),
            "worst" => Ok(Some(Some(Liar::Worst))),
            "mean" => Ok(Some(Some(Liar::Mean))),
            "none" => Ok(Some(None)),
            _ => Err(serde::de::Error::custom(format!(
                "constant_liar_type must be \"best\", \"worst\", \"mean\" or null, got \"{s}\""
            ))),
        },
        Some(other) => Err(serde::de::Error::custom(format!(
            "constant_liar_type must be \"best\", \"worst\", \"mean\" or null, got {other}"
        ))),
    }
}

impl Settings {
    fn from_args(variant: Variant, args: TpeArgs) -> Result<Settings, PluginError> {
        let mut settings = match variant {
            Variant::Nni => Settings {
                liar: Some(Liar::Best),
                n_startup_jobs: 20,
                n_ei_candidates: 24,
                linear_forgetting: 25,
                prior_weight: 1.0,
                split: Split::Sqrt(0.25),
                multivariate: false,
                good_weights: GoodWeights::Age,
                consider_endpoints: false,
                front_split: Split::Linear(0.1),
                front_split_many: Split::Linear(0.1),
                front_multivariate: false,
                front_weights: FrontWeights::Equal,
                front_endpoints: false,
                variant_nni: true,
            },
            Variant::Knob => Settings {
                liar: Some(Liar::Worst),
                n_startup_jobs: 10,
                n_ei_candidates: 24,
                linear_forgetting: 25,
                prior_weight: 1.0,
                split: Split::Linear(0.2),
                multivariate: true,
                good_weights: GoodWeights::Rank,
                consider_endpoints: false,
                front_split: Split::Linear(0.1),
                front_split_many: Split::Linear(0.125),
                front_multivariate: false,
                front_weights: FrontWeights::Rank,
                front_endpoints: true,
                variant_nni: false,
            },
        };
        let bad = |what: String| PluginError::new(format!("classArgs of {NAME}: tpe_args.{what}"));
        if let Some(liar) = args.constant_liar_type {
            settings.liar = liar;
        }
        if let Some(n) = args.n_startup_jobs {
            settings.n_startup_jobs = n as usize;
        }
        if let Some(n) = args.n_ei_candidates {
            if !(1..=MAX_EI_CANDIDATES).contains(&n) {
                return Err(bad(format!(
                    "n_ei_candidates must be a whole number from 1 to {MAX_EI_CANDIDATES}, got {n}"
                )));
            }
            settings.n_ei_candidates = n as usize;
        }
        if let Some(n) = args.linear_forgetting {
            settings.linear_forgetting = n as usize;
        }
        if let Some(w) = args.prior_weight {
            if !(w >= 0.0 && w.is_finite()) {
                return Err(bad(format!("prior_weight must be a number >= 0, got {w}")));
            }
            settings.prior_weight = w;
        }
        match (args.gamma, args.good_fraction) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "gamma (NNI's split: ceil(gamma * sqrt(n)) good trials) and good_fraction (ceil(good_fraction * n)) exclude each other; give one"
                        .into(),
                ))
            }
            (Some(gamma), None) => {
                if !(gamma > 0.0 && gamma.is_finite()) {
                    return Err(bad(format!("gamma must be a number > 0, got {gamma}")));
                }
                settings.split = Split::Sqrt(gamma);
                settings.front_split = Split::Sqrt(gamma);
                settings.front_split_many = Split::Sqrt(gamma);
            }
            (None, Some(fraction)) => {
                if !(fraction > 0.0 && fraction <= 1.0) {
                    return Err(bad(format!(
                        "good_fraction must be in (0, 1], got {fraction}"
                    )));
                }
                settings.split = Split::Linear(fraction);
                settings.front_split = Split::Linear(fraction);
                settings.front_split_many = Split::Linear(fraction);
            }
            (None, None) => {}
        }
        if let Some(endpoints) = args.consider_endpoints {
            settings.consider_endpoints = endpoints;
            settings.front_endpoints = endpoints;
        }
        if let Some(multivariate) = args.multivariate {
            settings.multivariate = multivariate;
            settings.front_multivariate = multivariate;
        }
        match args.good_weights {
            None => {}
            Some(GoodWeightsArg::Equal) => settings.front_weights = FrontWeights::Equal,
            Some(GoodWeightsArg::Hypervolume) => settings.front_weights = FrontWeights::Hypervolume,
            Some(arg @ (GoodWeightsArg::Age | GoodWeightsArg::Rank)) => {
                if arg == GoodWeightsArg::Rank {
                    settings.front_weights = FrontWeights::Rank;
                }
                if !settings.multivariate {
                    return Err(bad(
                        "good_weights age and rank apply to the multivariate model only; set multivariate: true or leave it out".into(),
                    ));
                }
                settings.good_weights = if arg == GoodWeightsArg::Age {
                    GoodWeights::Age
                } else {
                    GoodWeights::Rank
                };
            }
        }
        Ok(settings)
    }
}

impl TpeTuner {
    /// The seed in use, given or drawn: `classArgs: {seed: <it>}` replays this run.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The made-up loss of running trials, from the losses so far (0 before any, as NNI).
    fn lie(&self) -> Option<f64> {
        let liar = self.settings.liar?;
        let finite = self
            .finished
            .iter()
            .map(|o| o.loss)
            .filter(|l| l.is_finite());
        let lie = match liar {
            Liar::Best => finite.fold(None, |m: Option<f64>, l| Some(m.map_or(l, |m| m.min(l)))),
            Liar::Worst => finite.fold(None, |m: Option<f64>, l| Some(m.map_or(l, |m| m.max(l)))),
            Liar::Mean => {
                let (sum, n) = finite.fold((0.0, 0usize), |(s, n), l| (s + l, n + 1));
                (n > 0).then(|| sum / n as f64)
            }
        };
        Some(lie.unwrap_or(0.0))
    }

    /// Candidate points, best first.
    fn candidates(
        &self,
        model: &Model,
        rng: &mut knob_plugin_api::space::SeededRng,
    ) -> Result<Vec<Vec<f64>>, PluginError> {
        let multi_objective = self.finished.iter().any(|o| o.outcome.is_some());
        if multi_objective && self.settings.variant_nni {
            return Err(PluginError::new(format!(
                "{NAME}: variant nni models one objective, and this experiment lists objectives; leave out variant for multi-objective TPE"
            )));
        }
        let history = self.running.with_finished(&self.finished, self.lie());
        if !self.settings.multivariate && !multi_objective {
            return Ok(vec![nni::suggest(model, &self.settings, rng, &history)]);
        }
        if self.finished.len() < self.settings.n_startup_jobs {
            // Unseen's random draws from the space are the start-up trials.
            return Ok(Vec::new());
        }
        // Several objectives, rather than one with constraints.
        let objectives = self
            .finished
            .iter()
            .filter_map(|o| o.outcome.as_ref())
            .map(|o| o.losses.len())
            .max()
            .unwrap_or(0);
        let front = multi_objective && objectives > 1;
        let (below, below_weights, above) = if front {
            // Optuna counts finished trials only; running ones are bad under the liar.
            let n_below = self.settings.n_below_front(self.finished.len(), objectives);
            self.split_by_outcomes(&history, n_below.min(self.finished.len()))
        } else if multi_objective {
            let n_below = self.settings.n_below(history.len()).min(history.len());
            self.split_by_outcomes(&history, n_below)
        } else {
            let n_below = self.settings.n_below(history.len()).min(history.len());
            self.split_by_loss(&history, n_below)
        };
        let weights = |n| nni::linear_forgetting_weights(self.settings.linear_forgetting, n);
        let independent = if front {
            !self.settings.front_multivariate
        } else {
            !self.settings.multivariate
        };
        // The kernels' settings: the endpoints rule of several objectives, when there are.
        let settings = Settings {
            consider_endpoints: if front {
                self.settings.front_endpoints
            } else {
                self.settings.consider_endpoints
            },
            ..self.settings.clone()
        };
        if independent {
            let above_weights = weights(above.len());
            return Ok(vec![joint::suggest_independent(
                model,
                &settings,
                rng,
                (&below, &below_weights),
                (&above, &above_weights),
            )]);
        }
        let good = joint::Mixture::fit(model, &settings, &below, &below_weights);
        let bad = joint::Mixture::fit(model, &settings, &above, &weights(above.len()));
        let samples = good.sample(model, rng, settings.n_ei_candidates);
        let mut scratch = Vec::new();
        let mut scored: Vec<(f64, Vec<f64>)> = samples
            .into_iter()
            .map(|x| {
                let score = good.log_pdf(&x, &mut scratch) - bad.log_pdf(&x, &mut scratch);
                (
                    if score.is_nan() {
                        f64::NEG_INFINITY
                    } else {
                        score
                    },
                    x,
                )
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        Ok(scored.into_iter().map(|(_, x)| x).collect())
    }

    /// The good points with their weights and the bad points, by loss (single objective).
    fn split_by_loss<'a>(&self, history: &[(&'a [f64], f64)], n_below: usize) -> Groups<'a> {
        let mut order: Vec<usize> = (0..history.len()).collect();
        order.sort_by(|&a, &b| history[a].1.total_cmp(&history[b].1));
        let mut is_below = vec![false; history.len()];
        for &i in &order[..n_below] {
            is_below[i] = true;
        }
        // Each group in arrival order, so linear forgetting down-weights the oldest.
        let group = |below: bool| -> Vec<&[f64]> {
            (0..history.len())
                .filter(|&i| is_below[i] == below)
                .map(|i| history[i].0)
                .collect()
        };
        let (below, above) = (group(true), group(false));
        let weights = |n| nni::linear_forgetting_weights(self.settings.linear_forgetting, n);
        let below_weights = match self.settings.good_weights {
            GoodWeights::Age => weights(below.len()),
            // `group` lists the good trials in arrival order.
            GoodWeights::Rank => rank_weights(
                &order[..n_below],
                (0..history.len()).filter(|&i| is_below[i]),
                history.len(),
            ),
        };
        (below, below_weights, above)
    }

    /// The good points with their weights and the bad points when the finished trials have
    /// outcomes (`multi.rs`); running trials, at the end of `history`, are bad under a liar.
    fn split_by_outcomes<'a>(&self, history: &[(&'a [f64], f64)], n_below: usize) -> Groups<'a> {
        // A finished trial without an outcome (a scalar result reaching a multi-objective
        // experiment's tuner, which the host does not send) counts as incomplete: bad.
        let incomplete = Outcome {
            values: vec![],
            losses: vec![f64::NAN],
            violations: vec![],
        };
        let outcomes: Vec<&Outcome> = self
            .finished
            .iter()
            .map(|o| o.outcome.as_ref().unwrap_or(&incomplete))
            .collect();
        let order_ranks = self.settings.front_weights == FrontWeights::Rank;
        let best_first = multi::split(&outcomes, n_below, order_ranks);
        let mut is_below = vec![false; history.len()];
        for &i in &best_first {
            is_below[i] = true;
        }
        // Arrival order, as the single-objective split, with weights to match.
        let below_ids: Vec<usize> = (0..outcomes.len()).filter(|&i| is_below[i]).collect();
        let one_objective = outcomes
            .iter()
            .find(|o| o.is_complete())
            .is_some_and(|o| o.losses.len() == 1);
        let below_weights = if !one_objective {
            match self.settings.front_weights {
                FrontWeights::Equal => vec![1.0; below_ids.len()],
                FrontWeights::Hypervolume => multi::below_weights(&outcomes, &below_ids),
                FrontWeights::Rank => {
                    rank_weights(&best_first, below_ids.iter().copied(), history.len())
                }
            }
        } else {
            // One objective with constraints: the single-objective weights over the
            // constrained order.
            match self.settings.good_weights {
                GoodWeights::Age => {
                    nni::linear_forgetting_weights(self.settings.linear_forgetting, below_ids.len())
                }
                GoodWeights::Rank => {
                    rank_weights(&best_first, below_ids.iter().copied(), history.len())
                }
            }
        };
        let below = below_ids.iter().map(|&i| history[i].0).collect();
        let above = (0..history.len())
            .filter(|&i| !is_below[i])
            .map(|i| history[i].0)
            .collect();
        (below, below_weights, above)
    }

    fn take_pending_import(&mut self) {
        let Some(model) = &self.model else { return };
        let trials = std::mem::take(&mut self.pending_import);
        // A trial without a result was handed out all the same: never again, and it used a step.
        let (results, handed_out): (Vec<_>, Vec<_>) =
            trials.into_iter().partition(ImportedTrial::is_result);
        for trial in &handed_out {
            self.unseen.insert(&trial.parameters);
            self.steps += 1;
        }
        let observations = encode_imported(NAME, &model.encoding, &results, self.mode);
        for o in observations {
            self.unseen.insert(&o.parameters);
            self.finished.push(o);
            self.steps += 1;
        }
    }
}

impl Tuner for TpeTuner {
    /// Multi-objective with the multivariate model (the default); see the module docs.
    fn takes_objectives() -> bool {
        true
    }

    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args: TpeClassArgs = parse_class_args(NAME, class_args)?;
        let settings = Settings::from_args(
            args.variant.unwrap_or(Variant::Knob),
            args.tpe_args.unwrap_or_default(),
        )?;
        let (seed, seed_notice) = seed_or_entropy(NAME, args.seed);
        Ok(TpeTuner {
            seed,
            seed_notice,
            mode: args.optimize_mode.unwrap_or(OptimizeMode::Minimize),
            settings,
            model: None,
            finished: Vec::new(),
            running: RunningTrials::default(),
            pending_import: Vec::new(),
            steps: 0,
            unseen: Unseen::default(),
        })
    }

    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        let model = Model::new(space);
        reencode(NAME, &model.encoding, &mut self.finished);
        self.running.reencode(&model.encoding);
        self.unseen.reset_grid();
        self.model = Some(model);
        self.take_pending_import();
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        self.seed_notice.log_once();
        let Some(model) = &self.model else {
            return Err(PluginError::new(format!(
                "{NAME}: asked for parameters before it was given a search space"
            )));
        };
        let mut rng = step_rng(self.seed, self.steps);
        let candidates = self.candidates(model, &mut rng)?;
        let decoded = candidates
            .iter()
            .filter_map(|x| model.encoding.decode(x).ok())
            .collect::<Vec<_>>();
        let Some(parameters) = self.unseen.pick(NAME, &model.space, &mut rng, decoded) else {
            return Ok(Generated::NoMore);
        };
        self.running
            .start(NAME, &model.encoding, parameter_id, &parameters)?;
        self.steps += 1;
        Ok(Generated::Parameters(parameters))
    }

    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        value: f64,
    ) -> Result<(), PluginError> {
        let encoding = self.model.as_ref().map(|model| &model.encoding);
        let loss = loss(value, self.mode);
        if let Some(observation) =
            self.running
                .finish(NAME, encoding, parameter_id, parameters, loss)
        {
            self.finished.push(observation);
        }
        Ok(())
    }

    fn receive_trial_outcome(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        outcome: &Outcome,
    ) -> Result<(), PluginError> {
        let encoding = self.model.as_ref().map(|model| &model.encoding);
        // The first objective's loss, for the liar's statistics only.
        let first = outcome.losses.first().copied().unwrap_or(f64::NAN);
        let loss = if first.is_nan() { f64::INFINITY } else { first };
        if let Some(mut observation) =
            self.running
                .finish(NAME, encoding, parameter_id, parameters, loss)
        {
            observation.outcome = Some(outcome.clone());
            self.finished.push(observation);
        }
        Ok(())
    }

    fn trial_end(&mut self, parameter_id: u64, _status: &str) -> Result<(), PluginError> {
        // A trial that ended without a result leaves the liar's set.
        self.running.end(parameter_id);
        Ok(())
    }

    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        self.pending_import.extend_from_slice(trials);
        let before = self.finished.len();
        self.take_pending_import();
        if self.model.is_some() {
            log::info(&format!(
                "{NAME}: imported {} of {} trials",
                self.finished.len() - before,
                trials.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(args: &str) -> Settings {
        let args: TpeArgs = serde_json::from_str(args).expect("valid tpe_args");
        Settings::from_args(Variant::Knob, args).expect("accepted tpe_args")
    }

    /// Two objectives keep Optuna's `ceil(0.1 n)`; three or more take `ceil(0.125 n)`; a given
    /// `good_fraction` (or NNI's `gamma`) applies to any number of objectives.
    #[test]
    fn the_front_split_grows_with_three_objectives_unless_given() {
        let knob = settings("{}");
        assert_eq!(knob.n_below_front(200, 2), 20);
        assert_eq!(knob.n_below_front(200, 3), 25);
        assert_eq!(knob.n_below_front(200, 5), 25);
        assert_eq!(knob.n_below_front(11, 3), 2);
        let given = settings(r#"{"good_fraction": 0.3}"#);
        assert_eq!(given.n_below_front(200, 2), 60);
        assert_eq!(given.n_below_front(200, 3), 60);
        let gamma = settings(r#"{"gamma": 1.0}"#);
        assert_eq!(gamma.n_below_front(100, 3), 10);
        let nni = Settings::from_args(Variant::Nni, TpeArgs::default()).expect("defaults");
        assert_eq!(nni.n_below_front(200, 3), 20);
    }
}
