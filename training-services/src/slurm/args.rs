//! The `slurm` service's class args: the experiment's `trainingService` mapping (keys matched
//! ignoring case and underscores, as NNI does) plus what the core adds (`experimentId`,
//! `experimentDir`).

use std::path::PathBuf;
use std::time::Duration;

use knob_gpu_sched::ByteSize;
use serde_json::{Map, Value};

/// How long the agent in an allocation runs on with no knob connected (the manager died)
/// before it kills its trials and exits, which ends the Slurm job.
pub const DEFAULT_ORPHAN_TIMEOUT: Duration = Duration::from_secs(600);
/// How often `squeue` is asked while nothing goes wrong.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The least time between two `sbatch` calls: submitting many jobs at once is what times out
/// slurmctld's RPCs on busy clusters.
pub const DEFAULT_SUBMIT_INTERVAL: Duration = Duration::from_millis(200);

/// Everything the class args say.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmArgs {
    pub experiment_id: String,
    /// On the cluster's shared filesystem: job scripts, agent directories, logs, exit codes.
    pub experiment_dir: PathBuf,
    /// `true`: each environment is one allocation running many trials; `false`: one job per trial.
    pub reuse_mode: bool,
    /// Allocations at once (`reuseMode: true`).
    pub max_environments: u32,
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

/// What is wrong with the class args, one line.
#[derive(Debug, thiserror::Error)]
#[error("trainingService (platform slurm): {0}")]
pub struct ArgsError(pub String);

/// The keys this service reads, as the user writes them.
pub const KNOWN_KEYS: &[&str] = &[
    "platform",
    "reuseMode",
    "maxEnvironments",
    "trialConcurrency",
    "maxTrialDuration",
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
    "trialGpuNumber",
    "trialCpuNumber",
    "trialMemorySize",
    "agentBinary",
    "orphanTimeoutSecs",
    "pollIntervalSecs",
    "submitIntervalSecs",
    "experimentId",
    "experimentDir",
];

