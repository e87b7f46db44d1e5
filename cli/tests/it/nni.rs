//! The real `nni` package from PyPI, unmodified `import nni` trials, through the real `knob`:
//! `examples/nni-mnist-like` runs once with nni 3.0 (which must take the v3 HTTP channel) and
//! once with nni 2.x (which must take the file channel: `parameter.cfg`, `.nni/metrics`).
//! knob offers every trial both channels; each nni picks its own.
//!
//! Slow (a pip-installed nni in a virtualenv, several seconds of `import nni` per trial), so
//! gated: `KNOB_TEST_NNI3_PYTHON` / `KNOB_TEST_NNI2_PYTHON` name the venv pythons, as
//! `.ci/nni-venvs.sh` prints them (`eval "$(.ci/nni-venvs.sh)"`). Unset: the test skips.
//!
//! The same scripts also run without nni, on knob's `nni` shim (`python/shim/nni.py`): with the
//! `python3` on PATH, which must not have nni, and with `nniShim: true` in the nni 3.0 venv.
//!
//! The trial command is `record_trial.py mnist_like.py`: it runs the example script unchanged
//! and writes `seen-<trial id>.json` with what nni handed the script, what the script
//! reported, and which channel nni used, to hold the export against.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::prerequisite;
use crate::{knob, repo_root, run};

/// How long one experiment may take before the test stops it (4 trials, 2 at a time; nni
/// 3.0's `import nni` alone takes seconds on a loaded 2-core machine).
const EXPERIMENT_DEADLINE: Duration = Duration::from_secs(300);
const TRIALS: usize = 4;
const EPOCHS: u64 = 10;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Channel {
    /// nni 3.0: `NNI_TRIAL_COMMAND_CHANNEL`, HTTP long-poll.
    V3Http,
    /// nni 2.x: `parameter.cfg` in, `.nni/metrics` out.
    File,
    /// knob's `nni` shim (`python/shim/nni.py`), on knob's own protocol: `$KNOB_PARAMETERS` in,
    /// `$KNOB_METRICS_FILE` out.
    KnobShim,
}

#[test]
fn nni_3_trials_use_the_v3_http_channel_and_their_metrics_reach_the_store() {
    if let Some(python) = prerequisite::NNI3_PYTHON.path() {
        check_nni_experiment(&python, Channel::V3Http, None);
    }
}

#[test]
fn nni_2_trials_use_the_file_channel_and_their_metrics_reach_the_store() {
    if let Some(python) = prerequisite::NNI2_PYTHON.path() {
        check_nni_experiment(&python, Channel::File, None);
    }
}

/// The same scripts with no nni installed: the `python3` on PATH, which must not have nni (the
/// test fails if it does, since it would then test nothing of the fallback).
#[test]
fn without_nni_installed_the_shim_runs_the_nni_trials_on_knobs_protocol() {
    let (code, _, stderr) = run(Command::new("python3").args([
        "-c",
        "import importlib.util, sys; sys.exit(importlib.util.find_spec('nni') is not None)",
    ]));
    assert_eq!(
        code, 0,
        "the python3 on PATH has nni installed; this test needs one without it\n{stderr}"
    );
    check_nni_experiment(Path::new("python3"), Channel::KnobShim, None);
}

/// `nniShim: true` gives the shim even to a Python that has the real nni.
#[test]
fn nni_shim_true_replaces_an_installed_nni() {
    if let Some(python) = prerequisite::NNI3_PYTHON.path() {
        check_nni_experiment(&python, Channel::KnobShim, Some(true));
    }
}

