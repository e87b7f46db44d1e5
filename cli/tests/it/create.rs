//! `knob create` end to end: real configs, the real local training service plugin, real trial
//! processes, a real SQLite store; then the read-side commands on what it recorded.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{knob, repo_root, run};

/// A temp home (registry) and working directory for experiments, per test.
pub(crate) struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    pub(crate) fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn knob(&self) -> Command {
        let mut command = knob();
        command.env("KNOB_HOME", self.path().join("home"));
        command
    }

    /// Writes `config.yml` (with experimentWorkingDirectory in the sandbox) and `files`.
    pub(crate) fn config(&self, yaml: &str, files: &[(&str, &str)]) -> PathBuf {
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

    /// `knob create --config CONFIG --id ID`, to run as the caller needs (in the background, with
    /// limits of its own).
    pub(crate) fn create_command(&self, config: &Path, id: &str) -> Command {
        let mut command = self.knob();
        command
            .arg("create")
            .arg("--config")
            .arg(config)
            .args(["--id", id]);
        command
    }

    pub(crate) fn create(&self, config: &Path, id: &str) -> (i32, String, String) {
        run(&mut self.create_command(config, id))
    }

    pub(crate) fn export(&self, id: &str) -> Value {
        let (code, stdout, stderr) =
            run(self
                .knob()
                .args(["experiment", "export", id, "--format", "json"]));
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str(&stdout).unwrap()
    }
}

pub(crate) const SPACE: &str = r#"searchSpace:
  x: {_type: randint, _value: [0, 1000000]}
tuner:
  name: Random
  classArgs: {seed: 3}
trainingService:
  platform: local"#;

#[test]
fn the_quickstart_runs_and_exports_every_trial() {
    let sandbox = Sandbox::new();
    let code_dir = sandbox.path().join("quickstart");
    std::fs::create_dir_all(&code_dir).unwrap();
    for file in ["config.yml", "search_space.json", "branin.py"] {
        std::fs::copy(
            repo_root().join("examples/quickstart").join(file),
            code_dir.join(file),
        )
        .unwrap();
    }
    let config = code_dir.join("config.yml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "experimentWorkingDirectory: {}\n",
        sandbox.path().join("experiments").display()
    ));
    std::fs::write(&config, text).unwrap();

    let (code, stdout, stderr) = sandbox.create(&config, "quick");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment quick DONE: 24 trials (24 succeeded, 0 failed)"),
        "{stdout}"
    );
    assert!(stdout.contains("best (min)"), "{stdout}");

    let export = sandbox.export("quick");
    assert_eq!(export["experiment"]["status"], "DONE");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 24);
    for trial in trials {
        assert_eq!(trial["status"], "SUCCEEDED", "{trial}");
        let (x1, x2) = (
            trial["parameters"]["x1"].as_f64().unwrap(),
            trial["parameters"]["x2"].as_f64().unwrap(),
        );
        assert!(
            (-5.0..=10.0).contains(&x1) && (0.0..=15.0).contains(&x2),
            "{trial}"
        );
        // The stored final metric is Branin at the stored parameters: nothing crossed trials.
        let branin = {
            let (b, c, t) = (
                5.1 / (4.0 * std::f64::consts::PI.powi(2)),
                5.0 / std::f64::consts::PI,
                1.0 / (8.0 * std::f64::consts::PI),
            );
            (x2 - b * x1 * x1 + c * x1 - 6.0).powi(2) + 10.0 * (1.0 - t) * x1.cos() + 10.0
        };
        let reported = trial["final"].as_f64().unwrap();
        assert!(
            (reported - branin).abs() < 1e-9 * branin.max(1.0),
            "{reported} vs {branin}: {trial}"
        );
        assert_eq!(
            trial["intermediate"].as_array().unwrap().len(),
            3,
            "{trial}"
        );
    }

    let (code, csv, _) =
        run(sandbox
            .knob()
            .args(["experiment", "export", "quick", "--format", "csv"]));
    assert_eq!(code, 0);
    assert_eq!(csv.lines().count(), 25);
    assert!(csv.starts_with("trial_id,sequence,status,final,"), "{csv}");
    // `-o` writes the same; a write that fails (a full disk) names the file.
    let written = sandbox.path().join("quick.csv");
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["experiment", "export", "quick"])
        .args([
            "--format".as_ref(),
            "csv".as_ref(),
            "-o".as_ref(),
            written.as_os_str(),
        ]));
    assert_eq!(
        (code, std::fs::read_to_string(&written).unwrap()),
        (0, csv.clone()),
        "{stderr}"
    );
    let (code, _, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "export", "quick", "-o", "/dev/full"]));
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with("error: cannot write /dev/full: "),
        "{stderr}"
    );
    // The read commands on a stdout that cannot take their answer (a full disk) fail in one
    // line; `println!` panicked there (exit 101), and those that write piece by piece (top, man,
    // space, plugin) said only "error: No space left on device (os error 28)".
    let config_arg = config.display().to_string();
    let space_arg = code_dir.join("search_space.json").display().to_string();
    let plugin = std::path::Path::new(env!("CARGO_BIN_EXE_knob")).with_file_name(format!(
        "{}knob_tuners{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    let plugin_arg = plugin.display().to_string();
    for args in [
        vec!["experiment", "list"],
        vec!["experiment", "show", "quick"],
        vec!["trial", "ls", "quick"],
        vec!["gpu"],
        vec!["completions", "bash"],
        vec!["config", "check", &config_arg],
        vec!["top", "quick", "--iterations", "1"],
        vec!["man"],
        vec!["space", "validate", &space_arg],
        vec!["space", "sample", &space_arg],
        vec!["plugin", "list"],
        vec!["plugin", "list", "--json"],
        vec!["plugin", "check", &plugin_arg],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let output = sandbox.knob().args(&args).stdout(full).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr
                .lines()
                .last()
                .is_some_and(|l| l.starts_with("error: cannot write to standard output: "))
                && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
    // `knob top`'s interval is refused outside 0.1–3600 s (NaN used to panic).
    for bad in ["nan", "0", "-1", "inf"] {
        let (code, _, stderr) = run(sandbox
            .knob()
            .args(["top", "quick", "--iterations", "1"])
            .arg(format!("--interval={bad}")));
        assert_eq!(code, 2, "{bad}: {stderr}");
        assert!(
            stderr.contains("expected seconds between 0.1 and 3600"),
            "{bad}: {stderr}"
        );
    }

    let (code, list, _) = run(sandbox.knob().args(["experiment", "list"]));
    assert_eq!(code, 0);
    assert!(
        list.lines()
            .any(|l| l.starts_with("quick ") && l.contains("DONE") && l.contains(" 24 ")),
        "{list}"
    );
}

/// Without `HOME` (a service, `env -i`), knob's folder is the password database's home's, as
/// with it: it used to be `./knob`, a registry in whatever folder knob ran in.
#[test]
fn without_home_the_registry_is_not_put_in_the_current_folder() {
    let cwd = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run(Command::new(env!("CARGO_BIN_EXE_knob"))
        .args(["experiment", "list"])
        .current_dir(cwd.path())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default()));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let left: Vec<_> = std::fs::read_dir(cwd.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "knob wrote {left:?} in the current folder");
}

/// A final reported as a dict keeps its other entries in the CSV, one `final:` column each, NaN
/// as Python writes it; `default` is `final` itself.
#[test]
fn the_csv_export_has_a_column_for_each_entry_of_a_final_dict() {
    let sandbox = Sandbox::new();
    let yaml =
        format!("trialCommand: sh final.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}");
    let trial = r#"echo 'KNOB_FINAL {"default": 0.5, "epochs": 3, "loss": NaN}'"#;
    let config = sandbox.config(&yaml, &[("final.sh", trial)]);
    let (code, stdout, stderr) = sandbox.create(&config, "dict");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let (code, csv, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "export", "dict", "--format", "csv"]));
    assert_eq!(code, 0, "{stderr}");
    let (header, rows) = crate::csv_table(&csv);
    assert_eq!(rows.len(), 1, "{csv}");
    let row = &rows[0];
    let cell = |name: &str| {
        let at = header.iter().position(|c| c == name);
        at.map(|at| row[at].clone())
    };
    assert_eq!(cell("final").as_deref(), Some("0.5"), "{csv}");
    // The final as reported, right after `final` (the JSON export's `final_raw`).
    let at = |name: &str| header.iter().position(|c| c == name);
    assert_eq!(at("final_raw"), at("final").map(|at| at + 1), "{csv}");
    assert_eq!(
        cell("final_raw").as_deref(),
        Some(r#"{"default": 0.5, "epochs": 3, "loss": NaN}"#),
        "{csv}"
    );
    assert_eq!(cell("final:epochs").as_deref(), Some("3"), "{csv}");
    assert_eq!(cell("final:loss").as_deref(), Some("NaN"), "{csv}");
    assert_eq!(cell("final:default"), None, "{csv}");
    assert_eq!(cell("pareto"), None, "no objectives, no front: {csv}");
}

/// A CSV export's header and rows.
fn csv_of(sandbox: &Sandbox, id: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let (code, csv, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "export", id, "--format", "csv"]));
    assert_eq!(code, 0, "{stderr}");
    crate::csv_table(&csv)
}

