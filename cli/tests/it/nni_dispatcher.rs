//! NNI's own Python algorithms under knob, through NNI's real dispatcher (`python -m nni` of the
//! nni 3.0 and 2.10.1 virtualenvs `.ci/nni-venvs.sh` makes): a user's tuner and assessor by
//! `className` (`nni_dispatcher/`), a dispatcher that dies mid-run, a Python without nni, NNI's
//! Metis and PBTTuner (checkpoints saved and loaded by a numpy trial), and late answers (a `TR`
//! or a `KI` outside any call) that wake the manager at once.
//! Gated like `nni.rs` by `KNOB_TEST_NNI3_PYTHON` / `KNOB_TEST_NNI2_PYTHON`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::nni::create_bounded;
use crate::prerequisite;
use crate::{knob, repo_root, run};

/// The fixtures beside this file: a tuner, an assessor and a trial, copied into `root/code`.
fn code_dir(root: &Path) -> PathBuf {
    let fixtures = repo_root().join("cli/tests/it/nni_dispatcher");
    let code = root.join("code");
    std::fs::create_dir_all(&code).unwrap();
    for file in [
        "walk_tuner.py",
        "stop_assessor.py",
        "trial.py",
        "pbt_trial.py",
        "late_tuner.py",
        "credit_tuner.py",
        "slow_assessor.py",
    ] {
        std::fs::copy(fixtures.join(file), code.join(file)).unwrap();
    }
    code
}

/// Writes `code/config.yml`: `trial.py STEPS PAUSE` on the local machine, the `x` space, and
/// `algorithms` (YAML, indented at top level) for the tuner and assessor.
fn write_config(
    code: &Path,
    python: &Path,
    trials: u32,
    trial_args: &str,
    algorithms: &str,
) -> PathBuf {
    let trial = format!("trial.py {trial_args}");
    write_config_with(code, python, X_SPACE, trials, &trial, algorithms)
}

/// The search space of `trial.py`.
const X_SPACE: &str = "  x: {_type: uniform, _value: [0, 1]}";

/// [`write_config`] with another search space (YAML lines under `searchSpace`) and trial
/// (a script of `code/` and its arguments).
fn write_config_with(
    code: &Path,
    python: &Path,
    space: &str,
    trials: u32,
    trial: &str,
    algorithms: &str,
) -> PathBuf {
    let config = format!(
        "searchSpace:\n{space}\n\
         trialCommand: {python} {trial}\n\
         trialCodeDirectory: .\n\
         trialConcurrency: 2\n\
         maxTrialNumber: {trials}\n\
         maxExperimentDuration: 4m\n\
         experimentWorkingDirectory: {root}\n\
         {algorithms}\n\
         trainingService:\n  platform: local\n",
        python = python.display(),
        root = code.parent().unwrap().join("experiments").display(),
    );
    let path = code.join("config.yml");
    std::fs::write(&path, config).unwrap();
    path
}

/// Runs `knob create` to its end and returns its export (JSON) and stderr.
fn create_and_export(root: &Path, config: &Path, id: &str) -> (Value, String) {
    let home = root.join("home");
    let (status, stdout, stderr) = create_bounded(
        knob()
            .env("KNOB_HOME", &home)
            .arg("create")
            .arg("--config")
            .arg(config)
            .args(["--id", id]),
        root,
    );
    let export = export(&home, id)
        .unwrap_or_else(|e| panic!("export: {e}\ncreate: {status}\n{stdout}\n{stderr}"));
    (export, format!("{stdout}\n{stderr}"))
}

/// `knob experiment export ID --format json` under `home`, parsed; its stderr when it fails.
fn export(home: &Path, id: &str) -> Result<Value, String> {
    let (code, export, stderr) =
        run(knob()
            .env("KNOB_HOME", home)
            .args(["experiment", "export", id, "--format", "json"]));
    if code != 0 {
        return Err(stderr);
    }
    Ok(serde_json::from_str(&export).unwrap())
}

/// The tuner's record: one JSON object a line.
fn record(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Every file called `name` under `dir`, at any depth.
fn files_named(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_named(&path, name));
        } else if path.file_name().is_some_and(|n| n == name) {
            found.push(path);
        }
    }
    found
}

