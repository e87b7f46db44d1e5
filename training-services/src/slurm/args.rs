//! The `slurm` service's config: its own `trainingService` mapping, checked here
//! ([`check_config`], through `knob_plugin_api::config::ConfigReader`, so every problem reaches
//! the user with its file:line:column), plus what the host says about the experiment
//! (`ServiceContext`: its id and folder, and the trial settings `trialConcurrency`,
//! `trialGpuNumber`, `trialCpuNumber`, `trialMemorySize` and `maxTrialDuration`, which the
//! experiment config holds at top level).
//!
//! Canonical form: every field below with its default filled in; `agentBinary` absolute; the
//! intervals in seconds. The service has no secret fields.

use std::path::PathBuf;
use std::time::Duration;

use knob_gpu_sched::ByteSize;
use knob_plugin_api::config::{describe, quoted, ConfigReader, Field};
use knob_plugin_api::service::{CheckedConfig, ConfigProblem, FieldPath, ServiceContext};
use serde_json::{json, Map, Value};

use super::commands::slurm_seconds;

/// How long the agent in an allocation runs on with no knob connected (the manager died)
/// before it kills its trials and exits, which ends the Slurm job.
pub const DEFAULT_ORPHAN_TIMEOUT: Duration = Duration::from_secs(600);
/// How often `squeue` is asked while nothing goes wrong.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The least time between two `sbatch` calls: submitting many jobs at once is what times out
/// slurmctld's RPCs on busy clusters.
pub const DEFAULT_SUBMIT_INTERVAL: Duration = Duration::from_millis(200);
/// The longest `time` taken: Slurm's own arithmetic goes wrong for longer limits (on 22.05 a
/// limit ending after 2038 has squeue's TimeLeft `INVALID`, and limits past a few decades wrap
/// into others), and a longer one would be no limit in practice; `UNLIMITED` says that.
const LONGEST_TIME_DAYS: u128 = 365;
/// The most GPUs one environment may declare: gpu-sched holds one value for each, and the
/// queue of `reuseMode: false` declares `trialGpuNumber` × `trialConcurrency` (a product that
/// overflowed u32, or asked for hundreds of gigabytes). More than any cluster gives one user.
pub const MOST_ENVIRONMENT_GPUS: u64 = 65_536;
/// `pollIntervalSecs` below this would make `squeue` the cluster's load.
const LEAST_POLL_INTERVAL: f64 = 0.1;

/// The fields of `trainingService` for `platform: slurm`.
pub const SLURM_FIELDS: [&str; 21] = [
    "reuseMode",
    "maxEnvironments",
    "partition",
    "account",
    "qos",
    "time",
    "constraint",
    "nodes",
    "exclude",
    "sbatchArgs",
    "setupCommands",
    "jobName",
    "agentBinary",
    "orphanTimeoutSecs",
    "pollIntervalSecs",
    "submitIntervalSecs",
    crate::limits::LIMIT_FIELDS[0],
    crate::limits::LIMIT_FIELDS[1],
    crate::limits::LIMIT_FIELDS[2],
    crate::limits::LIMIT_FIELDS[3],
    crate::limits::LIMIT_FIELDS[4],
];

/// The job options passed through to `#SBATCH` lines as written.
const PASSED_THROUGH: [&str; 6] = [
    "partition",
    "account",
    "qos",
    "constraint",
    "nodes",
    "exclude",
];

/// Everything the service runs by.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmArgs {
    pub experiment_id: String,
    /// On the cluster's shared filesystem: job scripts, agent directories, logs, exit codes.
    pub experiment_dir: PathBuf,
    /// `true`: each environment is one allocation running many trials; `false`: one job per trial.
    pub reuse_mode: bool,
    /// Allocations at once (`reuseMode: true`); default `trialConcurrency`.
    pub max_environments: u32,
    /// `maxEnvironments` was set: it stays when `knob update concurrency` changes
    /// `trialConcurrency`, which the default follows.
    pub max_environments_set: bool,
    /// Jobs in the queue at once (`reuseMode: false`).
    pub trial_concurrency: u32,
    /// Used to keep trials out of an allocation that would end before they could finish.
    pub max_trial_duration: Option<Duration>,
    pub job: JobOptions,
    /// The `knob-agent` the jobs run; default: the one beside this library or on `PATH`.
    pub agent_binary: Option<PathBuf>,
    pub orphan_timeout: Duration,
    pub poll_interval: Duration,
    pub submit_interval: Duration,
    /// The shared-machine limits applied to each allocation (`reuseMode: true`), see
    /// [`crate::limits`].
    pub limits: knob_gpu_sched::EnvironmentLimits,
}

