//! The `local` training service: this machine is one environment, and trials run on it as
//! process groups (see `runner`).
//!
//! Its config (`trainingService: {platform: local, ...}`, checked by [`check_config`]): NNI's
//! `useActiveGpu`, `maxTrialNumberPerGpu`, `gpuIndices` (which limit what the service reports of
//! this machine's GPUs, probed with NVML or `KNOB_SIMULATE_GPUS`) and `reuseMode` (which changes
//! nothing here: every trial runs in the one environment). Local is the platform NNI's top-level
//! shortcut fields are meant for; they apply where the config does not set a field. The limits
//! of a shared machine (`maxCpuUtilization`, `maxMemoryUtilization`, `memoryReserve`,
//! `maxGpuMemoryUtilization`, `gpuMemoryReserve`, see [`crate::limits`]) apply to this machine.
//!
//! Class args (the checked config; keys are matched ignoring case and underscores, as NNI does;
//! unknown keys are ignored) may also hold, for tests and tools:
//!
//! - `gracePeriodSecs` (number, default 5, at most 3600): how long a killed trial's process
//!   group has between SIGTERM and SIGKILL.
//! - `ledgerDir` (path): the folder of the machine's lease ledger, instead of `$KNOB_HOME`
//!   (see [`crate::lease`]).

use std::sync::Arc;
use std::time::Duration;

use knob_gpu_sched::probe::{process_group_of, LocalProbe, SimulatedInventory, SIMULATE_GPUS_VAR};
use knob_gpu_sched::{EnvironmentLimits, SchedulerConfig};
use knob_plugin_api::config::ConfigReader;
use knob_plugin_api::service::{
    CheckedConfig, ConfigProblem, Environment, FieldPath, ServiceContext, ServiceEvent,
    TrialRequest,
};
use knob_plugin_api::{EventSink, PluginError, TrainingService};
use serde_json::{json, Map, Value};

use crate::lease::{self, MachineLeases};
use crate::metrics::Emit;
use crate::runner::TrialError;
use crate::trial_pool::{PoolError, Started, TrialPool};

/// The id of the one environment.
pub const ENVIRONMENT_ID: &str = "local";
/// `NNI_PLATFORM` of local trials (it makes `nni` 2.x use the file channel).
pub const PLATFORM: &str = crate::trial_pool::PLATFORM;

const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(5);
const MAX_GRACE_PERIOD_SECS: f64 = 3600.0;

/// What can go wrong in the local service, one line each.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("classArgs of training service local: {0}")]
    ClassArgs(String),
    #[error("training service local cannot start: {what}: {source}")]
    Startup {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("training service local has no environment {0:?}; its only environment is \"local\"")]
    UnknownEnvironment(String),
    #[error("training service local cannot probe this machine: {0}")]
    Probe(String),
    #[error("trial {0} is already running on training service local; trial ids must be unique")]
    DuplicateTrial(String),
    #[error("training service local is shut down; no trial can start")]
    ShutDown,
    #[error(transparent)]
    Trial(#[from] TrialError),
}

impl From<LocalError> for PluginError {
    fn from(e: LocalError) -> PluginError {
        PluginError::new(e.to_string())
    }
}

/// The local service's settings, from its class args.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalArgs {
    pub grace_period: Duration,
    /// The lease ledger's folder, when not the default.
    pub ledger_dir: Option<std::path::PathBuf>,
    /// What trials may use of this machine's GPUs.
    pub limits: EnvironmentLimits,
}

impl Default for LocalArgs {
    fn default() -> Self {
        LocalArgs {
            grace_period: DEFAULT_GRACE_PERIOD,
            ledger_dir: None,
            limits: EnvironmentLimits::default(),
        }
    }
}

