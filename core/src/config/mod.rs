//! Experiment configs: NNI's experiment config v2 (YAML or JSON), read, validated and made
//! canonical.
//!
//! [`load_file`] turns a config file into an [`ExperimentConfig`] or into *every* problem found,
//! each a one-line [`ConfigError`] naming the file, line, column and field and saying what is
//! allowed. [`check_file`] is `knob config check`: the canonical text, or those lines.
//!
//! # NNI's rules, kept
//!
//! - Keys are case- and underscore-insensitive: `trial_command`, `TrialCommand`, `trialcommand`.
//!   `null` means "not set".
//! - Relative paths are relative to the config file's folder; `~` is the home directory.
//! - Durations: `30s`, `30m`, `2h`, `1d`, `0.5h`, or a number of seconds.
//! - Sizes: `10GiB`, `500MB` (as in NNI, `GB` is 1024³ bytes), or a number of MiB.
//! - `gpuIndices` (and `tunerGpuIndices`): `[0, 1]`, `"0,1"` or `0`.
//! - `searchSpaceFile` (JSON or YAML) or an inline `searchSpace`: exactly one.
//! - `trialCommand`, `trialCodeDirectory` and `trialGpuNumber` may be written inside a training
//!   service; they must then agree with the top level, since knob runs one of each.
//! - `trainingService` is a mapping with a `platform`, or a list of them (hybrid). The platform
//!   names a training-service plugin (built-in or third-party), which checks the rest of the
//!   mapping itself (see `training_service`). `advisor` is read as `tuner`. `nniManagerIp` is
//!   accepted and ignored (knob needs no route back from training machines). `useAnnotation:
//!   true` and `sharedStorage` are refused with a message.
//!
//! # knob's extensions
//!
//! - Shortcuts: `useActiveGpu`, `maxTrialNumberPerGpu`, `gpuIndices` and `reuseMode` written at top
//!   level go to every training service, which applies them where its own config does not set
//!   them (`ServiceContext::shortcuts`).
//! - `trialGpuMemory` (GPU memory per trial, e.g. `10GiB`), `trialMemorySize` (host memory per
//!   trial), `trialCpuNumber` (CPU cores per trial), `placementPolicy` (`recently-idle`, the
//!   default, `pack`, `spread`, `round-robin`), `maxTrialRetries` and `maxOomRetries` (default 0), `nniShim`, `pluginPaths` (plugin
//!   files or folders to load, relative to the config).
//! - `experimentWorkingDirectory` defaults to `~/knob-experiments`.
//! - `notifications`: a webhook and/or mail when the experiment ends, and optionally on a new
//!   best or failures in a row (see `notifications`); the SMTP password and the webhook secret
//!   are secrets, never stored or shown.
//!
//! # NNI v1
//!
//! A config with `trainingServicePlatform` is NNI v1: [`v1`] converts it to a v2 document first,
//! as NNI 2.x and 3.0 do, and a warning says so. Errors keep the v1 field names and positions.
//!
//! The plugins check the rest, here ([`ServiceSource`]): each training service its own entry,
//! and the tuner and assessor are built with their classArgs (a tuner also given the search
//! space) and dropped, nothing run (see `algorithm`).

mod algorithm;
mod canonical;
mod error;
mod experiment;
mod model;
mod notifications;
mod reader;
mod secret;
mod training_service;
mod units;
mod v1;

pub use units::duration_text_seconds;
mod yaml;

use std::path::{Path, PathBuf};

pub use algorithm::AlgorithmProblem;
pub use error::{ConfigError, ConfigErrors};
pub use experiment::{parse_search_space, SpaceFileError, MAX_SEARCH_SPACE_FILE_BYTES};
pub use model::{
    AlgorithmConfig, Constraint, ConstraintOp, ExperimentConfig, LogLevel, ObjectiveConfig,
    PlacementPolicy, TrainingServiceConfig, TunerErrorPolicy,
};
pub use notifications::{
    EmailConfig, NotificationsConfig, SmtpSecurity, WebhookConfig, WebhookUrl,
    DEFAULT_SECRET_HEADER, PASSWORD_VARIABLE as SMTP_PASSWORD_VARIABLE, WEBHOOK_SECRET_VARIABLE,
    WEBHOOK_URL_VARIABLE,
};
pub use secret::{Secret, REDACTED};
pub use training_service::{recheck_services, trial_settings, ServiceChecker, SHORTCUT_PLATFORM};
pub use yaml::Pos;

