//! `knob config check` builds the tuner and assessor a config names, as `knob create` would,
//! and says where in the file each refusal is; `knob create` registers nothing when one is
//! refused (issue 20 item 12, issue 19 "earlier checks").

use std::path::PathBuf;

use crate::create::Sandbox;
use crate::plugin::build_third_party_tuner;
use crate::run;

fn config_check(sandbox: &Sandbox, config: &std::path::Path) -> (i32, String, String) {
    run(sandbox.knob().args(["config", "check"]).arg(config))
}

/// `(line, column)` of the first occurrence of `needle` in `text`, 1-based.
fn line_column(text: &str, needle: &str) -> (usize, usize) {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in the config"));
    let line = text[..at].matches('\n').count() + 1;
    let column = at - text[..at].rfind('\n').map_or(0, |newline| newline + 1) + 1;
    (line, column)
}

#[test]
fn config_check_builds_the_tuner_and_assessor_and_names_line_and_column() {
    let sandbox = Sandbox::new();
    let yaml = "trialCommand: echo KNOB_FINAL 1
trialConcurrency: 1
searchSpace:
  x: {_type: uniform, _value: [0, 1]}
tuner:
  name: TPE
  classArgs:
    seed: 1
    optimze_mode: maximize
assessor:
  name: Medianstop
  classArgs: {start_step: -3}
trainingService:
  platform: local";
    let config = sandbox.config(yaml, &[]);
    let text = std::fs::read_to_string(&config).unwrap();
    let (code, stdout, stderr) = config_check(&sandbox, &config);
    assert_eq!(code, 1, "{stdout}");
    let (line, column) = line_column(&text, "optimze_mode");
    assert!(
        stderr.contains(&format!(
            "config.yml:{line}:{column}: tuner.classArgs.optimze_mode: tuner TPE: constructor failed: classArgs of TPE: unknown field `optimze_mode`"
        )),
        "{stderr}"
    );
    let (line, column) = line_column(&text, "start_step");
    assert!(
        stderr.contains(&format!(
            "config.yml:{line}:{column}: assessor.classArgs.start_step: assessor Medianstop: constructor failed: classArgs of Medianstop: start_step must be"
        )),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 2, "{stderr}");
}

/// A classArg of the wrong type or range is named by its path, at its own line, and the type is
/// said in words (it was serde's `invalid value: integer `-5`, expected u64`, at `classArgs`).
#[test]
fn config_check_names_a_bad_class_arg_by_its_path_at_its_line() {
    let sandbox = Sandbox::new();
    let cases = [
        (
            "name: TPE\n  classArgs:\n    seed: 1\n    tpe_args:\n      n_startup_jobs: -5",
            "n_startup_jobs",
            "tuner.classArgs.tpe_args.n_startup_jobs: tuner TPE: constructor failed: classArgs of TPE: tpe_args.n_startup_jobs: expected a whole number ≥ 0, got -5",
        ),
        (
            "name: TPE\n  classArgs: {tpe_args: bad}",
            "tpe_args",
            r#"tuner.classArgs.tpe_args: tuner TPE: constructor failed: classArgs of TPE: tpe_args: expected a mapping, got "bad""#,
        ),
        (
            "name: TPE\n  classArgs:\n    tpe_args: {gamma: 0.2, gama: 3}",
            "gama",
            "tuner.classArgs.tpe_args.gama: tuner TPE: constructor failed: classArgs of TPE: tpe_args: unknown field `gama`, expected one of",
        ),
        (
            "name: Evolution\n  classArgs: {population_size: \"32\"}",
            "population_size",
            r#"tuner.classArgs.population_size: tuner Evolution: constructor failed: classArgs of Evolution: population_size: expected a whole number ≥ 0, got "32""#,
        ),
        (
            "name: GPTuner\n  classArgs: {cold_start_num: -1}",
            "cold_start_num",
            "tuner.classArgs.cold_start_num: tuner GPTuner: constructor failed: classArgs of GPTuner: cold_start_num: expected a whole number ≥ 0, got -1",
        ),
    ];
    for (tuner, at, expected) in cases {
        refused_at(&sandbox, &format!("tuner:\n  {tuner}"), at, expected);
    }
}

/// `knob config check` of a config whose algorithm sections are `sections` fails with one
/// line, at the line and column of `at`, that holds `expected`; the config's path and that
/// located message.
fn refused_at(sandbox: &Sandbox, sections: &str, at: &str, expected: &str) -> (PathBuf, String) {
    let yaml = format!(
        "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nsearchSpace: {{x: {{_type: uniform, _value: [0, 1]}}}}\n{sections}\ntrainingService:\n  platform: local"
    );
    let config = sandbox.config(&yaml, &[]);
    let text = std::fs::read_to_string(&config).unwrap();
    let (code, stdout, stderr) = config_check(sandbox, &config);
    assert_eq!(code, 1, "{sections}: {stdout}");
    let (line, column) = line_column(&text, at);
    let located = format!("config.yml:{line}:{column}: {expected}");
    assert!(stderr.contains(&located), "{sections}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{sections}: {stderr}");
    (config, located)
}

