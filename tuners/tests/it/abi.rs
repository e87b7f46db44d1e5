//! The built plugin library, loaded through the ABI as knob loads it.

use std::path::PathBuf;

use expect_test::expect;
use knob_plugin_api::host::PluginRegistry;
use knob_plugin_api::{ComponentKind, Generated};
use knob_tuners::GridSearchTuner;
use serde_json::{json, Value};

use crate::{generate, tuner};

/// The cdylib cargo built beside this test binary (in `target/<profile>/deps`).
pub(crate) fn plugin_file() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("test binary has a folder");
    let name = format!(
        "{}knob_tuners{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let file = deps.join(&name);
    assert!(file.is_file(), "{} was not built", file.display());
    file
}

const SPACE: &str = r#"{"a": {"_type": "choice", "_value": [1, 2]},
                        "b": {"_type": "quniform", "_value": [0, 10, 5]}}"#;

#[test]
fn the_library_exports_both_tuners_and_they_behave_as_through_the_rlib() {
    let registry = PluginRegistry::load_from(&[plugin_file()]);
    assert!(registry.problems().is_empty(), "{:?}", registry.problems());
    // Other tuners join the library over time; these must be there.
    let names = registry.names(ComponentKind::Tuner);
    for name in [
        "Anneal",
        "Batch",
        "Evolution",
        "GridSearch",
        "Random",
        "TPE",
    ] {
        assert!(
            names.iter().any(|n| n == name),
            "{name} missing from {names:?}"
        );
    }

    // Multi-objective experiments: NSGA2, TPE and Random take vector objectives, the others a
    // scalar.
    for (name, takes) in [
        ("NSGA2", true),
        ("Random", true),
        ("TPE", true),
        ("GridSearch", false),
        ("Anneal", false),
    ] {
        let tuner = registry.tuner_object(name, &Value::Null).unwrap();
        assert_eq!(tuner.takes_objectives(), takes, "{name}");
    }

    let mut through_abi = registry.tuner_object("GridSearch", &Value::Null).unwrap();
    through_abi
        .update_search_space(&serde_json::from_str(SPACE).unwrap())
        .unwrap();
    let mut abi_points = Vec::new();
    loop {
        match through_abi
            .generate_parameters(abi_points.len() as u64)
            .unwrap()
        {
            Generated::Parameters(p) => abi_points.push(p),
            Generated::NoMore => break,
            Generated::Deferred | Generated::Labeled { .. } | Generated::Member { .. } => {
                panic!("GridSearch neither defers nor labels")
            }
        }
    }
    let (rlib_points, _) = generate(&mut tuner::<GridSearchTuner>("{}", SPACE), 100);
    assert_eq!(abi_points, rlib_points);
    assert_eq!(abi_points.len(), 6);

    let mut random = registry
        .tuner_object("Random", &json!({"seed": 1}))
        .unwrap();
    random
        .update_search_space(&serde_json::from_str(SPACE).unwrap())
        .unwrap();
    assert!(matches!(
        random.generate_parameters(0).unwrap(),
        Generated::Parameters(_)
    ));

    let Err(error) = registry.tuner_object("Random", &json!({"sed": 1})) else {
        panic!("an unknown classArg should fail the constructor");
    };
    expect!["tuner Random: constructor failed: classArgs of Random: unknown field `sed`, expected `seed` or `optimize_mode`"].assert_eq(&error.to_string());
}
