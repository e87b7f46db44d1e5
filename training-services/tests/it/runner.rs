//! The trial runner on its own, as the knob-agent will use it (no `LocalService`), with metric
//! files polled instead of watched.

use std::sync::Arc;
use std::time::Duration;

use knob_plugin_api::service::MetricKind;
use knob_training_services::nni_http::ChannelServer;
use knob_training_services::runner::{start_trial, TrialHandle, TrialHost};
use knob_training_services::tail::{self, FileWatcher};

use crate::support::*;

/// A one-worker runtime and a `local` trial host on it that reports to `events` and watches
/// metric files with `watcher`.
fn local_host(events: &Events, watcher: FileWatcher) -> (tokio::runtime::Runtime, Arc<TrialHost>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let host = Arc::new(TrialHost {
        platform: "local".into(),
        grace_period: Duration::from_millis(500),
        channels: Arc::new(ChannelServer::start(runtime.handle()).unwrap()),
        watcher: Arc::new(watcher),
        emit: events.emitter(),
    });
    (runtime, host)
}

/// Starts `request` on `host`; the receiver hears once the trial finished.
fn start(
    host: &Arc<TrialHost>,
    runtime: &tokio::runtime::Runtime,
    request: &knob_plugin_api::service::TrialRequest,
) -> (TrialHandle, std::sync::mpsc::Receiver<()>) {
    let (finished_tx, finished_rx) = std::sync::mpsc::channel();
    let handle = start_trial(
        host,
        runtime.handle(),
        request,
        Box::new(|| {}),
        Box::new(move || finished_tx.send(()).unwrap()),
    )
    .unwrap();
    (handle, finished_rx)
}

