//! The four policies, and that each is deterministic.

use expect_test::expect;
use knob_gpu_sched::{Placement, Policy, TrialId, TrialRequest};

use crate::support::{cluster, env, place, place_each, scheduler, trial};

fn ones(count: usize) -> Vec<TrialRequest> {
    (0..count).map(|n| trial(&format!("t{n}"))).collect()
}

#[test]
fn pack_fills_one_machine_before_the_next() {
    let mut scheduler = scheduler(Policy::Pack, cluster(2, 2));
    expect![[r#"
        t0: node0 [0]
        t1: node0 [1]
        t2: node1 [0]
        t3: node1 [1]
        t4: wait: waiting for 1 GPU: node0: no GPU free (GPU 0 runs t0, GPU 1 runs t1); node1: no GPU free (GPU 0 runs t2, GPU 1 runs t3)
    "#]]
    .assert_eq(&place_each(&mut scheduler, &ones(5)));
}

#[test]
fn pack_is_best_fit() {
    // node0 has 1 GPU free, node1 has 3: a 1-GPU trial goes where it leaves the least over,
    // keeping node1 able to take a 3-GPU trial.
    let mut scheduler = scheduler(
        Policy::Pack,
        vec![env("node0", &[80; 2]), env("node1", &[80; 3])],
    );
    let setup = [trial("x").devices([knob_gpu_sched::DeviceRef::new("node0", 0)])];
    assert!(scheduler.place(&setup[0]).is_succeed());
    let requests = [trial("one"), trial("three").gpu_number(3)];
    expect![[r#"
        one: node0 [1]
        three: node1 [0, 1, 2]
    "#]]
    .assert_eq(&place(&mut scheduler, &requests));
}

#[test]
fn spread_balances_machines_and_gpus() {
    let mut scheduler = scheduler(
        Policy::Spread,
        vec![env("node0", &[80; 4]), env("node1", &[80; 2])],
    );
    expect![[r#"
        t0: node0 [0]
        t1: node1 [0]
        t2: node0 [1]
        t3: node0 [2]
        t4: node1 [1]
    "#]]
    .assert_eq(&place_each(&mut scheduler, &ones(5)));
}

#[test]
fn round_robin_takes_environments_in_turn_and_skips_full_ones() {
    let mut scheduler = scheduler(
        Policy::RoundRobin,
        vec![env("a", &[80]), env("b", &[80; 3]), env("c", &[80])],
    );
    expect![[r#"
        t0: a [0]
        t1: b [0]
        t2: c [0]
        t3: b [1]
        t4: b [2]
        t5: wait: waiting for 1 GPU: a: no GPU free (GPU 0 runs t0); b: no GPU free (GPU 0 runs t1, GPU 1 runs t3, GPU 2 runs t4); c: no GPU free (GPU 0 runs t2)
    "#]]
    .assert_eq(&place_each(&mut scheduler, &ones(6)));
}

#[test]
fn recently_idle_prefers_where_a_trial_just_ended() {
    let mut scheduler = scheduler(Policy::RecentlyIdle, cluster(3, 2));
    let first = ones(6);
    place_each(&mut scheduler, &first);
    // Trials end on node2, node0, node1 in that order: the newest release wins, and each
    // release is used once.
    scheduler.release(&TrialId::from("t2")).unwrap();
    scheduler.release(&TrialId::from("t0")).unwrap();
    scheduler.release(&TrialId::from("t1")).unwrap();
    let next = [trial("n0"), trial("n1"), trial("n2")];
    expect![[r#"
        n0: node1 [0]
        n1: node0 [0]
        n2: node2 [0]
    "#]]
    .assert_eq(&place_each(&mut scheduler, &next));
}

#[test]
fn recently_idle_without_releases_is_round_robin() {
    let mut idle = scheduler(Policy::RecentlyIdle, cluster(3, 2));
    let mut round_robin = scheduler(Policy::RoundRobin, cluster(3, 2));
    let requests = ones(6);
    assert_eq!(
        place_each(&mut idle, &requests),
        place_each(&mut round_robin, &requests)
    );
}

/// A scripted mix of placements and releases, replayed twice per policy: the outcomes match.
#[test]
fn every_policy_is_deterministic() {
    for policy in Policy::ALL {
        let run = || {
            let mut scheduler = scheduler(policy, cluster(5, 4));
            let mut outcomes = Vec::new();
            let mut state: u64 = 7;
            let mut live: Vec<TrialId> = Vec::new();
            for step in 0..300 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if state >> 62 == 0 && !live.is_empty() {
                    let victim = live.remove((state >> 33) as usize % live.len());
                    scheduler.release(&victim);
                    continue;
                }
                let request = trial(&format!("s{step}")).gpu_number(1 + (state >> 40) as u32 % 3);
                let placement = scheduler.place(&request);
                if placement.is_succeed() {
                    live.push(request.trial.clone());
                }
                outcomes.push(placement);
            }
            outcomes
        };
        let first: Vec<Placement> = run();
        assert_eq!(first, run(), "{policy} differs between runs");
        assert!(first.iter().any(Placement::is_succeed));
    }
}

#[test]
fn policy_names_parse_like_nni_configs() {
    for (text, policy) in [
        ("pack", Policy::Pack),
        ("Best_Fit", Policy::Pack),
        ("spread", Policy::Spread),
        ("least-loaded", Policy::Spread),
        ("round-robin", Policy::RoundRobin),
        ("ROUND_ROBIN", Policy::RoundRobin),
        ("recently-idle", Policy::RecentlyIdle),
    ] {
        assert_eq!(text.parse::<Policy>(), Ok(policy), "{text}");
    }
    expect!["unknown placement policy `random`: use pack, spread, round-robin or recently-idle"]
        .assert_eq(&"random".parse::<Policy>().unwrap_err().to_string());
    assert_eq!(Policy::default(), Policy::RecentlyIdle);
    let from_json: Policy = serde_json::from_str("\"best-fit\"").unwrap();
    assert_eq!(from_json, Policy::Pack);
}

/// On a full cluster every policy finds the one environment where a trial just ended, and
/// after an environment is removed (the later ones move up a position) each still takes them
/// in its order: the environments with a free GPU are kept by position as they change, and
/// with so few of them (2 of 19) the policies walk those alone.
#[test]
fn every_policy_finds_the_freed_gpu_of_a_full_cluster_and_follows_a_removal() {
    for policy in Policy::ALL {
        let mut scheduler = scheduler(policy, cluster(20, 1));
        let placed = place_each(&mut scheduler, &ones(20));
        assert!(!placed.contains("wait"), "{policy:?}: {placed}");
        assert!(!scheduler.place(&trial("late")).is_succeed(), "{policy:?}");
        for (ended, node) in [("t12", "node12"), ("t0", "node0")] {
            scheduler.release(&TrialId::from(ended));
            let next = format!("after-{ended}");
            assert_eq!(
                scheduler.place(&trial(&next)),
                Placement::Succeed {
                    environment: node.into(),
                    gpu_indices: Some(vec![0]),
                },
                "{policy:?}"
            );
        }
        // node1 goes; the later nodes move up. Free GPUs on node0 and node19 only.
        scheduler.release(&TrialId::from("after-t0"));
        scheduler.release(&TrialId::from("t19"));
        scheduler
            .remove_environment(&"node1".into())
            .expect("node1 is registered");
        let mut took = Vec::new();
        for n in 0..3 {
            match scheduler.place(&trial(&format!("again{n}"))) {
                Placement::Succeed { environment, .. } => took.push(environment.to_string()),
                _ => took.push("wait".to_owned()),
            }
        }
        took.sort();
        assert_eq!(took, ["node0", "node19", "wait"], "{policy:?}");
    }
}
