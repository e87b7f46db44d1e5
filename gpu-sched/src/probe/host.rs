//! CPU and memory of this machine through sysinfo.

use std::time::{Duration, Instant};

use sysinfo::{MemoryRefreshKind, System};

use crate::bytes::ByteSize;
use crate::error::HostProbeError;
use crate::inventory::HostResources;

/// How long CPU use must be observed before it means anything.
pub const CPU_SAMPLE_INTERVAL: Duration = sysinfo::MINIMUM_CPU_UPDATE_INTERVAL;

/// The longest span a CPU figure from [`HostProbe::sample_blocking`] covers: a figure over a
/// longer one would average in what ran then (a trial that has ended since, a job that
/// stopped), and hide what runs now.
pub const CPU_FIGURE_SPAN: Duration = Duration::from_secs(1);

/// Keeps the previous sample: CPU use is a difference between two samples, so the first one
/// reports `cpu_utilization_percent: None`.
pub struct HostProbe {
    system: System,
    samples: u64,
    last_sample: Option<Instant>,
}

impl std::fmt::Debug for HostProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostProbe")
            .field("samples", &self.samples)
            .finish_non_exhaustive()
    }
}

impl HostProbe {
    pub fn new() -> Result<HostProbe, HostProbeError> {
        let system =
            System::new_with_specifics(sysinfo::RefreshKind::nothing()).map_err(|error| {
                HostProbeError {
                    detail: error.to_string(),
                }
            })?;
        Ok(HostProbe {
            system,
            samples: 0,
            last_sample: None,
        })
    }

    pub fn sample(&mut self) -> HostResources {
        self.system.refresh_cpu_usage();
        self.system
            .refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        self.samples += 1;
        self.last_sample = Some(Instant::now());
        let mut memory_total = self.system.total_memory();
        let mut memory_available = self.system.available_memory();
        // In a container the machine's memory is not ours to promise: the cgroup limit is.
        if let Some(limits) = self.system.cgroup_limits() {
            if limits.total_memory > 0 && limits.total_memory < memory_total {
                memory_total = limits.total_memory;
                memory_available = memory_available.min(limits.free_memory);
            }
        }
        HostResources {
            cpu_count: usable_cpu_count(&self.system),
            cpu_utilization_percent: (self.samples > 1).then(|| self.system.global_cpu_usage()),
            memory_total: ByteSize(memory_total),
            memory_available: ByteSize(memory_available),
        }
    }

    /// A sample whose CPU figure covers at least [`CPU_SAMPLE_INTERVAL`] and at most
    /// [`CPU_FIGURE_SPAN`] before it: for one-shot callers (`knob gpu`, the probe example) and
    /// for a probe that a `maxCpuUtilization` is judged on. Blocks for up to that interval when
    /// the previous sample is too recent or too old (or there is none) to give one.
    pub fn sample_blocking(&mut self) -> HostResources {
        let since_last = self.last_sample.map(|at| at.elapsed());
        match since_last {
            Some(since) if since < CPU_SAMPLE_INTERVAL => {
                std::thread::sleep(CPU_SAMPLE_INTERVAL - since)
            }
            Some(since) if since <= CPU_FIGURE_SPAN => {}
            _ => {
                self.sample();
                std::thread::sleep(CPU_SAMPLE_INTERVAL);
            }
        }
        self.sample()
    }
}

/// CPUs this process may run on: affinity and cgroup CPU quota applied (what
/// `available_parallelism` reports), falling back to sysinfo's count.
fn usable_cpu_count(system: &System) -> u32 {
    match std::thread::available_parallelism() {
        Ok(count) => count.get() as u32,
        Err(_) => system.cpus().len().max(1) as u32,
    }
}