use knob_plugin_api::host::PluginRegistry;

/// Where the training services that check a config's entries come from, given the config's
/// `pluginPaths`.
pub trait ServiceSource {
    fn checker(&self, plugin_paths: &[PathBuf]) -> &dyn ServiceChecker;
}

impl ServiceSource for PluginRegistry {
    /// A registry already loaded (the config's `pluginPaths` were loaded into it, or not needed).
    fn checker(&self, _plugin_paths: &[PathBuf]) -> &dyn ServiceChecker {
        self
    }
}

/// The plugins of a config, loaded the first time a config asks (from the usual places and its
/// `pluginPaths`), and kept for what follows (the experiment's run).
///
/// As a checker, it builds the config's tuner and assessor on a thread of its own: a
/// constructor or `update_search_space` that never returns (a third-party tuner waiting on a
/// lock, a server, a download) hung `knob config check` and `knob create` without a word. One
/// unanswered for [`ALGORITHM_CHECK_NOTICE_AFTER`] is named through the notices (the console),
/// and at [`ALGORITHM_CHECK_PATIENCE`] the check gives up on it with an error.
#[derive(Default)]
pub struct ServicePlugins {
    registry: std::sync::OnceLock<PluginRegistry>,
    notices: Option<Box<dyn Fn(String) + Send + Sync>>,
}

/// How long a tuner's or assessor's build for a config check (with the tuner's
/// `update_search_space`) runs before the console is told it is still waited for.
pub const ALGORITHM_CHECK_NOTICE_AFTER: std::time::Duration = std::time::Duration::from_secs(10);
/// How long the check waits for that build before it gives up (NNI's own tuners start Python
/// and import their libraries first: seconds).
pub const ALGORITHM_CHECK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

impl ServicePlugins {
    pub fn new() -> ServicePlugins {
        ServicePlugins::default()
    }

    /// The same, telling `notice` of a tuner or an assessor whose build is slow to answer.
    pub fn with_notices(notice: impl Fn(String) + Send + Sync + 'static) -> ServicePlugins {
        ServicePlugins {
            notices: Some(Box::new(notice)),
            ..ServicePlugins::default()
        }
    }

    /// The registry, loaded now from `plugin_paths` if no config asked before.
    pub fn registry(&self, plugin_paths: &[PathBuf]) -> &PluginRegistry {
        self.registry
            .get_or_init(|| PluginRegistry::load(plugin_paths))
    }

    /// The registry `checker` loaded.
    fn loaded(&self) -> &PluginRegistry {
        self.registry(&[])
    }
}

impl ServiceSource for ServicePlugins {
    fn checker(&self, plugin_paths: &[PathBuf]) -> &dyn ServiceChecker {
        self.registry(plugin_paths);
        self
    }
}

impl ServiceChecker for ServicePlugins {
    fn platforms(&self) -> Vec<String> {
        self.loaded().platforms()
    }

    fn check(
        &self,
        platform: &str,
        config: &serde_json::Value,
        context: &knob_plugin_api::service::ServiceContext,
    ) -> Result<knob_plugin_api::service::ConfigCheck, String> {
        self.loaded().check(platform, config, context)
    }

    fn checks_algorithms(&self) -> bool {
        true
    }

    fn check_algorithm(
        &self,
        kind: knob_plugin_api::ComponentKind,
        name: &str,
        class_args: &serde_json::Value,
        search_space: Option<&serde_json::Value>,
    ) -> Option<Result<(), AlgorithmProblem>> {
        let calls = match (kind, search_space) {
            (knob_plugin_api::ComponentKind::Tuner, Some(_)) => {
                "constructor or update_search_space"
            }
            _ => "constructor",
        };
        let what = format!("{kind} {name}'s {calls}");
        let registry = self.loaded().clone();
        let (name, class_args) = (name.to_owned(), class_args.clone());
        let search_space = search_space.cloned();
        let built = within_patience(
            &what,
            ALGORITHM_CHECK_NOTICE_AFTER,
            ALGORITHM_CHECK_PATIENCE,
            self.notices.as_deref(),
            move || registry.check_algorithm(kind, &name, &class_args, search_space.as_ref()),
        );
        built.unwrap_or_else(|gave_up| Some(Err(AlgorithmProblem::Constructor(gave_up))))
    }

