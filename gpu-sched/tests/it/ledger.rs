//! The machine-wide lease ledger: limits across experiments, first come first served, and a
//! dead holder's leases reclaimed (a real process killed with SIGKILL).

use std::process::Command;

use knob_gpu_sched::ledger::{Acquired, Holder, Lease, Ledger, StandFor};
use knob_gpu_sched::ByteSize;

fn lease(holder: &Holder, trial: &str, gpus: &[u32], max_per_gpu: u32) -> Lease {
    Lease {
        holder: holder.clone(),
        trial: trial.into(),
        machine: "local".into(),
        gpus: gpus.to_vec(),
        max_per_gpu,
        gpu_memory: ByteSize::ZERO,
        host_memory: ByteSize::ZERO,
        cpu_cores: 0,
        ticket: 0,
        granted_ms: 0,
        gpu_memory_totals: Vec::new(),
        cpu_total: 0,
        host_memory_total: ByteSize::ZERO,
        process_group: None,
    }
}

/// A holder in a child process that is alive until killed.
fn child_holder(experiment: &str) -> (std::process::Child, Holder) {
    let child = Command::new("sleep").arg("600").spawn().unwrap();
    let pid = child.id();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let started = rest.split_whitespace().nth(19).unwrap().parse().unwrap();
    let holder = Holder {
        experiment: experiment.into(),
        pid,
        started,
    };
    assert!(holder.is_alive());
    (child, holder)
}

