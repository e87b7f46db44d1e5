//! The experiment config parser, `knob_core::config::load_str`, as YAML and as JSON.
//!
//! Any text gives a config or errors, never a panic or a hang. A config that loads also keeps
//! the documented promises of its canonical form: the canonical YAML is itself a valid config
//! that reads back to the same config (unless it holds a secret, which it prints as `***`),
//! and the serde form reads back to the same config.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use knob_core::config::{self, ExperimentConfig, ServiceChecker, ServiceSource, REDACTED};
use knob_plugin_api::service::{ConfigCheck, ServiceContext};
use libfuzzer_sys::fuzz_target;

/// The built-in training services' own config checks, linked in (knob reaches them through the
/// plugin ABI; the parser under test is the same).
struct BuiltIn;

impl ServiceChecker for BuiltIn {
    fn platforms(&self) -> Vec<String> {
        knob_training_services::BUILT_IN
            .iter()
            .map(|name| name.to_string())
            .collect()
    }

    fn check(
        &self,
        platform: &str,
        config: &serde_json::Value,
        context: &ServiceContext,
    ) -> Result<ConfigCheck, String> {
        match knob_training_services::check_built_in(platform, config, context) {
            Some(Ok(checked)) => Ok(ConfigCheck::Checked(checked)),
            Some(Err(problems)) => Ok(ConfigCheck::Problems(problems)),
            None => Err(format!("{platform} is not built in")),
        }
    }
}

impl ServiceSource for BuiltIn {
    fn checker(&self, _plugin_paths: &[PathBuf]) -> &dyn ServiceChecker {
        self
    }
}

/// A folder for relative paths: the files and folders the seed configs name exist there, so
/// inputs get past "does not exist" into the search-space file reader.
fn project() -> &'static Path {
    static PROJECT: OnceLock<PathBuf> = OnceLock::new();
    PROJECT.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("knob-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("code")).unwrap();
        std::fs::write(
            dir.join("search_space.json"),
            r#"{"lr": {"_type": "loguniform", "_value": [0.0001, 0.1]},
               "opt": {"_type": "choice", "_value": [{"_name": "sgd", "m": {"_type": "uniform", "_value": [0, 1]}}, {"_name": "adam"}]}}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("search_space.yml"),
            "x: {_type: randint, _value: [0, 10]}\n",
        )
        .unwrap();
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for name in ["exp.yml", "exp.json"] {
        let path = project().join(name);
        match config::load_str(&text, &path, &BuiltIn) {
            Ok(loaded) => check_loaded(&loaded.config, &path),
            Err(errors) => {
                assert!(!errors.0.is_empty(), "an Err with no error");
                let _ = errors.lines();
            }
        }
    }
});

fn check_loaded(config: &ExperimentConfig, path: &Path) {
    let canonical = config.to_canonical_yaml();
    // Secrets are written as `***`, and a webhook's URL as `scheme://host/***`, which a config
    // may not hold (knob asks for the real value there): the canonical form must load once they
    // are supplied again.
    let quoted_placeholder = format!("{REDACTED:?}");
    let url_placeholder = format!("/{REDACTED}\"");
    let with_secrets = canonical
        .replace(quoted_placeholder.as_str(), "\"fuzz-secret\"")
        .replace(url_placeholder.as_str(), "/fuzz-path\"");
    let reloaded = config::load_str(
        &with_secrets,
        &path.with_file_name("canonical.yml"),
        &BuiltIn,
    )
    .unwrap_or_else(|errors| {
        panic!(
            "the canonical form does not load:\n{canonical}\n{}",
            errors.lines().join("\n")
        )
    });
    // Secrets are written as `***` in both forms, so they cannot read back the same.
    if canonical.contains(REDACTED) {
        return;
    }
    assert_eq!(
        &reloaded.config, config,
        "the canonical form reads back differently:\n{canonical}"
    );
    let stored = serde_json::to_string(config).unwrap();
    let back: ExperimentConfig = serde_json::from_str(&stored)
        .unwrap_or_else(|error| panic!("the serde form does not read back ({error}): {stored}"));
    assert_eq!(
        &back, config,
        "the serde form reads back differently: {stored}"
    );
}