/// What goes into every job's `#SBATCH` lines.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobOptions {
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    /// Slurm's own time format (`30`, `1:00:00`, `2-00:00:00`), passed through.
    pub time: Option<String>,
    pub constraint: Option<String>,
    pub nodes: Option<String>,
    pub exclude: Option<String>,
    /// Extra `#SBATCH` lines, each with or without the `#SBATCH ` prefix.
    pub sbatch_args: Vec<String>,
    /// Shell lines run in the job before the agent (module load, conda activate, ...).
    pub setup_commands: Vec<String>,
    /// Prefix of every job name (default `knob`); the rest names the experiment and the job.
    pub job_name: String,
    pub gpu_number: u32,
    pub cpu_number: Option<u32>,
    pub memory: Option<ByteSize>,
}

/// What is wrong with the config or context the service was built with, one line.
#[derive(Debug, thiserror::Error)]
#[error("training service slurm: {0}")]
pub struct ArgsError(pub String);

/// A list of strings, or one string (one line each).
fn lines(reader: &mut ConfigReader<'_>, field: &Field<'_>) -> Option<Vec<String>> {
    reader.parse(field, |value| match value {
        Value::String(text) => Ok(text.lines().map(str::to_string).collect()),
        Value::Array(items) => items
            .iter()
            .map(|item| {
                item.as_str().map(str::to_string).ok_or_else(|| {
                    format!("expected a list of strings, got {} in it", describe(item))
                })
            })
            .collect(),
        other => Err(format!(
            "expected a list of strings, got {}",
            describe(other)
        )),
    })
}

/// The `#SBATCH` options knob writes into every job and depends on, none of which `sbatchArgs`
/// may set (a later line overrides an earlier one): the long name, the least prefix sbatch
/// takes for it (it accepts any unambiguous one), the short letter, and what to do instead.
const KNOB_OWN_OPTIONS: [(&str, usize, Option<char>, &str); 5] = [
    (
        "job-name",
        1,
        Some('J'),
        "knob finds its jobs in squeue by their names; set jobName instead",
    ),
    (
        "comment",
        3,
        None,
        "knob finds an experiment's jobs by their comment to cancel those a crashed run left; remove it",
    ),
    (
        "output",
        2,
        Some('o'),
        "knob writes each job's log into the experiment folder and reads it to say why a job ended; remove it",
    ),
    (
        "error",
        2,
        Some('e'),
        "knob writes each job's log into the experiment folder and reads it to say why a job ended; remove it",
    ),
    (
        "array",
        2,
        Some('a'),
        "knob submits one job per allocation (maxEnvironments) or per trial (reuseMode: false); remove it",
    ),
];

/// sbatch's short options that take no value, which may come first in a bundle (`-HJ name`).
const SHORT_FLAGS: &str = "hHkOQsvVW";

/// The arguments sbatch reads from an `#SBATCH` line (after the prefix): split at whitespace
/// outside quotes, with backslash escapes, up to an unquoted `#` (a comment), as sbatch does.
fn sbatch_line_arguments(line: &str) -> Vec<String> {
    let mut arguments = Vec::new();
    let mut current: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (c, quote) {
            ('\\', _) => {
                let escaped = chars.next().unwrap_or('\\');
                current.get_or_insert_with(String::new).push(escaped);
            }
            (c, Some(q)) if c == q => quote = None,
            (c, Some(_)) => current.get_or_insert_with(String::new).push(c),
            ('"' | '\'', None) => {
                quote = Some(c);
                current.get_or_insert_with(String::new);
            }
            ('#', None) => break,
            (c, None) if c.is_whitespace() => arguments.extend(current.take()),
            (c, None) => current.get_or_insert_with(String::new).push(c),
        }
    }
    arguments.extend(current);
    arguments
}

