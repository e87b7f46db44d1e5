//! The experiment store, on real SQLite files: round trips, counters, acknowledgements, group
//! commit, a SIGKILLed writer, and the one-line errors for files that are not a store.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use expect_test::{expect, Expect};
use knob_core::config::{Constraint, ConstraintOp, ObjectiveConfig};
use knob_core::objectives::Ranking;
use knob_core::store::{
    Direction, ExperimentStatus, MetricKind, Rejection, Store, StoreError, StoreEvent,
    StoreOptions, StoreReader, TrialQuery, TrialStatus, DB_FILE_NAME,
};
use rusqlite::Connection;
use serde_json::json;

fn created() -> StoreEvent {
    StoreEvent::ExperimentCreated {
        experiment_id: "exp1".to_string(),
        config: json!({"trialConcurrency": 2, "trainingService": {"platform": "local"}}),
        start_time_ms: 1_700_000_000_000,
    }
}

fn trial(trial_id: &str, sequence: u64) -> StoreEvent {
    StoreEvent::TrialCreated {
        trial_id: trial_id.to_string(),
        sequence,
        parameter_id: sequence,
        parameter_label: None,
        parameters: json!({"lr": 0.01 * (sequence + 1) as f64, "optimizer": "adam"}),
        lineage: None,
    }
}

fn started(trial_id: &str, attempt: u32) -> StoreEvent {
    StoreEvent::TrialStarted {
        trial_id: trial_id.to_string(),
        attempt,
        environment_id: "local".to_string(),
        gpu_indices: vec![0, 1],
        pid: Some(4242),
    }
}

fn ended(trial_id: &str, attempt: u32, status: TrialStatus) -> StoreEvent {
    StoreEvent::TrialEnded {
        trial_id: trial_id.to_string(),
        attempt,
        status,
        exit_code: Some(1),
        signal: None,
        message: Some("exit code 1".to_string()),
        stderr_tail: Some("Traceback ...\nValueError: boom\n".to_string()),
        peak_memory_mib: None,
        peak_gpu_memory_mib: None,
        ended_ms: None,
    }
}

fn metric(trial_id: &str, kind: MetricKind, trial_sequence: u64, raw: &str) -> StoreEvent {
    StoreEvent::Metric {
        trial_id: trial_id.to_string(),
        attempt: 1,
        kind,
        trial_sequence,
        raw: raw.to_string(),
        value: raw.parse::<f64>().ok().filter(|v| v.is_finite()),
    }
}

/// Appends and waits, panicking on failure: for set-up steps.
fn put(store: &Store, event: StoreEvent) -> u64 {
    store.append(event).wait().unwrap()
}

/// An error as its message, with the temp folder replaced by `$DIR`.
fn check_error(dir: &Path, error: StoreError, expect: Expect) {
    let text = error
        .to_string()
        .replace(&dir.display().to_string(), "$DIR");
    assert!(!text.contains('\n'), "not one line: {text}");
    expect.assert_eq(&text);
}

#[test]
fn every_event_type_round_trips_through_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let events = vec![
        created(),
        StoreEvent::ExperimentStatusChanged {
            status: ExperimentStatus::Running,
            message: None,
            spent_before_ms: None,
        },
        StoreEvent::ConfigUpdated {
            field: "trialConcurrency".to_string(),
            value: json!(4),
        },
        StoreEvent::ConfigUpdated {
            field: "tuner.classArgs.optimize_mode".to_string(),
            value: json!("maximize"),
        },
        trial("AbCdE", 0),
        started("AbCdE", 1),
        metric("AbCdE", MetricKind::Intermediate, 0, "0.5"),
        metric("AbCdE", MetricKind::Intermediate, 1, "NaN"),
        metric(
            "AbCdE",
            MetricKind::Final,
            0,
            r#"{"default": 0.75, "loss": 1.5}"#,
        ),
        ended("AbCdE", 1, TrialStatus::Succeeded),
        trial("FgHiJ", 1),
        started("FgHiJ", 1),
        metric("FgHiJ", MetricKind::Intermediate, 0, "0.1"),
        ended("FgHiJ", 1, TrialStatus::Failed),
        StoreEvent::TrialRequeued {
            trial_id: "FgHiJ".to_string(),
            reason: "retry 1 of 2 after exit code 1".to_string(),
            memory_request_mib: Some(512),
            gpu_memory_request_mib: Some(6000),
            peak_memory_mib: Some(700),
            peak_gpu_memory_mib: Some(3000),
        },
        started("FgHiJ", 2),
        StoreEvent::Metric {
            trial_id: "FgHiJ".to_string(),
            attempt: 2,
            kind: MetricKind::Final,
            trial_sequence: 0,
            raw: "0.25".to_string(),
            value: Some(0.25),
        },
        ended("FgHiJ", 2, TrialStatus::EarlyStopped),
        trial("KlMnO", 2),
        ended("KlMnO", 0, TrialStatus::UserCanceled),
        StoreEvent::Warning {
            trial_id: Some("zzzzz".to_string()),
            message: "metric for a trial that is not running, rejected".to_string(),
        },
        StoreEvent::Warning {
            trial_id: None,
            message: "tuner slow".to_string(),
        },
        StoreEvent::ExperimentStatusChanged {
            status: ExperimentStatus::Done,
            message: Some("maxTrialNumber reached".to_string()),
            spent_before_ms: None,
        },
    ];
    let acks: Vec<_> = events.iter().cloned().map(|e| store.append(e)).collect();
    let seqs: Vec<u64> = acks.into_iter().map(|ack| ack.wait().unwrap()).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());

    let reader = store.reader().unwrap();
    let logged: Vec<StoreEvent> = reader
        .events_since(0, u64::MAX)
        .unwrap()
        .into_iter()
        .map(|record| record.event)
        .collect();
    assert_eq!(logged, events);
    // The raised requests as the trial rows (`knob trial ls`, the API) show them.
    let row = reader.trial("FgHiJ").unwrap().unwrap();
    assert_eq!(
        (row.memory_request_mib, row.gpu_memory_request_mib),
        (Some(512), Some(6000))
    );
    // And what the attempt they were learned from used.
    assert_eq!(
        (row.memory_request_peak_mib, row.gpu_memory_request_peak_mib),
        (Some(700), Some(3000))
    );
    let tail = reader.events_since(20, 2).unwrap();
    assert_eq!(tail.iter().map(|r| r.seq).collect::<Vec<_>>(), [21, 22]);

    drop(store);
    let state = StoreReader::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.experiment_id, "exp1");
    assert_eq!(state.start_time_ms, 1_700_000_000_000);
    assert_eq!(state.status, ExperimentStatus::Done);
    assert_eq!(
        state.status_message.as_deref(),
        Some("maxTrialNumber reached")
    );
    assert_eq!(
        state.config,
        json!({"trialConcurrency": 4, "trainingService": {"platform": "local"},
               "tuner": {"classArgs": {"optimize_mode": "maximize"}}})
    );
    assert_eq!(state.last_event_seq, events.len() as u64);
    assert_eq!(state.counters.next_event_seq, events.len() as u64 + 1);
    assert_eq!(state.counters.next_trial_sequence, 3);
    assert_eq!(state.counters.next_parameter_id, 3);
    assert_eq!(state.warnings.len(), 2);
    assert_eq!(state.config_updates.len(), 2);
    let statuses: Vec<_> = state.status_history.iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [
            ExperimentStatus::Initialized,
            ExperimentStatus::Running,
            ExperimentStatus::Done
        ]
    );

    let first = state.trial("AbCdE").unwrap();
    assert_eq!(first.status, TrialStatus::Succeeded);
    assert_eq!(first.parameters, json!({"lr": 0.01, "optimizer": "adam"}));
    assert_eq!(first.attempts.len(), 1);
    assert_eq!(first.attempts[0].gpu_indices, [0, 1]);
    assert_eq!(first.attempts[0].pid, Some(4242));
    let end = first.end.as_ref().unwrap();
    assert_eq!(
        end.stderr_tail.as_deref(),
        Some("Traceback ...\nValueError: boom\n")
    );
    assert_eq!(first.metrics.len(), 3);
    assert_eq!(first.metrics[1].raw, "NaN");
    assert_eq!(first.metrics[1].value, None);
    assert_eq!(
        first.final_metric().unwrap().raw,
        r#"{"default": 0.75, "loss": 1.5}"#
    );
    assert!(first.started_ms().unwrap() <= first.ended_ms().unwrap());

    // The retried trial keeps each attempt's end and metrics apart.
    let retried = state.trial("FgHiJ").unwrap();
    assert_eq!(retried.status, TrialStatus::EarlyStopped);
    assert_eq!(retried.current_attempt(), 2);
    assert_eq!(
        retried.attempts[0].end.as_ref().unwrap().status,
        TrialStatus::Failed
    );
    assert_eq!(
        retried.attempts[0].requeued.as_ref().unwrap().reason,
        "retry 1 of 2 after exit code 1"
    );
    assert_eq!(
        (
            retried.attempts[0].peak_memory_mib,
            retried.attempts[0].peak_gpu_memory_mib
        ),
        (Some(700), Some(3000))
    );
    // What a resume starts the trial's next attempts with.
    assert_eq!(
        (retried.memory_request_mib, retried.gpu_memory_request_mib),
        (Some(512), Some(6000))
    );
    assert_eq!(
        retried.attempts[1].end.as_ref().unwrap().status,
        TrialStatus::EarlyStopped
    );
    let attempts: Vec<u32> = retried.metrics.iter().map(|m| m.attempt).collect();
    assert_eq!(attempts, [1, 2]);
    assert_eq!(retried.final_metric().unwrap().value, Some(0.25));

    let never_started = state.trial("KlMnO").unwrap();
    assert_eq!(never_started.status, TrialStatus::UserCanceled);
    assert!(never_started.attempts.is_empty());

    // Timestamps never decrease along the log.
    let reader = StoreReader::open(dir.path()).unwrap();
    let times: Vec<i64> = reader
        .events_since(0, 100)
        .unwrap()
        .iter()
        .map(|r| r.time_ms)
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
}

