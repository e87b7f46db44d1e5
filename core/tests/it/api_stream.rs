//! `/api/v1/stream` is pushed, not polled: an idle stream reads the store only when the store's
//! change signal says it changed. Requests go to the real router (no socket) over a real store.

use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use knob_core::api::{router, ApiConfig, ApiState};
use knob_core::store::{EventSeq, Store, StoreEvent};
use serde_json::json;
use tokio::sync::watch;
use tower::ServiceExt;

/// Reads a `text/event-stream` body one event at a time, skipping keep-alive comments.
struct EventReader {
    body: Body,
    buffer: String,
}

impl EventReader {
    async fn open(router: axum::Router, since: EventSeq) -> EventReader {
        let request = Request::get(format!("/api/v1/stream?since={since}"))
            .body(Body::empty())
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
        EventReader {
            body: response.into_body(),
            buffer: String::new(),
        }
    }

    /// The sequence number (`id:`) of the next event.
    async fn next_seq(&mut self) -> EventSeq {
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(id) = block.lines().find_map(|l| l.strip_prefix("id:")) {
                    return id.trim().parse().unwrap();
                }
            }
            let frame = self.body.frame().await.expect("the stream ended").unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }
}

fn trial_created(trial_id: &str, sequence: u64) -> StoreEvent {
    StoreEvent::TrialCreated {
        trial_id: trial_id.to_string(),
        sequence,
        parameter_id: sequence,
        parameter_label: None,
        parameters: json!({"x": sequence}),
        lineage: None,
    }
}

async fn new_store(dir: &std::path::Path) -> Store {
    let store = Store::open(dir).unwrap();
    store
        .append(StoreEvent::ExperimentCreated {
            experiment_id: "streamed".to_string(),
            config: json!({"trialConcurrency": 1}),
            start_time_ms: 0,
        })
        .await
        .unwrap();
    store.append(trial_created("a", 0)).await.unwrap();
    store
}

fn state(dir: &std::path::Path, commits: Option<watch::Receiver<EventSeq>>) -> ApiState {
    ApiState::new(ApiConfig {
        experiment_id: "streamed".to_string(),
        dir: dir.to_path_buf(),
        commands: None,
        token: None,
        allowed_hosts: Vec::new(),
        commits,
    })
}

/// With the clock paused, an hour of (virtual) waiting passes in no time: a stream that polled
/// the store on any interval would find the committed event in that hour. This one must not see
/// it until the change signal fires, and must see it right after.
#[tokio::test(start_paused = true)]
async fn an_idle_stream_reads_the_store_only_when_told_it_changed() {
    let dir = tempfile::tempdir().unwrap();
    let store = new_store(dir.path()).await;
    let (signal, commits) = watch::channel(2);
    let mut events = EventReader::open(router(state(dir.path(), Some(commits))), 0).await;
    assert_eq!(events.next_seq().await, 1);
    assert_eq!(events.next_seq().await, 2);
    // The stream reads once more after a batch; let it find nothing and go idle.
    let idle = tokio::time::timeout(Duration::from_secs(3600), events.next_seq()).await;
    assert!(idle.is_err(), "an event appeared from nowhere");

    let third = store.append(trial_created("b", 1)).await.unwrap();
    let unsignalled = tokio::time::timeout(Duration::from_secs(3600), events.next_seq()).await;
    assert!(
        unsignalled.is_err(),
        "the stream found event {third} without being told: it polls"
    );

    signal.send(third).unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(3600), events.next_seq()).await;
    assert_eq!(seen.ok(), Some(third));
}

/// The real signals: the store's own commit watch (the process that runs the experiment), and
/// file notifications on a store another process writes (`knob view`).
#[tokio::test]
async fn a_stream_sees_each_commit_through_the_commit_watch_and_through_file_notifications() {
    for watch_files in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = new_store(dir.path()).await;
        let commits = (!watch_files).then(|| store.commits());
        let api = state(dir.path(), commits);
        assert_eq!(api.live_unavailable(), None);
        let mut events = EventReader::open(router(api), 2).await;
        for (n, trial) in ["b", "c", "d"].into_iter().enumerate() {
            let seq = store
                .append(trial_created(trial, n as u64 + 1))
                .await
                .unwrap();
            // A generous bound, so a broken signal fails instead of hanging; not a timing check.
            let seen = tokio::time::timeout(Duration::from_secs(30), events.next_seq()).await;
            assert_eq!(seen.ok(), Some(seq), "watching files: {watch_files}");
        }
    }
}