fn normalize(key: &str) -> String {
    key.chars()
        .filter(|c| *c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

fn string(key: &str, value: &Value) -> Result<String, ArgsError> {
    match value {
        Value::String(text) if !text.trim().is_empty() => Ok(text.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(ArgsError(format!(
            "{key} must be a non-empty string, got {value}"
        ))),
    }
}

/// A list of strings, or one string (one line).
fn lines(key: &str, value: &Value) -> Result<Vec<String>, ArgsError> {
    match value {
        Value::Null => Ok(Vec::new()),
        Value::String(text) => Ok(text.lines().map(str::to_string).collect()),
        Value::Array(items) => items
            .iter()
            .map(|item| {
                item.as_str().map(str::to_string).ok_or_else(|| {
                    ArgsError(format!("{key} must be a list of strings, got {item} in it"))
                })
            })
            .collect(),
        _ => Err(ArgsError(format!(
            "{key} must be a list of strings, got {value}"
        ))),
    }
}

fn count(key: &str, value: &Value, least: u64) -> Result<u32, ArgsError> {
    value
        .as_u64()
        .filter(|n| *n >= least)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            ArgsError(format!(
                "{key} must be a whole number >= {least}, got {value}"
            ))
        })
}

fn seconds(key: &str, value: &Value) -> Result<Duration, ArgsError> {
    value
        .as_f64()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .filter(|d| *d <= Duration::from_secs(7 * 24 * 3600))
        .ok_or_else(|| {
            ArgsError(format!(
                "{key} must be a number of seconds from 0 to 604800, got {value}"
            ))
        })
}

/// NNI's durations: a number of seconds, or `30s`, `10m`, `2h`, `1d`.
pub fn parse_duration(key: &str, value: &Value) -> Result<Duration, ArgsError> {
    let bad = || {
        ArgsError(format!(
            "{key} must be a duration such as 30s, 10m, 2h or 1d, got {value}"
        ))
    };
    if value.is_number() {
        return seconds(key, value);
    }
    let text = value.as_str().ok_or_else(bad)?.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let unit = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "m" | "min" | "mins" => 60.0,
        "h" | "hour" | "hours" => 3600.0,
        "d" | "day" | "days" => 86400.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(number * unit).map_err(|_| bad())
}

impl SlurmArgs {
    pub fn parse(class_args: &Value) -> Result<SlurmArgs, ArgsError> {
        let empty = Map::new();
        let fields = match class_args {
            Value::Object(fields) => fields,
            Value::Null => &empty,
            other => {
                return Err(ArgsError(format!(
                    "expected a mapping of fields, got {other}"
                )))
            }
        };
        let mut args = SlurmArgs {
            experiment_id: String::new(),
            experiment_dir: PathBuf::new(),
            reuse_mode: true,
            max_environments: 1,
            trial_concurrency: 1,
            max_trial_duration: None,
            job: JobOptions {
                job_name: "knob".to_string(),
                ..JobOptions::default()
            },
            agent_binary: None,
            orphan_timeout: DEFAULT_ORPHAN_TIMEOUT,
            poll_interval: DEFAULT_POLL_INTERVAL,
            submit_interval: DEFAULT_SUBMIT_INTERVAL,
        };
        for (key, value) in fields {
            let Some(known) = KNOWN_KEYS.iter().find(|k| normalize(k) == normalize(key)) else {
                return Err(ArgsError(format!(
                    "unknown field {key}; the fields of platform slurm are {}",
                    KNOWN_KEYS[..KNOWN_KEYS.len() - 2].join(", ")
                )));
            };
            let key = *known;
            if value.is_null() {
                continue;
            }
            let job = &mut args.job;
            match key {
                "platform" => {
                    if value.as_str() != Some("slurm") {
                        return Err(ArgsError(format!(
                            "platform must be slurm here, got {value}"
                        )));
                    }
                }
                "reuseMode" => {
                    args.reuse_mode = value.as_bool().ok_or_else(|| {
                        ArgsError(format!("reuseMode must be true or false, got {value}"))
                    })?
                }
                "maxEnvironments" => args.max_environments = count(key, value, 1)?,
                "trialConcurrency" => args.trial_concurrency = count(key, value, 1)?,
                "maxTrialDuration" => args.max_trial_duration = Some(parse_duration(key, value)?),
                "partition" => job.partition = Some(string(key, value)?),
                "account" => job.account = Some(string(key, value)?),
                "qos" => job.qos = Some(string(key, value)?),
                "time" => job.time = Some(string(key, value)?),
                "constraint" => job.constraint = Some(string(key, value)?),
                "nodes" => job.nodes = Some(string(key, value)?),
                "exclude" => job.exclude = Some(string(key, value)?),
                "sbatchArgs" => job.sbatch_args = lines(key, value)?,
                "setupCommands" => job.setup_commands = lines(key, value)?,
                "jobName" => {
                    let name = string(key, value)?;
                    if name.chars().any(|c| c.is_whitespace() || c == '|') {
                        return Err(ArgsError(format!(
                            "jobName must have no spaces or '|', got {name:?}"
                        )));
                    }
                    job.job_name = name;
                }
                "trialGpuNumber" => job.gpu_number = count(key, value, 0)?,
                "trialCpuNumber" => job.cpu_number = Some(count(key, value, 1)?),
                "trialMemorySize" => {
                    let size = match value {
                        // NNI: a bare number is megabytes.
                        Value::Number(_) => value.as_u64().map(|mb| ByteSize(mb * 1024 * 1024)),
                        Value::String(text) => text.parse::<ByteSize>().ok(),
                        _ => None,
                    };
                    job.memory = Some(size.filter(|s| s.0 > 0).ok_or_else(|| {
                        ArgsError(format!(
                            "trialMemorySize must be a size such as 4g or 512m, got {value}"
                        ))
                    })?);
                }
                "agentBinary" => args.agent_binary = Some(PathBuf::from(string(key, value)?)),
                "orphanTimeoutSecs" => args.orphan_timeout = seconds(key, value)?,
                "pollIntervalSecs" => {
                    args.poll_interval = seconds(key, value)?.max(Duration::from_millis(100))
                }
                "submitIntervalSecs" => args.submit_interval = seconds(key, value)?,
                "experimentId" => args.experiment_id = string(key, value)?,
                "experimentDir" => args.experiment_dir = PathBuf::from(string(key, value)?),
                _ => unreachable!("every known key is matched"),
            }
        }
        if args.experiment_id.is_empty() {
            return Err(ArgsError(
                "experimentId is missing (the core sets it)".to_string(),
            ));
        }
        if !args.experiment_dir.is_absolute() {
            return Err(ArgsError(format!(
                "experimentDir must be an absolute path on the cluster's shared filesystem (the core sets it), got {:?}",
                args.experiment_dir
            )));
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"experimentId": "abc", "experimentDir": "/tmp/x"})
    }

    #[test]
    fn fields_parse_with_nni_spellings() {
        let mut v = base();
        let o = v.as_object_mut().unwrap();
        o.insert("reuse_mode".into(), json!(false));
        o.insert("Partition".into(), json!("debug"));
        o.insert("trialMemorySize".into(), json!("2g"));
        o.insert("trial_cpu_number".into(), json!(2));
        o.insert("setupCommands".into(), json!(["module load x", "echo hi"]));
        o.insert("maxTrialDuration".into(), json!("10m"));
        let args = SlurmArgs::parse(&v).unwrap();
        assert!(!args.reuse_mode);
        assert_eq!(args.job.partition.as_deref(), Some("debug"));
        assert_eq!(args.job.memory, Some(ByteSize(2 * 1024 * 1024 * 1024)));
        assert_eq!(args.job.cpu_number, Some(2));
        assert_eq!(args.job.setup_commands.len(), 2);
        assert_eq!(args.max_trial_duration, Some(Duration::from_secs(600)));
    }

    #[test]
    fn bad_fields_are_named() {
        let check = |key: &str, value: Value, expect: &str| {
            let mut v = base();
            v.as_object_mut().unwrap().insert(key.into(), value);
            let e = SlurmArgs::parse(&v).unwrap_err().to_string();
            assert!(e.contains(expect), "{e}");
        };
        check(
            "partiton",
            json!("x"),
            "unknown field partiton; the fields of platform slurm are platform, reuseMode",
        );
        check(
            "trialMemorySize",
            json!("lots"),
            "trialMemorySize must be a size",
        );
        check(
            "maxEnvironments",
            json!(0),
            "maxEnvironments must be a whole number >= 1",
        );
        check("jobName", json!("a b"), "jobName must have no spaces");
        check(
            "maxTrialDuration",
            json!("5 fortnights"),
            "maxTrialDuration must be a duration",
        );
        let e = SlurmArgs::parse(&json!({"experimentId": "a"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("experimentDir must be an absolute path"), "{e}");
    }
}