/// Two values whose flattened names would be the same (a parameter `opt/lr` beside `lr` inside
/// the nested choice `opt`; a final's `m/a` beside `a` inside `m`) each get a column: the
/// literal key is spelt as a JSON Pointer (`opt~1lr`). One of them used to be left out.
#[test]
fn the_csv_export_keeps_every_value_whose_flattened_names_collide() {
    let sandbox = Sandbox::new();
    let yaml = "trialCommand: sh final.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1
searchSpace:
  opt: {_type: choice, _value: [{_name: sgd, lr: {_type: choice, _value: [0.5]}}]}
  opt/lr: {_type: choice, _value: [0.25]}
  val/acc: {_type: choice, _value: [7]}
tuner: {name: Random}
trainingService: {platform: local}";
    let trial = r#"echo 'KNOB_FINAL {"default": 1, "m": {"a": 2}, "m/a": 3}'"#;
    let config = sandbox.config(yaml, &[("final.sh", trial)]);
    let (code, stdout, stderr) = sandbox.create(&config, "collide");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let (header, rows) = csv_of(&sandbox, "collide");
    assert_eq!(rows.len(), 1, "{header:?} {rows:?}");
    let cell = |name: &str| {
        let at = header.iter().position(|c| c == name);
        at.map(|at| rows[0][at].as_str())
    };
    let columns = format!("{header:?}");
    assert_eq!(cell("param:opt/_name"), Some("sgd"), "{columns}");
    assert_eq!(cell("param:opt/lr"), Some("0.5"), "{columns}");
    assert_eq!(cell("param:opt~1lr"), Some("0.25"), "{columns}");
    // A key with `/` that collides with nothing keeps its name.
    assert_eq!(cell("param:val/acc"), Some("7"), "{columns}");
    assert_eq!(cell("final"), Some("1"), "{columns}");
    assert_eq!(cell("final:m/a"), Some("2"), "{columns}");
    assert_eq!(cell("final:m~1a"), Some("3"), "{columns}");
    assert_eq!(header.len(), rows[0].len(), "{columns}");
}

/// A final that is NaN or ±Infinity (alone or as a dict's `default`) is spelt in the CSV's
/// `final` column as in the columns beside it, so that it differs from a final never reported.
#[test]
fn the_csv_export_spells_a_non_finite_final() {
    let sandbox = Sandbox::new();
    let yaml =
        format!("trialCommand: sh final.sh\ntrialConcurrency: 1\nmaxTrialNumber: 5\n{SPACE}");
    let trial = r#"case $NNI_TRIAL_SEQ_ID in
  0) echo 'KNOB_FINAL NaN' ;;
  1) echo 'KNOB_FINAL Infinity' ;;
  2) echo 'KNOB_FINAL -inf' ;;
  3) echo 'KNOB_FINAL {"default": NaN, "loss": 2}' ;;
esac"#;
    let config = sandbox.config(&yaml, &[("final.sh", trial)]);
    let (code, stdout, stderr) = sandbox.create(&config, "nonfinite");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let (header, rows) = csv_of(&sandbox, "nonfinite");
    let final_at = header.iter().position(|c| c == "final").unwrap();
    let sequence_at = header.iter().position(|c| c == "sequence").unwrap();
    let mut finals: Vec<(String, String)> = rows
        .iter()
        .map(|row| (row[sequence_at].clone(), row[final_at].clone()))
        .collect();
    finals.sort();
    let expected = [
        ("0", "NaN"),
        ("1", "Infinity"),
        ("2", "-Infinity"),
        ("3", "NaN"),
        ("4", ""),
    ]
    .map(|(sequence, value)| (sequence.to_string(), value.to_string()));
    assert_eq!(finals, expected, "{header:?} {rows:?}");
}

/// An export `-o` an SQLite database, or a file SQLite keeps beside one, is refused: written over
/// the experiment's own `experiment.db` (a completed path), it destroyed every trial, and over
/// knob's `registry.db` the list of experiments.
#[test]
fn the_export_refuses_to_write_over_a_store_or_the_registry() {
    let sandbox = Sandbox::new();
    let yaml =
        format!("trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, "own");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let before = sandbox.export("own");
    let store = sandbox.path().join("experiments/own/experiment.db");
    let registry = sandbox.path().join("home/registry.db");
    let wal = sandbox.path().join("experiments/own/experiment.db-wal");
    let link = sandbox.path().join("link.json");
    std::os::unix::fs::symlink(&store, &link).unwrap();
    for (target, database) in [
        (&store, None),
        (&registry, None),
        (&link, None),
        (&wal, Some(&store)),
    ] {
        let (code, _, stderr) = run(sandbox
            .knob()
            .args(["experiment", "export", "own", "--format", "json", "-o"])
            .arg(target));
        let why = match database {
            None => "it is an SQLite database (an experiment's store or knob's registry), which the export would destroy".to_string(),
            Some(database) => format!(
                "it belongs to the SQLite database {} (an experiment's store or knob's registry), which the export would damage",
                database.display()
            ),
        };
        assert_eq!(
            (code, stderr.trim_end()),
            (
                1,
                format!(
                    "error: cannot write {}: {why}; give -o another file",
                    target.display()
                )
                .as_str()
            )
        );
    }
    // Both databases are whole: the experiment is found and reads as before.
    assert_eq!(sandbox.export("own"), before);
}

/// A config in a folder whose path is not UTF-8 (a Latin-1 name) is refused, naming the field and
/// the path: the experiment had been created with its config stored as null, so that every trial
/// failed ("could not start: path contains invalid UTF-8 characters") and `knob resume` could not
/// read it back ("invalid type: null, expected struct ExperimentConfig").
#[test]
fn a_config_whose_folder_is_not_utf8_is_refused_before_anything_is_made() {
    use std::os::unix::ffi::OsStrExt;
    let sandbox = Sandbox::new();
    let folder = sandbox
        .path()
        .join(std::ffi::OsStr::from_bytes(b"caf\xe9 code"));
    std::fs::create_dir_all(&folder).unwrap();
    let yaml = format!(
        "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}\nexperimentWorkingDirectory: {}\n",
        sandbox.path().join("experiments").display()
    );
    let config = folder.join("config.yml");
    std::fs::write(&config, yaml).unwrap();
    let (code, stdout, stderr) = sandbox.create(&config, "latin1");
    let folder_text = format!("{folder:?}");
    assert_eq!(
        (code, stderr.trim_end()),
        (
            1,
            format!(
                "error: {}: trialCodeDirectory: not set, so the config file's folder: {folder_text} is not valid UTF-8, and knob keeps paths as text (in its store, in the trials' environment); rename the folder, or move what it holds to a path that is",
                config.display()
            )
            .as_str()
        ),
        "{stdout}"
    );
    let (_, list, _) = run(sandbox.knob().args(["experiment", "list"]));
    assert!(list.starts_with("no experiments yet"), "{list}");
    // Named in a field (through a link, as the text of a YAML file is UTF-8), it is refused at
    // that field's line, then resume still finds nothing.
    let yaml = std::fs::read_to_string(&config).unwrap();
    let code_dir = sandbox.path().join("code");
    std::fs::create_dir_all(&code_dir).unwrap();
    std::os::unix::fs::symlink(&folder, code_dir.join("link")).unwrap();
    let config = code_dir.join("config.yml");
    std::fs::write(&config, format!("{yaml}trialCodeDirectory: link\n")).unwrap();
    let line = yaml.lines().count() + 1;
    let (code, stdout, stderr) = sandbox.create(&config, "latin1");
    assert_eq!(
        (code, stderr.trim_end()),
        (
            1,
            format!(
                "error: {}:{line}:21: trialCodeDirectory: {folder_text} is not valid UTF-8, and knob keeps paths as text (in its store, in the trials' environment); rename the folder, or move what it holds to a path that is",
                config.display()
            )
            .as_str()
        ),
        "{stdout}"
    );
    let (_, list, _) = run(sandbox.knob().args(["experiment", "list"]));
    assert!(list.starts_with("no experiments yet"), "{list}");
}

/// An export that fails part way (here the file-size limit; a full disk, a Ctrl-C in a long
/// export) leaves the file that was there whole, and no half-written file beside it: the file was
/// truncated first, then written, so the previous export was lost with the failed one.
#[test]
fn a_failed_export_leaves_the_previous_file_whole() {
    use std::os::unix::process::CommandExt;
    let sandbox = Sandbox::new();
    let trial = "for i in $(seq 3000); do echo KNOB_INTERMEDIATE $i; done; echo KNOB_FINAL 1";
    let yaml = format!("trialCommand: {trial}\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, "long");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let file = sandbox.path().join("long.json");
    std::fs::write(&file, "the previous export").unwrap();
    let mut command = sandbox.knob();
    command
        .args(["experiment", "export", "long", "-o"])
        .arg(&file);
    const LIMIT: u64 = 128 * 1024;
    // SAFETY: between fork and exec, only async-signal-safe calls (setrlimit, signal).
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // A write past the limit then fails (EFBIG) instead of killing the process.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let (code, _, stderr) = run(&mut command);
    assert_eq!(
        (code, stderr.trim_end()),
        (
            1,
            format!(
                "error: cannot write {}: File too large (os error 27)",
                file.display()
            )
            .as_str()
        )
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "the previous export"
    );
    let mut names: Vec<_> = std::fs::read_dir(sandbox.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["code", "experiments", "home", "long.json"]);
    // Without the limit, it is replaced by the whole export.
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["experiment", "export", "long", "-o"])
        .arg(&file));
    assert_eq!(code, 0, "{stderr}");
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written, sandbox.export("long"));
    assert!(std::fs::metadata(&file).unwrap().len() > LIMIT);
}

/// Without `--format`, `-o`'s extension decides (`.csv` used to get JSON); a `--format` that
/// contradicts it is refused before anything is written.
#[test]
fn the_export_format_follows_the_output_files_extension() {
    let sandbox = Sandbox::new();
    let yaml =
        format!("trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, "ext");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = |file: &str, format: Option<&str>| {
        let path = sandbox.path().join(file);
        let mut command = sandbox.knob();
        command
            .args(["experiment", "export", "ext", "-o"])
            .arg(&path);
        if let Some(format) = format {
            command.args(["--format", format]);
        }
        let (code, _, stderr) = run(&mut command);
        (code, stderr, std::fs::read_to_string(&path).ok())
    };
    let is_csv = |text: &str| text.starts_with("trial_id,sequence,status,final,");
    let is_json = |text: &str| serde_json::from_str::<Value>(text).is_ok();
    for (file, format, csv) in [
        ("a.csv", None, true),
        ("b.CSV", None, true),
        ("c.json", None, false),
        ("d.txt", None, false),
        ("e", None, false),
        ("f.txt", Some("csv"), true),
        ("g.csv", Some("csv"), true),
        ("h.json", Some("json"), false),
    ] {
        let (code, stderr, written) = export(file, format);
        assert_eq!(code, 0, "{file} {format:?}: {stderr}");
        let written = written.unwrap();
        let right = if csv {
            is_csv(&written)
        } else {
            is_json(&written)
        };
        assert!(right, "{file} {format:?}: {written}");
    }
    for (file, format, named) in [("x.csv", "json", "csv"), ("y.json", "csv", "json")] {
        let (code, stderr, written) = export(file, Some(format));
        let path = sandbox.path().join(file);
        assert_eq!(
            (code, stderr.trim_end(), written),
            (
                1,
                format!(
                    "error: --format {format} contradicts the output file {}, whose extension says {named}; name the file .{format} or drop --format",
                    path.display()
                )
                .as_str(),
                None
            )
        );
    }
}

