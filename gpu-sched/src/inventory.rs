//! The inventory model: environments, their GPUs, their host resources and their placement
//! limits. Probes produce it, the core registers it with the [`Scheduler`](crate::Scheduler),
//! and `knob gpu` prints it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::bytes::ByteSize;
use crate::error::InventoryError;

/// Names an environment: the local machine, one SSH host, one cluster allocation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EnvironmentId(pub String);

/// Names a trial, as the core does (NNI's five-character ids, or anything else unique).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TrialId(pub String);

macro_rules! string_id {
    ($name:ident) => {
        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                $name(id.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                $name(id)
            }
        }
    };
}

string_id!(EnvironmentId);
string_id!(TrialId);

/// Whether an environment takes new trials.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum EnvironmentStatus {
    /// Probed and taking trials.
    #[default]
    Ready,
    /// Being set up (SSH connecting, cluster job pending). Its resources are not known yet, so
    /// while one is starting no request is rejected as too large: it may be the one that fits.
    Starting,
    /// Known but not reachable now (SSH dropped, agent restarting). Counts for "could this ever
    /// fit", takes nothing until it is ready again.
    Unavailable(String),
    /// Being retired: keeps its running trials, takes no new ones, and does not count for
    /// "could this ever fit".
    Draining,
}

/// Where an environment's GPU list came from, and why it is empty when it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "source")]
pub enum GpuSource {
    /// Read from NVML.
    Nvml {
        driver_version: String,
        /// CUDA version the driver supports, e.g. `12.4`.
        cuda_version: Option<String>,
        /// What could not be read (a skipped GPU, a process list), one line each.
        warnings: Vec<String>,
    },
    /// Made up from a `KNOB_SIMULATE_GPUS`-style spec.
    Simulated { spec: String },
    /// No GPU could be probed; the reason is the probe's one-line error.
    Unavailable { reason: String },
    /// Given by the caller (a config, a test, a remote agent's report).
    #[default]
    Declared,
}

/// A compute process on a GPU that knob did not start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// `None` where the driver does not say (e.g. some containers, Windows WDDM).
    pub used_memory: Option<ByteSize>,
}

