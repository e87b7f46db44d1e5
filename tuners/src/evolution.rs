//! Evolution, NNI's naive evolution (`nni/algorithms/hpo/evolution_tuner.py`, after Real et al.
//! 2017, "Large-Scale Evolution of Image Classifiers").
//!
//! The first `population_size` suggestions are random. After that each suggestion is a child:
//! two members of the population (the trials with results) meet in a tournament, the loser
//! leaves the population, and the winner is copied with a mutation. A trial that fails without a
//! result is replaced by a new random suggestion, as in NNI.
//!
//! Two deviations from NNI's defaults, both reachable by classArgs: `population_size` is 16, not
//! 32, and the mutation (`mutation: perturb`) moves every numeric parameter by a normal step of a
//! tenth of its range and redraws each choice with probability 1 / (active parameters), where
//! NNI redraws one parameter from its prior (`mutation: resample`). On the quality harness
//! (`benches/README.md`) NNI's settings barely beat random search within 100 trials; these reach
//! 2-4x lower regret.
//!
//! When no suggestion can be made yet (every random one is out and no result has come back, or
//! `population_size` trials are running), `generate_parameters` answers
//! [`Generated::Deferred`]; the suggestion is made when a result or a trial's end arrives and
//! handed over through `take_suggestions`, in the order the ids were deferred. NNI 3.0 does the
//! same through its `send_trial_callback`, but only while more than one request is waiting (its
//! `credit > 1`), which leaves the last request unanswered; here every deferred id is answered.
//!
//! Each suggestion draws from its own random stream and the population is a function of the
//! history, so `import_data` (trials in the order they ran, one at a time) rebuilds the state an
//! uninterrupted run would have.

use std::collections::VecDeque;

use knob_plugin_api::space::{
    standard_normal, DimKind, Encoding, ParamType, SearchSpace, SeededRng,
};
use knob_plugin_api::{
    log, parse_class_args, status, Generated, ImportedTrial, PluginError, Suggestion, Tuner,
};
use rand::Rng;
use serde::Deserialize;
use serde_json::Value;

use crate::common::args::{optimize_mode, OptimizeMode};
use crate::common::numeric::snap;
use crate::common::observed::{encode_imported, loss, reencode, Observation};
use crate::common::running::RunningTrials;
use crate::common::seed::{seed, seed_or_entropy, step_rng, SeedNotice};
use crate::common::unseen::Unseen;

const NAME: &str = "Evolution";
/// Mutations of the tournament's winner tried before `Unseen` falls back to random draws.
const MUTATIONS: usize = 8;

#[derive(Debug)]
pub struct EvolutionTuner {
    seed: u64,
    /// A drawn seed's log line, said once the tuner is asked for parameters.
    seed_notice: SeedNotice,
    mode: OptimizeMode,
    population_size: usize,
    mutation: Mutation,
    model: Option<(SearchSpace, Encoding)>,
    /// Each dimension's parameter type, for snapping perturbed values.
    types: Vec<ParamType>,
    /// Trials with results that have not lost a tournament, oldest first.
    population: Vec<Observation>,
    /// Random suggestions still to make: the first generation, plus one per failed trial.
    random_owed: usize,
    running: RunningTrials,
    deferred: VecDeque<u64>,
    ready: Vec<Suggestion>,
    pending_import: Vec<ImportedTrial>,
    steps: u64,
    unseen: Unseen,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EvolutionArgs {
    #[serde(default, deserialize_with = "optimize_mode")]
    optimize_mode: Option<OptimizeMode>,
    #[serde(default, deserialize_with = "seed")]
    seed: Option<u64>,
    population_size: Option<u64>,
    mutation: Option<Mutation>,
}

/// How a child differs from its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Mutation {
    /// NNI's: one active parameter, chosen uniformly, drawn anew from its prior.
    Resample,
    /// knob's default: every numeric parameter takes a normal step of a tenth of its range
    /// (half the prior's standard deviation for the normal family), and each choice is drawn anew
    /// with probability 1 / (active parameters); at least one parameter changes.
    Perturb,
}