/// A folder this registry does not list (copied from another machine, another KNOB_HOME) is
/// registered by `knob experiment register`, after which every command finds it; a create of
/// its id, before, says so.
#[test]
fn a_copied_experiment_folder_is_registered_and_then_found_by_its_id() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 2\n{SPACE}"
        ),
        &[],
    );
    assert_eq!(sandbox.create(&config, "moved").0, 0);
    // Another machine: its own registry, the folder copied to a place of its own.
    let elsewhere = sandbox.path().join("elsewhere");
    let copy = elsewhere.join("moved");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let copied = Command::new("cp")
        .arg("-r")
        .arg(sandbox.path().join("experiments/moved"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(copied.success());
    let there = |args: &[&str]| run(knob().env("KNOB_HOME", elsewhere.join("home")).args(args));
    let (code, _, stderr) = there(&["trial", "ls", "moved"]);
    assert_eq!(code, 1, "{stderr}");
    let copy_text = copy.display().to_string();
    let (code, stdout, stderr) = there(&["experiment", "register", &copy_text]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with(&format!("experiment moved registered (DONE, {copy_text})")),
        "{stdout}"
    );
    let (code, list, _) = there(&["experiment", "list"]);
    assert_eq!(code, 0);
    assert!(
        list.lines()
            .any(|l| l.starts_with("moved ") && l.contains(" DONE ") && l.contains(&copy_text)),
        "{list}"
    );
    let (code, trials, stderr) = there(&["trial", "ls", "moved"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        trials.lines().filter(|l| l.contains("SUCCEEDED")).count(),
        2,
        "{trials}"
    );
    // Again: nothing changes. The original folder, under the same id: refused, naming the copy.
    let (code, stdout, _) = there(&["experiment", "register", &copy_text]);
    assert_eq!(
        (code, stdout.trim()),
        (
            0,
            format!("experiment moved is registered already ({copy_text})").as_str()
        )
    );
    let original = sandbox
        .path()
        .join("experiments/moved")
        .display()
        .to_string();
    let (code, _, stderr) = there(&["experiment", "register", &original]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains(&format!(
            "experiment moved is registered already, with the folder {copy_text}"
        )),
        "{stderr}"
    );
    // Not an experiment's folder.
    let (code, _, stderr) = there(&["experiment", "register", &elsewhere.display().to_string()]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("no experiment.db here, so not a knob experiment's folder"),
        "{stderr}"
    );
}

/// A folder moved by hand: registering it where it now is says that the registered one is gone
/// and what to do, and doing that finds the experiment again, every trial kept.
#[test]
fn a_moved_folder_is_registered_after_forgetting_the_gone_one() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 2\n{SPACE}"
        ),
        &[],
    );
    assert_eq!(sandbox.create(&config, "wandered").0, 0);
    let old = sandbox.path().join("experiments/wandered");
    let new = sandbox.path().join("wandered-here");
    std::fs::rename(&old, &new).unwrap();
    let new_text = new.display().to_string();
    let (code, _, stderr) = run(sandbox.knob().args(["experiment", "register", &new_text]));
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: experiment wandered is registered with the folder {}, which is gone (moved or deleted outside knob); `knob experiment delete wandered --yes` forgets that entry (it removes nothing from {new_text}), then `knob experiment register {new_text}` registers this folder",
            old.display()
        )
    );
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["experiment", "delete", "wandered", "--yes"]));
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = run(sandbox.knob().args(["experiment", "register", &new_text]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        sandbox.export("wandered")["trials"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// Another experiment's folder put at a registered one's path: its commands refuse it rather
/// than show, resume or delete the other experiment under this id.
#[test]
fn a_folder_holding_another_experiment_is_refused_and_never_deleted() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}"
        ),
        &[],
    );
    assert_eq!(sandbox.create(&config, "mine").0, 0);
    assert_eq!(sandbox.create(&config, "theirs").0, 0);
    let mine = sandbox.path().join("experiments/mine");
    std::fs::rename(&mine, sandbox.path().join("mine-away")).unwrap();
    std::fs::rename(sandbox.path().join("experiments/theirs"), &mine).unwrap();
    let expected = |doing: &str| {
        format!(
            "error: experiment mine: its folder {dir} holds the store of experiment theirs, not mine's (a folder moved or copied there by hand){doing}; move that folder away (`knob experiment register` finds theirs wherever it is put) and put mine's back at {dir}\n",
            dir = mine.display()
        )
    };
    for args in [
        &["trial", "ls", "mine"][..],
        &["experiment", "export", "mine"],
        &["resume", "mine", "--max-trial-number", "3"],
    ] {
        let (code, _, stderr) = run(sandbox.knob().args(args));
        assert_eq!((code, stderr), (1, expected("")), "{args:?}");
    }
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["experiment", "delete", "mine", "--yes"]));
    assert_eq!(
        (code, stderr),
        (1, expected(": deleting mine would remove them"))
    );
    assert!(mine.join("experiment.db").is_file(), "theirs is kept");
    assert!(mine.join("trials").is_dir(), "theirs is kept");
    // Put back, each is found again as it was.
    std::fs::rename(&mine, sandbox.path().join("experiments/theirs")).unwrap();
    std::fs::rename(sandbox.path().join("mine-away"), &mine).unwrap();
    for id in ["mine", "theirs"] {
        let export = sandbox.export(id);
        assert_eq!(export["experiment"]["id"], id);
        assert_eq!(export["trials"].as_array().unwrap().len(), 1);
    }
}

#[test]
fn an_existing_id_is_refused_with_a_hint_to_resume() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}"
        ),
        &[],
    );
    assert_eq!(sandbox.create(&config, "twice").0, 0);
    let (code, _, stderr) = sandbox.create(&config, "twice");
    assert_eq!(code, 1);
    assert!(
        stderr.contains("experiment twice already exists"),
        "{stderr}"
    );
    assert!(stderr.contains("knob resume twice"), "{stderr}");
    assert_eq!(
        sandbox.export("twice")["trials"].as_array().unwrap().len(),
        1,
        "the first run is untouched"
    );
}

#[test]
fn create_refuses_a_folder_of_user_files_and_delete_keeps_what_knob_did_not_make() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}"
        ),
        &[],
    );
    let dir = sandbox.path().join("experiments/mine");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("data.csv"), "1,2,3").unwrap();
    let (code, _, stderr) = sandbox.create(&config, "mine");
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the experiment folder {} already exists and holds files knob did not make",
            dir.display()
        )),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("data.csv")).unwrap(),
        "1,2,3"
    );

    // A file put into a folder knob made survives `delete`, which names it.
    let (code, _, stderr) = sandbox.create(&config, "ours");
    assert_eq!(code, 0, "{stderr}");
    let dir = sandbox.path().join("experiments/ours");
    assert!(dir.join(".knob-experiment").is_file());
    std::fs::write(dir.join("analysis.ipynb"), "{}").unwrap();
    // A name with a newline and a terminal escape is named on one line, the escape harmless.
    let odd = "x\ny\x1b]0;owned\x07";
    std::fs::write(dir.join(odd), "").unwrap();
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "delete", "ours", "--yes"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("what knob did not make in it: ")
            && stdout.contains("analysis.ipynb")
            && stdout.contains("x\u{fffd}y\u{fffd}]0;owned\u{fffd}")
            && stdout.lines().count() == 1,
        "{stdout}"
    );
    let mut left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["analysis.ipynb", odd]);
}

/// In `trials/`, only the trials' own folders are knob's: a file or folder put beside them (notes,
/// a model copied out of a trial) is kept and named as `trials/NAME`. `delete` removed the whole
/// of `trials/`, and with it what it said it leaves.
#[test]
fn delete_keeps_what_was_put_in_the_trials_folder_beside_the_trials() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 2\n{SPACE}"
        ),
        &[],
    );
    let (code, _, stderr) = sandbox.create(&config, "beside");
    assert_eq!(code, 0, "{stderr}");
    let trials = sandbox.path().join("experiments/beside/trials");
    let trial_folders = std::fs::read_dir(&trials).unwrap().count();
    assert_eq!(trial_folders, 2);
    std::fs::write(trials.join("notes.txt"), "lr 0.1 was best").unwrap();
    std::fs::create_dir(trials.join("best")).unwrap();
    std::fs::write(trials.join("best/model.pt"), "weights").unwrap();
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "delete", "beside", "--yes"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout.trim_end(),
        format!(
            "experiment beside deleted; {} is kept with what knob did not make in it: trials/best, trials/notes.txt",
            sandbox.path().join("experiments/beside").display()
        )
    );
    let mut left: Vec<_> = std::fs::read_dir(&trials)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["best", "notes.txt"]);
    assert_eq!(
        std::fs::read_to_string(trials.join("best/model.pt")).unwrap(),
        "weights"
    );
}

/// A delete whose store cannot be read keeps `trials/` whole (nothing tells the trials'
/// folders from what was put beside them) and says why; it said `trials` was something knob
/// had not made.
#[test]
fn delete_with_a_damaged_store_keeps_the_trials_folder_whole_and_says_why() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 2\n{SPACE}"
        ),
        &[],
    );
    let (code, _, stderr) = sandbox.create(&config, "damaged");
    assert_eq!(code, 0, "{stderr}");
    let dir = sandbox.path().join("experiments/damaged");
    std::fs::write(dir.join("trials/notes.txt"), "lr 0.1 was best").unwrap();
    let store = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("experiment.db"))
        .unwrap();
    store.set_len(3000).unwrap();
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "delete", "damaged", "--yes"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout.trim_end(),
        format!(
            "experiment damaged deleted; {} is kept with trials/ whole (its store could not be read to tell the trials' folders from what was put beside them)",
            dir.display()
        )
    );
    assert_eq!(std::fs::read_dir(dir.join("trials")).unwrap().count(), 3);
}

