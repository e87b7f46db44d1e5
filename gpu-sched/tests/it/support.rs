//! Builders for inventories and a text rendering of placements for `expect!` checks.

use std::fmt::Write;

use knob_gpu_sched::probe::SimulatedInventory;
use knob_gpu_sched::{
    ByteSize, Environment, EnvironmentLimits, Gpu, GpuProcess, HostResources, Placement, Policy,
    Scheduler, SchedulerConfig, TrialRequest,
};

/// An idle environment with GPUs of the given sizes in GiB, 16 cores and 64 GiB of memory.
pub fn env(id: &str, gpu_gib: &[u64]) -> Environment {
    let gpus = gpu_gib
        .iter()
        .zip(0u32..)
        .map(|(&gib, index)| Gpu::idle(index, "Test GPU", ByteSize::gib(gib)))
        .collect();
    Environment::new(id, id, gpus, host(16, 64))
}

pub fn host(cpu_count: u32, memory_gib: u64) -> HostResources {
    HostResources {
        cpu_count,
        cpu_utilization_percent: Some(10.0),
        memory_total: ByteSize::gib(memory_gib),
        memory_available: ByteSize::gib(memory_gib),
    }
}

/// `count` identical environments `node0`, `node1`, … with `gpus` GPUs of 80 GiB each.
pub fn cluster(count: usize, gpus: usize) -> Vec<Environment> {
    (0..count)
        .map(|node| env(&format!("node{node}"), &vec![80; gpus]))
        .collect()
}

/// The environment from a `KNOB_SIMULATE_GPUS`-style spec, as tests see it everywhere.
pub fn simulated(spec: &str) -> Vec<Environment> {
    SimulatedInventory::parse(spec)
        .expect("test spec parses")
        .environments("local", None)
}

pub fn limits() -> EnvironmentLimits {
    EnvironmentLimits::default()
}

/// Puts a foreign process on a GPU, using `gib` of its memory.
pub fn with_foreign(mut env: Environment, index: u32, pid: u32, gib: u64) -> Environment {
    let gpu = env
        .gpus
        .iter_mut()
        .find(|gpu| gpu.index == index)
        .expect("GPU exists");
    gpu.foreign_processes.push(GpuProcess {
        pid,
        used_memory: Some(ByteSize::gib(gib)),
    });
    gpu.memory_used = ByteSize(gpu.memory_used.bytes() + ByteSize::gib(gib).bytes());
    gpu.memory_free = ByteSize(gpu.memory_free.bytes() - ByteSize::gib(gib).bytes());
    env
}

pub fn scheduler(policy: Policy, envs: Vec<Environment>) -> Scheduler {
    scheduler_with(
        SchedulerConfig {
            trial_gpu_number: Some(1),
            policy,
            ..SchedulerConfig::default()
        },
        envs,
    )
}

pub fn scheduler_with(config: SchedulerConfig, envs: Vec<Environment>) -> Scheduler {
    let mut scheduler = Scheduler::new(config);
    for env in envs {
        scheduler
            .upsert_environment(env)
            .expect("valid environment");
    }
    scheduler
}

pub fn trial(id: &str) -> TrialRequest {
    TrialRequest::new(id)
}

/// One line per placement: `t1: local [0, 1]`, `t2: wait: …`, `t3: reject: …`.
pub fn render(requests: &[TrialRequest], placements: &[Placement]) -> String {
    let mut text = String::new();
    for (request, placement) in requests.iter().zip(placements) {
        match placement {
            Placement::Succeed {
                environment,
                gpu_indices: Some(indices),
            } => writeln!(text, "{}: {environment} {indices:?}", request.trial),
            Placement::Succeed {
                environment,
                gpu_indices: None,
            } => writeln!(text, "{}: {environment} (GPUs unmanaged)", request.trial),
            Placement::RequireExceedTotal { reason } => {
                writeln!(text, "{}: reject: {reason}", request.trial)
            }
            Placement::TmpNoAvailableGpu { reason } => {
                writeln!(text, "{}: wait: {reason}", request.trial)
            }
        }
        .unwrap();
    }
    text
}

/// Places the queue and renders it.
pub fn place(scheduler: &mut Scheduler, requests: &[TrialRequest]) -> String {
    let placements = scheduler.place_queue(requests);
    render(requests, &placements)
}

/// Places trials one at a time (each as its own queue) and renders them.
pub fn place_each(scheduler: &mut Scheduler, requests: &[TrialRequest]) -> String {
    let placements: Vec<Placement> = requests
        .iter()
        .map(|request| scheduler.place(request))
        .collect();
    render(requests, &placements)
}