#[test]
fn runner_reads_metric_files_live_without_change_notification() {
    let events = Events::default();
    let (runtime, host) = local_host(&events, FileWatcher::polling("test"));
    let dir = tempfile::tempdir().unwrap();
    let command = r#"
        echo "KNOB_INTERMEDIATE 1" >> "$KNOB_METRICS_FILE"
        for i in $(seq 1 600); do [ -e "$KNOB_TRIAL_DIR/go" ] && break; sleep 0.05; done
        echo "KNOB_FINAL 2" >> "$KNOB_METRICS_FILE"
    "#;
    let request = request(dir.path(), &dir.path().join("trial"), "polled", command);
    let (_handle, finished_rx) = start(&host, &runtime, &request);
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
    let events = Events::default();
    let watcher = FileWatcher::new();
    assert_eq!(
        watcher.unavailable(),
        None,
        "inotify is needed for this test"
    );
    let (runtime, host) = local_host(&events, watcher);
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
    let (_handle, finished_rx) = start(&host, &runtime, &request);
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

/// The metric files are not created before the start (a short trial costs two inodes fewer):
/// a trial that runs on past `WATCH_AFTER` gets them created, empty, to be watched, and a
/// metric it appends afterwards is read while it runs.
#[test]
fn runner_creates_the_metric_files_of_a_trial_that_runs_on_to_watch_them() {
    let events = Events::default();
    let (runtime, host) = local_host(&events, FileWatcher::new());
    let dir = tempfile::tempdir().unwrap();
    let command = r#"
        for i in $(seq 1 600); do [ -e "$KNOB_TRIAL_DIR/go" ] && break; sleep 0.05; done
        echo "KNOB_INTERMEDIATE 1" >> "$KNOB_METRICS_FILE"
        for i in $(seq 1 600); do [ -e "$KNOB_TRIAL_DIR/end" ] && break; sleep 0.05; done
    "#;
    let trial_dir = dir.path().join("trial");
    let request = request(dir.path(), &trial_dir, "late", command);
    let (_handle, finished_rx) = start(&host, &runtime, &request);
    assert!(
        trial_dir.join(".nni").is_dir(),
        "NNI's folder exists from the start"
    );
    let (knob_file, nni_file) = (
        trial_dir.join("metrics.knob"),
        trial_dir.join(".nni/metrics"),
    );
    let deadline = std::time::Instant::now() + WAIT;
    while !(knob_file.exists() && nni_file.exists()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the metric files were not created to be watched"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(std::fs::read(&nni_file).unwrap(), b"");
    std::fs::write(trial_dir.join("go"), "").unwrap();
    events.wait_until("the metric, read while the trial runs", |events| {
        !metrics(events).is_empty()
    });
    std::fs::write(trial_dir.join("end"), "").unwrap();
    let trial = events.wait_ended("late");
    assert_eq!(metrics(&trial), [(MetricKind::Intermediate, 0, "1".into())]);
    finished_rx.recv_timeout(WAIT).unwrap();
}

/// A trial that deletes its folder and makes it again (cleaning its output folder) writes its
/// metrics to new files at the same paths: each is read from its start, not from where the
/// old one ended, and, its watch having followed the old file, read on a timer from then on.
#[test]
fn runner_reads_metric_files_a_trial_made_anew_from_their_start() {
    let events = Events::default();
    let (runtime, host) = local_host(&events, FileWatcher::new());
    let dir = tempfile::tempdir().unwrap();
    // The new files outgrow the old ones before they are read: the old offsets fell inside them.
    let command = r#"
        send_metric() {
            local data="$1"$'\n'
            printf 'ME%06d%s' "$(printf %s "$data" | wc -c)" "$data" >> "$NNI_SYS_DIR/.nni/metrics"
        }
        echo "KNOB_INTERMEDIATE 1" >> "$KNOB_METRICS_FILE"
        send_metric '{"parameter_id": 42, "trial_job_id": "'$NNI_TRIAL_JOB_ID'", "type": "PERIODICAL", "sequence": 0, "value": "2"}'
        for i in $(seq 1 600); do [ -e "$KNOB_TRIAL_DIR/go" ] && break; sleep 0.05; done
        rm -rf "$KNOB_TRIAL_DIR"
        mkdir -p "$KNOB_TRIAL_DIR/.nni"
        echo "KNOB_INTERMEDIATE 33" >> "$KNOB_METRICS_FILE"
        for i in $(seq 1 600); do [ -e "$KNOB_TRIAL_DIR/end" ] && break; sleep 0.05; done
        send_metric '{"parameter_id": 42, "trial_job_id": "'$NNI_TRIAL_JOB_ID'", "type": "FINAL", "sequence": 0, "value": "{\"default\": 0.5}"}'
    "#;
    let trial_dir = dir.path().join("trial");
    let request = request(dir.path(), &trial_dir, "anew", command);
    let (_handle, finished_rx) = start(&host, &runtime, &request);
    events.wait_until("the first two metrics", |events| metrics(events).len() >= 2);
    std::thread::sleep(tail::WATCH_AFTER);
    std::fs::write(trial_dir.join("go"), "").unwrap();
    events.wait_until(
        "the new file's metric, read while the trial runs",
        |events| metrics(events).len() >= 3,
    );
    std::fs::write(trial_dir.join("end"), "").unwrap();
    let trial = events.wait_ended("anew");
    let mut got = metrics(&trial);
    got.sort_by(|a, b| a.2.cmp(&b.2));
    assert_eq!(
        got,
        [
            (MetricKind::Intermediate, 0, "1".into()),
            (MetricKind::Intermediate, 1, "2".into()),
            (MetricKind::Intermediate, 2, "33".into()),
            (MetricKind::Final, 0, r#"{"default": 0.5}"#.into()),
        ]
    );
    assert_eq!(warnings(&trial), Vec::<String>::new());
    assert_eq!(ending(&trial).0, Some(0));
    finished_rx.recv_timeout(WAIT).unwrap();
}

/// The trials of one experiment import `knob_trial` and the `nni` shim from one folder beside
/// their `trials/` folder, written by the first of them; none gets a copy in its own folder.
#[test]
fn the_trials_of_an_experiment_import_knob_trial_and_the_shim_from_one_shared_folder() {
    let events = Events::default();
    let (runtime, host) = local_host(&events, FileWatcher::polling("test"));
    let dir = tempfile::tempdir().unwrap();
    let experiment = dir.path().join("experiment");
    // Where each module came from, then a final through knob's trial API.
    let command = r#"python3 -c '
import os, knob_trial, nni
with open(os.path.join(os.environ["KNOB_TRIAL_DIR"], "imported"), "w") as f:
    f.write(os.path.dirname(knob_trial.__file__) + "\n" + os.path.dirname(nni.__file__))
knob_trial.report_final(0.5)
'"#;
    let mut imported = Vec::new();
    for trial_id in ["a", "b"] {
        let trial_dir = experiment.join("trials").join(trial_id);
        let mut request = request(dir.path(), &trial_dir, trial_id, command);
        // The shim even where this machine's python3 has a real nni.
        request.env.insert("KNOB_NNI_SHIM".into(), "1".into());
        let _handle = start_trial(
            &host,
            runtime.handle(),
            &request,
            Box::new(|| {}),
            Box::new(|| {}),
        )
        .unwrap();
        let trial = events.wait_ended(trial_id);
        assert_eq!(ending(&trial).0, Some(0), "{trial:?}");
        assert_eq!(metrics(&trial), [(MetricKind::Final, 0, "0.5".into())]);
        assert!(!trial_dir.join(".knob-python").exists());
        imported.push(std::fs::read_to_string(trial_dir.join("imported")).unwrap());
    }
    let folders: Vec<_> = std::fs::read_dir(experiment.join(".knob-python"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(folders.len(), 1, "{folders:?}");
    let folder = folders[0].to_str().unwrap();
    assert_eq!(
        imported,
        [format!("{folder}\n{folder}"), format!("{folder}\n{folder}")]
    );
}

/// Through the `nni` shim, an intermediate result nni's reports take but that is no number
/// (a string, None) is kept as sent, as real nni's channels keep it: the same script recorded
/// other curves with nni installed than without (the shim's were dropped with a warning).
#[test]
fn the_shim_keeps_an_intermediate_result_that_is_no_number_as_nni_does() {
    let events = Events::default();
    let (runtime, host) = local_host(&events, FileWatcher::polling("test"));
    let dir = tempfile::tempdir().unwrap();
    let command = r#"python3 -c '
import nni
nni.get_next_parameter()
nni.report_intermediate_result("hello")
nni.report_intermediate_result(None)
nni.report_intermediate_result(0.5)
nni.report_final_result(1.0)
'"#;
    let mut request = request(dir.path(), &dir.path().join("trial"), "words", command);
    request.env.insert("KNOB_NNI_SHIM".into(), "1".into());
    let (_handle, _finished) = start(&host, &runtime, &request);
    let trial = events.wait_ended("words");
    assert_eq!(ending(&trial).0, Some(0), "{trial:#?}");
    assert_eq!(
        metrics(&trial),
        [
            (MetricKind::Intermediate, 0, r#""hello""#.into()),
            (MetricKind::Intermediate, 1, "null".into()),
            (MetricKind::Intermediate, 2, "0.5".into()),
            (MetricKind::Final, 0, "1.0".into()),
        ]
    );
    assert_eq!(warnings(&trial), Vec::<String>::new());
}

/// A trial may leave anything at the paths of its folder that knob reads when it ends. A FIFO
/// at trial.log kept the end's last read in `open()` for ever (the trial stayed RUNNING and
/// `knob stop` could not stop the experiment); a FIFO at metrics.knob did the same when the
/// file was created to be watched. Each is refused in one warning, and the trial ends.
#[test]
fn a_trial_that_leaves_fifos_and_links_in_its_folder_still_ends() {
    let events = Events::default();
    let (runtime, host) = local_host(&events, FileWatcher::new());
    let dir = tempfile::tempdir().unwrap();
    let command = r#"
        # knob may have created the metric files already (to watch them): replaced.
        rm -f "$KNOB_METRICS_FILE" "$KNOB_TRIAL_DIR/stderr"
        mkfifo "$KNOB_TRIAL_DIR/trial.log" "$KNOB_METRICS_FILE" "$KNOB_TRIAL_DIR/stderr"
        ln -sf /dev/zero "$KNOB_TRIAL_DIR/.nni/metrics"
        echo "KNOB_FINAL 1"
        sleep 0.3
    "#;
    let request = request(dir.path(), &dir.path().join("trial"), "fifos", command);
    let (_handle, finished_rx) = start(&host, &runtime, &request);
    let trial = events.wait_ended("fifos");
    assert_eq!(metrics(&trial), [(MetricKind::Final, 0, "1".into())]);
    assert_eq!(ending(&trial).0, Some(0), "{trial:#?}");
    let warnings = warnings(&trial);
    for (file, what) in [
        ("trial.log", "a FIFO"),
        ("metrics.knob", "a FIFO"),
        (".nni/metrics", "a symbolic link"),
    ] {
        let refused = format!(
            "{file} not read: it is {what}; knob reads and writes only a regular file there"
        );
        assert_eq!(
            warnings.iter().filter(|w| w.ends_with(&refused)).count(),
            1,
            "{refused:?} once in {warnings:#?}"
        );
    }
    finished_rx.recv_timeout(WAIT).unwrap();
}
