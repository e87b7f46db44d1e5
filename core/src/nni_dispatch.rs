//! Which algorithms run through NNI's own dispatcher, and what that plugin is given.
//!
//! NNI runs every Python algorithm by starting `python -m nni` and speaking its tuner command
//! channel; the `NniDispatcher` tuner and `NniDispatcherAssessor` assessor plugins
//! (`nni-dispatcher/`) are that manager side. The core only chooses them, here, from the config:
//! a `className` (the user's own class), an NNI built-in name that knob has no native version of
//! (`SMAC`, `Metis`, `PBTTuner`, ...: `knob_plugin_api::host::NNI_ALGORITHMS`), or any NNI name
//! with `useNniImplementation: true`. A plugin that exports the name itself still wins.

use std::path::Path;

use knob_plugin_api::host::nni_algorithm;
use knob_plugin_api::ComponentKind;
use serde_json::{json, Map, Value};

use crate::config::{AlgorithmConfig, LogLevel};

/// The tuner the dispatcher plugin exports.
pub const DISPATCHER_TUNER: &str = knob_plugin_api::host::NNI_DISPATCHER_TUNER;
/// The assessor the dispatcher plugin exports.
pub const DISPATCHER_ASSESSOR: &str = knob_plugin_api::host::NNI_DISPATCHER_ASSESSOR;

/// The dispatcher plugin's component name for `kind`.
pub fn dispatcher_name(kind: ComponentKind) -> &'static str {
    match kind {
        ComponentKind::Assessor => DISPATCHER_ASSESSOR,
        _ => DISPATCHER_TUNER,
    }
}

/// How a component built as `component` with `class_args` is named in messages: what the
/// dispatcher plugin runs is the user's NNI algorithm ("NNI tuner my_tuner.MyTuner", as the
/// plugin names it in its own errors), not the plugin ("tuner NniDispatcher"). `None`: the
/// component's own name says it.
pub fn label(kind: ComponentKind, component: &str, class_args: &Value) -> Option<String> {
    if component != dispatcher_name(kind) {
        return None;
    }
    let algorithm = &class_args["algorithm"];
    let name = ["name", "className"]
        .iter()
        .find_map(|key| algorithm[*key].as_str())?;
    let role = match kind {
        ComponentKind::Assessor => "assessor",
        _ => "tuner",
    };
    Some(format!("NNI {role} {name}"))
}

/// Whether `algorithm` runs through NNI's dispatcher. `exported(name)`: whether a loaded
/// plugin exports that name as written (it then wins over NNI's).
pub fn through_nni(
    kind: ComponentKind,
    algorithm: &AlgorithmConfig,
    exported: impl Fn(&str) -> bool,
) -> bool {
    if algorithm.class_name.is_some() {
        return true;
    }
    let Some(name) = &algorithm.name else {
        return false;
    };
    let nni = nni_algorithm(kind, name);
    if algorithm.use_nni_implementation {
        return nni.is_some();
    }
    nni.is_some_and(|nni| nni.native.is_none()) && !exported(name)
}

/// Where an experiment runs: its folder, whether this is a resume, and the config's
/// `tunerGpuIndices`.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    pub dir: &'a Path,
    pub resume: bool,
    pub tuner_gpu_indices: Option<&'a [u32]>,
}

/// The dispatcher plugin's class args: the algorithm as NNI's config holds it, and what its
/// launch needs. Without a `run` (a config being checked) nothing will be started.
pub fn class_args(algorithm: &AlgorithmConfig, log_level: LogLevel, run: Option<Run<'_>>) -> Value {
    let mut nni = Map::new();
    if let Some(name) = &algorithm.name {
        nni.insert("name".into(), json!(name));
    }
    if let Some(class_name) = &algorithm.class_name {
        nni.insert("className".into(), json!(class_name));
    }
    if let Some(directory) = &algorithm.code_directory {
        nni.insert("codeDirectory".into(), json!(directory));
    }
    nni.insert(
        "classArgs".into(),
        Value::Object(algorithm.class_args.clone()),
    );
    let level = match log_level {
        LogLevel::Fatal => "fatal",
        LogLevel::Error => "error",
        LogLevel::Warning => "warning",
        LogLevel::Info => "info",
        LogLevel::Debug => "debug",
        LogLevel::Trace => "trace",
    };
    let mut args = json!({
        "algorithm": nni,
        "logLevel": level,
    });
    let map = args.as_object_mut().expect("an object");
    if let Some(python) = &algorithm.python_interpreter {
        map.insert("pythonInterpreter".into(), json!(python));
    }
    if let Some(timeout) = algorithm.dispatcher_connect_timeout {
        map.insert("dispatcherConnectTimeout".into(), json!(timeout));
    }
    if let Some(run) = run {
        map.insert("experimentDir".into(), json!(run.dir));
        map.insert("resume".into(), json!(run.resume));
        // NNI's manager gives its dispatcher `tunerGpuIndices` joined, and '' when unset
        // (`toCudaVisibleDevices`): the tuner and assessor see no GPU unless given one, so a
        // tuner that uses torch does not take the trials' GPUs.
        let devices = run
            .tuner_gpu_indices
            .unwrap_or_default()
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        map.insert("cudaVisibleDevices".into(), json!(devices));
    }
    args
}