/// Two ranks of one trial (a torchrun or DDP job) each ask nni for the trial's parameters, and
/// a value holds a line separator: under nni 3.0 only the first rank got them (the other
/// None), and under both nni the record came apart at U+2028 ("Invalid control character").
#[test]
fn every_rank_of_an_nni_trial_gets_its_parameters_whatever_their_text() {
    for (python, id) in [
        (prerequisite::NNI3_PYTHON.path(), "ranks3"),
        (prerequisite::NNI2_PYTHON.path(), "ranks2"),
    ] {
        let Some(python) = python else { continue };
        let sandbox = tempfile::tempdir().unwrap();
        let code = sandbox.path().join("code");
        std::fs::create_dir_all(&code).unwrap();
        std::fs::write(
            code.join("rank.py"),
            "import nni, sys\n\
             p = nni.get_next_parameter()\n\
             if sys.argv[1] == '0':\n\
             \x20   nni.report_final_result(len(p['u']))\n\
             else:\n\
             \x20   open('rank1-' + p['u'], 'w').close()\n",
        )
        .unwrap();
        std::fs::write(
            code.join("config.yml"),
            format!(
                "searchSpace: {{\"u\": {{\"_type\": \"choice\", \"_value\": [\"line\\u2028sep\"]}}}}\n\
                 trialCommand: '{py} rank.py 1 & {py} rank.py 0 && wait $!'\n\
                 trialConcurrency: 1\nmaxTrialNumber: 1\n\
                 tuner: {{name: Random}}\ntrainingService: {{platform: local}}\n\
                 experimentWorkingDirectory: {}\n",
                sandbox.path().join("experiments").display(),
                py = python.display(),
            ),
        )
        .unwrap();
        let home = sandbox.path().join("home");
        let (status, stdout, stderr) = create_bounded(
            knob()
                .env("KNOB_HOME", &home)
                .arg("create")
                .arg("--config")
                .arg(code.join("config.yml"))
                .args(["--id", id]),
            sandbox.path(),
        );
        assert!(status.success(), "{id}: {status}\n{stdout}\n{stderr}");
        let (code_, export, stderr) = run(knob().env("KNOB_HOME", &home).args([
            "experiment",
            "export",
            id,
            "--format",
            "json",
        ]));
        assert_eq!(code_, 0, "{stderr}");
        let export: Value = serde_json::from_str(&export).unwrap();
        let trial = &export["trials"][0];
        assert_eq!(
            (&trial["status"], trial["final"].as_f64()),
            (&Value::from("SUCCEEDED"), Some(8.0)),
            "{id}: {trial:#}"
        );
        assert!(
            code.join("rank1-line\u{2028}sep").exists(),
            "{id}: the second rank got no parameters: {trial:#}"
        );
    }
}

/// `nni_shim`: the config's `nniShim`, left out when `None`.
fn check_nni_experiment(python: &Path, channel: Channel, nni_shim: Option<bool>) {
    let id = match (channel, nni_shim) {
        (Channel::V3Http, _) => "nni3",
        (Channel::File, _) => "nni2",
        (Channel::KnobShim, None) => "shim",
        (Channel::KnobShim, Some(_)) => "forcedshim",
    };
    let sandbox = tempfile::tempdir().unwrap();
    let config = write_experiment(sandbox.path(), python, nni_shim);
    let code_dir = config.parent().unwrap();
    let home = sandbox.path().join("home");

    let (status, stdout, stderr) = create_bounded(
        knob()
            .env("KNOB_HOME", &home)
            .arg("create")
            .arg("--config")
            .arg(&config)
            .args(["--id", id]),
        sandbox.path(),
    );
    assert!(
        status.success(),
        "knob create: {status}\n{stdout}\n{stderr}"
    );

    let (code, export, stderr) =
        run(knob()
            .env("KNOB_HOME", &home)
            .args(["experiment", "export", id, "--format", "json"]));
    assert_eq!(code, 0, "{stderr}");
    let export: Value = serde_json::from_str(&export).unwrap();
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), TRIALS, "{export:#}");

    for trial in trials {
        let trial_id = trial["id"].as_str().unwrap();
        assert_eq!(trial["status"], "SUCCEEDED", "{trial:#}");
        let seen_path = code_dir.join(format!("seen-{trial_id}.json"));
        let seen: Value = serde_json::from_str(
            &std::fs::read_to_string(&seen_path)
                .unwrap_or_else(|e| panic!("{}: {e}\n{trial:#}", seen_path.display())),
        )
        .unwrap();
        let context = format!("trial {trial_id}\nexport: {trial:#}\nseen: {seen:#}");

        // nni knows the trial as the store does.
        assert_eq!(seen["experiment_id"], id, "{context}");
        assert_eq!(seen["trial_id"], trial["id"], "{context}");
        assert_eq!(seen["sequence_id"], trial["sequence"], "{context}");

        // The parameters the store holds are the ones this trial's script received.
        assert_eq!(trial["parameters"], seen["parameters"], "{context}");
        assert!(trial["parameters"].is_object(), "{context}");

        // Ten epochs, in order, each the value the script reported; then the final, which the
        // script reports as its last accuracy.
        let intermediate = trial["intermediate"].as_array().unwrap();
        let sequences: Vec<u64> = intermediate
            .iter()
            .map(|m| m["sequence"].as_u64().unwrap())
            .collect();
        assert_eq!(sequences, (0..EPOCHS).collect::<Vec<_>>(), "{context}");
        let values: Vec<f64> = intermediate
            .iter()
            .map(|m| m["value"].as_f64().unwrap())
            .collect();
        assert_eq!(values, floats(&seen["intermediate"]), "{context}");
        assert_eq!(floats(&seen["final"]).len(), 1, "{context}");
        let last = *values.last().unwrap();
        assert_eq!(trial["final"].as_f64(), Some(last), "{context}");
        assert_eq!(floats(&seen["final"]), [last], "{context}");

        check_channel(channel, &seen, &values, &context);
    }
}

