//! Hyperband end to end: `knob create` hands trials NNI's string parameter ids and growing
//! `TRIAL_BUDGET`s, the experiment finishes, `knob resume` continues the brackets, and an
//! unmodified `import nni` 3.0 trial gets its string id and budget and has its metrics recorded.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::create::Sandbox;
use crate::prerequisite::{self, Prerequisite};
use crate::run;

/// R=3, eta=3, serial: bracket 0-1 runs three configurations at budget 1, then the best at 3;
/// bracket 0-0 runs two at 3. Six trials in all, budgets never going down.
const HYPERBAND: &str = r#"searchSpace:
  x: {_type: uniform, _value: [0, 1]}
tuner:
  name: Hyperband
  classArgs: {R: 3, eta: 3, exec_mode: serial, optimize_mode: maximize, seed: 5}
trainingService:
  platform: local"#;

/// A knob-protocol trial that reads NNI's `parameter.cfg` (written for every trial) and records
/// the parameter id and budget it found, then trains for `TRIAL_BUDGET` epochs.
const TRIAL: &str = r#"import json, os
with open(os.path.join(os.environ["NNI_SYS_DIR"], "parameter.cfg")) as f:
    record = json.loads(f.readline())
p = record["parameters"]
budget = p["TRIAL_BUDGET"]
for epoch in range(budget):
    print("KNOB_INTERMEDIATE", p["x"] * (epoch + 1) / budget, flush=True)
with open("seen-%s.json" % os.environ["NNI_TRIAL_JOB_ID"], "w") as out:
    json.dump({"parameter_id": record["parameter_id"], "budget": budget, "x": p["x"]}, out)
print("KNOB_FINAL", p["x"])
"#;

/// What each trial recorded, by trial id.
fn seen(code_dir: &Path) -> BTreeMap<String, Value> {
    std::fs::read_dir(code_dir)
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let trial = name
                .strip_prefix("seen-")?
                .strip_suffix(".json")?
                .to_string();
            let text = std::fs::read_to_string(entry.path()).ok()?;
            Some((trial, serde_json::from_str(&text).unwrap()))
        })
        .collect()
}

/// `label@budget` of each trial in sequence order, with promoted configurations' numbers as `k`.
fn schedule(export: &Value, seen: &BTreeMap<String, Value>) -> Vec<String> {
    export["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|trial| {
            let id = trial["id"].as_str().unwrap();
            let record = seen
                .get(id)
                .unwrap_or_else(|| panic!("trial {id} recorded nothing: {trial:#}"));
            let label = record["parameter_id"]
                .as_str()
                .unwrap_or_else(|| panic!("{record}"));
            // The store recorded the id the trial saw.
            assert_eq!(trial["parameter_label"], label, "{trial:#}");
            assert_eq!(
                trial["parameters"]["TRIAL_BUDGET"], record["budget"],
                "{trial:#}"
            );
            assert_eq!(trial["status"], "SUCCEEDED", "{trial:#}");
            assert_eq!(trial["final"], record["x"], "{trial:#}");
            let (prefix, k) = label.rsplit_once('_').unwrap();
            let k = if prefix.ends_with("_0") { k } else { "k" };
            format!("{prefix}_{k}@{}", record["budget"])
        })
        .collect()
}

#[test]
fn hyperband_trials_get_nni_ids_and_growing_budgets_and_the_experiment_finishes() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: python3 trial.py\ntrialConcurrency: 2\nmaxTrialNumber: 6\n{HYPERBAND}"
    );
    let config = sandbox.config(&yaml, &[("trial.py", TRIAL)]);
    let (code, stdout, stderr) = sandbox.create(&config, "hb");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("hb");
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    let seen = seen(config.parent().unwrap());
    assert_eq!(
        schedule(&export, &seen),
        [
            "0-1_0_0@1",
            "0-1_0_1@1",
            "0-1_0_2@1",
            "0-1_1_k@3",
            "0-0_0_3@3",
            "0-0_0_4@3"
        ]
    );
    // The promoted configuration is the best of round 0 (maximize), run again at budget 3.
    let trials = export["trials"].as_array().unwrap();
    let best_first = trials[..3]
        .iter()
        .max_by(|a, b| {
            a["final"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["final"].as_f64().unwrap())
        })
        .unwrap();
    assert_eq!(trials[3]["parameters"]["x"], best_first["parameters"]["x"]);
    // Each trial trained for its budget: one intermediate result per epoch.
    for trial in trials {
        let budget = trial["parameters"]["TRIAL_BUDGET"].as_u64().unwrap();
        assert_eq!(
            trial["intermediate"].as_array().unwrap().len() as u64,
            budget,
            "{trial:#}"
        );
    }
}

#[test]
fn a_resumed_hyperband_experiment_continues_its_brackets() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: python3 trial.py\ntrialConcurrency: 1\nmaxTrialNumber: 4\n{HYPERBAND}"
    );
    let config = sandbox.config(&yaml, &[("trial.py", TRIAL)]);
    let (code, stdout, stderr) = sandbox.create(&config, "hbr");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["resume", "hbr", "--max-trial-number", "6"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("hbr");
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    let seen = seen(config.parent().unwrap());
    // Bracket 0-1 finished before the stop; the resumed tuner opens 0-0, as the uninterrupted
    // run would, rather than starting over.
    assert_eq!(
        schedule(&export, &seen),
        [
            "0-1_0_0@1",
            "0-1_0_1@1",
            "0-1_0_2@1",
            "0-1_1_k@3",
            "0-0_0_3@3",
            "0-0_0_4@3"
        ]
    );
}

