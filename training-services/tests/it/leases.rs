//! The machine's lease ledger as the local service uses it (two services, one ledger, as two
//! experiments on one machine), and the memory a trial uses: sampled, reported, enforced.

use knob_plugin_api::service::ServiceEvent;
use serde_json::json;

use crate::support::*;

/// A harness whose service uses the ledger in `ledger` (a folder another harness may share).
fn sharing(ledger: &std::path::Path) -> Harness {
    Harness::with_args(
        json!({"gracePeriodSecs": 0.5, "ledgerDir": ledger, "maxTrialNumberPerGpu": 1}),
    )
}

#[test]
fn a_trial_whose_gpu_another_experiment_holds_waits_naming_it_then_starts() {
    let ledger = tempfile::tempdir().unwrap();
    let mut first = sharing(ledger.path());
    let mut second = sharing(ledger.path());
    let hold = first.code_dir().join("release");
    let mut holding = first.request(
        "a1",
        &format!("while [ ! -e {} ]; do sleep 0.05; done", hold.display()),
    );
    holding.experiment_id = "first".into();
    holding.gpu_indices = Some(vec![0]);
    first.service.start(&holding).unwrap();
    first
        .events
        .wait_until("a1 started", |events| !events.is_empty());

    let mut waiting = second.request("b1", "echo KNOB_FINAL 1");
    waiting.experiment_id = "second".into();
    waiting.gpu_indices = Some(vec![0]);
    second.service.start(&waiting).unwrap();
    let events = second
        .events
        .wait_until("b1's waiting reason", |events| !warnings(events).is_empty());
    let reason = &warnings(&events)[0];
    assert!(
        reason.starts_with("waiting: GPU 0 held by trial a1 of experiment first (pid "),
        "{reason}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, ServiceEvent::TrialStarted { .. })),
        "b1 started on a held GPU: {events:#?}"
    );
    std::fs::write(&hold, "").unwrap();
    first.events.wait_ended("a1");
    // Granted at its next retry, then it runs to its end.
    let events = second.events.wait_ended("b1");
    assert_eq!(ending(&events).0, Some(0), "{events:#?}");
    let state = knob_gpu_sched::ledger::Ledger::open(ledger.path())
        .unwrap()
        .snapshot()
        .unwrap();
    assert!(state.leases.is_empty(), "{state:?}");
    assert!(state.requests.is_empty(), "{state:?}");
}

#[test]
fn a_pending_trial_killed_ends_without_starting_and_gives_its_place_back() {
    let ledger = tempfile::tempdir().unwrap();
    let mut first = sharing(ledger.path());
    let mut second = sharing(ledger.path());
    let mut holding = first.request("a1", "sleep 30");
    holding.experiment_id = "first".into();
    holding.gpu_indices = Some(vec![1]);
    first.service.start(&holding).unwrap();
    let mut waiting = second.request("b1", "echo never");
    waiting.experiment_id = "second".into();
    waiting.gpu_indices = Some(vec![1]);
    second.service.start(&waiting).unwrap();
    second.service.kill("b1", "user asked");
    let events = second.events.wait_ended("b1");
    assert!(
        matches!(events.last(), Some(ServiceEvent::TrialEnded { killed_reason: Some(r), exit_code: None, .. }) if r == "user asked"),
        "{events:#?}"
    );
    let state = knob_gpu_sched::ledger::Ledger::open(ledger.path())
        .unwrap()
        .snapshot()
        .unwrap();
    assert_eq!(state.leases.len(), 1, "first's lease stays: {state:?}");
    assert!(state.requests.is_empty(), "b1's request is gone: {state:?}");
    first.service.kill("a1", "done");
    first.events.wait_ended("a1");
}

