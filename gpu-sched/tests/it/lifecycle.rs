//! Registration, refresh, release and removal: what the core does between decisions.

use expect_test::expect;
use knob_gpu_sched::{
    ByteSize, EnvironmentId, EnvironmentLimits, EnvironmentStatus, Placement, Policy, TrialId,
};

use crate::support::{env, limits, place, scheduler, trial, with_foreign};

#[test]
fn release_frees_the_gpus_once() {
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[80])]);
    assert!(scheduler.place(&trial("a")).is_succeed());
    assert!(!scheduler.place(&trial("b")).is_succeed());
    let released = scheduler
        .release(&TrialId::from("a"))
        .expect("a held GPU 0");
    assert_eq!(released.gpu_indices, Some(vec![0]));
    assert_eq!(scheduler.release(&TrialId::from("a")), None);
    assert_eq!(scheduler.release(&TrialId::from("never-placed")), None);
    assert!(scheduler.place(&trial("b")).is_succeed());
}

#[test]
fn placing_a_placed_trial_again_returns_its_assignment() {
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[80, 80])]);
    let first = scheduler.place(&trial("a"));
    assert_eq!(scheduler.place(&trial("a")), first);
    assert_eq!(scheduler.assignments().count(), 1);
}

#[test]
fn a_fresh_probe_keeps_the_trials_placed() {
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[80, 80])]);
    assert!(scheduler.place(&trial("a")).is_succeed());
    // The probe now sees a foreign process on GPU 1 and knows nothing of trial a.
    scheduler
        .upsert_environment(with_foreign(env("local", &[80, 80]), 1, 31337, 2))
        .unwrap();
    let gpus = &scheduler
        .environment(&EnvironmentId::from("local"))
        .unwrap()
        .gpus;
    assert_eq!(gpus[0].trials, [TrialId::from("a")]);
    assert_eq!(gpus[1].foreign_processes[0].pid, 31337);
    expect![[r#"
        b: wait: waiting for 1 GPU: local: no GPU free (GPU 0 runs a, GPU 1 runs foreign pid 31337 using 2 GiB and useActiveGpu is off)
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("b")]));
}

#[test]
fn a_gpu_that_vanishes_keeps_its_claim_until_it_returns() {
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[80, 80])]);
    assert_eq!(
        scheduler.place(&trial("a").gpu_number(2)),
        Placement::Succeed {
            environment: "local".into(),
            gpu_indices: Some(vec![0, 1])
        }
    );
    // GPU 1 fell off the bus; the probe lists only GPU 0.
    scheduler.upsert_environment(env("local", &[80])).unwrap();
    scheduler
        .upsert_environment(env("local", &[80, 80]))
        .unwrap();
    assert!(!scheduler.place(&trial("b")).is_succeed());
    scheduler.release(&TrialId::from("a"));
    assert!(scheduler.place(&trial("b")).is_succeed());
}

#[test]
fn removing_an_environment_hands_back_its_trials() {
    let mut scheduler = scheduler(Policy::RoundRobin, vec![env("a", &[80]), env("b", &[80])]);
    assert!(scheduler.place(&trial("on-a")).is_succeed());
    assert!(scheduler.place(&trial("on-b")).is_succeed());
    let orphans = scheduler
        .remove_environment(&EnvironmentId::from("a"))
        .unwrap();
    assert_eq!(orphans.len(), 1);
    assert_eq!(orphans[0].trial, TrialId::from("on-a"));
    assert!(scheduler.assignment(&TrialId::from("on-a")).is_none());
    assert_eq!(scheduler.environments().count(), 1);
    // b's trial is untouched and b still works after the positions shift.
    scheduler.release(&TrialId::from("on-b")).unwrap();
    assert!(scheduler.place(&trial("next")).is_succeed());
}

#[test]
fn registration_errors_say_what_to_fix() {
    let mut scheduler = scheduler(Policy::Pack, Vec::new());
    let mut twice = env("dup", &[80, 80]);
    twice.gpus[1].index = 0;
    let zero_sharing = env("zero", &[80]).with_limits(EnvironmentLimits {
        max_trial_number_per_gpu: 0,
        ..limits()
    });
    let bad_cpu_limit = env("cpu", &[80]).with_limits(EnvironmentLimits {
        max_cpu_utilization: Some(150.0),
        ..limits()
    });
    let missing = env("missing", &[80, 80]).with_limits(EnvironmentLimits {
        gpu_indices: Some(vec![0, 5]),
        ..limits()
    });
    let errors = [
        scheduler.upsert_environment(twice).unwrap_err().to_string(),
        scheduler
            .upsert_environment(zero_sharing)
            .unwrap_err()
            .to_string(),
        scheduler
            .upsert_environment(bad_cpu_limit)
            .unwrap_err()
            .to_string(),
        missing.check_limits_match_gpus().unwrap_err().to_string(),
        scheduler
            .set_environment_status(&EnvironmentId::from("nope"), EnvironmentStatus::Ready)
            .unwrap_err()
            .to_string(),
    ];
    expect![[r#"
        environment dup lists GPU 0 twice: each GPU index must be unique
        environment zero has maxTrialNumberPerGpu 0: set it to 1 or more
        environment cpu has maxCpuUtilization 150: give a percentage above 0 and at most 100
        environment missing: gpuIndices names GPU 5, but the GPUs found are 0, 1: list only GPUs it has
        no environment nope is registered: register it with upsert_environment first"#]]
    .assert_eq(&errors.join("\n"));
    assert_eq!(scheduler.environments().count(), 0);
}

#[test]
fn the_inventory_shows_trials_on_their_gpus_as_json() {
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[16])]);
    assert!(scheduler
        .place(&trial("t1").gpu_memory(ByteSize::gib(4)).cpu_cores(2))
        .is_succeed());
    let json = serde_json::to_string_pretty(&scheduler.inventory()).unwrap();
    expect![[r#"
        {
          "environments": [
            {
              "id": "local",
              "host": "local",
              "status": {
                "state": "ready"
              },
              "gpus": [
                {
                  "index": 0,
                  "uuid": "",
                  "name": "Test GPU",
                  "memory_total": 17179869184,
                  "memory_used": 0,
                  "memory_free": 17179869184,
                  "utilization_percent": 0,
                  "foreign_processes": [],
                  "trials": [
                    "t1"
                  ]
                }
              ],
              "gpu_source": {
                "source": "declared"
              },
              "host_resources": {
                "cpu_count": 16,
                "cpu_utilization_percent": 10.0,
                "memory_total": 68719476736,
                "memory_available": 68719476736
              },
              "limits": {
                "gpuIndices": null,
                "maxTrialNumberPerGpu": 1,
                "useActiveGpu": false,
                "maxCpuUtilization": null,
                "minAvailableMemory": null,
                "maxMemoryUtilization": null,
                "maxGpuMemoryUtilization": null,
                "gpuMemoryReserve": null
              }
            }
          ]
        }"#]]
    .assert_eq(&json);
    let assignment =
        serde_json::to_string(scheduler.assignment(&TrialId::from("t1")).unwrap()).unwrap();
    expect![[r#"{"trial":"t1","environment":"local","gpu_indices":[0],"gpu_memory":4294967296,"host_memory":0,"cpu_cores":2}"#]].assert_eq(&assignment);
}
