//! Inventories and queues for the gpu-sched benches.

use knob_gpu_sched::{
    ByteSize, DeviceRef, Environment, Gpu, HostResources, Policy, Scheduler, SchedulerConfig,
    TrialRequest,
};

/// `count` ready environments `node0`, `node1`, … with `gpus` idle 80 GiB GPUs each, 64 cores
/// and 512 GiB of memory.
pub fn environments(count: usize, gpus: usize) -> Vec<Environment> {
    (0..count)
        .map(|node| {
            let id = format!("node{node}");
            let gpus = (0..gpus as u32)
                .map(|index| Gpu::idle(index, "Bench GPU", ByteSize::gib(80)))
                .collect();
            let host = HostResources {
                cpu_count: 64,
                cpu_utilization_percent: Some(20.0),
                memory_total: ByteSize::gib(512),
                memory_available: ByteSize::gib(512),
            };
            Environment::new(id.clone(), id, gpus, host)
        })
        .collect()
}

/// A scheduler over idle environments, one GPU per trial by default.
pub fn idle_scheduler(count: usize, gpus: usize, policy: Policy) -> Scheduler {
    let mut scheduler = Scheduler::new(SchedulerConfig {
        trial_gpu_number: Some(1),
        policy,
        ..SchedulerConfig::default()
    });
    for env in environments(count, gpus) {
        scheduler
            .upsert_environment(env)
            .expect("bench environments are valid");
    }
    scheduler
}

/// Like [`idle_scheduler`], with the first half of every environment's GPUs running a trial:
/// every environment fits a 1-GPU request, so policies that score environments look at all.
pub fn half_busy_scheduler(count: usize, gpus: usize, policy: Policy) -> Scheduler {
    let mut scheduler = idle_scheduler(count, gpus, policy);
    for node in 0..count {
        for index in 0..(gpus / 2) as u32 {
            let request = TrialRequest::new(format!("busy-{node}-{index}"))
                .devices([DeviceRef::new(format!("node{node}"), index)]);
            assert!(scheduler.place(&request).is_succeed());
        }
    }
    scheduler
}

/// `len` waiting trials, every third asking for 2 GPUs, the rest for the default 1.
pub fn mixed_queue(len: usize) -> Vec<TrialRequest> {
    (0..len)
        .map(|n| {
            let request = TrialRequest::new(format!("w{n}"));
            if n % 3 == 2 {
                request.gpu_number(2)
            } else {
                request
            }
        })
        .collect()
}
