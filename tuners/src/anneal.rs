//! Anneal, NNI's `Anneal` tuner: hyperopt's annealing algorithm (`hyperopt/anneal.py`), which
//! NNI 3.0 wraps in `hyperopt_tuner.py`.
//!
//! Each parameter is drawn near its value in one of the best trials so far, from a neighbourhood
//! that shrinks as trials accumulate: with `T` trials that have the parameter, the width is the
//! prior's times `1 / (1 + T shrink_coef)`. Which trial: the `k`-th best, `k` drawn from a
//! geometric distribution with mean `avg_best_idx` (2 by default, so mostly the best or second
//! best); once a trial is picked for one parameter, later parameters of the same suggestion
//! reuse it when it has them (hyperopt's `best_tids`).
//!
//! - uniform family (log types in log space): uniform on `[v - w/2, v + w/2]`, shifted to stay
//!   inside the range;
//! - normal family: `normal(v, sigma w)`;
//! - choice, nested choice, randint: the picked trial's index with probability `1 - w`, else a
//!   uniform index (hyperopt treats randint as categorical too);
//! - a parameter no finished trial has is drawn from its prior.
//!
//! NNI's parallel mode is kept (`parallel_optimize`, `constant_liar_type` min / max / mean of the
//! metric values so far, used once more than 20 trials were handed out); without it, and in
//! any case, no point is handed out twice. Each suggestion draws from its own random stream, so
//! a resumed run continues as the uninterrupted one.

use knob_plugin_api::space::{
    standard_normal, DimKind, Encoding, ParamType, SearchSpace, SeededRng,
};
use knob_plugin_api::{log, parse_class_args, Generated, ImportedTrial, PluginError, Tuner};
use rand::Rng;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::common::args::{optimize_mode, OptimizeMode};
use crate::common::numeric::snap;
use crate::common::observed::{encode_imported, loss, reencode, Observation};
use crate::common::running::RunningTrials;
use crate::common::seed::{seed, seed_or_entropy, step_rng, SeedNotice};
use crate::common::unseen::Unseen;

const NAME: &str = "Anneal";
/// Annealed draws tried before `Unseen` falls back to random draws and the grid.
const DRAWS: usize = 8;
/// NNI lies about running trials only once more than this many trials were handed out.
const LIAR_AFTER: u64 = 20;

#[derive(Debug)]
pub struct AnnealTuner {
    seed: u64,
    /// A drawn seed's log line, said once the tuner is asked for parameters.
    seed_notice: SeedNotice,
    mode: OptimizeMode,
    avg_best_idx: f64,
    shrink_coef: f64,
    liar: Option<Liar>,
    model: Option<(SearchSpace, Encoding, Vec<ParamType>)>,
    finished: Vec<Observation>,
    /// Handed out, no result yet; the metric value is what the liar says.
    running: RunningTrials,
    pending_import: Vec<ImportedTrial>,
    steps: u64,
    unseen: Unseen,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Liar {
    Min,
    Max,
    Mean,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnnealArgs {
    #[serde(default, deserialize_with = "optimize_mode")]
    optimize_mode: Option<OptimizeMode>,
    #[serde(default, deserialize_with = "seed")]
    seed: Option<u64>,
    #[serde(default)]
    parallel_optimize: bool,
    #[serde(default, deserialize_with = "liar")]
    constant_liar_type: Option<Liar>,
    avg_best_idx: Option<f64>,
    shrink_coef: Option<f64>,
}

fn liar<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Liar>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s == "min" => Ok(Some(Liar::Min)),
        Some(Value::String(s)) if s == "max" => Ok(Some(Liar::Max)),
        Some(Value::String(s)) if s == "mean" => Ok(Some(Liar::Mean)),
        Some(other) => Err(serde::de::Error::custom(format!(
            "constant_liar_type must be \"min\", \"max\" or \"mean\", got {other}"
        ))),
    }
}