#[test]
fn best_trials_leave_out_results_that_break_a_constraint_however_many_rank_above() {
    let ids = |rows: Vec<knob_core::store::TrialRow>| -> Vec<String> {
        rows.into_iter().map(|row| row.trial_id).collect()
    };
    // With a constraint, results that break it do not rank, however many come first: 40
    // infeasible trials above 3 feasible ones (more than the first pages read).
    let constrained = [
        ObjectiveConfig::new("accuracy", Some(Direction::Maximize), None),
        ObjectiveConfig::new(
            "over",
            None,
            Some(Constraint {
                op: ConstraintOp::AtMost,
                bound: 0.0,
            }),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    for index in 0..43u64 {
        let id = format!("c{index}");
        let (accuracy, over) = if index < 40 {
            (1.0 + index as f64, 1.0)
        } else {
            (index as f64 / 100.0, -1.0)
        };
        put(&store, trial(&id, index));
        put(&store, started(&id, 1));
        put(
            &store,
            StoreEvent::Metric {
                trial_id: id.clone(),
                attempt: 1,
                kind: MetricKind::Final,
                trial_sequence: 0,
                raw: format!(r#"{{"accuracy": {accuracy}, "over": {over}}}"#),
                value: Some(accuracy),
            },
        );
        put(&store, ended(&id, 1, TrialStatus::Succeeded));
    }
    let reader = store.reader().unwrap();
    let ranking = Ranking::new(Direction::Maximize, &constrained);
    assert_eq!(
        ids(reader.best_trials(&ranking, 2).unwrap()),
        ["c42", "c41"]
    );
    assert_eq!(
        ids(reader.best_trials(&ranking, 10).unwrap()),
        ["c42", "c41", "c40"]
    );
}

#[test]
fn best_trials_are_the_succeeded_ones_with_every_objective_finite_ties_to_the_earlier() {
    let ids = |rows: Vec<knob_core::store::TrialRow>| -> Vec<String> {
        rows.into_iter().map(|row| row.trial_id).collect()
    };
    let two = [
        ObjectiveConfig::new("a", Some(Direction::Maximize), None),
        ObjectiveConfig::new("b", Some(Direction::Minimize), None),
    ];
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    // (id, a, b, how it ended): the best `a` failed after reporting it, the next was killed;
    // one has a NaN `b`, one an infinite `b`; two succeeded with the same `a`, the later first.
    let trials = [
        ("failed", "9", "1", TrialStatus::Failed),
        ("killed", "8", "1", TrialStatus::UserCanceled),
        ("nan-b", "7", "NaN", TrialStatus::Succeeded),
        ("inf-b", "6", "Infinity", TrialStatus::Succeeded),
        ("later", "5", "1", TrialStatus::Succeeded),
        ("earlier", "5", "2", TrialStatus::Succeeded),
        ("worse", "4", "1", TrialStatus::Succeeded),
    ];
    // Created in this order (sequences), ended in the order listed above.
    let created_order = [
        "failed", "killed", "nan-b", "inf-b", "earlier", "later", "worse",
    ];
    for (sequence, id) in created_order.iter().enumerate() {
        put(&store, trial(id, sequence as u64));
    }
    for (id, a, b, status) in trials {
        put(&store, started(id, 1));
        put(
            &store,
            StoreEvent::Metric {
                trial_id: id.to_string(),
                attempt: 1,
                kind: MetricKind::Final,
                trial_sequence: 0,
                raw: format!(r#"{{"a": {a}, "b": {b}}}"#),
                value: a.parse().ok(),
            },
        );
        put(&store, ended(id, 1, status));
    }
    let reader = store.reader().unwrap();
    assert_eq!(
        ids(reader
            .best_trials(&Ranking::new(Direction::Maximize, &two), 10)
            .unwrap()),
        ["earlier", "later", "worse"]
    );
    // Without objectives the first number alone counts: the NaN `b` is not read then.
    assert_eq!(
        ids(reader
            .best_trials(&Ranking::new(Direction::Maximize, &[]), 3)
            .unwrap()),
        ["nan-b", "inf-b", "earlier"]
    );
}

#[test]
fn materialized_tables_answer_queries() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    let finals = ["0.3", "0.9", "NaN", "0.6", "Infinity"];
    for (index, raw) in finals.iter().enumerate() {
        let id = format!("t{index}");
        put(&store, trial(&id, index as u64));
        put(&store, started(&id, 1));
        put(&store, metric(&id, MetricKind::Intermediate, 0, "0.01"));
        put(&store, metric(&id, MetricKind::Final, 0, raw));
        if index % 2 == 0 {
            put(&store, ended(&id, 1, TrialStatus::Succeeded));
        }
    }
    let reader = store.reader().unwrap();

    let ids = |rows: Vec<knob_core::store::TrialRow>| -> Vec<String> {
        rows.into_iter().map(|row| row.trial_id).collect()
    };
    // Only trials that succeeded rank: t1 and t3 (0.9, 0.6) still run, and t2 and t4 have no
    // usable number.
    let best = reader
        .best_trials(&Ranking::new(Direction::Maximize, &[]), 2)
        .unwrap();
    assert_eq!(best[0].final_value, Some(0.3));
    assert_eq!(ids(best), ["t0"]);
    assert_eq!(
        ids(reader
            .best_trials(&Ranking::new(Direction::Minimize, &[]), 10)
            .unwrap()),
        ["t0"]
    );

    let running = TrialQuery {
        statuses: vec![TrialStatus::Running],
        ..TrialQuery::default()
    };
    assert_eq!(ids(reader.trials(&running).unwrap()), ["t1", "t3"]);
    let page = TrialQuery {
        statuses: vec![],
        offset: 1,
        limit: Some(2),
    };
    assert_eq!(ids(reader.trials(&page).unwrap()), ["t1", "t2"]);
    let counts = reader.trial_counts().unwrap();
    assert_eq!(counts[&TrialStatus::Running], 2);
    assert_eq!(counts[&TrialStatus::Succeeded], 3);

    let t2 = reader.trial("t2").unwrap().unwrap();
    assert_eq!(t2.final_raw.as_deref(), Some("NaN"));
    assert_eq!(t2.final_value, None);
    assert_eq!(t2.exit_code, Some(1));
    assert!(reader.trial("nope").unwrap().is_none());

    let of_t1 = reader.metrics_of_trial("t1").unwrap();
    assert_eq!(
        of_t1.iter().map(|m| m.raw.as_str()).collect::<Vec<_>>(),
        ["0.01", "0.9"]
    );
    let since = reader.metrics_since(of_t1[1].seq, 3).unwrap();
    assert_eq!(since.len(), 3);
    assert!(since.iter().all(|m| m.seq > of_t1[1].seq));

    let summary = reader.experiment().unwrap().unwrap();
    assert_eq!(summary.experiment_id, "exp1");
    assert_eq!(summary.status, ExperimentStatus::Initialized);
}

/// An end its service reported later than it happened (a remote host unreachable meanwhile)
/// is recorded at the time it says, in the tables and the replay alike; one said to be before
/// the attempt's start (another machine's clock) is taken as the start, one in the future as
/// the time it was recorded.
#[test]
fn an_end_reported_late_is_recorded_when_it_happened_within_the_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    for (index, id) in ["early", "before_start", "future"].iter().enumerate() {
        put(&store, trial(id, index as u64));
        put(&store, started(id, 1));
    }
    std::thread::sleep(Duration::from_millis(50));
    let reader = store.reader().unwrap();
    let started_ms = |id: &str| reader.trial(id).unwrap().unwrap().started_ms.unwrap();
    let reported = [
        ("early", started_ms("early") + 20),
        ("before_start", started_ms("before_start") - 60_000),
        ("future", i64::MAX / 2),
    ];
    for (id, at) in reported {
        let mut event = ended(id, 1, TrialStatus::Succeeded);
        if let StoreEvent::TrialEnded { ended_ms, .. } = &mut event {
            *ended_ms = Some(at);
        }
        put(&store, event);
    }
    let state = reader.replay().unwrap();
    for id in ["early", "before_start", "future"] {
        let row = reader.trial(id).unwrap().unwrap();
        let replayed = state.trial(id).unwrap().ended_ms();
        assert_eq!(row.ended_ms, replayed, "{id}");
        let ended = row.ended_ms.unwrap();
        let start = row.started_ms.unwrap();
        match id {
            "early" => assert_eq!(ended, start + 20),
            "before_start" => assert_eq!(ended, start),
            _ => assert!(ended >= start + 50 && ended < i64::MAX / 2, "{ended}"),
        }
    }
}

#[test]
fn nan_and_infinity_keep_their_raw_text() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    put(&store, trial("t", 0));
    put(&store, started("t", 1));
    let raws = [
        "NaN",
        "Infinity",
        "-Infinity",
        r#"{"default": NaN, "loss": Infinity}"#,
        "1e999",
        "\"0.5\"",
        "0.1000000000000000055511151231257827",
    ];
    for (index, raw) in raws.iter().enumerate() {
        let value = match index {
            0 => Some(f64::NAN),
            1 | 4 => Some(f64::INFINITY),
            2 => Some(f64::NEG_INFINITY),
            5 => Some(0.5),
            6 => Some(0.1),
            _ => None,
        };
        let event = StoreEvent::Metric {
            trial_id: "t".to_string(),
            attempt: 1,
            kind: MetricKind::Intermediate,
            trial_sequence: index as u64,
            raw: raw.to_string(),
            value,
        };
        put(&store, event);
    }
    let stored = store.reader().unwrap().metrics_of_trial("t").unwrap();
    let pairs: Vec<(&str, Option<f64>)> =
        stored.iter().map(|m| (m.raw.as_str(), m.value)).collect();
    assert_eq!(
        pairs,
        [
            ("NaN", None),
            ("Infinity", None),
            ("-Infinity", None),
            (r#"{"default": NaN, "loss": Infinity}"#, None),
            ("1e999", None),
            ("\"0.5\"", Some(0.5)),
            ("0.1000000000000000055511151231257827", Some(0.1)),
        ]
    );
    let state = store.replay().unwrap();
    assert_eq!(state.trials[0].metrics, stored);
}

#[test]
fn the_first_final_of_an_attempt_is_the_trials_final_in_the_tables_and_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    put(&store, trial("t", 0));
    put(&store, started("t", 1));
    put(&store, metric("t", MetricKind::Final, 0, "Infinity"));
    put(&store, metric("t", MetricKind::Final, 1, "0.5"));
    let row = &store
        .reader()
        .unwrap()
        .trials(&TrialQuery::default())
        .unwrap()[0];
    assert_eq!(
        (row.final_value, row.final_raw.as_deref()),
        (None, Some("Infinity"))
    );
    let state = store.replay().unwrap();
    let first = state.trials[0].final_metric().unwrap();
    assert_eq!((first.raw.as_str(), first.value), ("Infinity", None));
}

#[test]
fn a_trial_cancelled_before_it_started_can_be_requeued_and_is_no_longer_ended() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    put(&store, trial("t", 0));
    put(
        &store,
        StoreEvent::TrialEnded {
            trial_id: "t".to_string(),
            attempt: 0,
            status: TrialStatus::UserCanceled,
            exit_code: None,
            signal: None,
            message: Some(knob_core::store::STOPPED_WITH_EXPERIMENT.to_string()),
            stderr_tail: None,
            peak_memory_mib: None,
            peak_gpu_memory_mib: None,
            ended_ms: None,
        },
    );
    let state = store.replay().unwrap();
    assert!(state.trials[0]
        .end
        .as_ref()
        .unwrap()
        .stopped_with_experiment());
    put(
        &store,
        StoreEvent::TrialRequeued {
            trial_id: "t".to_string(),
            reason: "the experiment was stopped before it ended".to_string(),
            memory_request_mib: None,
            gpu_memory_request_mib: None,
            peak_memory_mib: None,
            peak_gpu_memory_mib: None,
        },
    );
    let row = &store
        .reader()
        .unwrap()
        .trials(&TrialQuery::default())
        .unwrap()[0];
    assert_eq!(
        (row.status, row.ended_ms, row.end_message.as_deref()),
        (TrialStatus::Waiting, None, None)
    );
    let state = store.replay().unwrap();
    assert_eq!(state.trials[0].status, TrialStatus::Waiting);
    assert!(state.trials[0].end.is_none());
    // A waiting trial cannot be requeued.
    let refused = store
        .append(StoreEvent::TrialRequeued {
            trial_id: "t".to_string(),
            reason: "again".to_string(),
            memory_request_mib: None,
            gpu_memory_request_mib: None,
            peak_memory_mib: None,
            peak_gpu_memory_mib: None,
        })
        .wait();
    assert!(refused.is_err(), "{refused:?}");
}

