//! The NNI v3 HTTP channel, spoken over raw HTTP exactly as nni 3.0's trial side does.

use std::time::Duration;

use knob_plugin_api::service::MetricKind;
use serde_json::{json, Value};

use crate::support::*;

/// A trial that publishes its channel URL and waits (bounded) for the test to say `done`.
const WAITING_TRIAL: &str = r#"
    echo "$NNI_TRIAL_COMMAND_CHANNEL" > "$KNOB_TRIAL_DIR/url.tmp" && mv "$KNOB_TRIAL_DIR/url.tmp" "$KNOB_TRIAL_DIR/url"
    for i in $(seq 1 600); do [ -e "$KNOB_TRIAL_DIR/done" ] && exit 0; sleep 0.05; done
    exit 9
"#;

fn start_waiting_trial(h: &mut Harness, trial_id: &str, parameters: Value) -> String {
    let mut request = h.request(trial_id, WAITING_TRIAL);
    request.parameters = parameters;
    h.service.start(&request).unwrap();
    let url_file = h.trial_dir(trial_id).join("url");
    wait_for_file(&url_file);
    std::fs::read_to_string(url_file)
        .unwrap()
        .trim()
        .to_string()
}

fn finish(h: &Harness, trial_id: &str) {
    std::fs::write(h.trial_dir(trial_id).join("done"), "").unwrap();
}

fn received_parameter(reply: &HttpReply) -> Value {
    assert_eq!(reply.status, 200, "{reply:?}");
    let command: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(command["type"], "parameter");
    serde_json::from_str(command["parameter"].as_str().unwrap()).unwrap()
}