fn check_custom_tuner(python: &Path, id: &str) {
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("tuner-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}, optimize_mode: maximize, seed: 7}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, python, 5, "1 0", &algorithms);
    let (export, output) = create_and_export(sandbox.path(), &config, id);
    let context = format!("{export:#}\n{output}");
    assert_eq!(export["experiment"]["status"], "DONE", "{context}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 5, "{context}");
    // The dispatcher left on its own at the end, its channel closed as NNI's client closes it:
    // it used to wait on the close handshake until knob killed it 5 s later, without this line.
    let dispatcher_log = sandbox
        .path()
        .join("experiments")
        .join(id)
        .join("log/dispatcher.log");
    let dispatcher_log = std::fs::read_to_string(&dispatcher_log).unwrap_or_default();
    assert!(
        dispatcher_log.contains("Dispatcher terminiated"), // sic, NNI's spelling
        "{context}\ndispatcher.log:\n{dispatcher_log}"
    );

    let events = record(&record_file);
    let context = format!("{context}\nrecord: {events:#?}");
    assert_eq!(events[0]["event"], "space", "{context}");
    assert_eq!(
        events[0]["space"],
        serde_json::json!({"x": {"_type": "uniform", "_value": [0, 1]}})
    );
    // As nni 3.0's and 2.10.1's managers set it: their configs cannot turn it on.
    assert_eq!(
        events[0]["include_intermediate_results"], "false",
        "{context}"
    );
    let generated: Vec<&Value> = events.iter().filter(|e| e["event"] == "generate").collect();
    assert_eq!(generated.len(), 5, "{context}");
    // Each trial got its parameter id as the dispatcher sent it, an int (it used to get the
    // text "0"), on nni 3.0's channel and on 2.10's parameter.cfg alike.
    let mut trial_ids = files_named(
        &sandbox.path().join("experiments").join(id).join("trials"),
        "parameter_id.json",
    )
    .iter()
    .map(|file| serde_json::from_str::<Value>(&std::fs::read_to_string(file).unwrap()).unwrap())
    .collect::<Vec<Value>>();
    let mut generated_ids: Vec<Value> = generated
        .iter()
        .map(|g| g["parameter_id"].clone())
        .collect();
    let by_text = |a: &Value, b: &Value| a.to_string().cmp(&b.to_string());
    trial_ids.sort_by(by_text);
    generated_ids.sort_by(by_text);
    assert!(generated_ids.iter().all(Value::is_u64), "{context}");
    assert_eq!(trial_ids, generated_ids, "{context}");
    for trial in trials {
        assert_eq!(trial["status"], "SUCCEEDED", "{context}");
        // The trial ran with parameters the tuner generated, under the dispatcher's id.
        let made = generated
            .iter()
            .find(|g| g["parameters"] == trial["parameters"])
            .unwrap_or_else(|| {
                panic!(
                    "trial {} has parameters the tuner never made\n{context}",
                    trial["id"]
                )
            });
        let x = trial["parameters"]["x"].as_f64().unwrap();
        let final_value = trial["final"].as_f64().unwrap();
        assert_eq!(final_value, -(x - 0.3) * (x - 0.3), "{context}");
        // The dispatcher's tuner got that final for that parameter id, and the trial's end.
        let result = events
            .iter()
            .find(|e| e["event"] == "result" && e["parameter_id"] == made["parameter_id"])
            .unwrap_or_else(|| panic!("no result for {}\n{context}", made["parameter_id"]));
        assert_eq!(result["value"].as_f64(), Some(final_value), "{context}");
        assert_eq!(result["parameters"], trial["parameters"], "{context}");
        assert!(
            events.iter().any(|e| e["event"] == "end"
                && e["parameter_id"] == made["parameter_id"]
                && e["success"] == true),
            "{context}"
        );
    }
}

/// NNI hands a tuner the final result as the trial reported it: a user's own class that reads
/// an entry of a dict final other than 'default' (`value['accuracy']`) got a float, the
/// default alone, under knob, and failed.
fn check_whole_dict_final(python: &Path, id: &str) {
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("tuner-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}, seed: 3}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, python, 2, "2 0 dict", &algorithms);
    let (export, output) = create_and_export(sandbox.path(), &config, id);
    let events = record(&record_file);
    let context = format!("{export:#}\n{output}\nrecord: {events:#?}");
    assert_eq!(export["experiment"]["status"], "DONE", "{context}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2, "{context}");
    for trial in trials {
        assert_eq!(trial["status"], "SUCCEEDED", "{context}");
        let x = trial["parameters"]["x"].as_f64().unwrap();
        let final_value = trial["final"].as_f64().unwrap();
        assert_eq!(final_value, -(x - 0.3) * (x - 0.3), "{context}");
        let result = events
            .iter()
            .find(|e| e["event"] == "result" && e["parameters"] == trial["parameters"])
            .unwrap_or_else(|| panic!("no result for trial {}\n{context}", trial["id"]));
        assert_eq!(
            result["value"],
            serde_json::json!({"default": final_value, "accuracy": x, "epochs": 2, "tags": ["a", "b"]}),
            "{context}"
        );
    }
}

#[test]
fn a_users_nni_tuner_is_handed_a_dict_final_whole_under_nni_3() {
    if let Some(python) = prerequisite::NNI3_PYTHON.path() {
        check_whole_dict_final(&python, "wholedict3");
    }
}

#[test]
fn a_users_nni_tuner_is_handed_a_dict_final_whole_under_nni_2_10() {
    if let Some(python) = prerequisite::NNI2_PYTHON.path() {
        check_whole_dict_final(&python, "wholedict2");
    }
}

#[test]
fn a_users_nni_tuner_by_class_name_runs_under_nni_3() {
    if let Some(python) = prerequisite::NNI3_PYTHON.path() {
        check_custom_tuner(&python, "ctuner3");
    }
}

#[test]
fn a_users_nni_tuner_by_class_name_runs_under_nni_2_10() {
    if let Some(python) = prerequisite::NNI2_PYTHON.path() {
        check_custom_tuner(&python, "ctuner2");
    }
}

/// Trials that end together at the experiment's end: NNI's dispatcher queues their ends for
/// one worker, and the tuner takes 0.4 s over each (`end_delay`). Every end reaches it before
/// the dispatcher goes: by default NNI's worker left on TERMINATE with ends still queued.
/// NNI's manager sets its dispatcher's `CUDA_VISIBLE_DEVICES` to `tunerGpuIndices` joined, and
/// to '' when unset (`toCudaVisibleDevices`), whatever the manager's own is. knob used to pass
/// its own on (here 5,6) and ignore the field.
#[test]
fn the_dispatcher_sees_tuner_gpu_indices_as_its_cuda_visible_devices() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    for (id, field, expected) in [
        (
            "tgpuset",
            "tunerGpuIndices: [1, 3]
",
            "1,3",
        ),
        (
            "tgpuint",
            "tunerGpuIndices: 2
",
            "2",
        ),
        ("tgpunone", "", ""),
    ] {
        let sandbox = tempfile::tempdir().unwrap();
        let code = code_dir(sandbox.path());
        let record_file = sandbox.path().join("tuner-record.jsonl");
        let algorithms = format!(
            "{field}tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}}}",
            python.display(),
            record_file.display()
        );
        let config = write_config(&code, &python, 1, "1 0", &algorithms);
        let home = sandbox.path().join("home");
        let (status, stdout, stderr) = create_bounded(
            knob()
                .env("KNOB_HOME", &home)
                .env("CUDA_VISIBLE_DEVICES", "5,6")
                .arg("create")
                .arg("--config")
                .arg(&config)
                .args(["--id", id]),
            sandbox.path(),
        );
        let events = record(&record_file);
        let context =
            format!("{field:?}: create {status}\n{stdout}\n{stderr}\nrecord: {events:#?}");
        let space = events
            .iter()
            .find(|e| e["event"] == "space")
            .unwrap_or_else(|| panic!("the tuner never got its space\n{context}"));
        assert_eq!(space["cuda_visible_devices"], expected, "{context}");
    }
}

/// A `className` tuner is user code, as a trial is: NNI's dispatcher, which runs it, inherits
/// none of knob's secret variables (it used to get all six).
#[test]
fn a_users_nni_tuner_inherits_none_of_knobs_secret_variables() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("tuner-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, &python, 1, "1 0", &algorithms);
    let home = sandbox.path().join("home");
    let (status, stdout, stderr) = create_bounded(
        crate::secrets::with_secrets(&mut knob())
            .env("KNOB_HOME", &home)
            .arg("create")
            .arg("--config")
            .arg(&config)
            .args(["--id", "tsealed"]),
        sandbox.path(),
    );
    let events = record(&record_file);
    let context = format!("create {status}\n{stdout}\n{stderr}\nrecord: {events:#?}");
    let space = events
        .iter()
        .find(|e| e["event"] == "space")
        .unwrap_or_else(|| panic!("the tuner never got its space\n{context}"));
    crate::secrets::assert_sealed(
        space["knob_environment"].as_str().unwrap(),
        "the dispatcher",
    );
}

#[test]
fn ends_queued_in_nni_s_dispatcher_reach_the_tuner_before_it_terminates() {
    let Some(python) = prerequisite::NNI2_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("tuner-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}, seed: 7, end_delay: 0.4}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, &python, 4, "1 0", &algorithms);
    let (export, output) = create_and_export(sandbox.path(), &config, "ends");
    let events = record(&record_file);
    let context = format!("{export:#}\n{output}\nrecord: {events:#?}");
    assert_eq!(export["experiment"]["status"], "DONE", "{context}");
    let mut ended: Vec<u64> = events
        .iter()
        .filter(|e| e["event"] == "end")
        .filter_map(|e| e["parameter_id"].as_u64())
        .collect();
    ended.sort_unstable();
    assert_eq!(ended, vec![0, 1, 2, 3], "{context}");
}

/// A user's assessor by className stops the trials below its threshold, early-stopped with the
/// assessor named as the reason; the others run to the end.
#[test]
fn a_users_nni_assessor_by_class_name_stops_trials() {
    if let Some(python) = prerequisite::NNI3_PYTHON.path() {
        check_custom_assessor(&python, "cassess");
    }
}

#[test]
fn a_users_nni_assessor_by_class_name_stops_trials_under_nni_2_10() {
    if let Some(python) = prerequisite::NNI2_PYTHON.path() {
        check_custom_assessor(&python, "cassess2");
    }
}

fn check_custom_assessor(python: &Path, id: &str) {
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let algorithms = format!(
        "tuner:\n  name: Random\n  classArgs: {{seed: 5}}\n\
         assessor:\n  className: stop_assessor.ThresholdStop\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{threshold: 0.5, after: 2}}",
        python.display()
    );
    // Six steps a second apart.
    let config = write_config(&code, python, 6, "6 1", &algorithms);
    let (export, output) = create_and_export(sandbox.path(), &config, id);
    let context = format!("{export:#}\n{output}");
    assert_eq!(export["experiment"]["status"], "DONE", "{context}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 6, "{context}");
    let mut stopped = 0;
    for trial in trials {
        let x = trial["parameters"]["x"].as_f64().unwrap();
        if x < 0.5 {
            stopped += 1;
            assert_eq!(trial["status"], "EARLY_STOPPED", "{context}");
            let why = trial.to_string();
            assert!(
                why.contains("NNI assessor stop_assessor.ThresholdStop"),
                "the stop names the assessor\n{context}"
            );
            // Its verdict came at its second result (or, the kill being asynchronous in NNI's
            // protocol, at a later one); how many results reached the store before the kill
            // depends on timing, so it is not checked.
            let message = trial["message"].as_str().unwrap_or_default();
            let after: usize = message
                .rsplit("stopped the trial after ")
                .next()
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{message}\n{context}"));
            assert!(after >= 2, "{message}\n{context}");
        } else {
            assert_eq!(trial["status"], "SUCCEEDED", "{context}");
        }
    }
    assert!(
        stopped > 0,
        "Random with seed 5 should draw some x < 0.5\n{context}"
    );
}

/// A dispatcher that dies mid-run (its tuner SIGKILLs its own process at the third request)
/// ends the experiment in ERROR, and the reason says so with the last lines of dispatcher.log.
#[test]
fn a_dispatcher_killed_mid_run_ends_the_experiment_in_error_with_the_reason() {
    check_dispatcher_failure("die_at: 3", "ckilled", "killing my own dispatcher");
}

/// A tuner that raises inside the dispatcher (NNI's worker thread records the exception and
/// ends; the dispatcher's main loop notices only at its next command, which knob's ping
/// supplies) ends the experiment in ERROR with the exception from dispatcher.log, instead of
/// knob waiting for parameters that never come.
#[test]
fn a_tuner_that_raises_ends_the_experiment_in_error_with_the_exception() {
    check_dispatcher_failure("raise_at: 3", "craises", "walk_tuner: raising at parameter");
}

/// A tuner that thinks longer than a request waits (its first id is deferred, nothing runs)
/// and then raises: the dispatcher's end wakes the manager, which ends the experiment with the
/// exception at once. Without that wake it waited for parameters until its
/// `maxExperimentDuration` (4 minutes) and ended DONE with no trial.
#[test]
fn a_tuner_that_raises_after_thinking_ends_the_experiment_at_once() {
    check_dispatcher_failure(
        "raise_at: 1, think: 3",
        "cthinkraise",
        "walk_tuner: raising at parameter",
    );
}

/// Runs `walk_tuner` with `fail_args` (`raise_at: 3`: its third request fails) and checks the
/// experiment ends in ERROR naming the tuner and quoting `quote` from dispatcher.log.
fn check_dispatcher_failure(fail_args: &str, id: &str, quote: &str) {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("tuner-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}, {fail_args}}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, &python, 6, "1 0", &algorithms);
    let (export, output) = create_and_export(sandbox.path(), &config, id);
    let context = format!("{export:#}\n{output}");
    assert_eq!(export["experiment"]["status"], "ERROR", "{context}");
    let message = export["experiment"]["message"]
        .as_str()
        .filter(|m| !m.is_empty())
        .unwrap_or(&output)
        .to_owned();
    // Named by the user's class, once, not by the plugin that runs it ("tuner NniDispatcher
    // failed in generate_parameters: NNI tuner walk_tuner.WalkTuner: ...").
    assert!(
        message.starts_with("NNI tuner walk_tuner.WalkTuner: ")
            && message.matches("walk_tuner.WalkTuner").count() == 1
            && !message.contains("NniDispatcher")
            && message.contains("NNI's dispatcher"),
        "{message}\n{context}"
    );
    assert!(
        message.contains(quote),
        "the reason quotes dispatcher.log\n{message}\n{context}"
    );
}

/// A Python without nni: `knob config check` refuses the className at its line, naming the
/// Python and `pip install nni`. Runs everywhere: the python3 on PATH must not have nni.
#[test]
fn a_python_without_nni_is_refused_at_the_class_name() {
    assert_python3_has_no_nni();
    let sandbox = tempfile::tempdir().unwrap();
    let code_path = code_dir(sandbox.path());
    let algorithms = "tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: python3\n  classArgs: {record: r.jsonl}";
    let config = write_config(&code_path, Path::new("python3"), 2, "1 0", algorithms);
    let (status, stdout, stderr) = run(knob()
        .env("KNOB_HOME", sandbox.path().join("home"))
        .args(["config", "check"])
        .arg(&config));
    assert_ne!(status, 0, "{stdout}");
    let line = stderr
        .lines()
        .find(|l| l.contains("tuner.className"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        line.contains(
            "config.yml:10:14: tuner.className: NNI tuner walk_tuner.WalkTuner runs through"
        ),
        "{line}"
    );
    assert!(line.contains("python3 cannot import nni"), "{line}");
    assert!(line.contains("-m pip install nni"), "{line}");
}

/// The tests of a Python without nni use the python3 on PATH: it must not have nni.
fn assert_python3_has_no_nni() {
    let (code, _, _) = run(Command::new("python3").args([
        "-c",
        "import importlib.util, sys; sys.exit(importlib.util.find_spec('nni') is not None)",
    ]));
    assert_eq!(
        code, 0,
        "the python3 on PATH has nni; this test needs one without it"
    );
}

/// The same for one of NNI's own algorithms, also when it has classArgs (the refusal was put at
/// its first class argument, which was fine), in a v2 and a v1 config.
#[test]
fn a_python_without_nni_is_refused_at_the_algorithm_name_whatever_its_class_args() {
    assert_python3_has_no_nni();
    let sandbox = tempfile::tempdir().unwrap();
    let dir = sandbox.path();
    std::fs::write(
        dir.join("space.json"),
        r#"{"x": {"_type": "uniform", "_value": [0, 1]}}"#,
    )
    .unwrap();
    let v2 = "searchSpaceFile: space.json\ntrialCommand: python3 trial.py\ntrialConcurrency: 1\n\
              tuner:\n  name: SMAC\n  classArgs:\n    optimize_mode: maximize\n\
              trainingService:\n  platform: local\n";
    let v1 = "authorName: a\nexperimentName: b\ntrialConcurrency: 1\nsearchSpacePath: space.json\n\
              trainingServicePlatform: local\ntuner:\n  builtinTunerName: SMAC\n  classArgs:\n\
              \x20   optimize_mode: maximize\ntrial:\n  command: python3 trial.py\n  codeDir: .\n";
    for (file, text, at) in [
        ("v2.yml", v2, "v2.yml:5:9: tuner.name: "),
        ("v1.yml", v1, "v1.yml:7:21: tuner.builtinTunerName: "),
    ] {
        std::fs::write(dir.join(file), text).unwrap();
        let (status, stdout, stderr) = run(knob()
            .env("KNOB_HOME", dir.join("home"))
            .current_dir(dir)
            .args(["config", "check", file]));
        assert_ne!(status, 0, "{stdout}");
        assert!(
            stderr.contains(&format!(
                "{at}NNI tuner SMAC runs through NNI's Python dispatcher, but"
            )) && stderr.contains("cannot import nni"),
            "{stderr}"
        );
    }
}

/// Resume, as NNI's manager does it: the dispatcher starts again with `NNI_MODE=resume` and gets
/// `FD` with exactly the trials that finished (parameters and finals, a dict final whole, as
/// the trial reported it), and `AD` with the earlier trials, so its parameter ids go on after
/// theirs.
#[test]
fn a_resumed_dispatcher_gets_exactly_the_finished_trials_and_continues_their_ids() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("tuner-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}, seed: 11}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, &python, 3, "1 0 dict", &algorithms);
    let (first, output) = create_and_export(sandbox.path(), &config, "cresume");
    assert_eq!(first["experiment"]["status"], "DONE", "{first:#}\n{output}");
    let home = sandbox.path().join("home");
    let (status, stdout, stderr) =
        run(knob()
            .env("KNOB_HOME", &home)
            .args(["resume", "cresume", "--max-trial-number", "5"]));
    assert_eq!(status, 0, "{stdout}\n{stderr}");
    let export = export(&home, "cresume").unwrap();
    let events = record(&record_file);
    let context = format!("{export:#}\nrecord: {events:#?}");
    assert_eq!(export["experiment"]["status"], "DONE", "{context}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 5, "{context}");

    // FD: exactly the three finished trials, with their finals.
    let imports: Vec<&Value> = events.iter().filter(|e| e["event"] == "import").collect();
    assert_eq!(imports.len(), 1, "{context}");
    let mut imported: Vec<(String, f64)> = imports[0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let x = d["parameter"]["x"].clone();
            let whole = serde_json::json!({"default": d["value"]["default"], "accuracy": x, "epochs": 1, "tags": ["a", "b"]});
            assert_eq!(d["value"], whole, "{context}");
            (d["parameter"].to_string(), d["value"]["default"].as_f64().unwrap())
        })
        .collect();
    let mut finished: Vec<(String, f64)> = first["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["parameters"].to_string(), t["final"].as_f64().unwrap()))
        .collect();
    imported.sort_by(|a, b| a.0.cmp(&b.0));
    finished.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(imported, finished, "{context}");

    // AD: the second dispatcher's ids go on after the first one's 0, 1, 2.
    let generated: Vec<u64> = events
        .iter()
        .filter(|e| e["event"] == "generate")
        .map(|e| e["parameter_id"].as_u64().unwrap())
        .collect();
    assert_eq!(generated.len(), 5, "{context}");
    assert_eq!(&generated[..3], &[0, 1, 2], "{context}");
    assert!(generated[3..].iter().all(|id| *id >= 3), "{context}");
    let import_at = events.iter().position(|e| e["event"] == "import").unwrap();
    let space_again = events.iter().rposition(|e| e["event"] == "space").unwrap();
    assert!(space_again < import_at, "IN before FD\n{context}");
}

/// NNI's own Hyperband advisor (`useNniImplementation: true`): trials carry its string ids
/// (`"0-4_0_3"`, as its `TR`s give them) and its `TRIAL_BUDGET`. nni 3.0's advisor itself then
/// fails on the first result it gets (`Recoverable.is_created_in_previous_exp` compares the
/// string id with an int: a TypeError inside NNI, 2.10.1 has the same code), so the experiment
/// ends in ERROR quoting that line of dispatcher.log, as it does under NNI: knob's native
/// `Hyperband` is the one that runs.
#[test]
fn nni_s_hyperband_advisor_gives_string_ids_and_budgets() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let algorithms = format!(
        "tuner:\n  name: Hyperband\n  useNniImplementation: true\n  pythonInterpreter: {}\n  classArgs: {{optimize_mode: maximize, R: 9, eta: 3}}",
        python.display()
    );
    let config = write_config(&code, &python, 6, "1 0", &algorithms);
    let (export, output) = create_and_export(sandbox.path(), &config, "chyper");
    let context = format!("{export:#}\n{output}");
    let trials = export["trials"].as_array().unwrap();
    assert!(!trials.is_empty(), "{context}");
    for trial in trials {
        let label = trial["parameter_label"]
            .as_str()
            .unwrap_or_else(|| panic!("{context}"));
        assert!(
            label.contains('_') && label.parse::<u64>().is_err(),
            "{label}\n{context}"
        );
        let budget = trial["parameters"]["TRIAL_BUDGET"]
            .as_f64()
            .unwrap_or_else(|| panic!("{context}"));
        assert!(budget > 0.0 && budget <= 9.0, "{context}");
    }
    assert_eq!(export["experiment"]["status"], "ERROR", "{context}");
    let message = export["experiment"]["message"].as_str().unwrap();
    assert!(
        message.contains("NNI tuner Hyperband: NNI's dispatcher stopped")
            && message
                .contains("TypeError: '<=' not supported between instances of 'str' and 'int'"),
        "{message}"
    );
}

/// NNI's Metis (scikit-learn's Gaussian process inside NNI) by name: its first trials are its
/// cold start, the later ones come from its model; a few trials, since each of its answers
/// fits the model again.
#[test]
fn nni_s_metis_runs_by_name() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let algorithms = format!(
        "tuner:\n  name: Metis\n  pythonInterpreter: {}\n  classArgs: {{optimize_mode: maximize, cold_start_num: 2, selection_num_starting_points: 20}}",
        python.display()
    );
    let config = write_config(&code, &python, 4, "1 0", &algorithms);
    let (export, output) = create_and_export(sandbox.path(), &config, "cmetis");
    let context = format!("{export:#}\n{output}");
    assert_eq!(export["experiment"]["status"], "DONE", "{context}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "{context}");
    for trial in trials {
        assert_eq!(trial["status"], "SUCCEEDED", "{context}");
        let x = trial["parameters"]["x"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&x), "{context}");
        assert_eq!(
            trial["final"].as_f64(),
            Some(-(x - 0.3) * (x - 0.3)),
            "{context}"
        );
    }
    // Past its cold start, Metis's model chose: dispatcher.log says so.
    let log = std::fs::read_to_string(sandbox.path().join("experiments/cmetis/log/dispatcher.log"))
        .unwrap_or_default();
    assert!(
        !log.contains("Traceback"),
        "Metis failed inside NNI:\n{log}\n{context}"
    );
}

/// NNI's PBTTuner by name on a numpy trial (`pbt_trial.py`) that loads `load_checkpoint_dir` and
/// saves to `save_checkpoint_dir`: two generations of three (each numpy trial takes a minute on
/// a loaded machine). The parameters reach the trials as PBT made them, and the trials' own
/// files show that every trial of the second generation loaded exactly the weights a trial of
/// the first had saved in that directory. PBT answers most
/// requests late (its credit is paid when a generation's last result comes in), which the
/// manager takes when the dispatcher's `TR` arrives.
#[test]
fn nni_s_pbt_tuner_hands_checkpoints_from_trial_to_trial() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let checkpoints = sandbox.path().join("checkpoints");
    let algorithms = format!(
        "tuner:\n  name: PBTTuner\n  pythonInterpreter: {}\n  classArgs: {{optimize_mode: maximize, all_checkpoint_dir: {}, population_size: 3}}",
        python.display(),
        checkpoints.display()
    );
    let config = write_config_with(
        &code,
        &python,
        "  lr: {_type: uniform, _value: [0.05, 0.4]}",
        6,
        "pbt_trial.py",
        &algorithms,
    );
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("trialConcurrency: 2", "trialConcurrency: 3");
    std::fs::write(&config, text).unwrap();
    let (export, output) = create_and_export(sandbox.path(), &config, "cpbt");
    let context = format!("{export:#}\n{output}");
    assert_eq!(export["experiment"]["status"], "DONE", "{context}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 6, "{context}");
    let mut records = Vec::new();
    for trial in trials {
        assert_eq!(trial["status"], "SUCCEEDED", "{context}");
        let parameters = &trial["parameters"];
        let save = parameters["save_checkpoint_dir"].as_str().unwrap();
        let load = parameters["load_checkpoint_dir"].as_str().unwrap();
        assert!(
            Path::new(save).starts_with(&checkpoints) && Path::new(load).starts_with(&checkpoints),
            "{context}"
        );
        // The trial's own record of what it loaded and saved.
        let record: Value = serde_json::from_str(
            &std::fs::read_to_string(Path::new(save).join("trial.json"))
                .unwrap_or_else(|e| panic!("{save}/trial.json: {e}\n{context}")),
        )
        .unwrap();
        assert_eq!(record["load_checkpoint_dir"], load, "{context}");
        assert_eq!(record["save_checkpoint_dir"], save, "{context}");
        records.push(record);
    }
    let loaded: Vec<&Value> = records.iter().filter(|r| r["loaded"] == true).collect();
    assert_eq!(
        loaded.len(),
        3,
        "every trial after the first generation loads a checkpoint\n{records:#?}\n{context}"
    );
    for record in loaded {
        // What it loaded is what the trial that saved to that directory wrote there.
        let saver = records
            .iter()
            .find(|r| r["save_checkpoint_dir"] == record["load_checkpoint_dir"])
            .unwrap_or_else(|| {
                panic!(
                    "nobody saved to {}\n{records:#?}",
                    record["load_checkpoint_dir"]
                )
            });
        assert_eq!(saver["weights_out"], record["weights_in"], "{records:#?}");
        assert_ne!(saver["save_checkpoint_dir"], record["save_checkpoint_dir"]);
    }
}

/// A tuner that answers `GE` only later (NO first, then a `TR` from a timer, as NNI's advisors
/// and PBT pay their credit): with nothing running and every id deferred, the manager waits,
/// and the late `TR` wakes it at once. Before wakers, the experiment ended with no trial.
#[test]
fn a_late_answer_from_nni_s_dispatcher_wakes_the_manager() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let events = check_three_trials_run_what_was_paid(
        &python,
        "late_tuner.LateTuner",
        "delay: 2, seed: 3",
        "clate",
    );
    // Asked for no more than the budget: ids owed count against it.
    let handed_out = events.iter().filter(|e| e["event"] == "late").count();
    assert_eq!(handed_out, 3, "record: {events:#?}");
}

/// Runs 3 trials, 2 at a time, of the user's tuner `class_name` (`class_args` and a `record`
/// file, where it writes each parameter set it hands out with its parameter id): every trial
/// runs a parameter set it handed out, labeled with that set's id. Returns the record.
fn check_three_trials_run_what_was_paid(
    python: &Path,
    class_name: &str,
    class_args: &str,
    id: &str,
) -> Vec<Value> {
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("tuner-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: {class_name}\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}, {class_args}}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, python, 3, "1 0", &algorithms);
    let (export, output) = create_and_export(sandbox.path(), &config, id);
    let events = record(&record_file);
    let context = format!("{export:#}\n{output}\nrecord: {events:#?}");
    assert_eq!(export["experiment"]["status"], "DONE", "{context}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 3, "{context}");
    for trial in trials {
        assert_eq!(trial["status"], "SUCCEEDED", "{context}");
        // The first event with these parameters is their handing out.
        let handed_out = events
            .iter()
            .find(|e| e["parameters"] == trial["parameters"])
            .unwrap_or_else(|| panic!("parameters nobody handed out\n{context}"));
        assert_eq!(
            trial["parameter_label"].as_str(),
            Some(handed_out["parameter_id"].to_string().as_str()),
            "{context}"
        );
    }
    events
}

/// A tuner that pays its first request only after a result (NNI's PBTTuner and advisors keep
/// such a credit) and answers every later one at once: the second request's `TR` pays the first,
/// deferred id, and the second id must then be deferred too, not waited for. Waiting for its own
/// `TR` held the tuner's thread for 600 s with no trial running (no result can reach the tuner
/// while it waits), and the experiment ran out of time.
#[test]
fn an_answer_that_pays_an_earlier_request_does_not_hold_the_tuner() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("credit-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: credit_tuner.CreditTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}, seed: 5}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, &python, 4, "1 0", &algorithms);
    let (export, output) = create_and_export(sandbox.path(), &config, "credit");
    let events = record(&record_file);
    let context = format!("{export:#}\n{output}\nrecord: {events:#?}");
    assert_eq!(export["experiment"]["status"], "DONE", "{context}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "{context}");
    assert!(
        trials.iter().all(|t| t["status"] == "SUCCEEDED"),
        "{context}"
    );
    // The credit was paid (after a result) and its parameters ran.
    let paid = events
        .iter()
        .find(|e| e["event"] == "credit")
        .unwrap_or_else(|| panic!("the first request was never paid\n{context}"));
    assert!(
        trials.iter().any(|t| t["parameters"] == paid["parameters"]),
        "{context}"
    );
}

/// An assessor whose kill comes after its verdict was waited for (it thinks for a second, the
/// trial then sleeps 200 s before its next result, long enough for the assessor's dispatcher to
/// start on a loaded machine): the `KI` wakes the manager, which stops the trial at once, after
/// its first result. Before wakers, it ran on to its second.
#[test]
fn a_late_kill_from_nni_s_dispatcher_stops_the_trial_at_once() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let algorithms = format!(
        "tuner:\n  name: Random\n  classArgs: {{seed: 2}}\n\
         assessor:\n  className: slow_assessor.SlowStop\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{think: 1.0}}",
        python.display()
    );
    let config = write_config(&code, &python, 2, "2 200", &algorithms);
    let (export, output) = create_and_export(sandbox.path(), &config, "clatekill");
    let context = format!("{export:#}\n{output}");
    assert_eq!(export["experiment"]["status"], "DONE", "{context}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2, "{context}");
    for trial in trials {
        assert_eq!(trial["status"], "EARLY_STOPPED", "{context}");
        let message = trial["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("NNI assessor slow_assessor.SlowStop")
                && message.contains("stopped the trial after 1 intermediate results"),
            "{message}\n{context}"
        );
        assert_eq!(
            trial["intermediate"].as_array().map(Vec::len),
            Some(1),
            "{context}"
        );
    }
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
#[cfg(target_os = "linux")]
fn process_ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// Starts `knob create` of `config` as experiment `id` under `home`, its output to files in
/// `root`; with it, what knob printed so far and the tuner's `record`, for a failure's message.
#[cfg(target_os = "linux")]
fn spawn_create(
    root: &Path,
    home: &Path,
    config: &Path,
    id: &str,
    record_file: &Path,
) -> (std::process::Child, impl Fn() -> String) {
    let (stdout_path, stderr_path) = (root.join("create.stdout"), root.join("create.stderr"));
    let child = knob()
        .env("KNOB_HOME", home)
        .arg("create")
        .arg("--config")
        .arg(config)
        .args(["--id", id])
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let record_file = record_file.to_path_buf();
    let output = move || {
        format!(
            "{}\n{}\nrecord: {:#?}",
            std::fs::read_to_string(&stdout_path).unwrap_or_default(),
            std::fs::read_to_string(&stderr_path).unwrap_or_default(),
            record(&record_file)
        )
    };
    (child, output)
}

/// Polls `done` every 100 ms, `times` times at most.
#[cfg(target_os = "linux")]
fn poll(times: u32, mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..times {
        if done() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    done()
}

/// SIGTERM to a running `knob create` stops the experiment and knob exits: NNI's dispatcher
/// must not stay behind as an orphan `python -m nni` reconnecting forever (the kernel's
/// parent-death signal ends it even when knob is killed outright).
#[cfg(target_os = "linux")]
#[test]
fn nni_s_dispatcher_dies_with_a_sigtermed_knob() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("tuner-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}, seed: 5}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, &python, 40, "2 0.5", &algorithms);
    let home = sandbox.path().join("home");
    let (mut knob_create, output) =
        spawn_create(sandbox.path(), &home, &config, "csigterm", &record_file);
    // The dispatcher's pid, once it handed out parameters (it is connected and working):
    // 3 minutes at most, for a cold start of nni on a loaded machine.
    let mut pid = None;
    let working = poll(1800, || {
        let events = record(&record_file);
        pid = events
            .iter()
            .find(|e| e["event"] == "space")
            .and_then(|e| e["pid"].as_u64());
        pid.is_some() && events.iter().any(|e| e["event"] == "generate")
            || knob_create.try_wait().unwrap().is_some()
    });
    let running = knob_create.try_wait().unwrap().is_none();
    if !working || !running {
        let _ = knob_create.kill();
        let _ = knob_create.wait();
        panic!(
            "the dispatcher never handed out parameters while knob ran\n{}",
            output()
        );
    }
    let pid = u32::try_from(pid.unwrap()).unwrap();
    assert!(
        !process_ended(pid),
        "the dispatcher {pid} is not running\n{}",
        output()
    );

    // SAFETY: a signal to our own child, which has not been reaped.
    unsafe { libc::kill(knob_create.id() as i32, libc::SIGTERM) };
    let knob_ended = poll(300, || knob_create.try_wait().unwrap().is_some());
    if !knob_ended {
        let _ = knob_create.kill();
        let _ = knob_create.wait();
    }
    let dispatcher_ended = poll(200, || process_ended(pid));
    if !dispatcher_ended {
        // SAFETY: kill with a pid and a signal number touches no memory.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    assert!(knob_ended, "knob create outlived SIGTERM\n{}", output());
    assert!(
        dispatcher_ended,
        "NNI's dispatcher {pid} outlived the SIGTERMed knob create\n{}",
        output()
    );
}

/// A tuner that thinks for minutes over each request (NNI's GP or Metis far into an
/// experiment) holds up nothing: its ids are deferred after a short wait and paid late, through
/// the waker, and the experiment completes; `knob stop` while it thinks stops the experiment at
/// once, where it used to wait for the tuner's answer (up to 10 minutes).
#[cfg(target_os = "linux")]
#[test]
fn a_slow_tuner_leaves_the_loop_free() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    // Paid late: every trial runs what the tuner handed out, under its own parameter id.
    let events = check_three_trials_run_what_was_paid(
        &python,
        "walk_tuner.WalkTuner",
        "seed: 2, think: 2",
        "cthink",
    );
    // Asked for no more than the budget: with 2 at a time, the ids it still thought about
    // used to be asked for a fourth set no trial could run.
    let asked = events.iter().filter(|e| e["event"] == "thinking").count();
    assert_eq!(asked, 3, "record: {events:#?}");

    // Stopped while the tuner thinks for two minutes.
    check_a_stop_does_not_wait(&python, "think: 120", "thinking", "generate", "cthinkstop");
}

/// A tuner whose constructor takes minutes (a user's tuner that loads a model, a cold start of
/// a big venv) holds up nothing either: knob does not wait for NNI's dispatcher to connect and
/// answer `IN`, its first ids are paid late, and `knob stop` meanwhile stops the experiment
/// and the dispatcher at once, where it used to wait for the constructor and the `ID` (18 s
/// against a constructor of 20 s, by hand).
#[cfg(target_os = "linux")]
#[test]
fn a_tuner_slow_to_construct_leaves_the_loop_free() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let events = check_three_trials_run_what_was_paid(
        &python,
        "walk_tuner.WalkTuner",
        "seed: 3, construct: 3",
        "cconstruct",
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| e["event"] == "constructing")
            .count(),
        1,
        "record: {events:#?}"
    );
    check_a_stop_does_not_wait(
        &python,
        "construct: 120",
        "constructing",
        "space",
        "cconstructstop",
    );
}

/// A search space updated while NNI's dispatcher is still starting: the `GE`s sent before the
/// `SS` are answered from the earlier space (NNI's dispatcher handles commands in order), and
/// those parameters are dropped with a warning rather than ending the experiment in ERROR
/// (`tunerErrorPolicy: error`, the default) as parameters outside the space used to: every
/// trial runs in the new space.
#[cfg(target_os = "linux")]
#[test]
fn a_space_updated_while_the_tuner_starts_holds_every_trial() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("tuner-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}, construct: 4}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, &python, 3, "1 0", &algorithms);
    let home = sandbox.path().join("home");
    let (mut knob_create, output) =
        spawn_create(sandbox.path(), &home, &config, "cspacestart", &record_file);
    // 3 minutes at most for a cold start of nni on a loaded machine.
    let constructing = poll(1800, || {
        record(&record_file)
            .iter()
            .any(|e| e["event"] == "constructing")
            || knob_create.try_wait().unwrap().is_some()
    });
    let new_space = sandbox.path().join("new-space.json");
    std::fs::write(
        &new_space,
        r#"{"x": {"_type": "uniform", "_value": [5, 6]}}"#,
    )
    .unwrap();
    let (code, _, update_err) = run(knob()
        .env("KNOB_HOME", &home)
        .args(["update", "searchspace", "cspacestart"])
        .arg(&new_space));
    let ended = poll(1800, || knob_create.try_wait().unwrap().is_some());
    if !ended {
        let _ = knob_create.kill();
        let _ = knob_create.wait();
    }
    assert!(constructing, "the tuner never started\n{}", output());
    assert_eq!(code, 0, "knob update: {update_err}\n{}", output());
    assert!(ended, "the experiment did not end\n{}", output());
    let export =
        export(&home, "cspacestart").unwrap_or_else(|e| panic!("export: {e}\n{}", output()));
    let context = format!("{export:#}\n{}", output());
    assert_eq!(export["experiment"]["status"], "DONE", "{context}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 3, "{context}");
    for trial in trials {
        let x = trial["parameters"]["x"].as_f64().unwrap();
        assert!((5.0..=6.0).contains(&x), "{context}");
    }
    // The first requests went out before the update: their parameters were dropped, saying so.
    let dropped = export
        .to_string()
        .matches("asked for before the search space was updated")
        .count();
    assert!(dropped >= 1, "{context}");
}

/// Runs `walk_tuner` with `class_args` as experiment `id` and `knob stop`s it once the tuner
/// records `waiting_event` (it then sleeps for minutes): the stop must end the experiment
/// (STOPPED, no trial) and the dispatcher before the tuner gets as far as `answer_event`.
#[cfg(target_os = "linux")]
fn check_a_stop_does_not_wait(
    python: &Path,
    class_args: &str,
    waiting_event: &str,
    answer_event: &str,
    id: &str,
) {
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("tuner-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  classArgs: {{record: {}, {class_args}}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, python, 3, "1 0", &algorithms);
    let home = sandbox.path().join("home");
    let (mut knob_create, output) = spawn_create(sandbox.path(), &home, &config, id, &record_file);
    // 3 minutes at most for a cold start of nni on a loaded machine.
    let waiting = poll(1800, || {
        record(&record_file)
            .iter()
            .any(|e| e["event"] == waiting_event)
            || knob_create.try_wait().unwrap().is_some()
    });
    if !waiting || knob_create.try_wait().unwrap().is_some() {
        let _ = knob_create.kill();
        let _ = knob_create.wait();
        panic!(
            "the tuner never recorded {waiting_event:?} while knob ran\n{}",
            output()
        );
    }
    let mut knob_stop = knob()
        .env("KNOB_HOME", &home)
        .args(["stop", id])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stopped = poll(1500, || {
        knob_stop.try_wait().unwrap().is_some() && knob_create.try_wait().unwrap().is_some()
    });
    // Whether the tuner got further before the experiment was over.
    let events = record(&record_file);
    let answered = events.iter().any(|e| e["event"] == answer_event);
    for child in [&mut knob_stop, &mut knob_create] {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        stopped,
        "knob stop did not end the experiment\n{}",
        output()
    );
    assert!(
        !answered,
        "the stop waited for the tuner's {answer_event:?}\n{}",
        output()
    );
    let pid = events.iter().find_map(|e| e["pid"].as_u64());
    let pid = u32::try_from(pid.expect("the tuner recorded its pid")).unwrap();
    let dispatcher_ended = poll(100, || process_ended(pid));
    if !dispatcher_ended {
        // SAFETY: kill with a pid and a signal number touches no memory.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    assert!(
        dispatcher_ended,
        "NNI's dispatcher {pid} outlived the stopped experiment\n{}",
        output()
    );
    let export = export(&home, id).unwrap_or_else(|e| panic!("export: {e}\n{}", output()));
    assert_eq!(export["experiment"]["status"], "STOPPED", "{}", output());
    assert_eq!(export["trials"], serde_json::json!([]), "{}", output());
}

/// A dispatcher that does not connect within `dispatcherConnectTimeout` (a tuner whose
/// constructor takes longer) ends the experiment in ERROR with one line that names the setting,
/// and is not left behind. The line does not add the exit status of knob's own kill.
#[cfg(target_os = "linux")]
#[test]
fn a_dispatcher_that_does_not_connect_in_time_ends_the_experiment_naming_the_setting() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let record_file = sandbox.path().join("tuner-record.jsonl");
    let algorithms = format!(
        "tuner:\n  className: walk_tuner.WalkTuner\n  codeDirectory: .\n  pythonInterpreter: {}\n  dispatcherConnectTimeout: 2s\n  classArgs: {{record: {}, construct: 120}}",
        python.display(),
        record_file.display()
    );
    let config = write_config(&code, &python, 3, "1 0", &algorithms);
    let (export, output) = create_and_export(sandbox.path(), &config, "cconnecttimeout");
    let context = format!("{export:#}\n{output}");
    assert_eq!(export["experiment"]["status"], "ERROR", "{context}");
    assert!(export["trials"].as_array().unwrap().is_empty(), "{context}");
    let message = export["experiment"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "NNI's dispatcher stopped (it did not connect within 2 s (dispatcherConnectTimeout))"
        ) && !message.contains("SIGKILL"),
        "{message}"
    );
    // The dispatcher had begun to construct the tuner (on a loaded machine Python and nni may
    // not get that far in 2 s) and is gone.
    for event in record(&record_file) {
        let pid = event["pid"].as_u64().unwrap();
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the dispatcher {pid} was left running"
        );
    }
}

/// NNI's GridSearch by name, run by NNI (`useNniImplementation: true`), once its grid is done:
/// the dispatcher answers `NO` and knob waits, as NNI does, saying why in one warning (the
/// wait's notice otherwise read as a tuner slow to start).
#[test]
fn an_nni_tuner_out_of_parameters_is_said_to_be_so() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let code = code_dir(sandbox.path());
    let algorithms = format!(
        "tuner:\n  name: GridSearch\n  useNniImplementation: true\n  pythonInterpreter: {}",
        python.display()
    );
    let config = write_config_with(
        &code,
        &python,
        "  x: {_type: choice, _value: [0.25, 0.5]}",
        4,
        "trial.py 1 0",
        &algorithms,
    );
    // The wait for more parameters ends with the experiment's time.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("maxExperimentDuration: 4m", "maxExperimentDuration: 15s");
    std::fs::write(&config, text).unwrap();
    let (export, output) = create_and_export(sandbox.path(), &config, "cgrid");
    let context = format!("{export:#}\n{output}");
    assert_eq!(export["trials"].as_array().unwrap().len(), 2, "{context}");
    let said: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("the tuner has no more parameters for now"))
        .collect();
    assert_eq!(said.len(), 1, "{context}");
    assert!(
        said[0].contains("NNI tuner GridSearch: the tuner has no more parameters for now")
            && said[0].contains("`knob stop` ends it now"),
        "{context}"
    );
}