fn stopping(trial_id: &str, status: TrialStatus, message: &str) -> StoreEvent {
    StoreEvent::TrialStopping {
        trial_id: trial_id.to_string(),
        status,
        message: message.to_string(),
    }
}

#[test]
fn a_stop_the_manager_decided_is_kept_until_the_trial_ends_and_only_for_one_not_ended() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    put(&store, trial("t", 0));
    put(&store, started("t", 1));
    put(
        &store,
        stopping("t", TrialStatus::EarlyStopped, "PBT: bottom 25% at step 4"),
    );
    // What a resume after a crash here ends the trial with.
    let state = store.replay().unwrap();
    assert_eq!(state.trials[0].status, TrialStatus::Running);
    let stop = state.trials[0].stopping.as_ref().unwrap();
    assert_eq!(
        (stop.status, stop.message.as_str(), stop.with_experiment()),
        (
            TrialStatus::EarlyStopped,
            "PBT: bottom 25% at step 4",
            false
        )
    );
    put(&store, ended("t", 1, TrialStatus::EarlyStopped));
    assert!(store.replay().unwrap().trials[0].stopping.is_none());
    // Not for an ended trial, nor with a status that is not an end.
    let refused = store
        .append(stopping(
            "t",
            TrialStatus::UserCanceled,
            "killed by the user",
        ))
        .wait();
    assert!(refused.is_err(), "{refused:?}");
    put(&store, trial("u", 1));
    let refused = store
        .append(stopping("u", TrialStatus::Running, "?"))
        .wait();
    assert!(refused.is_err(), "{refused:?}");
    // A stop of the whole experiment, which a resume undoes, says so.
    put(
        &store,
        stopping(
            "u",
            TrialStatus::UserCanceled,
            knob_core::store::STOPPED_WITH_EXPERIMENT,
        ),
    );
    let state = store.replay().unwrap();
    assert!(state.trials[1].stopping.as_ref().unwrap().with_experiment());
}