impl LocalArgs {
    pub fn parse(class_args: &Value) -> Result<LocalArgs, LocalError> {
        let mut args = LocalArgs::default();
        let fields = match class_args {
            Value::Null => return Ok(args),
            Value::Object(fields) => fields,
            other => {
                return Err(LocalError::ClassArgs(format!(
                    "expected an object, got {other}"
                )))
            }
        };
        for (key, value) in fields {
            let normalized: String = key
                .chars()
                .filter(|c| *c != '_')
                .map(|c| c.to_ascii_lowercase())
                .collect();
            let bad =
                |what: &str| LocalError::ClassArgs(format!("{key} must be {what}, got {value}"));
            match normalized.as_str() {
                "useactivegpu" => {
                    args.limits.use_active_gpu =
                        value.as_bool().ok_or_else(|| bad("true or false"))?
                }
                "maxtrialnumberpergpu" => {
                    args.limits.max_trial_number_per_gpu = value
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| bad("an integer of at least 1"))?
                }
                "ledgerdir" => {
                    args.ledger_dir = Some(
                        value
                            .as_str()
                            .filter(|path| !path.is_empty())
                            .ok_or_else(|| bad("a folder's path"))?
                            .into(),
                    )
                }
                "gpuindices" if !value.is_null() => {
                    args.limits.gpu_indices = Some(
                        knob_plugin_api::config::gpu_indices(value)
                            .map_err(|e| LocalError::ClassArgs(format!("{key}: {e}")))?,
                    )
                }
                _ => {
                    crate::limits::set(&mut args.limits, key, value)
                        .map_err(LocalError::ClassArgs)?;
                }
            }
            if normalized == "graceperiodsecs" {
                args.grace_period = value
                    .as_f64()
                    .filter(|secs| (0.0..=MAX_GRACE_PERIOD_SECS).contains(secs))
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| {
                        LocalError::ClassArgs(format!(
                            "{key} must be a number of seconds from 0 to {MAX_GRACE_PERIOD_SECS}, got {value}"
                        ))
                    })?;
            }
        }
        Ok(args)
    }
}

/// Runs trials on this machine through a [`TrialPool`]. All work happens on the pool's tokio
/// runtime; the trait methods only hand work to it, and return at once (except `shutdown`,
/// which waits for the trials).
pub struct LocalService {
    pool: TrialPool,
    hostname: String,
    emit: Emit,
    limits: EnvironmentLimits,
    /// This machine's probe, made at the first `environments` call (NVML starts in
    /// milliseconds to seconds; a service that never reports environments never pays it).
    probe: Option<LocalProbe>,
    /// The experiment (from the context it was created with, else its first trial), under which
    /// the service stands in the ledger's line.
    experiment: Option<String>,
    /// What each of the experiment's trials asks for (from the context it was created with,
    /// else its first trial): which GPUs held elsewhere its waiting trials stand in line for.
    demand: Option<SchedulerConfig>,
    /// Whether `environments` was called before (see [`LocalService::environment`]).
    asked_before: bool,
    /// Whether the console was told that a trial's parameters are too large for
    /// `KNOB_PARAMETERS` (`knob_protocol::parameters_only_in_file`), said once.
    parameters_size_told: bool,
    /// Trials handed back to the host (`ServiceEvent::PlaceAgain`) since the host last said
    /// that none waits: see [`LocalService::nothing_waits`].
    handed_back: std::collections::HashSet<String>,
    /// The warning last given about a lease ledger that cannot be read, so that each re-probe
    /// does not repeat it; `None` once it is read again.
    ledger_warning: Option<String>,
}

