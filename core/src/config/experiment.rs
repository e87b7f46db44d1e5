//! Reading the top level of an experiment config into [`ExperimentConfig`].

use std::path::{Path, PathBuf};

use knob_plugin_api::space::{SearchSpace, SpaceError};

use knob_plugin_api::ComponentKind;

use super::algorithm::PendingAlgorithm;
use super::model::TrainingServiceConfig;
use super::model::{
    AlgorithmConfig, Constraint, ExperimentConfig, LogLevel, ObjectiveConfig, TunerErrorPolicy,
    OPTIMIZE_MODE, PLACEMENT_POLICY_NAMES,
};
use super::reader::{one_or_list, plain_io, quoted, Field, Fields, Reader};
use super::training_service::{
    read_training_services, Located, NNI_MANAGER_IP_IGNORED, SHORTCUT_PLATFORM,
};
use super::units;
use super::yaml::{self, Node, Pos, Value};
use crate::store::Direction;

/// The most `maxOomRetries` allowed: each such retry at least doubles a trial's memory request,
/// so ten already ask for a thousand times the first.
pub const MAX_OOM_RETRIES: u32 = 10;

/// Every top-level field knob reads: NNI v2's, the shortcuts, and knob's extensions.
pub(super) const TOP_FIELDS: [&str; 42] = [
    "experimentName",
    "experimentType",
    "searchSpaceFile",
    "searchSpace",
    "trialCommand",
    "trialCodeDirectory",
    "trialConcurrency",
    "trialGpuNumber",
    "maxExperimentDuration",
    "maxTrialNumber",
    "maxTrialDuration",
    "nniManagerIp",
    "useAnnotation",
    "debug",
    "logLevel",
    "experimentWorkingDirectory",
    "tunerGpuIndices",
    "tuner",
    "assessor",
    "advisor",
    "trainingService",
    "sharedStorage",
    "useActiveGpu",
    "maxTrialNumberPerGpu",
    "gpuIndices",
    "reuseMode",
    "maxCpuUtilization",
    "maxMemoryUtilization",
    "memoryReserve",
    "maxGpuMemoryUtilization",
    "gpuMemoryReserve",
    "pluginPaths",
    "trialGpuMemory",
    "trialMemorySize",
    "trialCpuNumber",
    "placementPolicy",
    "maxTrialRetries",
    "maxOomRetries",
    "nniShim",
    "tunerErrorPolicy",
    "notifications",
    "objectives",
];
/// knob's extensions for algorithms run by NNI's dispatcher (`nni_dispatch`). An NNI v1 config's
/// tuner, assessor and advisor take them too (`v1::convert_algorithm`), since the dispatcher's
/// errors tell a user of either form to set them.
pub(super) const NNI_DISPATCH_FIELDS: [&str; 3] = [
    "pythonInterpreter",
    "useNniImplementation",
    "dispatcherConnectTimeout",
];
const ALGORITHM_FIELDS: [&str; 7] = [
    "name",
    "className",
    "codeDirectory",
    "classArgs",
    NNI_DISPATCH_FIELDS[0],
    NNI_DISPATCH_FIELDS[1],
    NNI_DISPATCH_FIELDS[2],
];
const DEFAULT_WORKING_DIRECTORY: &str = "~/knob-experiments";

