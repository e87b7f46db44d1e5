//! Every request shape and environment limit, over simulated inventories.

use expect_test::expect;
use knob_gpu_sched::{
    ByteSize, DeviceRef, EnvironmentLimits, Placement, Policy, SchedulerConfig, TrialId,
};

use crate::support::{
    env, host, limits, place, scheduler, scheduler_with, simulated, trial, with_foreign,
};

#[test]
fn a_request_for_every_gpu_of_a_machine_succeeds() {
    // NNI 3.0 rejects n == gpu count; a 4-GPU trial on a 4-GPU machine must run.
    let mut scheduler = scheduler(Policy::Pack, simulated("4x80GiB"));
    let requests = [trial("all").gpu_number(4), trial("one").gpu_number(1)];
    expect![[r#"
        all: local [0, 1, 2, 3]
        one: wait: waiting for 1 GPU: local: no GPU free (GPU 0 runs all, GPU 1 runs all, GPU 2 runs all, GPU 3 runs all)
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn a_request_beyond_the_largest_machine_is_rejected_at_once() {
    let mut scheduler = scheduler(
        Policy::Pack,
        vec![env("small", &[80, 80]), env("big", &[80; 8])],
    );
    let requests = [trial("huge").gpu_number(9)];
    expect![[r#"
        huge: reject: the trial asks for 9 GPUs, but the largest environment, big, has 8 GPUs: ask for 8 or fewer, or add an environment with 9 GPUs
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn device_constraints_take_exactly_the_named_gpus() {
    let mut scheduler = scheduler(Policy::Spread, vec![env("a", &[80; 4]), env("b", &[80; 4])]);
    let requests = [
        trial("pinned").devices([DeviceRef::new("b", 2), DeviceRef::new("b", 1)]),
        trial("overlaps").devices([DeviceRef::new("b", 1)]),
        trial("free").devices([DeviceRef::new("b", 3)]),
    ];
    expect![[r#"
        pinned: b [1, 2]
        overlaps: wait: waiting for GPU 1 on b: b: no GPU free (GPU 1 runs pinned)
        free: b [3]
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));

    // Once the busy GPU is released, the waiting Device request gets it.
    scheduler.release(&TrialId::from("pinned"));
    expect![[r#"
        overlaps: b [1]
    "#]]
    .assert_eq(&place(&mut scheduler, &requests[1..2]));
}

#[test]
fn device_constraints_that_can_never_hold_are_rejected() {
    let mut a = env("a", &[80; 2]);
    a.limits.gpu_indices = Some(vec![0]);
    let mut scheduler = scheduler(Policy::Pack, vec![a, env("b", &[24])]);
    let requests = [
        trial("no-host").devices([DeviceRef::new("c", 0)]),
        trial("no-gpu").devices([DeviceRef::new("a", 7)]),
        trial("not-allowed").devices([DeviceRef::new("a", 1)]),
        trial("too-small")
            .devices([DeviceRef::new("b", 0)])
            .gpu_memory(ByteSize::gib(40)),
        trial("two-hosts").devices([DeviceRef::new("a", 0), DeviceRef::new("b", 0)]),
        trial("twice").devices([DeviceRef::new("a", 0), DeviceRef::new("a", 0)]),
        trial("empty").devices([]),
    ];
    expect![[r#"
        no-host: reject: the trial asks for GPU 0 on c, but no environment is on host c (hosts: a, b): fix the Device constraint
        no-gpu: reject: the trial asks for GPU 7 on a, but a has no GPU 7 (its GPUs: 0, 1): fix the Device constraint
        not-allowed: reject: the trial asks for GPU 1 on a, but GPU 1 on a is outside its gpuIndices (0): fix the Device constraint or gpuIndices
        too-small: reject: the trial asks for GPU 0 on b with 40 GiB, but GPU 0 on b has 24 GiB: lower trialGpuMemory to 24 GiB or less
        two-hosts: reject: the trial cannot be placed: its Device constraint spans hosts a and b, but a trial runs on one host: list GPUs of one host
        twice: reject: the trial cannot be placed: its Device constraint lists a:0 twice: list each GPU once
        empty: reject: the trial cannot be placed: its Device constraint lists no GPU: list at least one (host, index) pair
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn fractional_sharing_fills_each_gpu_up_to_max_trials_per_gpu() {
    let sharing = EnvironmentLimits {
        max_trial_number_per_gpu: 2,
        ..limits()
    };
    let envs = vec![env("local", &[80, 80]).with_limits(sharing)];
    let mut scheduler = scheduler(Policy::RoundRobin, envs);
    let requests: Vec<_> = ["a", "b", "c", "d", "e"].into_iter().map(trial).collect();
    expect![[r#"
        a: local [0]
        b: local [1]
        c: local [0]
        d: local [1]
        e: wait: waiting for 1 GPU: local: no GPU free (GPU 0 runs a, c (2 per GPU), GPU 1 runs b, d (2 per GPU))
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
    let gpu0 = scheduler.inventory().environments[0].gpus[0].trials.clone();
    assert_eq!(gpu0, [TrialId::from("a"), TrialId::from("c")]);
}

#[test]
fn gpu_memory_per_trial_limits_sharing() {
    let sharing = EnvironmentLimits {
        max_trial_number_per_gpu: 3,
        ..limits()
    };
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[80]).with_limits(sharing)]);
    let requests: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|id| trial(id).gpu_memory(ByteSize::gib(30)))
        .collect();
    expect![[r#"
        a: local [0]
        b: local [0]
        c: wait: waiting for 1 GPU with 30 GiB: local: no GPU free (GPU 0 has 20 GiB free)
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn gpu_indices_is_an_allow_list() {
    let allowed = EnvironmentLimits {
        gpu_indices: Some(vec![1, 3]),
        ..limits()
    };
    let mut scheduler = scheduler(
        Policy::Pack,
        vec![env("local", &[80; 4]).with_limits(allowed)],
    );
    let requests = [
        trial("a"),
        trial("b"),
        trial("c"),
        trial("three").gpu_number(3),
    ];
    expect![[r#"
        a: local [1]
        b: local [3]
        c: wait: waiting for 1 GPU: local: no GPU free (GPU 1 runs a, GPU 3 runs b)
        three: reject: the trial asks for 3 GPUs, but the largest environment, local, has 4 GPUs of which gpuIndices allows 2: ask for 2 or fewer, or add an environment with 3 GPUs
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn foreign_processes_block_a_gpu_unless_use_active_gpu() {
    let busy = with_foreign(
        with_foreign(env("local", &[80, 80]), 0, 4242, 3),
        1,
        4243,
        70,
    );
    let mut strict = scheduler(Policy::Pack, vec![busy.clone()]);
    expect![[r#"
        a: wait: waiting for 1 GPU: local: no GPU free (GPU 0 runs foreign pid 4242 using 3 GiB and useActiveGpu is off, GPU 1 runs foreign pid 4243 using 70 GiB and useActiveGpu is off)
    "#]]
    .assert_eq(&place(&mut strict, &[trial("a")]));

    let active_ok = EnvironmentLimits {
        use_active_gpu: true,
        ..limits()
    };
    let mut lenient = scheduler(Policy::Spread, vec![busy.with_limits(active_ok)]);
    // Spread picks the GPU with the most memory left: GPU 0 (77 GiB), not GPU 1 (10 GiB).
    // A trial asking 20 GiB cannot go on GPU 1 at all.
    let requests = [trial("a"), trial("b").gpu_memory(ByteSize::gib(20))];
    expect![[r#"
        a: local [0]
        b: wait: waiting for 1 GPU with 20 GiB: local: no GPU free (GPU 0 runs a, GPU 1 has 10 GiB free)
    "#]]
    .assert_eq(&place(&mut lenient, &requests));
}

#[test]
fn knob_trials_on_a_gpu_are_not_foreign() {
    // A probe that reports the trial's own process must not turn its GPU "active": the caller
    // filters knob's processes out, and the trial list stays the scheduler's own.
    let sharing = EnvironmentLimits {
        max_trial_number_per_gpu: 2,
        ..limits()
    };
    let mut scheduler = scheduler(
        Policy::Pack,
        vec![env("local", &[80]).with_limits(sharing.clone())],
    );
    assert!(scheduler.place(&trial("a")).is_succeed());
    let mut probed = env("local", &[80]).with_limits(sharing);
    probed.gpus[0].memory_free = ByteSize::gib(60);
    probed.gpus[0].memory_used = ByteSize::gib(20);
    scheduler.upsert_environment(probed).unwrap();
    assert!(scheduler.place(&trial("b")).is_succeed());
}

#[test]
fn host_memory_admission_keeps_a_reserve() {
    let reserve = EnvironmentLimits {
        min_available_memory: Some(ByteSize::gib(8)),
        ..limits()
    };
    let config = SchedulerConfig {
        trial_gpu_number: Some(0),
        trial_memory_size: Some(ByteSize::gib(20)),
        ..SchedulerConfig::default()
    };
    let mut scheduler = scheduler_with(config, vec![env("local", &[]).with_limits(reserve)]);
    let requests = [trial("a"), trial("b"), trial("c")];
    expect![[r#"
        a: local []
        b: local []
        c: wait: waiting for 20 GiB of host memory: local: 24 GiB of memory available (memoryReserve 8 GiB kept free)
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn measured_host_memory_counts_even_without_knob_trials() {
    let mut squeezed = env("local", &[80]);
    squeezed.host_resources.memory_available = ByteSize::gib(6);
    let mut scheduler = scheduler(Policy::Pack, vec![squeezed]);
    let requests = [trial("a").host_memory(ByteSize::gib(10))];
    expect![[r#"
        a: wait: waiting for 1 GPU and 10 GiB of host memory: local: 6 GiB of memory available
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn cpu_cores_per_trial_stop_oversubscription() {
    let config = SchedulerConfig {
        trial_gpu_number: Some(0),
        trial_cpu_number: Some(6),
        ..SchedulerConfig::default()
    };
    let mut scheduler = scheduler_with(config, vec![env("local", &[80; 4])]);
    let requests = [
        trial("a"),
        trial("b"),
        trial("c"),
        trial("big").cpu_cores(32),
    ];
    expect![[r#"
        a: local []
        b: local []
        c: wait: waiting for 6 CPU cores: local: 4 of 16 CPU cores free
        big: reject: the trial asks for 32 CPU cores, but the largest environment, local, has 16 CPU cores: lower trialCpuNumber to 16 or less
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn cpu_utilization_limit_holds_new_trials() {
    let mut hot = env("local", &[80]);
    hot.host_resources = host(16, 64);
    hot.host_resources.cpu_utilization_percent = Some(95.0);
    hot.limits.max_cpu_utilization = Some(90.0);
    let mut scheduler = scheduler(Policy::Pack, vec![hot]);
    expect![[r#"
        a: wait: waiting for 1 GPU: local: CPU at 95% (maxCpuUtilization 90%)
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a")]));
}

#[test]
fn unset_trial_gpu_number_leaves_gpus_unmanaged_and_zero_means_none() {
    let mut unmanaged = scheduler_with(SchedulerConfig::default(), simulated("2x80GiB"));
    let mut zero = scheduler_with(
        SchedulerConfig {
            trial_gpu_number: Some(0),
            ..SchedulerConfig::default()
        },
        simulated("2x80GiB"),
    );
    let requests = [trial("a"), trial("b").gpu_number(1)];
    expect![[r#"
        a: local (GPUs unmanaged)
        b: local [0]
    "#]]
    .assert_eq(&place(&mut unmanaged, &requests));
    expect![[r#"
        a: local []
        b: local [0]
    "#]]
    .assert_eq(&place(&mut zero, &requests));

    let assignment = unmanaged.assignment(&TrialId::from("a")).unwrap();
    assert_eq!(assignment.cuda_visible_devices(), None);
    assert!(assignment.cuda_environment().is_empty());
    let assignment = zero.assignment(&TrialId::from("a")).unwrap();
    assert_eq!(assignment.cuda_visible_devices().as_deref(), Some(""));
    let assignment = zero.assignment(&TrialId::from("b")).unwrap();
    assert_eq!(
        assignment.cuda_environment(),
        [
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_owned()),
            ("CUDA_VISIBLE_DEVICES", "0".to_owned())
        ]
    );
}

#[test]
fn per_trial_values_override_the_experiment_defaults() {
    let config = SchedulerConfig {
        trial_gpu_number: Some(2),
        trial_gpu_memory: Some(ByteSize::gib(70)),
        policy: Policy::Pack,
        ..SchedulerConfig::default()
    };
    let mut scheduler = scheduler_with(config, vec![env("local", &[80, 80, 40])]);
    let placement = scheduler.place(&trial("small").gpu_number(1).gpu_memory(ByteSize::gib(30)));
    // Pack puts a 30 GiB request on the 40 GiB GPU, keeping the big ones whole.
    assert_eq!(
        placement,
        Placement::Succeed {
            environment: "local".into(),
            gpu_indices: Some(vec![2])
        }
    );
}
