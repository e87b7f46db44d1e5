//! GPU and resource placement for the manager: the local machine probed once at start, and
//! gpu-sched deciding which waiting trial runs where.

use knob_gpu_sched::probe::LocalProbe;
use knob_gpu_sched::{
    ByteSize, EnvironmentLimits, Placement, Scheduler, SchedulerConfig, TrialId, TrialRequest,
};

use crate::config::{ExperimentConfig, TrainingServiceConfig};

const MIB: u64 = 1024 * 1024;

/// Owns the scheduler for one experiment.
pub struct Placer {
    scheduler: Scheduler,
    probe: LocalProbe,
    limits: EnvironmentLimits,
    request_template: TrialRequest,
}

impl Placer {
    /// Probes this machine (NVML, or `KNOB_SIMULATE_GPUS`) and checks that a trial of this
    /// config could ever be placed. The error is one line saying why not (for example that
    /// there is no NVIDIA driver while `trialGpuNumber` is 1).
    pub fn for_local(config: &ExperimentConfig) -> Result<Placer, String> {
        let limits = match config.training_service.as_slice() {
            [TrainingServiceConfig::Local(local)] => EnvironmentLimits {
                gpu_indices: local.gpu_indices.clone(),
                max_trial_number_per_gpu: local.max_trial_number_per_gpu.max(1),
                use_active_gpu: local.use_active_gpu,
                ..EnvironmentLimits::default()
            },
            _ => EnvironmentLimits::default(),
        };
        let scheduler = Scheduler::new(SchedulerConfig {
            trial_gpu_number: config.trial_gpu_number,
            trial_gpu_memory: config.trial_gpu_memory_mib.map(|mib| ByteSize(mib * MIB)),
            trial_memory_size: config.trial_memory_size_mib.map(|mib| ByteSize(mib * MIB)),
            trial_cpu_number: config.trial_cpu_number,
            policy: config.placement_policy,
        });
        let probe = LocalProbe::new("local").map_err(|e| e.to_string())?;
        let request_template = TrialRequest::new("template");
        let mut placer = Placer {
            scheduler,
            probe,
            limits,
            request_template,
        };
        placer.refresh(&|_| false)?;
        placer.scheduler.check_request(&placer.request_template)?;
        Ok(placer)
    }

    /// Probes the machine again (GPU memory and processes, CPU, memory). `is_trial_process`
    /// tells which GPU processes belong to this experiment's trials, which are not foreign.
    pub fn refresh(&mut self, is_trial_process: &dyn Fn(u32) -> bool) -> Result<(), String> {
        for environment in self.probe.sample(is_trial_process) {
            self.scheduler
                .upsert_environment(environment.with_limits(self.limits.clone()))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Places waiting trials, oldest first; returns each one's placement.
    pub fn place(&mut self, waiting: &[String]) -> Vec<Placement> {
        let requests: Vec<TrialRequest> = waiting
            .iter()
            .map(|id| TrialRequest {
                trial: id.as_str().into(),
                ..self.request_template.clone()
            })
            .collect();
        self.scheduler.place_queue(&requests)
    }

    /// Frees what a trial held; call once its process group is gone.
    pub fn release(&mut self, trial_id: &str) {
        self.scheduler.release(&TrialId::from(trial_id));
    }
}