/// The option of [`KNOB_OWN_OPTIONS`] an `sbatchArgs` item sets, if any: its long name and what
/// to do instead.
fn knob_own_option(item: &str) -> Option<(&'static str, &'static str)> {
    let item = item.trim();
    let line = item.strip_prefix("#SBATCH").unwrap_or(item);
    for argument in sbatch_line_arguments(line) {
        if let Some(long) = argument.strip_prefix("--") {
            let name = long.split('=').next().unwrap_or_default();
            let found = KNOB_OWN_OPTIONS
                .iter()
                .find(|(option, least, ..)| name.len() >= *least && option.starts_with(name));
            if let Some((option, _, _, instead)) = found {
                return Some((option, instead));
            }
        } else if let Some(short) = argument.strip_prefix('-') {
            for letter in short.chars() {
                let found = KNOB_OWN_OPTIONS
                    .iter()
                    .find(|(.., own, _)| *own == Some(letter));
                if let Some((option, _, _, instead)) = found {
                    return Some((option, instead));
                }
                if !SHORT_FLAGS.contains(letter) {
                    // The rest of the argument is this option's value.
                    break;
                }
            }
        }
    }
    None
}

/// Refuses `sbatchArgs` items that would break the job script: a line break ends the `#SBATCH`
/// line and makes the rest a command of the job (sbatch then ignores every later `#SBATCH`
/// line), and an option of [`KNOB_OWN_OPTIONS`] would take the job away from knob.
fn check_sbatch_args(reader: &mut ConfigReader<'_>, field: &Field<'_>, items: &[String]) {
    for (index, item) in items.iter().enumerate() {
        // Items of a list are named by their index; the lines of one string by the field.
        let path = match field.value {
            Value::Array(_) => field.path.index(index),
            _ => field.path.clone(),
        };
        if item.contains(['\n', '\r']) {
            reader.error(
                &path,
                format!("{item:?} holds a line break, which would end its #SBATCH line and run the rest as a command of the job; give each #SBATCH line as its own item"),
            );
        } else if let Some((option, instead)) = knob_own_option(item) {
            reader.error(
                &path,
                format!("{item:?} sets --{option}, which knob sets itself: {instead}"),
            );
        }
    }
}

/// A number of seconds (fractions allowed) from `least` to a week.
fn seconds(reader: &mut ConfigReader<'_>, field: &Field<'_>, least: f64) -> Option<f64> {
    reader.parse(field, |value| {
        value
            .as_f64()
            .filter(|s| (least..=7.0 * 86_400.0).contains(s))
            .ok_or_else(|| {
                format!(
                    "expected a number of seconds from {least} to 604800, got {}",
                    describe(value)
                )
            })
    })
}

/// A word for an `#SBATCH --flag=word` line: no whitespace (it would end the option).
fn sbatch_word(reader: &mut ConfigReader<'_>, field: &Field<'_>) -> Option<String> {
    reader.parse(field, |value| {
        let text = match value {
            Value::String(text) => text.trim().to_string(),
            Value::Number(n) => n.to_string(),
            other => return Err(format!("expected a string, got {}", describe(other))),
        };
        if text.is_empty() || text.chars().any(char::is_whitespace) {
            return Err(format!(
                "expected one word without spaces, got {}",
                describe(value)
            ));
        }
        Ok(text)
    })
}

/// Slurm's `--time`: `minutes`, `minutes:seconds`, `hours:minutes:seconds`, `days-hours[:minutes[:seconds]]`,
/// or `UNLIMITED`/`INFINITE`/0 (no limit, as sbatch reads 0). Returns the text and the duration
/// it means (`None`: unlimited).
fn slurm_time(value: &Value) -> Result<(String, Option<Duration>), String> {
    let text = match value {
        Value::String(text) => text.trim().to_string(),
        Value::Number(n) if n.as_u64().is_some() => n.to_string(),
        other => {
            return Err(format!(
                "expected Slurm's time format (minutes, \"1:00:00\", \"2-00:00:00\"), got {}",
                describe(other)
            ))
        }
    };
    if matches!(text.to_ascii_uppercase().as_str(), "UNLIMITED" | "INFINITE") {
        return Ok((text, None));
    }
    match slurm_seconds(&text) {
        Some(seconds) if seconds > LONGEST_TIME_DAYS * 86_400 => Err(format!(
            "expected a time limit of at most {LONGEST_TIME_DAYS} days (\"{LONGEST_TIME_DAYS}-00:00:00\"), got {}; for no limit write UNLIMITED",
            describe(value)
        )),
        // sbatch(1): "A time limit of zero requests that no time limit be imposed" (squeue
        // then shows UNLIMITED, or the partition's own limit, which knob reads as time left).
        Some(0) => Ok((text, None)),
        Some(seconds) => Ok((text, Some(Duration::from_secs(seconds as u64)))),
        None => Err(format!(
            "expected Slurm's time format (minutes, \"1:00:00\", \"2-00:00:00\"), got {}",
            describe(value)
        )),
    }
}