#[test]
fn an_experiment_whose_folder_was_removed_by_hand_says_so_and_can_be_forgotten() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}"
        ),
        &[],
    );
    assert_eq!(sandbox.create(&config, "moved").0, 0);
    let dir = sandbox.path().join("experiments/moved");
    std::fs::rename(&dir, sandbox.path().join("elsewhere")).unwrap();

    let (code, stdout, stderr) = run(sandbox.knob().args(["experiment", "list"]));
    assert_eq!(code, 0, "{stderr}");
    let row = stdout.lines().find(|l| l.starts_with("moved ")).unwrap();
    assert!(
        row.contains(" - ") && row.ends_with(&format!("{} (gone)", dir.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("`knob experiment delete ID --yes` forgets one"),
        "{stdout}"
    );

    let gone = format!(
        "error: experiment moved: its directory {} is gone (moved or deleted outside knob); `knob experiment delete moved --yes` forgets it\n",
        dir.display()
    );
    for command in [
        &["experiment", "show", "moved"][..],
        &["trial", "ls", "moved"],
        &["experiment", "export", "moved"],
        &["resume", "moved"],
        &["view", "moved", "--port", "0"],
    ] {
        let (code, _, stderr) = run(sandbox.knob().args(command));
        assert_eq!((code, stderr.as_str()), (1, gone.as_str()), "{command:?}");
    }

    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["experiment", "delete", "moved", "--yes"]));
    assert_eq!(code, 0, "{stderr}");
    let (_, stdout, _) = run(sandbox.knob().args(["experiment", "list"]));
    assert!(!stdout.contains("moved"), "{stdout}");
    assert!(sandbox.path().join("elsewhere/experiment.db").is_file());
}

/// The store removed from a folder that is still there is said as such (it was "its directory
/// is gone"), and an emptied store is refused by `resume` as it found it (it used to get a new
/// empty schema written into it).
#[test]
fn a_missing_or_emptied_store_is_named_and_left_as_found() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}"
        ),
        &[],
    );
    assert_eq!(sandbox.create(&config, "lost").0, 0);
    assert_eq!(sandbox.create(&config, "emptied").0, 0);
    let lost = sandbox.path().join("experiments/lost/experiment.db");
    std::fs::remove_file(&lost).unwrap();
    let emptied = sandbox.path().join("experiments/emptied/experiment.db");
    std::fs::write(&emptied, "").unwrap();

    let (code, stdout, stderr) = run(sandbox.knob().args(["experiment", "list"]));
    assert_eq!(code, 0, "{stderr}");
    let row = stdout.lines().find(|l| l.starts_with("lost ")).unwrap();
    assert!(
        row.ends_with("/experiments/lost (store missing)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(store missing): experiment.db was removed"),
        "{stdout}"
    );
    assert!(!stdout.contains("(gone):"), "{stdout}");
    let missing = format!(
        "error: experiment lost: its store {} is missing (its folder is still there): put the file back from a backup, or `knob experiment delete lost --yes` forgets the experiment\n",
        lost.display()
    );
    for command in [&["experiment", "show", "lost"][..], &["resume", "lost"]] {
        let (code, _, stderr) = run(sandbox.knob().args(command));
        assert_eq!(
            (code, stderr.as_str()),
            (1, missing.as_str()),
            "{command:?}"
        );
    }

    let (code, _, stderr) = run(sandbox.knob().args(["resume", "emptied"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.starts_with("error: experiment emptied: ")
            && stderr.ends_with(
                "experiment.db: the experiment store is empty (0 bytes: emptied, or a copy cut short); put it back from a backup, or `knob experiment delete emptied --yes` forgets the experiment\n"
            ),
        "{stderr}"
    );
    // Read, it is said the same way, not as an experiment never created.
    let (code, _, show) = run(sandbox.knob().args(["experiment", "show", "emptied"]));
    assert_eq!((code, show.as_str()), (1, stderr.as_str()));
    assert_eq!(
        std::fs::metadata(&emptied).unwrap().len(),
        0,
        "left as found"
    );
}

#[test]
fn an_unknown_tuner_is_refused_before_anything_is_created() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: echo\ntrialConcurrency: 1\n{}",
        SPACE.replace("name: Random", "name: Bayesian")
    );
    let config = sandbox.config(&yaml, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, "nope");
    assert_eq!(code, 1, "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("unknown tuner Bayesian; available: "),
        "{stderr}"
    );
    assert!(
        stderr.contains("GridSearch") && stderr.contains("Random"),
        "{stderr}"
    );
    assert!(!sandbox.path().join("experiments/nope").exists());
}

#[test]
fn config_errors_are_listed_one_per_line() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(&format!("trialConcurrency: two\n{SPACE}"), &[]);
    let (code, _, stderr) = sandbox.create(&config, "bad");
    assert_eq!(code, 1);
    assert!(stderr.contains("trialConcurrency"), "{stderr}");
    assert!(stderr.contains("trialCommand"), "{stderr}");
    assert!(stderr.lines().all(|l| l.contains("config.yml")), "{stderr}");
}

#[test]
fn failing_trials_are_recorded_with_their_stderr_and_the_experiment_goes_on() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: no-such-command-knob-test\ntrialConcurrency: 2\nmaxTrialNumber: 3\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, "fails");
    // Every trial failed: the run is a failure for a script, and one line says why.
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("3 trials (0 succeeded, 3 failed)"),
        "{stdout}"
    );
    assert!(
        stderr.contains("error: experiment fails: every trial that ended failed (3 failed)"),
        "{stderr}"
    );
    let (_, listing, _) = run(sandbox
        .knob()
        .args(["trial", "ls", "fails", "--status", "failed"]));
    assert_eq!(listing.lines().count(), 4, "{listing}");
    for line in listing.lines().skip(1) {
        assert!(
            line.contains("FAILED")
                && line.contains("exit code 127")
                && line.contains("command not found"),
            "{line}"
        );
    }
}

/// A trial whose error line is coloured, followed by a progress bar's window title: its message
/// is the error's text, with no control character (they reached `knob trial ls`'s terminal raw,
/// and the message was the title sequence).
#[test]
fn a_failed_trial_s_message_is_the_readable_text_of_its_coloured_stderr() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        r"trialCommand: 'printf ''Traceback\n\033[1;31mValueError: \033[4mboom\033[0m\n\033]0;title\007'' >&2; exit 1'
trialConcurrency: 1
maxTrialNumber: 1
{SPACE}"
    );
    let config = sandbox.config(&yaml, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, "colours");
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let trials = sandbox.export("colours")["trials"].clone();
    assert_eq!(
        trials[0]["message"], "exit code 1: ValueError: boom",
        "{trials}"
    );
    let (_, listing, _) = run(sandbox.knob().args(["trial", "ls", "colours"]));
    assert!(
        listing.contains("exit code 1: ValueError: boom") && !listing.contains('\x1b'),
        "{listing:?}"
    );
}

#[test]
fn trials_over_max_trial_duration_are_killed_and_say_why() {
    let sandbox = Sandbox::new();
    let yaml = format!("trialCommand: sleep 60\ntrialConcurrency: 2\nmaxTrialNumber: 2\nmaxTrialDuration: 1s\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let started = Instant::now();
    let (code, stdout, stderr) = sandbox.create(&config, "slow");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "the sleeping trials were not killed"
    );
    for trial in sandbox.export("slow")["trials"].as_array().unwrap() {
        assert_eq!(trial["status"], "SYS_CANCELED", "{trial}");
        assert_eq!(trial["message"], "maxTrialDuration reached", "{trial}");
    }
}

#[test]
fn ctrl_c_stops_the_experiment_and_records_running_trials_as_canceled() {
    stop_signal_stops_the_experiment_and_records_running_trials_as_canceled(libc::SIGINT);
}

/// A service manager or batch scheduler stops knob with SIGTERM: the same graceful stop.
#[test]
fn sigterm_stops_the_experiment_and_records_running_trials_as_canceled() {
    stop_signal_stops_the_experiment_and_records_running_trials_as_canceled(libc::SIGTERM);
}

fn stop_signal_stops_the_experiment_and_records_running_trials_as_canceled(signal: i32) {
    let sandbox = Sandbox::new();
    let yaml = format!("trialCommand: echo started > started-$NNI_TRIAL_JOB_ID; sleep 60\ntrialConcurrency: 2\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let child = sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "interrupted"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (bounded) until both trials run, then interrupt as a terminal would.
    let code_dir = config.parent().unwrap().to_path_buf();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&code_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("started-"))
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "trials did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let export = sandbox.export("interrupted");
    assert_eq!(export["experiment"]["status"], "STOPPED");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2, "no trial may start after the stop");
    for trial in trials {
        assert_eq!(trial["status"], "USER_CANCELED", "{trial}");
    }
}

