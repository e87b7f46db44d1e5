//! The canonical experiment config: what every other part of knob reads.
//!
//! These types hold a config *after* loading: names canonical, paths absolute, durations in
//! seconds, sizes in MiB, every default filled in, shortcuts copied where they apply. Their serde
//! form (camelCase) is the canonical form: it is what `knob config check` prints and what the
//! store keeps, and it deserializes back to an equal value (secrets aside, see [`Secret`]).
//! Parsing a user's file — case-insensitive keys, `30m`, `"0,1"` — is `super::load`'s job, not
//! serde's.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use knob_plugin_api::service::{FieldPath, SecretField};

use super::notifications::NotificationsConfig;
use super::secret::{Secret, REDACTED};
use crate::store::Direction;

/// One experiment, as described by an NNI v2 config (plus knob's extensions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExperimentConfig {
    pub experiment_name: Option<String>,
    /// Run as `bash -c` in [`Self::trial_code_directory`].
    pub trial_command: String,
    /// Absolute; defaults to the config file's folder.
    pub trial_code_directory: PathBuf,
    /// At least 1.
    pub trial_concurrency: u32,
    /// `None` (NNI: trials are scheduled as if GPU-less but may see every GPU) differs from
    /// `Some(0)` (trials see no GPU: `CUDA_VISIBLE_DEVICES` is empty).
    pub trial_gpu_number: Option<u32>,
    /// knob extension: GPU memory each trial needs on each of its GPUs, in MiB. Written like
    /// `10GiB`, `500MB` or a plain number of MiB.
    #[serde(rename = "trialGpuMemory")]
    pub trial_gpu_memory_mib: Option<u64>,
    /// knob extension (the name NNI gave this field on a cluster platform): host memory each
    /// trial needs, in MiB.
    #[serde(rename = "trialMemorySize")]
    pub trial_memory_size_mib: Option<u64>,
    /// knob extension: CPU cores each trial needs, so CPU-heavy trials do not oversubscribe a host.
    pub trial_cpu_number: Option<u32>,
    /// Whole seconds; `None` is unlimited.
    #[serde(with = "optional_seconds")]
    pub max_experiment_duration: Option<Duration>,
    /// `None` is unlimited.
    pub max_trial_number: Option<u64>,
    /// Whole seconds; `None` is unlimited.
    #[serde(with = "optional_seconds")]
    pub max_trial_duration: Option<Duration>,
    /// knob extension: how many times a failed trial is run again (default 0).
    pub max_trial_retries: u32,
    /// knob extension: how many more times a trial that failed looking out of memory (killed by
    /// SIGKILL / exit 137, or an out-of-memory error in its stderr) is run again, on top of
    /// `maxTrialRetries` (default 0). Memory pressure often passes; a bug does not.
    #[serde(default)]
    pub max_oom_retries: u32,
    /// knob extension: whether trials get knob's `nni` shim (`python/shim/nni.py`): `None` (the
    /// default) gives it only to a Python without nni, `Some(true)` always, `Some(false)` never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nni_shim: Option<bool>,
    pub debug: bool,
    /// Defaults to `debug` when [`Self::debug`] is set, `info` otherwise.
    pub log_level: LogLevel,
    /// Absolute; defaults to `~/knob-experiments`. Each experiment gets `<this>/<id>/`.
    pub experiment_working_directory: PathBuf,
    /// `CUDA_VISIBLE_DEVICES` of the tuner and assessor.
    pub tuner_gpu_indices: Option<Vec<u32>>,
    /// NNI's deprecated `advisor` is read into this field.
    pub tuner: AlgorithmConfig,
    pub assessor: Option<AlgorithmConfig>,
    /// Always a list: one entry is NNI's single `trainingService`, several are its hybrid mode.
    /// Each platform appears at most once.
    pub training_service: Vec<TrainingServiceConfig>,
    /// knob extension: how trials are placed on GPUs.
    pub placement_policy: PlacementPolicy,
    /// knob extension: what a parameter set the tuner hands out that is not in the search
    /// space does (see [`TunerErrorPolicy`]).
    #[serde(default)]
    pub tuner_error_policy: TunerErrorPolicy,
    /// knob extension: who is told when the experiment ends (and, if asked, of a new best or
    /// failures in a row), and how (see `notifications`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<NotificationsConfig>,
    /// knob extension: extra plugin files or folders to load, absolute (written relative to the
    /// config file).
    pub plugin_paths: Vec<PathBuf>,
    /// knob extension: the metrics of a multi-objective experiment, each a key of the dict a
    /// trial reports as its final result (see [`ObjectiveConfig`] and `crate::objectives`).
    /// Empty: NNI's single `default` metric, as without the field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objectives: Vec<ObjectiveConfig>,
    /// The search space JSON, inline even when the config named a `searchSpaceFile`: a resumed
    /// experiment keeps the space it started with even if the file changed since.
    pub search_space: serde_json::Value,
}