    fn tuner_takes_objectives(&self, name: &str, class_args: &serde_json::Value) -> Option<bool> {
        let registry = self.loaded().clone();
        let (name, class_args) = (name.to_owned(), class_args.clone());
        let what = format!("tuner {name}'s constructor");
        within_patience(
            &what,
            ALGORITHM_CHECK_NOTICE_AFTER,
            ALGORITHM_CHECK_PATIENCE,
            self.notices.as_deref(),
            move || registry.tuner_takes_objectives(&name, &class_args),
        )
        .ok()
        .flatten()
    }
}

/// Runs `work` (a plugin's call, `what`) on a thread of its own and waits for it: after
/// `notice_after` `notice` is told it is still waited for, and after `patience` the wait ends
/// with an error that says so. The thread is left to finish (or not) on its own: nothing can
/// stop a call inside a plugin.
fn within_patience<T: Send + 'static>(
    what: &str,
    notice_after: std::time::Duration,
    patience: std::time::Duration,
    notice: Option<&(dyn Fn(String) + Send + Sync)>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    use std::sync::mpsc::RecvTimeoutError;
    let (answer_tx, answer) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("knob-config-check".into())
        .spawn(move || {
            let _ = answer_tx.send(work());
        })
        .map_err(|e| format!("cannot start a thread to check {what}: {e}"))?;
    let ended = |error: RecvTimeoutError| {
        match error {
        // The host catches a plugin's panic; this is the host's own.
        RecvTimeoutError::Disconnected => format!("{what} failed: the check's thread panicked"),
        RecvTimeoutError::Timeout => format!(
            "{what} did not return in {} s, so knob gives up on it: it may wait for a lock, a server or a download that does not come",
            patience.as_secs()
        ),
    }
    };
    match answer.recv_timeout(notice_after) {
        Ok(answer) => return Ok(answer),
        Err(RecvTimeoutError::Timeout) => {}
        Err(error) => return Err(ended(error)),
    }
    if let Some(notice) = notice {
        notice(format!(
            "checking the config: {what} has not returned in {} s; still waiting (knob gives up after {} s, Ctrl-C stops now)",
            notice_after.as_secs(),
            patience.as_secs()
        ));
    }
    answer
        .recv_timeout(patience.saturating_sub(notice_after))
        .map_err(ended)
}

/// A config that passed every check, with what deserves a warning.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedConfig {
    pub config: ExperimentConfig,
    /// Accepted but worth telling the user (an ignored `nniManagerIp`, a deprecated `advisor`).
    pub warnings: Vec<ConfigError>,
}

/// Reads, validates and canonicalizes the config file at `path`. YAML, or JSON when the file name
/// ends in `.json`. Each training service's entry is checked by its plugin, from `services`.
pub fn load_file(path: &Path, services: &dyn ServiceSource) -> Result<LoadedConfig, ConfigErrors> {
    let display_name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => load_str(&text, path, services),
        Err(error) => Err(ConfigErrors(vec![ConfigError {
            file: display_name,
            line: None,
            column: None,
            field: String::new(),
            message: format!("cannot read config file: {}", reader::plain_io(&error)),
        }])),
    }
}

