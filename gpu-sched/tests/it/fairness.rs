//! Waiting trials are served in order, and a large request is not starved by small ones.

use expect_test::expect;
use knob_gpu_sched::{DeviceRef, Policy, TrialId, TrialRequest};

use crate::support::{env, place, scheduler, trial};

/// Occupies the named GPUs of `host` with trials `r<index>`.
fn occupy(scheduler: &mut knob_gpu_sched::Scheduler, host: &str, indices: &[u32]) {
    for &index in indices {
        let request = trial(&format!("r{index}")).devices([DeviceRef::new(host, index)]);
        assert!(scheduler.place(&request).is_succeed());
    }
}

#[test]
fn a_large_request_holds_what_it_waits_for() {
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[80; 4])]);
    occupy(&mut scheduler, "local", &[0, 1, 2]);
    let queue = [trial("big").gpu_number(4), trial("small")];
    expect![[r#"
        big: wait: waiting for 4 GPUs: local: 1 of 4 GPUs free (GPU 0 runs r0, GPU 1 runs r1, GPU 2 runs r2)
        small: wait: waiting for 1 GPU: local: no GPU free (GPU 0 held for waiting trial big, GPU 1 held for waiting trial big, GPU 2 held for waiting trial big, GPU 3 held for waiting trial big)
    "#]]
    .assert_eq(&place(&mut scheduler, &queue));

    // As GPUs free up, they stay with the big trial rather than going to the small one.
    scheduler.release(&TrialId::from("r0"));
    scheduler.release(&TrialId::from("r1"));
    let placements = scheduler.place_queue(&queue);
    assert!(placements.iter().all(|placement| !placement.is_succeed()));
    scheduler.release(&TrialId::from("r2"));
    expect![[r#"
        big: local [0, 1, 2, 3]
        small: wait: waiting for 1 GPU: local: no GPU free (GPU 0 runs big, GPU 1 runs big, GPU 2 runs big, GPU 3 runs big)
    "#]]
    .assert_eq(&place(&mut scheduler, &queue));
}

#[test]
fn younger_trials_backfill_what_nobody_older_waits_for() {
    let mut scheduler = scheduler(Policy::Pack, vec![env("a", &[80; 4]), env("b", &[80; 2])]);
    occupy(&mut scheduler, "a", &[0, 1, 2]);
    let queue = [
        trial("big").gpu_number(4),
        trial("s1"),
        trial("s2"),
        trial("s3"),
    ];
    expect![[r#"
        big: wait: waiting for 4 GPUs: a: 1 of 4 GPUs free (GPU 0 runs r0, GPU 1 runs r1, GPU 2 runs r2)
        s1: b [0]
        s2: b [1]
        s3: wait: waiting for 1 GPU: a: no GPU free (GPU 0 held for waiting trial big, GPU 1 held for waiting trial big, GPU 2 held for waiting trial big, GPU 3 held for waiting trial big); b: no GPU free (GPU 0 runs s1, GPU 1 runs s2)
    "#]]
    .assert_eq(&place(&mut scheduler, &queue));
}

#[test]
fn a_stream_of_small_trials_does_not_starve_a_large_one() {
    // Four GPUs, always four small trials running, and a new small trial queued behind the big
    // one each time one ends. Without holds, every freed GPU would go to a small trial forever.
    let mut scheduler = scheduler(Policy::RecentlyIdle, vec![env("local", &[80; 4])]);
    occupy(&mut scheduler, "local", &[0, 1, 2, 3]);
    let mut running: Vec<TrialId> = (0..4).map(|n| TrialId::from(format!("r{n}"))).collect();
    let mut queue: Vec<TrialRequest> = vec![trial("big").gpu_number(4)];
    let mut big_placed_after = None;
    for finished in 1..=20 {
        let ended = running.remove(0);
        scheduler.release(&ended);
        queue.push(trial(&format!("s{finished}")));
        let placements = scheduler.place_queue(&queue);
        let mut still_waiting = Vec::new();
        for (request, placement) in queue.drain(..).zip(placements) {
            if placement.is_succeed() {
                if request.trial.as_str() == "big" {
                    big_placed_after = Some(finished);
                }
                running.push(request.trial);
            } else {
                still_waiting.push(request);
            }
        }
        queue = still_waiting;
        if big_placed_after.is_some() {
            break;
        }
    }
    // The big trial starts as soon as the four GPUs running when it arrived have ended.
    assert_eq!(big_placed_after, Some(4));
}

#[test]
fn equal_requests_are_served_oldest_first() {
    let mut scheduler = scheduler(Policy::Spread, vec![env("local", &[80; 2])]);
    let queue: Vec<_> = ["first", "second", "third", "fourth"]
        .into_iter()
        .map(trial)
        .collect();
    expect![[r#"
        first: local [0]
        second: local [1]
        third: wait: waiting for 1 GPU: local: no GPU free (GPU 0 runs first, GPU 1 runs second)
        fourth: wait: waiting for 1 GPU: local: no GPU free (GPU 0 held for waiting trial third, GPU 1 runs second)
    "#]]
    .assert_eq(&place(&mut scheduler, &queue));
}

#[test]
fn holds_last_only_for_one_pass() {
    // Nothing is remembered between calls: a waiting trial that is cancelled (absent from the
    // next queue) holds nothing any more.
    let mut scheduler = scheduler(Policy::Pack, vec![env("local", &[80; 2])]);
    occupy(&mut scheduler, "local", &[0]);
    let waiting = scheduler.place_queue(&[trial("big").gpu_number(2), trial("small")]);
    assert!(!waiting[1].is_succeed());
    assert!(scheduler.place(&trial("small")).is_succeed());
    // The same again over an inventory that grew in between: what a pass held is let go
    // whichever environments it held on.
    scheduler
        .upsert_environment(env("second", &[80; 2]))
        .unwrap();
    let on_second = trial("s0").devices([DeviceRef::new("second", 0)]);
    assert!(scheduler.place(&on_second).is_succeed());
    let waiting = scheduler.place_queue(&[trial("big2").gpu_number(2), trial("small2")]);
    assert!(
        !waiting[0].is_succeed() && !waiting[1].is_succeed(),
        "{waiting:?}"
    );
    assert!(scheduler.place(&trial("small2")).is_succeed());
}

#[test]
fn an_unexplained_pass_decides_the_same_and_leaves_the_reasons_empty() {
    let envs = vec![env("a", &[80; 4]), env("b", &[80; 2])];
    let queue = [
        trial("big").gpu_number(4),
        trial("s1"),
        trial("s2"),
        trial("s3"),
    ];
    let mut explained = scheduler(Policy::Pack, envs.clone());
    let mut unexplained = scheduler(Policy::Pack, envs);
    occupy(&mut explained, "a", &[0, 1, 2]);
    occupy(&mut unexplained, "a", &[0, 1, 2]);
    let with = explained.place_queue_with(&queue, knob_gpu_sched::Reasons::Explained);
    let without = unexplained.place_queue_with(&queue, knob_gpu_sched::Reasons::Unexplained);
    assert_eq!(with.len(), without.len());
    let mut waited = 0;
    for (with, without) in with.iter().zip(&without) {
        match (with, without) {
            (
                knob_gpu_sched::Placement::TmpNoAvailableGpu { reason },
                knob_gpu_sched::Placement::TmpNoAvailableGpu { reason: empty },
            ) => {
                assert!(reason.starts_with("waiting for"), "{reason}");
                assert_eq!(empty, "");
                waited += 1;
            }
            (with, without) => assert_eq!(with, without),
        }
    }
    assert_eq!(waited, 2, "big and s3 wait: {with:?}");
    // The two schedulers hold the same trials afterwards.
    let held = |s: &knob_gpu_sched::Scheduler| {
        s.assignments()
            .map(|a| (a.trial.to_string(), a.environment.to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(held(&explained), held(&unexplained));
}