#[test]
fn hyperband_survives_a_sigkill_of_the_manager_mid_bracket() {
    let sandbox = Sandbox::new();
    // Trials say when they start, then train for a while (0.3 s per budget unit).
    let trial = TRIAL.replace(
        "for epoch in range(budget):",
        "import time\nopen(\"started-%d\" % budget, \"a\").close()\ntime.sleep(0.3 * budget)\nfor epoch in range(budget):",
    );
    let yaml = format!(
        "trialCommand: python3 trial.py\ntrialConcurrency: 2\nmaxTrialNumber: 6\n{HYPERBAND}"
    );
    let config = sandbox.config(&yaml, &[("trial.py", &trial)]);
    let code_dir = config.parent().unwrap().to_path_buf();
    let mut child = sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "hbk"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill as soon as a trial at budget 3 runs: round 0 of the first bracket is done, round 1
    // (and maybe the next bracket) under way.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !code_dir.join("started-3").exists() {
        assert!(
            Instant::now() < deadline,
            "the experiment did not get going"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let (code, stdout, stderr) = run(sandbox.knob().args(["resume", "hbk"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("hbk");
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    // The trial running at the kill ran again, and the same trials ran as in an uninterrupted
    // run: the resumed tuner knew which were running and took their results under their old ids.
    let trials = export["trials"].as_array().unwrap();
    assert!(
        trials.iter().any(|t| t["attempts"].as_u64() > Some(1)),
        "no trial was running at the kill: {export:#}"
    );
    assert_eq!(
        schedule(&export, &seen(&code_dir)),
        [
            "0-1_0_0@1",
            "0-1_0_1@1",
            "0-1_0_2@1",
            "0-1_1_k@3",
            "0-0_0_3@3",
            "0-0_0_4@3"
        ]
    );
}

/// An unmodified `import nni` 3.0 trial under Hyperband (gated like `nni.rs`): it talks over the
/// v3 HTTP channel.
#[test]
fn an_nni_3_trial_gets_its_string_id_and_budget_and_its_metrics_are_recorded() {
    check_nni_under_hyperband(&prerequisite::NNI3_PYTHON);
}

/// The same with nni 2.x, which reads `parameter.cfg` and writes `.nni/metrics`, where its
/// records carry the string id back.
#[test]
fn an_nni_2_trial_gets_its_string_id_and_budget_and_its_metrics_are_recorded() {
    check_nni_under_hyperband(&prerequisite::NNI2_PYTHON);
}

fn check_nni_under_hyperband(nni_python: &Prerequisite) {
    let Some(python) = nni_python.path() else {
        return;
    };
    let script = r#"import json, os
import nni
import nni.trial
p = nni.get_next_parameter()
for epoch in range(p["TRIAL_BUDGET"]):
    nni.report_intermediate_result(p["x"] * (epoch + 1))
nni.report_final_result(p["x"])
with open("seen-%s.json" % nni.get_trial_id(), "w") as out:
    json.dump({"parameter_id": nni.trial._params["parameter_id"], "budget": p["TRIAL_BUDGET"],
               "x": p["x"], "version": nni.__version__, "sys_dir": os.environ["NNI_SYS_DIR"]}, out)
"#;
    let python = Path::new(&python)
        .display()
        .to_string()
        .replace('\'', r"'\''");
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: \"'{python}' trial.py\"\ntrialConcurrency: 2\nmaxTrialNumber: 4\nmaxTrialDuration: 2m\n{HYPERBAND}"
    );
    let config = sandbox.config(&yaml, &[("trial.py", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "nnihb");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("nnihb");
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    let seen = seen(config.parent().unwrap());
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "{export:#}");
    for trial in trials {
        let record = &seen[trial["id"].as_str().unwrap()];
        let metrics = Path::new(record["sys_dir"].as_str().unwrap()).join(".nni/metrics");
        let written = std::fs::read_to_string(&metrics).unwrap_or_default();
        if record["version"].as_str().unwrap().starts_with('2') {
            // nni 2.x sent each metric back with the string id: `ME` + length + JSON.
            let ids: Vec<Value> = crate::nni::nni_metric_frames(written.as_bytes(), &written)
                .into_iter()
                .map(|metric| metric["parameter_id"].clone())
                .collect();
            assert!(!ids.is_empty(), "{record}");
            assert!(
                ids.iter().all(|id| *id == record["parameter_id"]),
                "{ids:?} {record}"
            );
        } else {
            // nni 3 talks over the v3 channel and writes no metrics file.
            assert!(written.is_empty(), "{written}");
        }
        let budget = trial["parameters"]["TRIAL_BUDGET"].as_u64().unwrap();
        // Every epoch's metric reached the store, sent with the string id.
        let intermediate: Vec<f64> = trial["intermediate"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["value"].as_f64().unwrap())
            .collect();
        let x = record["x"].as_f64().unwrap();
        assert_eq!(
            intermediate,
            (1..=budget).map(|e| x * e as f64).collect::<Vec<_>>(),
            "{trial:#}"
        );
        assert_eq!(trial["final"].as_f64(), Some(x), "{trial:#}");
    }
    assert_eq!(
        schedule(&export, &seen),
        ["0-1_0_0@1", "0-1_0_1@1", "0-1_0_2@1", "0-1_1_k@3"]
    );
}