fn warning(trial_id: &str, message: &str) -> StoreEvent {
    StoreEvent::Warning {
        trial_id: Some(trial_id.to_string()),
        message: message.to_string(),
    }
}

/// Each trial's `waiting_reason`, in sequence order.
fn waiting_reasons(store: &Store) -> Vec<Option<String>> {
    store
        .reader()
        .unwrap()
        .trials(&TrialQuery::default())
        .unwrap()
        .into_iter()
        .map(|row| row.waiting_reason)
        .collect()
}

#[test]
fn a_waiting_trial_shows_its_latest_waiting_warning_until_it_starts_and_after_a_requeue() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    put(&store, trial("a", 0));
    put(&store, trial("b", 1));
    assert_eq!(waiting_reasons(&store), vec![None, None]);
    put(
        &store,
        warning("a", "waiting: waiting for 1 GPU: local: GPU 0 runs b"),
    );
    put(&store, warning("a", "garbage metric line ignored"));
    put(
        &store,
        warning(
            "a",
            "waiting: env1: unavailable (job 7 pending (Resources))",
        ),
    );
    assert_eq!(
        waiting_reasons(&store),
        vec![
            Some("env1: unavailable (job 7 pending (Resources))".to_string()),
            None
        ]
    );
    // Running, it waits no more; requeued, an earlier attempt's reason is not shown.
    put(&store, started("a", 1));
    assert_eq!(waiting_reasons(&store), vec![None, None]);
    put(&store, ended("a", 1, TrialStatus::Failed));
    put(
        &store,
        StoreEvent::TrialRequeued {
            trial_id: "a".to_string(),
            reason: "attempt 1 failed".to_string(),
            memory_request_mib: None,
            gpu_memory_request_mib: None,
            peak_memory_mib: None,
            peak_gpu_memory_mib: None,
        },
    );
    assert_eq!(waiting_reasons(&store), vec![None, None]);
    put(&store, warning("a", "waiting: again"));
    assert_eq!(
        waiting_reasons(&store),
        vec![Some("again".to_string()), None]
    );
}

#[test]
fn counters_never_go_back_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.opened_counters().next_trial_sequence, 0);
        put(&store, created());
        put(&store, trial("a", 0));
        put(&store, trial("b", 1));
        // A gap: ids in between are never handed out again either.
        put(&store, trial("c", 7));
        store.close().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let counters = store.opened_counters();
    assert_eq!(counters.next_trial_sequence, 8);
    assert_eq!(counters.next_parameter_id, 8);
    assert_eq!(counters.next_event_seq, 5);
    let went_back = store.append(trial("d", 5)).wait().unwrap_err();
    check_error(
        dir.path(),
        went_back,
        expect![[
            r#"$DIR/experiment.db: event refused: trial sequence 5 may have been used before (next free is 8)"#
        ]],
    );
    let reused_parameter = StoreEvent::TrialCreated {
        trial_id: "e".to_string(),
        sequence: 8,
        parameter_id: 1,
        parameter_label: None,
        parameters: json!({}),
        lineage: None,
    };
    let error = store.append(reused_parameter).wait().unwrap_err();
    assert!(matches!(
        error,
        StoreError::Rejected {
            reason: Rejection::DuplicateParameterId { parameter_id: 1 },
            ..
        }
    ));
    // The event numbering continues without a gap after refused events.
    assert_eq!(put(&store, trial("e", 8)), 5);
    drop(store);

    // Counters are also derived from the log: a counters table set back cannot reuse ids.
    let raw = Connection::open(dir.path().join(DB_FILE_NAME)).unwrap();
    raw.execute("UPDATE counters SET next = 0", []).unwrap();
    drop(raw);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.opened_counters().next_trial_sequence, 9);
    assert_eq!(store.opened_counters().next_event_seq, 6);
    assert_eq!(put(&store, trial("f", 9)), 6);
    let state = store.replay().unwrap();
    assert_eq!(state.counters.next_trial_sequence, 10);
    assert_eq!(state.counters.next_parameter_id, 10);
}

