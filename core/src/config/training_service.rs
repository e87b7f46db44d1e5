//! Reading `trainingService`: one mapping, or a list of them (NNI's hybrid mode).
//!
//! The core reads only what every entry shares: `platform`, which names the training-service
//! plugin, and the trial settings NNI lets an entry carry (`trialCommand`, `trialCodeDirectory`,
//! `trialGpuNumber`, `nniManagerIp`). The rest of the mapping goes to that plugin, which checks
//! it (`TrainingService::check_config`) and answers with the canonical form and its secret
//! fields, or with problems that name a field path. The core keeps the YAML tree, so each
//! problem still reaches the user as `file:line:column: trainingService[i].<path>: message`.

use std::path::{Path, PathBuf};

use knob_plugin_api::host::{HostError, PluginRegistry};
use knob_plugin_api::service::{
    ConfigCheck, ConfigProblem, FieldPath, PathStep, ServiceContext, TrialSettings,
};
use knob_plugin_api::{AssessorContext, ComponentKind};
use serde_json::Map;

use super::algorithm::AlgorithmProblem;
use super::model::ExperimentConfig;
use super::reader::{map_entry, normalize_key, Field, Fields, Reader};
use super::secret::REDACTED;
use super::yaml::{Node, Pos, Value};

/// What checks a training service's config: the plugins. The core's own checker is
/// [`PluginRegistry`]; tests may check with the services' code linked in.
pub trait ServiceChecker {
    /// The names of the training services there are (the `platform` values a config may use).
    fn platforms(&self) -> Vec<String>;
    /// Asks the service `platform` (one of [`ServiceChecker::platforms`]) to check its config.
    /// `Err` is a failure of the call itself, one line.
    fn check(
        &self,
        platform: &str,
        config: &serde_json::Value,
        context: &ServiceContext,
    ) -> Result<ConfigCheck, String>;
    /// Whether this checker builds tuners and assessors ([`ServiceChecker::check_algorithm`]);
    /// not the tests that link the services in, which check the config's reading alone.
    fn checks_algorithms(&self) -> bool {
        false
    }
    /// Builds the tuner or assessor `name` from `class_args` and, given a search space, hands
    /// it over (a tuner), then drops it: nothing runs. `None` when this checker does not build
    /// algorithms.
    fn check_algorithm(
        &self,
        _kind: ComponentKind,
        _name: &str,
        _class_args: &serde_json::Value,
        _search_space: Option<&serde_json::Value>,
    ) -> Option<Result<(), AlgorithmProblem>> {
        None
    }
    /// Whether the tuner `name` (built from `class_args`) takes vector objectives
    /// (`Tuner::takes_objectives`); `None` when this checker does not build algorithms or the
    /// tuner cannot be built (that error is [`ServiceChecker::check_algorithm`]'s).
    fn tuner_takes_objectives(&self, _name: &str, _class_args: &serde_json::Value) -> Option<bool> {
        None
    }
}

impl ServiceChecker for PluginRegistry {
    fn platforms(&self) -> Vec<String> {
        self.names(ComponentKind::TrainingService)
    }

    fn check(
        &self,
        platform: &str,
        config: &serde_json::Value,
        context: &ServiceContext,
    ) -> Result<ConfigCheck, String> {
        self.check_training_service(platform, config, context)
            .map_err(|e| e.to_string())
    }

    fn checks_algorithms(&self) -> bool {
        true
    }

    fn check_algorithm(
        &self,
        kind: ComponentKind,
        name: &str,
        class_args: &serde_json::Value,
        search_space: Option<&serde_json::Value>,
    ) -> Option<Result<(), AlgorithmProblem>> {
        let built = |error: HostError| match error {
            HostError::Unknown { .. } | HostError::Duplicate { .. } => {
                AlgorithmProblem::Name(error.to_string())
            }
            other => AlgorithmProblem::Constructor(other.to_string()),
        };
        Some(match kind {
            ComponentKind::Tuner => {
                self.tuner_object(name, class_args)
                    .map_err(built)
                    .and_then(|mut tuner| match search_space {
                        Some(space) => tuner
                            .update_search_space(space)
                            .map_err(|e| AlgorithmProblem::SearchSpace(e.to_string())),
                        None => Ok(()),
                    })
            }
            // Built to check its classArgs only: the direction it is told changes nothing here.
            ComponentKind::Assessor => self
                .assessor_object(name, class_args, &AssessorContext::default())
                .map(drop)
                .map_err(built),
            ComponentKind::TrainingService => Ok(()),
        })
    }

