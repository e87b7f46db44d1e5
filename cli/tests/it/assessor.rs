//! Early stopping end to end: `knob create` with the built-in Medianstop assessor (loaded from
//! `libknob_assessors.so` beside the binary), real trial processes reporting intermediate
//! results over knob's stdout protocol, then what `trial ls` and the export recorded.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::{knob, run};

/// A temp home (registry) and working directory for experiments, per test (as in `create.rs`).
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn knob(&self) -> Command {
        let mut command = knob();
        command.env("KNOB_HOME", self.path().join("home"));
        command
    }

    /// Writes `config.yml` (with experimentWorkingDirectory in the sandbox) and `files`.
    fn config(&self, yaml: &str, files: &[(&str, &str)]) -> PathBuf {
        let code = self.path().join("code");
        std::fs::create_dir_all(&code).unwrap();
        for (name, text) in files {
            std::fs::write(code.join(name), text).unwrap();
        }
        let path = code.join("config.yml");
        let yaml = format!(
            "{yaml}\nexperimentWorkingDirectory: {}\n",
            self.path().join("experiments").display()
        );
        std::fs::write(&path, yaml).unwrap();
        path
    }
}

/// 20 results rising towards the trial's `quality` (q·(1 − 2^−step)), 0.1 s apart, so that a
/// stop verdict at step 5 arrives while the trial still has 1.5 s to run.
const TRIAL: &str = r#"import json, os, time
quality = json.loads(os.environ["KNOB_PARAMETERS"])["quality"]
for step in range(1, 21):
    print(f"KNOB_INTERMEDIATE {quality * (1 - 0.5 ** step)}", flush=True)
    time.sleep(0.1)
print(f"KNOB_FINAL {quality}", flush=True)
"#;

/// Grid order, two at a time: the first two (good) trials complete and set the medians; the
/// bad ones are far below them from step 5 on. The good ones are within 5 % of each other, so
/// that however late one runs beside another (a loaded machine starts Python late), its best
/// at step S, q(1 − 2^−S), stays above a completed better one's running average there,
/// q'(1 − (1 − 2^−S)/S), which reaches 0.95 q' at step 20: 0.8 beside 0.9 was stopped near
/// step 10 when it started a second late.
const CONFIG: &str = r#"trialCommand: python3 trial.py
trialConcurrency: 2
maxTrialNumber: 6
searchSpace:
  quality: {_type: choice, _value: [0.9, 0.88, 0.1, 0.2, 0.87, 0.15]}
tuner:
  name: GridSearch
assessor:
  name: Medianstop
  classArgs: {optimize_mode: maximize, start_step: 5}
trainingService:
  platform: local"#;

#[test]
fn medianstop_stops_the_bad_trials_with_a_reason_and_lets_the_good_ones_finish() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(CONFIG, &[("trial.py", TRIAL)]);
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "median"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("6 trials (3 succeeded, 0 failed, 3 early-stopped)"),
        "{stdout}"
    );

    let (code, export, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "export", "median", "--format", "json"]));
    assert_eq!(code, 0, "{stderr}");
    let export: Value = serde_json::from_str(&export).unwrap();
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 6, "{export}");
    for trial in trials {
        let quality = trial["parameters"]["quality"].as_f64().unwrap();
        let reported = trial["intermediate"].as_array().unwrap().len();
        if quality > 0.5 {
            assert_eq!(trial["status"], "SUCCEEDED", "{trial}");
            assert_eq!(reported, 20, "{trial}");
            assert_eq!(trial["final"], quality, "{trial}");
        } else {
            assert_eq!(trial["status"], "EARLY_STOPPED", "{trial}");
            assert!(reported < 20, "stopped before its end: {trial}");
            assert_eq!(trial["final"], Value::Null, "{trial}");
            // "step 5: best 0.09688 below median 0.645 of 2 completed trials": at start_step,
            // against the medians of the good trials that had completed by then.
            let message = trial["message"].as_str().unwrap_or_default();
            assert!(
                message.starts_with("step 5: best ")
                    && message.contains(" below median ")
                    && message.contains(" completed trial"),
                "{trial}"
            );
        }
    }

    let (code, listing, stderr) =
        run(sandbox
            .knob()
            .args(["trial", "ls", "median", "--status", "early_stopped"]));
    assert_eq!(code, 0, "{stderr}");
    let rows: Vec<&str> = listing.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{listing}");
    for row in rows {
        assert!(
            row.contains("EARLY_STOPPED")
                && row.contains("step 5: best ")
                && row.contains("below median"),
            "{listing}"
        );
    }
}

/// Each trial reports its `curve`, then its `final`.
const CURVE_TRIAL: &str = r#"import json, os
p = json.loads(os.environ["KNOB_PARAMETERS"])
for value in p["curve"]:
    print("KNOB_INTERMEDIATE", value, flush=True)
print("KNOB_FINAL", p["final"], flush=True)
"#;

/// One trial at a time, in order: the first reports `-Infinity` once (a loss that underflowed),
/// then numbers; the others are better at every step.
const INFINITE_FIRST: &str = r#"trialCommand: python3 trial.py
trialConcurrency: 1
maxTrialNumber: 4
searchSpace:
  combine_params:
    _type: choice
    _value:
      - {curve: ["-Infinity", 0.5, 0.4, 0.3], final: 0.3}
      - {curve: [0.2, 0.1, 0.05, 0.01], final: 0.01}
      - {curve: [0.2, 0.1, 0.05, 0.011], final: 0.011}
      - {curve: [0.2, 0.1, 0.05, 0.012], final: 0.012}
tuner:
  name: Batch
assessor:
  name: Medianstop
  classArgs: {optimize_mode: minimize}
trainingService:
  platform: local"#;