#[test]
fn trial_gets_its_own_parameters_and_reports_metrics_with_nan() {
    let mut h = Harness::new();
    let url = start_waiting_trial(&mut h, "v3a", json!({"lr": 0.5, "opt": "sgd"}));
    assert_eq!(
        url,
        format!("http://{}/env/local/v3a", h.service.channel_address())
    );

    // Nothing asked for yet: the GET is held, then answered 408 (nni asks again at once).
    assert_eq!(http("GET", &url, None).status, 408);

    let put = http("PUT", &url, Some(&json!({"type": "request_parameter"})));
    assert_eq!((put.status, put.body.as_str()), (200, ""));
    let record = received_parameter(&http("GET", &url, None));
    assert_eq!(
        record.to_string(),
        r#"{"parameter_id":42,"parameter_source":"algorithm","parameters":{"lr":0.5,"opt":"sgd"},"parameter_index":0}"#
    );

    for (kind, sequence, value) in [
        ("PERIODICAL", 0, "0.5"),
        ("PERIODICAL", 1, "NaN"),
        ("PERIODICAL", 2, "-Infinity"),
        ("FINAL", 0, r#"{"default": 0.75, "loss": NaN}"#),
    ] {
        let put = http(
            "PUT",
            &url,
            Some(&nni_metric_command("v3a", kind, sequence, value)),
        );
        assert_eq!((put.status, put.body.as_str()), (200, ""), "{kind} {value}");
    }
    finish(&h, "v3a");
    let events = h.events.wait_ended("v3a");
    assert_eq!(
        metrics(&events),
        [
            (MetricKind::Intermediate, 0, "0.5".into()),
            (MetricKind::Intermediate, 1, "NaN".into()),
            (MetricKind::Intermediate, 2, "-Infinity".into()),
            (
                MetricKind::Final,
                0,
                r#"{"default": 0.75, "loss": NaN}"#.into()
            ),
        ]
    );
    assert_eq!(ending(&events).0, Some(0));
    assert_eq!(warnings(&events), Vec::<String>::new());

    // The trial has ended: its channel refuses metrics.
    let late = http(
        "PUT",
        &url,
        Some(&nni_metric_command("v3a", "FINAL", 0, "1")),
    );
    assert_eq!(late.status, 404);
    assert_eq!(
        late.body,
        "trial v3a is not running on environment local; nothing recorded"
    );
    assert_eq!(metrics(&h.events.all()).len(), 4);
}

#[test]
fn parameters_are_bound_to_the_trial_in_the_url_whoever_asks_first() {
    let mut h = Harness::new();
    let url_a = start_waiting_trial(&mut h, "bindA", json!({"x": "A"}));
    let url_b = start_waiting_trial(&mut h, "bindB", json!({"x": "B"}));
    // B asks first; NNI 3.0 would give it A's parameters.
    assert_eq!(
        http("PUT", &url_b, Some(&json!({"type": "request_parameter"}))).status,
        200
    );
    assert_eq!(
        http("PUT", &url_a, Some(&json!({"type": "request_parameter"}))).status,
        200
    );
    assert_eq!(
        received_parameter(&http("GET", &url_a, None))["parameters"]["x"],
        "A"
    );
    assert_eq!(
        received_parameter(&http("GET", &url_b, None))["parameters"]["x"],
        "B"
    );

    // A metric naming another trial is refused, not recorded for either.
    let stray = http(
        "PUT",
        &url_a,
        Some(&nni_metric_command("bindB", "FINAL", 0, "1")),
    );
    assert_eq!(stray.status, 400);
    assert_eq!(
        stray.body,
        "metric names trial \"bindB\" but came on trial bindA's channel; not recorded"
    );
    finish(&h, "bindA");
    finish(&h, "bindB");
    let a = h.events.wait_ended("bindA");
    let b = h.events.wait_ended("bindB");
    assert!(metrics(&a).is_empty() && metrics(&b).is_empty());
    assert_eq!(warnings(&a).len(), 1, "{a:#?}");
}

#[test]
fn a_held_get_is_answered_as_soon_as_parameters_are_requested() {
    let mut h = Harness::new();
    let url = start_waiting_trial(&mut h, "poll1", json!({"k": 1}));
    let getter = {
        let url = url.clone();
        std::thread::spawn(move || http("GET", &url, None))
    };
    // Whether the GET is already held or not, it gets the parameters, not a 408; if it came
    // too early and timed out, nni's loop would ask again, so retry the same way (bounded).
    assert_eq!(
        http("PUT", &url, Some(&json!({"type": "request_parameter"}))).status,
        200
    );
    let mut reply = getter.join().unwrap();
    for _ in 0..5 {
        if reply.status != 408 {
            break;
        }
        reply = http("GET", &url, None);
    }
    assert_eq!(received_parameter(&reply)["parameters"]["k"], 1);

    // A second request (another rank of a torchrun or DDP trial) gets the same parameters, as
    // each process gets them from NNI 2.x's `parameter.cfg`; it used to get none.
    assert_eq!(
        http("PUT", &url, Some(&json!({"type": "request_parameter"}))).status,
        200
    );
    let second = http("GET", &url, None);
    assert_eq!(received_parameter(&second)["parameters"]["k"], 1);
    finish(&h, "poll1");
    let events = h.events.wait_ended("poll1");
    assert!(warnings(&events).is_empty(), "{:?}", warnings(&events));
}

#[test]
fn requests_for_unknown_trials_or_bad_commands_are_refused_with_a_message() {
    let mut h = Harness::new();
    let url = start_waiting_trial(&mut h, "known", json!({}));
    let base = format!("http://{}", h.service.channel_address());

    let unknown = http(
        "PUT",
        &format!("{base}/env/local/ghost"),
        Some(&nni_metric_command("ghost", "FINAL", 0, "1")),
    );
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.body,
        "trial ghost is not running on environment local; nothing recorded"
    );
    assert_eq!(
        http("GET", &format!("{base}/env/local/ghost"), None).status,
        404
    );
    assert_eq!(
        http(
            "PUT",
            &format!("{base}/env/elsewhere/known"),
            Some(&json!({"type": "request_parameter"}))
        )
        .status,
        404
    );
    let wrong_path = http("GET", &format!("{base}/metrics"), None);
    assert_eq!(wrong_path.status, 404);
    assert_eq!(
        wrong_path.body,
        "/metrics is not a trial channel (expected /env/<environment>/<trial>)"
    );

    let not_json = http("PUT", &url, None);
    assert_eq!(not_json.status, 400);
    assert_eq!(
        not_json.body,
        "empty command (expected a JSON object with a \"type\")"
    );
    let unknown_type = http("PUT", &url, Some(&json!({"type": "report"})));
    assert_eq!(
        (unknown_type.status, unknown_type.body.as_str()),
        (
            400,
            "command type \"report\" is unknown (expected request_parameter or metric)"
        )
    );
    let garbage_metric = http(
        "PUT",
        &url,
        Some(&json!({"type": "metric", "metric": "{{{"})),
    );
    assert_eq!(garbage_metric.status, 400);
    assert!(
        garbage_metric.body.starts_with("metric {{{ is not JSON"),
        "{garbage_metric:?}"
    );
    // A value that is not JSON is the trial's final all the same, passed on as sent for the
    // core to report, as a bad `KNOB_FINAL` line is (the later 0.5 is a second final).
    let bad_value = http(
        "PUT",
        &url,
        Some(&nni_metric_command("known", "FINAL", 0, "not json")),
    );
    assert_eq!(bad_value.status, 200);

    // A 10 MB metric is refused without being recorded; the trial is unharmed.
    let huge = "7".repeat(10 << 20);
    let too_big = http(
        "PUT",
        &url,
        Some(&nni_metric_command("known", "FINAL", 0, &huge)),
    );
    assert_eq!(too_big.status, 413);
    let ok = http(
        "PUT",
        &url,
        Some(&nni_metric_command("known", "FINAL", 0, "0.5")),
    );
    assert_eq!(ok.status, 200);

    finish(&h, "known");
    let events = h.events.wait_ended("known");
    assert_eq!(
        metrics(&events),
        [
            (MetricKind::Final, 0, "not json".into()),
            (MetricKind::Final, 1, "0.5".into())
        ]
    );
    assert_eq!(warnings(&events).len(), 4, "{events:#?}");
    assert_eq!(ending(&events).0, Some(0));
}

/// Out of file descriptors, the channel's accept fails while a connection waits in its backlog,
/// and the listener reads as ready again at once: it must wait before it tries again, not spin
/// a core until a descriptor frees (it did, ~12 000 failed accepts a second). Run in a child
/// process, since it uses up the process's descriptors.
#[test]
fn the_channel_waits_instead_of_spinning_when_out_of_descriptors() {
    let name = "nni_v3::the_channel_waits_instead_of_spinning_when_out_of_descriptors";
    if in_child_process(name, &[]).is_some() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = knob_training_services::nni_http::ChannelServer::start(runtime.handle()).unwrap();
    // The server cannot accept the client's connection.
    let held = use_up_descriptors_but_one();
    let _client = std::net::TcpStream::connect(server.address()).unwrap();
    let used = cpu_used_over(Duration::from_secs(1));
    drop(held);
    assert!(
        used < Duration::from_millis(100),
        "the channel used {used:?} of CPU in 1 s while out of descriptors"
    );
}