    fn tuner_takes_objectives(&self, name: &str, class_args: &serde_json::Value) -> Option<bool> {
        self.tuner_object(name, class_args)
            .ok()
            .map(|tuner| tuner.takes_objectives())
    }
}

/// The platform NNI's top-level shortcut fields (`useActiveGpu`, `maxTrialNumberPerGpu`,
/// `gpuIndices`, `reuseMode`) were made for, and the one error messages give as the example.
/// The shortcuts go to every training service in its context (`ServiceContext::shortcuts`,
/// canonical JSON); each applies those that mean something to it where its own config leaves
/// them unset.
pub const SHORTCUT_PLATFORM: &str = "local";

/// A value with the place it was written, to compare per-service settings with top-level ones.
pub(crate) struct Located<T> {
    pub value: T,
    pub pos: Option<Pos>,
    pub path: String,
}

/// NNI lets each training service carry its own `trialCommand`, `trialCodeDirectory` and
/// `trialGpuNumber`; knob runs one of each per experiment, so these must agree with the top level
/// (or stand in for it when it is not set).
#[derive(Default)]
pub(crate) struct ServiceTrialSettings {
    pub trial_command: Option<Located<String>>,
    pub trial_code_directory: Option<Located<std::path::PathBuf>>,
    pub trial_gpu_number: Option<Located<u32>>,
}

/// A service entry read up to its plugin: checked once the plugins are known.
pub(crate) struct PendingService {
    /// `platform` as written.
    pub platform: String,
    pub platform_pos: Option<Pos>,
    pub platform_path: String,
    /// `trainingService` or `trainingService[i]`.
    pub path: String,
    /// The entry's tree, for positions.
    pub node: Node,
    /// The service's own fields, as JSON.
    pub config: serde_json::Value,
}

/// Reads the `trainingService` field: each service (its own fields still unchecked, see
/// [`check_services`]), and the trial settings each one carries.
pub(crate) fn read_training_services(
    reader: &mut Reader,
    field: &Field<'_>,
) -> Option<(Vec<PendingService>, Vec<ServiceTrialSettings>)> {
    let items: Vec<(&Node, String)> = match &field.node.value {
        Value::Map(_) => vec![(field.node, field.path.clone())],
        Value::Seq(items) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(index, item)| (item, format!("{}[{index}]", field.path)))
            .collect(),
        Value::Seq(_) => {
            reader.error(
                field.node.pos,
                &field.path,
                "expected at least one training service",
            );
            return None;
        }
        _ => {
            let message = format!(
                "expected a mapping like {{platform: {SHORTCUT_PLATFORM}}} or a list of them, got {}",
                field.node.describe()
            );
            reader.error(field.node.pos, &field.path, message);
            return None;
        }
    };
    // Entries that fail here are left out; the others are still checked by their services, so
    // that every problem is reported at once.
    let mut services: Vec<PendingService> = Vec::new();
    let mut settings = Vec::new();
    for (node, path) in items {
        let Some((service, service_settings)) = read_service(reader, node, &path) else {
            continue;
        };
        services.push(service);
        settings.push(service_settings);
    }
    Some((services, settings))
}

fn read_service(
    reader: &mut Reader,
    node: &Node,
    path: &str,
) -> Option<(PendingService, ServiceTrialSettings)> {
    let mut fields = Fields::open(reader, node, path)?;
    let platform = match fields.take("platform") {
        Some(field) => reader
            .non_empty_string(&field)
            .map(|name| (name, field.node.pos, field.path.clone())),
        None => {
            let platform_path = fields.child_path("platform");
            reader.error(
                fields.pos,
                &platform_path,
                "required: the training service that runs the trials, e.g. local",
            );
            None
        }
    };
    let settings = read_trial_settings(reader, &mut fields);
    // A field refused for a non-finite number is left out: the service would see null in it,
    // and say so, about a value that was not written.
    let config = serde_json::Value::Object(
        fields
            .rest()
            .into_iter()
            .filter(|(key, value)| !refuse_non_finite(reader, value, &format!("{path}.{key}")))
            .map(|(key, value)| (key, to_json(value)))
            .collect(),
    );
    let (platform, platform_pos, platform_path) = platform?;
    Some((
        PendingService {
            platform,
            platform_pos,
            platform_path,
            path: path.to_owned(),
            node: node.clone(),
            config,
        },
        settings,
    ))
}