/// Reads the whole document; `None` when any error was recorded.
pub(crate) fn read_experiment(reader: &mut Reader, root: &Node) -> Option<ExperimentConfig> {
    let mut fields = Fields::open(reader, root, "")?;
    let errors_before = reader.errors.len();
    let mut take = |name: &str| fields.take(name);

    let experiment_name = take("experimentName").and_then(|field| reader.string(&field));
    if let Some(field) = take("experimentType") {
        if let Some(kind) = reader.string(&field) {
            if !kind.eq_ignore_ascii_case("hpo") {
                let message =
                    format!("only \"hpo\" experiments are supported (NAS is not), got {kind:?}");
                reader.error(field.node.pos, &field.path, message);
            }
        }
    }
    let search_space = read_search_space(reader, take("searchSpace"), take("searchSpaceFile"));
    let trial_command =
        take("trialCommand").and_then(|field| located(reader.non_empty_string(&field), &field));
    let trial_code_directory =
        take("trialCodeDirectory").and_then(|field| located(reader.directory(&field), &field));
    let trial_concurrency = take("trialConcurrency").map(|field| reader.integer::<u32>(&field, 1));
    let trial_gpu_number =
        take("trialGpuNumber").and_then(|field| located(reader.integer(&field, 0), &field));
    let trial_gpu_memory_mib =
        take("trialGpuMemory").and_then(|field| reader.parse(&field, units::size_mib));
    let trial_memory_size_mib =
        take("trialMemorySize").and_then(|field| reader.parse(&field, units::size_mib));
    let trial_cpu_number = take("trialCpuNumber").and_then(|field| reader.integer(&field, 1));
    let max_experiment_duration = take("maxExperimentDuration")
        .and_then(|field| reader.parse(&field, units::duration_seconds));
    let max_trial_number = take("maxTrialNumber").and_then(|field| reader.integer(&field, 1));
    let max_trial_duration =
        take("maxTrialDuration").and_then(|field| reader.parse(&field, units::duration_seconds));
    let max_trial_retries = take("maxTrialRetries").and_then(|field| reader.integer(&field, 0));
    let max_oom_retries = take("maxOomRetries").and_then(|field| {
        reader.parse(&field, |node| match node.value {
            Value::Int(i) if (0..=i64::from(MAX_OOM_RETRIES)).contains(&i) => Ok(i as u32),
            _ => Err(format!(
                "expected an integer from 0 to {MAX_OOM_RETRIES} (each retry after running out of memory doubles the trial's memory request), got {}",
                node.describe()
            )),
        })
    });
    let nni_shim = take("nniShim").and_then(|field| reader.boolean(&field));
    if let Some(field) = take("nniManagerIp") {
        reader.string(&field);
        reader.warn(field.node.pos, &field.path, NNI_MANAGER_IP_IGNORED);
    }
    if let Some(field) = take("useAnnotation") {
        if reader.boolean(&field) == Some(true) {
            let message =
                "NNI annotations are not supported by knob; write a searchSpace and call \
                           nni.get_next_parameter() in the trial";
            reader.error(field.node.pos, &field.path, message);
        }
    }
    let debug = take("debug")
        .and_then(|field| reader.boolean(&field))
        .unwrap_or(false);
    let log_level = take("logLevel").and_then(|field| reader.choice(&field, &LogLevel::ALL));
    let working_directory_field = take("experimentWorkingDirectory");
    let working_directory_at = working_directory_field
        .as_ref()
        .and_then(|field| field.node.pos);
    let experiment_working_directory = match working_directory_field {
        Some(field) => reader.path(&field).and_then(|path| {
            let what_to_do = "name a folder (knob creates it if it is missing)";
            reader.check_makeable_directory(field.node.pos, &field.path, path, what_to_do)
        }),
        None => {
            let (base_dir, home) = (reader.base_dir.clone(), reader.home.clone());
            match units::resolve_path(DEFAULT_WORKING_DIRECTORY, &base_dir, home.as_deref()) {
                Ok(path) => reader.check_makeable_directory(
                    None,
                    "experimentWorkingDirectory",
                    path,
                    "set experimentWorkingDirectory to a folder (knob creates it if it is missing)",
                ),
                Err(message) => {
                    reader.error(
                        None,
                        "experimentWorkingDirectory",
                        format!("{message}; set experimentWorkingDirectory"),
                    );
                    None
                }
            }
        }
    };
    // The trials' shared Python folder lives in the experiment's folder and goes on their
    // PYTHONPATH, which splits at ':': Python then finds neither of knob's modules.
    if let Some(dir) = experiment_working_directory
        .as_ref()
        .filter(|dir| dir.as_os_str().as_encoded_bytes().contains(&b':'))
    {
        reader.warn(
            working_directory_at,
            "experimentWorkingDirectory",
            format!(
                "{} holds ':', at which PYTHONPATH splits, so trials cannot `import knob_trial` nor knob's nni shim (a real nni still works); choose a folder without ':'",
                dir.display()
            ),
        );
    }
    let tuner_gpu_indices =
        take("tunerGpuIndices").and_then(|field| reader.parse(&field, units::gpu_indices));
    let tuner_field = take("tuner");
    let advisor_field = take("advisor");
    // Where the tuner's optimize_mode is, for an error about it once `objectives` is read.
    let tuner_mode_at = tuner_field
        .as_ref()
        .or(advisor_field.as_ref())
        .and_then(|field| {
            let (_, class_args) = super::reader::map_entry(field.node, "classArgs")?;
            let key = map_key(class_args, OPTIMIZE_MODE)?;
            Some((key.pos, format!("{}.classArgs.{OPTIMIZE_MODE}", field.path)))
        });
    let tuner = read_tuner(reader, tuner_field, advisor_field);
    let assessor =
        take("assessor").and_then(|field| read_algorithm(reader, &field, ComponentKind::Assessor));
    if let Some(field) = take("sharedStorage") {
        reader.error(
            field.node.pos,
            &field.path,
            "NNI's shared storage is not supported by knob",
        );
    }
    // NNI's top-level shortcuts, canonical, for the training services (see `SHORTCUT_PLATFORM`).
    let mut shortcuts = serde_json::Map::new();
    if let Some(value) = take("useActiveGpu").and_then(|field| reader.boolean(&field)) {
        shortcuts.insert("useActiveGpu".into(), value.into());
    }
    if let Some(value) =
        take("maxTrialNumberPerGpu").and_then(|field| reader.integer::<u32>(&field, 1))
    {
        shortcuts.insert("maxTrialNumberPerGpu".into(), value.into());
    }
    if let Some(value) =
        take("gpuIndices").and_then(|field| reader.parse(&field, units::gpu_indices))
    {
        shortcuts.insert("gpuIndices".into(), value.into());
    }
    if let Some(value) = take("reuseMode").and_then(|field| reader.boolean(&field)) {
        shortcuts.insert("reuseMode".into(), value.into());
    }
    // The limits of a shared machine (knob extension): for every environment of every service
    // that does not set its own.
    for name in units::PERCENT_LIMITS {
        if let Some(value) = take(name).and_then(|field| reader.parse(&field, units::percent)) {
            shortcuts.insert(name.into(), value.into());
        }
    }
    for name in units::SIZE_LIMITS {
        if let Some(value) = take(name).and_then(|field| reader.parse(&field, units::size_mib)) {
            shortcuts.insert(name.into(), value.into());
        }
    }
    reader.shortcuts = shortcuts;
    let plugin_paths = take("pluginPaths")
        .map(|field| read_plugin_paths(reader, &field))
        .unwrap_or_default();
    reader.plugin_paths = plugin_paths.clone();
    let placement_policy =
        take("placementPolicy").and_then(|field| reader.choice(&field, &PLACEMENT_POLICY_NAMES));
    let tuner_error_policy =
        take("tunerErrorPolicy").and_then(|field| reader.choice(&field, &TunerErrorPolicy::NAMES));
    let notifications = take("notifications")
        .and_then(|field| super::notifications::read_notifications(reader, &field));
    let objectives = take("objectives").map(|field| read_objectives(reader, &field));
    // With objectives, the first objective's mode decides which trials are best; a tuner's
    // optimize_mode that says the opposite would be dropped without a word.
    let first_objective = objectives
        .iter()
        .flatten()
        .find(|objective| objective.constraint.is_none());
    let tuner_mode = tuner
        .as_ref()
        .and_then(|tuner| tuner.class_args.get(OPTIMIZE_MODE))
        .and_then(serde_json::Value::as_str);
    if let (Some(objective), Some(mode), Some((pos, path))) =
        (first_objective, tuner_mode, &tuner_mode_at)
    {
        if objective.mode.as_deref().is_some_and(|first| first != mode) {
            let message = format!(
                "{mode} contradicts objectives, whose first objective ({}, {}) decides which trials are best; remove optimize_mode or make the two agree",
                objective.metric,
                objective.mode.as_deref().unwrap_or_default()
            );
            reader.error(*pos, path, message);
        }
    }
    let training_services = match take("trainingService") {
        Some(field) => read_training_services(reader, &field),
        None => {
            reader.error(
                None,
                "trainingService",
                format!("required: where trials run, e.g. {{platform: {SHORTCUT_PLATFORM}}}"),
            );
            None
        }
    };
    fields.finish(reader, &TOP_FIELDS);

    // NNI lets a training service carry trial settings; knob keeps one of each per experiment.
    let (training_services, service_settings) = match training_services {
        Some((services, settings)) => {
            let entries: Vec<TrainingServiceConfig> = services
                .iter()
                .map(|service| {
                    let fields = service.config.as_object().cloned().unwrap_or_default();
                    TrainingServiceConfig::new(service.platform.clone(), fields)
                })
                .collect();
            reader.pending = services;
            (Some(entries), settings)
        }
        None => (None, Vec::new()),
    };
    let (mut commands, mut directories, mut gpu_numbers) = (Vec::new(), Vec::new(), Vec::new());
    for settings in service_settings {
        commands.push(settings.trial_command);
        directories.push(settings.trial_code_directory);
        gpu_numbers.push(settings.trial_gpu_number);
    }
    let trial_command = merge(reader, "trialCommand", trial_command, commands);
    let trial_code_directory = merge(
        reader,
        "trialCodeDirectory",
        trial_code_directory,
        directories,
    );
    let trial_gpu_number = merge(reader, "trialGpuNumber", trial_gpu_number, gpu_numbers);
    // Unset, it is the config's folder, which no path field's check has seen.
    if trial_code_directory.is_none() {
        if let Err(message) = units::check_utf8(&reader.base_dir) {
            let message = format!("not set, so the config file's folder: {message}");
            reader.error(None, "trialCodeDirectory", message);
        }
    }
    if trial_command.is_none()
        && !reader
            .errors
            .iter()
            .any(|error| error.field.ends_with("trialCommand"))
    {
        reader.error(
            None,
            "trialCommand",
            "required: the command that runs one trial, e.g. \"python3 train.py\"",
        );
    }
    let trial_concurrency = match trial_concurrency {
        Some(value) => value,
        None => {
            reader.error(
                None,
                "trialConcurrency",
                "required: how many trials run at once, a positive integer",
            );
            None
        }
    };

    if reader.errors.len() != errors_before {
        return None;
    }
    Some(ExperimentConfig {
        experiment_name,
        trial_command: trial_command?,
        trial_code_directory: trial_code_directory.unwrap_or_else(|| reader.base_dir.clone()),
        trial_concurrency: trial_concurrency?,
        trial_gpu_number,
        trial_gpu_memory_mib,
        trial_memory_size_mib,
        trial_cpu_number,
        max_experiment_duration: max_experiment_duration.map(std::time::Duration::from_secs),
        max_trial_number,
        max_trial_duration: max_trial_duration.map(std::time::Duration::from_secs),
        max_trial_retries: max_trial_retries.unwrap_or(0),
        max_oom_retries: max_oom_retries.unwrap_or(0),
        nni_shim,
        debug,
        log_level: log_level.unwrap_or(if debug {
            LogLevel::Debug
        } else {
            LogLevel::Info
        }),
        experiment_working_directory: experiment_working_directory?,
        tuner_gpu_indices,
        tuner: tuner?,
        assessor,
        training_service: training_services?,
        placement_policy: placement_policy.unwrap_or_default(),
        tuner_error_policy: tuner_error_policy.unwrap_or_default(),
        notifications,
        plugin_paths,
        objectives: objectives.unwrap_or_default(),
        search_space: search_space?,
    })
}

