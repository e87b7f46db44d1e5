//! GridSearch, after NNI's `GridSearchTuner` (NNI 3.0): every combination of choices and integers,
//! continuous ranges refined in rounds; see `common::grid` for the walk itself.

use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{log, parse_class_args, Generated, ImportedTrial, PluginError, Tuner};
use serde::Deserialize;
use serde_json::Value;

use crate::common::args::{optimize_mode, OptimizeMode};
use crate::common::grid::Grid;
use crate::common::history::History;

/// Grid search. Deterministic: it takes no seed. Never hands out a parameters object twice, nor
/// one imported with `import_data`; answers [`Generated::NoMore`] once a grid of choices,
/// integers and q-types is used up.
#[derive(Debug)]
pub struct GridSearchTuner {
    grid: Option<Grid>,
    history: History,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GridSearchArgs {
    /// Accepted so a config can switch tuners without editing classArgs; grid search ignores it.
    #[serde(default, deserialize_with = "optimize_mode")]
    optimize_mode: Option<OptimizeMode>,
}

impl Tuner for GridSearchTuner {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args: GridSearchArgs = parse_class_args("GridSearch", class_args)?;
        if let Some(mode) = args.optimize_mode {
            log::debug(&format!(
                "GridSearch: ignored optimize_mode {mode:?}; grid search does not look at results"
            ));
        }
        Ok(GridSearchTuner {
            grid: None,
            history: History::default(),
        })
    }

    /// Starts the walk over from round 1; points already handed out or imported stay skipped.
    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        if space.is_empty() {
            return Err(PluginError::new(
                "GridSearch: the search space is empty; give it at least one parameter to search over",
            ));
        }
        self.grid = Some(Grid::new(space.clone()));
        Ok(())
    }

    fn generate_parameters(&mut self, _parameter_id: u64) -> Result<Generated, PluginError> {
        let grid = self.grid.as_mut().ok_or_else(|| {
            PluginError::new("GridSearch: asked for parameters before it was given a search space")
        })?;
        while let Some(params) = grid.next_point() {
            if self.history.insert(&params) {
                return Ok(Generated::Parameters(params));
            }
        }
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
            "GridSearch: imported {} trials; {} points will be skipped",
            trials.len(),
            self.history.len()
        ));
        Ok(())
    }
}