/// `message` (about the config file at `path`, naming its fields as v2 names them) with the
/// line and column of the first top-level field it names in front, and an NNI v1 config's fields
/// named as the file writes them (`trialGpuNumber` is `trial.gpuNum`). For checks made after the
/// config was read (the placement check of `knob create` and `knob config check`).
pub fn as_written(path: &Path, message: &str) -> String {
    let file = path.display().to_string();
    let unchanged = || format!("{file}: {message}");
    let Ok(text) = std::fs::read_to_string(path) else {
        return unchanged();
    };
    let Ok(Some(root)) = yaml::parse_file(path, &text) else {
        return unchanged();
    };
    if !v1::is_v1(&root) {
        let yaml::Value::Map(entries) = &root.value else {
            return unchanged();
        };
        let named = entries
            .iter()
            .filter_map(|(key, value)| {
                let name = key.key_text();
                Some((word_at(message, &name)?, value.pos?, name))
            })
            .min_by_key(|(at, _, _)| *at);
        return match named {
            Some((_, pos, field)) => {
                format!("{file}:{}:{}: {field}: {message}", pos.line, pos.column)
            }
            None => unchanged(),
        };
    }
    let converted = v1::convert(&mut new_reader(path), &root);
    let yaml::Value::Map(entries) = &converted.root.value else {
        return unchanged();
    };
    let mut rewritten = message.to_owned();
    let mut first: Option<(usize, Option<yaml::Pos>, String)> = None;
    for (key, value) in entries {
        let v2 = key.key_text();
        let v1 = converted.v1_field(&v2);
        if v1 == v2 {
            continue;
        }
        if let Some(at) = message.find(&v2) {
            rewritten = rewritten.replace(&v2, &v1);
            if first.as_ref().is_none_or(|(earliest, _, _)| at < *earliest) {
                first = Some((at, value.pos, v1));
            }
        }
    }
    match first {
        Some((_, Some(pos), field)) => {
            format!("{file}:{}:{}: {field}: {rewritten}", pos.line, pos.column)
        }
        _ => format!("{file}: {rewritten}"),
    }
}

/// Where `word` first stands in `text` as a word of its own (`trialGpuNumber`, not the start of
/// `trialGpuNumberX`).
fn word_at(text: &str, word: &str) -> Option<usize> {
    let is_word_char = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).map(|(at, _)| at).find(|&at| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_word_char) && !after.is_some_and(is_word_char)
    })
}

/// Like [`load_file`] for text already read: `path` only names the file in messages, picks the
/// format by its extension, and anchors relative paths at its folder.
pub fn load_str(
    text: &str,
    path: &Path,
    services: &dyn ServiceSource,
) -> Result<LoadedConfig, ConfigErrors> {
    load_document(text, path, services).map(|(loaded, _)| loaded)
}

