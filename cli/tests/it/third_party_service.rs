//! A third-party training service end to end: `examples/third-party-training-service/` (a crate
//! outside the workspace, `platform: nice`) is built here, selected and configured from an
//! experiment config, and runs the experiment's trials.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::create::Sandbox;
use crate::{repo_root, run};

/// Builds the example plugin (into its own folder of the workspace's target dir, kept between
/// runs) and returns its library.
fn build_nice_service() -> PathBuf {
    let manifest = repo_root().join("examples/third-party-training-service/Cargo.toml");
    let target = crate::bin_dir()
        .parent()
        .expect("the target dir")
        .join("third-party-training-service");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["build", "--quiet", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("cannot run cargo");
    assert!(
        output.status.success(),
        "building the example training service failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let library = target.join("debug/libknob_nice_service.so");
    assert!(library.is_file(), "{} was not built", library.display());
    library
}

/// This process's niceness, as `nice` prints it: trials are `nice -n LEVEL` from here.
fn own_niceness() -> i32 {
    let output = Command::new("nice").output().expect("cannot run nice");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap()
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if std::fs::read(&path)
                .map(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
                .unwrap_or(false)
            {
                found.push(path);
            }
        }
    }
    found
}

const TOKEN: &str = "tok-7f3a9c-never-stored";

/// The first 16 hex digits of the sha256 of `text`, as the trial computes them (the trial
/// command must not hold the secret itself: knob stores the command).
fn sha256_prefix(text: &str) -> String {
    let output = Command::new("bash")
        .args(["-c", "printf %s \"$1\" | sha256sum | cut -c1-16", "-", text])
        .output()
        .expect("cannot run sha256sum");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn a_third_party_service_runs_an_experiment_from_its_config() {
    let library = build_nice_service();
    let sandbox = Sandbox::new();
    let level = 7;
    // Each trial checks that the secret reached it in clear, then reports its own niceness.
    let digest = sha256_prefix(TOKEN);
    assert_eq!(digest.len(), 16);
    let config = sandbox.config(
        &format!(
            r#"searchSpace:
  x: {{_type: choice, _value: [1, 2, 3, 4, 5]}}
trialCommand: 'test "$(printf %s "$NICE_API_TOKEN" | sha256sum | cut -c1-16)" = {digest} && echo "KNOB_FINAL $(nice)"'
trialConcurrency: 2
maxTrialNumber: 3
tuner: {{name: Random}}
trainingService:
  platform: Nice
  niceLevel: {level}
  apiToken: {TOKEN}
pluginPaths: [{}]"#,
            library.display()
        ),
        &[],
    );

    // `knob config check` prints the service's canonical form, its secret as `***`.
    let (code, canonical, stderr) = run(sandbox.knob().args(["config", "check"]).arg(&config));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        canonical.contains("  - platform: nice\n    niceLevel: 7\n    apiToken: \"***\"\n"),
        "{canonical}"
    );
    assert!(!canonical.contains(TOKEN), "{canonical}");

    let (code, stdout, stderr) = sandbox.create(&config, "nice");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment nice DONE: 3 trials (3 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
    // The niceness really applied: each trial reported `nice` as it saw it.
    let expected = (own_niceness() + level).min(19);
    let export = sandbox.export("nice");
    for trial in export["trials"].as_array().unwrap() {
        assert_eq!(
            trial["final"].as_f64(),
            Some(f64::from(expected)),
            "{trial}"
        );
    }
    // The secret is nowhere on disk: not in the store, the registry or the trials' files.
    assert!(!export.to_string().contains(TOKEN));
    for dir in ["experiments", "home"] {
        let found = files_containing(&sandbox.path().join(dir), TOKEN);
        assert!(
            found.is_empty(),
            "the secret is stored in clear in {found:?}"
        );
    }

    // On resume knob asks for the secret again, as the service declared it: from the config
    // file the experiment was created from, else from the variable the service named.
    let resume = |max: &str, token: Option<&str>| {
        let mut command = sandbox.knob();
        command.args(["resume", "nice", "--max-trial-number", max]);
        command.env_remove("NICE_API_TOKEN");
        if let Some(token) = token {
            command.env("NICE_API_TOKEN", token);
        }
        run(&mut command)
    };
    let (code, stdout, stderr) = resume("4", None);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("4 trials (4 succeeded"),
        "{stdout}\n{stderr}"
    );
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::remove_file(&config).unwrap();
    let (code, stdout, stderr) = resume("5", None);
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stderr.lines().any(|line| line.starts_with("error: ")
            && line.contains(
                "trainingService[0].apiToken: this secret is not known (knob never stores it)"
            )
            && line.ends_with("or set NICE_API_TOKEN")),
        "{stderr}"
    );
    let (code, stdout, stderr) = resume("5", Some(TOKEN));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("5 trials (5 succeeded"),
        "{stdout}\n{stderr}"
    );
    for dir in ["experiments", "home"] {
        let found = files_containing(&sandbox.path().join(dir), TOKEN);
        assert!(
            found.is_empty(),
            "the secret is stored in clear in {found:?}"
        );
    }

    // The service's own errors reach the user as one line, with file, line, column and the
    // field's path.
    std::fs::write(&config, text.replace("niceLevel: 7", "niceLevel: 30")).unwrap();
    let (code, _, stderr) = run(sandbox.knob().args(["config", "check"]).arg(&config));
    assert_ne!(code, 0);
    assert!(
        stderr.lines().any(|line| line.starts_with("error: ")
            && line.ends_with(
                ":9:14: trainingService.niceLevel: must be from 0 to 19 (nice's range), got 30"
            )),
        "{stderr}"
    );
}
