//! NNI's algorithm names (issue 20 item 15): every `builtinName` and `alias` of NNI 3.0's
//! `builtin_algorithms.yml` for an algorithm knob has natively reaches knob's plugin.
//!
//! `knob_plugin_api::host::NNI_ALGORITHMS` is knob's copy of that file. The real file is read
//! from the installed nni 3.0 when `KNOB_TEST_NNI3_PYTHON` names its python (as in `nni.rs`);
//! without it that test skips visibly, and fails under `KNOB_TEST_REQUIRE_ALL=1`.

use std::path::PathBuf;
use std::process::Command;

use knob_plugin_api::host::{PluginRegistry, NNI_ALGORITHMS};
use knob_plugin_api::ComponentKind;
use serde_json::{json, Value};

use crate::bin_dir;
use crate::create::Sandbox;
use crate::prerequisite;

fn built_in_registry() -> PluginRegistry {
    for library in ["knob_tuners", "knob_assessors"] {
        let path = bin_dir().join(format!("lib{library}.so"));
        assert!(
            path.exists(),
            "{} is missing: run `cargo build --workspace` before the tests",
            path.display()
        );
    }
    PluginRegistry::load_from(&[bin_dir()])
}

/// Every spelling a user may write for `name`: as NNI writes it, lower and upper case.
fn spellings(name: &str) -> [String; 3] {
    [name.to_owned(), name.to_lowercase(), name.to_uppercase()]
}

#[test]
fn every_nni_name_and_alias_of_a_native_algorithm_constructs_knob_s_plugin() {
    let registry = built_in_registry();
    let mut checked = Vec::new();
    for algorithm in NNI_ALGORITHMS.iter() {
        let Some(native) = algorithm.native else {
            continue;
        };
        for written in std::iter::once(algorithm.name).chain(algorithm.alias) {
            for spelling in spellings(written) {
                let (_, exact) = registry
                    .find(algorithm.kind, &spelling)
                    .unwrap_or_else(|e| panic!("{spelling}: {e}"));
                assert_eq!(exact, native, "{spelling}");
                // NNI requires it too: the epoch whose result Curvefitting predicts.
                let class_args = match native {
                    "Curvefitting" => json!({"epoch_num": 10}),
                    _ => json!({}),
                };
                let constructed = match algorithm.kind {
                    ComponentKind::Tuner => registry
                        .tuner_object(&spelling, &class_args)
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    _ => registry
                        .assessor_object(
                            &spelling,
                            &class_args,
                            &knob_plugin_api::AssessorContext::default(),
                        )
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                };
                assert_eq!(constructed, Ok(()), "{spelling}");
            }
            checked.push(written);
        }
    }
    // The two names issue 20 found refused, among the rest.
    assert!(checked.contains(&"BatchTuner") && checked.contains(&"GP"));
    assert_eq!(checked.len(), 13, "{checked:?}");
}

#[test]
fn an_nni_algorithm_knob_does_not_have_says_so() {
    let registry = built_in_registry();
    let error = registry
        .find(ComponentKind::Tuner, "SMAC")
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.starts_with(
            "unknown tuner SMAC (an NNI 3.0 algorithm that knob does not have natively; \
             knob's core runs it through NNI's own dispatcher, the NniDispatcher plugin); available: "
        ),
        "{error}"
    );
    // A name NNI does not know gets no such note.
    let error = registry
        .find(ComponentKind::Tuner, "Bayesian")
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.starts_with("unknown tuner Bayesian; available: "),
        "{error}"
    );
}

/// `tuner: {name: BatchTuner}` and `GP`, as NNI's examples write them, run end to end.
#[test]
fn nni_example_tuner_names_run_an_experiment() {
    for (id, tuner) in [("batch", "BatchTuner"), ("gp", "GP")] {
        let sandbox = Sandbox::new();
        let yaml = format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 2\n\
             searchSpace:\n  combo: {{_type: choice, _value: [{{x: 1}}, {{x: 2}}]}}\n\
             tuner:\n  name: {tuner}\ntrainingService:\n  platform: local"
        );
        let config = sandbox.config(&yaml, &[]);
        let (code, stdout, stderr) = sandbox.create(&config, id);
        assert_eq!(code, 0, "{tuner}: {stdout}\n{stderr}");
        let export = sandbox.export(id);
        assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
        let trials = export["trials"].as_array().unwrap();
        assert_eq!(trials.len(), 2, "{tuner}: {export:#}");
        assert!(
            trials.iter().all(|trial| trial["status"] == "SUCCEEDED"),
            "{tuner}: {export:#}"
        );
    }
}

