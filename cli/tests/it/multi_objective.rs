//! Multi-objective experiments end to end (issue 15): `objectives` in the config, dict finals
//! through knob's protocol and through a real nni's `report_final_result(dict)`, constraints,
//! the `pareto` field of the export, `knob experiment pareto`, a trial whose final lacks a
//! listed metric, and a single-objective tuner refused.

use std::path::Path;

use serde_json::Value;

use crate::create::Sandbox;
use crate::prerequisite;
use crate::run;

/// Two objectives (accuracy up, latency down, traded off by x) and a constraint (memory_over
/// <= 0, violated for y > 0.7).
const OBJECTIVES: &str = r#"searchSpace:
  x: {_type: uniform, _value: [0, 1]}
  y: {_type: uniform, _value: [0, 1]}
objectives:
  - {metric: accuracy, mode: maximize}
  - {metric: latency_ms, mode: minimize}
  - {metric: memory_over, constraint: "<= 0"}
trainingService:
  platform: local"#;

const KNOB_TRIAL: &str = r#"import json, os
p = json.loads(os.environ["KNOB_PARAMETERS"]) if "KNOB_PARAMETERS" in os.environ else None
if p is None:
    with open(os.path.join(os.environ["NNI_SYS_DIR"], "parameter.cfg")) as f:
        p = json.loads(f.readline())["parameters"]
x, y = p["x"], p["y"]
result = {"accuracy": x * (1 - 0.3 * y), "latency_ms": 10 + 90 * x * x + 20 * y, "memory_over": y - 0.7}
print("KNOB_FINAL", json.dumps(result))
"#;

fn values(trial: &Value) -> Option<(f64, f64, f64)> {
    let raw: Value = serde_json::from_str(trial["final_raw"].as_str()?).ok()?;
    Some((
        raw["accuracy"].as_f64()?,
        raw["latency_ms"].as_f64()?,
        raw["memory_over"].as_f64()?,
    ))
}

/// Checks the export's `pareto` field against the definition: feasible, and no feasible trial
/// at least as good in both objectives and better in one. Returns the front's trial ids.
fn check_front(export: &Value) -> Vec<String> {
    let trials = export["trials"].as_array().unwrap();
    let feasible: Vec<(&str, (f64, f64, f64))> = trials
        .iter()
        .filter(|t| t["status"] == "SUCCEEDED")
        .filter_map(|t| Some((t["id"].as_str()?, values(t)?)))
        .filter(|(_, v)| v.2 <= 0.0)
        .collect();
    let mut front = Vec::new();
    for trial in trials {
        let id = trial["id"].as_str().unwrap();
        let expected = feasible
            .iter()
            .find(|(f, _)| *f == id)
            .is_some_and(|(_, v)| {
                !feasible
                    .iter()
                    .any(|(_, w)| w.0 >= v.0 && w.1 <= v.1 && (w.0 > v.0 || w.1 < v.1))
            });
        assert_eq!(trial["pareto"], expected, "{trial:#}");
        if expected {
            front.push(id.to_string());
        }
    }
    front
}