/// The component to build for `algorithm` and its class args: the dispatcher plugin with
/// [`class_args`], or the algorithm's own name and classArgs.
pub fn component(
    kind: ComponentKind,
    algorithm: &AlgorithmConfig,
    log_level: LogLevel,
    run: Option<Run<'_>>,
    exported: impl Fn(&str) -> bool,
) -> Option<(String, Value)> {
    if through_nni(kind, algorithm, exported) {
        return Some((
            dispatcher_name(kind).to_owned(),
            class_args(algorithm, log_level, run),
        ));
    }
    algorithm
        .name
        .clone()
        .map(|name| (name, Value::Object(algorithm.class_args.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str) -> AlgorithmConfig {
        AlgorithmConfig {
            name: Some(name.into()),
            class_name: None,
            code_directory: None,
            class_args: Map::new(),
            python_interpreter: None,
            use_nni_implementation: false,
            dispatcher_connect_timeout: None,
        }
    }

    #[test]
    fn nni_runs_what_knob_lacks_and_what_is_asked_of_it() {
        let none = |_: &str| false;
        let tuner = ComponentKind::Tuner;
        assert!(through_nni(tuner, &named("SMAC"), none));
        assert!(through_nni(tuner, &named("PBTTuner"), none));
        assert!(through_nni(tuner, &named("metis"), none));
        assert!(!through_nni(tuner, &named("TPE"), none));
        assert!(!through_nni(tuner, &named("Sweep"), none));
        // A plugin exporting the name wins.
        assert!(!through_nni(tuner, &named("SMAC"), |n| n == "SMAC"));
        let mut nni_tpe = named("TPE");
        nni_tpe.use_nni_implementation = true;
        assert!(through_nni(tuner, &nni_tpe, none));
        // Not an NNI name: nothing of NNI's to use.
        let mut sweep = named("Sweep");
        sweep.use_nni_implementation = true;
        assert!(!through_nni(tuner, &sweep, none));
        let mut custom = named("x");
        custom.name = None;
        custom.class_name = Some("my_tuner.MyTuner".into());
        assert!(through_nni(tuner, &custom, none));
        assert!(through_nni(ComponentKind::Assessor, &custom, none));
        assert!(!through_nni(
            ComponentKind::Assessor,
            &named("Medianstop"),
            none
        ));
    }

    #[test]
    fn the_plugin_gets_the_algorithm_as_nni_writes_it() {
        let mut custom = named("x");
        custom.name = None;
        custom.class_name = Some("my_tuner.MyTuner".into());
        custom.code_directory = Some("/code".into());
        custom
            .class_args
            .insert("optimize_mode".into(), json!("minimize"));
        custom.python_interpreter = Some("/venv/bin/python".into());
        let args = class_args(
            &custom,
            LogLevel::Info,
            Some(Run {
                dir: Path::new("/exp"),
                resume: true,
                tuner_gpu_indices: Some(&[1, 3]),
            }),
        );
        assert_eq!(
            args,
            json!({
                "algorithm": {"className": "my_tuner.MyTuner", "codeDirectory": "/code", "classArgs": {"optimize_mode": "minimize"}},
                "logLevel": "info",
                "pythonInterpreter": "/venv/bin/python",
                "experimentDir": "/exp",
                "resume": true,
                "cudaVisibleDevices": "1,3",
            })
        );
    }
}