/// `knob create … 2>&1 | head -1`, or a terminal closed under it: once nobody reads its output,
/// the experiment still runs to its end (its lines dropped), and is recorded DONE, where the
/// default SIGPIPE killed it at its next line and left it "crashed" with no trial run.
#[test]
fn create_runs_to_the_end_when_nobody_reads_its_output_any_more() {
    use std::io::BufRead;
    let sandbox = Sandbox::new();
    let yaml =
        format!("trialCommand: sleep 0.2; echo KNOB_FINAL 1\ntrialConcurrency: 2\nmaxTrialNumber: 6\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let mut child = sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "unread"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("experiment unread: "), "{first}");
    // Both readers go away, as `head` exits after its line.
    drop(child.stdout.take());
    let code = crate::resume::wait_bounded(&mut child, Duration::from_secs(60));
    assert_eq!(
        code,
        Some(0),
        "exit code (-1: a signal; None: still running after 60 s)"
    );
    assert_done_with_every_trial_succeeded(&sandbox, "unread", 6);
}

/// Experiment `id` ended DONE with `trials` trials, each SUCCEEDED.
fn assert_done_with_every_trial_succeeded(sandbox: &Sandbox, id: &str, trials: usize) {
    let export = sandbox.export(id);
    assert_eq!(export["experiment"]["status"], "DONE", "{export}");
    let all = export["trials"].as_array().unwrap();
    assert_eq!(all.len(), trials, "{export}");
    assert!(all.iter().all(|t| t["status"] == "SUCCEEDED"), "{export}");
}

/// A hang-up (the terminal or the SSH session closed under `knob create`) stops nothing: the
/// experiment runs to its end, recorded DONE. Output that went to the terminal goes to
/// `$KNOB_HOME/logs/ID.log` from then on; output that went to a file (`nohup`) stays there.
/// SIGHUP's default action killed the manager at once, left the trials running unwatched and
/// the experiment "crashed".
#[test]
fn a_hang_up_leaves_the_experiment_running_with_its_output_in_the_log() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let sandbox = Sandbox::new();

    // On a terminal (a pseudo-terminal here, drained as a terminal would be).
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two new descriptors into the two integers; no name, no settings.
    let opened = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both were just opened by openpty and are owned by nothing else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let terminal = std::thread::spawn(move || {
        use std::io::Read;
        let mut shown = Vec::new();
        // Ends with EIO once no process holds the terminal's other side any more.
        let _ = std::fs::File::from(master).read_to_end(&mut shown);
        String::from_utf8_lossy(&shown).into_owned()
    });
    let stdout = std::process::Stdio::from(slave.try_clone().unwrap());
    hang_up_mid_run(&sandbox, "onterm", stdout, std::process::Stdio::from(slave));
    let shown = terminal.join().unwrap();
    assert!(shown.contains("experiment onterm: "), "{shown}");
    assert!(
        !shown.contains("DONE"),
        "the summary went to the hung-up terminal: {shown}"
    );
    let log = std::fs::read_to_string(sandbox.path().join("home/logs/onterm.log")).unwrap();
    assert!(
        log.starts_with("the terminal hung up (SIGHUP); experiment onterm goes on in the background, its output in "),
        "{log}"
    );
    assert!(
        log.contains("experiment onterm DONE: 6 trials (6 succeeded, 0 failed)"),
        "{log}"
    );
    // The progress bar stopped drawing: its redraws (up to ten a second) filled the log.
    assert!(
        !log.contains('\u{1b}'),
        "terminal escapes in the log: {log:?}"
    );

    // Into a file, as under `nohup`: it stays there, and no log is made.
    let file = sandbox.path().join("nohup.out");
    let out = std::fs::File::create(&file).unwrap();
    hang_up_mid_run(
        &sandbox,
        "nohup",
        out.try_clone().unwrap().into(),
        out.into(),
    );
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(
        written.contains("experiment nohup DONE: 6 trials (6 succeeded, 0 failed)"),
        "{written}"
    );
    assert!(!sandbox.path().join("home/logs/nohup.log").exists());
}

/// The terminal really gone (an SSH session or a terminal window closed): the kernel hangs up
/// the tty, sends SIGHUP, and `isatty` on it fails from then on (EIO). Output that went to it
/// goes to the log all the same. Asked only at the hang-up which descriptors were on a
/// terminal, knob found none, made no log, and lost the rest of its output.
#[test]
fn a_terminal_closed_under_a_run_sends_its_output_to_the_log() {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::process::CommandExt;
    let sandbox = Sandbox::new();
    // Both sides opened close-on-exec (not with openpty): a copy of the terminal's side in any
    // process this test binary starts would keep it open, and no hang-up would come. The
    // terminal is drained here, without blocking, between looks for the first trial.
    // SAFETY: posix_openpt opens a new descriptor, or fails with -1.
    let master = unsafe {
        libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK)
    };
    assert!(
        master >= 0,
        "posix_openpt: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: just opened, owned by nothing else.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: grantpt, unlockpt and ptsname_r on a pseudo-terminal master this test owns,
    // ptsname_r writing at most `name.len()` bytes into `name`.
    let slave_path = unsafe {
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0);
        assert_eq!(libc::unlockpt(master.as_raw_fd()), 0);
        assert_eq!(
            libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()),
            0
        );
        std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .unwrap()
            .to_string()
    };
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&slave_path)
        .unwrap();

    let started = sandbox.path().join("code/started");
    let yaml = format!(
        "trialCommand: touch {}; sleep 0.5; echo KNOB_FINAL 1\ntrialConcurrency: 2\nmaxTrialNumber: 6\n{SPACE}",
        started.display()
    );
    let config = sandbox.config(&yaml, &[]);
    let mut command = sandbox.create_command(&config, "closed");
    command
        .stdin(std::process::Stdio::from(slave.try_clone().unwrap()))
        .stdout(std::process::Stdio::from(slave.try_clone().unwrap()))
        .stderr(std::process::Stdio::from(slave));
    // SAFETY: only async-signal-safe calls between fork and exec: a new session whose
    // controlling terminal is the pseudo-terminal on stdin, as a shell in a terminal has.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    // The test's copies of the terminal's side go with the command.
    drop(command);
    let mut master = std::fs::File::from(master);
    let mut shown = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !started.exists() {
        assert!(
            Instant::now() < deadline,
            "no trial started: {}",
            String::from_utf8_lossy(&shown)
        );
        let mut chunk = [0; 4096];
        while let Ok(n @ 1..) = master.read(&mut chunk) {
            shown.extend_from_slice(&chunk[..n]);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // As sshd or a terminal emulator does when the session or the window closes.
    drop(master);
    let code = crate::resume::wait_bounded(&mut child, Duration::from_secs(60));
    assert_eq!(
        code,
        Some(0),
        "exit code (-1: a signal; None: still running after 60 s)"
    );
    assert_done_with_every_trial_succeeded(&sandbox, "closed", 6);
    let log = std::fs::read_to_string(sandbox.path().join("home/logs/closed.log"))
        .expect("no log made after the terminal closed");
    assert!(
        log.starts_with("the terminal hung up (SIGHUP); experiment closed goes on in the background, its output in "),
        "{log}"
    );
    assert!(
        log.contains("experiment closed DONE: 6 trials (6 succeeded, 0 failed)"),
        "{log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "terminal escapes in the log: {log:?}"
    );
}

/// Runs experiment `id` (6 trials, 2 at a time) with this stdout and stderr, sends it SIGHUP once
/// its first trial runs (the manager and its signal handling are up by then), and checks that it
/// ran to its end all the same.
fn hang_up_mid_run(
    sandbox: &Sandbox,
    id: &str,
    stdout: std::process::Stdio,
    stderr: std::process::Stdio,
) {
    let started = sandbox.path().join(format!("code/started-{id}"));
    let yaml = format!(
        "trialCommand: touch {}; sleep 0.5; echo KNOB_FINAL 1\ntrialConcurrency: 2\nmaxTrialNumber: 6\n{SPACE}",
        started.display()
    );
    let config = sandbox.config(&yaml, &[]);
    let mut child = sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", id])
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !started.exists() {
        assert!(Instant::now() < deadline, "no trial of {id} started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let code = crate::resume::wait_bounded(&mut child, Duration::from_secs(60));
    assert_eq!(
        code,
        Some(0),
        "{id}: exit code (-1: a signal; None: still running after 60 s)"
    );
    assert_done_with_every_trial_succeeded(sandbox, id, 6);
}

#[test]
fn a_gpu_experiment_without_gpus_fails_at_create_with_the_reason() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!("trialCommand: echo\ntrialConcurrency: 1\ntrialGpuNumber: 1\n{SPACE}"),
        &[],
    );
    if std::path::Path::new("/dev/nvidia0").exists() {
        crate::prerequisite::not_applicable("this machine has an NVIDIA GPU");
        return;
    }
    let mut command = sandbox.knob();
    command
        .env_remove("KNOB_SIMULATE_GPUS")
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "gpu"]);
    let (code, _, stderr) = run(&mut command);
    assert_eq!(code, 1);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot place trials") && stderr.contains("NVML"),
        "{stderr}"
    );
    assert!(!sandbox.path().join("experiments/gpu").exists());
}

/// More cores than this machine has: `create` refuses the config naming the field at its line
/// (it named no line), and `config check`, which passed it without a word, warns that `create`
/// would refuse it here but passes (the config is valid for a larger machine).
#[test]
fn more_cores_than_the_machine_has_are_named_at_their_line() {
    let sandbox = Sandbox::new();
    let yaml = format!("trialCommand: echo\ntrialConcurrency: 1\ntrialCpuNumber: 100000\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let expected = format!("{}:3:17: trialCpuNumber: ", config.display());

    let (code, _, stderr) = run(sandbox.knob().arg("create").arg("--config").arg(&config));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: {expected}cannot place trials: the trial asks for 100000 CPU cores"
        )) && stderr.contains(": lower trialCpuNumber to ")
            && stderr.lines().count() == 1,
        "{stderr}"
    );

    for v2 in [false, true] {
        let mut command = sandbox.knob();
        command.args(["config", "check"]);
        if v2 {
            command.arg("--v2");
        }
        let (code, stdout, stderr) = run(command.arg(&config));
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.contains("trialCpuNumber: 100000"), "{stdout}");
        assert!(
            stderr.starts_with(&format!(
                "warning: {expected}knob create on this machine would refuse the config: the trial asks for 100000 CPU cores"
            )) && stderr.lines().count() == 1,
            "{stderr}"
        );
    }
}

/// `command` run under a limit of `kib` KiB on its address space, as `ulimit -v` sets it.
fn limit_address_space(command: &mut Command, kib: u64) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: only `setrlimit`, async-signal-safe, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: kib * 1024,
                rlim_max: kib * 1024,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    command
}