fn read_trial_settings(reader: &mut Reader, fields: &mut Fields<'_>) -> ServiceTrialSettings {
    let mut settings = ServiceTrialSettings::default();
    if let Some(field) = fields.take("trialCommand") {
        settings.trial_command = reader.non_empty_string(&field).map(|value| Located {
            value,
            pos: field.node.pos,
            path: field.path.clone(),
        });
    }
    if let Some(field) = fields.take("trialCodeDirectory") {
        settings.trial_code_directory = reader.directory(&field).map(|value| Located {
            value,
            pos: field.node.pos,
            path: field.path.clone(),
        });
    }
    if let Some(field) = fields.take("trialGpuNumber") {
        settings.trial_gpu_number = reader.integer(&field, 0).map(|value| Located {
            value,
            pos: field.node.pos,
            path: field.path.clone(),
        });
    }
    if let Some(field) = fields.take("nniManagerIp") {
        reader.string(&field);
        reader.warn(field.node.pos, &field.path, NNI_MANAGER_IP_IGNORED);
    }
    settings
}

pub(crate) const NNI_MANAGER_IP_IGNORED: &str =
    "ignored: knob reaches training machines over SSH and needs no route back to the manager";

/// Refuses `.inf` and `.nan` in a service's mapping at their line: JSON has no form for them,
/// so they would reach the service as null, which it reads as "not set" and fills with its
/// default, while the same values at top level are refused. Whether it found one.
fn refuse_non_finite(reader: &mut Reader, node: &Node, path: &str) -> bool {
    match &node.value {
        Value::Float(f) if !f.is_finite() => {
            reader.error(node.pos, path, format!("expected a finite number, got {f}"));
            true
        }
        Value::Seq(items) => items
            .iter()
            .enumerate()
            .fold(false, |found, (index, item)| {
                refuse_non_finite(reader, item, &format!("{path}[{index}]")) || found
            }),
        Value::Map(pairs) => pairs.iter().fold(false, |found, (key, value)| {
            refuse_non_finite(reader, value, &format!("{path}.{}", key.key_text())) || found
        }),
        _ => false,
    }
}

/// A YAML tree as JSON (keys as written).
fn to_json(node: &Node) -> serde_json::Value {
    match &node.value {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Int(i) => serde_json::Value::from(*i),
        Value::UInt(u) => serde_json::Value::from(*u),
        Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null),
        Value::Str(text) => serde_json::Value::String(text.clone()),
        Value::Seq(items) => serde_json::Value::Array(items.iter().map(to_json).collect()),
        Value::Map(pairs) => {
            let mut map = Map::new();
            for (key, value) in pairs {
                // A key written twice the same way: the first is kept (the service then
                // reports keys that differ only in spelling).
                map.entry(key.key_text()).or_insert_with(|| to_json(value));
            }
            serde_json::Value::Object(map)
        }
    }
}

/// The node at a field path of a service's config as written, or the nearest mapping or list
/// above it that was written, and whether it is the node itself. Keys match as NNI matches them.
fn walk<'n>(node: &'n Node, path: &FieldPath) -> (&'n Node, bool) {
    let mut current = node;
    for step in &path.0 {
        let next = match (step, &current.value) {
            (PathStep::Field(name), _) => map_entry(current, name).map(|(_, value)| value),
            (PathStep::Index(index), Value::Seq(items)) => items.get(*index),
            _ => None,
        };
        match next {
            Some(next) => current = next,
            None => return (current, false),
        }
    }
    (current, true)
}

/// Where a field path of a service's config was written: the value's position, or that of the
/// nearest mapping or list above it that was written (a missing field is reported at its
/// mapping).
fn position(node: &Node, path: &FieldPath) -> Option<Pos> {
    walk(node, path).0.pos
}

