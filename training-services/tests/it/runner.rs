//! The trial runner on its own, as the knob-agent will use it (no `LocalService`), with metric
//! files polled instead of watched.

use std::sync::Arc;
use std::time::Duration;

use knob_plugin_api::service::MetricKind;
use knob_training_services::nni_http::ChannelServer;
use knob_training_services::runner::{start_trial, TrialHost};
use knob_training_services::tail::{self, FileWatcher};

use crate::support::*;

#[test]
fn runner_reads_metric_files_live_without_change_notification() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let events = Events::default();
    let host = Arc::new(TrialHost {
        platform: "local".into(),
        grace_period: Duration::from_millis(500),
        channels: Arc::new(ChannelServer::start(runtime.handle()).unwrap()),
        watcher: Arc::new(FileWatcher::polling("test")),
        emit: events.emitter(),
    });
    let dir = tempfile::tempdir().unwrap();
    let command = r#"
        echo "KNOB_INTERMEDIATE 1" >> "$KNOB_METRICS_FILE"
        for i in $(seq 1 600); do [ -e "$KNOB_TRIAL_DIR/go" ] && break; sleep 0.05; done
        echo "KNOB_FINAL 2" >> "$KNOB_METRICS_FILE"
    "#;
    let request = request(dir.path(), &dir.path().join("trial"), "polled", command);
    let (finished_tx, finished_rx) = std::sync::mpsc::channel();
    let _handle = start_trial(
        &host,
        runtime.handle(),
        &request,
        Box::new(|| {}),
        Box::new(move || finished_tx.send(()).unwrap()),
    )
    .unwrap();
    events.wait_until("the first metric, read while the trial runs", |events| {
        !metrics(events).is_empty()
    });
    std::fs::write(dir.path().join("trial/go"), "").unwrap();
    let trial = events.wait_ended("polled");
    assert_eq!(
        metrics(&trial),
        [
            (MetricKind::Intermediate, 0, "1".into()),
            (MetricKind::Final, 0, "2".into()),
        ]
    );
    assert_eq!(ending(&trial).0, Some(0));
    finished_rx.recv_timeout(WAIT).unwrap();
}

#[test]
fn runner_watches_metric_files_of_a_trial_that_runs_on() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let events = Events::default();
    let watcher = FileWatcher::new();
    assert_eq!(
        watcher.unavailable(),
        None,
        "inotify is needed for this test"
    );
    let host = Arc::new(TrialHost {
        platform: "local".into(),
        grace_period: Duration::from_millis(500),
        channels: Arc::new(ChannelServer::start(runtime.handle()).unwrap()),
        watcher: Arc::new(watcher),
        emit: events.emitter(),
    });
    let dir = tempfile::tempdir().unwrap();
    // One metric at its start (read before the watches are added, or as they are), one each
    // time the test says go, after them: only a change notification brings those while the
    // trial runs (a watched file is not polled), then the final.
    let command = r#"
        echo "KNOB_INTERMEDIATE 1" >> "$KNOB_METRICS_FILE"
        for n in 2 3; do
            for i in $(seq 1 600); do [ -e "$KNOB_TRIAL_DIR/go$n" ] && break; sleep 0.05; done
            echo "KNOB_INTERMEDIATE $n" >> "$KNOB_METRICS_FILE"
        done
        for i in $(seq 1 600); do [ -e "$KNOB_TRIAL_DIR/end" ] && break; sleep 0.05; done
        echo "KNOB_FINAL 4" >> "$KNOB_METRICS_FILE"
    "#;
    let request = request(dir.path(), &dir.path().join("trial"), "watched", command);
    let (finished_tx, finished_rx) = std::sync::mpsc::channel();
    let _handle = start_trial(
        &host,
        runtime.handle(),
        &request,
        Box::new(|| {}),
        Box::new(move || finished_tx.send(()).unwrap()),
    )
    .unwrap();
    for (n, go) in [(1, "go2"), (2, "go3"), (3, "end")] {
        events.wait_until("a metric, read while the trial runs", |events| {
            metrics(events).len() >= n
        });
        std::thread::sleep(tail::WATCH_AFTER);
        std::fs::write(dir.path().join("trial").join(go), "").unwrap();
    }
    let trial = events.wait_ended("watched");
    assert_eq!(
        metrics(&trial),
        [
            (MetricKind::Intermediate, 0, "1".into()),
            (MetricKind::Intermediate, 1, "2".into()),
            (MetricKind::Intermediate, 2, "3".into()),
            (MetricKind::Final, 0, "4".into()),
        ]
    );
    assert_eq!(ending(&trial).0, Some(0));
    finished_rx.recv_timeout(WAIT).unwrap();
}
