//! The service loaded the way knob loads it: the cdylib, through the plugin ABI.

use std::path::PathBuf;
use std::process::Command;

use knob_plugin_api::host::PluginRegistry;
use knob_plugin_api::service::{MetricKind, ServiceEvent};
use knob_plugin_api::ComponentKind;
use serde_json::json;

use crate::support::*;

/// `libknob_training_services.so` beside the test binary's target directory, built if missing.
fn plugin_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/it-<hash> -> target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .to_path_buf();
    let library = profile_dir.join(format!(
        "{}knob_training_services{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    if !library.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "knob-training-services"])
            .status()
            .unwrap();
        assert!(status.success(), "building the plugin library failed");
    }
    assert!(library.exists(), "{} not built", library.display());
    library
}

#[test]
fn local_service_runs_a_trial_through_the_plugin_abi() {
    let registry = PluginRegistry::load_from(&[plugin_library()]);
    assert!(registry.problems().is_empty(), "{:?}", registry.problems());
    assert_eq!(
        registry.names(ComponentKind::TrainingService),
        ["local", "remote", "slurm"]
    );

    let events = Events::default();
    let sink = events.clone();
    let dir = tempfile::tempdir().unwrap();
    // A lease ledger of its own: the default is the user's, under $HOME.
    let ledger = dir.path().join("ledger");
    let service = registry
        .training_service(
            "local",
            &json!({"platform": "local", "gracePeriodSecs": 1, "ledgerDir": ledger}),
            move |event| sink.push(event.expect("a readable event")),
        )
        .unwrap();
    let environments = service.environments().wait().unwrap();
    assert_eq!(environments.len(), 1);
    assert_eq!(
        (environments[0].id.as_str(), environments[0].ready),
        ("local", true)
    );

    let code_dir = dir.path().join("code");
    std::fs::create_dir(&code_dir).unwrap();
    let command = r#"echo "KNOB_INTERMEDIATE $(cat "$KNOB_PARAMETERS_FILE" | tr -d ' ')"; echo KNOB_FINAL 0.5; echo bye >&2; exit 1"#;
    let mut request = request(&code_dir, &dir.path().join("t1"), "t1", command);
    request.parameters = json!({"default": 2});
    service.start_trial(request).wait().unwrap();
    let trial = events.wait_ended("t1");
    assert!(matches!(trial[0], ServiceEvent::TrialStarted { .. }));
    assert_eq!(
        metrics(&trial),
        [
            (MetricKind::Intermediate, 0, r#"{"default":2}"#.into()),
            (MetricKind::Final, 0, "0.5".into()),
        ]
    );
    assert_eq!(ending(&trial), (Some(1), None, None, "bye".into()));

    // Errors cross the ABI as one line.
    let mut bad = crate::support::request(
        &dir.path().join("nope"),
        &dir.path().join("t2"),
        "t2",
        "true",
    );
    bad.trial_id = "t2".into();
    let err = service.start_trial(bad).wait().unwrap_err().to_string();
    assert!(
        err.ends_with("does not exist or is not a directory"),
        "{err}"
    );
    let err = registry
        .training_service("local", &json!({"gracePeriodSecs": -1}), |_| {})
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        err,
        "training service local: constructor failed: classArgs of training service local: gracePeriodSecs must be a number of seconds from 0 to 3600, got -1"
    );

    service
        .kill_trial("t1".into(), "already over".into())
        .wait()
        .unwrap();
    service.shutdown().wait().unwrap();
}