impl LocalService {
    /// Builds the service with events going to `emit` (what `TrainingService::new` does with
    /// the host's event sink; tests pass their own).
    pub fn with_emitter(class_args: &Value, emit: Emit) -> Result<LocalService, LocalError> {
        let args = LocalArgs::parse(class_args)?;
        let mut pool = TrialPool::new("training service local", args.grace_period, emit.clone())
            .map_err(|e| match e {
                PoolError::Startup { what, source } => LocalError::Startup { what, source },
                other => LocalError::Startup {
                    what: "cannot start",
                    source: std::io::Error::other(other.to_string()),
                },
            })?;
        let leases = match &args.ledger_dir {
            Some(dir) => MachineLeases::open(dir).map(Some),
            None => MachineLeases::open_default(),
        };
        let leases = leases.map_err(|e| LocalError::Startup {
            what: "cannot open this machine's lease ledger",
            source: std::io::Error::other(e.to_string()),
        })?;
        if let Some(leases) = leases {
            pool.use_leases(leases);
        }
        Ok(LocalService {
            pool,
            hostname: hostname(),
            emit,
            limits: args.limits,
            probe: None,
            experiment: None,
            demand: None,
            asked_before: false,
            parameters_size_told: false,
            handed_back: Default::default(),
            ledger_warning: None,
        })
    }

    /// Whether a trial whose lease must wait is handed back to the host to be placed again
    /// (what `create` sets from `ServiceContext::places_again`).
    pub fn set_places_again(&mut self, on: bool) {
        self.pool.set_places_again(on);
    }

    /// Where the NNI v3 channel listens (127.0.0.1 and an ephemeral port).
    pub fn channel_address(&self) -> std::net::SocketAddr {
        self.pool.channel_address()
    }

    /// This machine as the one environment, with what it has now (GPUs, their memory and the
    /// processes on them, CPU and memory; this experiment's own trials are not foreign to it),
    /// limited by the config.
    pub fn environment(&mut self) -> Result<Environment, LocalError> {
        if self.probe.is_none() {
            self.probe = Some(
                LocalProbe::new(ENVIRONMENT_ID).map_err(|e| LocalError::Probe(e.to_string()))?,
            );
        }
        let probe = self.probe.as_mut().expect("set just above");
        let groups: Vec<u32> = self
            .pool
            .running()
            .into_iter()
            .filter_map(|(_, pid)| pid)
            .collect();
        let is_trial =
            |pid: u32| process_group_of(pid).is_some_and(|group| groups.contains(&group));
        let mut inventory = probe_inventory(probe, &is_trial, &self.limits)?;
        if let Some(leases) = self.pool.leases() {
            // The core asks once at its start, then only while trials wait to be placed (for
            // resources, or for a fresh probe under a limit judged on the host's use): from the
            // second call on, this experiment has trials waiting, and stands in line for the
            // GPUs others hold.
            let waiting = std::mem::replace(&mut self.asked_before, true);
            let waiting = self
                .experiment
                .as_deref()
                .zip(self.demand.as_ref())
                .filter(|_| waiting);
            // A ledger that cannot be used holds nothing back, as a trial whose lease cannot be
            // taken starts anyway (`TrialPool`): the machine is reported as probed, without
            // other experiments' trials, and the console told once. Failing the probe instead
            // kept every experiment on the machine from starting.
            match leases.annotate(&mut inventory, waiting) {
                Ok(()) => self.ledger_warning = None,
                Err(e) => {
                    let message = format!(
                        "cannot read this machine's lease ledger, trials are placed as if no other experiment ran here: {e}"
                    );
                    if self.ledger_warning.as_ref() != Some(&message) {
                        (self.emit)(ServiceEvent::Warning {
                            trial_id: None,
                            message: message.clone(),
                        });
                        self.ledger_warning = Some(message);
                    }
                }
            }
        }
        let inventory =
            serde_json::to_value(&inventory).map_err(|e| LocalError::Probe(e.to_string()))?;
        Ok(Environment {
            id: ENVIRONMENT_ID.to_string(),
            host: self.hostname.clone(),
            ready: !self.pool.is_shut_down(),
            inventory,
        })
    }