/// A tuner or assessor: a built-in or registered one by `name`, or NNI's custom
/// `className` + `codeDirectory`. Exactly one of `name` and `class_name` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AlgorithmConfig {
    /// Matched against loaded plugins elsewhere, case-insensitively as in NNI.
    pub name: Option<String>,
    /// Qualified class name of an NNI custom algorithm, e.g. `my_tuner.MyTuner`.
    pub class_name: Option<String>,
    /// Absolute; set exactly when `class_name` is (defaults to the config file's folder).
    pub code_directory: Option<PathBuf>,
    /// Passed to the algorithm's constructor, as JSON.
    pub class_args: serde_json::Map<String, serde_json::Value>,
    /// knob extension: the Python that runs NNI's dispatcher for this algorithm (a path, or a
    /// command looked up on PATH); NNI's algorithms otherwise use the first `python3` on PATH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_interpreter: Option<PathBuf>,
    /// knob extension: run NNI's own Python version of a name knob also has natively (`TPE`,
    /// `Hyperband`, ...), through NNI's dispatcher.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub use_nni_implementation: bool,
    /// knob extension: how long NNI's dispatcher may take to connect after its start, in
    /// seconds (default 120).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatcher_connect_timeout: Option<u64>,
}

impl ExperimentConfig {
    /// Which way "best" goes: the first objective's `mode` when `objectives` lists any, else the
    /// tuner's `classArgs.optimize_mode`, read as [`Direction::from_optimize_mode`] reads it for
    /// this tuner (absent: the tuner's default; the reader refused any value it refuses).
    pub fn direction(&self) -> Direction {
        if let Some(first) = self.objectives.iter().find(|o| o.constraint.is_none()) {
            return first.direction();
        }
        let tuner = self.tuner.name.as_deref();
        Direction::from_optimize_mode(tuner, self.tuner.class_args.get(OPTIMIZE_MODE))
            .unwrap_or_else(|_| Direction::default_for(tuner))
    }
}

/// knob extension: one entry of `objectives`. Without `constraint` it is an objective
/// (`mode` required); with one it is a constraint a feasible trial satisfies (no `mode`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectiveConfig {
    /// A key of the trial's final result dict.
    pub metric: String,
    /// `maximize` or `minimize`; `None` exactly for a constraint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<Constraint>,
    /// The reference value of this objective for the dashboard's hypervolume (default: the
    /// worst value seen, pushed out by a tenth of the range).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<f64>,
}

impl ObjectiveConfig {
    pub fn new(
        metric: &str,
        mode: Option<Direction>,
        constraint: Option<Constraint>,
    ) -> ObjectiveConfig {
        ObjectiveConfig {
            metric: metric.into(),
            mode: mode.map(|m| m.as_str().into()),
            constraint,
            reference: None,
        }
    }

    /// The objective's direction (a constraint's is meaningless and reads as minimize).
    pub fn direction(&self) -> Direction {
        match self.mode.as_deref() {
            Some("maximize") => Direction::Maximize,
            _ => Direction::Minimize,
        }
    }
}

/// A constraint on a metric: `"<= 0"` or `">= 0.5"` (Optuna's convention is `<= 0`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Constraint {
    pub op: ConstraintOp,
    pub bound: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstraintOp {
    /// `<=`: feasible while the metric is at most the bound.
    AtMost,
    /// `>=`: feasible while the metric is at least the bound.
    AtLeast,
}

impl std::str::FromStr for Constraint {
    type Err = String;

    fn from_str(text: &str) -> Result<Constraint, String> {
        let text = text.trim();
        let (op, rest) = if let Some(rest) = text.strip_prefix("<=") {
            (ConstraintOp::AtMost, rest)
        } else if let Some(rest) = text.strip_prefix(">=") {
            (ConstraintOp::AtLeast, rest)
        } else {
            return Err(format!(
                "constraint {text:?} must be \"<= NUMBER\" or \">= NUMBER\", e.g. \"<= 0\""
            ));
        };
        match rest.trim().parse::<f64>() {
            Ok(bound) if bound.is_finite() => Ok(Constraint { op, bound }),
            _ => Err(format!(
                "constraint {text:?}: {:?} is not a finite number; write e.g. \"<= 0\"",
                rest.trim()
            )),
        }
    }
}