fn located<T>(value: Option<T>, field: &Field<'_>) -> Option<Located<T>> {
    value.map(|value| Located {
        value,
        pos: field.node.pos,
        path: field.path.clone(),
    })
}

/// One value from the top level and the training services: they must agree.
fn merge<T: PartialEq + std::fmt::Debug>(
    reader: &mut Reader,
    name: &str,
    top_level: Option<Located<T>>,
    per_service: Vec<Option<Located<T>>>,
) -> Option<T> {
    let mut chosen = top_level;
    for setting in per_service.into_iter().flatten() {
        let Some(first) = &chosen else {
            chosen = Some(setting);
            continue;
        };
        if first.value != setting.value {
            let message = format!(
                "{:?} differs from {} ({:?}); knob runs one {name} per experiment, set it once at top level",
                setting.value, first.path, first.value
            );
            reader.error(setting.pos, &setting.path, message);
        }
    }
    chosen.map(|located| located.value)
}

fn read_search_space(
    reader: &mut Reader,
    inline: Option<Field<'_>>,
    file: Option<Field<'_>>,
) -> Option<serde_json::Value> {
    match (inline, file) {
        (Some(_), Some(file)) => {
            let message =
                "searchSpace is set too; keep one of searchSpace (inline) and searchSpaceFile";
            reader.error(file.node.pos, &file.path, message);
            None
        }
        (None, None) => {
            let message = "required: searchSpace (the space inline) or searchSpaceFile (a JSON or YAML file); \
                           an empty space is written {}";
            reader.error(None, "searchSpace", message);
            None
        }
        (Some(inline), None) => {
            let value = match inline.node.to_json() {
                Ok(value) => value,
                Err((pos, message)) => {
                    reader.error(pos.or(inline.node.pos), &inline.path, message);
                    return None;
                }
            };
            match SearchSpace::from_value_all(&value) {
                Ok(_) => Some(value),
                Err(errors) => {
                    for error in errors {
                        let pos = parameter_node(inline.node, &error)
                            .and_then(|node| node.pos)
                            .or(inline.node.pos);
                        reader.error(pos, &inline.path, error.to_string());
                    }
                    None
                }
            }
        }
        (None, Some(file)) => {
            let path = reader.path(&file)?;
            // Only a regular file of sane size: /dev/zero or a FIFO would never end.
            let too_big = match std::fs::metadata(&path) {
                Ok(meta) if !meta.is_file() => Some("it is not a regular file".to_string()),
                Ok(meta) if meta.len() > MAX_SEARCH_SPACE_FILE_BYTES => Some(format!(
                    "it is over {} MiB",
                    MAX_SEARCH_SPACE_FILE_BYTES >> 20
                )),
                _ => None,
            };
            if let Some(why) = too_big {
                let message = format!("cannot read search space file {}: {why}", quoted(&path));
                reader.error(file.node.pos, &file.path, message);
                return None;
            }
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(error) => {
                    let message = format!(
                        "cannot read search space file {}: {}",
                        quoted(&path),
                        plain_io(&error)
                    );
                    reader.error(file.node.pos, &file.path, message);
                    return None;
                }
            };
            match parse_search_space(&path, &text) {
                Ok(value) => Some(value),
                Err(errors) => {
                    for error in errors {
                        reader.error_in(&path, error.pos, &file.path, error.message);
                    }
                    None
                }
            }
        }
    }
}