    /// Starts a trial. On `Err` nothing was started and no event follows for it. One whose
    /// lease must wait is given back to the host (`ServiceEvent::PlaceAgain`) when the host
    /// takes that ([`TrialPool::set_places_again`]), else kept until its lease is granted.
    pub fn start(&mut self, request: &TrialRequest) -> Result<(), LocalError> {
        if self.pool.is_shut_down() {
            return Err(LocalError::ShutDown);
        }
        if request.environment_id != ENVIRONMENT_ID {
            return Err(LocalError::UnknownEnvironment(
                request.environment_id.clone(),
            ));
        }
        self.experiment = Some(request.experiment_id.clone());
        self.handed_back.remove(&request.trial_id);
        if self.demand.is_none() {
            self.demand = Some(lease::demand_of_request(request));
        }
        if let Some(warning) =
            crate::knob_protocol::parameters_only_in_file(&mut self.parameters_size_told, request)
        {
            (self.emit)(warning);
        }
        let mut request = request.clone();
        request.resources.max_trials_per_gpu = Some(self.limits.max_trial_number_per_gpu.max(1));
        let started = self.pool.start(&request).map_err(|e| match e {
            PoolError::DuplicateTrial(id) => LocalError::DuplicateTrial(id),
            PoolError::ShutDown => LocalError::ShutDown,
            PoolError::Trial(e) => LocalError::Trial(e),
            PoolError::Startup { what, source } => LocalError::Startup { what, source },
        })?;
        if let Started::Refused(reason) = started {
            self.handed_back.insert(request.trial_id.clone());
            // The machine as it is now goes first: the host places the trial again against
            // it, so that it sees the GPUs another experiment took and uses a free one. Without
            // it the host would place it on the same GPUs from its older report.
            match self.environment() {
                Ok(environment) => (self.emit)(ServiceEvent::Environment { environment }),
                Err(e) => (self.emit)(ServiceEvent::Warning {
                    trial_id: Some(request.trial_id.clone()),
                    message: e.to_string(),
                }),
            }
            (self.emit)(ServiceEvent::PlaceAgain {
                trial_id: request.trial_id,
                reason,
            });
        }
        Ok(())
    }

    /// Stops a running trial; a trial that is not running (already ended) is left alone.
    pub fn kill(&mut self, trial_id: &str, reason: &str) {
        if !self.pool.kill(trial_id, reason) {
            knob_plugin_api::log::debug(&format!(
                "training service local: kill of trial {trial_id} ignored, it is not running"
            ));
        }
    }

    /// None of the experiment's trials waits any more: it leaves the ledger's line, so that
    /// the GPUs (cores, memory) it stood for go to other experiments at once. Unless a trial
    /// was handed back since the host last said so: the host sent this after that trial's
    /// start, before it learned that the trial waits again, and the trial keeps the place it
    /// stood in (the host says so again once no trial waits).
    pub fn nothing_waits(&mut self) {
        if !self.handed_back.is_empty() {
            self.handed_back.clear();
            return;
        }
        self.leave_line();
    }

    fn leave_line(&mut self) {
        let (Some(leases), Some(experiment)) = (self.pool.leases(), self.experiment.as_deref())
        else {
            return;
        };
        if let Err(e) = leases.leave_line(experiment) {
            (self.emit)(ServiceEvent::Warning {
                trial_id: None,
                message: format!("cannot leave this machine's lease ledger line: {e}"),
            });
        }
    }

    /// Kills every running trial and waits until each has ended (its `TrialEnded` emitted),
    /// at most the grace period and a few seconds more; then closes the HTTP channel.
    pub fn stop(&mut self) {
        if self.pool.is_shut_down() {
            return;
        }
        // Its trials wait no more: what it stood in line for is not kept from the others.
        self.leave_line();
        let left = self.pool.stop("the training service is shutting down");
        if !left.is_empty() {
            (self.emit)(ServiceEvent::Warning {
                trial_id: None,
                message: format!(
                    "training service local stopped before these trials were seen to end: {left:?}"
                ),
            });
        }
    }
}

impl TrainingService for LocalService {
    fn new(class_args: &Value, events: EventSink) -> Result<Self, PluginError> {
        let emit: Emit = Arc::new(move |event: ServiceEvent| events.emit(&event));
        Ok(LocalService::with_emitter(class_args, emit)?)
    }