/// The nodes of a config document that hold a field its training services declared secret
/// (`config` is what the document was read into).
pub(crate) fn secret_nodes<'d>(document: &'d Node, config: &ExperimentConfig) -> Vec<&'d Node> {
    let Some((_, services)) = map_entry(document, "trainingService") else {
        return Vec::new();
    };
    let entries: Vec<&Node> = match &services.value {
        Value::Seq(items) => items.iter().collect(),
        _ => vec![services],
    };
    let mut found = Vec::new();
    for (entry, service) in entries.into_iter().zip(&config.training_service) {
        for secret in &service.secrets {
            if let (node, true) = walk(entry, &secret.path) {
                found.push(node);
            }
        }
    }
    found
}

/// The value at a field path in a config as written (keys matched as NNI matches them).
fn written<'v>(value: &'v serde_json::Value, path: &FieldPath) -> Option<&'v serde_json::Value> {
    let mut current = value;
    for step in &path.0 {
        current = match step {
            PathStep::Field(name) => {
                let wanted = normalize_key(name);
                current
                    .as_object()?
                    .iter()
                    .find(|(key, _)| normalize_key(key) == wanted)
                    .map(|(_, value)| value)?
            }
            PathStep::Index(index) => current.as_array()?.get(*index)?,
        };
    }
    Some(current)
}

fn field_text(service_path: &str, path: &FieldPath) -> String {
    if path.is_root() {
        service_path.to_owned()
    } else if matches!(path.0.first(), Some(PathStep::Index(_))) {
        format!("{service_path}{path}")
    } else {
        format!("{service_path}.{path}")
    }
}

/// The experiment as a service sees it while its config is checked: no experiment yet.
pub(crate) fn check_context(
    config_dir: &Path,
    config_file: Option<PathBuf>,
    shortcuts: &Map<String, serde_json::Value>,
    config: Option<&ExperimentConfig>,
) -> ServiceContext {
    ServiceContext {
        config_dir: config_dir.to_path_buf(),
        config_file,
        shortcuts: shortcuts.clone(),
        trial: config.map(trial_settings).unwrap_or_default(),
        working_directory: config.map(|config| config.experiment_working_directory.clone()),
        ..ServiceContext::default()
    }
}

/// The experiment-wide trial settings a service may need.
pub fn trial_settings(config: &ExperimentConfig) -> TrialSettings {
    TrialSettings {
        trial_command: config.trial_command.clone(),
        trial_code_directory: config.trial_code_directory.clone(),
        trial_concurrency: config.trial_concurrency,
        trial_gpu_number: config.trial_gpu_number,
        trial_cpu_number: config.trial_cpu_number,
        trial_memory_size_mib: config.trial_memory_size_mib,
        trial_gpu_memory_mib: config.trial_gpu_memory_mib,
        max_trial_duration_secs: config.max_trial_duration.map(|d| d.as_secs()),
    }
}

/// The installed platform that `written` names (matched ignoring case), or the error for it.
pub(crate) fn resolve_platform(
    checker: &dyn ServiceChecker,
    written: &str,
) -> Result<String, String> {
    let platforms = checker.platforms();
    if let Some(found) = platforms
        .iter()
        .find(|name| name.eq_ignore_ascii_case(written))
    {
        return Ok(found.clone());
    }
    let lower = written.to_ascii_lowercase();
    let hint = platforms
        .iter()
        .find(|known| strsim::damerau_levenshtein(&known.to_ascii_lowercase(), &lower) <= 2)
        .map(|known| format!(" (did you mean {known:?}?)"))
        .unwrap_or_default();
    let installed: Vec<String> = platforms.iter().map(|name| format!("{name:?}")).collect();
    let installed = if installed.is_empty() {
        "none is installed".to_owned()
    } else {
        format!("installed: {}", installed.join(", "))
    };
    Err(format!(
        "unknown platform {written:?}{hint}; {installed} (a third-party training service is a plugin: name its file or folder in pluginPaths)"
    ))
}