/// The largest `searchSpaceFile` a config may name. The API's search-space route takes the same
/// space as JSON (`api::writes::SEARCH_SPACE_BODY_LIMIT`), sized from this.
pub const MAX_SEARCH_SPACE_FILE_BYTES: u64 = 16 << 20;

/// A problem of a search-space file, at a line and column of that file where known.
#[derive(Debug, Clone, PartialEq)]
pub struct SpaceFileError {
    pub pos: Option<Pos>,
    pub message: String,
}

/// Reads the text of a search-space file as `searchSpaceFile` does: JSON when the name ends in
/// `.json`, YAML otherwise (YAML is a superset of JSON, so a JSON file by another name reads too),
/// checked as an NNI search space. `knob space` uses it, so it accepts what a config accepts.
/// A file that cannot be read as JSON or YAML has one error; a space, every error it has.
pub fn parse_search_space(
    path: &Path,
    text: &str,
) -> Result<serde_json::Value, Vec<SpaceFileError>> {
    let parsed = yaml::parse_file(path, text);
    let node = match parsed {
        Ok(Some(node)) => node,
        Ok(None) => {
            return Err(vec![SpaceFileError {
                pos: None,
                message: "the search space file is empty; an empty space is written {}".into(),
            }])
        }
        Err(error) => {
            let kind = if yaml::is_json_file(path) {
                "JSON"
            } else {
                "YAML"
            };
            return Err(vec![SpaceFileError {
                pos: error.pos,
                message: format!("malformed {kind}: {}", error.message),
            }]);
        }
    };
    let value = node
        .to_json()
        .map_err(|(pos, message)| vec![SpaceFileError { pos, message }])?;
    match SearchSpace::from_value_all(&value) {
        Ok(_) => Ok(value),
        Err(errors) => Err(errors
            .into_iter()
            .map(|error| SpaceFileError {
                pos: parameter_node(&node, &error)
                    .and_then(|node| node.pos)
                    .or(node.pos),
                message: error.to_string(),
            })
            .collect()),
    }
}

