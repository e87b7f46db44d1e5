//! What a tuner hands out is checked before any trial sees it, and a tuner's panic is its
//! experiment's one-line error, never a panic report on the terminal (issue 19 "output checked
//! at the boundary"). The tuners are `cli/tests/fixtures/misbehaving-tuner`, a plugin built here
//! like a third-party one.

use std::path::PathBuf;
use std::process::Command;

use crate::create::Sandbox;
use crate::repo_root;

/// Builds the fixture plugin (in the target dir the third-party example uses, sharing its
/// dependencies) and returns its library.
pub(crate) fn misbehaving_tuner() -> PathBuf {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("third-party");
    let manifest = repo_root().join("cli/tests/fixtures/misbehaving-tuner/Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["build", "--quiet", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    target.join("debug/libknob_misbehaving_tuner.so")
}

fn config(sandbox: &Sandbox, library: &std::path::Path, tuner: &str, extra: &str) -> PathBuf {
    sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1
trialConcurrency: 1
maxTrialNumber: 3
searchSpace: {{x: {{_type: uniform, _value: [0, 1]}}}}
pluginPaths: [{}]
{tuner}
trainingService:
  platform: local
{extra}",
            library.display()
        ),
        &[],
    )
}

#[test]
fn each_kind_of_bad_output_ends_the_experiment_with_one_line_naming_tuner_parameter_and_rule() {
    let library = misbehaving_tuner();
    let sandbox = Sandbox::new();
    let cases = [
        (
            "out_of_range",
            r#"trial parameter "x": 7.5 is outside uniform [0, 1]"#,
        ),
        (
            "extra_key",
            r#"trial parameter "y": not in the search space; expected only [x]"#,
        ),
        (
            "missing_key",
            r#"trial parameter "x": missing; the search space has it as uniform [0, 1]"#,
        ),
        (
            "not_an_object",
            "trial parameters: must be a JSON object of parameter values, got [1,2,3]",
        ),
    ];
    for (output, rule) in cases {
        let tuner = format!("tuner: {{name: Misbehaving, classArgs: {{output: {output}}}}}");
        let config = config(&sandbox, &library, &tuner, "");
        let (code, stdout, stderr) = sandbox.create(&config, output);
        assert_eq!(code, 1, "{output}: {stdout}\n{stderr}");
        let line = format!(
            "tuner Misbehaving handed out parameters the search space does not hold (parameter id 0): {rule} (tunerErrorPolicy: skip drops such parameters instead, allow runs them as NNI does)"
        );
        assert!(
            stderr.contains(&format!("error: experiment {output}: {line}")),
            "{output}: {stderr}"
        );
        let export = sandbox.export(output);
        assert_eq!(export["experiment"]["status"], "ERROR", "{output}");
        assert_eq!(export["experiment"]["message"], line.as_str(), "{output}");
        // No trial ever saw the bad parameters.
        assert_eq!(export["trials"].as_array().unwrap().len(), 0, "{output}");
    }
}

#[test]
fn with_tuner_error_policy_skip_bad_output_is_dropped_counted_and_logged() {
    let library = misbehaving_tuner();
    let sandbox = Sandbox::new();
    let tuner = "tuner: {name: Misbehaving, classArgs: {output: every_other}}";
    let config = config(&sandbox, &library, tuner, "tunerErrorPolicy: skip");
    let (code, stdout, stderr) = sandbox.create(&config, "skipping");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("skipping");
    assert_eq!(export["experiment"]["status"], "DONE");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 3);
    for trial in trials {
        assert_eq!(
            trial["parameters"],
            serde_json::json!({"x": 0.5}),
            "{trial}"
        );
    }
    let text = serde_json::to_string(&export).unwrap();
    // Parameter ids 0, 2 and 4 were refused; the third trial got id 5.
    for (id, count) in [(0, 1), (2, 2), (4, 3)] {
        let warning = format!(
            r#"tuner Misbehaving handed out parameters the search space does not hold (parameter id {id}): trial parameter \"x\": -1 is outside uniform [0, 1]; dropped (tunerErrorPolicy: skip), {count} so far"#
        );
        assert!(text.contains(&warning), "{warning} not in\n{text}");
    }
}

/// NNI never checks what a tuner hands out: a user's own tuner that adds keys (or makes up its
/// parameters under `searchSpace: {}`) runs under `allow`, as under NNI, with one warning.
#[test]
fn with_tuner_error_policy_allow_parameters_outside_the_space_run_as_they_are() {
    let library = misbehaving_tuner();
    let sandbox = Sandbox::new();
    let tuner = "tuner: {name: Misbehaving, classArgs: {output: extra_key}}";
    let config = config(&sandbox, &library, tuner, "tunerErrorPolicy: allow");
    let (code, stdout, stderr) = sandbox.create(&config, "allowing");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("allowing");
    assert_eq!(export["experiment"]["status"], "DONE");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 3);
    for trial in trials {
        assert_eq!(trial["status"], "SUCCEEDED", "{trial}");
        assert_eq!(
            trial["parameters"],
            serde_json::json!({"x": 0.5, "y": 1}),
            "{trial}"
        );
    }
    let warnings: Vec<String> = export["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["message"].as_str().unwrap_or_default().to_string())
        .filter(|m| m.contains("tunerErrorPolicy: allow"))
        .collect();
    assert_eq!(
        warnings,
        [
            r#"tuner Misbehaving handed out parameters the search space does not hold (parameter id 0): trial parameter "y": not in the search space; expected only [x]; run as it is (tunerErrorPolicy: allow), and so is every later such set, without a warning"#
        ],
        "{export:#}"
    );
}

#[test]
fn a_panicking_tuner_ends_the_experiment_with_one_line_and_nothing_else_on_stderr() {
    let library = misbehaving_tuner();
    let sandbox = Sandbox::new();
    let config = config(&sandbox, &library, "tuner: {name: Panicking}", "");
    let (code, stdout, stderr) = sandbox.create(&config, "panicking");
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let expected =
        "tuner Panicking panicked in generate_parameters: the dice fell off the table at 0 (at ";
    assert!(
        stderr.contains(&format!("error: experiment panicking: {expected}")),
        "{stderr}"
    );
    // Once, as the experiment's error: not as Rust's panic report ("thread '…' panicked at").
    assert_eq!(stderr.matches("the dice fell off").count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked at"), "{stderr}");
    let export = sandbox.export("panicking");
    let message = export["experiment"]["message"].as_str().unwrap();
    assert!(message.starts_with(expected), "{message}");
    assert!(message.contains("lib.rs:"), "{message}");
}