/// Under a limit on the address space (`ulimit -v`, a batch system's `h_vmem`), 64 trials at
/// once grew knob to some 50 threads, each with a malloc arena reserving 64 MiB: it aborted
/// ("memory allocation of 1 bytes failed") at 600 000 KiB, using 70 MB of real memory, and left
/// the experiment crashed.
#[test]
fn a_run_of_64_trials_at_once_fits_a_600_mb_address_space_limit() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: sleep 0.2; echo KNOB_FINAL 1\ntrialConcurrency: 64\nmaxTrialNumber: 256\n{SPACE}"
        ),
        &[],
    );
    let mut command = sandbox.knob();
    command
        .args(["create", "--config"])
        .arg(&config)
        .args(["--id", "limited"]);
    let (code, stdout, stderr) = run(limit_address_space(&mut command, 600_000));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment limited DONE: 256 trials (256 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
}

/// The JSON export is written as it is made: of 400 000 intermediate results (60 MB of JSON)
/// it needs little more than the experiment's state. Made whole as one value first it took
/// some 2 KB a result (2.2 GB for a million) and aborted under this 600 MB limit.
#[test]
fn the_json_export_of_400_000_intermediate_results_fits_a_600_mb_address_space_limit() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: seq 400000 | sed 's/^/KNOB_INTERMEDIATE /'; echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}"
        ),
        &[],
    );
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .args(["create", "--config"])
        .arg(&config)
        .args(["--id", "curves"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let written = sandbox.path().join("curves.json");
    let mut command = sandbox.knob();
    command
        .args(["experiment", "export", "curves", "-o"])
        .arg(&written);
    let (code, _, stderr) = run(limit_address_space(&mut command, 600_000));
    assert_eq!(code, 0, "{stderr}");
    let json = std::fs::read_to_string(&written).unwrap();
    let results = json.matches("\"raw\": ").count();
    assert_eq!(results, 400_000, "{}", &json[..2000.min(json.len())]);
    assert!(json.ends_with("]\n}\n"), "{}", &json[json.len() - 200..]);
}

/// A `gpuIndices` entry the machine has no GPU for is a config mistake (a typo, a config from a
/// larger machine): create refuses it in one line, where it used to drop the index in silence
/// and run on the GPUs that exist.
#[test]
fn gpu_indices_naming_a_gpu_the_machine_lacks_fail_at_create() {
    let sandbox = Sandbox::new();
    let space = SPACE.replace("platform: local", "platform: local\n  gpuIndices: '1,3'");
    let yaml = format!("trialCommand: echo\ntrialConcurrency: 1\ntrialGpuNumber: 1\n{space}");
    // `knob create` of `yaml` as experiment `id` on a simulated machine of two GPUs.
    let create_on_two_gpus = |yaml: &str, id: &str| {
        let config = sandbox.config(yaml, &[]);
        let mut command = sandbox.knob();
        command
            .env("KNOB_SIMULATE_GPUS", "2x16GiB")
            .arg("create")
            .arg("--config")
            .arg(&config)
            .args(["--id", id]);
        run(&mut command)
    };
    let (code, _, stderr) = create_on_two_gpus(&yaml, "indices");
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot place trials: environment local: gpuIndices names GPU 3, but the GPUs found are 0, 1: list only GPUs it has"),
        "{stderr}"
    );
    assert!(!sandbox.path().join("experiments/indices").exists());
    // Trials that ask for no GPU are placed on none: the config runs, as under NNI.
    for (gpus, id) in [("trialGpuNumber: 0\n", "nogpus"), ("", "unset")] {
        let yaml =
            format!("trialCommand: echo\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{gpus}{space}");
        let (code, stdout, stderr) = create_on_two_gpus(&yaml, id);
        assert_eq!(code, 0, "{gpus:?}: {stdout}\n{stderr}");
        assert!(
            stdout.contains("(1 succeeded, 0 failed)"),
            "{gpus:?}: {stdout}"
        );
    }
}

/// Four trials wanting one GPU each, two at a time, on a simulated 2-GPU machine: each trial sees
/// one GPU in CUDA_VISIBLE_DEVICES and no two running trials share one.
#[test]
fn trials_get_their_own_gpu_on_a_simulated_machine() {
    let sandbox = Sandbox::new();
    let script =
        "echo \"$CUDA_VISIBLE_DEVICES $(date +%s%N)\" > gpu-$NNI_TRIAL_JOB_ID.start\nsleep 0.3\n\
                  echo \"$(date +%s%N)\" > gpu-$NNI_TRIAL_JOB_ID.end\necho KNOB_FINAL 1\n";
    let yaml = format!("trialCommand: bash trial.sh\ntrialConcurrency: 3\nmaxTrialNumber: 6\ntrialGpuNumber: 1\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let mut command = sandbox.knob();
    command
        .env("KNOB_SIMULATE_GPUS", "2x16GiB")
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "gpus"]);
    let (code, stdout, stderr) = run(&mut command);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("6 trials (6 succeeded, 0 failed)"),
        "{stdout}"
    );
    let code_dir = config.parent().unwrap();
    let mut spans: Vec<(String, u128, u128)> = Vec::new();
    for entry in std::fs::read_dir(code_dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(trial) = name.strip_suffix(".start") {
            let start = std::fs::read_to_string(entry.path()).unwrap();
            let (gpu, at) = start.trim().split_once(' ').unwrap();
            let end = std::fs::read_to_string(code_dir.join(format!("{trial}.end"))).unwrap();
            spans.push((
                gpu.to_string(),
                at.parse().unwrap(),
                end.trim().parse().unwrap(),
            ));
        }
    }
    assert_eq!(spans.len(), 6);
    for (i, a) in spans.iter().enumerate() {
        assert!(a.0 == "0" || a.0 == "1", "CUDA_VISIBLE_DEVICES={:?}", a.0);
        for b in &spans[i + 1..] {
            let overlap = a.1 < b.2 && b.1 < a.2;
            assert!(
                !(overlap && a.0 == b.0),
                "two running trials shared GPU {}: {spans:?}",
                a.0
            );
        }
    }
}

/// A tuner that refuses the search space is refused by create at the search space's line,
/// before anything is registered (it used to end a registered experiment in ERROR).
#[test]
fn a_tuner_that_refuses_the_search_space_is_refused_before_anything_is_created() {
    let sandbox = Sandbox::new();
    let yaml = "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nsearchSpace: {}\ntuner:\n  name: GridSearch\ntrainingService:\n  platform: local";
    let config = sandbox.config(yaml, &[]);
    let (code, _, stderr) = sandbox.create(&config, "broken");
    assert_eq!(code, 1);
    let expected = "config.yml:3:14: searchSpace: tuner GridSearch refuses this search space: the search space is empty; give it at least one parameter to search over";
    assert!(stderr.contains(expected), "{stderr}");
    assert!(!sandbox.path().join("experiments/broken").exists());
}

#[test]
fn max_experiment_duration_ends_the_experiment_and_cancels_running_trials() {
    let sandbox = Sandbox::new();
    let yaml =
        format!("trialCommand: sleep 60\ntrialConcurrency: 2\nmaxExperimentDuration: 2s\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let started = Instant::now();
    let (code, stdout, stderr) = sandbox.create(&config, "timed");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "the experiment outlived its duration"
    );
    let export = sandbox.export("timed");
    assert_eq!(export["experiment"]["status"], "DONE");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2, "no trial may start after the deadline");
    for trial in trials {
        assert_eq!(trial["status"], "SYS_CANCELED", "{trial}");
        assert_eq!(trial["message"], "maxExperimentDuration reached", "{trial}");
    }
}