/// Checks a `slurm` config and gives its canonical form.
pub fn check_config(
    config: &Value,
    context: &ServiceContext,
) -> Result<CheckedConfig, Vec<ConfigProblem>> {
    let mut reader = ConfigReader::new(context);
    let Some(mut fields) = reader.mapping(config, FieldPath::root()) else {
        return reader.finish(Map::new());
    };
    let mut canonical = Map::new();
    let reuse_mode = fields
        .take("reuseMode")
        .and_then(|field| reader.boolean(&field))
        .or_else(|| context.shortcuts.get("reuseMode").and_then(Value::as_bool))
        .unwrap_or(true);
    canonical.insert("reuseMode".into(), json!(reuse_mode));
    // Unset: as many allocations as trials may run at once (each is sized for one trial).
    let max_environments = fields.take("maxEnvironments").and_then(|field| {
        let number = reader.integer::<u32>(&field, 1)?;
        if !reuse_mode {
            // One job per trial: trialConcurrency is the queue's size. Taken without a word, it
            // let more jobs run at once than the user meant to hold. A warning, not a refusal:
            // an experiment made so before must still resume, and the canonical form drops it.
            reader.warn(
                &field.path,
                "ignored: it applies to reuseMode: true only (allocations held at once); with reuseMode: false each trial is its own job and trialConcurrency bounds them: remove maxEnvironments or set trialConcurrency",
            );
            return None;
        }
        Some(number)
    });
    canonical.insert("maxEnvironments".into(), json!(max_environments));
    for name in PASSED_THROUGH {
        let value = fields
            .take(name)
            .and_then(|field| sbatch_word(&mut reader, &field));
        canonical.insert(name.into(), json!(value));
    }
    let time = fields.take("time").and_then(|field| {
        let (text, duration) = reader.parse(&field, slurm_time)?;
        let longest_trial = context.trial.max_trial_duration_secs.map(Duration::from_secs);
        if let (true, Some(duration), Some(trial)) = (reuse_mode, duration, longest_trial) {
            if duration <= trial {
                reader.error(
                    &field.path,
                    format!(
                        "an allocation of {} s is not longer than maxTrialDuration ({} s), so it could never take a trial; raise time or lower maxTrialDuration",
                        duration.as_secs(),
                        trial.as_secs()
                    ),
                );
            }
        }
        Some(text)
    });
    canonical.insert("time".into(), json!(time));
    let sbatch_args = fields
        .take("sbatchArgs")
        .and_then(|field| {
            let items = lines(&mut reader, &field)?;
            check_sbatch_args(&mut reader, &field, &items);
            Some(items)
        })
        .unwrap_or_default();
    canonical.insert("sbatchArgs".into(), json!(sbatch_args));
    let setup_commands = fields
        .take("setupCommands")
        .and_then(|field| lines(&mut reader, &field))
        .unwrap_or_default();
    canonical.insert("setupCommands".into(), json!(setup_commands));
    let job_name = fields
        .take("jobName")
        .and_then(|field| {
            let name = sbatch_word(&mut reader, &field)?;
            if name.contains('|') {
                reader.error(
                    &field.path,
                    format!("expected a name without '|', got {name:?}"),
                );
                return None;
            }
            Some(name)
        })
        .unwrap_or_else(|| "knob".to_string());
    canonical.insert("jobName".into(), json!(job_name));
    let agent_binary = fields.take("agentBinary").and_then(|field| {
        let path = reader.path(&field)?;
        if path.is_file() {
            Some(path)
        } else {
            reader.error(
                &field.path,
                format!(
                    "{} is not a file; name a knob-agent the compute nodes can run (on the shared filesystem)",
                    quoted(&path)
                ),
            );
            None
        }
    });
    canonical.insert("agentBinary".into(), json!(agent_binary));
    for (name, default, least) in [
        ("orphanTimeoutSecs", DEFAULT_ORPHAN_TIMEOUT, 1.0),
        (
            "pollIntervalSecs",
            DEFAULT_POLL_INTERVAL,
            LEAST_POLL_INTERVAL,
        ),
        ("submitIntervalSecs", DEFAULT_SUBMIT_INTERVAL, 0.0),
    ] {
        let value = fields
            .take(name)
            .and_then(|field| seconds(&mut reader, &field, least))
            .unwrap_or(default.as_secs_f64());
        canonical.insert(name.into(), json!(value));
    }
    // The GPUs one environment declares (see `environment::requested`). Top-level fields: the
    // problem is told at this mapping's root, naming them.
    let gpu_number = u64::from(context.trial.trial_gpu_number.unwrap_or(0));
    let concurrency = u64::from(context.trial.trial_concurrency.max(1));
    if reuse_mode && gpu_number > MOST_ENVIRONMENT_GPUS {
        reader.error(
            &FieldPath::root(),
            format!("trialGpuNumber {gpu_number} is more GPUs than knob takes for one trial ({MOST_ENVIRONMENT_GPUS} at most); lower trialGpuNumber"),
        );
    } else if !reuse_mode && gpu_number * concurrency > MOST_ENVIRONMENT_GPUS {
        reader.error(
            &FieldPath::root(),
            format!(
                "trialGpuNumber {gpu_number} × trialConcurrency {concurrency} is {} GPUs queued at once (reuseMode: false), more than knob takes ({MOST_ENVIRONMENT_GPUS} at most); lower trialConcurrency or trialGpuNumber",
                gpu_number * concurrency
            ),
        );
    }
    crate::limits::read(&mut reader, &mut fields, &mut canonical);
    // The experiment's folder is in every job's log path (`#SBATCH --output`). Not a field of
    // this mapping: the problem is told at its root, naming the top-level field.
    let folder = context
        .working_directory
        .as_ref()
        .or(context.experiment_dir.as_ref());
    if let Some(folder) = folder {
        if let Some(what) = super::script::unusable_in_sbatch_path(folder) {
            reader.error(
                &FieldPath::root(),
                format!(
                    "experimentWorkingDirectory {} holds {what}, which Slurm cannot take in a job's log path (#SBATCH --output); choose a folder without one",
                    quoted(folder)
                ),
            );
        }
    }
    fields.finish(&mut reader, &SLURM_FIELDS);
    reader.finish(canonical)
}

