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