#[test]
fn a_two_objective_experiment_with_a_constraint_has_a_pareto_front() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: python3 trial.py\ntrialConcurrency: 2\nmaxTrialNumber: 12\ntuner:\n  name: NSGA2\n  classArgs: {{seed: 1, population_size: 4}}\n{OBJECTIVES}"
    );
    let config = sandbox.config(&yaml, &[("trial.py", KNOB_TRIAL)]);
    let (code, stdout, stderr) = sandbox.create(&config, "mo");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("mo");
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 12);
    assert!(
        trials.iter().all(|t| t["status"] == "SUCCEEDED"),
        "{export:#}"
    );
    let front = check_front(&export);
    assert!(!front.is_empty(), "{export:#}");
    // The table lists exactly the front, best accuracy first, each metric in a column.
    let (code, table, stderr) = run(sandbox.knob().args(["experiment", "pareto", "mo"]));
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "trial",
            "accuracy",
            "(maximize)",
            "latency_ms",
            "(minimize)",
            "memory_over",
            "(<=",
            "0)"
        ]
    );
    let mut listed: Vec<String> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    let accuracies: Vec<f64> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(accuracies.windows(2).all(|w| w[0] >= w[1]), "{table}");
    listed.sort();
    let mut expected = front.clone();
    expected.sort();
    assert_eq!(listed, expected, "{table}");
    // --all shows every trial, infeasible ones marked.
    let (code, all, _) = run(sandbox.knob().args(["experiment", "pareto", "mo", "--all"]));
    assert_eq!(code, 0);
    assert_eq!(all.lines().count(), 13, "{all}");
    for trial in trials {
        let (_, _, memory_over) = values(trial).unwrap();
        let line = all
            .lines()
            .find(|l| l.starts_with(trial["id"].as_str().unwrap()))
            .unwrap();
        let feasible = line.split_whitespace().rev().nth(1).unwrap();
        assert_eq!(feasible == "yes", memory_over <= 0.0, "{line}");
    }
    // The CSV has each metric of the final dict as a number, and the front, as the JSON has.
    let (code, csv, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "export", "mo", "--format", "csv"]));
    assert_eq!(code, 0, "{stderr}");
    let (header, rows) = crate::csv_table(&csv);
    let column = |name: &str| {
        header
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("no column {name}: {header:?}"))
    };
    let (id, pareto, accuracy, latency, memory_over) = (
        column("trial_id"),
        column("pareto"),
        column("final:accuracy"),
        column("final:latency_ms"),
        column("final:memory_over"),
    );
    let mut rows_seen = 0;
    for row in rows {
        let trial = trials.iter().find(|t| t["id"] == row[id]).unwrap();
        let (a, l, m) = values(trial).unwrap();
        let number = |i: usize| row[i].parse::<f64>().unwrap();
        assert_eq!(
            (number(accuracy), number(latency), number(memory_over)),
            (a, l, m)
        );
        assert_eq!(
            row[pareto] == "true",
            front.contains(&row[id].to_string()),
            "{csv}"
        );
        rows_seen += 1;
    }
    assert_eq!(rows_seen, 12, "{csv}");
}

#[test]
fn a_final_without_a_listed_metric_fails_the_trial_naming_it() {
    let sandbox = Sandbox::new();
    let trial = r#"print('KNOB_FINAL {"accuracy": 0.5, "memory_over": -1}')"#;
    let yaml = format!(
        "trialCommand: python3 trial.py\ntrialConcurrency: 1\nmaxTrialNumber: 2\nmaxTrialRetries: 2\ntuner:\n  name: Random\n  classArgs: {{seed: 1}}\n{OBJECTIVES}"
    );
    let config = sandbox.config(&yaml, &[("trial.py", trial)]);
    let (code, stdout, stderr) = sandbox.create(&config, "missing");
    // `knob create` says no trial gave a usable result, and exits non-zero for it.
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("2 trials (0 succeeded, 2 failed)"),
        "{stdout}\n{stderr}"
    );
    let export = sandbox.export("missing");
    for trial in export["trials"].as_array().unwrap() {
        assert_eq!(trial["status"], "FAILED", "{trial:#}");
        // Not retried: the script would report the same dict again.
        assert_eq!(trial["attempts"], 1, "{trial:#}");
        let message = trial["message"].as_str().unwrap();
        assert!(
            message.starts_with(r#"final result has no "latency_ms" entry (objectives lists accuracy, latency_ms, memory_over)"#),
            "{message}"
        );
        assert_eq!(trial["pareto"], false);
    }
}

#[test]
fn a_single_objective_tuner_refuses_a_multi_objective_experiment_in_one_line() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: python3 trial.py\ntrialConcurrency: 1\ntuner:\n  name: Anneal\n{OBJECTIVES}"
    );
    let config = sandbox.config(&yaml, &[("trial.py", KNOB_TRIAL)]);
    let (code, stdout, stderr) = sandbox.create(&config, "anneal");
    assert_ne!(code, 0, "{stdout}");
    assert!(
        stderr.contains("tuner.name: tuner Anneal optimises a single objective, and objectives lists 2 objectives and 1 constraint; use NSGA2, TPE or Random, or a tuner that takes objectives"),
        "{stderr}"
    );
    // Bad objectives: each problem on its own line, at its field.
    let bad = r#"searchSpace: {x: {_type: uniform, _value: [0, 1]}}
objectives:
  - {metric: accuracy}
  - {metric: accuracy, mode: up}
  - {metric: mem, constraint: "< 0", mode: minimize}