#[test]
fn refused_events_leave_the_rest_of_their_batch_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let before_experiment = store.append(trial("t", 0)).wait().unwrap_err();
    assert!(matches!(
        before_experiment,
        StoreError::Rejected {
            reason: Rejection::NoExperiment,
            ..
        }
    ));
    put(&store, created());
    // Queued together, so they share a transaction.
    let acks = vec![
        store.append(trial("t", 0)),
        store.append(created()),
        store.append(metric("t", MetricKind::Final, 0, "1")),
        store.append(started("t", 2)),
        store.append(started("t", 1)),
        store.append(metric("t", MetricKind::Final, 0, "1")),
        store.append(metric("t", MetricKind::Final, 0, "2")),
        store.append(metric("nobody", MetricKind::Final, 0, "1")),
        store.append(ended("t", 1, TrialStatus::Running)),
        store.append(StoreEvent::ConfigUpdated {
            field: "trialConcurrency.inner".to_string(),
            value: json!(1),
        }),
        store.append(ended("t", 1, TrialStatus::Succeeded)),
        store.append(ended("t", 1, TrialStatus::Failed)),
    ];
    let outcomes: Vec<String> = acks
        .into_iter()
        .map(|ack| match ack.wait() {
            Ok(seq) => format!("ok {seq}"),
            Err(StoreError::Rejected { reason, .. }) => reason.to_string(),
            Err(other) => panic!("{other}"),
        })
        .collect();
    expect![[r#"
        ok 2
        the experiment was already created
        trial "t" has no attempt 1 here (expected 1..=0)
        trial "t" has no attempt 2 here (expected 1)
        ok 3
        ok 4
        metric 0 of trial "t" attempt 1 is already stored
        no trial "nobody"
        RUNNING is not a status a trial can end with
        config field "trialConcurrency.inner": trialConcurrency is not an object
        ok 5
        trial "t" is SUCCEEDED, so trial_ended cannot follow"#]]
    .assert_eq(&outcomes.join("\n"));
    let state = store.replay().unwrap();
    assert_eq!(state.last_event_seq, 5);
    assert_eq!(state.trials[0].metrics.len(), 1);
}

#[test]
fn ack_arrives_only_after_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    put(&store, trial("t", 0));
    put(&store, started("t", 1));
    let db = dir.path().join(DB_FILE_NAME);

    // Each acknowledged metric is visible to a connection opened after the ack.
    for index in 0..50 {
        let seq = put(&store, metric("t", MetricKind::Intermediate, index, "0.5"));
        let other = Connection::open(&db).unwrap();
        let found: i64 = other
            .query_row(
                "SELECT count(*) FROM metrics WHERE seq = ?1",
                [seq as i64],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(found, 1, "metric {seq} acknowledged but not visible");
    }

    // While another connection holds the write lock the writer cannot commit, and the ack
    // must not arrive; it does once the lock is released.
    let blocker = Connection::open(&db).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut ack = store.append(metric("t", MetricKind::Final, 0, "0.9"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(ack.try_outcome().is_none(), "acknowledged before commit");
    blocker.execute_batch("ROLLBACK").unwrap();
    let seq = ack.wait().unwrap();
    let found: String = Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT raw FROM metrics WHERE seq = ?1",
            [seq as i64],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(found, "0.9");
}

#[test]
fn events_appended_together_commit_in_one_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    put(&store, trial("t", 0));
    put(&store, started("t", 1));
    // Each pair alone, the writer idle before it: still one transaction each.
    for attempt in 1..=20 {
        let before = store.stats();
        let requeued = StoreEvent::TrialRequeued {
            trial_id: "t".to_string(),
            reason: "its host was lost".to_string(),
            memory_request_mib: None,
            gpu_memory_request_mib: None,
            peak_memory_mib: None,
            peak_gpu_memory_mib: None,
        };
        let seq = store
            .append_together(vec![ended("t", attempt, TrialStatus::Failed), requeued])
            .wait()
            .unwrap();
        let after = store.stats();
        assert_eq!(
            (
                after.events - before.events,
                after.transactions - before.transactions
            ),
            (2, 1)
        );
        assert_eq!(seq, 3 + 2 * u64::from(attempt) + u64::from(attempt - 1));
        put(&store, started("t", attempt + 1));
    }
    let state = store.replay().unwrap();
    assert_eq!(state.trials[0].status, TrialStatus::Running);
    assert_eq!(state.trials[0].attempts.len(), 21);
}

#[test]
fn queued_events_share_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    put(&store, trial("t", 0));
    put(&store, started("t", 1));
    let before = store.stats();

    // Hold the write lock so the events pile up behind the writer's first transaction.
    let blocker = Connection::open(dir.path().join(DB_FILE_NAME)).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let acks: Vec<_> = (0..1000)
        .map(|index| store.append(metric("t", MetricKind::Intermediate, index, "0.5")))
        .collect();
    blocker.execute_batch("ROLLBACK").unwrap();
    for ack in acks {
        ack.wait().unwrap();
    }
    let after = store.stats();
    assert_eq!(after.events - before.events, 1000);
    // One transaction for what the writer had taken before it blocked, one for the rest.
    let transactions = after.transactions - before.transactions;
    assert!(
        transactions <= 2,
        "1000 queued events took {transactions} transactions"
    );
}

#[test]
fn unacked_events_are_written_and_their_failures_reported_by_flush() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.append_unacked(created());
    store.append_unacked(trial("t", 0));
    store.flush().wait().unwrap();
    store.append_unacked(StoreEvent::TrialCreated {
        trial_id: "t".to_string(),
        sequence: 5,
        parameter_id: 5,
        parameter_label: None,
        parameters: json!({}),
        lineage: None,
    });
    let error = store.flush().wait().unwrap_err();
    check_error(
        dir.path(),
        error,
        expect![[r#"$DIR/experiment.db: event refused: trial id "t" is taken"#]],
    );
    store.flush().wait().unwrap();
    let handle = store.handle();
    handle.append_unacked(started("t", 1));
    drop(store);
    // Dropping the store committed what was queued, and handles left over are told.
    let state = StoreReader::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.trials[0].status, TrialStatus::Running);
    let closed = handle
        .append(ended("t", 1, TrialStatus::Succeeded))
        .wait()
        .unwrap_err();
    check_error(
        dir.path(),
        closed,
        expect![[r#"$DIR/experiment.db: the store is closed; the event was not written"#]],
    );
}

#[test]
fn a_failed_commit_reaches_every_caller_and_loses_no_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        busy_timeout: Duration::from_millis(50),
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    put(&store, created());
    let blocker = Connection::open(dir.path().join(DB_FILE_NAME)).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let first = store.append(trial("t", 0));
    let second = store.append(trial("u", 1));
    for ack in [first, second] {
        check_error(
            dir.path(),
            ack.wait().unwrap_err(),
            expect![[
                r#"$DIR/experiment.db: cannot write to the experiment store: database is locked: another process holds a write transaction on it (an `sqlite3` shell after BEGIN?) longer than knob waits; end that transaction, then `knob resume` continues the experiment"#
            ]],
        );
    }
    blocker.execute_batch("ROLLBACK").unwrap();
    assert_eq!(put(&store, trial("t", 0)), 2);
    assert_eq!(store.replay().unwrap().counters.next_trial_sequence, 1);
}

#[test]
fn one_writer_per_experiment() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    check_error(
        dir.path(),
        Store::open(dir.path()).unwrap_err(),
        expect![[
            r#"$DIR/experiment.db: another knob process is writing this experiment; stop it (knob stop) before opening it again"#
        ]],
    );
    // Readers are welcome meanwhile.
    put(&store, created());
    assert!(StoreReader::open(dir.path())
        .unwrap()
        .experiment()
        .unwrap()
        .is_some());
    drop(store);
    Store::open(dir.path()).unwrap();
}

/// The store file deleted under its writer (the experiment's folder removed by hand): SQLite
/// wrote on into the unlinked file, and every event from then on was lost without a word. The
/// next batch fails instead, naming the folder.
#[test]
fn a_store_deleted_under_its_writer_fails_the_next_write() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("e");
    let store = Store::open(&dir).unwrap();
    put(&store, created());
    std::fs::remove_dir_all(&dir).unwrap();
    let error = store.append(trial("u", 1)).wait().unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}: the experiment's files were deleted while it ran; its trials are stopped and nothing more can be recorded",
            dir.display()
        )
    );
    assert!(store.close().is_ok(), "nothing was left unreported");
}

/// The experiment's folder moved (renamed) while it runs: the store went on in the new place,
/// but each new trial's folder was made again under the old path, apart from the store, and the
/// registry still named the old path. The next batch fails instead, and nothing after it is in
/// either place; the moved store holds everything before.
#[test]
fn a_store_moved_under_its_writer_fails_the_next_write() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("e");
    let store = Store::open(&dir).unwrap();
    put(&store, created());
    let moved = root.path().join("moved");
    std::fs::rename(&dir, &moved).unwrap();
    let error = store.append(trial("t", 0)).wait().unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}: the experiment's folder was moved while it ran; its trials are stopped and nothing more is recorded; its store, wherever the folder now is, holds everything before this",
            dir.display()
        )
    );
    drop(store);
    let state = StoreReader::open(&moved).unwrap().replay().unwrap();
    assert!(state.trials.is_empty(), "{state:?}");
    // Another folder put in its place is not the store either.
    std::fs::create_dir_all(&dir).unwrap();
    let store = Store::open(&moved).unwrap();
    std::fs::rename(&moved, root.path().join("again")).unwrap();
    std::fs::rename(root.path().join("again"), &moved).unwrap();
    assert_eq!(
        put(&store, trial("t", 0)),
        2,
        "moved back: the same file again"
    );
}

/// Two managers opening one experiment at the same moment (two `knob resume` started together):
/// one of them writes it. Without a wait on the lock file each could hold the shared lock the
/// other needed to become the writer, and both failed.
#[test]
fn of_two_writers_opening_at_once_one_wins() {
    for round in 0..12 {
        let dir = tempfile::tempdir().unwrap();
        Store::open(dir.path()).unwrap();
        let start = std::sync::Barrier::new(2);
        let opened: Vec<bool> = std::thread::scope(|scope| {
            let open = || {
                start.wait();
                Store::open(dir.path())
            };
            let (a, b) = (scope.spawn(open), scope.spawn(open));
            let (a, b) = (a.join().unwrap(), b.join().unwrap());
            // Both results are held until both are known, so a winner cannot let the other in.
            vec![a.is_ok(), b.is_ok()]
        });
        assert_eq!(
            opened.iter().filter(|&&ok| ok).count(),
            1,
            "round {round}: {opened:?}"
        );
    }
}

/// A store cut short (a copy taken while it was written, a disk that lost its cache) is called
/// damaged, with where the trials' results still are, wherever SQLite notices it.
#[test]
fn a_damaged_store_says_so_and_where_the_results_still_are() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        put(&store, created());
        for sequence in 0..2000 {
            store.append_unacked(trial(&format!("t{sequence}"), sequence));
        }
        put(&store, trial("last", 2000));
    }
    let path = dir.path().join(DB_FILE_NAME);
    let length = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(length / 2)
        .unwrap();
    let error = StoreReader::open(dir.path())
        .and_then(|reader| reader.replay())
        .map(|_| ())
        .unwrap_err();
    check_error(
        dir.path(),
        error,
        expect![[
            r#"$DIR/experiment.db: the experiment store is damaged (database disk image is malformed) and cannot be read; keep a copy of the experiment's folder: each trial's folder in it (trials/ID/) still holds the trial's parameters and its output, metrics included"#
        ]],
    );
}