/// Reads and checks the config, and returns it with the v2 document it was read from: the
/// document itself, or for an NNI v1 config its conversion (see [`v1`]).
fn load_document(
    text: &str,
    path: &Path,
    services: &dyn ServiceSource,
) -> Result<(LoadedConfig, yaml::Node), ConfigErrors> {
    let file = path.display().to_string();
    let mut reader = new_reader(path);
    let parsed = yaml::parse_file(path, text);
    let mut document = None;
    // For an NNI v1 config: how to name its v2 fields as the user wrote them.
    let mut converted: Option<v1::Converted> = None;
    // And the v1 fields its conversion refused, whose v2 problems are not reported again.
    let mut refused: Vec<String> = Vec::new();
    let mut config = match parsed {
        Ok(Some(root)) if v1::is_v1(&root) => {
            let note = format!(
                "an NNI v1 config, converted to v2 as NNI 2.x and 3.0 do; `knob config check \
                 --v2 {file}` prints the v2 config"
            );
            reader.warn(None, "", note);
            let converting_from = reader.errors.len();
            let v1 = v1::convert(&mut reader, &root);
            // Read the v2 document even after a conversion error, so that one run lists them all.
            let (errors_before, warnings_before) = (reader.errors.len(), reader.warnings.len());
            let config = experiment::read_experiment(&mut reader, &v1.root);
            // What the v2 reader found, under the names the user wrote.
            for problem in reader.errors[errors_before..]
                .iter_mut()
                .chain(reader.warnings[warnings_before..].iter_mut())
            {
                problem.field = v1.v1_field(&problem.field);
            }
            // What the conversion refused is not reported again by the v2 reader, which saw it
            // missing (trainingServicePlatform: pai leaves no trainingService behind).
            refused = reader.errors[converting_from..errors_before]
                .iter()
                .map(|error| error.field.clone())
                .filter(|field| !field.is_empty())
                .collect();
            drop_refused(&mut reader.errors, errors_before, &refused);
            document = Some(v1.root.clone());
            converted = Some(v1);
            config
        }
        Ok(Some(root)) if matches!(root.value, yaml::Value::Map(_)) => {
            let config = experiment::read_experiment(&mut reader, &root);
            document = Some(root);
            config
        }
        Ok(Some(root)) => {
            let message = format!(
                "a config is a mapping of fields (trialCommand: ..., tuner: ...), got {}",
                root.describe()
            );
            reader.error(root.pos, "", message);
            None
        }
        Ok(None) => {
            reader.error(None, "", "the config file is empty");
            None
        }
        Err(error) => {
            let kind = if yaml::is_json_file(path) {
                "JSON"
            } else {
                "YAML"
            };
            reader.error(
                error.pos,
                "",
                format!("malformed {kind}: {}", error.message),
            );
            None
        }
    };
    // The training services check their own entries, and the tuner and assessor are built by
    // their plugins, even when the rest had errors: the user sees every problem at once.
    let pending = std::mem::take(&mut reader.pending);
    let algorithms = std::mem::take(&mut reader.pending_algorithms);
    if !pending.is_empty() || !algorithms.is_empty() {
        let (errors_before, warnings_before) = (reader.errors.len(), reader.warnings.len());
        let checker = services.checker(&reader.plugin_paths);
        if !pending.is_empty() {
            let context = training_service::check_context(
                &reader.base_dir,
                reader.config_file.clone(),
                &reader.shortcuts,
                config.as_ref(),
            );
            training_service::check_services(
                &mut reader,
                checker,
                &pending,
                &context,
                config.as_mut(),
            );
        }
        // A tuner is given the search space only once it was read without error.
        let search_space = config.as_ref().map(|config| &config.search_space);
        let objectives = config
            .as_ref()
            .map_or(&[][..], |config| &config.objectives[..]);
        algorithm::check_algorithms(
            &mut reader,
            checker,
            &algorithms,
            search_space,
            document.as_ref(),
            objectives,
        );
        if let Some(v1) = &converted {
            for problem in reader.errors[errors_before..]
                .iter_mut()
                .chain(reader.warnings[warnings_before..].iter_mut())
            {
                problem.field = v1.v1_field(&problem.field);
            }
            drop_refused(&mut reader.errors, errors_before, &refused);
        }
    }
    match (config, document) {
        (Some(config), Some(document)) if reader.errors.is_empty() => Ok((
            LoadedConfig {
                config,
                warnings: reader.warnings,
            },
            document,
        )),
        _ => {
            let mut errors = reader.errors;
            // File order; errors with no place (a missing field) last. The sort is stable.
            errors.sort_by_key(|error| (error.line.is_none(), error.line, error.column));
            Err(ConfigErrors(errors))
        }
    }
}

/// Drops the errors from `from` on that lie under a field the v1 conversion refused (it said
/// so already; the v2 document saw the field missing).
fn drop_refused(errors: &mut Vec<ConfigError>, from: usize, refused: &[String]) {
    let mut index = from;
    while index < errors.len() {
        let field = &errors[index].field;
        let under = |refused: &String| {
            field.strip_prefix(refused.as_str()).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with('.') || rest.starts_with('[')
            })
        };
        if refused.iter().any(under) {
            errors.remove(index);
        } else {
            index += 1;
        }
    }
}

/// `knob config check FILE`: the canonical YAML (warnings first, as comments), or every error as
/// one line each.
pub fn check_file(path: &Path, services: &dyn ServiceSource) -> Result<String, Vec<String>> {
    check_file_rendered(path, services, false).map(|(text, _)| text)
}

/// `knob config check --v2 FILE`: the config as an NNI v2 document (an NNI v1 config converted,
/// values as written, passwords and passphrases as `***`), once it passed every check; or every
/// error as one line each.
pub fn check_file_v2(path: &Path, services: &dyn ServiceSource) -> Result<String, Vec<String>> {
    check_file_rendered(path, services, true).map(|(text, _)| text)
}

