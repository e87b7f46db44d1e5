//! knob's secret variables (`knob_plugin_api::secrets`): no trial inherits one, the README names
//! each, and no source spells one outside the list.

use std::path::Path;
use std::process::Command;

use knob_plugin_api::secrets::SECRET_VARIABLES;

use crate::create::Sandbox;
use crate::repo_root;

/// A variable of knob's environment that is no secret, which a trial inherits: the proof that
/// the trial's environment was printed at all.
const INHERITED: (&str, &str) = ("KNOB_TEST_INHERITED", "passed-on");

/// The `NAME=` lines of a printed environment that name one of `names`.
fn lines_naming<'a>(environment: &'a str, names: &[&str]) -> Vec<&'a str> {
    environment
        .lines()
        .filter(|line| {
            names
                .iter()
                .any(|name| line.starts_with(&format!("{name}=")))
        })
        .collect()
}

/// Sets every secret variable (and [`INHERITED`]) in the environment of `command`, a `knob`.
pub(crate) fn with_secrets(command: &mut Command) -> &mut Command {
    for name in SECRET_VARIABLES {
        command.env(name, format!("{name}-value"));
    }
    command.env(INHERITED.0, INHERITED.1)
}

/// Checks that `environment` (`env`'s output), printed by a process knob started for user code
/// under a `knob` run [`with_secrets`], has [`INHERITED`] and no secret variable.
#[track_caller]
pub(crate) fn assert_sealed(environment: &str, whose: &str) {
    assert_eq!(
        lines_naming(environment, &[INHERITED.0]),
        [format!("{}={}", INHERITED.0, INHERITED.1)],
        "{whose}: {environment}"
    );
    assert_eq!(
        lines_naming(environment, &SECRET_VARIABLES),
        Vec::<&str>::new(),
        "{whose}"
    );
}

#[test]
fn a_trial_inherits_none_of_knobs_secret_variables() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        r#"trialCommand: 'env > "$NNI_OUTPUT_DIR/environment" && echo KNOB_FINAL 1'
trialConcurrency: 1
maxTrialNumber: 1
searchSpace:
  x: {_type: randint, _value: [0, 10]}
tuner:
  name: Random
trainingService:
  platform: local"#,
        &[],
    );
    let (code, stdout, stderr) =
        crate::run(with_secrets(&mut sandbox.create_command(&config, "sealed")));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let trials = sandbox.path().join("experiments/sealed/trials");
    let trial = std::fs::read_dir(&trials)
        .unwrap()
        .next()
        .expect("no trial folder")
        .unwrap()
        .path();
    let environment = std::fs::read_to_string(trial.join("environment")).unwrap();
    assert_sealed(&environment, "the trial");
}

#[test]
fn the_readme_names_every_secret_variable_and_says_trials_do_not_see_them() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let paragraph = readme
        .split("\n\n")
        .find(|p| p.starts_with("**Secrets in the environment.**"))
        .expect("README.md has no paragraph starting **Secrets in the environment.**");
    for name in SECRET_VARIABLES {
        assert!(
            paragraph.contains(&format!("`{name}`")),
            "{name}: {paragraph}"
        );
    }
}

/// Every Rust file under `dir`, recursively.
fn rust_files(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The list is the one place a secret variable is named, so that one cannot be read without
/// being kept from trials: no source of knob's crates writes one as a string, and a `KNOB_`
/// variable named like a secret (token, password, passphrase, secret) is in the list.
#[test]
fn no_source_names_a_secret_variable_outside_the_list() {
    let root = repo_root();
    let list = root.join("plugin-api/src/secrets.rs");
    let mut files = Vec::new();
    for krate in [
        "plugin-api",
        "core",
        "cli",
        "training-services",
        "tuners",
        "assessors",
        "nni-dispatcher",
        "gpu-sched",
    ] {
        rust_files(&root.join(krate).join("src"), &mut files);
    }
    let mut found = Vec::new();
    for file in files.iter().filter(|f| **f != list) {
        let text = std::fs::read_to_string(file).unwrap();
        // Each string literal `"KNOB_…"` holding a variable's name and nothing else.
        for (at, _) in text.match_indices("\"KNOB_") {
            let rest = &text[at + 1..];
            let end = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(rest.len());
            if !rest[end..].starts_with('"') {
                continue;
            }
            let name = &rest[..end];
            let like_one = ["TOKEN", "PASSWORD", "PASSPHRASE", "SECRET"]
                .iter()
                .any(|word| name.contains(word));
            if SECRET_VARIABLES.contains(&name) || like_one {
                found.push(format!(
                    "{}: {name}",
                    file.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert_eq!(
        found,
        Vec::<String>::new(),
        "name these through knob_plugin_api::secrets (adding new ones to SECRET_VARIABLES)"
    );
}