#[test]
fn a_gpu_never_takes_more_trials_than_any_holder_allows_and_waiters_name_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut other, b) = child_holder("expB");
    let a = Holder::this_process("expA");
    assert_eq!(
        ledger.acquire(&lease(&a, "a1", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    // B allows two per GPU, but A's trial there allows one: B waits, naming A.
    let Acquired::Waiting(reason) = ledger.acquire(&lease(&b, "b1", &[0], 2)).unwrap() else {
        panic!("GPU 0 is A's");
    };
    assert_eq!(
        reason,
        format!(
            "GPU 0 held by trial a1 of experiment expA (pid {})",
            std::process::id()
        )
    );
    assert_eq!(
        ledger.acquire(&lease(&b, "b2", &[1], 1)).unwrap(),
        Acquired::Granted
    );
    // Asking again is idempotent for a granted lease.
    assert_eq!(
        ledger.acquire(&lease(&a, "a1", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    ledger.release(&a, "a1").unwrap();
    assert_eq!(
        ledger.acquire(&lease(&b, "b1", &[0], 2)).unwrap(),
        Acquired::Granted
    );
    let state = ledger.snapshot().unwrap();
    assert_eq!(state.leases.len(), 2);
    assert!(state.requests.is_empty());
    other.kill().unwrap();
    other.wait().unwrap();
}

#[test]
fn requests_are_served_first_come_first_served_per_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut other, b) = child_holder("expB");
    let a = Holder::this_process("expA");
    assert_eq!(
        ledger.acquire(&lease(&a, "a1", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    // B asks for GPUs 0 and 1 first; A's later request for GPU 1 (free) must not jump it.
    assert!(matches!(
        ledger.acquire(&lease(&b, "b1", &[0, 1], 1)).unwrap(),
        Acquired::Waiting(_)
    ));
    let Acquired::Waiting(reason) = ledger.acquire(&lease(&a, "a2", &[1], 1)).unwrap() else {
        panic!("an older request waits for GPU 1");
    };
    assert!(
        reason.contains("promised first to trial b1 of experiment expB"),
        "{reason}"
    );
    ledger.release(&a, "a1").unwrap();
    assert_eq!(
        ledger.acquire(&lease(&b, "b1", &[0, 1], 1)).unwrap(),
        Acquired::Granted
    );
    other.kill().unwrap();
    other.wait().unwrap();
}

#[test]
fn a_holder_killed_with_sigkill_loses_its_leases_and_requests_to_the_next_caller() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut dead, b) = child_holder("expB");
    let a = Holder::this_process("expA");
    assert_eq!(
        ledger.acquire(&lease(&b, "b1", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    assert!(matches!(
        ledger.acquire(&lease(&b, "b2", &[1], 1)).unwrap(),
        Acquired::Granted
    ));
    assert!(matches!(
        ledger.acquire(&lease(&a, "a1", &[0], 1)).unwrap(),
        Acquired::Waiting(_)
    ));
    dead.kill().unwrap(); // SIGKILL
    dead.wait().unwrap();
    assert_eq!(
        ledger.acquire(&lease(&a, "a1", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    let state = ledger.snapshot().unwrap();
    assert_eq!(state.leases.len(), 1, "{state:?}");
    assert_eq!(state.leases[0].holder, a);
    let journal = std::fs::read_to_string(ledger.journal_path()).unwrap();
    let ops: Vec<(String, String)> = journal
        .lines()
        .map(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).unwrap();
            (
                entry["op"].as_str().unwrap().to_owned(),
                entry["trial"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let ops: Vec<(&str, &str)> = ops.iter().map(|(o, t)| (o.as_str(), t.as_str())).collect();
    assert_eq!(
        ops,
        [
            ("grant", "b1"),
            ("grant", "b2"),
            ("reclaim", "b1"),
            ("reclaim", "b2"),
            ("grant", "a1")
        ]
    );
}

/// A trial runs in a process group of its own and outlives its experiment killed with
/// SIGKILL: its GPU is not given to another trial while the group lives, and is once it is gone.
#[test]
fn a_dead_holders_lease_is_kept_while_its_trials_process_group_lives() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut dead, b) = child_holder("expB");
    let a = Holder::this_process("expA");
    let mut trial = Command::new("sleep")
        .arg("600")
        .process_group(0)
        .spawn()
        .unwrap();
    assert_eq!(
        ledger.acquire(&lease(&b, "b1", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    ledger.record_process_group(&b, "b1", trial.id()).unwrap();
    dead.kill().unwrap(); // SIGKILL
    dead.wait().unwrap();
    let Acquired::Waiting(reason) = ledger.acquire(&lease(&a, "a1", &[0], 1)).unwrap() else {
        panic!("GPU 0 was given away while trial b1 still runs on it");
    };
    assert!(reason.contains("trial b1 of experiment expB"), "{reason}");
    trial.kill().unwrap();
    trial.wait().unwrap();
    assert_eq!(
        ledger.acquire(&lease(&a, "a1", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    let state = ledger.snapshot().unwrap();
    assert_eq!(state.leases.len(), 1, "{state:?}");
    assert_eq!(state.leases[0].holder, a);
}

#[test]
fn a_full_journal_is_moved_aside_and_a_new_one_begun() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let a = Holder::this_process("expA");
    // A journal at the bound (sparse: no 16 MiB written).
    let journal = ledger.journal_path();
    std::fs::File::create(&journal)
        .unwrap()
        .set_len(knob_gpu_sched::ledger::JOURNAL_ROTATE_BYTES)
        .unwrap();
    assert_eq!(
        ledger.acquire(&lease(&a, "a1", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    let older = dir.path().join("gpu-ledger.journal.1");
    assert_eq!(
        std::fs::metadata(&older).unwrap().len(),
        knob_gpu_sched::ledger::JOURNAL_ROTATE_BYTES
    );
    let text = std::fs::read_to_string(&journal).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains(r#""op":"grant""#), "{text}");
}

#[test]
fn a_damaged_ledger_is_one_line_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gpu-ledger.json"), "{not json").unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let error = ledger.snapshot().unwrap_err().to_string();
    assert!(
        error.contains("gpu-ledger.json is not a ledger knob wrote"),
        "{error}"
    );
    // What to do, and what it costs: a new ledger holds none of the running experiments'
    // leases, so it is begun once none runs (H2 F9).
    assert!(
        error.contains("once no knob experiment runs on this machine, move it away"),
        "{error}"
    );
    assert!(
        !error.contains("every running experiment writes"),
        "{error}"
    );
    assert_eq!(error.lines().count(), 1);
}

#[test]
fn trials_of_other_experiments_count_against_max_trial_number_per_gpu_and_are_named() {
    use crate::support::{env, place, scheduler};
    use knob_gpu_sched::{HeldElsewhere, Policy};
    let mut shared = env("local", &[80, 80]);
    shared.gpus[0].held_elsewhere.push(HeldElsewhere {
        experiment: "expB".into(),
        trial: "b1".into(),
        gpu_memory: ByteSize::gib(10),
        max_per_gpu: None,
        asked_earlier: false,
    });
    let mut scheduler = scheduler(Policy::Pack, vec![shared]);
    expect_test::expect![[r#"
        a: local [1]
        c: wait: waiting for 1 GPU: local: no GPU free (GPU 0 runs trial b1 of experiment expB, GPU 1 runs a)
    "#]]
    .assert_eq(&place(
        &mut scheduler,
        &[crate::support::trial("a"), crate::support::trial("c")],
    ));
}

/// A GPU promised to another experiment's waiting request runs nothing: the reason says it is
/// promised to that experiment's waiting trials, not that a trial of it runs there.
#[test]
fn a_gpu_promised_to_another_experiments_waiting_trials_is_named_promised_not_running() {
    use crate::support::{env, place, scheduler, trial};
    use knob_gpu_sched::Policy;
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut running, b) = child_holder("expB");
    let (mut waiting, c) = child_holder("expC");
    let (mut asking, d) = child_holder("expD");
    let a = Holder::this_process("expA");
    assert_eq!(
        ledger.acquire(&lease(&b, "b1", &[0, 1], 1)).unwrap(),
        Acquired::Granted
    );
    // C's trials wait for GPU 1 (B's), D's trial d1 for GPU 2 (E's): both asked before A.
    ledger
        .stand_in_line(&c, "local", &StandFor::gpus(&[1]))
        .unwrap();
    ledger.release(&b, "b1").unwrap();
    ledger.acquire(&lease(&b, "b2", &[0], 1)).unwrap();
    let (mut holding, e) = child_holder("expE");
    ledger.acquire(&lease(&e, "e1", &[2], 1)).unwrap();
    ledger.acquire(&lease(&d, "d1", &[2], 1)).unwrap();
    let mut seen_by_a = env("local", &[80, 80, 80]);
    ledger
        .snapshot()
        .unwrap()
        .annotate(&mut seen_by_a, "local", a.pid, None);
    let mut scheduler = scheduler(Policy::Pack, vec![seen_by_a]);
    expect_test::expect![[r#"
        a1: wait: waiting for 1 GPU: local: no GPU free (GPU 0 runs trial b2 of experiment expB, GPU 1 promised first to the waiting trials of experiment expC (asked earlier), GPU 2 runs trial e1 of experiment expE and is promised first to waiting trial d1 of experiment expD (asked earlier))
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("a1")]));
    for child in [&mut running, &mut waiting, &mut asking, &mut holding] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// The scheduler applies the ledger's rule (`trials_per_gpu`): a GPU that another experiment
/// holds with `maxTrialNumberPerGpu: 1` takes no trial of an experiment that allows two, which
/// the scheduler then places on the free GPU instead of a GPU the ledger would refuse.
#[test]
fn the_scheduler_places_only_where_the_ledger_grants() {
    use crate::support::{env, place};
    use knob_gpu_sched::{EnvironmentLimits, Policy, SchedulerConfig};
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut other, b) = child_holder("expB");
    let a = Holder::this_process("expA");
    // B allows one trial per GPU and holds GPU 0; A allows two.
    assert_eq!(
        ledger.acquire(&lease(&b, "b1", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    let mut seen_by_a = env("local", &[80, 80]);
    seen_by_a.limits = EnvironmentLimits {
        max_trial_number_per_gpu: 2,
        ..EnvironmentLimits::default()
    };
    ledger
        .snapshot()
        .unwrap()
        .annotate(&mut seen_by_a, "local", a.pid, None);
    assert_eq!(seen_by_a.gpus[0].held_elsewhere[0].max_per_gpu, Some(1));
    assert_eq!(seen_by_a.gpus[0].trial_limit(2), 1);
    let mut scheduler = crate::support::scheduler_with(
        SchedulerConfig {
            trial_gpu_number: Some(1),
            policy: Policy::Pack,
            ..SchedulerConfig::default()
        },
        vec![seen_by_a],
    );
    // Packing would put a1 beside b1 on GPU 0 if only A's own limit counted.
    expect_test::expect![[r#"
        a1: local [1]
        a2: local [1]
        a3: wait: waiting for 1 GPU: local: no GPU free (GPU 0 runs trial b1 of experiment expB, GPU 1 runs a1, a2 (2 per GPU))
    "#]]
    .assert_eq(&place(
        &mut scheduler,
        &[
            crate::support::trial("a1"),
            crate::support::trial("a2"),
            crate::support::trial("a3"),
        ],
    ));
    // And the ledger grants what the scheduler placed.
    for trial in ["a1", "a2"] {
        assert_eq!(
            ledger.acquire(&lease(&a, trial, &[1], 2)).unwrap(),
            Acquired::Granted
        );
    }
    assert!(matches!(
        ledger.acquire(&lease(&a, "a3", &[0], 2)).unwrap(),
        Acquired::Waiting(_)
    ));
    other.kill().unwrap();
    other.wait().unwrap();
}

#[test]
fn a_holder_standing_in_line_is_served_before_a_newer_request_and_its_trial_takes_its_ticket() {
    use crate::support::env;
    use knob_gpu_sched::ledger::STANDING;
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut other, b) = child_holder("expB");
    let a = Holder::this_process("expA");
    assert_eq!(
        ledger.acquire(&lease(&b, "b1", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    // A's trials wait in A's scheduler for GPU 0: A stands in line for it.
    let ticket = ledger
        .stand_in_line(&a, "local", &StandFor::gpus(&[0]))
        .unwrap()
        .unwrap();
    assert_eq!(
        ledger
            .stand_in_line(&a, "local", &StandFor::gpus(&[0]))
            .unwrap(),
        Some(ticket)
    );
    // B frees GPU 0 and asks for it again at once: A asked first.
    ledger.release(&b, "b1").unwrap();
    let Acquired::Waiting(reason) = ledger.acquire(&lease(&b, "b2", &[0], 1)).unwrap() else {
        panic!("B's new request jumped A's place in line");
    };
    assert_eq!(
        reason,
        format!(
            "GPU 0 promised first to the waiting trials of experiment expA (pid {}) (asked earlier)",
            std::process::id()
        )
    );
    // A's next probe sees GPU 0 free (held by nobody): A keeps its place until its trial
    // takes it, so B's retry in that moment still waits.
    assert_eq!(
        ledger
            .stand_in_line(&a, "local", &StandFor::gpus(&[]))
            .unwrap(),
        Some(ticket)
    );
    assert!(matches!(
        ledger.acquire(&lease(&b, "b2", &[0], 1)).unwrap(),
        Acquired::Waiting(_)
    ));
    // What A's scheduler sees: GPU 0 free of B's newer request; what B's would see: promised.
    let state = ledger.snapshot().unwrap();
    let mut seen_by_a = env("local", &[80]);
    state.annotate(&mut seen_by_a, "local", a.pid, Some(ticket));
    assert!(seen_by_a.gpus[0].held_elsewhere.is_empty(), "{seen_by_a:?}");
    let mut seen_by_b = env("local", &[80]);
    let b_ticket = state
        .requests
        .iter()
        .find(|r| r.lease.trial == "b2")
        .unwrap()
        .lease
        .ticket;
    state.annotate(&mut seen_by_b, "local", b.pid, Some(b_ticket));
    assert_eq!(seen_by_b.gpus[0].held_elsewhere[0].experiment, "expA");
    // A's trial takes its holder's place (the older ticket), so B's waiting request does not
    // hold it back.
    assert_eq!(
        ledger.acquire(&lease(&a, "a1", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    let granted = ledger.snapshot().unwrap();
    assert_eq!(granted.leases[0].ticket, ticket);
    // The grant took the standing request's place: it is gone, and nothing renews it.
    assert!(!granted.requests.iter().any(|r| r.lease.trial == STANDING));
    assert_eq!(
        ledger
            .stand_in_line(&a, "local", &StandFor::gpus(&[]))
            .unwrap(),
        None
    );
    other.kill().unwrap();
    other.wait().unwrap();
}

/// A lease asking `gib` GiB on each of `gpus`, which the requester probed at 80 GiB each.
fn memory_lease(holder: &Holder, trial: &str, gpus: &[u32], max_per_gpu: u32, gib: u64) -> Lease {
    Lease {
        gpu_memory: ByteSize::gib(gib),
        gpu_memory_totals: gpus.iter().map(|&gpu| (gpu, ByteSize::gib(80))).collect(),
        ..lease(holder, trial, gpus, max_per_gpu)
    }
}

#[test]
fn a_gpu_is_never_granted_more_memory_than_it_has_whatever_the_trial_count_allows() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut other, b) = child_holder("expB");
    let a = Holder::this_process("expA");
    // Both allow two trials per GPU, and both placed 50 GiB on an 80 GiB GPU against the same
    // probe: the second to ask waits, naming what the first holds.
    assert_eq!(
        ledger
            .acquire(&memory_lease(&a, "a1", &[0], 2, 50))
            .unwrap(),
        Acquired::Granted
    );
    let Acquired::Waiting(reason) = ledger
        .acquire(&memory_lease(&b, "b1", &[0], 2, 50))
        .unwrap()
    else {
        panic!("100 GiB granted on an 80 GiB GPU");
    };
    assert_eq!(
        reason,
        format!(
            "GPU 0 has 80 GiB, of which 50 GiB promised to trial a1 of experiment expA (pid {}) (50 GiB): 30 GiB left, 50 GiB asked",
            std::process::id()
        )
    );
    // What fits beside it is granted; a request that names no memory is limited by count only.
    assert_eq!(
        ledger
            .acquire(&memory_lease(&b, "b2", &[1], 2, 50))
            .unwrap(),
        Acquired::Granted
    );
    ledger.release(&a, "a1").unwrap();
    assert_eq!(
        ledger
            .acquire(&memory_lease(&b, "b1", &[0], 2, 50))
            .unwrap(),
        Acquired::Granted
    );
    assert_eq!(
        ledger
            .acquire(&memory_lease(&a, "a2", &[0], 2, 30))
            .unwrap(),
        Acquired::Granted
    );
    other.kill().unwrap();
    other.wait().unwrap();
}

#[test]
fn a_waiting_experiment_stands_in_line_only_for_gpus_its_trial_may_use_and_waits_for() {
    use crate::support::env;
    use knob_gpu_sched::{EnvironmentLimits, SchedulerConfig};
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut other, b) = child_holder("expB");
    let a = Holder::this_process("expA");
    // B holds both GPUs of a 2 x 80 GiB machine.
    for (trial, gpu) in [("b0", 0), ("b1", 1)] {
        assert_eq!(
            ledger.acquire(&lease(&b, trial, &[gpu], 1)).unwrap(),
            Acquired::Granted
        );
    }
    let state = ledger.snapshot().unwrap();
    let stand_for = |limits: EnvironmentLimits, demand: SchedulerConfig| {
        let probed = env("local", &[80, 80]).with_limits(limits);
        let mut seen = probed.clone();
        state.annotate(&mut seen, "local", a.pid, None);
        state.to_stand_for(&probed, &seen, "local", a.pid, &demand)
    };
    let gpus = |count: u32| SchedulerConfig {
        trial_gpu_number: Some(count),
        ..SchedulerConfig::default()
    };
    // A trial that may use either GPU stands for both.
    assert_eq!(
        stand_for(EnvironmentLimits::default(), gpus(1)),
        Some(StandFor::gpus(&[0, 1]))
    );
    // gpuIndices: 1: GPU 0 is none of A's business.
    let only_gpu_1 = EnvironmentLimits {
        gpu_indices: Some(vec![1]),
        ..EnvironmentLimits::default()
    };
    assert_eq!(stand_for(only_gpu_1, gpus(1)), Some(StandFor::gpus(&[1])));
    // A trial that asks for no GPU waits for something else: it leaves the line.
    assert_eq!(stand_for(EnvironmentLimits::default(), gpus(0)), None);
    assert_eq!(
        stand_for(EnvironmentLimits::default(), SchedulerConfig::default()),
        None
    );
    // One that waits for host memory (or could never run) would not start even were B gone.
    let reserve = EnvironmentLimits {
        min_available_memory: Some(ByteSize::gib(100)),
        ..EnvironmentLimits::default()
    };
    assert_eq!(stand_for(reserve, gpus(1)), None);
    let host_memory = SchedulerConfig {
        trial_memory_size: Some(ByteSize::gib(65)),
        ..gpus(1)
    };
    assert_eq!(stand_for(EnvironmentLimits::default(), host_memory), None);
    // A GPU too small for the trial's memory even when free is not stood for.
    let mut mixed_probed = env("local", &[80, 16]);
    let mut mixed_seen = mixed_probed.clone();
    state.annotate(&mut mixed_seen, "local", a.pid, None);
    let big = SchedulerConfig {
        trial_gpu_memory: Some(ByteSize::gib(40)),
        ..gpus(1)
    };
    assert_eq!(
        state.to_stand_for(&mixed_probed, &mixed_seen, "local", a.pid, &big),
        Some(StandFor::gpus(&[0]))
    );
    // A's own trial on GPU 1 (gpuIndices: 1) is what its next trial waits for, not B: it
    // takes no place in line (it would only renew one it had).
    assert_eq!(
        ledger.acquire(&lease(&a, "a1", &[1], 1)).unwrap(),
        Acquired::Waiting(format!(
            "GPU 1 held by trial b1 of experiment expB (pid {})",
            b.pid
        ))
    );
    ledger.release(&b, "b1").unwrap();
    ledger.release(&a, "a1").unwrap();
    assert_eq!(
        ledger.acquire(&lease(&a, "a1", &[1], 1)).unwrap(),
        Acquired::Granted
    );
    let state = ledger.snapshot().unwrap();
    mixed_probed.limits.gpu_indices = Some(vec![1]);
    let mut seen = mixed_probed.clone();
    state.annotate(&mut seen, "local", a.pid, None);
    assert_eq!(
        state.to_stand_for(&mixed_probed, &seen, "local", a.pid, &gpus(1)),
        Some(StandFor::default())
    );
    // Leaving the line drops the standing request, so B is not held back.
    ledger
        .stand_in_line(&a, "local", &StandFor::gpus(&[0]))
        .unwrap();
    ledger.leave_line(&a, "local").unwrap();
    ledger.release(&b, "b0").unwrap();
    assert_eq!(
        ledger.acquire(&lease(&b, "b2", &[0], 1)).unwrap(),
        Acquired::Granted
    );
    other.kill().unwrap();
    other.wait().unwrap();
}

/// A trial that waits for its own experiment's trial and for another experiment's GPU stands in
/// line for both: the GPU the other frees stays promised to it until its own trial ended, so
/// the other cannot refill it over and over. A GPU the trial cannot use stays the other's.
#[test]
fn a_trial_waiting_for_its_own_trial_and_another_experiments_gpu_stands_in_line_for_both() {
    use crate::support::env;
    use knob_gpu_sched::ledger::STANDING;
    use knob_gpu_sched::SchedulerConfig;
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut other, b) = child_holder("expB");
    let a = Holder::this_process("expA");
    // 80, 80 and 16 GiB GPUs: A's trial a1 runs on GPU 0, B's on GPUs 1 and 2; A's next trial
    // asks for 2 GPUs of 40 GiB, which only GPUs 0 and 1 have.
    let grant = |lease: Lease| assert_eq!(ledger.acquire(&lease).unwrap(), Acquired::Granted);
    grant(lease(&a, "a1", &[0], 1));
    grant(lease(&b, "b1", &[1], 1));
    grant(lease(&b, "b9", &[2], 1));
    let two_big = SchedulerConfig {
        trial_gpu_number: Some(2),
        trial_gpu_memory: Some(ByteSize::gib(40)),
        ..SchedulerConfig::default()
    };
    let stand_for = || {
        let state = ledger.snapshot().unwrap();
        let probed = env("local", &[80, 80, 16]);
        let mut seen = probed.clone();
        // As `MachineLeases::annotate` does: A's own place in line decides which requests of
        // others are older.
        let mine = state
            .requests
            .iter()
            .find(|r| r.lease.trial == STANDING && r.lease.holder == a)
            .map(|r| r.lease.ticket);
        state.annotate(&mut seen, "local", a.pid, mine);
        state.to_stand_for(&probed, &seen, "local", a.pid, &two_big)
    };
    assert_eq!(stand_for(), Some(StandFor::gpus(&[0, 1])));
    let ticket = ledger
        .stand_in_line(&a, "local", &stand_for().unwrap())
        .unwrap()
        .unwrap();
    // B's trial on GPU 1 ends and B asks for GPU 1 again at once: promised to A.
    ledger.release(&b, "b1").unwrap();
    let Acquired::Waiting(reason) = ledger.acquire(&lease(&b, "b2", &[1], 1)).unwrap() else {
        panic!("B refilled the GPU A waits for");
    };
    assert_eq!(
        reason,
        format!(
            "GPU 1 promised first to the waiting trials of experiment expA (pid {}) (asked earlier)",
            a.pid
        )
    );
    // A's own trial ends: B cannot take GPU 0 either, which A's trial waits for.
    ledger.release(&a, "a1").unwrap();
    assert!(matches!(
        ledger.acquire(&lease(&b, "b3", &[0], 1)).unwrap(),
        Acquired::Waiting(_)
    ));
    // GPU 2, which A's trial cannot use, B refills.
    ledger.release(&b, "b9").unwrap();
    grant(lease(&b, "b10", &[2], 1));
    // A's next probe renews its place; its trial takes both GPUs with its ticket.
    assert_eq!(stand_for(), Some(StandFor::default()));
    grant(lease(&a, "a2", &[0, 1], 1));
    let state = ledger.snapshot().unwrap();
    let a2 = state.leases.iter().find(|l| l.trial == "a2").unwrap();
    assert_eq!(a2.ticket, ticket);
    assert!(!state.requests.iter().any(|r| r.lease.trial == STANDING));
    // B's waiting trials went elsewhere. A's next trial waits for a2 alone (B holds nothing
    // it may use): it takes no place.
    ledger.release(&b, "b2").unwrap();
    ledger.release(&b, "b3").unwrap();
    assert_eq!(stand_for(), Some(StandFor::default()));
    other.kill().unwrap();
    other.wait().unwrap();
}

/// A lease asking for `cores` CPU cores and `gib` GiB of memory, no GPU, from a requester that
/// probed a 16-core, 64 GiB machine.
fn host_lease(holder: &Holder, trial: &str, cores: u32, gib: u64) -> Lease {
    Lease {
        cpu_cores: cores,
        host_memory: ByteSize::gib(gib),
        cpu_total: 16,
        host_memory_total: ByteSize::gib(64),
        ..lease(holder, trial, &[], 1)
    }
}

#[test]
fn a_request_for_cpu_cores_is_served_first_come_first_served_between_experiments() {
    use crate::support::env;
    use knob_gpu_sched::ledger::STANDING;
    use knob_gpu_sched::SchedulerConfig;
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut other, b) = child_holder("expB");
    let a = Holder::this_process("expA");
    // A's trial holds 12 of the 16 cores; B's trial, 8 cores and 1 GiB, waits in B's
    // scheduler. It stands in line for the cores, not for the memory, which is free.
    assert_eq!(
        ledger.acquire(&host_lease(&a, "a1", 12, 0)).unwrap(),
        Acquired::Granted
    );
    let demand = SchedulerConfig {
        trial_cpu_number: Some(8),
        trial_memory_size: Some(ByteSize::gib(1)),
        ..SchedulerConfig::default()
    };
    let probed = env("local", &[]);
    let mut seen_by_b = probed.clone();
    let state = ledger.snapshot().unwrap();
    state.annotate(&mut seen_by_b, "local", b.pid, None);
    let stand_for = state
        .to_stand_for(&probed, &seen_by_b, "local", b.pid, &demand)
        .unwrap();
    assert_eq!(
        stand_for,
        StandFor {
            cpu_cores: 8,
            ..StandFor::default()
        }
    );
    // A's next such trial waits for A's own trial alone: it takes no place in line.
    let mut seen_by_a = probed.clone();
    state.annotate(&mut seen_by_a, "local", a.pid, None);
    assert_eq!(
        state.to_stand_for(&probed, &seen_by_a, "local", a.pid, &demand),
        Some(StandFor::default())
    );
    let ticket = ledger
        .stand_in_line(&b, "local", &stand_for)
        .unwrap()
        .unwrap();
    // A's trial ends and A asks again at once: what leaves room for B's 8 cores is granted,
    // what does not waits behind B, and a request for memory alone does not wait for cores.
    ledger.release(&a, "a1").unwrap();
    assert_eq!(
        ledger.acquire(&host_lease(&a, "a2", 4, 0)).unwrap(),
        Acquired::Granted
    );
    assert_eq!(
        ledger.acquire(&host_lease(&a, "a3", 8, 0)).unwrap(),
        Acquired::Waiting(format!(
            "CPU cores promised first to the waiting trials of experiment expB (pid {}) (asked earlier)",
            b.pid
        ))
    );
    assert_eq!(
        ledger.acquire(&host_lease(&a, "a4", 0, 1)).unwrap(),
        Acquired::Granted
    );
    // A requester that does not say how many cores the machine has waits behind B.
    let unknown_total = Lease {
        cpu_total: 0,
        ..host_lease(&a, "a5", 1, 0)
    };
    assert!(matches!(
        ledger.acquire(&unknown_total).unwrap(),
        Acquired::Waiting(_)
    ));
    ledger.release(&a, "a5").unwrap();
    // A's scheduler sees B's 8 cores as taken (its own 4 it counts itself), so it does not
    // place a trial the ledger refuses.
    let mut seen_by_a = probed.clone();
    ledger
        .snapshot()
        .unwrap()
        .annotate(&mut seen_by_a, "local", a.pid, None);
    assert_eq!(seen_by_a.host_held_elsewhere.cpu_cores, 8);
    // B's trial takes B's place (its ticket), and the standing request is used up.
    assert_eq!(
        ledger.acquire(&host_lease(&b, "b1", 8, 1)).unwrap(),
        Acquired::Granted
    );
    let granted = ledger.snapshot().unwrap();
    let b1 = granted.leases.iter().find(|l| l.trial == "b1").unwrap();
    assert_eq!(b1.ticket, ticket);
    assert!(!granted.requests.iter().any(|r| r.lease.trial == STANDING));
    ledger.release(&a, "a3").unwrap();
    ledger.release(&b, "b1").unwrap();
    // A waiter killed with SIGKILL holds nobody back: its place in line is reclaimed.
    ledger.stand_in_line(&b, "local", &stand_for).unwrap();
    assert!(matches!(
        ledger.acquire(&host_lease(&a, "a6", 12, 0)).unwrap(),
        Acquired::Waiting(_)
    ));
    other.kill().unwrap();
    other.wait().unwrap();
    assert_eq!(
        ledger.acquire(&host_lease(&a, "a6", 12, 0)).unwrap(),
        Acquired::Granted
    );
}

#[test]
fn a_trial_waiting_for_cores_or_memory_of_other_experiments_names_who_holds_them_and_who_asked_first(
) {
    use crate::support::{host, place, scheduler_with, trial};
    use knob_gpu_sched::{Environment, SchedulerConfig};
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let (mut first, a) = child_holder("ca");
    let (mut second, b) = child_holder("cb");
    let c = Holder::this_process("cc");
    // On a 2-core, 24 GiB machine, ca's trial holds 1 core and 10 GiB; cb's trial, asking for
    // both cores and 15 GiB, waits in line; then cc's trial asks for 1 core and 5 GiB.
    let a1 = Lease {
        cpu_total: 2,
        host_memory_total: ByteSize::gib(24),
        ..host_lease(&a, "a1", 1, 10)
    };
    assert_eq!(ledger.acquire(&a1).unwrap(), Acquired::Granted);
    let waits_for = StandFor {
        cpu_cores: 2,
        host_memory: ByteSize::gib(15),
        ..StandFor::default()
    };
    ledger.stand_in_line(&b, "local", &waits_for).unwrap();
    let mut seen_by_c = Environment::new("local", "localhost", Vec::new(), host(2, 24));
    ledger
        .snapshot()
        .unwrap()
        .annotate(&mut seen_by_c, "local", c.pid, None);
    let mut scheduler = scheduler_with(
        SchedulerConfig {
            trial_gpu_number: Some(0),
            trial_cpu_number: Some(1),
            trial_memory_size: Some(ByteSize::gib(5)),
            ..SchedulerConfig::default()
        },
        vec![seen_by_c],
    );
    // One core and 14 GiB are not leased, but promised to cb, which asked first.
    expect_test::expect![[r#"
        c1: wait: waiting for 1 CPU core and 5 GiB of host memory: local: 0 of 2 CPU cores free (1 core held by trial a1 of experiment ca, 2 cores promised first to the waiting trials of experiment cb (asked earlier)), 0 B of memory available (10 GiB held by trial a1 of experiment ca, 15 GiB promised first to the waiting trials of experiment cb (asked earlier))
    "#]]
    .assert_eq(&place(&mut scheduler, &[trial("c1")]));
    first.kill().unwrap();
    first.wait().unwrap();
    second.kill().unwrap();
    second.wait().unwrap();
}