/// The key `key` of the mapping `node`, if it is one and has it: where an error about its value
/// points, as the plugins' classArgs errors do.
fn map_key<'a>(node: &'a Node, key: &str) -> Option<&'a Node> {
    let Value::Map(entries) = &node.value else {
        return None;
    };
    entries
        .iter()
        .map(|(entry, _)| entry)
        .find(|entry| entry.key_text() == key)
}

/// The key of the parameter a search-space error is about, to point at its line: inside a
/// nested choice (`model/mlp/h`: `h` of option `mlp` of `model`), the entry's own key, else as
/// deep as the path could be followed.
fn parameter_node<'a>(space: &'a Node, error: &SpaceError) -> Option<&'a Node> {
    let SpaceError::Parameter { path, .. } = error else {
        return None;
    };
    fn entry<'a>(map: &'a Node, name: &str) -> Option<(&'a Node, &'a Node)> {
        match &map.value {
            Value::Map(entries) => entries
                .iter()
                .find(|(key, _)| key.key_text() == name)
                .map(|(key, value)| (key, value)),
            _ => None,
        }
    }
    let mut segments = path.split('/');
    let (mut key, mut spec) = entry(space, segments.next()?)?;
    // Then pairs: an option's `_name` in the choice's `_value`, a parameter's name in it.
    while let (Some(option), Some(name)) = (segments.next(), segments.next()) {
        let Some(Value::Seq(options)) = entry(spec, "_value").map(|(_, v)| &v.value) else {
            break;
        };
        let chosen = options.iter().find(|candidate| {
            entry(candidate, "_name").and_then(|(_, v)| v.as_str()) == Some(option)
        });
        let Some((inner_key, inner_spec)) = chosen.and_then(|chosen| entry(chosen, name)) else {
            break;
        };
        (key, spec) = (inner_key, inner_spec);
    }
    Some(key)
}