/// Which channel the trial's nni used, from both ends: nni's own objects, and the files.
fn check_channel(channel: Channel, seen: &Value, intermediate: &[f64], context: &str) {
    // knob offered both channels to every trial.
    let url = seen["env"]["NNI_TRIAL_COMMAND_CHANNEL"]
        .as_str()
        .unwrap_or_else(|| panic!("NNI_TRIAL_COMMAND_CHANNEL not set\n{context}"));
    assert!(url.starts_with("http://127.0.0.1:"), "{context}");
    assert_eq!(seen["parameter_cfg_offered"], true, "{context}");
    assert_eq!(seen["env"]["NNI_PLATFORM"], "local", "{context}");

    let version = seen["nni_version"].as_str().unwrap();
    let metrics_file = Path::new(seen["env"]["NNI_SYS_DIR"].as_str().unwrap()).join(".nni/metrics");
    let written = std::fs::read(&metrics_file).unwrap_or_default();
    match channel {
        Channel::V3Http => {
            assert!(version.starts_with("3."), "{context}");
            assert_eq!(
                seen["channel"], "nni.runtime.trial_command_channel.v3.TrialCommandChannelV3",
                "{context}"
            );
            assert!(
                written.is_empty(),
                "an nni 3 trial wrote {}: {}\n{context}",
                metrics_file.display(),
                String::from_utf8_lossy(&written)
            );
        }
        Channel::KnobShim => {
            assert_eq!(version, "knob-shim", "{context}");
            assert_eq!(seen["channel"], "knob shim", "{context}");
            assert!(written.is_empty(), "{context}");
            // Every epoch, then the final, as knob protocol lines in `$KNOB_METRICS_FILE`.
            let knob_metrics = std::fs::read_to_string(
                Path::new(seen["env"]["NNI_SYS_DIR"].as_str().unwrap()).join("metrics.knob"),
            )
            .unwrap();
            let lines: Vec<(&str, f64)> = knob_metrics
                .lines()
                .map(|line| {
                    let (kind, value) = line.split_once(' ').unwrap();
                    (kind, value.parse().unwrap())
                })
                .collect();
            let mut expected: Vec<(&str, f64)> = intermediate
                .iter()
                .map(|value| ("KNOB_INTERMEDIATE", *value))
                .collect();
            expected.push(("KNOB_FINAL", *intermediate.last().unwrap()));
            assert_eq!(lines, expected, "{context}");
        }
        Channel::File => {
            assert!(version.starts_with("2."), "{context}");
            assert_eq!(seen["channel"], "nni.runtime.platform.local", "{context}");
            // The file holds exactly what reached the store: every epoch, then the final.
            let records = nni_metric_records(&written, context);
            let mut expected: Vec<(String, u64, f64)> = intermediate
                .iter()
                .zip(0..)
                .map(|(value, sequence)| ("PERIODICAL".to_string(), sequence, *value))
                .collect();
            expected.push(("FINAL".to_string(), 0, *intermediate.last().unwrap()));
            assert_eq!(records, expected, "{context}");
        }
    }
}