#[test]
fn a_trial_over_its_memory_request_is_killed_and_its_peak_reported() {
    let mut h = Harness::new();
    let mut request = h.request(
        "big",
        "python3 -c \"import time; block = b'x' * (120 << 20); time.sleep(5)\"",
    );
    request.resources.memory_mib = Some(40);
    let trial_dir = h.trial_dir("big");
    let events = h.run(request);
    let (exit_code, signal, _, stderr_tail) = ending(&events);
    assert!(
        signal == Some(9) || exit_code == Some(137),
        "killed with SIGKILL: {events:#?}"
    );
    assert!(
        stderr_tail
            .contains("more than its 40 MiB request (trialMemorySize); killed as out of memory"),
        "{stderr_tail}"
    );
    let all = h.events.all();
    let peak = usage_of(&all, "big")
        .expect("a usage report")
        .expect("a peak");
    assert!(peak > 40, "peak {peak} MiB");
    assert!(std::fs::read_to_string(trial_dir.join("stderr"))
        .unwrap()
        .contains("killed as out of memory"));

    // Within its request it runs to its end, and its peak is reported too.
    let mut small = h.request(
        "small",
        "python3 -c \"import time; block = b'x' * (20 << 20); time.sleep(0.6)\"",
    );
    small.resources.memory_mib = Some(200);
    let events = h.run(small);
    assert_eq!(ending(&events).0, Some(0), "{events:#?}");
    let peak = usage_of(&h.events.all(), "small").unwrap().unwrap();
    assert!((20..200).contains(&peak), "peak {peak} MiB");
}

/// An experiment whose trials no longer wait (the host says so, or the service stops) leaves
/// the ledger's line at once: another experiment is granted what it stood for then, not once its
/// place lapsed 12 s later.
#[test]
fn an_experiment_whose_trials_no_longer_wait_leaves_the_line_at_once() {
    use knob_gpu_sched::ledger::{Acquired, Holder, Ledger, StandFor, STANDING};
    let dir = tempfile::tempdir().unwrap();
    let mut second = sharing(dir.path());
    // The service learns its experiment from its first trial.
    let mut trial = second.request("b0", "true");
    trial.experiment_id = "second".into();
    second.service.start(&trial).unwrap();
    second.events.wait_ended("b0");
    let ledger = Ledger::open(dir.path()).unwrap();
    let stands = |ledger: &Ledger| {
        ledger
            .snapshot()
            .unwrap()
            .requests
            .iter()
            .any(|r| r.lease.trial == STANDING && r.lease.holder.experiment == "second")
    };
    let first = Holder::this_process("first");
    let wants_gpu_0 = |trial: &str| crate::support::gpu_0_lease(&first, trial, "local");
    // Its trials waited for GPU 0, so it stood in line for it: first's request waits.
    let holder = Holder::this_process("second");
    ledger
        .stand_in_line(&holder, "local", &StandFor::gpus(&[0]))
        .unwrap();
    assert!(matches!(
        ledger.acquire(&wants_gpu_0("a1")).unwrap(),
        Acquired::Waiting(_)
    ));
    // The host says none of its trials waits any more.
    second.service.nothing_waits();
    assert!(!stands(&ledger));
    assert_eq!(
        ledger.acquire(&wants_gpu_0("a1")).unwrap(),
        Acquired::Granted
    );
    ledger.release(&first, "a1").unwrap();
    // The same when the service stops while its trials wait.
    ledger
        .stand_in_line(&holder, "local", &StandFor::gpus(&[0]))
        .unwrap();
    second.service.stop();
    assert!(!stands(&ledger));
    assert_eq!(
        ledger.acquire(&wants_gpu_0("a2")).unwrap(),
        Acquired::Granted
    );
}

/// A trial refused its lease and handed back to the host waits again: the host's word that
/// none waits, sent after that trial's start and before it learned of the hand-back, keeps the
/// experiment's place in line; its next word, once the trial no longer waits, leaves it.
#[test]
fn a_trial_handed_back_keeps_its_experiments_place_in_line() {
    use knob_gpu_sched::ledger::{Acquired, Holder, Ledger, StandFor, STANDING};
    let dir = tempfile::tempdir().unwrap();
    let mut second = sharing(dir.path());
    second.service.set_places_again(true);
    let ledger = Ledger::open(dir.path()).unwrap();
    let first = Holder::this_process("first");
    let holds_gpu_0 = crate::support::gpu_0_lease(&first, "a1", "local");
    assert_eq!(ledger.acquire(&holds_gpu_0).unwrap(), Acquired::Granted);
    let holder = Holder::this_process("second");
    ledger
        .stand_in_line(&holder, "local", &StandFor::gpus(&[0]))
        .unwrap();
    let stands = || {
        ledger
            .snapshot()
            .unwrap()
            .requests
            .iter()
            .any(|r| r.lease.trial == STANDING && r.lease.holder == holder)
    };
    let mut trial = second.request("b1", "true");
    trial.experiment_id = "second".into();
    trial.gpu_indices = Some(vec![0]);
    second.service.start(&trial).unwrap();
    second.events.wait_until("b1 handed back", |events| {
        events
            .iter()
            .any(|e| matches!(e, ServiceEvent::PlaceAgain { .. }))
    });
    second.service.nothing_waits();
    assert!(stands(), "b1 waits again: its place is kept");
    second.service.nothing_waits();
    assert!(!stands());
}

