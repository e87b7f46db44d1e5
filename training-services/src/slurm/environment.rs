//! What the core sees of the service's jobs: gpu-sched environments with their inventories.

use std::path::Path;

use knob_plugin_api::service::Environment;
use serde_json::Value;

use super::{script, Job, Phase, SlurmArgs, QUEUE_ENVIRONMENT};

/// The environment of `reuseMode: false`: room for `jobs` (`trialConcurrency`) jobs, each with what it
/// asks Slurm for (GPUs declared so that gpu-sched lets GPU trials through; the job's own
/// `CUDA_VISIBLE_DEVICES` is Slurm's). `retired` once no job of the config can ever run
/// (`Shared::never`): the core then starts no trial there and, with nothing else left, ends
/// the experiment with the service's line.
pub(super) fn queue_environment(args: &SlurmArgs, jobs: u32, retired: bool) -> Environment {
    let status = match retired {
        true => knob_gpu_sched::EnvironmentStatus::Draining,
        false => knob_gpu_sched::EnvironmentStatus::Ready,
    };
    // A trialConcurrency raised while the experiment runs is not checked as the config's was
    // (`args::MOST_ENVIRONMENT_GPUS`): the GPUs declared stay within that bound.
    let jobs = match args.job.gpu_number {
        0 => jobs,
        per_job => jobs
            .min((super::args::MOST_ENVIRONMENT_GPUS / u64::from(per_job)) as u32)
            .max(1),
    };
    let mut inventory = requested(args, QUEUE_ENVIRONMENT, jobs, status);
    // Each job asks Slurm for its own trial's memory (`--mem`, raised after an out-of-memory
    // end), so the queue holds no fixed amount: `trialConcurrency` bounds the jobs, and Slurm
    // whether a job's memory fits a node. A fixed total would hold a raised request back forever.
    let unbounded = knob_gpu_sched::ByteSize(u64::MAX / 2);
    inventory.host_resources.memory_total = unbounded;
    inventory.host_resources.memory_available = unbounded;
    Environment {
        id: QUEUE_ENVIRONMENT.to_string(),
        host: "slurm".to_string(),
        ready: !retired,
        inventory: serde_json::to_value(inventory).unwrap_or(Value::Null),
    }
}

/// What `jobs` jobs ask Slurm for, as a gpu-sched inventory with `status`.
fn requested(
    args: &SlurmArgs,
    id: &str,
    jobs: u32,
    status: knob_gpu_sched::EnvironmentStatus,
) -> knob_gpu_sched::Environment {
    let gpus = (0..args.job.gpu_number.saturating_mul(jobs))
        .map(|index| {
            knob_gpu_sched::Gpu::idle(
                index,
                "GPU requested from Slurm",
                knob_gpu_sched::ByteSize(80 * 1024 * 1024 * 1024),
            )
        })
        .collect();
    // Saturating: these bound what fits, so a total past the type's range is as good as no bound
    // (the GPUs, one value each, are bounded by the config check: `MOST_ENVIRONMENT_GPUS`).
    let cpus = args.job.cpu_number.unwrap_or(1).saturating_mul(jobs);
    let memory = args
        .job
        .memory
        .map(|m| m.0.saturating_mul(u64::from(jobs)).min(u64::MAX / 2))
        .unwrap_or(u64::MAX / 2);
    let mut inventory = knob_gpu_sched::Environment::new(
        id,
        "slurm",
        gpus,
        knob_gpu_sched::HostResources {
            cpu_count: cpus,
            cpu_utilization_percent: None,
            memory_total: knob_gpu_sched::ByteSize(memory),
            memory_available: knob_gpu_sched::ByteSize(memory),
        },
    );
    inventory.status = status;
    inventory
}