#[test]
fn files_that_are_not_a_knob_store_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let text_dir = dir.path().join("text");
    std::fs::create_dir(&text_dir).unwrap();
    std::fs::write(
        text_dir.join(DB_FILE_NAME),
        "experimentName: mnist\n".repeat(200),
    )
    .unwrap();
    check_error(
        dir.path(),
        Store::open(&text_dir).unwrap_err(),
        expect![[
            r#"$DIR/text/experiment.db: not an SQLite database, so not a knob experiment store; move it away or choose another experiment directory"#
        ]],
    );
    check_error(
        dir.path(),
        StoreReader::open(&text_dir).unwrap_err(),
        expect![[
            r#"$DIR/text/experiment.db: not an SQLite database, so not a knob experiment store; move it away or choose another experiment directory"#
        ]],
    );

    let foreign_dir = dir.path().join("foreign");
    std::fs::create_dir(&foreign_dir).unwrap();
    Connection::open(foreign_dir.join(DB_FILE_NAME))
        .unwrap()
        .execute_batch("CREATE TABLE studies (id INTEGER PRIMARY KEY)")
        .unwrap();
    check_error(
        dir.path(),
        Store::open(&foreign_dir).unwrap_err(),
        expect![[
            r#"$DIR/foreign/experiment.db: an SQLite database of another program, not a knob experiment store; move it away or choose another experiment directory"#
        ]],
    );

    // The experiment directory cannot be created under a file.
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    check_error(
        dir.path(),
        Store::open(&file.join("exp")).unwrap_err(),
        expect![[
            r#"$DIR/plain-file/exp/experiment.db: cannot open the experiment store: cannot create the experiment directory: Not a directory (os error 20)"#
        ]],
    );
    check_error(
        dir.path(),
        StoreReader::open(&dir.path().join("missing")).unwrap_err(),
        expect![[
            r#"$DIR/missing/experiment.db: cannot open the experiment store: no such file; is this an experiment directory?"#
        ]],
    );
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    Store::open(dir.path()).unwrap().close().unwrap();
    Connection::open(dir.path().join(DB_FILE_NAME))
        .unwrap()
        .execute(
            "UPDATE meta SET value = '99' WHERE key = 'schema_version'",
            [],
        )
        .unwrap();
    check_error(
        dir.path(),
        Store::open(dir.path()).unwrap_err(),
        expect![[
            r#"$DIR/experiment.db: written by a newer knob (store schema 99, this knob reads schemas up to 1); upgrade knob to open it"#
        ]],
    );
    check_error(
        dir.path(),
        StoreReader::open(dir.path()).unwrap_err(),
        expect![[
            r#"$DIR/experiment.db: written by a newer knob (store schema 99, this knob reads schemas up to 1); upgrade knob to open it"#
        ]],
    );
}

#[test]
fn replay_of_a_store_without_an_experiment_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    check_error(
        dir.path(),
        store.replay().unwrap_err(),
        expect!["$DIR/experiment.db: no experiment has been created in this store: its `knob create` has not recorded it yet, or was killed before it did; `knob experiment delete ID --yes` removes it"],
    );
}

#[test]
fn active_time_counts_only_active_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    let status = |status| StoreEvent::ExperimentStatusChanged {
        status,
        message: None,
        spent_before_ms: None,
    };
    put(&store, status(ExperimentStatus::Running));
    put(&store, status(ExperimentStatus::Stopped));
    let state = store.replay().unwrap();
    let running = state.status_history[1].time_ms;
    let stopped = state.status_history[2].time_ms;
    assert_eq!(state.active_time_ms(stopped + 10_000), stopped - running);
}

/// A crashed run's `RUNNING` has no end: the next run's `RUNNING` ends it, and the stretch
/// between them (a weekend between the crash and `knob resume`) used to count at every later
/// resume. A resumed run records what was spent before it, and time counts from that.
#[test]
fn a_run_that_says_what_was_spent_before_it_leaves_the_crash_downtime_out() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    let status = |status, spent_before_ms| StoreEvent::ExperimentStatusChanged {
        status,
        message: None,
        spent_before_ms,
    };
    put(&store, status(ExperimentStatus::Running, None));
    // The run crashes here; the next one starts later and says 1 234 ms were spent.
    put(&store, status(ExperimentStatus::Running, Some(1_234)));
    put(&store, status(ExperimentStatus::Stopped, None));
    let state = store.replay().unwrap();
    let resumed = state.status_history[2].time_ms;
    let stopped = state.status_history[3].time_ms;
    assert_eq!(state.status_history[2].spent_before_ms, Some(1_234));
    assert_eq!(
        state.active_time_ms(stopped + 10_000),
        1_234 + (stopped - resumed)
    );
    // Before the resumed run started, its figure does not apply yet.
    let crashed_run = state.status_history[1].time_ms;
    assert_eq!(
        state.active_time_ms(resumed - 1),
        (resumed - 1 - crashed_run).max(0)
    ); // A reader (the API's snapshot) counts the same from the status changes alone.
    let reader = knob_core::store::StoreReader::open(dir.path()).unwrap();
    for until in [resumed - 1, stopped, stopped + 10_000] {
        assert_eq!(
            reader.active_time_ms(until).unwrap(),
            state.active_time_ms(until)
        );
    }
}

/// After a crash nothing says when the run died: no event is written while trials run quietly.
/// The writer marks the run alive while it waits, so a resume counts that stretch against
/// `maxExperimentDuration` (it used to count only up to the last event, and a run killed an
/// hour into a quiet trial got that hour again).
#[test]
fn an_idle_writer_marks_the_run_alive_and_replay_counts_up_to_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        alive_interval: std::time::Duration::from_millis(20),
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    put(&store, created());
    put(
        &store,
        StoreEvent::ExperimentStatusChanged {
            status: ExperimentStatus::Running,
            message: None,
            spent_before_ms: None,
        },
    );
    let alive = dir.path().join(knob_core::store::ALIVE_FILE_NAME);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !alive.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer never marked the run alive"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The process dies quietly an hour after its last event: only the mark says so.
    let state = store.replay().unwrap();
    let running = state.status_history[1].time_ms;
    assert!(state.last_alive_ms >= state.last_event_time_ms, "{state:?}");
    drop(store);
    let an_hour_later = std::time::UNIX_EPOCH
        + std::time::Duration::from_millis(state.last_event_time_ms as u64 + 3_600_000);
    std::fs::File::options()
        .write(true)
        .open(&alive)
        .unwrap()
        .set_modified(an_hour_later)
        .unwrap();
    let state = StoreReader::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.last_alive_ms, state.last_event_time_ms + 3_600_000);
    assert_eq!(
        state.active_time_ms(state.last_alive_ms),
        state.last_alive_ms - running
    );
}

/// Set by [`acknowledged_metrics_survive_sigkill`] in the child it starts.
const CHILD_DIR_VARIABLE: &str = "KNOB_TEST_STORE_SIGKILL_CHILD_DIR";
const CHILD_SENDERS: u64 = 4;

/// Not a test on its own: the child process of [`acknowledged_metrics_survive_sigkill`]. It
/// appends metrics from several threads and prints each one once acknowledged, until killed.
#[test]
fn sigkill_child_writer() {
    let Some(dir) = std::env::var_os(CHILD_DIR_VARIABLE) else {
        return;
    };
    let store = Store::open(Path::new(&dir)).unwrap();
    put(&store, created());
    put(&store, trial("t", 0));
    put(&store, started("t", 1));
    let senders: Vec<_> = (0..CHILD_SENDERS)
        .map(|sender| {
            let handle = store.handle();
            std::thread::spawn(move || {
                for index in 0.. {
                    let trial_sequence = sender * 1_000_000_000 + index;
                    let raw = format!("{index}.5");
                    let event = metric("t", MetricKind::Intermediate, trial_sequence, &raw);
                    let seq = handle.append(event).wait().unwrap();
                    println!("acked {seq} {trial_sequence}");
                }
            })
        })
        .collect();
    for sender in senders {
        sender.join().unwrap();
    }
}

#[test]
fn acknowledged_metrics_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "store::sigkill_child_writer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_VARIABLE, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked = Vec::new();
    let parse = |acked: &mut Vec<(u64, u64)>, line: String| {
        let mut words = line.split(' ');
        if words.next() == Some("acked") {
            let seq: u64 = words.next().unwrap().parse().unwrap();
            let trial_sequence: u64 = words.next().unwrap().parse().unwrap();
            acked.push((seq, trial_sequence));
        }
    };
    for line in lines.by_ref() {
        parse(&mut acked, line.unwrap());
        if acked.len() >= 3000 {
            break;
        }
    }
    assert_eq!(acked.len(), 3000, "the child stopped early");
    child.kill().unwrap(); // SIGKILL on Unix
                           // Acks printed before the kill still sit in the pipe; they count too.
    for line in lines {
        match line {
            Ok(line) => parse(&mut acked, line),
            Err(_) => break,
        }
    }
    child.wait().unwrap();

    // The lock died with the child, so a writer can open the store again.
    let store = Store::open(dir.path()).unwrap();
    let reader = store.reader().unwrap();
    let stored: std::collections::HashMap<u64, u64> = reader
        .metrics_of_trial("t")
        .unwrap()
        .into_iter()
        .map(|m| (m.trial_sequence, m.seq))
        .collect();
    for (seq, trial_sequence) in &acked {
        assert_eq!(
            stored.get(trial_sequence),
            Some(seq),
            "acknowledged metric lost"
        );
    }
    let state = store.replay().unwrap();
    let max_acked = acked.iter().map(|(seq, _)| *seq).max().unwrap();
    assert!(state.counters.next_event_seq > max_acked);
    // Numbering continues after what the killed writer committed.
    let next = put(&store, metric("t", MetricKind::Final, 0, "1.0"));
    assert_eq!(next, state.last_event_seq + 1);
}