/// A ledger that is not one knob wrote (a half-written file, another program's) holds nothing
/// back: the machine is still reported, so that an experiment starts, with one warning naming
/// the file however often it is probed, and a trial on a GPU runs without a lease.
#[test]
fn an_unreadable_ledger_is_warned_of_once_and_keeps_no_experiment_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    std::fs::create_dir(&ledger).unwrap();
    std::fs::write(ledger.join("gpu-ledger.json"), "garbage{").unwrap();
    let mut harness = sharing(&ledger);
    for _ in 0..3 {
        let environment = harness.service.environment();
        assert!(environment.is_ok(), "{environment:?}");
    }
    let told = warnings(&harness.events.all());
    assert_eq!(told.len(), 1, "{told:#?}");
    assert!(
        told[0].starts_with("cannot read this machine's lease ledger")
            && told[0].contains(&ledger.join("gpu-ledger.json").display().to_string()),
        "{}",
        told[0]
    );
    let mut trial = harness.request("t1", "echo KNOB_FINAL 1");
    trial.experiment_id = "exp".into();
    trial.gpu_indices = Some(vec![0]);
    let events = harness.run(trial);
    assert_eq!(ending(&events).0, Some(0), "{events:#?}");
}

/// A started trial's lease names its process group, which keeps the lease (and the GPU) from
/// another experiment while the trial runs, even after its own experiment is killed with
/// SIGKILL (its trials, in groups of their own, outlive it).
#[test]
fn a_started_trials_lease_names_its_process_group() {
    let ledger = tempfile::tempdir().unwrap();
    let mut harness = sharing(ledger.path());
    let hold = harness.code_dir().join("release");
    let mut trial = harness.request(
        "g1",
        &format!("while [ ! -e {} ]; do sleep 0.05; done", hold.display()),
    );
    trial.experiment_id = "exp".into();
    trial.gpu_indices = Some(vec![0]);
    harness.service.start(&trial).unwrap();
    let events = harness.events.wait_until("g1 started", |events| {
        events
            .iter()
            .any(|e| matches!(e, ServiceEvent::TrialStarted { .. }))
    });
    let pid = events
        .iter()
        .find_map(|e| match e {
            ServiceEvent::TrialStarted { pid, .. } => *pid,
            _ => None,
        })
        .expect("a started trial has a pid");
    let ledger = knob_gpu_sched::ledger::Ledger::open(ledger.path()).unwrap();
    // Recorded just after the start is told: asked again for a bounded while.
    let mut recorded = None;
    for _ in 0..200 {
        let state = ledger.snapshot().unwrap();
        recorded = state.leases.iter().find_map(|lease| lease.process_group);
        if recorded.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(recorded, Some(pid));
    std::fs::write(&hold, "").unwrap();
    harness.events.wait_ended("g1");
    assert!(ledger.snapshot().unwrap().leases.is_empty());
}

/// `KNOB_GPU_LEDGER` takes the booleans configs take: each of these keeps a service out of
/// the ledger (each in a child process of its own, since the variable is process-wide).
#[test]
fn knob_gpu_ledger_off_is_read_in_every_spelling() {
    const NAME: &str = "leases::knob_gpu_ledger_off_is_read_in_every_spelling";
    let home = tempfile::tempdir().unwrap();
    let home = home.path().to_str().unwrap();
    for off in ["0", "false", "off", "No", " FALSE "] {
        if in_child_process(NAME, &[("KNOB_GPU_LEDGER", off), ("KNOB_HOME", home)]).is_none() {
            let leases = knob_training_services::lease::MachineLeases::open_default().unwrap();
            let set = std::env::var("KNOB_GPU_LEDGER");
            assert!(
                leases.is_none(),
                "KNOB_GPU_LEDGER={set:?} left the ledger on"
            );
            return;
        }
    }
}
