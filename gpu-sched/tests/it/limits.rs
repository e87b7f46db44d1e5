//! The admission limits of a shared machine (`maxCpuUtilization`, `maxMemoryUtilization`,
//! `memoryReserve`, `maxGpuMemoryUtilization`, `gpuMemoryReserve`, `maxTrialNumberPerGpu`):
//! each one holds a trial back from the live probe plus what knob holds, and the waiting or
//! rejection reason names the limit.

use expect_test::expect;
use knob_gpu_sched::{ByteSize, DeviceRef, EnvironmentLimits, Placement, SchedulerConfig, TrialId};

use crate::support::{env, host, limits, place, scheduler_with, trial, with_foreign};

fn gpu_config(gpu_memory_gib: Option<u64>) -> SchedulerConfig {
    SchedulerConfig {
        trial_gpu_number: Some(1),
        trial_gpu_memory: gpu_memory_gib.map(ByteSize::gib),
        ..SchedulerConfig::default()
    }
}

fn host_config(memory_gib: u64) -> SchedulerConfig {
    SchedulerConfig {
        trial_gpu_number: Some(0),
        trial_memory_size: Some(ByteSize::gib(memory_gib)),
        ..SchedulerConfig::default()
    }
}

#[test]
fn max_cpu_utilization_holds_trials_while_the_host_is_busy_and_admits_them_once_it_calms() {
    let mut busy = env("local", &[80]);
    busy.limits.max_cpu_utilization = Some(80.0);
    busy.host_resources.cpu_utilization_percent = Some(85.0);
    let mut scheduler = scheduler_with(gpu_config(None), vec![busy.clone()]);
    expect![[r#"
        a: wait: waiting for 1 GPU: local: CPU at 85% (maxCpuUtilization 80%)
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
    busy.host_resources.cpu_utilization_percent = Some(40.0);
    scheduler.upsert_environment(busy).unwrap();
    expect![[r#"
        a: local [0]
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
}

#[test]
fn max_cpu_utilization_holds_trials_while_cpu_use_is_not_measured_yet() {
    // A probe's first sample has no CPU figure: a host whose use is unknown is not one known to
    // be below the limit (H2 F4, H3 F6). Without the limit the unknown figure holds nothing.
    let mut unmeasured = env("local", &[]);
    unmeasured.host_resources.cpu_utilization_percent = None;
    let mut scheduler = scheduler_with(SchedulerConfig::default(), vec![unmeasured.clone()]);
    expect![[r#"
        a: local (GPUs unmanaged)
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
    unmeasured.limits.max_cpu_utilization = Some(90.0);
    let mut scheduler = scheduler_with(SchedulerConfig::default(), vec![unmeasured.clone()]);
    expect![[r#"
        a: wait: waiting to start: local: CPU use not measured yet (maxCpuUtilization 90%)
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
    unmeasured.host_resources.cpu_utilization_percent = Some(20.0);
    scheduler.upsert_environment(unmeasured).unwrap();
    expect![[r#"
        a: local (GPUs unmanaged)
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
}

#[test]
fn a_reserve_as_large_as_the_machine_is_a_rejection_advising_to_lower_the_reserve() {
    // H2 F2/F3, H3 F7: a reserve that leaves nothing admits no trial, whatever it asks; the
    // advice names the reserve, since no request could fit ("lower trialGpuMemory to 0 B" can
    // not be followed).
    let check = |limits: EnvironmentLimits, config: SchedulerConfig| {
        let mut machine = env("local", &[80]);
        machine.limits = limits;
        let mut scheduler = scheduler_with(config, vec![machine]);
        place(&mut scheduler, &[trial("a")])
    };
    let gpu_reserve = EnvironmentLimits {
        gpu_memory_reserve: Some(ByteSize::gib(81)),
        ..limits()
    };
    expect![[r#"
        a: reject: the trial asks for 1 GPU, but the largest environment, local, has 0 GPUs with memory left by the limits (its GPUs have up to 80 GiB, of which gpuMemoryReserve 81 GiB leave up to 0 B): lower gpuMemoryReserve below 80 GiB
    "#]]
    .assert_eq(&check(gpu_reserve.clone(), gpu_config(None)));
    expect![[r#"
        a: reject: the trial asks for 1 GPU with 1 GiB, but the largest environment, local, has 0 GPUs with 1 GiB or more (its GPUs have up to 80 GiB, of which gpuMemoryReserve 81 GiB leave up to 0 B): lower gpuMemoryReserve to 79 GiB or less
    "#]]
    .assert_eq(&check(gpu_reserve.clone(), gpu_config(Some(1))));
    let device = SchedulerConfig {
        trial_gpu_number: None,
        ..SchedulerConfig::default()
    };
    let mut machine = env("local", &[80]);
    machine.limits = gpu_reserve;
    let mut scheduler = scheduler_with(device, vec![machine]);
    let on_gpu_0 = trial("a").devices([DeviceRef::new("local", 0)]);
    expect![[r#"
        a: reject: the trial asks for GPU 0 on local, but GPU 0 on local has 80 GiB, of which gpuMemoryReserve 81 GiB leave 0 B: lower gpuMemoryReserve below 80 GiB
    "#]]
    .assert_eq(&place(&mut scheduler, &[on_gpu_0]));
    let host_reserve = EnvironmentLimits {
        min_available_memory: Some(ByteSize::gib(100)),
        ..limits()
    };
    expect![[r#"
        a: reject: the trial asks for no GPU, but the largest environment, local, has 64 GiB of memory and keeps 100 GiB free (memoryReserve): lower memoryReserve below 64 GiB
    "#]]
    .assert_eq(&check(host_reserve.clone(), SchedulerConfig::default()));
    expect![[r#"
        a: reject: the trial asks for 8 GiB of host memory, but the largest environment, local, has 64 GiB of memory and keeps 100 GiB free (memoryReserve): lower memoryReserve to 56 GiB or less
    "#]]
    .assert_eq(&check(host_reserve, host_config(8)));
    // A reserve below the machine's size still leaves trials room: they wait, not refused.
    let mut busy = env("local", &[]);
    busy.host_resources.memory_available = ByteSize::gib(4);
    busy.limits.min_available_memory = Some(ByteSize::gib(8));
    let mut scheduler = scheduler_with(SchedulerConfig::default(), vec![busy]);
    expect![[r#"
        a: wait: waiting to start: local: 4 GiB of memory available (memoryReserve 8 GiB kept free)
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
}

#[test]
fn max_memory_utilization_counts_the_requests_held() {
    // 64 GiB host at most 75% used (48 GiB): two 20 GiB trials fit, a third would make 60 GiB.
    let mut shared = env("local", &[]);
    shared.host_resources = host(16, 64);
    shared.limits.max_memory_utilization = Some(75.0);
    let mut scheduler = scheduler_with(host_config(20), vec![shared]);
    expect![[r#"
        a: local []
        b: local []
        c: wait: waiting for 20 GiB of host memory: local: host memory 62% used, 94% with the trial's 20 GiB (maxMemoryUtilization 75%)
    "#]]
    .assert_eq(&place(
        &mut scheduler,
        &[trial("a"), trial("b"), trial("c")],
    ));
    scheduler.release(&TrialId::from("a"));
    expect![[r#"
        c: local []
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("c")]));
}

#[test]
fn max_memory_utilization_holds_even_trials_that_ask_for_no_memory() {
    let mut full = env("local", &[80]);
    full.host_resources.memory_available = ByteSize::gib(4);
    full.limits.max_memory_utilization = Some(90.0);
    let mut scheduler = scheduler_with(gpu_config(None), vec![full]);
    expect![[r#"
        a: wait: waiting for 1 GPU: local: host memory 94% used (maxMemoryUtilization 90%)
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
}

#[test]
fn max_memory_utilization_too_low_for_any_trial_is_a_rejection_naming_it() {
    let mut small = env("local", &[]);
    small.limits.max_memory_utilization = Some(25.0);
    let mut scheduler = scheduler_with(host_config(20), vec![small]);
    expect![[r#"
        a: reject: the trial asks for 20 GiB of host memory, but the largest environment, local, has 64 GiB of memory and lets 25% be used (maxMemoryUtilization): lower trialMemorySize to 16 GiB or less
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
}

#[test]
fn memory_reserve_keeps_host_memory_free_after_the_request() {
    let mut reserved = env("local", &[]);
    reserved.limits.min_available_memory = Some(ByteSize::gib(10));
    let mut scheduler = scheduler_with(host_config(20), vec![reserved]);
    expect![[r#"
        a: local []
        b: local []
        c: wait: waiting for 20 GiB of host memory: local: 24 GiB of memory available (memoryReserve 10 GiB kept free)
    "#]]
    .assert_eq(&place(
        &mut scheduler,
        &[trial("a"), trial("b"), trial("c")],
    ));
}

#[test]
fn memory_reserve_larger_than_what_a_trial_could_get_is_a_rejection_naming_it() {
    let mut reserved = env("local", &[]);
    reserved.limits.min_available_memory = Some(ByteSize::gib(60));
    let mut scheduler = scheduler_with(host_config(8), vec![reserved]);
    expect![[r#"
        a: reject: the trial asks for 8 GiB of host memory, but the largest environment, local, has 64 GiB of memory and keeps 60 GiB free (memoryReserve): lower trialMemorySize to 4 GiB or less
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
}

#[test]
fn max_gpu_memory_utilization_counts_what_is_used_and_what_trials_hold() {
    // 80 GiB GPUs at most 50% used: a 30 GiB trial fits an idle one; a second would make 60 GiB
    // on the same GPU, so with two trials allowed per GPU it goes to the other one, and a third
    // waits. GPU 1 also has 10 GiB used by a process knob did not start.
    let mut shared = with_foreign(env("local", &[80, 80]), 1, 4242, 10);
    shared.limits = EnvironmentLimits {
        max_trial_number_per_gpu: 2,
        max_gpu_memory_utilization: Some(50.0),
        use_active_gpu: true,
        ..limits()
    };
    let mut scheduler = scheduler_with(gpu_config(Some(30)), vec![shared]);
    expect![[r#"
        a: local [0]
        b: local [1]
        c: wait: waiting for 1 GPU with 30 GiB: local: no GPU free (GPU 0 memory 38% used, 75% with the trial's 30 GiB (maxGpuMemoryUtilization 50%), GPU 1 memory 50% used, 88% with the trial's 30 GiB (maxGpuMemoryUtilization 50%))
    "#]]
    .assert_eq(&place(
        &mut scheduler,
        &[trial("a"), trial("b"), trial("c")],
    ));
}

#[test]
fn a_gpu_over_its_memory_utilization_takes_no_trial_even_one_asking_for_no_memory() {
    let mut hot = env("local", &[80, 80]);
    hot.gpus[0].memory_used = ByteSize::gib(70);
    hot.gpus[0].memory_free = ByteSize::gib(10);
    hot.limits.max_gpu_memory_utilization = Some(80.0);
    let mut scheduler = scheduler_with(gpu_config(None), vec![hot]);
    expect![[r#"
        a: local [1]
        b: wait: waiting for 1 GPU: local: no GPU free (GPU 0 memory 88% used (maxGpuMemoryUtilization 80%), GPU 1 runs a)
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a"), trial("b")]));
}

#[test]
fn gpu_memory_reserve_keeps_memory_free_on_each_gpu() {
    // 24 GiB GPUs keeping 4 GiB free: two 10 GiB trials share one, a third does not fit.
    let mut shared = env("local", &[24]);
    shared.limits = EnvironmentLimits {
        max_trial_number_per_gpu: 3,
        gpu_memory_reserve: Some(ByteSize::gib(4)),
        ..limits()
    };
    let mut scheduler = scheduler_with(gpu_config(Some(10)), vec![shared]);
    expect![[r#"
        a: local [0]
        b: local [0]
        c: wait: waiting for 1 GPU with 10 GiB: local: no GPU free (GPU 0 has 4 GiB free (gpuMemoryReserve 4 GiB kept free))
    "#]]
    .assert_eq(&place(
        &mut scheduler,
        &[trial("a"), trial("b"), trial("c")],
    ));
}

#[test]
fn gpu_memory_limits_that_leave_too_little_are_a_rejection_naming_them() {
    let mut small = env("local", &[24, 24]);
    small.limits.gpu_memory_reserve = Some(ByteSize::gib(8));
    small.limits.max_gpu_memory_utilization = Some(50.0);
    let mut scheduler = scheduler_with(gpu_config(Some(16)), vec![small]);
    expect![[r#"
        a: reject: the trial asks for 1 GPU with 16 GiB, but the largest environment, local, has 0 GPUs with 16 GiB or more (its GPUs have up to 24 GiB, of which gpuMemoryReserve 8 GiB and maxGpuMemoryUtilization 50% leave up to 12 GiB): lower trialGpuMemory to 12 GiB or less
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
}

#[test]
fn the_largest_gpu_capacity_is_what_the_limits_leave_of_the_largest_allowed_gpu() {
    let mut limited = env("limited", &[24, 80]);
    limited.limits.gpu_memory_reserve = Some(ByteSize::gib(8));
    limited.limits.gpu_indices = Some(vec![0]);
    let other = env("other", &[16]);
    let mut scheduler = scheduler_with(gpu_config(Some(1)), vec![limited, other]);
    // GPU 1 (80 GiB) is not in gpuIndices; GPU 0 keeps 8 of its 24 GiB free.
    assert_eq!(scheduler.largest_gpu_capacity(), Some(ByteSize::gib(16)));
    // Trials placed do not change what a GPU could ever be promised.
    place(&mut scheduler, &[trial("a")]);
    assert_eq!(scheduler.largest_gpu_capacity(), Some(ByteSize::gib(16)));
    let none = scheduler_with(host_config(1), vec![env("cpu", &[])]);
    assert_eq!(none.largest_gpu_capacity(), None);
}

#[test]
fn the_largest_host_memory_room_is_what_the_limits_leave_of_the_memory_measured_available() {
    // 64 GiB, 40 GiB available, 8 GiB kept free: a trial could be placed with 32 GiB, though
    // up to 56 GiB could be promised with nothing else on the host.
    let mut reserved = env("reserved", &[]);
    reserved.host_resources.memory_available = ByteSize::gib(40);
    reserved.limits.min_available_memory = Some(ByteSize::gib(8));
    let mut small = env("small", &[]);
    small.host_resources = host(4, 24);
    let mut scheduler = scheduler_with(host_config(1), vec![reserved, small]);
    assert_eq!(
        scheduler.largest_host_memory_capacity(),
        Some(ByteSize::gib(56))
    );
    assert_eq!(
        scheduler.largest_host_memory_room(),
        Some(ByteSize::gib(32))
    );
    // Knob's own claims aside: a trial placed does not lower it.
    place(&mut scheduler, &[trial("a")]);
    assert_eq!(
        scheduler.largest_host_memory_room(),
        Some(ByteSize::gib(32))
    );
}

#[test]
fn max_trial_number_per_gpu_bounds_the_trials_sharing_a_gpu() {
    let mut shared = env("local", &[80]);
    shared.limits.max_trial_number_per_gpu = 2;
    let mut scheduler = scheduler_with(gpu_config(None), vec![shared]);
    expect![[r#"
        a: local [0]
        b: local [0]
        c: wait: waiting for 1 GPU: local: no GPU free (GPU 0 runs a, b (2 per GPU))
    "#]]
    .assert_eq(&place(
        &mut scheduler,
        &[trial("a"), trial("b"), trial("c")],
    ));
}

#[test]
fn a_utilization_limit_out_of_range_is_refused_naming_the_limit() {
    for (name, set) in [
        (
            "maxMemoryUtilization",
            (|limits: &mut EnvironmentLimits| limits.max_memory_utilization = Some(0.0))
                as fn(&mut EnvironmentLimits),
        ),
        ("maxGpuMemoryUtilization", |limits| {
            limits.max_gpu_memory_utilization = Some(120.0)
        }),
    ] {
        let mut bad = env("local", &[80]);
        set(&mut bad.limits);
        let mut scheduler = scheduler_with(gpu_config(None), Vec::new());
        let error = scheduler.upsert_environment(bad).unwrap_err().to_string();
        assert!(error.contains(name), "{error}");
    }
}

#[test]
fn limits_survive_a_reprobe_with_trials_placed() {
    // The reserve is checked against the new probe plus the held assignment: after a probe
    // shows the first trial really using its memory, the second still does not fit.
    let mut reserved = env("local", &[24]);
    reserved.limits = EnvironmentLimits {
        max_trial_number_per_gpu: 2,
        gpu_memory_reserve: Some(ByteSize::gib(8)),
        ..limits()
    };
    let mut scheduler = scheduler_with(gpu_config(Some(10)), vec![reserved.clone()]);
    assert!(scheduler.place(&trial("a")).is_succeed());
    reserved.gpus[0].memory_used = ByteSize::gib(10);
    reserved.gpus[0].memory_free = ByteSize::gib(14);
    scheduler.upsert_environment(reserved).unwrap();
    let placement = scheduler.place(&trial("b"));
    assert!(
        matches!(&placement, Placement::TmpNoAvailableGpu { reason } if reason.contains("gpuMemoryReserve")),
        "{placement:?}"
    );
}