impl AnnealTuner {
    /// The seed in use, given or drawn.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn lie(&self) -> Option<f64> {
        let liar = self.liar?;
        if self.steps <= LIAR_AFTER || self.running.is_empty() {
            return None;
        }
        // NNI's liar works on metric values, not losses: "min" is the best under minimize and
        // the worst under maximize.
        let finite = self
            .finished
            .iter()
            .filter(|o| o.loss.is_finite())
            .map(|o| match self.mode {
                OptimizeMode::Minimize => o.loss,
                OptimizeMode::Maximize => -o.loss,
            });
        match liar {
            Liar::Min => finite.reduce(f64::min),
            Liar::Max => finite.reduce(f64::max),
            Liar::Mean => {
                let (sum, n) = finite.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
                (n > 0).then(|| sum / n as f64)
            }
        }
    }

    /// One annealed point (encoded), hyperopt's `AnnealingAlgo` for a single new trial.
    fn anneal(
        &self,
        encoding: &Encoding,
        types: &[ParamType],
        trials: &[(&[f64], f64)],
        rng: &mut SeededRng,
    ) -> Vec<f64> {
        let mut point: Vec<f64> = Vec::with_capacity(encoding.len());
        let mut best_trials: Vec<usize> = Vec::new();
        for (d, dim) in encoding.dims().iter().enumerate() {
            let active = dim
                .condition()
                .is_none_or(|c| point[c.dim] == c.option as f64);
            if !active {
                point.push(f64::NAN);
                continue;
            }
            let having: Vec<usize> = (0..trials.len())
                .filter(|&i| !trials[i].0[d].is_nan())
                .collect();
            if having.is_empty() {
                point.push(prior_draw(dim.kind(), rng));
                continue;
            }
            let picked = match best_trials.iter().find(|t| having.contains(t)) {
                Some(&t) => t,
                None => {
                    let mut by_loss = having.clone();
                    by_loss.sort_by(|&a, &b| trials[a].1.total_cmp(&trials[b].1));
                    let rank =
                        (geometric(rng, 1.0 / self.avg_best_idx) - 1).min(by_loss.len() as u64 - 1);
                    let t = by_loss[rank as usize];
                    best_trials.push(t);
                    t
                }
            };
            let value = trials[picked].0[d];
            let shrink = 1.0 / (1.0 + having.len() as f64 * self.shrink_coef);
            let x = match dim.kind() {
                DimKind::Categorical { size } | DimKind::Integer { size } => {
                    if rng.gen::<f64>() < 1.0 - shrink {
                        value
                    } else {
                        rng.gen_range(0..size) as f64
                    }
                }
                DimKind::Unit => {
                    let half = 0.5 * shrink;
                    let mid = value.clamp(half, 1.0 - half);
                    mid - half + rng.gen::<f64>() * 2.0 * half
                }
                DimKind::Gaussian => value + shrink * standard_normal(rng),
            };
            point.push(snap(&types[d], dim.kind(), x));
        }
        point
    }
}

/// A draw from the prior, as `Encoding::sample_vector` makes it for one dimension.
fn prior_draw(kind: DimKind, rng: &mut SeededRng) -> f64 {
    match kind {
        DimKind::Categorical { size } | DimKind::Integer { size } => rng.gen_range(0..size) as f64,
        DimKind::Unit => rng.gen(),
        DimKind::Gaussian => standard_normal(rng),
    }
}

/// numpy's `geometric(p)`: trials up to and including the first success, at least 1.
fn geometric(rng: &mut SeededRng, p: f64) -> u64 {
    if p >= 1.0 {
        return 1;
    }
    let u = 1.0 - rng.gen::<f64>();
    (u.ln() / (1.0 - p).ln()).ceil().max(1.0) as u64
}