/// An infinite intermediate result is no result (README), as NaN is: it pinned Medianstop's
/// median at `-inf` at its step, and every later trial, better at every step, was stopped there.
#[test]
fn an_infinite_intermediate_result_is_no_result_to_the_assessor() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(INFINITE_FIRST, &[("trial.py", CURVE_TRIAL)]);
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "infinite"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("4 trials (4 succeeded, 0 failed)") && !stdout.contains("early-stopped"),
        "{stdout}"
    );
}

/// ASHA (rungs at steps 1, 2, 4, the top half goes on) over four trials whose results arrive in
/// an order the test sets: each result waits for its file `go-NAME-STEP`.
const ASHA_TRIAL: &str = r#"import json, os, time
name = json.loads(os.environ["KNOB_PARAMETERS"])["name"]
values = {"A": [0.1, 0.2, 0.3, 0.9], "B": [0.5], "C": [0.6], "D": [0.95, 0.1, 0.1, 0.1]}[name]
for step, value in enumerate(values, 1):
    for _ in range(1200):
        if os.path.exists(f"go-{name}-{step}"):
            break
        time.sleep(0.05)
    print(f"KNOB_INTERMEDIATE {value}", flush=True)
print(f"KNOB_FINAL {values[-1]}", flush=True)
"#;

const ASHA_CONFIG: &str = r#"trialCommand: python3 trial.py
trialConcurrency: 3
maxTrialNumber: 4
searchSpace:
  name: {_type: choice, _value: [A, B, C, D]}
tuner:
  name: GridSearch
assessor:
  name: ASHA
  classArgs: {optimize_mode: maximize, reduction_factor: 2, min_resource: 1}
trainingService:
  platform: local"#;

/// Runs [`ASHA_CONFIG`]: A is first at rung 1 (0.1, alone there, it goes on), then B (0.5) and
/// C (0.6) get there in turn, each the best so far, and end, then A reports 0.2 (rung 2), 0.3, 0.9 (rung 4) and ends; D then
/// reports 0.95 (rung 1, it goes on) and 0.1, below A's 0.2 at rung 2. With `stop_after_a`,
/// the experiment is stopped once A ended (D not yet past step 0) and resumed. D's status and
/// message. D is let past steps 1 and 2 only: the verdict at step 2 is not waited for, and D let
/// run to its end had ended SUCCEEDED before the verdict on a loaded machine; held at step 3,
/// it ends only by the verdict (or, were there none, after 2 × 60 s, past the test's wait).
fn asha_trial_d(stop_after_a: bool) -> (String, String) {
    let sandbox = crate::create::Sandbox::new();
    let config = sandbox.config(ASHA_CONFIG, &[("trial.py", ASHA_TRIAL)]);
    let code = sandbox.path().join("code");
    let go = |gates: &[&str]| {
        for gate in gates {
            std::fs::write(code.join(format!("go-{gate}")), "").unwrap();
        }
    };
    let trial = |export: &Value, name: &str| {
        export["trials"]
            .as_array()?
            .iter()
            .find(|t| t["parameters"]["name"] == name)
            .cloned()
    };
    // Waits (bounded) until the export shows `name` with `results` intermediate results and
    // `status` (an export before the experiment is registered fails: it waits on).
    let wait_for = |name: &str, results: usize, status: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let (_, stdout, _) =
                run(sandbox
                    .knob()
                    .args(["experiment", "export", "asha", "--format", "json"]));
            let export: Value = serde_json::from_str(&stdout).unwrap_or_default();
            if trial(&export, name).is_some_and(|t| {
                t["intermediate"].as_array().map_or(0, Vec::len) == results && t["status"] == status
            }) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "trial {name} never had {results} results and {status}: {export}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let mut child = sandbox
        .create_command(&config, "asha")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    go(&["A-1"]);
    wait_for("A", 1, "RUNNING");
    go(&["B-1"]);
    wait_for("B", 1, "SUCCEEDED");
    go(&["C-1"]);
    wait_for("C", 1, "SUCCEEDED");
    go(&["A-2", "A-3", "A-4"]);
    wait_for("A", 4, "SUCCEEDED");
    if stop_after_a {
        let (status, stdout, stderr) = run(sandbox.knob().args(["stop", "asha"]));
        assert_eq!(status, 0, "{stdout}\n{stderr}");
        let exit = crate::resume::wait_bounded(&mut child, std::time::Duration::from_secs(30));
        assert_eq!(exit, Some(0));
        go(&["D-1", "D-2"]);
        let (status, stdout, stderr) = run(sandbox.knob().args(["resume", "asha"]));
        assert_eq!(status, 0, "{stdout}\n{stderr}");
    } else {
        go(&["D-1", "D-2"]);
        let exit = crate::resume::wait_bounded(&mut child, std::time::Duration::from_secs(60));
        assert_eq!(exit, Some(0));
    }
    let export = sandbox.export("asha");
    let d = trial(&export, "D").unwrap_or_else(|| panic!("no trial D: {export}"));
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (text(&d["status"]), text(&d["message"]))
}

/// `knob stop` and `knob resume` leave ASHA's rungs as they were: the resumed assessor stops D
/// as the uninterrupted one does. (Its rungs were rebuilt from whole histories in the order the
/// trials ended: A, behind B and C at rung 1 though it got there first, was "stopped" there,
/// its results at rungs 2 and 4 were lost, and D ran to its end.)
#[test]
fn asha_decides_the_same_after_a_stop_and_resume_as_without() {
    let expected = (
        "EARLY_STOPPED".to_string(),
        "step 2: 0.1 below 0.2, the best of 2 results at this rung (top 1/2 go on)".to_string(),
    );
    assert_eq!(asha_trial_d(false), expected, "uninterrupted");
    assert_eq!(asha_trial_d(true), expected, "stopped and resumed");
}
