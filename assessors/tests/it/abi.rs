//! The built plugin library, loaded through the ABI as knob loads it.

use std::path::PathBuf;

use expect_test::expect;
use knob_plugin_api::host::PluginRegistry;
use knob_plugin_api::ComponentKind;
use serde_json::json;

/// The cdylib cargo built beside this test binary (in `target/<profile>/deps`).
pub(crate) fn plugin_file() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("test binary has a folder");
    let name = format!(
        "{}knob_assessors{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let file = deps.join(&name);
    assert!(file.is_file(), "{} was not built", file.display());
    file
}

#[test]
fn the_library_exports_every_rule_and_they_judge_as_through_the_rlib() {
    let registry = PluginRegistry::load_from(&[plugin_file()]);
    assert!(registry.problems().is_empty(), "{:?}", registry.problems());
    assert_eq!(
        registry.names(ComponentKind::Assessor),
        [
            "ASHA",
            "Curvefitting",
            "Medianstop",
            "Patience",
            "Threshold"
        ]
    );

    let mut medianstop = registry
        .assessor_object(
            "Medianstop",
            &json!({"start_step": 2}),
            &knob_plugin_api::AssessorContext::default(),
        )
        .unwrap();
    for step in 1..=3 {
        let history = &[0.5, 0.6, 0.7][..step];
        assert!(medianstop.assess_trial("done", history).unwrap().keep_going);
    }
    medianstop.trial_end("done", "SUCCEEDED").unwrap();
    assert!(medianstop.assess_trial("bad", &[0.1]).unwrap().keep_going);
    let verdict = medianstop.assess_trial("bad", &[0.1, 0.2]).unwrap();
    assert!(!verdict.keep_going);
    expect!["step 2: best 0.2 below median 0.55 of 1 completed trial"].assert_eq(&verdict.reason);

    // The threaded handle the manager uses.
    let threshold = registry
        .assessor(
            "Threshold",
            &json!({"lower": 0.3}),
            &knob_plugin_api::AssessorContext::default(),
        )
        .unwrap();
    let verdict = threshold
        .assess_trial("t".into(), vec![0.5, 0.2])
        .wait()
        .unwrap();
    expect!["step 2: result 0.2 below the lower threshold 0.3"].assert_eq(&verdict.reason);

    let Err(error) = registry.assessor_object(
        "ASHA",
        &json!({"max_t": 100}),
        &knob_plugin_api::AssessorContext::default(),
    ) else {
        panic!("an unknown classArg should fail the constructor");
    };
    expect!["assessor ASHA: constructor failed: classArgs of ASHA: unknown argument `max_t`; known: optimize_mode, reduction_factor, eta, min_resource, max_resource, grace_period"]
        .assert_eq(&error.to_string());
}
