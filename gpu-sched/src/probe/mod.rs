//! Probes: what this machine has. The scheduler never calls these; the core (or a remote agent)
//! does, on its own thread, and registers the result.

mod host;
mod nvml;
mod simulated;

pub use host::{HostProbe, CPU_FIGURE_SPAN, CPU_SAMPLE_INTERVAL};
pub use nvml::{trial_gpu_memory, NvmlProbe, NvmlReading, NVML_LIBRARY};
pub use simulated::{SimulatedInventory, MAX_SIMULATED_GPUS, SIMULATE_GPUS_VAR};

use crate::error::{GpuProbeError, ProbeError};
use crate::inventory::{
    Environment, EnvironmentId, EnvironmentLimits, EnvironmentStatus, GpuSource,
};

/// Where the local machine's GPUs come from.
#[derive(Debug)]
enum GpuBackend {
    Simulated(SimulatedInventory),
    /// NVML, or why it could not start (retried on every sample: the driver may load later).
    Nvml(Result<NvmlProbe, GpuProbeError>),
}

/// Probes the local machine: NVML for GPUs (or a simulated inventory when
/// `KNOB_SIMULATE_GPUS` is set), sysinfo for CPU and memory.
#[derive(Debug)]
pub struct LocalProbe {
    id: EnvironmentId,
    gpus: GpuBackend,
    host: HostProbe,
}

impl LocalProbe {
    /// Uses `KNOB_SIMULATE_GPUS` if set (an invalid spec is an error, not silently ignored),
    /// NVML otherwise.
    pub fn new(id: impl Into<EnvironmentId>) -> Result<LocalProbe, ProbeError> {
        let simulated = SimulatedInventory::from_env()?;
        LocalProbe::with_simulation(id, simulated)
    }

    /// `Some` forces a simulated inventory (e.g. from a config field), `None` forces NVML.
    pub fn with_simulation(
        id: impl Into<EnvironmentId>,
        simulated: Option<SimulatedInventory>,
    ) -> Result<LocalProbe, ProbeError> {
        let gpus = match simulated {
            Some(simulated) => GpuBackend::Simulated(simulated),
            None => GpuBackend::Nvml(NvmlProbe::init()),
        };
        Ok(LocalProbe {
            id: id.into(),
            gpus,
            host: HostProbe::new()?,
        })
    }

    /// One environment for this machine, or the spec's environments when simulating.
    /// `is_knob_process` tells which GPU processes are knob's trials (see
    /// [`process_group_of`]). A missing driver is not an error here: the environment has no
    /// GPUs and its `gpu_source` says why.
    pub fn sample(&mut self, is_knob_process: &dyn Fn(u32) -> bool) -> Vec<Environment> {
        let host_resources = self.host.sample();
        self.environments(host_resources, is_knob_process)
    }

    /// Like [`sample`](Self::sample), but with CPU use known, over a recent span (see
    /// [`HostProbe::sample_blocking`]; waits up to [`CPU_SAMPLE_INTERVAL`] for it): for one-shot
    /// callers such as `knob gpu`, and for a probe that `maxCpuUtilization` is judged on.
    pub fn sample_blocking(&mut self, is_knob_process: &dyn Fn(u32) -> bool) -> Vec<Environment> {
        let host_resources = self.host.sample_blocking();
        self.environments(host_resources, is_knob_process)
    }

    fn environments(
        &mut self,
        host_resources: crate::inventory::HostResources,
        is_knob_process: &dyn Fn(u32) -> bool,
    ) -> Vec<Environment> {
        let nvml = match &mut self.gpus {
            GpuBackend::Simulated(simulated) => {
                return simulated.environments(self.id.as_str(), Some(&host_resources));
            }
            GpuBackend::Nvml(nvml) => nvml,
        };
        if nvml.is_err() {
            *nvml = NvmlProbe::init();
        }
        let reading = match nvml {
            Ok(probe) => probe.read(is_knob_process),
            Err(error) => Err(error.clone()),
        };
        let (gpus, gpu_source) = match reading {
            Ok(reading) => (reading.gpus, reading.source),
            Err(error) => (
                Vec::new(),
                GpuSource::Unavailable {
                    reason: error.to_string(),
                },
            ),
        };
        vec![Environment {
            id: self.id.clone(),
            host: "localhost".to_owned(),
            status: EnvironmentStatus::Ready,
            gpus,
            gpu_source,
            host_resources,
            limits: EnvironmentLimits::default(),
            host_held_elsewhere: Default::default(),
        }]
    }
}

/// The process group of a running process (Linux, from `/proc/<pid>/stat`), for telling knob's
/// trials from foreign processes: knob starts each trial in its own process group, and a GPU
/// process whose group is a trial's belongs to that trial. `None` if the process is gone or
/// the platform has no `/proc`.
pub fn process_group_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may itself contain ") ", so parse from
    // the last one: state, ppid, pgrp follow.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(2)?.parse().ok()
}
