//! GPUs through NVML (nvml-wrapper). The library is opened at run time, so a machine without an
//! NVIDIA driver gets an error to show, not a build or start-up failure.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

use crate::bytes::ByteSize;
use crate::error::GpuProbeError;
use crate::inventory::{Gpu, GpuProcess, GpuSource};

/// The shared object NVML lives in (the versioned name: the unversioned `.so` link only exists
/// where the CUDA development files are installed).
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// An initialised NVML, reused across probes (initialisation costs tens of milliseconds).
pub struct NvmlProbe {
    /// Boxed: the loaded function table is about 12 KiB.
    nvml: Box<Nvml>,
    driver_version: String,
    cuda_version: Option<String>,
}

impl std::fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlProbe")
            .field("driver_version", &self.driver_version)
            .field("cuda_version", &self.cuda_version)
            .finish_non_exhaustive()
    }
}

/// GPUs read by one probe, and what could not be read.
#[derive(Clone, Debug, PartialEq)]
pub struct NvmlReading {
    pub gpus: Vec<Gpu>,
    pub source: GpuSource,
}

impl NvmlProbe {
    pub fn init() -> Result<NvmlProbe, GpuProbeError> {
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new(NVML_LIBRARY))
            .init()
            .map_err(|error| classify(error, "the driver"))?;
        let driver_version = nvml
            .sys_driver_version()
            .map_err(|error| classify(error, "the driver version"))?;
        let cuda_version = nvml.sys_cuda_driver_version().ok().map(|version| {
            format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(version),
                nvml_wrapper::cuda_driver_version_minor(version)
            )
        });
        Ok(NvmlProbe {
            nvml: Box::new(nvml),
            driver_version,
            cuda_version,
        })
    }

    pub fn driver_version(&self) -> &str {
        &self.driver_version
    }

    /// Reads every GPU. `is_knob_process` tells which compute processes belong to knob's
    /// trials; the others are listed as foreign. A GPU that cannot be read is skipped with a
    /// warning in the source; if none can be read, that is an error.
    pub fn read(
        &self,
        is_knob_process: &dyn Fn(u32) -> bool,
    ) -> Result<NvmlReading, GpuProbeError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|error| classify(error, "the GPU count"))?;
        let mut gpus = Vec::new();
        let mut warnings = Vec::new();
        let mut first_failure = None;
        for index in 0..count {
            match self.read_gpu(index, is_knob_process, &mut warnings) {
                Ok(gpu) => gpus.push(gpu),
                Err(error) => {
                    warnings.push(format!("GPU {index} skipped: {error}"));
                    first_failure.get_or_insert(error);
                }
            }
        }
        if let (true, Some(error)) = (gpus.is_empty(), first_failure) {
            return Err(error);
        }
        Ok(NvmlReading {
            gpus,
            source: GpuSource::Nvml {
                driver_version: self.driver_version.clone(),
                cuda_version: self.cuda_version.clone(),
                warnings,
            },
        })
    }

    fn read_gpu(
        &self,
        index: u32,
        is_knob_process: &dyn Fn(u32) -> bool,
        warnings: &mut Vec<String>,
    ) -> Result<Gpu, GpuProbeError> {
        let what = |item: &str| format!("GPU {index}'s {item}");
        let device = self
            .nvml
            .device_by_index(index)
            .map_err(|error| classify(error, &what("handle")))?;
        let memory = device
            .memory_info()
            .map_err(|error| classify(error, &what("memory")))?;
        let name = device
            .name()
            .unwrap_or_else(|_| "NVIDIA GPU (name unreadable)".to_owned());
        let uuid = device.uuid().unwrap_or_default();
        // Utilization is unsupported on some boards (and under MIG): unknown, not an error.
        let utilization_percent = device.utilization_rates().ok().map(|rates| rates.gpu);
        let processes = match compute_processes(&device) {
            Ok(processes) => processes,
            Err(error) => {
                // Without the process list, useActiveGpu cannot be honoured for this GPU; say so
                // rather than pretend it is idle without a word.
                warnings.push(format!(
                    "GPU {index}: cannot list compute processes ({error}); it is treated as running none"
                ));
                Vec::new()
            }
        };
        let foreign_processes = processes
            .into_iter()
            .filter(|process| !is_knob_process(process.pid))
            .map(|process| GpuProcess {
                pid: process.pid,
                used_memory: match process.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(ByteSize(bytes)),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect();
        Ok(Gpu {
            index,
            uuid,
            name,
            memory_total: ByteSize(memory.total),
            memory_used: ByteSize(memory.used),
            memory_free: ByteSize(memory.free),
            utilization_percent,
            foreign_processes,
            trials: Vec::new(),
            held_elsewhere: Vec::new(),
        })
    }
}

impl NvmlProbe {
    /// Every compute process NVML lists now, with the index of its GPU (a process on two GPUs
    /// is listed once for each). A GPU or list that cannot be read is left out: what a trial
    /// used there is then unknown, which is no reason to fail it.
    pub fn compute_processes_by_gpu(&self) -> Vec<(u32, GpuProcess)> {
        let count = self.nvml.device_count().unwrap_or(0);
        let mut listed = Vec::new();
        for index in 0..count {
            let Ok(device) = self.nvml.device_by_index(index) else {
                continue;
            };
            let Ok(processes) = compute_processes(&device) else {
                continue;
            };
            listed.extend(processes.into_iter().map(|process| {
                (
                    index,
                    GpuProcess {
                        pid: process.pid,
                        used_memory: match process.used_gpu_memory {
                            UsedGpuMemory::Used(bytes) => Some(ByteSize(bytes)),
                            UsedGpuMemory::Unavailable => None,
                        },
                    },
                )
            }));
        }
        listed
    }
}

/// The GPU memory a trial whose processes are `pids` uses now, from the compute processes of
/// [`NvmlProbe::compute_processes_by_gpu`]: per GPU the sum of its processes' memory, and of
/// its GPUs the largest (a request, `trialGpuMemory`, is per GPU). `None` when none of its
/// processes is listed with a known amount: not using a GPU and NVML not saying (in a container
/// NVML may list host pids, which match none of the trial's) read alike, as unknown.
pub fn trial_gpu_memory(pids: &[u32], processes: &[(u32, GpuProcess)]) -> Option<ByteSize> {
    let mut per_gpu: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    for (gpu, process) in processes {
        if let (true, Some(used)) = (pids.contains(&process.pid), process.used_memory) {
            *per_gpu.entry(*gpu).or_default() += used.0;
        }
    }
    per_gpu.into_values().max().map(ByteSize)
}

/// The current call first, then the pre-510-driver one, which lacks newer fields but lists the
/// same processes.
fn compute_processes(device: &Device) -> Result<Vec<ProcessInfo>, NvmlError> {
    match device.running_compute_processes() {
        Err(NvmlError::FailedToLoadSymbol(_)) => device.running_compute_processes_v2(),
        other => other,
    }
}

/// Turns NVML's error into the reason a user reads, for the usual ways it fails on a machine.
fn classify(error: NvmlError, what: &str) -> GpuProbeError {
    match error {
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => {
            GpuProbeError::LibraryNotFound {
                library: NVML_LIBRARY.to_owned(),
            }
        }
        NvmlError::DriverNotLoaded => GpuProbeError::DriverNotLoaded,
        NvmlError::NoPermission => GpuProbeError::NoPermission,
        NvmlError::LibRmVersionMismatch => GpuProbeError::DriverVersionMismatch,
        NvmlError::FailedToLoadSymbol(detail) => GpuProbeError::DriverTooOld {
            detail: format!("reading {what}: {detail}"),
        },
        NvmlError::FunctionNotFound => GpuProbeError::DriverTooOld {
            detail: format!("reading {what}: function not found"),
        },
        other => GpuProbeError::Query {
            what: what.to_owned(),
            detail: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn process(gpu: u32, pid: u32, mib: Option<u64>) -> (u32, GpuProcess) {
        (
            gpu,
            GpuProcess {
                pid,
                used_memory: mib.map(|m| ByteSize(m * MIB)),
            },
        )
    }

    #[test]
    fn a_trials_gpu_memory_is_its_processes_sum_on_its_fullest_gpu() {
        let listed = [
            process(0, 10, Some(300)),
            process(0, 11, Some(200)),
            process(1, 10, Some(700)),
            // Another experiment's process on the same GPU is not the trial's.
            process(0, 99, Some(5000)),
        ];
        // GPU 0: 300 + 200; GPU 1: 700.
        assert_eq!(
            trial_gpu_memory(&[10, 11], &listed),
            Some(ByteSize(700 * MIB))
        );
        assert_eq!(trial_gpu_memory(&[11], &listed), Some(ByteSize(200 * MIB)));
    }

    #[test]
    fn no_listed_process_or_no_amount_is_unknown() {
        assert_eq!(trial_gpu_memory(&[10], &[]), None);
        assert_eq!(trial_gpu_memory(&[], &[process(0, 10, Some(1))]), None);
        assert_eq!(trial_gpu_memory(&[10], &[process(0, 11, Some(1))]), None);
        // The driver does not say (some containers): unknown, not 0.
        assert_eq!(trial_gpu_memory(&[10], &[process(0, 10, None)]), None);
        // A known amount on one GPU is enough.
        assert_eq!(
            trial_gpu_memory(&[10], &[process(0, 10, None), process(1, 10, Some(64))]),
            Some(ByteSize(64 * MIB))
        );
    }
}