impl TryFrom<String> for Constraint {
    type Error = String;
    fn try_from(text: String) -> Result<Constraint, String> {
        text.parse()
    }
}

impl From<Constraint> for String {
    fn from(c: Constraint) -> String {
        let op = match c.op {
            ConstraintOp::AtMost => "<=",
            ConstraintOp::AtLeast => ">=",
        };
        format!("{op} {}", c.bound)
    }
}

/// The tuner's classArgs key knob itself reads: which way "best" goes.
pub const OPTIMIZE_MODE: &str = "optimize_mode";

impl AlgorithmConfig {
    /// The name to show a user: `name`, or `className` for a custom algorithm.
    pub fn display_name(&self) -> &str {
        self.name
            .as_deref()
            .or(self.class_name.as_deref())
            .unwrap_or("")
    }
}

/// Where trials run: one `trainingService` entry, for the training-service plugin named by its
/// `platform`. The core does not know what a platform's fields mean: the plugin checked them
/// and made them canonical (see `knob_plugin_api::TrainingService::check_config`).
///
/// Serialized as NNI writes it, `{platform: ..., <the service's fields>}`, with every secret
/// field the plugin declared shown as `***`: that is the form `knob config check` prints and the
/// store keeps. The secrets' clear text lives only in memory ([`Self::config_with_secrets`]); a
/// config read back from the store has them as `***` until they are filled in again
/// ([`Self::fill_secret`]).
#[derive(Debug, Clone)]
pub struct TrainingServiceConfig {
    /// The name of the training-service plugin, as the plugin spells it.
    pub platform: String,
    /// The service's canonical config, without `platform` and the trial settings the core reads;
    /// secrets as `***`.
    pub config: serde_json::Map<String, serde_json::Value>,
    /// The fields of `config` the plugin declared secret.
    pub secrets: Vec<SecretField>,
    /// The clear text of the secrets that are known, by path.
    revealed: Vec<(FieldPath, Secret)>,
    /// This service's environments with their inventories, when its plugin knew them while it
    /// checked the config (this machine, probed); not stored.
    pub environments: Option<Vec<knob_plugin_api::service::Environment>>,
}

impl PartialEq for TrainingServiceConfig {
    /// The config as stored and what the plugin declared; probed inventories change by the
    /// second and are not part of a config.
    fn eq(&self, other: &Self) -> bool {
        self.platform == other.platform
            && self.config == other.config
            && self.secrets == other.secrets
            && self.revealed == other.revealed
    }
}

impl TrainingServiceConfig {
    /// A service entry as written or as stored: no secrets declared yet.
    pub fn new(
        platform: impl Into<String>,
        config: serde_json::Map<String, serde_json::Value>,
    ) -> TrainingServiceConfig {
        TrainingServiceConfig {
            platform: platform.into(),
            config,
            secrets: Vec::new(),
            revealed: Vec::new(),
            environments: None,
        }
    }

    /// The `platform` value: the training-service plugin's name.
    pub fn platform(&self) -> &str {
        &self.platform
    }

    /// Takes the plugin's canonical config and secret fields: each secret's value moves into
    /// memory, and `***` takes its place in [`Self::config`]. A secret already `***` (a config
    /// read back from the store) stays unknown.
    pub(crate) fn set_checked(
        &mut self,
        mut config: serde_json::Map<String, serde_json::Value>,
        secrets: Vec<SecretField>,
    ) {
        let mut revealed = Vec::new();
        let mut root = serde_json::Value::Object(std::mem::take(&mut config));
        for secret in &secrets {
            if let Some(value) = secret.path.find_mut(&mut root) {
                if let Some(text) = value.as_str().filter(|text| *text != REDACTED) {
                    revealed.push((secret.path.clone(), Secret::new(text)));
                }
                if value.is_string() {
                    *value = serde_json::Value::from(REDACTED);
                }
            }
        }
        if let serde_json::Value::Object(map) = root {
            config = map;
        }
        self.config = config;
        self.secrets = secrets;
        self.revealed = revealed;
    }

    /// The service's config with the known secrets in clear: what its plugin is built with, and
    /// nothing else. Whoever keeps this value owns keeping it out of plain sight.
    pub fn config_with_secrets(&self) -> serde_json::Value {
        let mut root = serde_json::Value::Object(self.config.clone());
        for (path, secret) in &self.revealed {
            if let Some(value) = path.find_mut(&mut root) {
                *value = serde_json::Value::from(secret.expose());
            }
        }
        root
    }