impl Tuner for AnnealTuner {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args: AnnealArgs = parse_class_args(NAME, class_args)?;
        let bad = |m: String| PluginError::new(format!("classArgs of {NAME}: {m}"));
        let avg_best_idx = args.avg_best_idx.unwrap_or(2.0);
        if !(avg_best_idx >= 1.0 && avg_best_idx.is_finite()) {
            return Err(bad(format!(
                "avg_best_idx must be a number >= 1, got {avg_best_idx}"
            )));
        }
        let shrink_coef = args.shrink_coef.unwrap_or(0.1);
        if !(shrink_coef >= 0.0 && shrink_coef.is_finite()) {
            return Err(bad(format!(
                "shrink_coef must be a number >= 0, got {shrink_coef}"
            )));
        }
        if args.constant_liar_type.is_some() && !args.parallel_optimize {
            log::info(&format!(
                "{NAME}: constant_liar_type is used only with parallel_optimize: true (as in NNI)"
            ));
        }
        let (seed, seed_notice) = seed_or_entropy(NAME, args.seed);
        Ok(AnnealTuner {
            seed,
            seed_notice,
            mode: args.optimize_mode.unwrap_or(OptimizeMode::Minimize),
            avg_best_idx,
            shrink_coef,
            liar: args
                .parallel_optimize
                .then(|| args.constant_liar_type.unwrap_or(Liar::Min)),
            model: None,
            finished: Vec::new(),
            running: RunningTrials::default(),
            pending_import: Vec::new(),
            steps: 0,
            unseen: Unseen::default(),
        })
    }

    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        let encoding = space.encoding();
        reencode(NAME, &encoding, &mut self.finished);
        self.running.reencode(&encoding);
        let types = space
            .all_parameters()
            .into_iter()
            .map(|p| p.param_type().clone())
            .collect();
        self.model = Some((space.clone(), encoding, types));
        self.unseen.reset_grid();
        let pending = std::mem::take(&mut self.pending_import);
        self.import_data(&pending)
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        self.seed_notice.log_once();
        let Some((space, encoding, types)) = &self.model else {
            return Err(PluginError::new(format!(
                "{NAME}: asked for parameters before it was given a search space"
            )));
        };
        let mut rng = step_rng(self.seed, self.steps);
        let lie = self.lie().map(|lie| loss(lie, self.mode));
        let trials = self.running.with_finished(&self.finished, lie);
        let candidates: Vec<Value> = (0..DRAWS)
            .filter_map(|_| {
                encoding
                    .decode(&self.anneal(encoding, types, &trials, &mut rng))
                    .ok()
            })
            .collect();
        let Some(parameters) = self.unseen.pick(NAME, space, &mut rng, candidates) else {
            return Ok(Generated::NoMore);
        };
        self.running
            .start(NAME, encoding, parameter_id, &parameters)?;
        self.steps += 1;
        Ok(Generated::Parameters(parameters))
    }

    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        value: f64,
    ) -> Result<(), PluginError> {
        let encoding = self.model.as_ref().map(|(_, encoding, _)| encoding);
        let loss = loss(value, self.mode);
        if let Some(observation) =
            self.running
                .finish(NAME, encoding, parameter_id, parameters, loss)
        {
            // Anneal keeps the parameters as the result names them (the same as handed out,
            // unless the host says otherwise), with the handed-out encoding.
            self.finished.push(Observation {
                parameters: parameters.clone(),
                ..observation
            });
        }
        Ok(())
    }

    fn trial_end(&mut self, parameter_id: u64, _status: &str) -> Result<(), PluginError> {
        self.running.end(parameter_id);
        Ok(())
    }

    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        let Some((_, encoding, _)) = &self.model else {
            self.pending_import.extend_from_slice(trials);
            return Ok(());
        };
        // A trial without a result was handed out all the same: never again, and it used a step.
        let (results, handed_out): (Vec<ImportedTrial>, Vec<ImportedTrial>) =
            trials.iter().cloned().partition(ImportedTrial::is_result);
        for trial in &handed_out {
            self.unseen.insert(&trial.parameters);
            self.steps += 1;
        }
        let observations = encode_imported(NAME, encoding, &results, self.mode);
        let imported = observations.len();
        for o in observations {
            self.unseen.insert(&o.parameters);
            self.finished.push(o);
            self.steps += 1;
        }
        if !trials.is_empty() {
            log::info(&format!(
                "{NAME}: imported {imported} of {} trials",
                trials.len()
            ));
        }
        Ok(())
    }
}