fn read_tuner(
    reader: &mut Reader,
    tuner: Option<Field<'_>>,
    advisor: Option<Field<'_>>,
) -> Option<AlgorithmConfig> {
    match (tuner, advisor) {
        (Some(tuner), None) => read_algorithm(reader, &tuner, ComponentKind::Tuner),
        (None, Some(advisor)) => {
            reader.warn(
                advisor.node.pos,
                &advisor.path,
                "deprecated in NNI; read as tuner",
            );
            read_algorithm(reader, &advisor, ComponentKind::Tuner)
        }
        (Some(tuner), Some(advisor)) => {
            read_algorithm(reader, &tuner, ComponentKind::Tuner);
            reader.error(
                advisor.node.pos,
                &advisor.path,
                "deprecated, and tuner is set too; keep only tuner",
            );
            None
        }
        (None, None) => {
            reader.error(None, "tuner", "required: the tuning algorithm, e.g. {name: TPE, classArgs: {optimize_mode: maximize}}");
            None
        }
    }
}

fn read_algorithm(
    reader: &mut Reader,
    field: &Field<'_>,
    kind: ComponentKind,
) -> Option<AlgorithmConfig> {
    let errors_before = reader.errors.len();
    let mut fields = Fields::open(reader, field.node, &field.path)?;
    let name_field = fields.take("name");
    let class_name_field = fields.take("className");
    let code_directory_field = fields.take("codeDirectory");
    let name = name_field
        .as_ref()
        .and_then(|field| reader.non_empty_string(field));
    let class_name = class_name_field
        .as_ref()
        .and_then(|field| reader.non_empty_string(field));
    let class_args_field = fields.take("classArgs");
    let python_interpreter = fields.take("pythonInterpreter").and_then(|field| {
        let text = reader.non_empty_string(&field)?;
        // A bare command (`python3.11`) is looked up on PATH, a path taken against the config's
        // folder but never resolved further: a virtualenv's python is a symlink to the base
        // interpreter, which does not see the venv's packages.
        let path = std::path::PathBuf::from(&text);
        Some(
            if text.contains(std::path::MAIN_SEPARATOR) && path.is_relative() {
                reader.base_dir.join(path)
            } else {
                path
            },
        )
    });
    let use_nni_implementation = fields
        .take("useNniImplementation")
        .and_then(|field| reader.boolean(&field))
        .unwrap_or(false);
    let dispatcher_connect_timeout = fields
        .take("dispatcherConnectTimeout")
        .and_then(|field| reader.parse(&field, super::units::duration_seconds));
    let class_args = class_args_field
        .as_ref()
        .and_then(|field| reader.json_object(field))
        .unwrap_or_default();
    // A tuner's optimize_mode is knob's too (it says which trials are best), so knob checks it
    // for any tuner, a custom or third-party one included; an assessor's is its own to check.
    if let (ComponentKind::Tuner, Some(field), Err(message)) = (
        kind,
        &class_args_field,
        Direction::from_optimize_mode(None, class_args.get(OPTIMIZE_MODE)),
    ) {
        let node = map_key(field.node, OPTIMIZE_MODE).unwrap_or(field.node);
        let path = format!("{}.{OPTIMIZE_MODE}", field.path);
        reader.error(node.pos, &path, message);
    }
    let mut code_directory = None;
    match (&name_field, &class_name_field) {
        (Some(_), Some(class_name)) => {
            let message =
                "name and className are both set: name picks a built-in or registered algorithm, \
                           className a custom one; keep one";
            reader.error(class_name.node.pos, &class_name.path, message);
        }
        (None, None) => {
            let message = "required: the algorithm's name, e.g. TPE (or className and codeDirectory for a custom one)";
            reader.error(fields.pos, &fields.child_path("name"), message);
        }
        (Some(_), None) => {
            if let Some(directory) = &code_directory_field {
                reader.error(
                    directory.node.pos,
                    &directory.path,
                    "only used with className; remove it",
                );
            }
        }
        (None, Some(class_field)) => {
            // NNI imports `module.Class` (it splits at the last dot): a bare class name made its
            // dispatcher die with "not enough values to unpack". (Not said again after a v1
            // config's conversion refused its classFileName, the module.)
            let qualified = class_name
                .as_deref()
                .and_then(|name| name.rsplit_once('.'))
                .is_some_and(|(module, class)| !module.is_empty() && !class.is_empty());
            let said = reader
                .errors
                .iter()
                .any(|e| e.field.starts_with(&format!("{}.", field.path)));
            if class_name.is_some() && !qualified && !said {
                let message = format!(
                    "expected module.Class, the module a Python file in codeDirectory (my_tuner.MyTuner for my_tuner.py), not {:?}",
                    class_name.as_deref().unwrap_or_default()
                );
                reader.error(class_field.node.pos, &class_field.path, message);
            }
            code_directory = match &code_directory_field {
                Some(directory) => reader.directory(directory),
                None => Some(reader.base_dir.clone()),
            };
        }
    }
    fields.finish(reader, &ALGORITHM_FIELDS);
    let algorithm = (reader.errors.len() == errors_before).then_some(AlgorithmConfig {
        name,
        class_name,
        code_directory,
        class_args,
        python_interpreter,
        use_nni_implementation,
        dispatcher_connect_timeout,
    })?;
    // Built by its plugin once the plugins are known (`algorithm::check_algorithms`).
    reader.pending_algorithms.push(PendingAlgorithm {
        kind,
        path: field.path.clone(),
        node: field.node.clone(),
        name: algorithm.name.clone(),
        class_name: algorithm.class_name.clone(),
        class_args: algorithm.class_args.clone(),
        config: algorithm.clone(),
    });
    Some(algorithm)
}