trainingService: {platform: local}"#;
    let yaml = format!(
        "trialCommand: python3 trial.py\ntrialConcurrency: 1\ntuner: {{name: Random}}\n{bad}"
    );
    let config = sandbox.config(&yaml, &[]);
    let (code, _, stderr) = run(sandbox.knob().args(["config", "check"]).arg(&config));
    assert_ne!(code, 0);
    for expected in [
        "objectives[0].mode: required: maximize or minimize",
        r#"objectives[1].mode: expected one of "maximize", "minimize", got"#,
        r#"objectives[1].metric: "accuracy" is listed twice"#,
        r#"objectives[2].constraint: constraint "< 0" must be "<= NUMBER" or ">= NUMBER""#,
        "objectives[2].mode: a constraint has no mode",
    ] {
        assert!(stderr.contains(expected), "{expected}\n{stderr}");
    }
}

/// When no trial meets the constraints, the run's summary and `knob experiment pareto` say so
/// with the experiment's own id (the summary said `<id>`; `pareto` printed a header alone).
#[test]
fn an_experiment_where_no_trial_meets_the_constraints_says_so_with_its_id() {
    let sandbox = Sandbox::new();
    let infeasible = OBJECTIVES.replace(r#"constraint: "<= 0""#, r#"constraint: "<= -1""#);
    let yaml = format!(
        "trialCommand: python3 trial.py\ntrialConcurrency: 2\nmaxTrialNumber: 3\ntuner: {{name: NSGA2}}\n{infeasible}"
    );
    let config = sandbox.config(&yaml, &[("trial.py", KNOB_TRIAL)]);
    let (_, stdout, stderr) = sandbox.create(&config, "nofront");
    assert!(
        stdout.contains("no trial met every constraint (3 broke one: `knob experiment pareto nofront --all` lists them)"),
        "{stdout}\n{stderr}"
    );
    let (code, table, _) = run(sandbox.knob().args(["experiment", "pareto", "nofront"]));
    assert_eq!(code, 0);
    assert_eq!(
        table.trim(),
        "no trial is on the Pareto front (3 broke a constraint: `knob experiment pareto nofront --all` lists them)"
    );
    let (_, all, _) = run(sandbox
        .knob()
        .args(["experiment", "pareto", "nofront", "--all"]));
    assert_eq!(all.lines().count(), 4, "{all}");
}

/// A tuner NNI runs (its own TPE by `useNniImplementation`, a user's class by `className`)
/// optimises one objective: `knob config check` refuses it at its field, as it refuses a native
/// single-objective tuner (it passed, and `knob create` refused it with no line after printing
/// a dashboard URL).
#[test]
fn a_tuner_run_by_nni_refuses_a_multi_objective_experiment_at_config_check() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let sandbox = Sandbox::new();
    let tuner_file = "from nni.tuner import Tuner\nclass GoodTuner(Tuner):\n    pass\n";
    for (tuner, field, shown) in [
        (
            format!("tuner:\n  name: TPE\n  useNniImplementation: true\n  pythonInterpreter: {}", python.display()),
            "tuner.name",
            "tuner TPE (NNI's own) optimises a single objective, and objectives lists 2 objectives and 1 constraint; use NSGA2, TPE or Random, or a tuner that takes objectives (leave out useNniImplementation to run knob's own)",
        ),
        (
            format!("tuner:\n  className: good_tuner.GoodTuner\n  codeDirectory: .\n  pythonInterpreter: {}", python.display()),
            "tuner.className",
            "tuner good_tuner.GoodTuner (run by NNI) optimises a single objective",
        ),
    ] {
        let yaml = format!("trialCommand: python3 trial.py\ntrialConcurrency: 1\n{tuner}\n{OBJECTIVES}");
        let config = sandbox.config(&yaml, &[("trial.py", KNOB_TRIAL), ("good_tuner.py", tuner_file)]);
        let (code, stdout, stderr) = run(sandbox.knob().args(["config", "check"]).arg(&config));
        assert_ne!(code, 0, "{stdout}");
        assert!(
            stderr.contains(&format!("{field}: {shown}")),
            "{stderr}"
        );
    }
}