/// Has each service's plugin check its entry: the entries of `config` (when the rest of the
/// config was good) become canonical, with their secrets; every problem becomes a config error
/// at the place it was written.
pub(crate) fn check_services(
    reader: &mut Reader,
    checker: &dyn ServiceChecker,
    pending: &[PendingService],
    context: &ServiceContext,
    mut config: Option<&mut ExperimentConfig>,
) {
    let mut good: Vec<&str> = Vec::new();
    for (index, service) in pending.iter().enumerate() {
        let platform = match resolve_platform(checker, &service.platform) {
            Ok(platform) => platform,
            Err(message) => {
                reader.error(service.platform_pos, &service.platform_path, message);
                continue;
            }
        };
        let checked = match checker.check(&platform, &service.config, context) {
            Ok(ConfigCheck::Checked(checked)) => checked,
            Ok(ConfigCheck::Problems(problems)) => {
                report(reader, service, &problems, true);
                continue;
            }
            Err(message) => {
                reader.error(
                    service.platform_pos,
                    &service.platform_path,
                    format!("training service {platform} could not check its config: {message}"),
                );
                continue;
            }
        };
        report(reader, service, &checked.warnings, false);
        // The placeholder knob prints is never a secret a user meant (`ConfigReader::secret`
        // says so too; this catches a service that declares secrets without it).
        let placeholders: Vec<ConfigProblem> = checked
            .secrets
            .iter()
            .filter(|secret| {
                written(&service.config, &secret.path).and_then(serde_json::Value::as_str)
                    == Some(REDACTED)
            })
            .map(|secret| ConfigProblem {
                path: secret.path.clone(),
                message: format!(
                    "{REDACTED:?} is the placeholder knob prints instead of a secret; write the real value"
                ),
            })
            .collect();
        report(reader, service, &placeholders, true);
        // Each service runs once per experiment, with all its environments in its one entry.
        if good
            .iter()
            .any(|other| other.eq_ignore_ascii_case(&platform))
        {
            let message = format!(
                "platform {:?} is listed twice; list each platform once, with all its machines in one entry",
                service.platform
            );
            reader.error(service.node.pos, &service.path, message);
            continue;
        }
        good.push(pending[index].platform.as_str());
        if let Some(entry) = config
            .as_deref_mut()
            .and_then(|config| config.training_service.get_mut(index))
        {
            entry.platform = platform;
            entry.set_checked(checked.config, checked.secrets);
            entry.environments = checked.environments;
        }
    }
}

fn report(reader: &mut Reader, service: &PendingService, problems: &[ConfigProblem], errors: bool) {
    for problem in problems {
        let pos = position(&service.node, &problem.path);
        let field = field_text(&service.path, &problem.path);
        if errors {
            reader.error(pos, &field, problem.message.clone());
        } else {
            reader.warn(pos, &field, problem.message.clone());
        }
    }
}

/// Checks again the training services of a config read back from the store (canonical, secrets
/// as `***`), so that each plugin declares its secrets again and reports what it knows of its
/// environments. One line per problem.
pub fn recheck_services(
    config: &mut ExperimentConfig,
    checker: &dyn ServiceChecker,
    context: &ServiceContext,
) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let mut context = context.clone();
    context.trial = trial_settings(config);
    context.stored = true;
    for (index, service) in config.training_service.iter_mut().enumerate() {
        let path = format!("trainingService[{index}]");
        let platform = match resolve_platform(checker, &service.platform) {
            Ok(platform) => platform,
            Err(message) => {
                problems.push(format!("{path}.platform: {message}"));
                continue;
            }
        };
        let written = serde_json::Value::Object(service.config.clone());
        match checker.check(&platform, &written, &context) {
            Ok(ConfigCheck::Checked(checked)) => {
                let known: Vec<_> = service
                    .secrets
                    .iter()
                    .filter_map(|secret| {
                        service
                            .secret(&secret.path)
                            .map(|value| (secret.path.clone(), value.clone()))
                    })
                    .collect();
                service.platform = platform;
                service.set_checked(checked.config, checked.secrets);
                for (path, value) in known {
                    service.fill_secret(&path, value);
                }
                service.environments = checked.environments;
            }
            Ok(ConfigCheck::Problems(found)) => problems.extend(found.iter().map(|problem| {
                format!("{}: {}", field_text(&path, &problem.path), problem.message)
            })),
            Err(message) => problems.push(format!(
                "{path}: training service {platform} could not check its config: {message}"
            )),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}