/// `objectives` (knob extension): a list of `{metric, mode}` objectives and `{metric,
/// constraint}` constraints, each metric once, at least one objective.
fn read_objectives(reader: &mut Reader, field: &Field<'_>) -> Vec<ObjectiveConfig> {
    const OBJECTIVE_FIELDS: [&str; 4] = ["metric", "mode", "constraint", "reference"];
    const MODES: [(&str, &str); 2] = [("maximize", "maximize"), ("minimize", "minimize")];
    let Value::Seq(items) = &field.node.value else {
        let message = format!(
            "expected a list such as [{{metric: accuracy, mode: maximize}}, {{metric: latency_ms, mode: minimize}}], got {}",
            field.node.describe()
        );
        reader.error(field.node.pos, &field.path, message);
        return Vec::new();
    };
    if items.is_empty() {
        let message = "an empty list; list at least one {metric, mode}, or leave objectives out";
        reader.error(field.node.pos, &field.path, message);
        return Vec::new();
    }
    let mut objectives: Vec<ObjectiveConfig> = Vec::new();
    for (index, node) in items.iter().enumerate() {
        let path = format!("{}[{index}]", field.path);
        let Some(mut fields) = Fields::open(reader, node, &path) else {
            continue;
        };
        let metric = match fields.take("metric") {
            Some(metric) => reader
                .non_empty_string(&metric)
                .map(|m| (m, metric.node.pos)),
            None => {
                reader.error(
                    node.pos,
                    &format!("{path}.metric"),
                    "required: a key of the dict the trial reports as its final result",
                );
                None
            }
        };
        let mode_field = fields.take("mode");
        let mode = mode_field
            .as_ref()
            .and_then(|mode| reader.choice(mode, &MODES));
        let constraint_field = fields.take("constraint");
        let constraint = constraint_field.as_ref().and_then(|c| {
            reader.parse(c, |node| match &node.value {
                Value::Str(text) => text.parse::<Constraint>(),
                _ => Err(format!(
                    "expected a string such as \"<= 0\", got {}",
                    node.describe()
                )),
            })
        });
        let reference = fields.take("reference").and_then(|r| {
            reader.parse(&r, |node| match node.value {
                Value::Int(i) => Ok(i as f64),
                Value::UInt(u) => Ok(u as f64),
                Value::Float(x) if x.is_finite() => Ok(x),
                _ => Err(format!("expected a number, got {}", node.describe())),
            })
        });
        fields.finish(reader, &OBJECTIVE_FIELDS);
        match (&mode_field, &constraint_field) {
            (Some(mode), Some(_)) => reader.error(
                mode.node.pos,
                &mode.path,
                "a constraint has no mode; leave mode out, or constraint out for an objective",
            ),
            (None, None) => reader.error(
                node.pos,
                &format!("{path}.mode"),
                "required: maximize or minimize (or a constraint such as \"<= 0\")",
            ),
            _ => {}
        }
        let Some((metric, pos)) = metric else {
            continue;
        };
        if objectives.iter().any(|o| o.metric == metric) {
            reader.error(
                pos,
                &format!("{path}.metric"),
                format!("{metric:?} is listed twice; list each metric once"),
            );
            continue;
        }
        objectives.push(ObjectiveConfig {
            metric,
            mode: mode.map(String::from),
            constraint,
            reference,
        });
    }
    if !objectives.is_empty() && objectives.iter().all(|o| o.constraint.is_some()) {
        reader.error(
            field.node.pos,
            &field.path,
            "only constraints are listed; add an objective such as {metric: accuracy, mode: maximize}",
        );
    }
    objectives
}

fn read_plugin_paths(reader: &mut Reader, field: &Field<'_>) -> Vec<PathBuf> {
    let Some(items) = one_or_list(field) else {
        let message = format!(
            "expected a list of plugin files or folders, got {}",
            field.node.describe()
        );
        reader.error(field.node.pos, &field.path, message);
        return Vec::new();
    };
    let mut paths = Vec::new();
    for item in items {
        let Some(path) = reader.path(&item) else {
            continue;
        };
        if Path::new(&path).exists() {
            paths.push(path);
        } else {
            reader.error(
                item.node.pos,
                &item.path,
                format!("plugin path {} does not exist", quoted(&path)),
            );
        }
    }
    paths
}
