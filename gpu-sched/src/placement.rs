//! What the scheduler answers, and what it remembers about each placed trial.

use serde::{Deserialize, Serialize};

use crate::bytes::ByteSize;
use crate::inventory::{EnvironmentId, TrialId};

/// The answer for one waiting trial (NNI's `ScheduleResultType`, with reasons).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum Placement {
    /// Start the trial on `environment`. The GPUs are held for it until
    /// [`Scheduler::release`](crate::Scheduler::release).
    Succeed {
        environment: EnvironmentId,
        /// The GPU indices to expose; `Some(vec![])` for a trial that asked for 0 GPUs
        /// (`CUDA_VISIBLE_DEVICES=""`); `None` when `trialGpuNumber` is unset and knob does not
        /// manage the trial's GPUs (leave `CUDA_VISIBLE_DEVICES` untouched).
        gpu_indices: Option<Vec<u32>>,
    },
    /// No environment could ever satisfy the request: fail the trial (or `knob create`) now.
    /// The reason names the largest environment and what to change.
    RequireExceedTotal { reason: String },
    /// Not now: keep the trial waiting. The reason says what is busy.
    TmpNoAvailableGpu { reason: String },
}

impl Placement {
    pub fn is_succeed(&self) -> bool {
        matches!(self, Placement::Succeed { .. })
    }

    /// The reason for a rejected or waiting trial, `None` for a placed one.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Placement::Succeed { .. } => None,
            Placement::RequireExceedTotal { reason } | Placement::TmpNoAvailableGpu { reason } => {
                Some(reason)
            }
        }
    }
}

/// A placed trial's hold on its environment, kept until it is released.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub trial: TrialId,
    pub environment: EnvironmentId,
    /// As in [`Placement::Succeed`].
    pub gpu_indices: Option<Vec<u32>>,
    /// GPU memory declared on each assigned GPU.
    pub gpu_memory: ByteSize,
    pub host_memory: ByteSize,
    pub cpu_cores: u32,
}

impl Assignment {
    /// The value for `CUDA_VISIBLE_DEVICES`: `"0,2"`, `""` for no GPU, `None` to leave it unset.
    pub fn cuda_visible_devices(&self) -> Option<String> {
        self.gpu_indices.as_deref().map(visible_devices)
    }

    /// The variables a training service sets for the trial's process ([`cuda_environment`]).
    pub fn cuda_environment(&self) -> Vec<(&'static str, String)> {
        cuda_environment(self.gpu_indices.as_deref())
    }
}

/// The variables a trial placed on `gpu_indices` gets: none when knob does not manage its GPUs
/// (`None`), else `CUDA_VISIBLE_DEVICES` (`"0,2"`, `""` for no GPU). The indices are NVML's,
/// which follow PCI bus order, while CUDA by default numbers devices fastest-first; setting
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes CUDA agree with NVML on machines with mixed GPUs, where
/// the trial would otherwise run on a GPU placed for another trial.
pub fn cuda_environment(gpu_indices: Option<&[u32]>) -> Vec<(&'static str, String)> {
    match gpu_indices {
        None => Vec::new(),
        Some(indices) => vec![
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_owned()),
            ("CUDA_VISIBLE_DEVICES", visible_devices(indices)),
        ],
    }
}

fn visible_devices(indices: &[u32]) -> String {
    indices
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