/// [`check_file`] (`v2` false) or [`check_file_v2`], with the config itself for the checks the
/// caller makes next (`knob config check` asks whether its trials can be placed).
pub fn check_file_rendered(
    path: &Path,
    services: &dyn ServiceSource,
    v2: bool,
) -> Result<(String, ExperimentConfig), Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        vec![format!(
            "{}: cannot read config file: {}",
            path.display(),
            reader::plain_io(&error)
        )]
    })?;
    let (loaded, document) =
        load_document(&text, path, services).map_err(|errors| errors.lines())?;
    let mut out = String::new();
    for warning in &loaded.warnings {
        out.push_str(&format!("# warning: {warning}\n"));
    }
    if v2 {
        let mut secrets = training_service::secret_nodes(&document, &loaded.config);
        secrets.extend(notifications::secret_nodes(&document));
        out.push_str(&canonical::document_yaml(&document, &secrets));
    } else {
        out.push_str(&loaded.config.to_canonical_yaml());
    }
    Ok((out, loaded.config))
}

/// The absolute folder of the config file, which relative paths in it are relative to.
/// A reader of the config file at `path`, before anything is read.
fn new_reader(path: &Path) -> reader::Reader {
    reader::Reader {
        file: path.display().to_string(),
        base_dir: config_folder(path),
        // For `~` in paths: `$HOME`, else the password database's.
        home: std::env::home_dir(),
        errors: Vec::new(),
        warnings: Vec::new(),
        config_file: std::path::absolute(path).ok(),
        shortcuts: Default::default(),
        plugin_paths: Vec::new(),
        pending: Vec::new(),
        pending_algorithms: Vec::new(),
    }
}

fn config_folder(path: &Path) -> PathBuf {
    let folder = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::canonicalize(folder).unwrap_or_else(|_| {
        std::env::current_dir()
            .map(|current| current.join(folder))
            .unwrap_or_else(|_| folder.to_path_buf())
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::within_patience;

    const SHORT: Duration = Duration::from_millis(50);
    const LONG: Duration = Duration::from_secs(20);

    /// What the notices were told.
    fn told() -> (Arc<Mutex<Vec<String>>>, impl Fn(String) + Send + Sync) {
        let said = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let said = said.clone();
            move |line| said.lock().unwrap().push(line)
        };
        (said, sink)
    }

    #[test]
    fn a_quick_call_is_answered_without_a_notice() {
        let (said, sink) = told();
        let answer = within_patience("tuner Quick's constructor", LONG, LONG, Some(&sink), || 7);
        assert_eq!(answer, Ok(7));
        assert!(said.lock().unwrap().is_empty());
    }

    #[test]
    fn a_slow_call_is_named_and_still_answered() {
        let (said, sink) = told();
        let answer = within_patience("tuner Slow's constructor", SHORT, LONG, Some(&sink), || {
            std::thread::sleep(SHORT * 4);
            "built"
        });
        assert_eq!(answer, Ok("built"));
        let said = said.lock().unwrap();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("tuner Slow's constructor has not returned in 0 s; still waiting"),
            "{said:?}"
        );
    }

    #[test]
    fn a_call_that_never_returns_is_given_up_saying_so() {
        let (said, sink) = told();
        let (_never, stuck) = std::sync::mpsc::channel::<()>();
        let answer = within_patience(
            "tuner Stuck's constructor or update_search_space",
            SHORT,
            SHORT * 2,
            Some(&sink),
            move || stuck.recv_timeout(LONG).is_ok(),
        );
        let error = answer.unwrap_err();
        assert!(
            error.starts_with("tuner Stuck's constructor or update_search_space did not return in 0 s, so knob gives up on it"),
            "{error}"
        );
        assert_eq!(said.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_panicking_call_is_an_error_not_a_wait() {
        let answer = within_patience("assessor Broken's constructor", LONG, LONG, None, || {
            panic!("the host's own bug")
        });
        let error: String = answer.unwrap_err();
        assert!(
            error.contains("assessor Broken's constructor failed"),
            "{error}"
        );
    }
}