#[test]
fn config_check_refuses_unknown_names_python_classes_and_a_space_the_tuner_refuses() {
    let sandbox = Sandbox::new();
    let cases = [
        (
            "tuner:\n  name: Bayesian",
            "Bayesian",
            "tuner.name: unknown tuner Bayesian; available: ",
        ),
        (
            "tuner:\n  name: Rnadom",
            "Rnadom",
            "tuner.name: unknown tuner Rnadom (did you mean Random?); available: ",
        ),
        (
            "tuner:\n  className: my_tuner.MyTuner",
            "my_tuner.MyTuner",
            // Through NNI's dispatcher, with the python3 on PATH, which has no nni.
            "tuner.className: NNI tuner my_tuner.MyTuner runs through NNI's Python dispatcher, but ",
        ),
        // A stray space is shown (the name quoted): it read "unknown tuner TPE  (did you mean
        // TPE?)", as if knob did not know TPE (H3 F2).
        (
            "tuner:\n  name: \"TPE \"",
            "\"TPE \"",
            "tuner.name: unknown tuner \"TPE \" (did you mean TPE?); available: ",
        ),
        (
            "tuner: {name: Random}\nassessor:\n  name: Medianstopp",
            "Medianstopp",
            "assessor.name: unknown assessor Medianstopp (did you mean Medianstop?); available: ",
        ),
        // The NNI dispatcher's bridge is not a name to give: it was offered among the available
        // names and then refused with "missing field `algorithm`".
        (
            "tuner:\n  name: NniDispatcher",
            "NniDispatcher",
            "tuner.name: NniDispatcher is knob's bridge to NNI's own Python algorithms, not one to name: give the NNI algorithm's name (name: SMAC, name: Metis, ...) or your own class (className: module.Class)",
        ),
        (
            "tuner: {name: Random}\nassessor:\n  name: nnidispatcherassessor",
            "nnidispatcherassessor",
            "assessor.name: nnidispatcherassessor is knob's bridge to NNI's own Python algorithms",
        ),
        // Batch takes one choice of parameter sets: the space is refused where it is written.
        (
            "tuner:\n  name: Batch",
            "{x: {_type: uniform",
            "searchSpace: tuner Batch refuses this search space: x is uniform, not a choice",
        ),
    ];
    for (tuner, at, expected) in cases {
        let (config, located) = refused_at(&sandbox, tuner, at, expected);
        // create refuses it the same way, before anything is registered.
        let (code, _, create_stderr) = sandbox.create(&config, "refused");
        assert_eq!(code, 1, "{tuner}: {create_stderr}");
        assert!(create_stderr.contains(&located), "{tuner}: {create_stderr}");
        assert!(!sandbox.path().join("experiments/refused").exists());
        // Nor is the bridge offered among the available names.
        assert!(
            !create_stderr.contains(", NniDispatcher")
                && !create_stderr.contains(" NniDispatcher,"),
            "{tuner}: {create_stderr}"
        );
    }
}

#[test]
fn config_check_catches_a_misspelled_class_arg_of_a_third_party_tuner() {
    let library = build_third_party_tuner();
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: echo KNOB_FINAL 1
trialConcurrency: 1
searchSpace: {{x: {{_type: uniform, _value: [0, 1]}}}}
pluginPaths: [{}]
tuner:
  name: Sweep
  classArgs:
    stesp: 5
trainingService:
  platform: local",
        library.display()
    );
    let config = sandbox.config(&yaml, &[]);
    let text = std::fs::read_to_string(&config).unwrap();
    let (code, stdout, stderr) = config_check(&sandbox, &config);
    assert_eq!(code, 1, "{stdout}");
    let (line, column) = line_column(&text, "stesp");
    assert!(
        stderr.contains(&format!(
            "config.yml:{line}:{column}: tuner.classArgs.stesp: tuner Sweep: constructor failed: classArgs of Sweep: unknown field `stesp`, expected `steps`"
        )),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // Spelled right, it passes.
    std::fs::write(&config, text.replace("stesp", "steps")).unwrap();
    let (code, stdout, stderr) = config_check(&sandbox, &config);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("steps: 5"), "{stdout}");
}

/// A tuner whose constructor fails used to leave an ERROR experiment with 0 trials in the
/// registry and its folder on disk.
#[test]
fn create_with_a_failing_constructor_registers_nothing_and_makes_no_folder() {
    let sandbox = Sandbox::new();
    let yaml = "trialCommand: echo KNOB_FINAL 1
trialConcurrency: 1
searchSpace: {x: {_type: uniform, _value: [0, 1]}}
tuner:
  name: TPE
  classArgs: {seed: sideways}
trainingService:
  platform: local";
    let config = sandbox.config(yaml, &[]);
    let text = std::fs::read_to_string(&config).unwrap();
    let (code, stdout, stderr) = sandbox.create(&config, "ctor");
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let (line, column) = line_column(&text, "seed");
    assert!(
        stderr.contains(&format!(
            "config.yml:{line}:{column}: tuner.classArgs.seed: tuner TPE: constructor failed: "
        )),
        "{stderr}"
    );
    assert!(stderr.contains("sideways"), "{stderr}");
    let (code, list, stderr) = run(sandbox.knob().args(["experiment", "list"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(!list.contains("ctor"), "registered:\n{list}");
    assert!(!sandbox.path().join("experiments/ctor").exists());
    // The id is free: the same config, fixed, creates it.
    std::fs::write(
        &config,
        text.replace("sideways", "1").replace(
            "trialConcurrency: 1",
            "trialConcurrency: 1\nmaxTrialNumber: 1",
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = sandbox.create(&config, "ctor");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
}