    fn create(
        config: &Value,
        context: &ServiceContext,
        events: EventSink,
    ) -> Result<Self, PluginError> {
        let mut service = Self::new(config, events)?;
        service.pool.set_places_again(context.places_again);
        service.experiment = Some(context.experiment_id.clone());
        service.demand = Some(lease::demand_of_settings(&context.trial));
        Ok(service)
    }

    fn check_config(
        config: &Value,
        context: &ServiceContext,
    ) -> Result<CheckedConfig, Vec<ConfigProblem>> {
        check_config(config, context)
    }

    fn clean_up_leftovers(
        _config: &Value,
        context: &ServiceContext,
        trial_ids: &[String],
    ) -> Result<Vec<String>, PluginError> {
        Ok(kill_leftovers(&context.experiment_id, trial_ids))
    }

    fn environments(&mut self) -> Result<Vec<Environment>, PluginError> {
        Ok(vec![self.environment()?])
    }

    fn start_trial(&mut self, request: TrialRequest) -> Result<(), PluginError> {
        Ok(self.start(&request)?)
    }

    fn kill_trial(&mut self, trial_id: &str, reason: &str) -> Result<(), PluginError> {
        self.kill(trial_id, reason);
        Ok(())
    }

    fn shutdown(&mut self) -> Result<(), PluginError> {
        self.stop();
        Ok(())
    }

    fn nothing_waits(&mut self) -> Result<(), PluginError> {
        LocalService::nothing_waits(self);
        Ok(())
    }
}

/// The probe's view of this machine as gpu-sched JSON, limits applied. A simulated spec may
/// name several environments; this machine is one, the first.
fn probe_inventory(
    probe: &mut LocalProbe,
    is_trial: &dyn Fn(u32) -> bool,
    limits: &EnvironmentLimits,
) -> Result<knob_gpu_sched::Environment, LocalError> {
    // CPU use is the difference of two samples: with `maxCpuUtilization` set, the probe waits a
    // moment for a figure of what runs now rather than report none (which holds trials back)
    // or one averaged since the last probe, seconds or minutes ago.
    let mut environments = if limits.max_cpu_utilization.is_some() {
        probe.sample_blocking(is_trial)
    } else {
        probe.sample(is_trial)
    };
    if environments.is_empty() {
        return Err(LocalError::Probe("the probe found nothing".into()));
    }
    let mut environment = environments.swap_remove(0).with_limits(EnvironmentLimits {
        max_trial_number_per_gpu: limits.max_trial_number_per_gpu.max(1),
        ..limits.clone()
    });
    environment.id = ENVIRONMENT_ID.into();
    Ok(environment)
}

const LOCAL_FIELDS: [&str; 9] = [
    "useActiveGpu",
    "maxTrialNumberPerGpu",
    "gpuIndices",
    "reuseMode",
    crate::limits::LIMIT_FIELDS[0],
    crate::limits::LIMIT_FIELDS[1],
    crate::limits::LIMIT_FIELDS[2],
    crate::limits::LIMIT_FIELDS[3],
    crate::limits::LIMIT_FIELDS[4],
];