/// What the tuner can do for the next id.
enum Next {
    Point(Value),
    /// Not until a result arrives.
    Wait,
    /// Every point of a finite space has been handed out.
    Exhausted,
}

impl EvolutionTuner {
    /// The seed in use, given or drawn.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The tournament of step `step`'s stream: the winner's index. The loser leaves the
    /// population. Shared by suggestions and by the replay of imported trials, so both consume
    /// the stream alike.
    fn tournament(&mut self, rng: &mut SeededRng) -> usize {
        let n = self.population.len();
        if n < 2 {
            return 0;
        }
        let a = rng.gen_range(0..n as u64) as usize;
        let b = (a + 1 + rng.gen_range(0..n as u64 - 1) as usize) % n;
        let (winner, loser) = if self.population[b].loss < self.population[a].loss {
            (b, a)
        } else {
            (a, b)
        };
        self.population.remove(loser);
        if winner > loser {
            winner - 1
        } else {
            winner
        }
    }

    fn next(&mut self) -> Result<Next, PluginError> {
        let Some((space, encoding)) = self.model.clone() else {
            return Err(PluginError::new(format!(
                "{NAME}: asked for parameters before it was given a search space"
            )));
        };
        let mut rng = step_rng(self.seed, self.steps);
        let candidates: Vec<Value> = if self.random_owed > 0 {
            // `Unseen` draws random points when given no candidate.
            Vec::new()
        } else if !self.population.is_empty() && self.running.len() < self.population_size {
            let parent = self.tournament(&mut rng);
            let parent = self.population[parent].vector.clone();
            (0..MUTATIONS)
                .filter_map(|_| {
                    let child = match self.mutation {
                        Mutation::Resample => resample_one(&encoding, &parent, &mut rng),
                        Mutation::Perturb => perturb(&encoding, &self.types, &parent, &mut rng),
                    };
                    encoding.decode(&child).ok()
                })
                .collect()
        } else {
            return Ok(Next::Wait);
        };
        let Some(parameters) = self.unseen.pick(NAME, &space, &mut rng, candidates) else {
            return Ok(Next::Exhausted);
        };
        self.random_owed = self.random_owed.saturating_sub(1);
        self.steps += 1;
        Ok(Next::Point(parameters))
    }

    fn start(&mut self, parameter_id: u64, parameters: &Value) -> Result<(), PluginError> {
        let Some((_, encoding)) = &self.model else {
            return Ok(());
        };
        self.running.start(NAME, encoding, parameter_id, parameters)
    }

    /// Answers deferred ids, oldest first, while suggestions can be made.
    fn serve_deferred(&mut self) -> Result<(), PluginError> {
        while let Some(&id) = self.deferred.front() {
            match self.next()? {
                Next::Point(parameters) => {
                    self.deferred.pop_front();
                    self.start(id, &parameters)?;
                    self.ready.push(Suggestion {
                        parameter_id: id,
                        parameters,
                        label: None,
                    });
                }
                Next::Wait => break,
                Next::Exhausted => {
                    log::info(&format!(
                        "{NAME}: the search space is used up; {} deferred requests stay unanswered",
                        self.deferred.len()
                    ));
                    self.deferred.clear();
                }
            }
        }
        Ok(())
    }
}

