//! BOHB (Falkner et al. 2018), NNI 3.0's `BOHB` advisor (`bohb_advisor/`), in Rust: Hyperband's
//! brackets with configurations proposed by a TPE-like model (`kde.rs`) instead of random ones.
//!
//! classArgs as NNI's: `optimize_mode` (default `maximize`), `min_budget` (1), `max_budget` (3),
//! `eta` (3), `min_points_in_model` (default and least: dimensions + 1), `top_n_percent` (15),
//! `num_samples` (64), `random_fraction` (1/3), `bandwidth_factor` (3), `min_bandwidth`
//! (0.001). NNI's `config_space` (a ConfigSpace `.pcs` file) is refused: give the search space
//! in the experiment config. knob adds `seed`.
//!
//! As NNI's, brackets run one at a time (a new one opens once every trial of the current
//! bracket's last round has ended; until then requests are deferred), trial ids are
//! `"{s}_{round}_{k}"` and `TRIAL_BUDGET` carries the budget. A result enters the model at the
//! trial's own budget (NNI passes the metric's sequence number instead, which is not a budget).

mod kde;

use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{log, Generated, ImportedTrial, PluginError, Suggestion, Tuner};
use rand::Rng;
use serde_json::Value;

use crate::common::args::ClassArgs;
use crate::common::seed::{seed_or_entropy, step_rng, SeedNotice};
use crate::common::unit_cube::UnitCube;
use crate::hyperband::brackets::{Brackets, Draw, LabelStyle, Opening, Outcome, BUDGET_KEY};
use crate::hyperband::schedule::Schedule;
use kde::{KdeModels, KdeSettings};

const NAME: &str = "BOHB";
const MAX_BUDGET: u64 = 1_000_000_000;

#[derive(Debug)]
pub struct BohbTuner {
    brackets: Brackets,
    proposer: Proposer,
    /// A drawn seed's log line, said once the tuner is asked for parameters.
    seed_notice: SeedNotice,
}

#[derive(Debug)]
struct Proposer {
    seed: u64,
    settings: KdeSettings,
    /// `min_points_in_model` as given (the least is set per space).
    min_points_given: Option<usize>,
    cube: Option<UnitCube>,
    models: KdeModels,
    /// Results seen, to refit when the space changes.
    outcomes: Vec<Outcome>,
    /// Results folded into the model so far: draws for the model's randomness.
    observed: u64,
}

impl Proposer {
    fn observe(&mut self, outcome: Outcome) {
        self.outcomes.push(outcome.clone());
        let Some(cube) = &self.cube else { return };
        match cube.encode(&outcome.parameters) {
            Ok(point) => {
                // Its own stream, apart from the proposals' (`u64::MAX - n` is never a `k`).
                let mut rng = step_rng(self.seed, u64::MAX - self.observed);
                self.observed += 1;
                self.models.observe(
                    cube,
                    &self.settings,
                    point,
                    outcome.budget,
                    outcome.loss,
                    &mut rng,
                );
            }
            Err(e) => log::warn(&format!(
                "{NAME}: a result left out of the model, its parameters are not in the search space: {e}"
            )),
        }
    }

    fn set_space(&mut self, space: &SearchSpace) {
        let cube = UnitCube::new(space);
        let least = cube.len() + 1;
        self.settings.min_points = match self.min_points_given {
            Some(given) if given < least => {
                log::warn(&format!(
                    "{NAME}: min_points_in_model {given} is below dimensions + 1; using {least}"
                ));
                least
            }
            Some(given) => given,
            None => least,
        };
        self.cube = Some(cube);
        self.models = KdeModels::default();
        self.observed = 0;
        for outcome in std::mem::take(&mut self.outcomes) {
            self.observe(outcome);
        }
    }
}

impl Draw for Proposer {
    fn draw(&mut self, k: u64, _budget: u64) -> Result<Value, PluginError> {
        let cube = self.cube.as_ref().ok_or_else(|| {
            PluginError::new(format!(
                "{NAME}: asked for parameters before it was given a search space"
            ))
        })?;
        let mut rng = step_rng(self.seed, k);
        let random = !self.models.has_model() || rng.gen::<f64>() < self.settings.random_fraction;
        let point = if random {
            None
        } else {
            self.models.propose(cube, &self.settings, &mut rng)
        }
        .unwrap_or_else(|| cube.sample(&mut rng));
        Ok(cube.decode(&point)?)
    }
}

