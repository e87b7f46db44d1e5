//! The deterministic simulator (`knob_core::sim`): the real manager, store and gpu-sched on
//! tokio's paused clock, with an in-process tuner, assessor and training service. Each seed is a
//! small random scenario whose invariants are checked; a failing one prints the line that runs it
//! again alone (`KNOB_SIM_SEED=<seed>`).

use std::time::Duration;

use knob_core::sim::{self, Report, Scenario};

/// How many seeded scenarios a plain `cargo test` runs (`KNOB_SIM_SEEDS` changes it).
const SEEDS: u64 = 200;

fn play(scenario: &Scenario) -> Report {
    let dir = tempfile::tempdir().expect("a temporary folder");
    sim::run(scenario, dir.path())
}

fn explain(report: &Report) -> String {
    format!(
        "seed {} broke {} invariant(s):\n  {}\nscenario: {:?}\noutcome: {:?}\nrun it alone: {}",
        report.scenario.seed,
        report.violations.len(),
        report.violations.join("\n  "),
        report.scenario,
        report
            .outcome
            .as_ref()
            .map(|o| (o.status, o.message.clone())),
        report.rerun_hint()
    )
}

#[test]
fn seeded_scenarios_keep_the_invariants() {
    let seeds: Vec<u64> = match std::env::var("KNOB_SIM_SEED") {
        Ok(seed) => vec![seed.parse().expect("KNOB_SIM_SEED is a seed number (u64)")],
        Err(_) => {
            let count = std::env::var("KNOB_SIM_SEEDS")
                .ok()
                .map(|n| n.parse().expect("KNOB_SIM_SEEDS is a number of seeds"))
                .unwrap_or(SEEDS);
            (0..count).collect()
        }
    };
    let mut failures = Vec::new();
    let (mut trials, mut attempts) = (0, 0);
    for seed in seeds {
        let report = play(&Scenario::small(seed));
        trials += report.trials;
        attempts += report.attempts;
        if !report.violations.is_empty() {
            failures.push(explain(&report));
        }
    }
    eprintln!("simulator: {trials} trials, {attempts} attempts");
    assert!(
        failures.is_empty(),
        "{} scenario(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn a_seed_replays_the_same_run() {
    let scenario = Scenario::small(7);
    let (first, second) = (play(&scenario), play(&scenario));
    let summary = |report: &Report| {
        let outcome = report.outcome.as_ref().expect("the run ends");
        let mut trials: Vec<_> = outcome
            .trials
            .iter()
            .map(|t| (t.sequence, t.status, t.final_value.map(f64::to_bits)))
            .collect();
        trials.sort();
        (outcome.status, trials, report.simulated, report.attempts)
    };
    assert_eq!(summary(&first), summary(&second));
}

/// Seeds whose scenario has what `what` picks, among the first `limit`.
fn seeds_with(what: impl Fn(&Scenario) -> bool, count: usize, limit: u64) -> Vec<Scenario> {
    (0..limit)
        .map(Scenario::small)
        .filter(|scenario| what(scenario))
        .take(count)
        .collect()
}

fn assert_sound(reports: &[Report]) {
    let failures: Vec<String> = reports
        .iter()
        .filter(|report| !report.violations.is_empty())
        .map(explain)
        .collect();
    assert!(
        failures.is_empty(),
        "{} scenario(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn a_manager_killed_mid_run_is_resumed_from_its_store_without_losing_or_repeating_an_attempt() {
    // Each crashes at a seeded time; a new manager resumes from the store as `knob resume`
    // does, the services end what was left of the runs, and every invariant still holds (the
    // seeded test above has crashes among its scenarios too).
    let scenarios = seeds_with(|s| s.crash_at.is_some(), 12, 400);
    assert!(scenarios.len() >= 12, "few crash scenarios among the seeds");
    let reports: Vec<Report> = scenarios.iter().map(play).collect();
    assert_sound(&reports);
    // A crash due after the run ended does not happen.
    let resumed = reports.iter().filter(|report| report.resumed == 1).count();
    assert!(
        resumed >= 6,
        "only {resumed} of 12 runs crashed and resumed"
    );
    // Some crashes left runs behind, which the resumed manager's services ended.
    assert!(
        reports.iter().map(|r| r.crash_losses).sum::<u64>() > 0,
        "no crash caught a trial running"
    );
}

#[test]
fn a_trial_the_manager_decided_to_stop_ends_so_after_a_crash_instead_of_running_again() {
    // Each crashes while a run the assessor stopped is still being killed (a simulated kill
    // takes 10 ms to 3 s): the stop was decided and recorded, its end was not. The resumed
    // manager must end the trial as decided; the checks fail on any start or requeue of a
    // trial after the manager decided to end it. Before the decision was recorded, the resume
    // ran such a trial again (a PBT member its tuner had replaced then trained beside its
    // successor, two members in one slot).
    let scenarios: Vec<Scenario> = seeds_with(
        |s| {
            s.assessor_threshold.is_some()
                && s.stop_at.is_none()
                && s.max_experiment_duration.is_none()
        },
        10,
        2000,
    )
    .into_iter()
    .map(|mut scenario| {
        // At the first stop's kill; nearly every trial is stopped at its third result.
        scenario.crash_at = Some(Duration::from_secs(1));
        scenario.assessor_threshold = Some(0.95);
        scenario.crash_while_killing = true;
        scenario
    })
    .collect();
    assert!(scenarios.len() >= 10, "few such scenarios among the seeds");
    let reports: Vec<Report> = scenarios.iter().map(play).collect();
    assert_sound(&reports);
    // A crash comes only with a kill on its way.
    let resumed = reports.iter().filter(|report| report.resumed == 1).count();
    assert!(
        resumed >= 5,
        "only {resumed} of 10 runs crashed while a stopped trial was being killed"
    );
}

#[test]
fn start_failures_and_several_training_services_keep_the_invariants() {
    let scenarios = seeds_with(|s| s.p_start_fail > 0.05 && s.services >= 2, 10, 2000);
    assert!(scenarios.len() >= 5, "few such scenarios among the seeds");
    let reports: Vec<Report> = scenarios.iter().map(play).collect();
    assert_sound(&reports);
    assert!(
        reports.iter().map(|r| r.start_failures).sum::<u64>() > 0,
        "no start was refused"
    );
    // The second service's refusals come late (`ServiceEvent::StartFailed`); those that say
    // nothing ran are asked for again.
    assert!(
        reports.iter().map(|r| r.retried_starts).sum::<u64>() > 0,
        "no start refused late was tried again"
    );
}

#[test]
fn a_trial_killed_while_its_start_is_under_way_stays_killed_when_the_start_fails() {
    // The second service refuses starts late, half of them saying nothing ran (which the
    // manager tries again); the user kills each such trial before the refusal arrives. The
    // kill must hold: the trial ends USER_CANCELED and is never started again (the checks).
    // Before, a refusal that said nothing ran cleared the kill and placed the trial again.
    let scenarios: Vec<Scenario> = seeds_with(
        |s| s.p_start_fail > 0.05 && s.services >= 2 && s.crash_at.is_none(),
        10,
        2000,
    )
    .into_iter()
    .map(|mut scenario| {
        scenario.user_kills_failing_starts = true;
        scenario
    })
    .collect();
    assert!(scenarios.len() >= 5, "few such scenarios among the seeds");
    let reports: Vec<Report> = scenarios.iter().map(play).collect();
    assert_sound(&reports);
    assert!(
        reports.iter().map(|r| r.user_kills).sum::<u64>() >= 5,
        "the user killed fewer than 5 trials while their starts were under way"
    );
}

#[test]
fn waiting_trials_have_the_machines_probed_again_while_other_trials_keep_the_loop_busy() {
    // Twice as many trials wanted as GPUs: half of them always wait, while the running ones
    // report every simulated second. The machines must still be probed again every 5 s (a GPU
    // freed outside knob is seen only so); the re-probe used to be put off by every event's
    // placement round and never came.
    let mut scenario = Scenario::large(11, 120, 20, 1);
    scenario.trial_concurrency = 40;
    scenario.duration = (Duration::from_secs(60), Duration::from_secs(120));
    scenario.intermediate_every = Duration::from_secs(1);
    let report = play(&scenario);
    let (simulated, reprobes) = (report.simulated, report.wakes.reprobes);
    assert_sound(&[report]);
    // Trials wait for all but the last minute or two of the run.
    let owed = simulated.saturating_sub(Duration::from_secs(240)).as_secs() / 5;
    assert!(
        owed >= 20 && reprobes >= owed * 3 / 4,
        "{reprobes} re-probes in {simulated:?} of waiting trials (about {owed} owed)"
    );
}

#[test]
fn an_intermediate_result_reported_twice_is_stored_once_with_or_without_an_assessor() {
    // Without an assessor the manager does not wait for an intermediate result's commit (nothing
    // acts on it), so the store's refusal of the second copy reaches it later, by another path
    // than the one it waits on with an assessor: both must warn and go on.
    for assessor in [None, Some(0.2)] {
        let mut scenario = Scenario::large(5, 40, 4, 2);
        scenario.duration = (Duration::from_secs(300), Duration::from_secs(900));
        scenario.intermediate_every = Duration::from_secs(60);
        scenario.p_duplicate_metric = 0.3;
        scenario.assessor_threshold = assessor;
        let dir = tempfile::tempdir().expect("a temporary folder");
        let report = sim::run(&scenario, dir.path());
        assert!(
            matches!(&report.outcome, Ok(o) if o.status == knob_core::store::ExperimentStatus::Done),
            "assessor {assessor:?}: {:?}",
            report
                .outcome
                .as_ref()
                .map(|o| (o.status, o.message.clone()))
        );
        assert_sound(&[report]);
        let state = knob_core::store::StoreReader::open(&dir.path().join("sim"))
            .and_then(|reader| reader.replay())
            .expect("the store replays");
        let warned = state
            .warnings
            .iter()
            .filter(|w| w.message == "duplicate metric ignored")
            .count();
        assert!(
            warned >= 10,
            "assessor {assessor:?}: {warned} duplicates warned"
        );
        for trial in &state.trials {
            let mut seen = std::collections::HashSet::new();
            for metric in &trial.metrics {
                assert!(
                    seen.insert((metric.attempt, metric.kind, metric.trial_sequence)),
                    "{} stored {metric:?} twice",
                    trial.trial_id
                );
            }
        }
    }
}

#[test]
fn a_service_that_never_reports_a_killed_trials_end_holds_it_only_for_its_patience() {
    // The service loses the report of a third of the runs' ends, their own and their kills'
    // (a third-party service that sends none): the run is over there, but the manager hears
    // nothing. `maxTrialDuration` kills a trial whose own end was lost; a kill, whoever decided
    // it (the deadline, the assessor, a stop, `maxExperimentDuration`), is followed by the
    // manager's patience, after which it records the end itself. Before, such a trial stayed
    // RUNNING for ever: the experiment, its stop and its deadline never ended.
    let scenarios: Vec<Scenario> = seeds_with(|s| s.crash_at.is_none(), 16, 400)
        .into_iter()
        .enumerate()
        .map(|(i, mut scenario)| {
            scenario.p_end_unreported = 0.3;
            scenario.max_trial_duration = Some(Duration::from_secs(120));
            scenario.duration = (Duration::from_secs(20), Duration::from_secs(240));
            // Some stop, some run out of time, the rest end by themselves.
            match i % 4 {
                0 => scenario.stop_at = Some(Duration::from_secs(200)),
                1 => scenario.max_experiment_duration = Some(Duration::from_secs(300)),
                _ => {}
            }
            scenario
        })
        .collect();
    let dirs: Vec<_> = scenarios
        .iter()
        .map(|_| tempfile::tempdir().expect("a temporary folder"))
        .collect();
    let reports: Vec<Report> = scenarios
        .iter()
        .zip(&dirs)
        .map(|(scenario, dir)| sim::run(scenario, dir.path()))
        .collect();
    assert_sound(&reports);
    assert!(
        reports.iter().map(|r| r.ends_unreported).sum::<u64>() >= 16,
        "few ends went unreported"
    );
    // The manager recorded those ends itself, saying so, and ended each experiment as it would
    // have: by itself, stopped, or out of time.
    let mut recorded = 0;
    for (report, dir) in reports.iter().zip(&dirs) {
        let outcome = report.outcome.as_ref().expect("the run ends");
        let expected = match report.scenario.stop_at {
            Some(_) => knob_core::store::ExperimentStatus::Stopped,
            None => knob_core::store::ExperimentStatus::Done,
        };
        assert_eq!(outcome.status, expected, "{}", report.rerun_hint());
        // A stop, or the end of the time budget, waits for such a trial at most the patience
        // (`knob stop` returns within it).
        let ends_by = report
            .scenario
            .stop_at
            .or(report.scenario.max_experiment_duration);
        if let Some(at) = ends_by {
            assert!(
                report.simulated <= at + Duration::from_secs(61),
                "{}: ended {:?} after the stop or deadline at {at:?}",
                report.rerun_hint(),
                report.simulated.saturating_sub(at)
            );
        }
        let state = knob_core::store::StoreReader::open(&dir.path().join("sim"))
            .and_then(|reader| reader.replay())
            .expect("the store replays");
        recorded += state
            .warnings
            .iter()
            .filter(|w| {
                w.message
                    .contains("training service sim never reported its end")
            })
            .count();
        for trial in &state.trials {
            assert!(
                trial.status.is_final(),
                "{}: trial {} left {:?}",
                report.rerun_hint(),
                trial.trial_id,
                trial.status
            );
        }
    }
    assert!(
        recorded >= 8,
        "the manager recorded {recorded} unreported ends"
    );
}
