//! Hyperband (Li et al. 2017), NNI 3.0's `Hyperband` advisor (`hyperband_advisor.py`).
//!
//! classArgs as NNI's: `optimize_mode` (default `maximize`), `R` (default 60: the largest
//! budget), `eta` (default 3), `exec_mode` (`parallelism`, the default: a new bracket opens
//! whenever nothing is queued; `serial`: only once the current bracket has queued its last
//! round). knob adds `seed`.
//!
//! Brackets, rounds and budgets follow `schedule.rs`; promotion, labels and deferral
//! `brackets.rs`. Configurations are random draws from the search space, as NNI's; each trial's
//! parameters carry its budget as `TRIAL_BUDGET` (a whole number: train that many epochs, say)
//! and its NNI id, `"{cycle}-{s}_{round}_{k}"`, reaches the trial as its `parameter_id`. A
//! round ranks trials by their final result, as NNI's does (it takes a trial's intermediate
//! results only when no final one arrives; knob's tuners see final results only).
//!
//! Like NNI's, it never runs out: brackets cycle until `maxTrialNumber` or
//! `maxExperimentDuration` ends the experiment. Unlike NNI's, a run resumed with `knob resume`
//! continues its brackets (NNI ignores trials of an earlier run): see `Brackets::import`.

pub(crate) mod brackets;
pub(crate) mod schedule;

use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{Generated, ImportedTrial, PluginError, Suggestion, Tuner};
use serde_json::Value;

use crate::common::args::ClassArgs;
use crate::common::seed::{seed_or_entropy, step_rng, SeedNotice};
use brackets::{Brackets, Draw, LabelStyle, Opening};
use schedule::Schedule;

const NAME: &str = "Hyperband";
/// Larger budgets make brackets of a billion configurations; nobody trains that.
const MAX_R: u64 = 1_000_000_000;
const MAX_ETA: u64 = 1_000_000;

#[derive(Debug)]
pub struct HyperbandTuner {
    brackets: Brackets,
    draw: RandomDraw,
    /// A drawn seed's log line, said once the tuner is asked for parameters.
    seed_notice: SeedNotice,
}

/// Configuration `k` is a draw from the space with the random stream `step_rng(seed, k)`.
#[derive(Debug)]
struct RandomDraw {
    seed: u64,
    space: Option<SearchSpace>,
}

impl Draw for RandomDraw {
    fn draw(&mut self, k: u64, _budget: u64) -> Result<Value, PluginError> {
        let space = self.space.as_ref().ok_or_else(|| {
            PluginError::new(format!(
                "{NAME}: asked for parameters before it was given a search space"
            ))
        })?;
        Ok(space.sample(&mut step_rng(self.seed, k)))
    }
}

impl HyperbandTuner {
    /// The seed in use, given or drawn.
    pub fn seed(&self) -> u64 {
        self.draw.seed
    }

    /// `(configurations, budget)` of each round of each bracket, `s_max` first: NNI's table.
    pub fn schedule_table(&self) -> Vec<Vec<(u64, u64)>> {
        schedule_table(self.brackets.schedule())
    }
}

pub(crate) fn schedule_table(schedule: &Schedule) -> Vec<Vec<(u64, u64)>> {
    (0..=schedule.s_max())
        .rev()
        .map(|s| (0..=s).map(|i| schedule.round(s, i)).collect())
        .collect()
}

impl Tuner for HyperbandTuner {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args = ClassArgs::new(
            NAME,
            class_args,
            &["optimize_mode", "R", "eta", "exec_mode", "seed"],
        )?;
        let mode = args.optimize_mode_or_maximize()?;
        let r = args.integer("R", 60, 1, MAX_R)?;
        let eta = args.integer("eta", 3, 2, MAX_ETA)?;
        let opening = match args.choice("exec_mode", &["parallelism", "serial"])? {
            "serial" => Opening::AfterLastRoundQueued,
            _ => Opening::Always,
        };
        let (seed, seed_notice) = seed_or_entropy(NAME, args.seed()?);
        Ok(HyperbandTuner {
            brackets: Brackets::new(
                Schedule::hyperband(r, eta),
                LabelStyle::Hyperband,
                opening,
                mode,
            ),
            draw: RandomDraw { seed, space: None },
            seed_notice,
        })
    }

    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        if space.get(brackets::BUDGET_KEY).is_some() {
            return Err(PluginError::new(format!(
                "{NAME}: the search space has a parameter named {}, which Hyperband sets to each trial's budget; rename it",
                brackets::BUDGET_KEY
            )));
        }
        self.draw.space = Some(space.clone());
        self.brackets.set_space(space);
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        self.seed_notice.log_once();
        self.brackets.generate(parameter_id, &mut self.draw)
    }

    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        _parameters: &Value,
        value: f64,
    ) -> Result<(), PluginError> {
        self.brackets.result(parameter_id, value);
        Ok(())
    }

    fn trial_end(&mut self, parameter_id: u64, _status: &str) -> Result<(), PluginError> {
        self.brackets.end(parameter_id, &mut self.draw)
    }

    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        self.brackets.import(trials);
        Ok(())
    }

    fn take_suggestions(&mut self) -> Result<Vec<Suggestion>, PluginError> {
        Ok(self.brackets.take_ready())
    }
}