/// `.nni/metrics` as nni 2.x writes it: `ME`, the byte length of the rest as 6 digits, a JSON
/// metric and `\n`; the metric's `value` is itself JSON text.
fn nni_metric_records(bytes: &[u8], context: &str) -> Vec<(String, u64, f64)> {
    nni_metric_frames(bytes, context)
        .into_iter()
        .map(|metric| {
            let value: f64 = serde_json::from_str(metric["value"].as_str().unwrap()).unwrap();
            (
                metric["type"].as_str().unwrap().to_string(),
                metric["sequence"].as_u64().unwrap(),
                value,
            )
        })
        .collect()
}

/// The records of nni 2.x's `.nni/metrics` file: `ME`, the JSON's length in 6 digits, the JSON.
/// Read by their lengths: a split at "ME" cut a record whose trial id holds those letters.
pub fn nni_metric_frames(mut bytes: &[u8], context: &str) -> Vec<Value> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        assert!(bytes.len() >= 8 && bytes.starts_with(b"ME"), "{context}");
        let length: usize = std::str::from_utf8(&bytes[2..8]).unwrap().parse().unwrap();
        let (record, rest) = bytes[8..].split_at(length);
        frames.push(serde_json::from_slice(record).unwrap());
        bytes = rest;
    }
    frames
}

fn floats(list: &Value) -> Vec<f64> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// Copies the example into `root/code` and writes its config with the recording wrapper as the
/// trial command, `TRIALS` trials, time limits, and experiments under `root`.
fn write_experiment(root: &Path, python: &Path, nni_shim: Option<bool>) -> PathBuf {
    let example = repo_root().join("examples/nni-mnist-like");
    let code = root.join("code");
    std::fs::create_dir_all(&code).unwrap();
    for file in ["mnist_like.py", "search_space.json"] {
        std::fs::copy(example.join(file), code.join(file)).unwrap();
    }
    std::fs::write(
        code.join("record_trial.py"),
        include_str!("nni/record_trial.py"),
    )
    .unwrap();

    let shell_quoted = format!("'{}'", python.display().to_string().replace('\'', r"'\''"));
    let command = format!("{shell_quoted} record_trial.py mnist_like.py");
    let original = std::fs::read_to_string(example.join("config.yml")).unwrap();
    let mut replaced = (false, false);
    let mut yaml: String = original
        .lines()
        .map(|line| {
            if line.starts_with("trialCommand:") {
                replaced.0 = true;
                // A JSON string is a YAML double-quoted scalar.
                format!("trialCommand: {}", Value::from(command.clone()))
            } else if line.starts_with("maxTrialNumber:") {
                replaced.1 = true;
                format!("maxTrialNumber: {TRIALS}")
            } else {
                line.to_string()
            }
        })
        .map(|line| line + "\n")
        .collect();
    assert_eq!(
        replaced,
        (true, true),
        "examples/nni-mnist-like/config.yml has no top-level trialCommand or maxTrialNumber:\n{original}"
    );
    yaml.push_str(&format!(
        "maxTrialDuration: 2m\nexperimentWorkingDirectory: {}\n",
        Value::from(root.join("experiments").display().to_string())
    ));
    if let Some(shim) = nni_shim {
        yaml.push_str(&format!("nniShim: {shim}\n"));
    }
    let config = code.join("config.yml");
    std::fs::write(&config, yaml).unwrap();
    config
}

/// Runs `knob create` to its end, at most [`EXPERIMENT_DEADLINE`]: past it, Ctrl-C (knob stops
/// its trials), then a kill; the test fails with what knob printed.
pub(crate) fn create_bounded(command: &mut Command, dir: &Path) -> (ExitStatus, String, String) {
    let (stdout_path, stderr_path) = (dir.join("create.stdout"), dir.join("create.stderr"));
    let mut child = command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("cannot run knob");
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    match wait_until(&mut child, Instant::now() + EXPERIMENT_DEADLINE) {
        Some(status) => (status, read(&stdout_path), read(&stderr_path)),
        None => {
            // SAFETY: a signal to our own child, which has not been reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            if wait_until(&mut child, Instant::now() + Duration::from_secs(30)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            panic!(
                "knob create still running after {EXPERIMENT_DEADLINE:?}; stopped\n{}\n{}",
                read(&stdout_path),
                read(&stderr_path)
            );
        }
    }
}

fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
