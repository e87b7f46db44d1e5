//! The class args the host gives the dispatcher plugin: the NNI algorithm as the user wrote it
//! and what the launch needs (knob's core builds them, `knob_core::nni_dispatch`).

use std::path::PathBuf;
use std::time::Duration;

use knob_plugin_api::PluginError;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::process::{default_python, probe_python, Launch, Python};

/// Default bound on the dispatcher's connection after its start (`import nni` and the
/// algorithm's own imports: scikit-learn, torch...).
pub const DEFAULT_CONNECT_TIMEOUT_SECS: f64 = 120.0;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DispatcherArgs {
    /// `{name}` or `{className, codeDirectory}`, with `classArgs`: what NNI's config holds.
    pub algorithm: Map<String, Value>,
    #[serde(default)]
    pub python_interpreter: Option<PathBuf>,
    /// The experiment's folder; absent when the config is only checked (nothing is started).
    #[serde(default)]
    pub experiment_dir: Option<PathBuf>,
    #[serde(default)]
    pub resume: bool,
    #[serde(default)]
    pub dispatcher_connect_timeout: Option<f64>,
    #[serde(default)]
    pub log_level: Option<String>,
    /// `NNI_INCLUDE_INTERMEDIATE_RESULTS`. Never set by knob's core, as under nni 3.0 and
    /// 2.10.1: their manager reads `config.deprecated.includeIntermediateResults`, which their
    /// Python config refuses (`ExperimentConfig does not have field(s) deprecated`) and their
    /// v1 converter drops, so their dispatcher always gets `false`.
    #[serde(default)]
    pub include_intermediate_results: bool,
    /// The dispatcher's `CUDA_VISIBLE_DEVICES`: the config's `tunerGpuIndices` joined, `""`
    /// (no GPU) when unset, as NNI's manager sets it; never knob's own.
    #[serde(default)]
    pub cuda_visible_devices: String,
}

/// Which side of NNI's experiment config the algorithm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Tuner,
    Assessor,
}

impl DispatcherArgs {
    pub fn parse(component: &str, class_args: &Value) -> Result<DispatcherArgs, PluginError> {
        let args: DispatcherArgs = knob_plugin_api::parse_class_args(component, class_args)?;
        if let Some(timeout) = args.dispatcher_connect_timeout {
            // `try_from`: `launch` turns it into a Duration, which panics past ~584 billion years.
            if !(timeout > 0.0 && Duration::try_from_secs_f64(timeout).is_ok()) {
                return Err(PluginError::new(format!(
                    "dispatcherConnectTimeout must be a positive number of seconds, not {timeout}"
                )));
            }
        }
        Ok(args)
    }

    /// "tuner SMAC", "assessor my_assessor.MyAssessor".
    pub fn describe(&self, role: Role) -> String {
        let name = ["name", "className"]
            .iter()
            .find_map(|key| self.algorithm.get(*key).and_then(Value::as_str))
            .unwrap_or("(unnamed)");
        match role {
            Role::Tuner => format!("NNI tuner {name}"),
            Role::Assessor => format!("NNI assessor {name}"),
        }
    }

    pub fn python(&self, role: Role) -> Result<Python, PluginError> {
        let program = self
            .python_interpreter
            .clone()
            .unwrap_or_else(default_python);
        probe_python(&program, &self.describe(role))
    }

    /// The launch of this algorithm's dispatcher, `None` when there is no experiment folder.
    pub fn launch(&self, role: Role, python: Python) -> Option<Launch> {
        let dir = self.experiment_dir.as_ref()?;
        let algorithm = Value::Object(self.algorithm.clone());
        // NNI's dispatcher always builds a tuner; an assessor's own dispatcher gets NNI's Random,
        // which it never asks for parameters.
        let (exp_params, log_dir, checkpoint_dir) = match role {
            Role::Tuner => (
                json!({"tuner": algorithm}),
                dir.join("log"),
                dir.join("checkpoint"),
            ),
            Role::Assessor => (
                json!({"tuner": {"name": "Random"}, "assessor": algorithm}),
                dir.join("log").join("assessor"),
                dir.join("checkpoint").join("assessor"),
            ),
        };
        Some(Launch {
            what: self.describe(role),
            python,
            exp_params,
            log_dir,
            checkpoint_dir,
            resume: self.resume,
            log_level: self.log_level.clone().unwrap_or_else(|| "info".into()),
            include_intermediate_results: self.include_intermediate_results,
            cuda_visible_devices: self.cuda_visible_devices.clone(),
            connect_timeout: Duration::from_secs_f64(
                self.dispatcher_connect_timeout
                    .unwrap_or(DEFAULT_CONNECT_TIMEOUT_SECS),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_timeout_is_a_positive_number_of_seconds_a_duration_holds() {
        let args = |timeout: Value| {
            DispatcherArgs::parse(
                "NniDispatcher",
                &json!({"algorithm": {"name": "SMAC"}, "dispatcherConnectTimeout": timeout}),
            )
        };
        assert!(args(json!(30)).is_ok());
        for bad in [json!(0), json!(-1), json!(1e300)] {
            let error = args(bad.clone()).unwrap_err().to_string();
            assert!(
                error.contains("dispatcherConnectTimeout must be a positive number of seconds"),
                "{bad}: {error}"
            );
        }
    }
}
