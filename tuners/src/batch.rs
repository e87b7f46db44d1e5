//! Batch, NNI's `BatchTuner`: the search space is one `choice` (NNI names it `combine_params`)
//! whose values are complete parameters objects; they are handed out in order, each once, then
//! [`Generated::NoMore`]. Results are not looked at.
//!
//! Unlike NNI, a parameters object listed twice is handed out once (every tuner hands out
//! distinct points), and one imported on resume is skipped wherever it is in the list (NNI drops
//! imported ones only from what is left to hand out).

use knob_plugin_api::space::{ParamType, SearchSpace};
use knob_plugin_api::{log, parse_class_args, Generated, ImportedTrial, PluginError, Tuner};
use serde::Deserialize;
use serde_json::Value;

use crate::common::args::{optimize_mode, OptimizeMode};
use crate::common::history::History;

const NAME: &str = "Batch";

#[derive(Debug, Default)]
pub struct BatchTuner {
    sets: Vec<Value>,
    next: usize,
    seen: History,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchArgs {
    /// Accepted so a config can switch tuners without editing classArgs; Batch ignores it.
    #[serde(default, deserialize_with = "optimize_mode", rename = "optimize_mode")]
    _optimize_mode: Option<OptimizeMode>,
}

impl Tuner for BatchTuner {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let _: BatchArgs = parse_class_args(NAME, class_args)?;
        Ok(BatchTuner::default())
    }

    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        let usage = "Batch's search space is one choice whose values are parameters objects, e.g. {\"combine_params\": {\"_type\": \"choice\", \"_value\": [{\"lr\": 0.1}, {\"lr\": 0.01}]}}";
        let [param] = space.parameters() else {
            return Err(PluginError::new(format!(
                "{NAME}: the search space has {} parameters; {usage}",
                space.len()
            )));
        };
        let values = match param.param_type() {
            ParamType::Choice { values } => values,
            ParamType::NestedChoice { .. } => {
                return Err(PluginError::new(format!(
                    "{NAME}: {} lists objects with \"_name\", which make a nested choice, not parameter sets; {usage}",
                    param.path()
                )))
            }
            other => {
                return Err(PluginError::new(format!(
                    "{NAME}: {} is {}, not a choice; {usage}",
                    param.path(),
                    other.type_name()
                )))
            }
        };
        if let Some((i, bad)) = values.iter().enumerate().find(|(_, v)| !v.is_object()) {
            return Err(PluginError::new(format!(
                "{NAME}: value {i} of {} is {bad}, not a parameters object; {usage}",
                param.path()
            )));
        }
        self.sets = values.clone();
        self.next = 0;
        Ok(())
    }

    fn generate_parameters(&mut self, _parameter_id: u64) -> Result<Generated, PluginError> {
        while let Some(set) = self.sets.get(self.next) {
            self.next += 1;
            if self.seen.insert(set) {
                return Ok(Generated::Parameters(set.clone()));
            }
            log::info(&format!(
                "{NAME}: skipped parameter set {} ({set}): handed out or imported before",
                self.next - 1
            ));
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
            self.seen.insert(&trial.parameters);
        }
        Ok(())
    }
}