impl SlurmArgs {
    /// The service's settings from its config (checked again here: a canonical config gives
    /// itself back) and the experiment's context.
    pub fn new(config: &Value, context: &ServiceContext) -> Result<SlurmArgs, ArgsError> {
        let checked = check_config(config, context).map_err(|problems| {
            ArgsError(
                problems
                    .iter()
                    .map(|p| match p.path.is_root() {
                        true => p.message.clone(),
                        false => format!("{}: {}", p.path, p.message),
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        let c = &checked.config;
        let text = |name: &str| c.get(name).and_then(Value::as_str).map(str::to_string);
        let list = |name: &str| -> Vec<String> {
            c.get(name)
                .and_then(Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|i| i.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let secs = |name: &str, default: Duration| {
            c.get(name)
                .and_then(Value::as_f64)
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .unwrap_or(default)
        };
        if context.experiment_id.is_empty() {
            return Err(ArgsError(
                "no experiment id in its context (the host gives it)".to_string(),
            ));
        }
        let experiment_dir = match &context.experiment_dir {
            Some(dir) if dir.is_absolute() => dir.clone(),
            other => {
                return Err(ArgsError(format!(
                    "the experiment folder must be an absolute path on the cluster's shared filesystem, got {other:?}"
                )))
            }
        };
        let trial = &context.trial;
        let mut limits = knob_gpu_sched::EnvironmentLimits::default();
        for name in crate::limits::LIMIT_FIELDS {
            if let Some(value) = c.get(name) {
                crate::limits::set(&mut limits, name, value).map_err(ArgsError)?;
            }
        }
        Ok(SlurmArgs {
            experiment_id: context.experiment_id.clone(),
            experiment_dir,
            reuse_mode: c.get("reuseMode").and_then(Value::as_bool).unwrap_or(true),
            max_environments: c
                .get("maxEnvironments")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(trial.trial_concurrency.max(1)),
            max_environments_set: c.get("maxEnvironments").is_some_and(Value::is_u64),
            trial_concurrency: trial.trial_concurrency.max(1),
            max_trial_duration: trial.max_trial_duration_secs.map(Duration::from_secs),
            job: JobOptions {
                partition: text("partition"),
                account: text("account"),
                qos: text("qos"),
                time: text("time"),
                constraint: text("constraint"),
                nodes: text("nodes"),
                exclude: text("exclude"),
                sbatch_args: list("sbatchArgs"),
                setup_commands: list("setupCommands"),
                job_name: text("jobName").unwrap_or_else(|| "knob".to_string()),
                gpu_number: trial.trial_gpu_number.unwrap_or(0),
                cpu_number: trial.trial_cpu_number,
                memory: trial
                    .trial_memory_size_mib
                    .filter(|mib| *mib > 0)
                    .map(|mib| ByteSize(mib * 1024 * 1024)),
            },
            agent_binary: text("agentBinary").map(PathBuf::from),
            orphan_timeout: secs("orphanTimeoutSecs", DEFAULT_ORPHAN_TIMEOUT),
            poll_interval: secs("pollIntervalSecs", DEFAULT_POLL_INTERVAL),
            submit_interval: secs("submitIntervalSecs", DEFAULT_SUBMIT_INTERVAL),
            limits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knob_plugin_api::service::TrialSettings;

    fn context() -> ServiceContext {
        ServiceContext {
            experiment_id: "abc".into(),
            experiment_dir: Some(PathBuf::from("/tmp/x")),
            trial: TrialSettings {
                trial_concurrency: 3,
                trial_cpu_number: Some(2),
                trial_memory_size_mib: Some(2048),
                max_trial_duration_secs: Some(600),
                ..TrialSettings::default()
            },
            ..ServiceContext::default()
        }
    }

    fn problems(config: Value) -> String {
        check_config(&config, &context())
            .unwrap_err()
            .iter()
            .map(|p| format!("{}: {}", p.path, p.message))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn fields_parse_with_nni_spellings_and_the_trial_settings() {
        let config = json!({
            "reuse_mode": false,
            "Partition": "debug",
            "setupCommands": ["module load x", "echo hi"],
            "time": "1:00:00",
        });
        let args = SlurmArgs::new(&config, &context()).unwrap();
        assert!(!args.reuse_mode);
        assert_eq!(args.job.partition.as_deref(), Some("debug"));
        assert_eq!(args.job.memory, Some(ByteSize(2 * 1024 * 1024 * 1024)));
        assert_eq!(args.job.cpu_number, Some(2));
        assert_eq!(args.trial_concurrency, 3);
        assert_eq!(args.job.setup_commands.len(), 2);
        assert_eq!(args.max_trial_duration, Some(Duration::from_secs(600)));
        assert_eq!(args.poll_interval, DEFAULT_POLL_INTERVAL);
        // One allocation per trial that may run at once, unless said otherwise.
        assert_eq!(args.max_environments, 3);
        let args = SlurmArgs::new(&json!({"maxEnvironments": 1}), &context()).unwrap();
        assert_eq!(args.max_environments, 1);
    }

    #[test]
    fn the_canonical_form_checks_to_itself() {
        let checked = check_config(&json!({"partition": "gpu", "time": 120}), &context()).unwrap();
        let again = check_config(&Value::Object(checked.config.clone()), &context()).unwrap();
        assert_eq!(checked.config, again.config);
        assert!(checked.secrets.is_empty());
        assert_eq!(checked.config["reuseMode"], json!(true));
        assert_eq!(checked.config["jobName"], json!("knob"));
        assert_eq!(checked.config["time"], json!("120"));
    }

    #[test]
    fn the_reuse_mode_shortcut_applies_when_unset() {
        let mut context = context();
        context.shortcuts.insert("reuseMode".into(), json!(false));
        let checked = check_config(&json!({}), &context).unwrap();
        assert_eq!(checked.config["reuseMode"], json!(false));
        let checked = check_config(&json!({"reuseMode": true}), &context).unwrap();
        assert_eq!(checked.config["reuseMode"], json!(true));
    }

    #[test]
    fn bad_fields_are_named() {
        let said = problems(json!({
            "partiton": "x",
            "maxEnvironments": 0,
            "jobName": "a b",
            "time": "5 fortnights",
            "sbatchArgs": [1],
            "agentBinary": "/no/such/knob-agent",
        }));
        for expected in [
            "partiton: unknown field \"partiton\" (did you mean \"partition\"?)",
            "maxEnvironments: expected a positive integer, got 0",
            "jobName: expected one word without spaces, got \"a b\"",
            "time: expected Slurm's time format",
            "sbatchArgs: expected a list of strings, got 1 in it",
            "agentBinary: \"/no/such/knob-agent\" is not a file",
        ] {
            assert!(said.contains(expected), "{expected} missing from:\n{said}");
        }
    }

    #[test]
    fn sbatch_args_that_set_what_knob_sets_are_refused_naming_the_item() {
        let said = problems(json!({
            "sbatchArgs": [
                "--job-name=mine",
                "#SBATCH -J mine",
                "--comment 'my note'",
                "-o /tmp/out-%j.txt",
                "--err=/tmp/err.txt",
                "#SBATCH --exclusive --array=1-3",
                "-HJmine",
                "--mail-type=FAIL\n--time=5",
            ],
        }));
        let expected = [
            "sbatchArgs[0]: \"--job-name=mine\" sets --job-name, which knob sets itself: knob finds its jobs in squeue by their names; set jobName instead",
            "sbatchArgs[1]: \"#SBATCH -J mine\" sets --job-name, which knob sets itself: knob finds its jobs in squeue by their names; set jobName instead",
            "sbatchArgs[2]: \"--comment 'my note'\" sets --comment, which knob sets itself: knob finds an experiment's jobs by their comment to cancel those a crashed run left; remove it",
            "sbatchArgs[3]: \"-o /tmp/out-%j.txt\" sets --output, which knob sets itself: knob writes each job's log into the experiment folder and reads it to say why a job ended; remove it",
            "sbatchArgs[4]: \"--err=/tmp/err.txt\" sets --error, which knob sets itself: knob writes each job's log into the experiment folder and reads it to say why a job ended; remove it",
            "sbatchArgs[5]: \"#SBATCH --exclusive --array=1-3\" sets --array, which knob sets itself: knob submits one job per allocation (maxEnvironments) or per trial (reuseMode: false); remove it",
            "sbatchArgs[6]: \"-HJmine\" sets --job-name, which knob sets itself: knob finds its jobs in squeue by their names; set jobName instead",
            "sbatchArgs[7]: \"--mail-type=FAIL\\n--time=5\" holds a line break, which would end its #SBATCH line and run the rest as a command of the job; give each #SBATCH line as its own item",
        ];
        assert_eq!(said, expected.join("\n"));
        // One string is one item a line; the error names the field.
        let said = problems(json!({"sbatchArgs": "--exclusive\n--output=x"}));
        assert!(
            said.starts_with("sbatchArgs: \"--output=x\" sets --output"),
            "{said}"
        );
        // Options knob does not depend on, values that merely look alike, and comments pass.
        check_config(
            &json!({"sbatchArgs": [
                "--exclusive", "--mail-type=FAIL", "-p debug", "--signal=USR1@60",
                "--requeue", "--export=ALL", "--account=a", "-N 1", "--constraint=\"a b\"",
                "--gres=gpu:1 # --job-name=x", "#SBATCH --exclude=node-o",
            ]}),
            &context(),
        )
        .unwrap();
    }

    #[test]
    fn an_experiment_folder_slurm_cannot_take_is_refused_naming_the_field() {
        for (dir, what) in [("/tmp/a\nb", "a line break"), ("/tmp/a\\b", "a backslash")] {
            // While the config is checked: the working directory.
            let mut context = context();
            context.experiment_dir = None;
            context.working_directory = Some(PathBuf::from(dir));
            let e = check_config(&json!({}), &context).unwrap_err();
            assert_eq!(e.len(), 1, "{e:?}");
            assert!(e[0].path.is_root(), "{e:?}");
            assert!(
                e[0].message.starts_with(&format!(
                    "experimentWorkingDirectory {} holds {what}, which Slurm cannot take",
                    quoted(std::path::Path::new(dir))
                )) && !e[0].message.contains('\n'),
                "{e:?}"
            );
            // At the start, from a host that gives only the experiment's folder.
            let mut context = self::context();
            context.experiment_dir = Some(PathBuf::from(dir).join("abc"));
            let e = SlurmArgs::new(&json!({}), &context)
                .unwrap_err()
                .to_string();
            assert!(!e.contains('\n'), "{e}");
            assert!(
                e.starts_with("training service slurm: experimentWorkingDirectory ")
                    && e.contains(&format!("holds {what}, which Slurm cannot take")),
                "{e}"
            );
        }
        // Spaces, quotes, '#' and '%' are written so that Slurm takes them (see script.rs).
        let mut context = context();
        context.experiment_dir = Some(PathBuf::from("/tmp/a b#c%j\"d'e"));
        SlurmArgs::new(&json!({}), &context).unwrap();
    }

    #[test]
    fn max_environments_is_said_to_be_ignored_with_one_job_per_trial() {
        let checked = check_config(
            &json!({"reuseMode": false, "maxEnvironments": 2}),
            &context(),
        )
        .unwrap();
        let said: Vec<String> = checked
            .warnings
            .iter()
            .map(|w| format!("{}: {}", w.path, w.message))
            .collect();
        assert_eq!(
            said,
            ["maxEnvironments: ignored: it applies to reuseMode: true only (allocations held at once); with reuseMode: false each trial is its own job and trialConcurrency bounds them: remove maxEnvironments or set trialConcurrency"]
        );
        // The canonical form drops it, and checks to itself without the warning.
        assert_eq!(checked.config["maxEnvironments"], Value::Null);
        let again = check_config(&Value::Object(checked.config), &context()).unwrap();
        assert!(again.warnings.is_empty(), "{:?}", again.warnings);
    }

    #[test]
    fn an_allocation_shorter_than_a_trial_is_refused_in_reuse_mode() {
        let said = problems(json!({"time": "5"}));
        assert!(
            said.contains(
                "time: an allocation of 300 s is not longer than maxTrialDuration (600 s)"
            ),
            "{said}"
        );
        // One job per trial: Slurm's time limit is the trial's own.
        check_config(&json!({"time": "5", "reuseMode": false}), &context()).unwrap();
    }

    #[test]
    fn a_time_too_long_is_refused_at_the_field_naming_the_longest() {
        // Each overflowed u64 seconds (a panic in a debug build, a wrong time in a release one).
        for time in [
            json!(307445734561825861_u64),
            json!("213503982334602-0"),
            json!("5124095576030432:0:0"),
            json!("366-0"),
        ] {
            let said = problems(json!({"time": time}));
            assert_eq!(
                said,
                format!("time: expected a time limit of at most 365 days (\"365-00:00:00\"), got {}; for no limit write UNLIMITED", describe(&time)),
            );
        }
        check_config(&json!({"time": "365-0"}), &context()).unwrap();
    }

    #[test]
    fn more_gpus_than_an_environment_takes_are_refused_naming_the_fields() {
        let mut context = context();
        // 70000 × 70000 overflowed u32; 50000 × 50000 asked for 400 GB.
        for n in [70_000, 50_000] {
            context.trial.trial_concurrency = n;
            context.trial.trial_gpu_number = Some(n);
            let e = check_config(&json!({"reuseMode": false}), &context).unwrap_err();
            assert_eq!(e.len(), 1, "{e:?}");
            assert!(e[0].path.is_root(), "{e:?}");
            assert_eq!(
                e[0].message,
                format!("trialGpuNumber {n} × trialConcurrency {n} is {} GPUs queued at once (reuseMode: false), more than knob takes (65536 at most); lower trialConcurrency or trialGpuNumber", u64::from(n) * u64::from(n))
            );
        }
        // One allocation per trial: its own GPUs only.
        check_config(&json!({}), &context).unwrap();
        context.trial.trial_gpu_number = Some(70_000);
        {
            let n = 70_000;
            let e = check_config(&json!({}), &context).unwrap_err();
            assert_eq!(
                e[0].message,
                format!("trialGpuNumber {n} is more GPUs than knob takes for one trial (65536 at most); lower trialGpuNumber")
            );
        }
        // Many trials of few GPUs each, one allocation each: as many as the cluster gives.
        context.trial.trial_gpu_number = Some(1);
        let args = SlurmArgs::new(&json!({}), &context).unwrap();
        assert_eq!(args.max_environments, 50_000);
        context.trial.trial_concurrency = 256;
        context.trial.trial_gpu_number = Some(256);
        SlurmArgs::new(&json!({"reuseMode": false}), &context).unwrap();
    }

    #[test]
    fn a_zero_time_is_no_limit_as_in_slurm() {
        // Slurm's "no time limit": accepted as UNLIMITED is, with no maxTrialDuration check
        // (maxTrialDuration is 600 s here, and an allocation of 0 s would be refused).
        for time in [
            json!("0"),
            json!(0),
            json!("0:00"),
            json!("0-0"),
            json!("UNLIMITED"),
        ] {
            let checked = check_config(&json!({"time": time}), &context()).unwrap();
            assert_eq!(
                checked.config["time"],
                json!(time.as_str().map_or("0".to_string(), str::to_string))
            );
        }
    }

    #[test]
    fn the_context_must_name_the_experiment_and_its_folder() {
        let mut context = context();
        context.experiment_dir = Some(PathBuf::from("relative"));
        let e = SlurmArgs::new(&json!({}), &context)
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be an absolute path"), "{e}");
    }
}