/// The table is the installed nni 3.0's own `builtin_algorithms.yml`: same sections, names and
/// aliases, in the same order.
#[test]
fn the_table_matches_the_installed_nni_3_0_file() {
    let Some(python) = nni3_python() else {
        return;
    };
    // PyYAML comes with nni; get_builtin_config_file is how nni itself finds the file.
    let script = "import json, yaml\n\
                  from nni.runtime.config import get_builtin_config_file\n\
                  path = get_builtin_config_file('builtin_algorithms.yml')\n\
                  print(json.dumps({'path': str(path), 'algorithms': yaml.safe_load(open(path))}))";
    let read = printed_json(&python, script);
    let mut real = Vec::new();
    for (section, kind) in [
        ("assessors", ComponentKind::Assessor),
        ("tuners", ComponentKind::Tuner),
    ] {
        for entry in read["algorithms"][section].as_array().unwrap() {
            real.push((
                kind,
                entry["builtinName"].as_str().unwrap().to_owned(),
                entry["alias"].as_str().map(str::to_owned),
            ));
        }
    }
    let ours: Vec<_> = NNI_ALGORITHMS
        .iter()
        .map(|a| (a.kind, a.name.to_owned(), a.alias.map(str::to_owned)))
        .collect();
    assert_eq!(ours, real, "knob's table differs from {}", read["path"]);
}

/// What `script`, run by the nni 3.0 python, prints: one JSON value.
fn printed_json(python: &std::path::Path, script: &str) -> Value {
    let output = Command::new(python)
        .args(["-c", script])
        .env_remove("NNI_PLATFORM")
        .output()
        .expect("cannot run the nni 3.0 python");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn nni3_python() -> Option<PathBuf> {
    prerequisite::NNI3_PYTHON.path()
}

/// `minimizes_by_default` is what the installed nni 3.0's classes default to: each tuner class
/// the file names is imported and its `optimize_mode` default read, or, where its module needs
/// a package nni does not bring (hyperopt for Anneal, ConfigSpace for BOHB), read from the
/// module's source (a class found in neither way is left out; the ones knob has natively must
/// all be read).
#[test]
fn the_default_directions_match_the_installed_nni_3_0_classes() {
    let Some(python) = nni3_python() else {
        return;
    };
    let script = r#"
import ast, glob, importlib, importlib.util, inspect, json, yaml
from nni.runtime.config import get_builtin_config_file

def from_source(module, name):
    # The default as written in the class's __init__, without importing the module (or, for a
    # package such as bohb_advisor, any of its files).
    spec = importlib.util.find_spec(module)
    files = [spec.origin] + sorted(glob.glob(f"{spec.submodule_search_locations[0]}/*.py") if spec.submodule_search_locations else [])
    trees = [ast.parse(open(file).read()) for file in files]
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == '__init__':
                    args = item.args.args[len(item.args.args) - len(item.args.defaults):]
                    for arg, default in zip(args, item.args.defaults):
                        if arg.arg == 'optimize_mode':
                            return ast.unparse(default)
                    return None
    raise LookupError(name)

path = get_builtin_config_file('builtin_algorithms.yml')
defaults = {}
for entry in yaml.safe_load(open(path))['tuners']:
    module, _, name = entry['className'].rpartition('.')
    try:
        cls = getattr(importlib.import_module(module), name)
        parameter = inspect.signature(cls.__init__).parameters.get('optimize_mode')
        default = None if parameter is None or parameter.default is inspect.Parameter.empty else str(parameter.default)
    except Exception:
        try:
            default = from_source(module, name)
        except Exception:
            continue
    defaults[entry['builtinName']] = default
print(json.dumps(defaults))
"#;
    let defaults = printed_json(&python, script);
    let defaults = defaults.as_object().unwrap();
    for algorithm in NNI_ALGORITHMS
        .iter()
        .filter(|a| a.kind == ComponentKind::Tuner)
    {
        let Some(default) = defaults.get(algorithm.name) else {
            assert!(
                algorithm.native.is_none(),
                "{}: knob runs it natively, so nni's class must be read: {defaults:?}",
                algorithm.name
            );
            continue;
        };
        assert_eq!(
            algorithm.minimizes_by_default,
            default
                .as_str()
                .is_some_and(|mode| mode.to_lowercase().contains("minimize")),
            "{}: nni's class defaults optimize_mode to {default}",
            algorithm.name
        );
    }
}
