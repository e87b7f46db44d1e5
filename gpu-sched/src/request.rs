//! What a trial asks for, and the experiment-wide defaults and policy.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::bytes::ByteSize;
use crate::error::PolicyParseError;
use crate::inventory::TrialId;

/// One GPU, named the way NNI's `Device` placement constraint names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DeviceRef {
    pub host: String,
    pub index: u32,
}

impl DeviceRef {
    pub fn new(host: impl Into<String>, index: u32) -> DeviceRef {
        DeviceRef {
            host: host.into(),
            index,
        }
    }
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.index)
    }
}

/// NNI's placement constraint, for every training service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "gpus")]
pub enum GpuRequest {
    /// Use the experiment's `trialGpuNumber`.
    #[default]
    None,
    /// This many GPUs on one environment, any of them.
    #[serde(rename = "GPUNumber")]
    GpuNumber(u32),
    /// Exactly these GPUs, all on one host.
    Device(Vec<DeviceRef>),
}

/// A waiting trial's request. Fields left `None` take the experiment's defaults from
/// [`SchedulerConfig`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialRequest {
    pub trial: TrialId,
    pub gpus: GpuRequest,
    /// GPU memory needed on each assigned GPU (`trialGpuMemory`).
    pub gpu_memory: Option<ByteSize>,
    /// Host memory needed (`trialMemorySize`).
    pub host_memory: Option<ByteSize>,
    /// CPU cores needed (`trialCpuNumber`).
    pub cpu_cores: Option<u32>,
}

impl TrialRequest {
    /// A request that takes every default.
    pub fn new(trial: impl Into<TrialId>) -> TrialRequest {
        TrialRequest {
            trial: trial.into(),
            gpus: GpuRequest::None,
            gpu_memory: None,
            host_memory: None,
            cpu_cores: None,
        }
    }

    pub fn gpu_number(mut self, count: u32) -> TrialRequest {
        self.gpus = GpuRequest::GpuNumber(count);
        self
    }

    pub fn devices(mut self, devices: impl IntoIterator<Item = DeviceRef>) -> TrialRequest {
        self.gpus = GpuRequest::Device(devices.into_iter().collect());
        self
    }

    pub fn gpu_memory(mut self, memory: ByteSize) -> TrialRequest {
        self.gpu_memory = Some(memory);
        self
    }

    pub fn host_memory(mut self, memory: ByteSize) -> TrialRequest {
        self.host_memory = Some(memory);
        self
    }

    pub fn cpu_cores(mut self, cores: u32) -> TrialRequest {
        self.cpu_cores = Some(cores);
        self
    }
}

/// How the scheduler picks among environments (and GPUs) that fit. All four are deterministic:
/// the same inventory and the same sequence of calls give the same placements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Best fit: the environment left with the fewest free GPUs, the busiest GPUs that still
    /// have room. Keeps whole machines free for large trials.
    #[serde(alias = "best-fit")]
    Pack,
    /// Least loaded: the environment with the largest free share of its GPUs, the idlest GPUs.
    /// Spreads heat and memory bandwidth.
    #[serde(alias = "least-loaded")]
    Spread,
    /// Environments in turn, starting after the last one used.
    RoundRobin,
    /// NNI's default: the environment that most recently had a trial end (its data and caches
    /// are warm), otherwise round-robin.
    #[default]
    RecentlyIdle,
}

impl Policy {
    pub const ALL: [Policy; 4] = [
        Policy::Pack,
        Policy::Spread,
        Policy::RoundRobin,
        Policy::RecentlyIdle,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Pack => "pack",
            Policy::Spread => "spread",
            Policy::RoundRobin => "round-robin",
            Policy::RecentlyIdle => "recently-idle",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = PolicyParseError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        // NNI configs are case- and underscore-insensitive; so is this.
        let normalized = name.trim().to_ascii_lowercase().replace('_', "-");
        match normalized.as_str() {
            "pack" | "best-fit" | "bestfit" => Ok(Policy::Pack),
            "spread" | "least-loaded" | "leastloaded" => Ok(Policy::Spread),
            "round-robin" | "roundrobin" => Ok(Policy::RoundRobin),
            "recently-idle" | "recentlyidle" => Ok(Policy::RecentlyIdle),
            _ => Err(PolicyParseError {
                name: name.to_owned(),
            }),
        }
    }
}

/// Experiment-wide placement settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SchedulerConfig {
    /// GPUs per trial when its request is [`GpuRequest::None`]. `None` (unset in the config)
    /// means knob does not manage GPUs for such trials: they get no GPUs assigned and their
    /// `CUDA_VISIBLE_DEVICES` is left as it was.
    pub trial_gpu_number: Option<u32>,
    pub trial_gpu_memory: Option<ByteSize>,
    pub trial_memory_size: Option<ByteSize>,
    pub trial_cpu_number: Option<u32>,
    pub policy: Policy,
}
