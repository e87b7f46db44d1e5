//! knob's placement of trials onto environments and GPUs.
//!
//! - [`inventory`]: environments (the local machine, SSH hosts, cluster allocations), their GPUs
//!   with memory, utilization and foreign processes, host CPU and memory, and the per-environment
//!   limits (`gpuIndices`, `maxTrialNumberPerGpu`, `useActiveGpu`, admission limits).
//! - [`TrialRequest`]: what a trial asks for (`None` / `GPUNumber` / `Device`, GPU memory, host
//!   memory, CPU cores), with the experiment's defaults in [`SchedulerConfig`].
//! - [`Scheduler`]: decides [`Placement::Succeed`], [`Placement::RequireExceedTotal`] or
//!   [`Placement::TmpNoAvailableGpu`] under a [`Policy`], serves the waiting queue in order
//!   without starving large requests, and explains every refusal in one line.
//! - [`probe`]: NVML, sysinfo and `KNOB_SIMULATE_GPUS` inventories.
//! - [`ledger`]: the machine-wide lease file every experiment here shares.
//!
//! The scheduler is pure and synchronous: no I/O, no clock, no randomness. Probes do I/O and are
//! kept apart so that the core decides when to pay for them.

pub mod bytes;
pub mod error;
pub mod inventory;
pub mod ledger;
mod placement;
pub mod probe;
mod request;
mod scheduler;

pub use bytes::ByteSize;
pub use error::{
    ByteSizeError, GpuProbeError, HostProbeError, InventoryError, PolicyParseError, ProbeError,
    SimulationSpecError,
};
pub use inventory::{
    trials_per_gpu, Environment, EnvironmentId, EnvironmentLimits, EnvironmentStatus, Gpu,
    GpuProcess, GpuSource, HeldElsewhere, HostHeldElsewhere, HostHolder, HostResources, Inventory,
    TrialId,
};
pub use placement::{cuda_environment, Assignment, Placement};
pub use request::{DeviceRef, GpuRequest, Policy, SchedulerConfig, TrialRequest};
pub use scheduler::{Reasons, Scheduler};