/// [`Mutation::Perturb`]: numeric steps everywhere, choices redrawn now and then (a redrawn
/// nested choice redraws what is under it).
fn perturb(
    encoding: &Encoding,
    types: &[ParamType],
    parent: &[f64],
    rng: &mut SeededRng,
) -> Vec<f64> {
    let dims = encoding.dims();
    let active = parent.iter().filter(|x| !x.is_nan()).count().max(1);
    let mut changed = false;
    let mut redrawn: Vec<bool> = vec![false; dims.len()];
    let mut child: Vec<f64> = Vec::with_capacity(dims.len());
    for (d, dim) in dims.iter().enumerate() {
        let on = dim
            .condition()
            .is_none_or(|c| child[c.dim] == c.option as f64);
        let parent_redrawn = dim.condition().is_some_and(|c| redrawn[c.dim]);
        let x = if !on {
            f64::NAN
        } else if parent_redrawn || parent[d].is_nan() {
            // Under a redrawn nested choice, or an option the parent did not have.
            redrawn[d] = true;
            prior_draw(dim.kind(), rng)
        } else {
            match dim.kind() {
                DimKind::Categorical { size } => {
                    if rng.gen_range(0..active as u64) == 0 {
                        redrawn[d] = true;
                        rng.gen_range(0..size) as f64
                    } else {
                        parent[d]
                    }
                }
                kind => {
                    let (lo, hi) = kind.range();
                    let step = match kind {
                        DimKind::Gaussian => 0.5,
                        _ => 0.1 * (hi - lo).max(1.0),
                    };
                    let raw = parent[d] + step * standard_normal(rng);
                    let raw = if kind == DimKind::Gaussian {
                        raw
                    } else {
                        raw.clamp(lo, hi)
                    };
                    snap(&types[d], kind, raw)
                }
            }
        };
        changed |= x.to_bits() != parent[d].to_bits();
        child.push(x);
    }
    if changed {
        child
    } else {
        resample_one(encoding, parent, rng)
    }
}

fn prior_draw(kind: DimKind, rng: &mut SeededRng) -> f64 {
    match kind {
        DimKind::Categorical { size } | DimKind::Integer { size } => rng.gen_range(0..size) as f64,
        DimKind::Unit => rng.gen(),
        DimKind::Gaussian => standard_normal(rng),
    }
}

/// [`Mutation::Resample`], NNI's: the parent with one active parameter, chosen uniformly, drawn
/// anew from its prior; under a nested choice drawn anew, every parameter of the chosen option
/// is drawn anew too.
fn resample_one(encoding: &Encoding, parent: &[f64], rng: &mut SeededRng) -> Vec<f64> {
    let dims = encoding.dims();
    let active: Vec<usize> = (0..dims.len()).filter(|&d| !parent[d].is_nan()).collect();
    if active.is_empty() {
        return parent.to_vec();
    }
    let target = active[rng.gen_range(0..active.len() as u64) as usize];
    let below_target = |mut d: usize| {
        while let Some(c) = dims[d].condition() {
            if c.dim == target {
                return true;
            }
            d = c.dim;
        }
        false
    };
    let mut child: Vec<f64> = Vec::with_capacity(dims.len());
    for (d, dim) in dims.iter().enumerate() {
        let on = dim
            .condition()
            .is_none_or(|c| child[c.dim] == c.option as f64);
        let x = if !on {
            f64::NAN
        } else if d == target || below_target(d) {
            match dim.kind() {
                DimKind::Categorical { size } | DimKind::Integer { size } => {
                    rng.gen_range(0..size) as f64
                }
                DimKind::Unit => rng.gen(),
                DimKind::Gaussian => standard_normal(rng),
            }
        } else {
            parent[d]
        };
        child.push(x);
    }
    child
}

