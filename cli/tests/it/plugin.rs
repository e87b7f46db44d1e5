use std::process::Command;

use crate::{bin_dir, knob, normalize, repo_root, run};

fn built_in_library(name: &str) -> std::path::PathBuf {
    let path = bin_dir().join(format!("lib{name}.so"));
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace` before the tests",
        path.display()
    );
    path
}

#[test]
fn plugin_list_shows_the_built_in_tuners() {
    built_in_library("knob_tuners");
    let (code, stdout, stderr) = run(knob().args(["plugin", "list"]));
    assert_eq!(code, 0, "{stderr}");
    let stdout = normalize(&stdout);
    assert!(
        stdout.contains(&format!(
            "$BIN/libknob_tuners.so (knob-plugin-api 0.1.0, ABI {})",
            knob_plugin_api::ABI_VERSION
        )),
        "{stdout}"
    );
    for name in ["Random", "GridSearch"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with("tuner") && l.contains(name)),
            "{name} missing:\n{stdout}"
        );
    }
}

#[test]
fn plugin_check_loads_one_file_or_fails_with_one_line() {
    let library = built_in_library("knob_tuners");
    let (code, stdout, stderr) = run(knob().arg("plugin").arg("check").arg(&library));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("Random"), "{stdout}");

    let tmp = tempfile::tempdir().unwrap();
    let bogus = tmp.path().join("libbogus.so");
    std::fs::write(&bogus, "not elf").unwrap();
    let (code, stdout, stderr) = run(knob().arg("plugin").arg("check").arg(&bogus));
    assert_eq!(code, 1);
    assert_eq!(stdout, "");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: {}: not a loadable shared library",
            bogus.display()
        )),
        "{stderr}"
    );
}

/// Builds `examples/third-party-tuner` the way its author would (its own workspace, depending
/// on knob-plugin-api by path); returns its library.
pub(crate) fn build_third_party_tuner() -> std::path::PathBuf {
    build_example("third-party-tuner", "knob_example_tuner")
}

/// Builds `examples/NAME` as its author would (its own workspace, knob-plugin-api by path);
/// returns its library, `lib<LIB>.so`.
pub(crate) fn build_example(name: &str, lib: &str) -> std::path::PathBuf {
    let target = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(match name {
        // Where it has always been built (other tests reuse that build).
        "third-party-tuner" => "third-party".to_string(),
        other => other.to_string(),
    });
    let manifest = repo_root().join(format!("examples/{name}/Cargo.toml"));
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
    target.join(format!("debug/lib{lib}.so"))
}

/// The third-party example, loaded from `$KNOB_PLUGIN_PATH`.
#[test]
fn a_third_party_tuner_dropped_on_the_plugin_path_is_listed_and_runs() {
    let library = build_third_party_tuner();
    let plugin_dir = tempfile::tempdir().unwrap();
    std::fs::copy(&library, plugin_dir.path().join("libsweep.so")).unwrap();
    let (code, stdout, stderr) = run(knob()
        .args(["plugin", "list"])
        .env("KNOB_PLUGIN_PATH", plugin_dir.path()));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(&format!(
            "{}/libsweep.so (knob-plugin-api 0.1.0, ABI {})",
            plugin_dir.path().display(),
            knob_plugin_api::ABI_VERSION
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("walks all parameters from low to high together"),
        "{stdout}"
    );
    assert!(!stderr.contains("warning"), "{stderr}");
}

#[test]
fn knob_gpu_shows_a_simulated_machine_and_says_why_there_are_no_real_gpus() {
    let (code, stdout, stderr) = run(knob().arg("gpu").env("KNOB_SIMULATE_GPUS", "2x16GiB"));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("simulated GPUs (KNOB_SIMULATE_GPUS=2x16GiB)"),
        "{stdout}"
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.contains("Simulated GPU (16 GiB)"))
            .count(),
        2,
        "{stdout}"
    );

    let (code, stdout, stderr) = run(knob()
        .args(["gpu", "--json"])
        .env_remove("KNOB_SIMULATE_GPUS"));
    assert_eq!(code, 0, "{stderr}");
    let inventory: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let environment = &inventory["environments"][0];
    if environment["gpu_source"]["source"] == "unavailable" {
        assert!(
            environment["gpu_source"]["reason"]
                .as_str()
                .unwrap()
                .contains("NVML"),
            "{stdout}"
        );
        assert_eq!(environment["gpus"].as_array().unwrap().len(), 0);
    }
}

/// A plugin file cut short on the plugin path (a copy interrupted) is refused in one line by
/// `plugin check`, `plugin list` and `create`, which go on with the other plugins; `dlopen`
/// of such a file died of SIGBUS (exit 135, no message).
#[test]
fn a_truncated_plugin_on_the_plugin_path_is_refused_and_the_others_still_load() {
    let whole = std::fs::read(built_in_library("knob_tuners")).unwrap();
    let plugin_dir = tempfile::tempdir().unwrap();
    let sizes = [1 << 10, 16 << 10, 256 << 10, 1 << 20];
    for size in sizes {
        assert!(
            size < whole.len(),
            "libknob_tuners.so is {} bytes",
            whole.len()
        );
        let cut = plugin_dir.path().join(format!("libcut{size}.so"));
        std::fs::write(&cut, &whole[..size]).unwrap();
        let (code, stdout, stderr) = run(knob().arg("plugin").arg("check").arg(&cut));
        assert_eq!((code, stdout.as_str()), (1, ""), "{size} bytes: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "error: {}: not a loadable shared library (",
                cut.display()
            )) && stderr.contains("truncated or damaged"),
            "{stderr}"
        );
    }

    let (code, stdout, stderr) = run(knob()
        .args(["plugin", "list"])
        .env("KNOB_PLUGIN_PATH", plugin_dir.path()));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        normalize(&stdout).contains("$BIN/libknob_tuners.so (knob-plugin-api"),
        "{stdout}"
    );
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.starts_with("warning: ") && l.contains("not a loadable shared library"))
            .count(),
        sizes.len(),
        "{stderr}"
    );

    let sandbox = crate::create::Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{}",
            crate::create::SPACE
        ),
        &[],
    );
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "cut"])
        .env("KNOB_PLUGIN_PATH", plugin_dir.path()));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("not a loadable shared library"))
            .count(),
        sizes.len(),
        "{stderr}"
    );
    assert_eq!(sandbox.export("cut")["trials"].as_array().unwrap().len(), 1);
}

/// A simulated machine far beyond any real one is refused at once, in one line that gives the
/// spec's error once (a million GPUs took 30 s and 570 MB; the error was printed twice).
#[test]
fn an_oversized_or_bad_simulated_gpu_spec_is_one_line_printed_once() {
    for spec in ["1000000x1GiB", "bad"] {
        let started = std::time::Instant::now();
        let (code, stdout, stderr) = run(knob().arg("gpu").env("KNOB_SIMULATE_GPUS", spec));
        assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "error: KNOB_SIMULATE_GPUS: cannot read simulated GPU spec `{spec}`: "
            )),
            "{stderr}"
        );
        assert_eq!(stderr.matches("cannot read").count(), 1, "{stderr}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{spec}: {:?}",
            started.elapsed()
        );
    }
    let (_, _, stderr) = run(knob().arg("gpu").env("KNOB_SIMULATE_GPUS", "1000000x1GiB"));
    assert!(stderr.contains("past 4096 GPUs"), "{stderr}");
}

/// `knob plugin try` runs a tuner outside any experiment: suggestions as JSON lines, results fed
/// from a file, every suggestion checked against the space (issue 19).
#[test]
fn plugin_try_runs_the_third_party_tuner_and_checks_what_it_hands_out() {
    let library = build_third_party_tuner();
    let dir = tempfile::tempdir().unwrap();
    let space = dir.path().join("space.json");
    std::fs::write(
        &space,
        r#"{"x": {"_type": "uniform", "_value": [0, 1]}, "k": {"_type": "choice", "_value": [1, 2, 3]}}"#,
    )
    .unwrap();
    let results = dir.path().join("results.txt");
    std::fs::write(&results, "0.5\n0.25\n").unwrap();
    let (code, stdout, stderr) = run(knob()
        .args(["plugin", "try"])
        .arg(&library)
        .arg("--space")
        .arg(&space)
        .args(["-n", "5", "--class-args", r#"{"steps": 3}"#, "--results"])
        .arg(&results));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        concat!(
            r#"{"parameter_id":0,"parameters":{"x":0.0,"k":1}}"#,
            "\n",
            r#"{"parameter_id":1,"parameters":{"x":0.5,"k":2}}"#,
            "\n",
            r#"{"parameter_id":2,"parameters":{"x":1.0,"k":3}}"#,
            "\n",
            r#"{"parameter_id":3,"no_more":true}"#,
            "\n",
        )
    );

    // A misspelled classArg is the constructor's one line.
    let (code, _, stderr) = run(knob()
        .args(["plugin", "try"])
        .arg(&library)
        .arg("--space")
        .arg(&space)
        .args(["--class-args", r#"{"stesp": 3}"#]));
    assert_eq!(code, 1);
    assert!(
        stderr
            .contains("tuner Sweep: constructor failed: classArgs of Sweep: unknown field `stesp`"),
        "{stderr}"
    );

    // classArgs are a mapping, as in a config: a list is refused before any tuner sees it.
    let (code, _, stderr) = run(knob()
        .args(["plugin", "try"])
        .arg(&library)
        .arg("--space")
        .arg(&space)
        .args(["--class-args", "[3]"]));
    assert_eq!(code, 1);
    assert_eq!(
        stderr.trim(),
        r#"error: --class-args must be a JSON object of the tuner's arguments, such as '{"optimize_mode": "minimize"}', got [3]"#
    );

    // What the space does not hold is refused, naming the parameter and the rule.
    let misbehaving = crate::tuner_output::misbehaving_tuner();
    let (code, stdout, stderr) = run(knob()
        .args(["plugin", "try"])
        .arg(&misbehaving)
        .args(["--tuner", "Misbehaving", "--space"])
        .arg(&space)
        .args(["--class-args", r#"{"output": "out_of_range"}"#]));
    assert_eq!(code, 1, "{stdout}");
    assert_eq!(stdout, "");
    assert_eq!(
        stderr.trim(),
        r#"error: tuner Misbehaving handed out parameters the search space does not hold (parameter id 0): trial parameter "x": 7.5 is outside uniform [0, 1]"#
    );
}

/// `knob plugin try` checks a built-in tuner's suggestions as an experiment checks them: the
/// `TRIAL_BUDGET` Hyperband and BOHB add passes (it was refused as "not in the search space"),
/// and Batch's listed parameter sets are members of its space.
#[test]
fn plugin_try_accepts_what_an_experiment_accepts_from_the_built_in_tuners() {
    let library = built_in_library("knob_tuners");
    let dir = tempfile::tempdir().unwrap();
    let space = dir.path().join("space.json");
    std::fs::write(&space, r#"{"x": {"_type": "uniform", "_value": [0, 1]}}"#).unwrap();
    for (tuner, class_args) in [
        ("Hyperband", "{}"),
        ("Hyperband", r#"{"R": 9, "eta": 3}"#),
        ("BOHB", "{}"),
        ("BOHB", r#"{"max_budget": 9, "eta": 3}"#),
    ] {
        let (code, stdout, stderr) = run(knob()
            .args(["plugin", "try"])
            .arg(&library)
            .arg("--space")
            .arg(&space)
            .args(["-n", "3", "--tuner", tuner, "--class-args", class_args]));
        assert_eq!(code, 0, "{tuner} {class_args}: {stderr}");
        let lines: Vec<serde_json::Value> = stdout
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{tuner} {class_args}: {stdout}");
        for line in lines {
            let parameters = &line["parameters"];
            assert!(parameters["TRIAL_BUDGET"].is_u64(), "{tuner}: {line}");
            assert!(parameters["x"].is_f64(), "{tuner}: {line}");
        }
    }

    let batch_space = dir.path().join("batch.json");
    std::fs::write(
        &batch_space,
        r#"{"combine_params": {"_type": "choice", "_value": [{"lr": 0.1}, {"lr": 0.01, "bs": 3}]}}"#,
    )
    .unwrap();
    let (code, stdout, stderr) = run(knob()
        .args(["plugin", "try"])
        .arg(&library)
        .arg("--space")
        .arg(&batch_space)
        .args(["-n", "3", "--tuner", "Batch"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        concat!(
            r#"{"parameter_id":0,"parameters":{"lr":0.1}}"#,
            "\n",
            r#"{"parameter_id":1,"parameters":{"lr":0.01,"bs":3}}"#,
            "\n",
            r#"{"parameter_id":2,"no_more":true}"#,
            "\n",
        )
    );
}

/// The Halton example (a tuner and an assessor written from docs/writing-a-plugin.md) under
/// `knob plugin try`, its results computed by a Python expression of the parameters (issue 19).
#[test]
fn plugin_try_runs_the_halton_example_with_results_from_a_python_expression() {
    let library = build_example("halton-tuner", "knob_example_halton");
    let dir = tempfile::tempdir().unwrap();
    let space = dir.path().join("space.json");
    std::fs::write(
        &space,
        r#"{"a": {"_type": "uniform", "_value": [0, 4]}, "k": {"_type": "choice", "_value": [1, 2, 3]}}"#,
    )
    .unwrap();
    let try_with = |expr: &str| {
        run(knob()
            .args(["plugin", "try"])
            .arg(&library)
            .args(["--tuner", "Halton", "--space"])
            .arg(&space)
            .args(["-n", "4", "--results-expr", expr]))
    };
    // Halton points 1..4: a = 4 * (1/2, 1/4, 3/4, 1/8), k = choice index floor(3 * (1/3, 2/3,
    // 1/9, 4/9)).
    let (code, stdout, stderr) = try_with(r#"-(x["a"] - 3) ** 2 + math.log(x["k"])"#);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        concat!(
            r#"{"parameter_id":0,"parameters":{"a":2.0,"k":2}}"#,
            "\n",
            r#"{"parameter_id":1,"parameters":{"a":1.0,"k":3}}"#,
            "\n",
            r#"{"parameter_id":2,"parameters":{"a":3.0,"k":1}}"#,
            "\n",
            r#"{"parameter_id":3,"parameters":{"a":0.5,"k":2}}"#,
            "\n",
        )
    );
    // The expression is evaluated for each suggestion: its errors are one line naming it.
    let (code, stdout, stderr) = try_with(r#"x["b"]"#);
    assert_eq!(code, 1);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert_eq!(
        stderr.trim(),
        r#"error: --results-expr "x[\"b\"]" failed for parameter id 0 ({"a":2.0,"k":2}): KeyError: 'b'"#
    );
    let (code, _, stderr) = try_with(r#""big" if x["a"] > 1 else 0"#);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("failed for parameter id 0") && stderr.contains("ValueError"),
        "{stderr}"
    );
    // --results and --results-expr do not mix.
    let (code, _, stderr) = run(knob()
        .args(["plugin", "try"])
        .arg(&library)
        .arg("--space")
        .arg(&space)
        .args(["--results", "r.txt", "--results-expr", "1"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

/// The Halton example's FinalMedian assessor in a real experiment that minimizes: the core tells
/// it the direction and each trial's final, and it stops exactly the trials whose loss at step
/// 5 is above the median final of the trials finished so far (issue 19). Told nothing, it would
/// stop none: it has no median without finals, and maximizing, a high loss is good.
#[test]
fn an_assessor_plugin_learns_the_direction_and_the_finals_in_an_experiment() {
    let library = build_example("halton-tuner", "knob_example_halton");
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(&library, plugins.join("libhalton.so")).unwrap();
    // A loss falling from 1 towards the trial's quality (lower is better), 0.1 s a step.
    std::fs::write(
        dir.path().join("trial.py"),
        r#"import json, os, time
quality = json.loads(os.environ["KNOB_PARAMETERS"])["quality"]
for step in range(1, 21):
    print(f"KNOB_INTERMEDIATE {quality + (1 - quality) * 0.5 ** step}", flush=True)
    time.sleep(0.1)
print(f"KNOB_FINAL {quality}", flush=True)
"#,
    )
    .unwrap();
    // Halton's first five choices of four: indices 2, 1, 3, 0, 2 (qualities 0.8, 0.2, 0.9, 0.1,
    // 0.8). Finals 0.8 and 0.2 make the median 0.5: the 0.9 trial is above it at step 5; 0.1
    // finishes; then the median of 0.8, 0.2, 0.1 is 0.2 and the second 0.8 trial is stopped.
    let config = dir.path().join("config.yml");
    std::fs::write(
        &config,
        format!(
            r#"trialCommand: python3 trial.py
trialCodeDirectory: {code}
trialConcurrency: 1
maxTrialNumber: 5
searchSpace:
  quality: {{_type: choice, _value: [0.1, 0.2, 0.8, 0.9]}}
tuner:
  name: Halton
  classArgs: {{optimize_mode: minimize}}
assessor:
  name: FinalMedian
  classArgs: {{min_steps: 5, min_trials: 2}}
trainingService:
  platform: local
experimentWorkingDirectory: {work}
"#,
            code = dir.path().display(),
            work = dir.path().join("experiments").display()
        ),
    )
    .unwrap();
    let knob_in_sandbox = || {
        let mut command = knob();
        command
            .env("KNOB_HOME", dir.path().join("home"))
            .env("KNOB_PLUGIN_PATH", &plugins);
        command
    };
    let (code, stdout, stderr) = run(knob_in_sandbox()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "halton"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("5 trials (3 succeeded, 0 failed, 2 early-stopped)"),
        "{stdout}"
    );
    let (code, export, stderr) =
        run(knob_in_sandbox().args(["experiment", "export", "halton", "--format", "json"]));
    assert_eq!(code, 0, "{stderr}");
    let export: serde_json::Value = serde_json::from_str(&export).unwrap();
    let outcome: Vec<(f64, String, String)> = export["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["parameters"]["quality"].as_f64().unwrap(),
                t["status"].as_str().unwrap().to_owned(),
                t["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let stopped: Vec<&(f64, String, String)> = outcome
        .iter()
        .filter(|(_, status, _)| status == "EARLY_STOPPED")
        .collect();
    assert_eq!(stopped.len(), 2, "{outcome:?}");
    assert_eq!(stopped[0].0, 0.9, "{outcome:?}");
    assert!(
        stopped[0].2.starts_with("step 5: ")
            && stopped[0]
                .2
                .ends_with("is worse than the median final 0.5 (2 trials, minimize)"),
        "{outcome:?}"
    );
    assert_eq!(stopped[1].0, 0.8, "{outcome:?}");
    assert!(
        stopped[1]
            .2
            .ends_with("is worse than the median final 0.2 (3 trials, minimize)"),
        "{outcome:?}"
    );
}

/// The example tuners follow the guide's `import_data` contract: after `knob resume`, the
/// trials of the earlier run count as handed out, so the resumed run goes on with the next
/// points of the sequence (it handed out the first ones again), and Sweep says `NoMore` once
/// its `steps` points are out, counting both runs (H3 F1).
#[test]
fn the_example_tuners_go_on_after_the_earlier_runs_trials_on_resume() {
    for (example, lib, tuner, space, resumed_max, expected) in [
        (
            "third-party-tuner",
            "knob_example_tuner",
            "{name: Sweep, classArgs: {steps: 4}}",
            "{_type: uniform, _value: [0, 3]}",
            "10",
            vec![0.0, 1.0, 2.0, 3.0],
        ),
        (
            "halton-tuner",
            "knob_example_halton",
            "{name: Halton}",
            "{_type: uniform, _value: [0, 1]}",
            "4",
            vec![0.5, 0.25, 0.75, 0.125],
        ),
    ] {
        let library = build_example(example, lib);
        let sandbox = crate::create::Sandbox::new();
        let config = sandbox.config(
            &format!(
                "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 2\n\
                 searchSpace:\n  x: {space}\ntuner: {tuner}\n\
                 trainingService:\n  platform: local\npluginPaths: [{}]",
                library.display()
            ),
            &[],
        );
        let (code, stdout, stderr) = sandbox.create(&config, "resumed");
        assert_eq!(code, 0, "{example}: {stdout}\n{stderr}");
        let (code, stdout, stderr) =
            run(sandbox
                .knob()
                .args(["resume", "resumed", "--max-trial-number", resumed_max]));
        assert_eq!(code, 0, "{example}: {stdout}\n{stderr}");
        let xs: Vec<f64> = sandbox.export("resumed")["trials"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["parameters"]["x"].as_f64().unwrap())
            .collect();
        assert_eq!(xs, expected, "{example}");
    }
}