/// Python trials report every objective as one dict without "default", through `knob_trial`
/// and through `import nni` (the shim): each failed at the first report, the trial API asking
/// for a numeric "default", and knob's protocol dropped such intermediates. Each intermediate is
/// stored with the first objective's value (a "default" entry wins), what an assessor judges,
/// without a warning.
#[test]
fn python_trials_report_objective_dicts_through_knob_trial_and_the_nni_shim() {
    let script = r#"import knob_trial, nni
p = knob_trial.get_parameters()
x, y = p["x"], p["y"]
accuracy, latency = x * (1 - 0.3 * y), 10 + 90 * x * x + 20 * y
knob_trial.report_intermediate({"accuracy": accuracy / 2, "latency_ms": latency})
nni.report_intermediate_result({"latency_ms": latency, "accuracy": accuracy})
knob_trial.report_intermediate({"default": 0.125, "accuracy": accuracy})
result = {"accuracy": accuracy, "latency_ms": latency, "memory_over": y - 0.7}
if knob_trial.get_sequence_id() % 2:
    knob_trial.report_final(result)
else:
    nni.report_final_result(result)
"#;
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: python3 trial.py\ntrialConcurrency: 2\nmaxTrialNumber: 4\nnniShim: true\ntuner:\n  name: Random\n  classArgs: {{seed: 3}}\n{OBJECTIVES}"
    );
    let config = sandbox.config(&yaml, &[("trial.py", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "pymo");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("pymo");
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4);
    for trial in trials {
        assert_eq!(trial["status"], "SUCCEEDED", "{trial:#}");
        let (accuracy, _, _) = values(trial).unwrap();
        let stored: Vec<f64> = trial["intermediate"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["value"].as_f64().unwrap_or(f64::NAN))
            .collect();
        assert_eq!(stored, [accuracy / 2.0, accuracy, 0.125], "{trial:#}");
        assert_eq!(trial["final"], accuracy, "{trial:#}");
    }
    assert!(!check_front(&export).is_empty(), "{export:#}");
    assert_eq!(export["warnings"], Value::Array(Vec::new()), "{export:#}");
}

/// An unmodified `import nni` trial reports a dict with `nni.report_final_result`.
#[test]
fn nni_report_final_result_of_a_dict_feeds_the_objectives() {
    let Some(python) = prerequisite::NNI3_PYTHON.path() else {
        return;
    };
    let script = r#"import nni
p = nni.get_next_parameter()
x, y = p["x"], p["y"]
nni.report_final_result({"default": x, "accuracy": x * (1 - 0.3 * y), "latency_ms": 10 + 90 * x * x + 20 * y, "memory_over": y - 0.7})
"#;
    let python = Path::new(&python)
        .display()
        .to_string()
        .replace('\'', r"'\''");
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: \"'{python}' trial.py\"\ntrialConcurrency: 2\nmaxTrialNumber: 6\nmaxTrialDuration: 2m\ntuner:\n  name: NSGA2\n  classArgs: {{seed: 2, population_size: 4}}\n{OBJECTIVES}"
    );
    let config = sandbox.config(&yaml, &[("trial.py", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "nnimo");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("nnimo");
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 6);
    assert!(
        trials.iter().all(|t| t["status"] == "SUCCEEDED"),
        "{export:#}"
    );
    assert!(!check_front(&export).is_empty(), "{export:#}");
}