    /// The secret fields that hold a value knob does not know (`***` in a stored config).
    pub fn missing_secrets(&self) -> Vec<&SecretField> {
        let root = serde_json::Value::Object(self.config.clone());
        self.secrets
            .iter()
            .filter(|secret| {
                secret.path.find(&root).and_then(serde_json::Value::as_str) == Some(REDACTED)
                    && !self.revealed.iter().any(|(path, _)| *path == secret.path)
            })
            .collect()
    }

    /// The known clear text of a secret field.
    pub fn secret(&self, path: &FieldPath) -> Option<&Secret> {
        self.revealed
            .iter()
            .find(|(known, _)| known == path)
            .map(|(_, secret)| secret)
    }

    /// Gives back the clear text of a secret field knob did not store.
    pub fn fill_secret(&mut self, path: &FieldPath, secret: Secret) {
        self.revealed.retain(|(known, _)| known != path);
        self.revealed.push((path.clone(), secret));
    }
}

impl Serialize for TrainingServiceConfig {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.config.len() + 1))?;
        map.serialize_entry("platform", &self.platform)?;
        for (key, value) in &self.config {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for TrainingServiceConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut config = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
        let platform = match config.remove("platform") {
            Some(serde_json::Value::String(platform)) => platform,
            _ => {
                return Err(serde::de::Error::custom(
                    "a training service without platform",
                ))
            }
        };
        Ok(TrainingServiceConfig::new(platform, config))
    }
}

/// NNI's log levels, lowercase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Fatal,
    Error,
    Warning,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub const ALL: [(&'static str, LogLevel); 6] = [
        ("fatal", LogLevel::Fatal),
        ("error", LogLevel::Error),
        ("warning", LogLevel::Warning),
        ("info", LogLevel::Info),
        ("debug", LogLevel::Debug),
        ("trace", LogLevel::Trace),
    ];
}

/// knob extension (`placementPolicy`): which free GPUs a waiting trial gets; gpu-sched's own
/// type, so that the config and the scheduler cannot disagree on the set of policies.
pub use knob_gpu_sched::Policy as PlacementPolicy;

/// What the manager does with a parameter set a tuner hands out that the search space refuses
/// (a value out of range, a key missing or extra, not an object): checked before any trial sees
/// it. A tuner *call* that fails or panics ends the experiment whatever the policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TunerErrorPolicy {
    /// The experiment ends in ERROR with the one-line refusal (the default: a tuner that hands
    /// out bad parameters is broken, and its other suggestions cannot be trusted either).
    #[default]
    Error,
    /// The parameter set is dropped (the tuner is told it ended `SYS_CANCELED`), a warning is
    /// logged, and the drops are counted; the experiment goes on. Many drops in a row still end
    /// it ([`TunerErrorPolicy::MAX_DROPS_IN_A_ROW`]).
    Skip,
    /// The parameter set is run as it is, as NNI does (its manager never checks what a tuner
    /// hands out): a user's own NNI tuner that makes up its parameters (`searchSpace: {}`) or
    /// adds derived keys runs unchanged. The first such set is named in a warning.
    Allow,
}

impl TunerErrorPolicy {
    pub const NAMES: [(&'static str, TunerErrorPolicy); 3] = [
        ("error", TunerErrorPolicy::Error),
        ("skip", TunerErrorPolicy::Skip),
        ("allow", TunerErrorPolicy::Allow),
    ];
    /// Under `skip`, this many refused parameter sets in a row end the experiment: a tuner that
    /// only hands out bad ones would otherwise be asked forever.
    pub const MAX_DROPS_IN_A_ROW: u64 = 100;
}

/// The names `placementPolicy` accepts (the aliases gpu-sched also parses are not offered).
pub const PLACEMENT_POLICY_NAMES: [(&str, PlacementPolicy); 4] = [
    ("recently-idle", PlacementPolicy::RecentlyIdle),
    ("pack", PlacementPolicy::Pack),
    ("spread", PlacementPolicy::Spread),
    ("round-robin", PlacementPolicy::RoundRobin),
];

/// `Option<Duration>` as whole seconds (or null), the canonical form of NNI durations.
mod optional_seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => serializer.serialize_u64(duration.as_secs()),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(deserializer)?.map(Duration::from_secs))
    }
}