#[test]
fn the_commit_watch_holds_an_event_by_the_time_its_ack_resolves() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let commits = store.commits();
    assert_eq!(*commits.borrow(), 0);
    let first = put(&store, created());
    assert_eq!(*commits.borrow(), first);
    let acks: Vec<_> = (0..50)
        .map(|n| store.append(trial(&format!("t{n}"), n)))
        .collect();
    let last = acks
        .into_iter()
        .map(|ack| ack.wait().unwrap())
        .max()
        .unwrap();
    assert!(commits.has_changed().unwrap());
    assert_eq!(*commits.borrow(), last);
    // A rejected event commits nothing and moves nothing.
    assert!(store.append(created()).wait().is_err());
    assert_eq!(*commits.borrow(), last);
    drop(store);
    let reopened = Store::open(dir.path()).unwrap();
    assert_eq!(*reopened.commits().borrow(), last);
}

/// The snapshot `GET /api/v1/experiment` and `knob top` show: best trials in the tuner's
/// direction, each with its duration; none before the experiment is recorded.
#[test]
fn the_experiment_snapshot_ranks_by_the_tuners_direction() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let reader = StoreReader::open(dir.path()).unwrap();
    assert_eq!(
        knob_core::api::experiment_snapshot(&reader, true).unwrap(),
        None
    );
    put(
        &store,
        StoreEvent::ExperimentCreated {
            experiment_id: "exp1".to_string(),
            config: json!({"tuner": {"name": "TPE", "classArgs": {"optimize_mode": "minimize"}}}),
            start_time_ms: 1_700_000_000_000,
        },
    );
    for (sequence, (id, value)) in [("a", "0.5"), ("b", "0.2"), ("c", "0.9")]
        .into_iter()
        .enumerate()
    {
        put(&store, trial(id, sequence as u64));
        put(&store, started(id, 1));
        put(&store, metric(id, MetricKind::Final, 0, value));
        put(&store, ended(id, 1, TrialStatus::Succeeded));
    }
    let snapshot = knob_core::api::experiment_snapshot(&reader, true)
        .unwrap()
        .unwrap();
    assert_eq!(snapshot["id"], "exp1");
    assert_eq!(snapshot["optimize_mode"], "minimize");
    assert_eq!(snapshot["trial_total"], 3);
    let best: Vec<_> = snapshot["best_trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["trial_id"].as_str().unwrap(), t["duration_ms"].is_i64()))
        .collect();
    assert_eq!(best, [("b", true), ("a", true), ("c", true)], "{snapshot}");
}

/// A trial run twice: the CSV's `intermediate` is its latest attempt's curve, what its status and
/// final describe (it ran both attempts' values together, a saw-tooth of 5 steps for a trial that
/// ran 3); the JSON export keeps every attempt's, each tagged with it (H3 F5).
#[test]
fn the_csv_export_has_the_latest_attempts_intermediate_results() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    put(&store, trial("t", 0));
    let intermediate = |attempt: u32, trial_sequence: u64, raw: &str| StoreEvent::Metric {
        trial_id: "t".to_string(),
        attempt,
        kind: MetricKind::Intermediate,
        trial_sequence,
        raw: raw.to_string(),
        value: raw.parse::<f64>().ok().filter(|v| v.is_finite()),
    };
    put(&store, started("t", 1));
    put(&store, intermediate(1, 0, "0.5"));
    put(&store, intermediate(1, 1, "0.25"));
    put(&store, ended("t", 1, TrialStatus::Failed));
    put(
        &store,
        StoreEvent::TrialRequeued {
            trial_id: "t".to_string(),
            reason: "attempt 1 failed".to_string(),
            memory_request_mib: None,
            gpu_memory_request_mib: None,
            peak_memory_mib: None,
            peak_gpu_memory_mib: None,
        },
    );
    put(&store, started("t", 2));
    for (sequence, raw) in ["1", "2", "NaN"].into_iter().enumerate() {
        put(&store, intermediate(2, sequence as u64, raw));
    }
    let state = store.replay().unwrap();
    let mut csv = Vec::new();
    knob_core::export::write_csv(&state, &mut csv).unwrap();
    let csv = String::from_utf8(csv).unwrap();
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let column = reader
        .headers()
        .unwrap()
        .iter()
        .position(|name| name == "intermediate")
        .unwrap();
    let row = reader.records().next().unwrap().unwrap();
    assert_eq!(&row[column], r#"[1.0,2.0,"NaN"]"#, "{csv}");
    let (_, json) = exported_json(&state);
    let attempts: Vec<u64> = json["trials"][0]["intermediate"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 1, 2, 2, 2]);
}