/// An allocation as the core sees it: the agent's probe of the node with the allocation's
/// GPUs and CPUs, and its phase as gpu-sched's status.
///
/// Before its agent has probed the node (the job pending, or starting), the inventory is what
/// the job asks Slurm for, with the phase as its status: the core then counts the allocation as
/// one that will take trials, and a trial waiting for it says why (Slurm's pending reason). An
/// allocation that ended is `Draining` (retired), which the core no longer counts.
pub(super) fn job_environment(args: &SlurmArgs, job: &Job) -> Environment {
    let status = match &job.phase {
        // Retired: it takes no new trial, whether its agent's link is up, closed or back.
        _ if job.retired.is_some() => knob_gpu_sched::EnvironmentStatus::Draining,
        Phase::Ready => knob_gpu_sched::EnvironmentStatus::Ready,
        Phase::Draining => knob_gpu_sched::EnvironmentStatus::Draining,
        Phase::Queued(why) => knob_gpu_sched::EnvironmentStatus::Unavailable(why.clone()),
        Phase::Connecting => knob_gpu_sched::EnvironmentStatus::Starting,
        // Retired: it takes no trial again, and the core does not wait for it.
        Phase::Ended => knob_gpu_sched::EnvironmentStatus::Draining,
    };
    let inventory =
        match serde_json::from_value::<knob_gpu_sched::Environment>(job.inventory.clone()) {
            Ok(mut environment) => {
                environment.id = knob_gpu_sched::EnvironmentId(job.environment_id.clone());
                environment.status = status;
                crate::limits::copy(&args.limits, &mut environment.limits);
                let (gpus, cpus) = allocation_resources(&job.dir, job.id);
                if let Some(gpus) = gpus {
                    environment.limits.gpu_indices = Some(gpus);
                }
                if let Some(cpus) = cpus {
                    environment.host_resources.cpu_count = cpus;
                }
                // A trial that asks no CPU cores (no trialCpuNumber, as in NNI's configs) fits
                // anywhere, so every trial went into the first allocation, sharing its one core
                // while the others sat idle. It counts as one core here: the allocation was
                // sized for one trial of one core.
                if args.job.cpu_number.is_none() {
                    environment.limits.max_trials = Some(cpus.unwrap_or(1).max(1));
                }
                // The allocation has the node's memory only up to its `--mem`
                // (`trialMemorySize`): a trial whose request was raised beyond it after running
                // out of memory must not be placed here, where Slurm (or knob) would kill it
                // again at the allocation's limit; gpu-sched refuses it, naming the limit.
                if let Some(limit) = args.job.memory {
                    let host = &mut environment.host_resources;
                    host.memory_total = host.memory_total.min(limit);
                    host.memory_available = host.memory_available.min(limit);
                }
                serde_json::to_value(environment).unwrap_or(Value::Null)
            }
            // What it asked for while it has no probe of its own: an allocation that ended
            // before its agent came up is reported retired, with that inventory.
            Err(_) if job.phase != Phase::Ready => {
                serde_json::to_value(requested(args, &job.environment_id, 1, status))
                    .unwrap_or(Value::Null)
            }
            Err(_) => Value::Null,
        };
    Environment {
        id: job.environment_id.clone(),
        host: format!("slurm job {}", job.id),
        ready: job.phase == Phase::Ready && job.retired.is_none(),
        inventory,
    }
}

/// The GPUs (`SLURM_JOB_GPUS`) and CPUs of an allocation, from the file its script wrote.
fn allocation_resources(dir: &Path, job_id: u64) -> (Option<Vec<u32>>, Option<u32>) {
    let Ok(text) = std::fs::read_to_string(script::job_env_file(dir, job_id)) else {
        return (None, None);
    };
    let mut gpus = None;
    let mut cpus = None;
    for line in text.lines() {
        if let Some(list) = line.strip_prefix("SLURM_JOB_GPUS=") {
            let parsed: Option<Vec<u32>> = list.split(',').map(|g| g.trim().parse().ok()).collect();
            gpus = parsed.filter(|g| !g.is_empty());
        } else if let Some(count) = line.strip_prefix("SLURM_CPUS_ON_NODE=") {
            cpus = count.trim().parse().ok();
        }
    }
    (gpus, cpus)
}
