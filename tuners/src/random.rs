//! Random, after NNI's `RandomTuner` with its `Deduplicator` (NNI 3.0).

use knob_plugin_api::space::{seeded_rng, SearchSpace, SeededRng};
use knob_plugin_api::{log, parse_class_args, Generated, ImportedTrial, PluginError, Tuner};
use serde::Deserialize;
use serde_json::Value;

use crate::common::args::{optimize_mode, OptimizeMode};
use crate::common::grid::Grid;
use crate::common::history::History;
use crate::common::seed::{seed, seed_or_entropy, SeedNotice};

/// Fresh draws tried before falling back to the grid walk. A draw repeats an earlier point only
/// in a space with few points, and there the walk finds the remaining ones in order.
const DRAWS_BEFORE_GRID: usize = 32;

/// Random search: each point is [`SearchSpace::sample`] from a seeded PCG64 stream, so a seed
/// replays a run exactly, and `knob space sample --seed S` shows the points `Random` with seed S
/// starts with.
///
/// It never hands out a parameters object twice, nor one imported with `import_data`: a draw
/// that repeats is drawn again, up to [`DRAWS_BEFORE_GRID`] times, and then the next unseen
/// point of NNI's grid walk is taken instead (as NNI's `Deduplicator` does). When that walk is
/// used up too, the space has no unseen point left: [`Generated::NoMore`].
#[derive(Debug)]
pub struct RandomTuner {
    seed: u64,
    seed_notice: SeedNotice,
    rng: SeededRng,
    space: Option<SearchSpace>,
    history: History,
    /// Created the first time draws keep repeating.
    fallback: Option<Grid>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RandomArgs {
    /// The PCG64 seed; drawn from OS entropy (and logged) when absent.
    #[serde(default, deserialize_with = "seed")]
    seed: Option<u64>,
    /// Accepted so a config can switch tuners without editing classArgs; random search ignores it.
    #[serde(default, deserialize_with = "optimize_mode")]
    optimize_mode: Option<OptimizeMode>,
}

impl RandomTuner {
    /// The seed in use, given or drawn: `classArgs: {seed: <it>}` replays this run.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

impl Tuner for RandomTuner {
    /// Random search never looks at results, so it runs a multi-objective experiment as it runs
    /// any other.
    fn takes_objectives() -> bool {
        true
    }

    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args: RandomArgs = parse_class_args("Random", class_args)?;
        if let Some(mode) = args.optimize_mode {
            log::debug(&format!(
                "Random: ignored optimize_mode {mode:?}; random search does not look at results"
            ));
        }
        let (seed, seed_notice) = seed_or_entropy("Random", args.seed);
        Ok(RandomTuner {
            seed,
            seed_notice,
            rng: seeded_rng(seed),
            space: None,
            history: History::default(),
            fallback: None,
        })
    }

    /// Takes the new space; points already handed out or imported stay skipped.
    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        self.space = Some(space.clone());
        self.fallback = None;
        Ok(())
    }

    fn generate_parameters(&mut self, _parameter_id: u64) -> Result<Generated, PluginError> {
        self.seed_notice.log_once();
        let Some(space) = &self.space else {
            return Err(PluginError::new(
                "Random: asked for parameters before it was given a search space",
            ));
        };
        if self.fallback.as_ref().is_some_and(Grid::is_exhausted) {
            return Ok(Generated::NoMore);
        }
        for _ in 0..DRAWS_BEFORE_GRID {
            let params = space.sample(&mut self.rng);
            if self.history.insert(&params) {
                return Ok(Generated::Parameters(params));
            }
        }
        let grid = self.fallback.get_or_insert_with(|| {
            log::info(&format!(
                "Random: {DRAWS_BEFORE_GRID} draws in a row repeated earlier points; taking unseen points from a grid walk"
            ));
            Grid::new(space.clone())
        });
        while let Some(params) = grid.next_point() {
            if self.history.insert(&params) {
                return Ok(Generated::Parameters(params));
            }
        }
        log::info("Random: every point of the search space has been tried");
        Ok(Generated::NoMore)
    }

    fn receive_trial_result(
        &mut self,
        _id: u64,
        _parameters: &Value,
        _value: f64,
    ) -> Result<(), PluginError> {
        Ok(())
    }

    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        for trial in trials {
            self.history.insert(&trial.parameters);
        }
        log::info(&format!(
            "Random: imported {} trials; {} points will be skipped",
            trials.len(),
            self.history.len()
        ));
        Ok(())
    }
}