/// The CSV's `final` is written as the JSON export writes numbers (shortest round trip, an
/// exponent outside 1e-5..1e16; Rust's `Display` gave `0.0000001` and 301 digits), and
/// `final_raw`, right after it, is the final as reported (a dict was only in the JSON export).
#[test]
fn the_csv_export_writes_numbers_shortest_and_the_final_as_reported() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    let raws = [
        "1e-7",
        "1e300",
        "0.30000000000000004",
        "0.00001",
        "1e16",
        "3",
        r#"{"default": 1.5e-9, "acc": 0.5}"#,
        "NaN",
    ];
    for (index, raw) in raws.iter().enumerate() {
        let id = format!("t{index}");
        put(&store, trial(&id, index as u64));
        put(&store, started(&id, 1));
        let value = knob_plugin_api::metric::default_value(raw)
            .ok()
            .filter(|v| v.is_finite());
        put(
            &store,
            StoreEvent::Metric {
                trial_id: id.clone(),
                attempt: 1,
                kind: MetricKind::Final,
                trial_sequence: 0,
                raw: raw.to_string(),
                value,
            },
        );
        put(&store, ended(&id, 1, TrialStatus::Succeeded));
    }
    put(&store, trial("none", 99));
    let state = store.replay().unwrap();
    let mut csv = Vec::new();
    knob_core::export::write_csv(&state, &mut csv).unwrap();
    let csv = String::from_utf8(csv).unwrap();
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let headers: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    let at = |name: &str| headers.iter().position(|h| h == name).unwrap();
    assert_eq!(at("final_raw"), at("final") + 1, "{headers:?}");
    let cells: Vec<(String, String, String)> = reader
        .records()
        .map(|row| {
            let row = row.unwrap();
            (
                row[at("final")].to_string(),
                row[at("final_raw")].to_string(),
                row[at("final:acc")].to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String, String)> = [
        ("1e-7", "1e-7", ""),
        ("1e+300", "1e300", ""),
        ("0.30000000000000004", "0.30000000000000004", ""),
        ("0.00001", "0.00001", ""),
        ("1e+16", "1e16", ""),
        ("3", "3", ""),
        ("1.5e-9", r#"{"default": 1.5e-9, "acc": 0.5}"#, "0.5"),
        ("NaN", "NaN", ""),
        ("", "", ""),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    assert_eq!(cells, expected, "{csv}");
    // Every number cell reads back as the number stored.
    for (cell, raw) in cells.iter().zip(raws.iter().take(6)) {
        assert_eq!(cell.0.parse::<f64>().unwrap(), raw.parse::<f64>().unwrap());
    }
}

/// The JSON export is written part by part (`write_json`; a million intermediate results took
/// 2 GB as one value, H2 F3): its bytes are those of the whole value written pretty, on trials
/// with and without intermediate results, retried ones, PBT members, odd metrics and warnings.
#[test]
fn the_json_export_written_part_by_part_is_the_whole_value_written_pretty() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    put(
        &store,
        StoreEvent::Warning {
            trial_id: None,
            message: "a \"quoted\" line\nand a second, ünïcode ✓".to_string(),
        },
    );
    let raws = [
        "0.5",
        "NaN",
        "-Infinity",
        "1e308",
        "-0.0",
        "3",
        r#"{"default": 0.25, "acc": "a\"b"}"#,
        "\"text\"",
        "[1, 2]",
        "1.7976931348623157e308",
        "5e-324",
        "0.1",
    ];
    for (sequence, id) in ["a", "b", "c", "d"].into_iter().enumerate() {
        let sequence = sequence as u64;
        let mut created = trial(id, sequence);
        if let StoreEvent::TrialCreated {
            lineage,
            parameters,
            ..
        } = &mut created
        {
            // "c" is a population member cloned from "a"; "d" has odd parameters.
            if id == "c" {
                *lineage = Some(Box::new(knob_core::store::Lineage {
                    parent: Some("a".to_string()),
                    replaces: Some("b".to_string()),
                    parent_step: Some(3),
                }));
            }
            if id == "d" {
                *parameters = json!({"nested": {"x": [1, null, "∞"]}, "e": 1e-300});
            }
        }
        put(&store, created);
        if id == "d" {
            // Never started: no attempts, no intermediate results.
            continue;
        }
        put(&store, started(id, 1));
        for (at, raw) in raws.iter().enumerate().skip(sequence as usize) {
            put(&store, metric(id, MetricKind::Intermediate, at as u64, raw));
        }
        if id == "b" {
            put(&store, ended(id, 1, TrialStatus::Failed));
            put(
                &store,
                StoreEvent::TrialRequeued {
                    trial_id: id.to_string(),
                    reason: "attempt 1 failed".to_string(),
                    memory_request_mib: Some(2048),
                    gpu_memory_request_mib: None,
                    peak_memory_mib: Some(1024),
                    peak_gpu_memory_mib: None,
                },
            );
            put(&store, started(id, 2));
            continue;
        }
        put(&store, metric(id, MetricKind::Final, 0, raws[6]));
        put(&store, ended(id, 1, TrialStatus::Succeeded));
    }
    let state = store.replay().unwrap();
    // Written part by part, it is what its one value written pretty would be.
    let (whole, value) = exported_json(&state);
    assert_eq!(serde_json::to_string_pretty(&value).unwrap() + "\n", whole);
    // What is compared has what it is meant to have.
    let counts: Vec<usize> = (0..4)
        .map(|t| value["trials"][t]["intermediate"].as_array().unwrap().len())
        .collect();
    assert_eq!(counts, [12, 11, 10, 0], "{whole}");
    assert_eq!(value["trials"][2]["schedule"][0]["from_step"], 3, "{whole}");
    assert_eq!(value["warnings"].as_array().unwrap().len(), 1, "{whole}");
}

/// The JSON export as `knob experiment export` writes it, and read back.
fn exported_json(state: &knob_core::store::ExperimentState) -> (String, serde_json::Value) {
    let mut written = Vec::new();
    knob_core::export::write_json(state, false, &mut written).unwrap();
    let text = String::from_utf8(written).unwrap();
    let value = serde_json::from_str(&text).unwrap();
    (text, value)
}

/// Every snapshot reads the experiment's status changes (`running_ms`): an index of their own
/// keeps that from scanning the whole log (0.1 s at 100 000 trials). A store written by a knob
/// from before the index gets it the next time it is opened for writing.
#[test]
fn the_experiments_own_events_have_an_index_an_older_store_gets_when_next_written() {
    let dir = tempfile::tempdir().unwrap();
    let status = |status| StoreEvent::ExperimentStatusChanged {
        status,
        message: None,
        spent_before_ms: None,
    };
    {
        let store = Store::open(dir.path()).unwrap();
        put(&store, created());
        put(&store, status(ExperimentStatus::Running));
        put(&store, trial("t0", 0));
        put(&store, status(ExperimentStatus::Stopped));
    }
    let db = dir.path().join(DB_FILE_NAME);
    let plan = || -> String {
        let connection = Connection::open(&db).unwrap();
        connection
            .query_row(
                "EXPLAIN QUERY PLAN SELECT seq, time_ms, payload FROM events
                 WHERE trial_id IS NULL AND kind = 'experiment_status_changed' ORDER BY seq",
                [],
                |row| row.get::<_, String>(3),
            )
            .unwrap()
    };
    assert!(
        plan().contains("USING INDEX events_of_experiment"),
        "{}",
        plan()
    );
    // As a store from before the index was.
    Connection::open(&db)
        .unwrap()
        .execute_batch("DROP INDEX events_of_experiment")
        .unwrap();
    assert!(plan().starts_with("SCAN events"), "{}", plan());
    let state = StoreReader::open(dir.path()).unwrap().replay().unwrap();
    let until = state.status_history[2].time_ms + 5_000;
    let scanned = StoreReader::open(dir.path())
        .unwrap()
        .active_time_ms(until)
        .unwrap();
    assert_eq!(scanned, state.active_time_ms(until));
    drop(Store::open(dir.path()).unwrap());
    assert!(
        plan().contains("USING INDEX events_of_experiment"),
        "{}",
        plan()
    );
    let indexed = StoreReader::open(dir.path())
        .unwrap()
        .active_time_ms(until)
        .unwrap();
    assert_eq!(indexed, scanned);
}

/// The last moment a crashed run was alive is its last event or metric: either table may be
/// empty (a run that crashed before any trial reported gave none at all, and the alive mark
/// alone counted).
#[test]
fn the_last_alive_moment_is_the_latest_event_or_metric_even_with_no_metrics() {
    let dir = tempfile::tempdir().unwrap();
    // No alive mark on a slow machine: it would be the latest.
    let options = StoreOptions {
        alive_interval: Duration::from_secs(3_600),
        ..StoreOptions::default()
    };
    let store = Store::open_with(dir.path(), options).unwrap();
    put(&store, created());
    put(&store, trial("t0", 0));
    put(&store, started("t0", 1));
    let reader = StoreReader::open(dir.path()).unwrap();
    let events_only = store.replay().unwrap().last_event_time_ms;
    assert_eq!(reader.last_alive_ms().unwrap(), Some(events_only));
    put(&store, metric("t0", MetricKind::Intermediate, 0, "0.5"));
    let with_metric = store.replay().unwrap().last_event_time_ms;
    assert!(with_metric >= events_only);
    assert_eq!(reader.last_alive_ms().unwrap(), Some(with_metric));
}

/// A row whose bytes were damaged inside an intact page reads as a damaged store, with its
/// advice, not as rusqlite's conversion error.
#[test]
fn a_row_that_does_not_decode_is_a_damaged_store() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        put(&store, created());
        put(&store, trial("t0", 0));
    }
    Connection::open(dir.path().join(DB_FILE_NAME))
        .unwrap()
        .execute("UPDATE trials SET parameters = 'x{'", [])
        .unwrap();
    let error = StoreReader::open(dir.path())
        .unwrap()
        .trials(&TrialQuery::default())
        .unwrap_err();
    assert!(matches!(error, StoreError::Damaged { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("keep a copy of the experiment's folder"),
        "{error}"
    );
}

/// A cursor above every sequence number, however large, finds nothing after it: one above
/// `i64::MAX` turned negative in SQL and replayed the whole log.
#[test]
fn a_cursor_above_every_event_finds_nothing_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    put(&store, created());
    put(&store, trial("t0", 0));
    put(&store, started("t0", 1));
    put(&store, metric("t0", MetricKind::Intermediate, 0, "0.5"));
    let reader = StoreReader::open(dir.path()).unwrap();
    assert_eq!(reader.events_since(0, 10).unwrap().len(), 4);
    assert_eq!(reader.metrics_since(0, 10).unwrap().len(), 1);
    for after in [i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX] {
        assert!(
            reader.events_since(after, 10).unwrap().is_empty(),
            "{after}"
        );
        assert!(
            reader.metrics_since(after, 10).unwrap().is_empty(),
            "{after}"
        );
    }
}