impl Tuner for EvolutionTuner {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args: EvolutionArgs = parse_class_args(NAME, class_args)?;
        let population_size = args.population_size.unwrap_or(16);
        if population_size == 0 {
            return Err(PluginError::new(format!(
                "classArgs of {NAME}: population_size must be at least 1, got 0"
            )));
        }
        let (seed, seed_notice) = seed_or_entropy(NAME, args.seed);
        Ok(EvolutionTuner {
            seed,
            seed_notice,
            // NNI's Evolution maximizes unless told otherwise.
            mode: args.optimize_mode.unwrap_or(OptimizeMode::Maximize),
            population_size: population_size as usize,
            mutation: args.mutation.unwrap_or(Mutation::Perturb),
            model: None,
            types: Vec::new(),
            population: Vec::new(),
            random_owed: population_size as usize,
            running: RunningTrials::default(),
            deferred: VecDeque::new(),
            ready: Vec::new(),
            pending_import: Vec::new(),
            steps: 0,
            unseen: Unseen::default(),
        })
    }

    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        let encoding = space.encoding();
        reencode(NAME, &encoding, &mut self.population);
        self.running.reencode(&encoding);
        self.types = space
            .all_parameters()
            .into_iter()
            .map(|p| p.param_type().clone())
            .collect();
        self.model = Some((space.clone(), encoding));
        self.unseen.reset_grid();
        let pending = std::mem::take(&mut self.pending_import);
        self.import_data(&pending)?;
        self.serve_deferred()
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        self.seed_notice.log_once();
        if !self.deferred.is_empty() {
            self.deferred.push_back(parameter_id);
            return Ok(Generated::Deferred);
        }
        match self.next()? {
            Next::Point(parameters) => {
                self.start(parameter_id, &parameters)?;
                Ok(Generated::Parameters(parameters))
            }
            Next::Wait => {
                if self.running.len() >= self.population_size {
                    log::warn(&format!(
                        "{NAME}: {} trials are running, as many as population_size; make population_size larger than trialConcurrency",
                        self.running.len()
                    ));
                }
                self.deferred.push_back(parameter_id);
                Ok(Generated::Deferred)
            }
            Next::Exhausted => Ok(Generated::NoMore),
        }
    }

    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        value: f64,
    ) -> Result<(), PluginError> {
        let encoding = self.model.as_ref().map(|(_, encoding)| encoding);
        let loss = loss(value, self.mode);
        match self
            .running
            .finish(NAME, encoding, parameter_id, parameters, loss)
        {
            Some(observation) => {
                self.population.push(observation);
                self.serve_deferred()
            }
            None => Ok(()),
        }
    }

    fn trial_end(&mut self, parameter_id: u64, status: &str) -> Result<(), PluginError> {
        // Still running means no result came: NNI replaces such a trial with a random one.
        if self.running.end(parameter_id) && status != status::SUCCEEDED {
            self.random_owed += 1;
        }
        self.serve_deferred()
    }

    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        let Some((_, encoding)) = &self.model else {
            self.pending_import.extend_from_slice(trials);
            return Ok(());
        };
        // Each trial with its observation, `None` for one without a result; a result outside
        // the (changed) space is left out, with a warning.
        let replayed: Vec<(&ImportedTrial, Option<_>)> = trials
            .iter()
            .filter_map(|trial| {
                if !trial.is_result() {
                    return Some((trial, None));
                }
                let slice = std::slice::from_ref(trial);
                let observation = encode_imported(NAME, encoding, slice, self.mode).pop()?;
                Some((trial, Some(observation)))
            })
            .collect();
        let mut imported = 0;
        for (trial, observation) in replayed {
            // Replays the step that produced this trial: a random one, or a tournament whose
            // loser left the population (the mutation's draws come after, so they do not matter).
            if self.random_owed > 0 {
                self.random_owed -= 1;
            } else {
                let mut rng = step_rng(self.seed, self.steps);
                self.tournament(&mut rng);
            }
            self.steps += 1;
            self.unseen.insert(&trial.parameters);
            match observation {
                Some(o) => {
                    self.population.push(o);
                    imported += 1;
                }
                // As `trial_end` without a result: NNI replaces such a trial with a random one.
                None if trial.has_ended() => self.random_owed += 1,
                // It runs again; its result arrives as any other.
                None => {}
            }
        }
        if !trials.is_empty() {
            log::info(&format!(
                "{NAME}: imported {imported} of {} trials",
                trials.len()
            ));
        }
        Ok(())
    }

    fn take_suggestions(&mut self) -> Result<Vec<Suggestion>, PluginError> {
        Ok(std::mem::take(&mut self.ready))
    }
}