#[test]
fn a_trial_that_breaks_a_constraint_is_never_the_best() {
    // The best accuracies break the constraint (x > 0.5): the summary and `--head` must name
    // feasible trials only, though their first objective is worse.
    let sandbox = Sandbox::new();
    let yaml = r#"trialCommand: python3 trial.py
trialConcurrency: 2
maxTrialNumber: 8
tuner:
  name: Random
  classArgs: {seed: 4}
searchSpace:
  x: {_type: uniform, _value: [0, 1]}
objectives:
  - {metric: accuracy, mode: maximize}
  - {metric: cost, mode: minimize}
  - {metric: over, constraint: "<= 0"}
trainingService:
  platform: local"#;
    let trial = r#"import json, os
x = json.loads(os.environ["KNOB_PARAMETERS"])["x"]
print("KNOB_FINAL", json.dumps({"accuracy": x, "cost": x * x, "over": x - 0.5}))
"#;
    let config = sandbox.config(yaml, &[("trial.py", trial)]);
    let (code, stdout, stderr) = sandbox.create(&config, "constrained");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("constrained");
    let x_of = |id: &str| {
        let trial = export["trials"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .unwrap_or_else(|| panic!("no trial {id}: {export:#}"));
        trial["parameters"]["x"].as_f64().unwrap()
    };
    let xs: Vec<f64> = export["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["parameters"]["x"].as_f64().unwrap())
        .collect();
    assert!(
        xs.iter().any(|x| *x > 0.5) && xs.iter().any(|x| *x <= 0.5),
        "the seed must give both kinds: {xs:?}"
    );
    let best_feasible = xs
        .iter()
        .copied()
        .filter(|x| *x <= 0.5)
        .fold(f64::MIN, f64::max);
    // The summary's best trials (stdout: "#  trial  best (max)  parameters").
    let first_row = stdout
        .lines()
        .find(|l| l.starts_with("1 "))
        .unwrap_or_else(|| panic!("{stdout}"));
    let best_id = first_row.split_whitespace().nth(1).unwrap();
    assert_eq!(x_of(best_id), best_feasible, "{stdout}");
    for line in stdout.lines().filter(|l| l.starts_with(char::is_numeric)) {
        let id = line.split_whitespace().nth(1).unwrap();
        assert!(
            x_of(id) <= 0.5,
            "an infeasible trial listed as best: {stdout}"
        );
    }
    let (code, head, stderr) =
        run(sandbox
            .knob()
            .args(["trial", "ls", "constrained", "--head", "3"]));
    assert_eq!(code, 0, "{stderr}");
    let head_ids: Vec<&str> = head
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert!(!head_ids.is_empty(), "{head}");
    assert_eq!(x_of(head_ids[0]), best_feasible, "{head}");
    assert!(head_ids.iter().all(|id| x_of(id) <= 0.5), "{head}");
}

/// Trials whose objectives are NaN or infinite (H12 F4, F1): none is on the front, `feasible`
/// says only whether the constraints are met, `--all` shows what they reported, the export
/// agrees, and the one with an infinite second objective is not the best though its first is.
#[test]
fn a_trial_with_a_nan_or_infinite_objective_is_neither_on_the_front_nor_the_best() {
    let sandbox = Sandbox::new();
    let yaml = r#"trialCommand: sh trial.sh
trialConcurrency: 1
maxTrialNumber: 4
tuner:
  name: Random
  classArgs: {seed: 1}
searchSpace:
  k: {_type: choice, _value: [0, 1, 2, 3]}
objectives:
  - {metric: a, mode: maximize}
  - {metric: b, mode: minimize}
trainingService:
  platform: local"#;
    // k 0: a NaN; 1: no b (fails); 2: the best a, but b infinite; 3: usable.
    let trial = r#"k=$(echo "$KNOB_PARAMETERS" | tr -dc 0-9)
case $k in
0) echo 'KNOB_FINAL {"a": NaN, "b": 1}' ;;
1) echo 'KNOB_FINAL {"a": 0.9}' ;;
2) echo 'KNOB_FINAL {"a": 0.8, "b": Infinity}' ;;
3) echo 'KNOB_FINAL {"a": 0.6, "b": 3}' ;;
esac
"#;
    let config = sandbox.config(yaml, &[("trial.sh", trial)]);
    let (_, stdout, stderr) = sandbox.create(&config, "nonfinite");
    let export = sandbox.export("nonfinite");
    let id_of = |k: u64| {
        export["trials"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["parameters"]["k"] == k)
            .unwrap_or_else(|| panic!("no trial k={k}: {export:#}"))["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (nan, missing, inf, usable) = (id_of(0), id_of(1), id_of(2), id_of(3));
    // The export's front: the usable trial alone.
    let on_front: Vec<&str> = export["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["pareto"] == true)
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(on_front, [usable.as_str()], "{export:#}");
    // The front and every succeeded trial as reported.
    let (code, front, _) = run(sandbox.knob().args(["experiment", "pareto", "nonfinite"]));
    assert_eq!(code, 0);
    let rows: Vec<Vec<&str>> = front
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [vec![usable.as_str(), "0.600000", "3.000000"]],
        "{front}"
    );
    let (code, all, _) = run(sandbox
        .knob()
        .args(["experiment", "pareto", "nonfinite", "--all"]));
    assert_eq!(code, 0);
    let rows: Vec<Vec<&str>> = all
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec![inf.as_str(), "0.800000", "inf", "yes", "no"],
            vec![usable.as_str(), "0.600000", "3.000000", "yes", "yes"],
            vec![nan.as_str(), "nan", "1.000000", "yes", "no"],
        ],
        "{all}"
    );
    assert!(
        !all.contains(&missing),
        "a FAILED trial is no result: {all}"
    );
    // The best: the usable trial, in the summary and `--head`.
    let first_row = stdout
        .lines()
        .find(|l| l.starts_with("1 "))
        .unwrap_or_else(|| panic!("{stdout}\n{stderr}"));
    assert_eq!(
        first_row.split_whitespace().nth(1),
        Some(usable.as_str()),
        "{stdout}"
    );
    assert!(!stdout.lines().any(|l| l.starts_with("2 ")), "{stdout}");
    let (_, head, _) = run(sandbox
        .knob()
        .args(["trial", "ls", "nonfinite", "--head", "5"]));
    let head_ids: Vec<&str> = head
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(head_ids, [usable.as_str()], "{head}");
}
