//! The NNI 2.x file channel: `parameter.cfg` before start, `.nni/metrics` records read live.

use knob_plugin_api::service::MetricKind;
use serde_json::json;

use crate::support::*;

/// Bash that appends one NNI record (`ME` + 6-digit byte length + JSON + `\n`) for metric JSON
/// `$1`, the way `nni/runtime/platform/local.py` does.
const SEND_METRIC: &str = r#"
    send_metric() {
        local data="$1"$'\n'
        printf 'ME%06d%s' "$(printf %s "$data" | wc -c)" "$data" >> "$NNI_SYS_DIR/.nni/metrics"
    }
"#;

#[test]
fn parameter_cfg_is_written_before_start_and_metrics_are_read_as_they_come() {
    let mut h = Harness::new();
    let command = format!(
        r#"{SEND_METRIC}
        # What nni 2.x reads, before anything else.
        cp "$NNI_SYS_DIR/parameter.cfg" "$NNI_SYS_DIR/parameter.seen"
        send_metric '{{"parameter_id": 42, "trial_job_id": "'$NNI_TRIAL_JOB_ID'", "type": "PERIODICAL", "sequence": 0, "value": "0.25"}}'
        # Wait (bounded) until the test has seen that metric while the trial still runs.
        for i in $(seq 1 600); do [ -e "$NNI_SYS_DIR/go" ] && break; sleep 0.05; done
        send_metric '{{"parameter_id": 42, "trial_job_id": "'$NNI_TRIAL_JOB_ID'", "type": "PERIODICAL", "sequence": 1, "value": "NaN"}}'
        send_metric '{{"parameter_id": 42, "trial_job_id": "'$NNI_TRIAL_JOB_ID'", "type": "FINAL", "sequence": 0, "value": "{{\"default\": 0.5}}"}}'
        exit 0
        "#
    );
    let mut request = h.request("file1", &command);
    request.parameters = json!({"dropout": 0.5, "conv": {"_name": "big", "size": 7}});
    h.service.start(&request).unwrap();

    h.events
        .wait_until("the first metric, read while the trial runs", |events| {
            !metrics(events).is_empty()
        });
    let dir = h.trial_dir("file1");
    std::fs::write(dir.join("go"), "").unwrap();
    let events = h.events.wait_ended("file1");
    assert_eq!(
        metrics(&events),
        [
            (MetricKind::Intermediate, 0, "0.25".into()),
            (MetricKind::Intermediate, 1, "NaN".into()),
            (MetricKind::Final, 0, r#"{"default": 0.5}"#.into()),
        ]
    );
    assert_eq!(ending(&events).0, Some(0));
    assert_eq!(warnings(&events), Vec::<String>::new());
    let seen = std::fs::read_to_string(dir.join("parameter.seen")).unwrap();
    assert_eq!(
        seen,
        r#"{"parameter_id":42,"parameter_source":"algorithm","parameters":{"dropout":0.5,"conv":{"_name":"big","size":7}},"parameter_index":0}"#
    );
}

#[test]
fn corrupt_records_and_foreign_metrics_are_warned_about_and_the_rest_kept() {
    let mut h = Harness::new();
    let command = format!(
        r#"{SEND_METRIC}
        echo 'this is not a record' >> "$NNI_SYS_DIR/.nni/metrics"
        send_metric '{{"trial_job_id": "someone-else", "type": "FINAL", "sequence": 0, "value": "9"}}'
        send_metric '{{"trial_job_id": "'$NNI_TRIAL_JOB_ID'", "type": "REQUEST_PARAMETER", "sequence": 0, "parameter_index": 0}}'
        send_metric '{{"trial_job_id": "'$NNI_TRIAL_JOB_ID'", "type": "FINAL", "sequence": 0, "value": "1.5"}}'
        printf 'ME0000' >> "$NNI_SYS_DIR/.nni/metrics"
        "#
    );
    let events = h.run(h.request("file2", &command));
    assert_eq!(metrics(&events), [(MetricKind::Final, 0, "1.5".into())]);
    assert_eq!(
        warnings(&events),
        [
            "trial file2: .nni/metrics: not a record (`ME` + 6 digits + JSON) at byte 0: this is not a record",
            "trial file2: .nni/metrics: metric names trial \"someone-else\" but came on trial file2's channel; not recorded",
            "trial file2: .nni/metrics: incomplete record at byte 290 (6 bytes: ME0000)",
        ]
    );
    assert_eq!(ending(&events).0, Some(0));
}

#[test]
fn an_unreadable_final_is_passed_on_as_a_bad_knob_final_line_is() {
    // `nni.report_final_result(10**400)`: Python writes the int's 401 digits, more than a
    // float holds. The first final goes on as sent (the core stores it, warns on the console
    // and gives the trial "final result unreadable: ..."), as `KNOB_FINAL 1e400` does; a bad
    // intermediate, and a bad final after it, stay warnings.
    let mut h = Harness::new();
    let huge = format!("1{}", "0".repeat(400));
    let command = format!(
        r#"{SEND_METRIC}
        send_metric '{{"trial_job_id": "'$NNI_TRIAL_JOB_ID'", "type": "PERIODICAL", "sequence": 0, "value": "-{huge}"}}'
        send_metric '{{"trial_job_id": "'$NNI_TRIAL_JOB_ID'", "type": "FINAL", "sequence": 0, "value": "{huge}"}}'
        send_metric '{{"trial_job_id": "'$NNI_TRIAL_JOB_ID'", "type": "FINAL", "sequence": 1, "value": "{{\"default\": {huge}}}"}}'
        "#
    );
    let events = h.run(h.request("file3", &command));
    assert_eq!(metrics(&events), [(MetricKind::Final, 0, huge.clone())]);
    let warned = warnings(&events);
    assert_eq!(warned.len(), 2, "{warned:#?}");
    assert!(
        warned[0].starts_with("trial file3: .nni/metrics: metric value -10000")
            && warned[0].contains("is not JSON (number out of range"),
        "{warned:#?}"
    );
    assert!(
        warned[1].starts_with("trial file3: .nni/metrics: metric value {\\\"default\\\": 10000"),
        "{warned:#?}"
    );
    assert_eq!(ending(&events).0, Some(0));
}