#[test]
fn the_experiment_ends_when_the_tuner_has_nothing_more_to_try() {
    let sandbox = Sandbox::new();
    let yaml = "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 3\nsearchSpace:\n  a: {_type: choice, _value: [x, y, z]}\n  b: {_type: randint, _value: [0, 2]}\ntuner:\n  name: GridSearch\ntrainingService:\n  platform: local";
    let config = sandbox.config(yaml, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, "grid");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("grid");
    let mut points: Vec<String> = export["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["parameters"].to_string())
        .collect();
    points.sort();
    points.dedup();
    assert_eq!(points.len(), 6, "every grid point exactly once: {points:?}");
    assert_eq!(export["trials"].as_array().unwrap().len(), 6);
}

#[test]
fn garbage_and_nan_metrics_are_tolerated_and_nothing_else_is_lost() {
    let sandbox = Sandbox::new();
    let script = "echo 'KNOB_INTERMEDIATE not-json'\necho 'KNOB_INTERMEDIATE NaN'\n\
                  head -c 10000000 /dev/zero | tr '\\0' x; echo\necho 'KNOB_INTERMEDIATE 2'\n\
                  echo 'KNOB_INTERMEDIATE {\"loss\": 1}'\necho 'KNOB_FINAL {\"default\": 0.5, \"loss\": Infinity}'\n";
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "noisy");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("noisy");
    let trial = &export["trials"][0];
    assert_eq!(trial["status"], "SUCCEEDED", "{trial}");
    assert_eq!(trial["final"], 0.5, "{trial}");
    assert_eq!(
        trial["final_raw"], r#"{"default": 0.5, "loss": Infinity}"#,
        "{trial}"
    );
    let intermediate = trial["intermediate"].as_array().unwrap();
    let raws: Vec<&str> = intermediate
        .iter()
        .map(|m| m["raw"].as_str().unwrap())
        .collect();
    // A dict without "default" (in an experiment without objectives) is kept as sent, with a
    // warning that no number could be read from it.
    assert_eq!(raws, ["NaN", "2", r#"{"loss": 1}"#], "{trial}");
    assert_eq!(intermediate[0]["value"], Value::Null);
    assert_eq!(intermediate[1]["value"], 2.0);
    assert_eq!(intermediate[2]["value"], Value::Null);
    let warned = export["warnings"].to_string();
    assert!(
        warned.contains(r#"has no \"default\" entry; the assessor does not see it"#),
        "{warned}"
    );
}

/// `knob trial ls ID` as (header, rows), each row the line of one trial.
fn trial_ls(sandbox: &Sandbox, id: &str) -> Vec<String> {
    let (code, stdout, stderr) = run(sandbox.knob().args(["trial", "ls", id]));
    assert_eq!(code, 0, "{stderr}");
    stdout.lines().skip(1).map(String::from).collect()
}

#[test]
fn an_infinite_final_is_never_the_best_live_in_the_store_or_after_resume() {
    let sandbox = Sandbox::new();
    // Maximised: trial 0 reports +Infinity, the others their sequence number (trial 1 then
    // reports 100 as a second final, which is ignored: the first counts, live and stored).
    let script = "if [ \"$NNI_TRIAL_SEQ_ID\" = 0 ]; then echo 'KNOB_FINAL Infinity'; \
                  else echo \"KNOB_FINAL $NNI_TRIAL_SEQ_ID\"; fi\n\
                  if [ \"$NNI_TRIAL_SEQ_ID\" = 1 ]; then echo 'KNOB_FINAL 100'; fi\n";
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 3\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "inf");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let best_row = |stdout: &str| {
        let table: Vec<&str> = stdout.lines().skip_while(|l| !l.starts_with('#')).collect();
        assert!(table.len() > 1, "{stdout}");
        table[1].to_string()
    };
    let export = sandbox.export("inf");
    let trials = export["trials"].as_array().unwrap();
    let infinite = trials.iter().find(|t| t["sequence"] == 0).unwrap();
    let infinite_id = infinite["id"].as_str().unwrap();
    assert_eq!(infinite["status"], "SUCCEEDED", "{infinite}");
    assert_eq!(infinite["final"], Value::Null, "{infinite}");
    assert_eq!(infinite["final_raw"], "Infinity", "{infinite}");
    let second = trials.iter().find(|t| t["sequence"] == 1).unwrap();
    assert_eq!(second["final"], 1.0, "{second}");
    // Live: the best is trial 2's 2, and the infinite trial is not ranked at all.
    assert!(best_row(&stdout).contains("2.000000"), "{stdout}");
    assert!(!stdout.contains(infinite_id), "{stdout}");
    let listing = trial_ls(&sandbox, "inf");
    let row = listing.iter().find(|l| l.starts_with(infinite_id)).unwrap();
    assert!(row.contains("- (Infinity)"), "{row}");

    // After a resume (one more trial) the summary says the same.
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["resume", "inf", "--max-trial-number", "4"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("4 trials (4 succeeded"), "{stdout}");
    assert!(best_row(&stdout).contains("3.000000"), "{stdout}");
    assert!(!stdout.contains(infinite_id), "{stdout}");
}

#[test]
fn a_second_final_result_is_named_on_the_console_once_with_the_result_kept() {
    let sandbox = Sandbox::new();
    // A script that reports its final every epoch (a common slip): each trial's first final
    // counts, and the console says so once, not once per trial or per epoch.
    let script = "for epoch in 1 2 3; do echo \"KNOB_FINAL 0.$NNI_TRIAL_SEQ_ID$epoch\"; done\n";
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 2\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "twice");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("twice");
    let trials = export["trials"].as_array().unwrap();
    let first = trials.iter().find(|t| t["sequence"] == 0).unwrap();
    assert_eq!(first["final"], 0.01, "{first}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("second final result ignored"))
        .collect();
    let id = first["id"].as_str().unwrap();
    assert_eq!(
        said,
        [format!("warning: trial {id}: second final result ignored: a trial's result is the first final it reports (0.01); report the final once, and per-epoch values as intermediate results")],
        "{stderr}"
    );
    // The store names each one, with the result each trial kept.
    let warnings = export["warnings"].to_string();
    for kept in ["(0.01)", "(0.11)"] {
        let count = warnings
            .matches(&format!("the first final it reports {kept}"))
            .count();
        assert_eq!(count, 2, "{kept}: {warnings}");
    }
}

#[test]
fn a_final_written_to_stderr_is_named_in_the_trials_warning() {
    let sandbox = Sandbox::new();
    // Python's logging writes to stderr, where knob reads no metric line: trial 0's result is
    // lost, and it is told why; trial 1 reports on stdout too, and is told nothing.
    let script = "echo \"INFO:root:KNOB_FINAL 0.5\" >&2\n\
                  if [ \"$NNI_TRIAL_SEQ_ID\" = 1 ]; then echo 'KNOB_FINAL 0.7'; fi\n";
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 2\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "stderr");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("stderr");
    let trials = export["trials"].as_array().unwrap();
    let id = |sequence: u64| {
        let trial = trials.iter().find(|t| t["sequence"] == sequence).unwrap();
        trial["id"].as_str().unwrap().to_string()
    };
    let warnings: Vec<String> = export["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["message"].as_str().unwrap().to_string())
        .filter(|m| m.contains("stderr"))
        .collect();
    assert_eq!(
        warnings,
        [format!("trial {}: no final result recorded, but its stderr has \"INFO:root:KNOB_FINAL 0.5\": knob reads metric lines only on stdout or in $KNOB_METRICS_FILE (Python's logging and print(..., file=sys.stderr) write to stderr); print them to stdout, or report with knob_trial or nni", id(0))],
        "{}",
        export["warnings"]
    );
    assert!(!warnings[0].contains(&id(1)));
}

#[test]
fn unreadable_finals_are_shown_on_the_console_in_trial_ls_and_as_the_trials_message() {
    let sandbox = Sandbox::new();
    let script = "case $NNI_TRIAL_SEQ_ID in\n\
                  0) echo 'KNOB_FINAL hello' ;;\n\
                  1) echo 'KNOB_FINAL 1e400' ;;\n\
                  2) echo 'KNOB_FINAL {\"acc\":0.5}' ;;\n\
                  3) echo 'KNOB_FINAL {\"default\":\"abc\"}' ;;\n\
                  *) printf 'KNOB_FINAL 0.5\\377\\n' ;;\n\
                  esac\n";
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 5\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "garbled");
    // Documented choice: the trial keeps the status of its exit, SUCCEEDED, without a final.
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("5 trials (5 succeeded, 0 failed)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("no trial reported a usable final result (5 reported one that is NaN, infinite or unreadable"),
        "{stdout}"
    );
    let expected = [
        (0, r#"metric "hello" is not JSON"#, "- (hello)"),
        (
            1,
            r#"metric "1e400" is not JSON: number out of range"#,
            "- (1e400)",
        ),
        (2, r#"has no "default" entry"#, r#"- ({"acc":0.5})"#),
        (3, r#"is not a number"#, r#"- ({"default":"abc"})"#),
        // A byte that is not UTF-8 (shown as U+FFFD) makes a final unreadable like the others.
        (4, "metric \"0.5\u{FFFD}\" is not JSON", "- (0.5\u{FFFD})"),
    ];
    let export = sandbox.export("garbled");
    let listing = trial_ls(&sandbox, "garbled");
    for (sequence, reason, cell) in expected {
        let trial = export["trials"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["sequence"] == sequence)
            .unwrap();
        let id = trial["id"].as_str().unwrap();
        assert_eq!(trial["status"], "SUCCEEDED", "{trial}");
        assert_eq!(trial["final"], Value::Null, "{trial}");
        let message = trial["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("final result unreadable: ") && message.contains(reason),
            "{trial}"
        );
        let notice = format!("warning: trial {id}: final result unreadable: ");
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&notice) && l.contains(reason)),
            "{notice}\n{stderr}"
        );
        let row = listing.iter().find(|l| l.starts_with(id)).unwrap();
        assert!(
            row.contains(cell) && row.contains("final result unreadable"),
            "{row}"
        );
    }
}

#[test]
fn the_tuner_sees_an_infinite_final_as_a_resume_does() {
    // Evolution breeds from the best results it was given. The uninterrupted run and a run
    // resumed halfway must suggest the same: both hand the +Infinity of trial 0 over as NaN.
    let script = "x=$(echo \"$KNOB_PARAMETERS\" | tr -dc 0-9)\n\
                  if [ \"$NNI_TRIAL_SEQ_ID\" = 0 ]; then echo 'KNOB_FINAL Infinity'; else echo \"KNOB_FINAL $x\"; fi\n";
    let space = "searchSpace:\n  x: {_type: randint, _value: [0, 1000000]}\n\
                 tuner:\n  name: Evolution\n  classArgs: {seed: 7, optimize_mode: maximize, population_size: 3}\n\
                 trainingService:\n  platform: local";
    let parameters = |sandbox: &Sandbox, id: &str| -> Vec<Value> {
        sandbox.export(id)["trials"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["parameters"].clone())
            .collect()
    };
    let whole = Sandbox::new();
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 8\n{space}");
    let config = whole.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = whole.create(&config, "whole");
    assert_eq!(code, 0, "{stdout}\n{stderr}");

    let halves = Sandbox::new();
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 4\n{space}");
    let config = halves.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = halves.create(&config, "halves");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let (code, stdout, stderr) =
        run(halves
            .knob()
            .args(["resume", "halves", "--max-trial-number", "8"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");

    assert_eq!(parameters(&whole, "whole"), parameters(&halves, "halves"));
}

/// A trial's `setsid` child and double-forked daemon leave its process group; neither outlives
/// the experiment, whether their trial finished (sequence 0) or was still running when
/// maxExperimentDuration ended the experiment (sequence 1) (issue 20 item 3).
#[test]
fn processes_that_left_a_trials_group_do_not_outlive_the_experiment() {
    let sandbox = Sandbox::new();
    let script = r#"setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "$NNI_OUTPUT_DIR/setsid.pid"
( setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "$NNI_OUTPUT_DIR/daemon.pid" )
if [ "$NNI_TRIAL_SEQ_ID" = 0 ]; then echo KNOB_FINAL 1; else sleep 60; fi
"#;
    let yaml = format!(
        "trialCommand: bash leave.sh\ntrialConcurrency: 2\nmaxTrialNumber: 2\nmaxExperimentDuration: 8s\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[("leave.sh", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "escape");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let trials = sandbox.export("escape")["trials"]
        .as_array()
        .unwrap()
        .clone();
    let statuses: Vec<&str> = trials
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert!(
        statuses.contains(&"SUCCEEDED") && statuses.contains(&"SYS_CANCELED"),
        "{statuses:?}"
    );
    let trials_dir = sandbox.path().join("experiments/escape/trials");
    let mut checked = 0;
    for trial in std::fs::read_dir(&trials_dir).unwrap() {
        for name in ["setsid.pid", "daemon.pid"] {
            let text = std::fs::read_to_string(trial.as_ref().unwrap().path().join(name)).unwrap();
            let pid: i32 = text.trim().parse().unwrap();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat.rfind(')').map(|end| &stat[end + 2..end + 3]);
            assert!(
                matches!(state, None | Some("Z" | "X")),
                "{name} {pid} of {} outlived the experiment: {stat}",
                trial.unwrap().path().display()
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 4);
}

/// A busy --port, or a --bind address this machine does not have, fails before the experiment
/// is registered: nothing is left that would block the id, which then runs (issue 20 item 11).
#[test]
fn a_busy_port_or_a_foreign_bind_address_registers_nothing() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}"
        ),
        &[],
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    // 192.0.2.1 is TEST-NET-1 (RFC 5737): no machine has it.
    let attempts: [&[&str]; 3] = [
        &["--port", &port],
        &["--port", &port, "--detach"],
        &["--bind", "192.0.2.1", "--token", "s3cret"],
    ];
    for extra in attempts {
        let (code, stdout, stderr) = run(sandbox
            .knob()
            .arg("create")
            .arg("--config")
            .arg(&config)
            .args(["--id", "blocked"])
            .args(extra));
        assert_eq!(code, 1, "{extra:?}: {stdout}\n{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{extra:?}: {stderr}");
        assert!(
            stderr.contains("cannot serve the API on ")
                && (stderr.contains(&format!("127.0.0.1:{port}"))
                    || stderr.contains("192.0.2.1:0")),
            "{extra:?}: {stderr}"
        );
        // And what to do about it.
        assert!(
            stderr.contains("give another --port, or leave --port out for a free one")
                || stderr.contains("--bind one of its own"),
            "{extra:?}: {stderr}"
        );
        let (code, list, _) = run(sandbox.knob().args(["experiment", "list"]));
        assert_eq!(code, 0);
        assert!(
            !list.contains("blocked"),
            "{extra:?} registered it:\n{list}"
        );
        assert!(
            !sandbox.path().join("experiments/blocked").exists(),
            "{extra:?} made its folder"
        );
    }
    let (code, stdout, stderr) = sandbox.create(&config, "blocked");
    assert_eq!(code, 0, "{stdout}\n{stderr}");

    // A resume on the busy port fails before it raises the stored maxTrialNumber: the next
    // plain resume still has a budget of one trial, used up.
    let (code, _, stderr) = run(sandbox.knob().args([
        "resume",
        "blocked",
        "--max-trial-number",
        "3",
        "--port",
        &port,
    ]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cannot serve the API on "), "{stderr}");
    let (code, stdout, stderr) = run(sandbox.knob().args(["resume", "blocked"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(
        sandbox.export("blocked")["trials"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    drop(taken);
}

/// A bad or oversized KNOB_SIMULATE_GPUS is refused by create before anything is registered,
/// in one line printed once (it used to end a registered experiment in ERROR, its line printed
/// as a warning and again in the error) (issue 20 item 14 part).
#[test]
fn a_bad_simulated_gpu_spec_is_refused_before_anything_is_registered() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\ntrialGpuNumber: 1\n{SPACE}"
        ),
        &[],
    );
    for spec in ["1000000x1GiB", "lots"] {
        let (code, stdout, stderr) = run(sandbox
            .knob()
            .env("KNOB_SIMULATE_GPUS", spec)
            .arg("create")
            .arg("--config")
            .arg(&config)
            .args(["--id", "simulated"]));
        assert_eq!(code, 1, "{spec}: {stdout}\n{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{spec}: {stderr}");
        assert_eq!(
            stderr.matches("cannot read simulated GPU spec").count(),
            1,
            "{stderr}"
        );
        assert!(
            stderr.contains(&format!("KNOB_SIMULATE_GPUS is set and cannot be used for this machine: cannot read simulated GPU spec `{spec}`")),
            "{stderr}"
        );
        let (_, list, _) = run(sandbox.knob().args(["experiment", "list"]));
        assert!(!list.contains("simulated"), "{spec} registered it:\n{list}");
    }
}

/// A tuner given no `optimize_mode` is judged the way it optimises: NNI's TPE minimises by
/// default, so "best" is the lowest final (it used to be the highest, knob's default for every
/// tuner, while TPE went for the lowest).
#[test]
fn a_tuner_without_optimize_mode_is_judged_the_way_it_optimises() {
    let sandbox = Sandbox::new();
    let yaml = "trialCommand: python3 trial.py\ntrialConcurrency: 1\nmaxTrialNumber: 3\n\
                searchSpace:\n  x: {_type: randint, _value: [0, 1000]}\n\
                tuner:\n  name: TPE\n  classArgs: {seed: 1}\ntrainingService:\n  platform: local";
    let trial =
        "import json, os\nprint('KNOB_FINAL', json.loads(os.environ['KNOB_PARAMETERS'])['x'])\n";
    let config = sandbox.config(yaml, &[("trial.py", trial)]);
    let (code, stdout, stderr) = sandbox.create(&config, "tpe");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("tpe");
    let lowest = export["trials"]
        .as_array()
        .unwrap()
        .iter()
        .min_by(|a, b| {
            a["final"]
                .as_f64()
                .partial_cmp(&b["final"].as_f64())
                .unwrap()
        })
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The table of the best trials, best first.
    let mut lines = stdout.lines().skip_while(|line| !line.contains("best ("));
    let header = lines.next().unwrap_or_else(|| panic!("no table: {stdout}"));
    let first = lines.next().unwrap_or_default();
    assert!(
        header.contains("best (min)") && first.contains(&lowest),
        "{stdout}\n{export:#}"
    );
}

/// A tuner that runs out of parameters before `maxTrialNumber` (a finite space used up) ends
/// the experiment DONE with a note that says why: it ended after 2 of 6 trials without a word.
#[test]
fn a_search_space_used_up_before_the_budget_is_said() {
    let sandbox = Sandbox::new();
    let yaml = "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 6\n\
                searchSpace:\n  x: {_type: choice, _value: [1, 2]}\n\
                tuner:\n  name: Random\ntrainingService:\n  platform: local";
    let config = sandbox.config(yaml, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, "used-up");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment used-up DONE: 2 trials"),
        "{stdout}"
    );
    assert!(
        stderr.contains(
            "note: experiment used-up: the tuner has no more parameters to try, after 2 trial(s) of maxTrialNumber 6"
        ),
        "{stderr}"
    );
    let export = sandbox.export("used-up");
    assert!(
        export["experiment"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("the tuner has no more parameters")),
        "{export:#}"
    );
    // A budget that ends the run first needs no note.
    let yaml = yaml.replace("maxTrialNumber: 6", "maxTrialNumber: 2");
    let config = sandbox.config(&yaml, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, "budget");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(!stderr.contains("no more parameters"), "{stderr}");
}

/// `--detach` opened `$KNOB_HOME/logs/ID.log` before the id was checked: `../escape` wrote
/// `$KNOB_HOME/escape.log`, other bad ids left junk logs or failed with the filesystem's error
/// (`No such file or directory`, `File name too long`) instead of the id rule. Checked first,
/// each gets the rule's line, and nothing is written.
#[test]
fn a_detached_create_refuses_a_bad_id_before_writing_anything() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}"
        ),
        &[],
    );
    let long = "x".repeat(300);
    // "-x1": every command given it would read it as options (`knob trial ls -x1`).
    for id in [
        "../escape",
        "",
        ".",
        "..",
        "a b",
        "a/b",
        long.as_str(),
        "-x1",
    ] {
        let (code, stdout, stderr) = run(sandbox
            .knob()
            .arg("create")
            .arg("--config")
            .arg(&config)
            .arg(format!("--id={id}"))
            .arg("--detach"));
        assert_eq!((code, stdout.as_str()), (1, ""), "{id:?}: {stderr}");
        assert_eq!(
            stderr,
            format!("error: experiment id {id:?} is not valid: use 1 to 64 letters, digits, '-' or '_', not starting with '-'\n"),
            "{id:?}"
        );
        let mut made: Vec<_> = std::fs::read_dir(sandbox.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        made.sort();
        assert_eq!(made, ["code"], "{id:?} wrote something");
    }
}

/// A tuner given no seed logs the one it drew, once, and that seed replays the run: `knob create`
/// builds a tuner to check the config before the run's, and each logged a seed of its own, the
/// first of which replayed nothing (hunt H2 F4).
#[test]
fn an_unseeded_tuner_logs_one_seed_and_it_replays_the_run() {
    let sandbox = Sandbox::new();
    let yaml = "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 3\n\
                searchSpace:\n  x: {_type: uniform, _value: [0, 1]}\n\
                tuner:\n  name: Random\ntrainingService:\n  platform: local";
    let config = sandbox.config(yaml, &[]);
    let (code, stdout, stderr) = run(sandbox
        .create_command(&config, "drawn")
        .env("KNOB_LOG", "info"));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let seeds: Vec<&str> = stderr
        .lines()
        .chain(stdout.lines())
        .filter_map(|line| line.split("Random: using seed ").nth(1))
        .filter_map(|rest| rest.split(';').next())
        .collect();
    assert_eq!(seeds.len(), 1, "one seed line:\n{stdout}\n{stderr}");

    let replay = sandbox.config(
        &yaml.replace(
            "name: Random",
            &format!("name: Random\n  classArgs: {{seed: {}}}", seeds[0]),
        ),
        &[],
    );
    let (code, stdout, stderr) = sandbox.create(&replay, "replayed");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let parameters = |id: &str| -> Vec<Value> {
        let export = sandbox.export(id);
        let mut trials = export["trials"].as_array().unwrap().clone();
        trials.sort_by_key(|trial| trial["sequence"].as_u64());
        trials
            .iter()
            .map(|trial| trial["parameters"].clone())
            .collect()
    };
    assert_eq!(parameters("drawn"), parameters("replayed"));
}