/// One GPU as probed, plus the trials knob placed on it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// The NVML index, which is what `CUDA_VISIBLE_DEVICES` names (with
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID`, see [`Assignment::cuda_environment`](crate::Assignment::cuda_environment)).
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total: ByteSize,
    pub memory_used: ByteSize,
    pub memory_free: ByteSize,
    /// Percent of time a kernel ran over the driver's last sample period.
    pub utilization_percent: Option<u32>,
    /// Compute processes not started by knob (the probe's caller tells which are knob's).
    pub foreign_processes: Vec<GpuProcess>,
    /// Trials knob placed here and has not released. Maintained by the scheduler: whatever a
    /// probe or caller puts here is replaced on registration.
    #[serde(default)]
    pub trials: Vec<TrialId>,
    /// Trials of other knob experiments on this machine that hold this GPU, from the machine's
    /// lease ledger (see [`crate::ledger`]): each counts against `maxTrialNumberPerGpu`, and
    /// its GPU memory as promised.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_elsewhere: Vec<HeldElsewhere>,
}

/// A trial of another experiment holding a GPU or host resources here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldElsewhere {
    pub experiment: String,
    pub trial: String,
    pub gpu_memory: ByteSize,
    /// The holder's `maxTrialNumberPerGpu`, which limits this GPU for everyone
    /// ([`trials_per_gpu`]); `None` from a service that does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_gpu: Option<u32>,
    /// Not held: promised to a request of the experiment that asked before the asker and waits
    /// (`trial` is then that request's trial, or [`STANDING`](crate::ledger::STANDING) for its
    /// waiting trials), so that a reason says it is promised, not that a trial runs there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub asked_earlier: bool,
}

/// How many trials, of every experiment together, a GPU may take: the smallest
/// `maxTrialNumberPerGpu` among the experiments that hold it (`holders`) and the one that asks
/// (`own`), at least 1, so that no experiment finds more trials on a GPU than its own limit
/// allows. The one rule both the [`Scheduler`](crate::Scheduler) (what it places, from
/// [`Gpu::held_elsewhere`]) and the [`ledger`](crate::ledger) (what it grants) apply, so that
/// the ledger does not refuse what the scheduler placed.
pub fn trials_per_gpu(holders: impl IntoIterator<Item = u32>, own: u32) -> u32 {
    holders.into_iter().fold(own, u32::min).max(1)
}

/// What other experiments' trials hold of the host, from the lease ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostHeldElsewhere {
    pub host_memory: ByteSize,
    pub cpu_cores: u32,
    /// Who holds (or was promised) them, so that a waiting reason names them as it names a
    /// GPU's holders. Empty from a service that does not say: the totals above are then
    /// described as held by other experiments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<HostHolder>,
}

/// One lease or older waiting request of another experiment for host memory or CPU cores.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostHolder {
    pub experiment: String,
    /// `None` for the experiment's waiting trials standing in line (the ledger's
    /// [`STANDING`](crate::ledger::STANDING) request).
    pub trial: Option<String>,
    pub host_memory: ByteSize,
    pub cpu_cores: u32,
    /// A request older than the asker's that waits for them: promised first, not held yet.
    pub asked_earlier: bool,
}

impl HostHeldElsewhere {
    pub fn is_empty(&self) -> bool {
        *self == HostHeldElsewhere::default()
    }
}

impl Gpu {
    /// An idle GPU with nothing on it, for declared and simulated inventories.
    pub fn idle(index: u32, name: impl Into<String>, memory: ByteSize) -> Gpu {
        Gpu {
            index,
            uuid: String::new(),
            name: name.into(),
            memory_total: memory,
            memory_used: ByteSize::ZERO,
            memory_free: memory,
            utilization_percent: Some(0),
            foreign_processes: Vec::new(),
            trials: Vec::new(),
            held_elsewhere: Vec::new(),
        }
    }

    /// How many trials this GPU may take for an experiment whose `maxTrialNumberPerGpu` is
    /// `own`, given who else holds it ([`trials_per_gpu`]).
    pub fn trial_limit(&self, own: u32) -> u32 {
        trials_per_gpu(
            self.held_elsewhere
                .iter()
                .filter_map(|held| held.max_per_gpu),
            own,
        )
    }

    /// Memory used by foreign processes, as far as the driver reports it.
    pub fn foreign_memory(&self) -> ByteSize {
        ByteSize(
            self.foreign_processes
                .iter()
                .filter_map(|process| process.used_memory)
                .map(ByteSize::bytes)
                .sum(),
        )
    }
}

/// The host's CPU and memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostResources {
    /// Logical CPUs this process may use (cgroup quota and affinity applied).
    pub cpu_count: u32,
    /// Whole-machine CPU use in percent; `None` until two samples exist.
    pub cpu_utilization_percent: Option<f32>,
    pub memory_total: ByteSize,
    /// Memory a new process could get without swapping (cgroup limit applied).
    pub memory_available: ByteSize,
}

/// How knob may use an environment: NNI's per-machine `gpuIndices`, `maxTrialNumberPerGpu` and
/// `useActiveGpu`, plus admission limits in the style of FedFlow's group scheduler, for machines
/// that other people use too. Each limit is checked against the latest probe plus everything
/// knob holds there; the config names are in the field docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EnvironmentLimits {
    /// Only these GPU indices are used; `None` allows all.
    pub gpu_indices: Option<Vec<u32>>,
    /// How many trials may share one GPU (at least 1).
    pub max_trial_number_per_gpu: u32,
    /// Whether a GPU running foreign processes may take trials.
    pub use_active_gpu: bool,
    /// `maxCpuUtilization`: no trial starts while the host's CPU use is at or above this
    /// percentage.
    pub max_cpu_utilization: Option<f32>,
    /// `memoryReserve`: host memory kept free: a trial starts only if this much stays available
    /// after its own host-memory request.
    pub min_available_memory: Option<ByteSize>,
    /// `maxMemoryUtilization`: a trial starts only if the host's memory in use, with its own
    /// host-memory request added, stays at or below this percentage of the total.
    pub max_memory_utilization: Option<f32>,
    /// `maxGpuMemoryUtilization`: a GPU takes a trial only if its memory in use, with the
    /// trial's GPU-memory request added, stays at or below this percentage of its total.
    pub max_gpu_memory_utilization: Option<f32>,
    /// `gpuMemoryReserve`: GPU memory kept free on each GPU after the trial's GPU-memory request.
    pub gpu_memory_reserve: Option<ByteSize>,
    /// At most this many knob trials at once, whatever they ask: set by a training service
    /// whose environment was sized for a number of trials that ask no CPU cores (a Slurm
    /// allocation of one core per trial), where nothing else would stop them piling in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_trials: Option<u32>,
}

impl EnvironmentLimits {
    /// Whether a limit is judged on the host's CPU use or available memory as they are now
    /// (`maxCpuUtilization`, `memoryReserve`, `maxMemoryUtilization`): only a recent probe can
    /// tell whether a trial may start under them.
    pub fn judged_on_host_use(&self) -> bool {
        self.max_cpu_utilization.is_some()
            || self.min_available_memory.is_some()
            || self.max_memory_utilization.is_some()
    }
}

impl Default for EnvironmentLimits {
    fn default() -> Self {
        EnvironmentLimits {
            gpu_indices: None,
            max_trial_number_per_gpu: 1,
            use_active_gpu: false,
            max_cpu_utilization: None,
            min_available_memory: None,
            max_memory_utilization: None,
            max_gpu_memory_utilization: None,
            gpu_memory_reserve: None,
            max_trials: None,
        }
    }
}

impl EnvironmentLimits {
    pub fn allows_gpu(&self, index: u32) -> bool {
        self.gpu_indices
            .as_ref()
            .is_none_or(|allowed| allowed.contains(&index))
    }
}

/// One place trials run, with everything placement needs to know about it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    pub id: EnvironmentId,
    /// The host name `Device` constraints refer to (`localhost` for the local machine).
    pub host: String,
    pub status: EnvironmentStatus,
    /// Sorted by index.
    pub gpus: Vec<Gpu>,
    pub gpu_source: GpuSource,
    pub host_resources: HostResources,
    pub limits: EnvironmentLimits,
    /// Host memory and cores that other experiments' trials hold here (lease ledger).
    #[serde(default, skip_serializing_if = "HostHeldElsewhere::is_empty")]
    pub host_held_elsewhere: HostHeldElsewhere,
}

impl Environment {
    /// A ready environment with the given GPUs and host, default limits, declared source.
    pub fn new(
        id: impl Into<EnvironmentId>,
        host: impl Into<String>,
        gpus: Vec<Gpu>,
        host_resources: HostResources,
    ) -> Environment {
        Environment {
            id: id.into(),
            host: host.into(),
            status: EnvironmentStatus::Ready,
            gpus,
            gpu_source: GpuSource::Declared,
            host_resources,
            limits: EnvironmentLimits::default(),
            host_held_elsewhere: HostHeldElsewhere::default(),
        }
    }

    pub fn with_limits(mut self, limits: EnvironmentLimits) -> Environment {
        self.limits = limits;
        self
    }

    pub fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|gpu| gpu.index == index)
    }

    /// Checks what the scheduler needs to hold (unique GPU indices, sane limits). Called on
    /// every registration.
    pub fn check_consistency(&self) -> Result<(), InventoryError> {
        let mut indices: Vec<u32> = self.gpus.iter().map(|gpu| gpu.index).collect();
        indices.sort_unstable();
        if let Some(pair) = indices.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(InventoryError::DuplicateGpuIndex {
                environment: self.id.clone(),
                index: pair[0],
            });
        }
        if self.limits.max_trial_number_per_gpu == 0 {
            return Err(InventoryError::ZeroTrialsPerGpu {
                environment: self.id.clone(),
            });
        }
        let percents = [
            ("maxCpuUtilization", self.limits.max_cpu_utilization),
            ("maxMemoryUtilization", self.limits.max_memory_utilization),
            (
                "maxGpuMemoryUtilization",
                self.limits.max_gpu_memory_utilization,
            ),
        ];
        for (limit, percent) in percents {
            if let Some(percent) = percent {
                if !(percent > 0.0 && percent <= 100.0) {
                    return Err(InventoryError::UtilizationLimitOutOfRange {
                        environment: self.id.clone(),
                        limit,
                        percent,
                    });
                }
            }
        }
        Ok(())
    }

    /// Checks the limits against the GPUs found: a `gpuIndices` entry that names no GPU is a
    /// config mistake worth failing `knob create` for. Not checked on registration, because a
    /// GPU that falls off the bus mid-experiment must not make the refresh fail.
    pub fn check_limits_match_gpus(&self) -> Result<(), InventoryError> {
        let Some(allowed) = &self.limits.gpu_indices else {
            return Ok(());
        };
        match allowed.iter().find(|&&index| self.gpu(index).is_none()) {
            None => Ok(()),
            Some(&index) => Err(InventoryError::AllowedGpuMissing {
                environment: self.id.clone(),
                index,
                present: describe_indices(self.gpus.iter().map(|gpu| gpu.index)),
            }),
        }
    }
}

/// `0-3`, `0, 2, 5`, or `none`: GPU index lists in messages.
pub(crate) fn describe_indices(indices: impl IntoIterator<Item = u32>) -> String {
    let indices: Vec<u32> = indices.into_iter().collect();
    match indices.as_slice() {
        [] => "none".to_owned(),
        [only] => only.to_string(),
        [first, .., last]
            if indices.windows(2).all(|pair| pair[1] == pair[0] + 1) && indices.len() > 2 =>
        {
            format!("{first}-{last}")
        }
        _ => indices
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Every environment the scheduler knows, in registration order, as `knob gpu` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub environments: Vec<Environment>,
}