impl BohbTuner {
    /// The seed in use, given or drawn.
    pub fn seed(&self) -> u64 {
        self.proposer.seed
    }

    /// `(configurations, budget)` of each round of each bracket, `s_max` first.
    pub fn schedule_table(&self) -> Vec<Vec<(u64, u64)>> {
        crate::hyperband::schedule_table(self.brackets.schedule())
    }
}

impl Tuner for BohbTuner {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args = ClassArgs::new(
            NAME,
            class_args,
            &[
                "optimize_mode",
                "min_budget",
                "max_budget",
                "eta",
                "min_points_in_model",
                "top_n_percent",
                "num_samples",
                "random_fraction",
                "bandwidth_factor",
                "min_bandwidth",
                "config_space",
                "seed",
            ],
        )?;
        if args.has("config_space") {
            return Err(PluginError::new(format!(
                "classArgs of {NAME}: config_space (a ConfigSpace .pcs file) is not supported; give the search space in the experiment config (searchSpace or searchSpaceFile)"
            )));
        }
        let mode = args.optimize_mode_or_maximize()?;
        let min_budget = args.integer("min_budget", 1, 1, MAX_BUDGET)?;
        let max_budget = args.integer("max_budget", 3, 1, MAX_BUDGET)?;
        if max_budget < min_budget {
            return Err(PluginError::new(format!(
                "classArgs of {NAME}: max_budget ({max_budget}) must be at least min_budget ({min_budget})"
            )));
        }
        let eta = args.integer("eta", 3, 2, 1_000_000)?;
        let min_points_given = args
            .has("min_points_in_model")
            .then(|| args.integer("min_points_in_model", 1, 1, 1_000_000))
            .transpose()?
            .map(|n| n as usize);
        let settings = KdeSettings {
            min_points: 1,
            top_n_percent: args.integer("top_n_percent", 15, 1, 99)? as usize,
            num_samples: args.integer("num_samples", 64, 1, 100_000)? as usize,
            random_fraction: args.number(
                "random_fraction",
                1.0 / 3.0,
                "a number from 0 to 1",
                |x| (0.0..=1.0).contains(&x),
            )?,
            bandwidth_factor: args
                .number("bandwidth_factor", 3.0, "a number above 0", |x| x > 0.0)?,
            min_bandwidth: args.number("min_bandwidth", 1e-3, "a number above 0", |x| x > 0.0)?,
        };
        let (seed, seed_notice) = seed_or_entropy(NAME, args.seed()?);
        Ok(BohbTuner {
            brackets: Brackets::new(
                Schedule::bohb(min_budget, max_budget, eta),
                LabelStyle::Bohb,
                Opening::AfterLastRoundEnded,
                mode,
            ),
            proposer: Proposer {
                seed,
                settings,
                min_points_given,
                cube: None,
                models: KdeModels::default(),
                outcomes: Vec::new(),
                observed: 0,
            },
            seed_notice,
        })
    }

    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        if space.get(BUDGET_KEY).is_some() {
            return Err(PluginError::new(format!(
                "{NAME}: the search space has a parameter named {BUDGET_KEY}, which BOHB sets to each trial's budget; rename it"
            )));
        }
        self.proposer.set_space(space);
        self.brackets.set_space(space);
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        self.seed_notice.log_once();
        self.brackets.generate(parameter_id, &mut self.proposer)
    }

    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        _parameters: &Value,
        value: f64,
    ) -> Result<(), PluginError> {
        if let Some(outcome) = self.brackets.result(parameter_id, value) {
            self.proposer.observe(outcome);
        }
        Ok(())
    }

    fn trial_end(&mut self, parameter_id: u64, _status: &str) -> Result<(), PluginError> {
        self.brackets.end(parameter_id, &mut self.proposer)
    }

    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        for outcome in self.brackets.import(trials) {
            self.proposer.observe(outcome);
        }
        Ok(())
    }

    fn take_suggestions(&mut self) -> Result<Vec<Suggestion>, PluginError> {
        Ok(self.brackets.take_ready())
    }
}
