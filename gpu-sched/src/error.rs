//! Error types. Every message is one line that says what happened, to what, and what to change.

use thiserror::Error;

use crate::inventory::EnvironmentId;

/// A size string that is not a number followed by a known unit.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("cannot read `{text}` as a size: write a number and a unit, such as 10GiB, 512MiB or 80GB")]
pub struct ByteSizeError {
    pub text: String,
}

/// A policy name that is not one of the four policies.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("unknown placement policy `{name}`: use pack, spread, round-robin or recently-idle")]
pub struct PolicyParseError {
    pub name: String,
}

/// An environment that the scheduler refuses to register or update.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum InventoryError {
    #[error("environment {environment} lists GPU {index} twice: each GPU index must be unique")]
    DuplicateGpuIndex {
        environment: EnvironmentId,
        index: u32,
    },
    #[error("environment {environment} has maxTrialNumberPerGpu 0: set it to 1 or more")]
    ZeroTrialsPerGpu { environment: EnvironmentId },
    #[error(
        "environment {environment} has {limit} {percent}: give a percentage above 0 and at most 100"
    )]
    UtilizationLimitOutOfRange {
        environment: EnvironmentId,
        /// The config name of the limit.
        limit: &'static str,
        percent: f32,
    },
    #[error(
        "environment {environment}: gpuIndices names GPU {index}, but the GPUs found are {present}: list only GPUs it has"
    )]
    AllowedGpuMissing {
        environment: EnvironmentId,
        index: u32,
        present: String,
    },
    #[error(
        "no environment {environment} is registered: register it with upsert_environment first"
    )]
    UnknownEnvironment { environment: EnvironmentId },
}

/// A `KNOB_SIMULATE_GPUS` (or config) spec that does not parse.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error(
    "cannot read simulated GPU spec `{spec}`: {problem}; write e.g. `4x80GiB` or `node1=8x80GiB,cpu=64,mem=512GiB;node2=2x24GiB`"
)]
pub struct SimulationSpecError {
    pub spec: String,
    pub problem: String,
}

/// Why NVML gave no GPUs. The `Display` text is the reason a user sees in `knob gpu` and in a
/// rejected `knob create`.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum GpuProbeError {
    #[error("NVML library not found ({library}): no NVIDIA driver on this machine")]
    LibraryNotFound { library: String },
    #[error("NVIDIA driver is not loaded (NVML found, driver not running): load the nvidia kernel module or reboot after installing the driver")]
    DriverNotLoaded,
    #[error("no permission to talk to the NVIDIA driver through NVML: give this user access to /dev/nvidia*")]
    NoPermission,
    #[error("NVIDIA kernel module and driver library versions differ: reboot or reload the nvidia module after the driver update")]
    DriverVersionMismatch,
    #[error("NVIDIA driver is too old for knob's NVML calls ({detail}): update the driver to 510 or newer")]
    DriverTooOld { detail: String },
    #[error("NVML could not read {what}: {detail}")]
    Query { what: String, detail: String },
}

/// Why the host's CPU and memory could not be read.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("cannot read this machine's CPU and memory: {detail}")]
pub struct HostProbeError {
    pub detail: String,
}

/// Why probing the local machine failed as a whole (a missing GPU is not a failure: it is an
/// environment with no GPUs and a reason).
#[derive(Clone, Debug, Error, PartialEq)]
pub enum ProbeError {
    #[error(transparent)]
    Host(#[from] HostProbeError),
    /// Not a `source`: the message already holds the spec's error, and a reporter that prints
    /// the chain (anyhow's `{:#}`) would print it twice.
    #[error("KNOB_SIMULATE_GPUS: {0}")]
    Simulation(SimulationSpecError),
}

impl From<SimulationSpecError> for ProbeError {
    fn from(error: SimulationSpecError) -> ProbeError {
        ProbeError::Simulation(error)
    }
}
