//! The three results and their reasons: fail fast with what to change, or wait saying what is
//! busy.

use expect_test::expect;
use knob_gpu_sched::{
    ByteSize, EnvironmentId, EnvironmentLimits, EnvironmentStatus, GpuSource, Placement, Policy,
    SchedulerConfig,
};

use crate::support::{cluster, env, limits, place, scheduler, scheduler_with, trial, with_foreign};

#[test]
fn no_driver_rejects_gpu_trials_with_the_probe_reason() {
    let mut no_gpu = env("local", &[]);
    no_gpu.gpu_source = GpuSource::Unavailable {
        reason: "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine"
            .to_owned(),
    };
    let scheduler = scheduler(Policy::RecentlyIdle, vec![no_gpu]);
    // What `knob create` checks before starting anything.
    let error = scheduler.check_request(&trial("any")).unwrap_err();
    expect![[r#"
        the trial asks for 1 GPU, but the largest environment, local, has no GPU (NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine): set trialGpuNumber to 0, or run on a machine with an NVIDIA GPU
    "#]]
    .assert_eq(&(error + "\n"));
    assert_eq!(
        scheduler.check_request(&trial("cpu-only").gpu_number(0)),
        Ok(())
    );
}

#[test]
fn gpu_indices_that_name_no_gpu_say_which_indices_there_are() {
    let mut elsewhere = env("local", &[80, 80]);
    elsewhere.limits.gpu_indices = Some(vec![5]);
    let scheduler = scheduler(Policy::RecentlyIdle, vec![elsewhere]);
    let error = scheduler.check_request(&trial("any")).unwrap_err();
    expect![[r#"
        the trial asks for 1 GPU, but the largest environment, local, has 2 GPUs of which gpuIndices allows 0: list GPUs it has (indices 0 to 1) in gpuIndices, or set trialGpuNumber to 0
    "#]]
    .assert_eq(&(error + "\n"));
}

#[test]
fn rejections_name_the_largest_environment_and_what_to_change() {
    let mut allowed = env("restricted", &[80; 8]);
    allowed.limits.gpu_indices = Some(vec![0, 1, 2, 3]);
    let mut cluster = scheduler(
        Policy::Pack,
        vec![
            env("small", &[24, 24]),
            allowed,
            env("mixed", &[80, 40, 40]),
        ],
    );
    let requests = [
        trial("too-many").gpu_number(6),
        trial("too-much-gpu-memory")
            .gpu_number(2)
            .gpu_memory(ByteSize::gib(90)),
        trial("too-much-memory").host_memory(ByteSize::gib(100)),
        trial("too-many-cores").cpu_cores(17),
    ];
    expect![[r#"
        too-many: reject: the trial asks for 6 GPUs, but the largest environment, restricted, has 8 GPUs of which gpuIndices allows 4: ask for 4 or fewer, or add an environment with 6 GPUs
        too-much-gpu-memory: reject: the trial asks for 2 GPUs with 90 GiB each, but the largest environment, restricted, has 0 GPUs with 90 GiB or more (its GPUs have up to 80 GiB): lower trialGpuMemory to 80 GiB or less
        too-much-memory: reject: the trial asks for 1 GPU and 100 GiB of host memory, but the largest environment, restricted, has 64 GiB of memory: lower trialMemorySize to 64 GiB or less
        too-many-cores: reject: the trial asks for 1 GPU and 17 CPU cores, but the largest environment, restricted, has 16 CPU cores: lower trialCpuNumber to 16 or less
    "#]]
    .assert_eq(&place(&mut cluster, &requests));

    // Only one GPU has 60 GiB: the advice is the most each of two GPUs can be promised.
    let mut mixed = scheduler(Policy::Pack, vec![env("mixed", &[80, 40, 40])]);
    let requests = [trial("two-large")
        .gpu_number(2)
        .gpu_memory(ByteSize::gib(60))];
    expect![[r#"
        two-large: reject: the trial asks for 2 GPUs with 60 GiB each, but the largest environment, mixed, has 1 GPU with 60 GiB or more (its GPUs have up to 80 GiB): lower trialGpuMemory to 40 GiB or less
    "#]]
    .assert_eq(&place(&mut mixed, &requests));
}

#[test]
fn the_memory_reserve_counts_against_the_largest_request() {
    let reserve = EnvironmentLimits {
        min_available_memory: Some(ByteSize::gib(16)),
        ..limits()
    };
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[80]).with_limits(reserve)]);
    expect![[r#"
        a: reject: the trial asks for 1 GPU and 50 GiB of host memory, but the largest environment, local, has 64 GiB of memory and keeps 16 GiB free (memoryReserve): lower trialMemorySize to 48 GiB or less
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a").host_memory(ByteSize::gib(50))]));
}

#[test]
fn waiting_reasons_say_what_is_busy() {
    let mut scheduler = scheduler(
        Policy::Pack,
        vec![with_foreign(env("local", &[80, 80, 80]), 2, 999, 5)],
    );
    let requests = [trial("t1"), trial("t2"), trial("pair").gpu_number(2)];
    expect![[r#"
        t1: local [0]
        t2: local [1]
        pair: wait: waiting for 2 GPUs: local: 0 of 2 GPUs free (GPU 0 runs t1, GPU 1 runs t2, GPU 2 runs foreign pid 999 using 5 GiB and useActiveGpu is off)
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn waiting_reasons_cover_many_environments_in_one_line() {
    let mut envs = cluster(6, 1);
    envs[1].status = EnvironmentStatus::Starting;
    envs[2].status = EnvironmentStatus::Unavailable("ssh: connection refused".to_owned());
    envs[3].status = EnvironmentStatus::Draining;
    let mut scheduler = scheduler(Policy::RoundRobin, envs);
    let requests: Vec<_> = (0..4).map(|n| trial(&format!("t{n}"))).collect();
    expect![[r#"
        t0: node0 [0]
        t1: node4 [0]
        t2: node5 [0]
        t3: wait: waiting for 1 GPU: node0: no GPU free (GPU 0 runs t0); node1: starting; node2: unavailable (ssh: connection refused); and 2 more environments
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn a_starting_environment_defers_rejection() {
    // Its resources are unknown until it is probed: it may be the one that fits.
    let mut starting = env("cluster-job", &[]);
    starting.status = EnvironmentStatus::Starting;
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[80]), starting]);
    let requests = [trial("big").gpu_number(4)];
    expect![[r#"
        big: wait: waiting for 4 GPUs: cluster-job: starting
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));

    let mut ready = env("cluster-job", &[80; 4]);
    ready.status = EnvironmentStatus::Ready;
    scheduler.upsert_environment(ready).unwrap();
    expect![[r#"
        big: cluster-job [0, 1, 2, 3]
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn an_unavailable_environment_still_counts_as_capacity() {
    let mut away = env("remote", &[80; 8]);
    away.status = EnvironmentStatus::Unavailable("agent restarting".to_owned());
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[80]), away]);
    let requests = [trial("big").gpu_number(8)];
    expect![[r#"
        big: wait: waiting for 8 GPUs: remote: unavailable (agent restarting)
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
    scheduler
        .set_environment_status(&EnvironmentId::from("remote"), EnvironmentStatus::Ready)
        .unwrap();
    assert!(scheduler.place(&requests[0]).is_succeed());
}

#[test]
fn draining_environments_take_nothing_and_do_not_count() {
    let mut old = env("old", &[80; 8]);
    old.status = EnvironmentStatus::Draining;
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[80, 80]), old]);
    let requests = [trial("big").gpu_number(8), trial("small")];
    expect![[r#"
        big: reject: the trial asks for 8 GPUs, but the largest environment, local, has 2 GPUs: ask for 2 or fewer, or add an environment with 8 GPUs
        small: local [0]
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));

    let mut only_draining = scheduler_with(SchedulerConfig::default(), Vec::new());
    let mut gone = env("old", &[80]);
    gone.status = EnvironmentStatus::Draining;
    only_draining.upsert_environment(gone).unwrap();
    expect![[r#"
        a: wait: waiting for 1 GPU: every environment is draining
    "#]]
    .assert_eq(&place(&mut only_draining, &[trial("a").gpu_number(1)]));
}

#[test]
fn an_empty_inventory_waits() {
    let mut scheduler = scheduler(Policy::Pack, Vec::new());
    expect![[r#"
        a: wait: waiting for 1 GPU: no environment is registered yet
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
}

#[test]
fn reasons_are_single_lines() {
    let mut scheduler = scheduler(Policy::Pack, cluster(10, 8));
    let everything: Vec<_> = (0..100).map(|n| trial(&format!("t{n}"))).collect();
    for placement in scheduler.place_queue(&everything) {
        if let Some(reason) = placement.reason() {
            assert!(!reason.contains('\n'), "{reason}");
            assert!(reason.len() < 600, "{} characters: {reason}", reason.len());
        }
    }
    let waiting = scheduler.place(&trial("late").gpu_number(8));
    assert!(matches!(waiting, Placement::TmpNoAvailableGpu { .. }));
    let reason = waiting.reason().unwrap();
    assert!(reason.contains("and 7 more environments"), "{reason}");
}

#[test]
fn the_environments_a_reason_counts_follow_the_inventory() {
    // The count is kept between passes; every change to the inventory must show in it.
    let mut scheduler = scheduler(Policy::Pack, cluster(10, 8));
    let everything: Vec<_> = (0..80).map(|n| trial(&format!("t{n}"))).collect();
    scheduler.place_queue(&everything);
    let more = |scheduler: &mut knob_gpu_sched::Scheduler| {
        let placement = scheduler.place(&trial("late"));
        let Some(reason) = placement.reason().map(str::to_owned) else {
            panic!("late is placed: {placement:?}");
        };
        reason
            .rsplit_once("; and ")
            .map_or_else(|| reason.clone(), |(_, more)| more.to_owned())
    };
    assert_eq!(more(&mut scheduler), "7 more environments");
    scheduler
        .set_environment_status(&EnvironmentId::from("node9"), EnvironmentStatus::Draining)
        .unwrap();
    assert_eq!(more(&mut scheduler), "6 more environments");
    scheduler
        .remove_environment(&EnvironmentId::from("node8"))
        .unwrap();
    assert_eq!(more(&mut scheduler), "5 more environments");
    // A probe that finds an environment too small for the request takes it out of the count.
    scheduler.upsert_environment(env("node7", &[])).unwrap();
    assert_eq!(more(&mut scheduler), "4 more environments");
    let mut starting = env("node8", &[80]);
    starting.status = EnvironmentStatus::Starting;
    scheduler.upsert_environment(starting).unwrap();
    assert_eq!(more(&mut scheduler), "5 more environments");
}

#[test]
fn preview_answers_without_holding_anything() {
    let mut scheduler = scheduler(Policy::RoundRobin, cluster(2, 1));
    let first = scheduler.preview(&trial("a"));
    assert_eq!(first, scheduler.preview(&trial("a")));
    assert!(scheduler.assignments().next().is_none());
    // Round-robin did not advance either: placing gives what preview showed.
    assert_eq!(scheduler.place(&trial("a")), first);
}

#[test]
fn cores_and_memory_held_by_unnamed_experiments_are_counted_as_theirs() {
    // From a service (an older agent) that sends what others hold without saying who.
    let mut shared = env("local", &[]);
    shared.host_held_elsewhere.cpu_cores = 14;
    shared.host_held_elsewhere.host_memory = ByteSize::gib(60);
    let mut scheduler = scheduler(Policy::Pack, vec![shared]);
    let requests = [trial("t")
        .gpu_number(0)
        .cpu_cores(4)
        .host_memory(ByteSize::gib(8))];
    expect![[r#"
        t: wait: waiting for 4 CPU cores and 8 GiB of host memory: local: 2 of 16 CPU cores free (14 cores held by other experiments), 4 GiB of memory available (60 GiB held by other experiments)
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}