/// Checks a `local` config: NNI's four fields and the shared-machine limits, each defaulting to the top-level shortcut the user
/// wrote, else NNI's default. The canonical form also carries this machine as probed (limits
/// applied), so that a trial that could never fit here fails before the experiment is created.
pub fn check_config(
    config: &Value,
    context: &ServiceContext,
) -> Result<CheckedConfig, Vec<ConfigProblem>> {
    let mut reader = ConfigReader::new(context);
    let Some(mut fields) = reader.mapping(config, FieldPath::root()) else {
        return reader.finish(Map::new());
    };
    let shortcut = |name: &str| {
        context
            .shortcuts
            .get(name)
            .filter(|v| !v.is_null())
            .cloned()
    };
    let use_active_gpu = fields
        .take("useActiveGpu")
        .and_then(|field| reader.boolean(&field))
        .map(Value::from)
        .or_else(|| shortcut("useActiveGpu"))
        .unwrap_or(json!(false));
    let max_trial_number_per_gpu = fields
        .take("maxTrialNumberPerGpu")
        .and_then(|field| reader.integer::<u32>(&field, 1))
        .map(Value::from)
        .or_else(|| shortcut("maxTrialNumberPerGpu"))
        .unwrap_or(json!(1));
    let gpu_indices = fields
        .take("gpuIndices")
        .and_then(|field| reader.gpu_indices(&field))
        .map(|indices| json!(indices))
        .or_else(|| shortcut("gpuIndices"))
        .unwrap_or(Value::Null);
    let reuse_mode = fields
        .take("reuseMode")
        .and_then(|field| reader.boolean(&field))
        .map(Value::from)
        .or_else(|| shortcut("reuseMode"))
        .unwrap_or(json!(false));
    let mut limits = Map::new();
    crate::limits::read(&mut reader, &mut fields, &mut limits);
    fields.finish(&mut reader, &LOCAL_FIELDS);
    // A bad KNOB_SIMULATE_GPUS is refused here, before the experiment is registered: found
    // only when the service probes, it ended a registered experiment in ERROR and its line
    // was printed twice (the service's warning, then the experiment's error).
    if let Err(e) = SimulatedInventory::from_env() {
        reader.error(
            &FieldPath::root(),
            format!("{SIMULATE_GPUS_VAR} is set and cannot be used for this machine: {e}"),
        );
    }
    let mut canonical = Map::new();
    canonical.insert("useActiveGpu".into(), use_active_gpu);
    canonical.insert("maxTrialNumberPerGpu".into(), max_trial_number_per_gpu);
    canonical.insert("gpuIndices".into(), gpu_indices);
    canonical.insert("reuseMode".into(), reuse_mode);
    canonical.extend(limits);
    let mut checked = reader.finish(canonical)?;
    // A probe that fails here fails again, with its reason, when the service starts.
    if let Ok(args) = LocalArgs::parse(&Value::Object(checked.config.clone())) {
        if let Ok(mut probe) = LocalProbe::new(ENVIRONMENT_ID) {
            let inventory = probe_inventory(&mut probe, &|_| false, &args.limits)
                .ok()
                .and_then(|inventory| serde_json::to_value(&inventory).ok());
            if let Some(inventory) = inventory {
                checked.environments = Some(vec![Environment {
                    id: ENVIRONMENT_ID.into(),
                    host: hostname(),
                    ready: true,
                    inventory,
                }]);
            }
        }
    }
    Ok(checked)
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".to_string())
}

/// Kills what is left of these trials from an earlier run of the experiment (see
/// [`crate::process::kill_leftovers`]). Returns one line per trial that had processes left.
pub fn kill_leftovers(experiment_id: &str, trial_ids: &[String]) -> Vec<String> {
    crate::process::kill_leftovers(experiment_id, trial_ids)
        .into_iter()
        .zip(trial_ids)
        .filter(|&(count, _)| count > 0)
        .map(|(count, trial)| {
            format!("killed {count} process(es) of trial {trial} left from an earlier run")
        })
        .collect()
}

impl Drop for LocalService {
    fn drop(&mut self) {
        // Trials never outlive the service that started them (the pool's drop shuts its
        // runtime down after this).
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_args() {
        assert_eq!(
            LocalArgs::parse(&Value::Null).unwrap(),
            LocalArgs::default()
        );
        let args = serde_json::json!({"platform": "local", "grace_period_secs": 0.5});
        assert_eq!(
            LocalArgs::parse(&args).unwrap().grace_period,
            Duration::from_millis(500)
        );
        let err = LocalArgs::parse(&serde_json::json!({"gracePeriodSecs": "5"})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "classArgs of training service local: gracePeriodSecs must be a number of seconds from 0 to 3600, got \"5\""
        );
        let err = LocalArgs::parse(&serde_json::json!([1])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "classArgs of training service local: expected an object, got [1]"
        );
    }
}
