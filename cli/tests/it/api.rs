//! The HTTP API against a real running experiment (`knob create --port 0`), every route, every
//! update, bad requests; the read-only `knob view`; token and bind rules; the CLI commands that
//! go through the API.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::create::Sandbox;
use crate::run;

/// Trials report an intermediate and a final result after a short sleep; x = 7 sleeps long
/// enough to be killed.
const CONFIG: &str = r#"trialCommand: 'x=$(echo "$KNOB_PARAMETERS" | tr -dc 0-9); echo KNOB_INTERMEDIATE 1; echo to-stderr >&2; if [ "$x" = 7 ]; then sleep 60; fi; sleep 0.3; echo KNOB_FINAL $x'
trialConcurrency: 1
maxTrialNumber: 1000
searchSpace:
  x: {_type: randint, _value: [0, 1000000]}
tuner:
  name: Random
  classArgs: {seed: 3}
trainingService:
  platform: local"#;

pub(crate) struct Experiment {
    child: Child,
    pub(crate) base: String,
}

impl Experiment {
    /// Waits for the knob process to exit, at most `within`; its status, `None` if it did not.
    pub(crate) fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the knob process (SIGKILL), as a crash would, and reaps it.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Experiment {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `knob <args>` and returns it with the URL it prints (within 30 s).
pub(crate) fn start(mut command: std::process::Command, args: &[&str]) -> Experiment {
    let mut child = command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (found, url) = mpsc::channel();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let found = found.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if let Some(at) = line.find("http://") {
                    let url = line[at..].split_whitespace().next().unwrap().to_string();
                    let _ = found.send(url.trim_end_matches('/').to_string());
                }
            }
        });
    }
    let base = url
        .recv_timeout(Duration::from_secs(30))
        .expect("knob printed no URL within 30 s");
    Experiment { child, base }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// (status, body as JSON, or as a string when it is not JSON).
fn call(method: &str, url: &str, body: Option<&str>, token: Option<&str>) -> (u16, Value) {
    let agent = agent();
    let mut request = ureq::http::Request::builder().method(method).uri(url);
    if let Some(token) = token {
        request = request.header("Authorization", format!("Bearer {token}"));
    }
    let request = request
        .header("Content-Type", "application/json")
        .body(body.unwrap_or("").to_string())
        .unwrap();
    let mut response = agent.run(request).unwrap();
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

pub(crate) fn get(base: &str, path: &str) -> (u16, Value) {
    call("GET", &format!("{base}/api/v1{path}"), None, None)
}

pub(crate) fn send(base: &str, method: &str, path: &str, body: &str) -> (u16, Value) {
    call(method, &format!("{base}/api/v1{path}"), Some(body), None)
}

/// A 4xx whose body is `{"error": "<one line>"}` containing `needle`.
#[track_caller]
fn assert_refused((status, body): (u16, Value), code: u16, needle: &str) {
    assert_eq!(status, code, "{body}");
    let message = body["error"].as_str().unwrap_or_else(|| panic!("{body}"));
    assert!(!message.contains('\n'), "{message}");
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn trials(base: &str, query: &str) -> Value {
    let (status, body) = get(base, &format!("/trials{query}"));
    assert_eq!(status, 200, "{body}");
    body
}

#[test]
fn every_route_of_a_running_experiment_answers_and_refuses_bad_requests() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(CONFIG, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let mut experiment = start(command, &["--id", "live", "--port", "0"]);
    let base = experiment.base.clone();

    // The experiment and its config.
    let (status, summary) = get(&base, "/experiment");
    assert_eq!(status, 200, "{summary}");
    assert_eq!(summary["id"], "live");
    assert_eq!(summary["writable"], true);
    assert_eq!(summary["config"]["trialConcurrency"], 1);
    let (status, page) = call("GET", &format!("{base}/"), None, None);
    assert_eq!(status, 200);
    assert!(page.as_str().unwrap().contains("<html"), "{page}");

    // Trials: wait for two with results, then filters and paging.
    wait_for("two succeeded trials", || {
        trials(&base, "?status=SUCCEEDED")["total"].as_u64() >= Some(2)
    });
    let page = trials(&base, "?status=succeeded&offset=1&limit=1");
    assert_eq!(page["trials"].as_array().unwrap().len(), 1);
    assert_eq!(page["trials"][0]["status"], "SUCCEEDED");
    assert_eq!(page["trials"][0]["sequence"], 1);
    let first = trials(&base, "?limit=1")["trials"][0].clone();
    let first_id = first["trial_id"].as_str().unwrap().to_string();
    assert!(first["duration_ms"].as_i64().is_some(), "{first}");
    assert_refused(
        get(&base, "/trials?status=DONE"),
        400,
        "unknown trial status",
    );
    assert_refused(get(&base, "/trials?offset=-1"), 400, "offset");
    assert_refused(get(&base, "/trials?limit=ten"), 400, "limit");

    // The same trials as columns (what the dashboard loads): one array per field and one per
    // parameter, row for row the trials of `/trials`, with the log's position read before them.
    let (status, columns) = get(&base, "/trial-columns?offset=0&limit=2");
    assert_eq!(status, 200, "{columns}");
    let objects = trials(&base, "?offset=0&limit=2")["trials"].clone();
    assert_eq!(columns["count"], 2, "{columns}");
    for (i, trial) in objects.as_array().unwrap().iter().enumerate() {
        for field in [
            "trial_id",
            "sequence",
            "attempts",
            "started_ms",
            "environment_id",
        ] {
            assert_eq!(
                columns["columns"][field][i], trial[field],
                "{field}: {columns}"
            );
        }
        assert_eq!(
            columns["parameters"]["x"][i], trial["parameters"]["x"],
            "{columns}"
        );
    }
    assert!(columns["last_seq"].as_u64().unwrap() > 0, "{columns}");
    assert!(columns["total"].as_u64().unwrap() >= 2, "{columns}");
    assert_refused(
        get(&base, "/trial-columns?status=DONE"),
        400,
        "unknown trial status",
    );
    assert_refused(get(&base, "/trial-columns?offset=x"), 400, "offset");

    // The platform with its environments, as the running experiment sees them: the local
    // machine, ready, with the trials it ran.
    let (status, environments) = get(&base, "/environments");
    assert_eq!(status, 200, "{environments}");
    assert_eq!(environments["live"], true, "{environments}");
    assert_eq!(
        environments["platforms"][0]["platform"], "local",
        "{environments}"
    );
    let local = &environments["environments"][0];
    assert_eq!(
        (&local["id"], &local["platform"], &local["ready"]),
        (&json!("local"), &json!("local"), &json!(true)),
        "{environments}"
    );
    assert!(local["trials"].as_u64().unwrap() >= 2, "{environments}");

    // Importance is computed once per set of finished trials: asked again before another trial
    // ends, the answer is the cached one; after one ends, it is computed again.
    let ended = |base: &str| -> u64 {
        let (_, summary) = get(base, "/experiment");
        summary["trial_counts"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(status, _)| !["WAITING", "RUNNING"].contains(&status.as_str()))
            .map(|(_, n)| n.as_u64().unwrap())
            .sum()
    };
    let (status, first_answer) = get(&base, "/importance");
    assert_eq!(status, 200, "{first_answer}");
    let seen = ended(&base);
    wait_for("one more trial to end", || ended(&base) > seen);
    let (_, after_an_end) = get(&base, "/importance");
    assert_eq!(after_an_end["cached"], false, "{after_an_end}");

    // One trial, its metrics (intermediate and final), its logs.
    let (status, trial) = get(&base, &format!("/trials/{first_id}"));
    assert_eq!(status, 200, "{trial}");
    let kinds: Vec<&str> = trial["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["intermediate", "final"]);
    let (status, metrics) = get(&base, &format!("/trials/{first_id}/metrics"));
    assert_eq!(status, 200);
    assert_eq!(metrics["metrics"].as_array().unwrap().len(), 2);
    assert_refused(get(&base, "/trials/nosuch"), 404, "no trial nosuch");
    assert_refused(get(&base, "/trials/nosuch/metrics"), 404, "no trial nosuch");
    let (status, stdout) = get(&base, &format!("/trials/{first_id}/logs/stdout"));
    assert_eq!(status, 200);
    assert!(stdout.as_str().unwrap().contains("KNOB_FINAL"), "{stdout}");
    let (status, stderr) = get(&base, &format!("/trials/{first_id}/logs/stderr"));
    assert_eq!((status, stderr.as_str()), (200, Some("to-stderr\n")));
    assert_refused(
        get(&base, &format!("/trials/{first_id}/logs/trial.log")),
        404,
        "no trial.log",
    );
    assert_refused(
        get(&base, &format!("/trials/{first_id}/logs/..")),
        404,
        "no log",
    );
    assert_refused(get(&base, "/trials/nosuch/logs/stdout"), 404, "no trial");

    // Incremental reads: metrics and events since a sequence number.
    let (_, all) = get(&base, "/metrics?since=0");
    let all = all["metrics"].as_array().unwrap().clone();
    assert!(all.len() >= 4);
    let cut = all[1]["seq"].as_u64().unwrap();
    let (_, later) = get(&base, &format!("/metrics?since={cut}&limit=2"));
    assert_eq!(later["metrics"].as_array().unwrap().len(), 2);
    assert_eq!(later["metrics"][0], all[2]);
    assert_refused(get(&base, "/metrics?since=x"), 400, "since");
    let (_, events) = get(&base, "/events?since=0&limit=3");
    let seqs: Vec<u64> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(events["events"][0]["event"]["type"], "experiment_created");
    assert_eq!(events["last_seq"], 3);

    // The live stream starts after `since` and carries ids.
    let mut stream = agent()
        .get(format!("{base}/api/v1/stream?since=1"))
        .call()
        .unwrap();
    assert_eq!(
        stream.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut reader = BufReader::new(stream.body_mut().as_reader());
    let mut first_lines = Vec::new();
    while first_lines.len() < 3 {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        first_lines.push(line.trim_end().to_string());
    }
    assert_eq!(first_lines[0], "id: 2", "{first_lines:?}");
    assert!(first_lines[1].starts_with("event: "), "{first_lines:?}");
    assert!(
        first_lines[2].starts_with("data: {\"seq\":2"),
        "{first_lines:?}"
    );
    drop(reader);

    // Updates, each read back from the experiment's config.
    let (status, body) = send(&base, "PATCH", "/experiment", r#"{"trialConcurrency": 2}"#);
    assert_eq!(
        (status, &body),
        (200, &json!({"applied": ["trialConcurrency"]}))
    );
    let (status, _) = send(
        &base,
        "PUT",
        "/experiment",
        r#"{"max_trial_number": 500, "maxExperimentDuration": "30m"}"#,
    );
    assert_eq!(status, 200);
    let config = get(&base, "/experiment").1["config"].clone();
    assert_eq!(config["trialConcurrency"], 2);
    assert_eq!(config["maxTrialNumber"], 500);
    assert_eq!(config["maxExperimentDuration"], 1800);
    let (status, _) = send(
        &base,
        "PATCH",
        "/experiment",
        r#"{"maxExperimentDuration": 3600}"#,
    );
    assert_eq!(status, 200);
    assert_eq!(
        get(&base, "/experiment").1["config"]["maxExperimentDuration"],
        3600
    );
    let space = r#"{"x": {"_type": "randint", "_value": [0, 2000000]}}"#;
    assert_eq!(send(&base, "PUT", "/experiment/search-space", space).0, 200);
    assert_eq!(
        get(&base, "/experiment").1["config"]["searchSpace"]["x"]["_value"],
        json!([0, 2000000])
    );
    let patch = |body: &str| send(&base, "PATCH", "/experiment", body);
    assert_refused(
        patch(r#"{"trialConcurrency": -1}"#),
        400,
        "positive integer",
    );
    assert_refused(
        patch(r#"{"trialConcurrency": "two"}"#),
        400,
        "positive integer",
    );
    assert_refused(patch(r#"{"trialConcurrency": 0}"#), 400, "at least 1");
    assert_refused(patch(r#"{"maxTrialNumber": 1.5}"#), 400, "positive integer");
    assert_refused(patch(r#"{"maxTrialNumber": 0}"#), 400, "at least 1");
    assert_refused(
        patch(r#"{"maxExperimentDuration": "soon"}"#),
        400,
        "maxExperimentDuration",
    );
    assert_refused(patch(r#"{"maxExperimentDuration": -5}"#), 400, "positive");
    // Seconds as a number are capped as the config's are (this one saturated to u64::MAX and
    // overflowed the manager's deadline: the experiment crashed, and again on every resume).
    for huge in ["1e20", "1e300", "100000000000000000000"] {
        assert_refused(
            patch(&format!(r#"{{"maxExperimentDuration": {huge}}}"#)),
            400,
            "maxExperimentDuration: must be at most 100 years",
        );
    }
    assert_refused(patch(r#"{"searchSpace": 3}"#), 400, "searchSpace");
    assert_refused(
        patch(r#"{"searchSpace": {"x": {"_type": "bogus"}}}"#),
        400,
        "bogus",
    );
    assert_refused(
        patch(r#"{"trialCommand": "rm -rf /"}"#),
        400,
        "cannot update",
    );
    assert_refused(patch(r#"{"trialConcurrency": 2"#), 400, "malformed JSON");
    assert_refused(patch(""), 400, "JSON body");
    assert_refused(patch("{}"), 400, "nothing to update");
    assert_refused(patch("[1]"), 400, "JSON object");
    assert_refused(
        send(&base, "PUT", "/experiment/search-space", "[]"),
        400,
        "searchSpace",
    );
    assert_eq!(get(&base, "/experiment").1["config"]["trialConcurrency"], 2);

    // Add a trial with given parameters, kill it.
    let (status, added) = send(&base, "POST", "/trials", r#"{"parameters": {"x": 7}}"#);
    assert_eq!(status, 201, "{added}");
    let added_id = added["trial_id"].as_str().unwrap().to_string();
    wait_for("the added trial to run", || {
        get(&base, &format!("/trials/{added_id}")).1["status"] == "RUNNING"
    });
    assert_eq!(
        get(&base, &format!("/trials/{added_id}")).1["parameters"],
        json!({"x": 7})
    );
    let (status, _) = send(&base, "POST", &format!("/trials/{added_id}/kill"), "");
    assert_eq!(status, 200);
    wait_for("the killed trial to end", || {
        get(&base, &format!("/trials/{added_id}")).1["status"] == "USER_CANCELED"
    });
    assert_refused(
        send(&base, "POST", &format!("/trials/{added_id}/kill"), ""),
        409,
        "already ended",
    );
    assert_refused(
        send(&base, "POST", "/trials/nosuch/kill", ""),
        404,
        "no trial nosuch",
    );
    assert_refused(
        send(&base, "POST", "/trials", r#"{"parameters": {"x": "a"}}"#),
        400,
        "x",
    );
    assert_refused(
        send(&base, "POST", "/trials", r#"{"parameters": {"y": 1}}"#),
        400,
        "",
    );
    assert_refused(
        send(&base, "POST", "/trials", r#"{"x": 7}"#),
        400,
        "parameters",
    );
    assert_refused(get(&base, "/nosuch"), 404, "no such API route");
    // axum's own rejections, made before any handler runs, are JSON too (they were plain text).
    assert_refused(
        get(&base, "/trials/%FF"),
        400,
        "Invalid UTF-8 in `trial_id`",
    );
    assert_refused(
        get(&base, "/trials/x/logs/%FF"),
        400,
        "Invalid UTF-8 in `name`",
    );

    // The CLI goes through the API of a running experiment.
    let knob = |args: &[&str]| run(sandbox.knob().args(args));
    assert_eq!(knob(&["update", "concurrency", "live", "3"]).0, 0);
    // nnictl's spelling, `--value V`: it was "unexpected argument", and a lone `--value` was
    // sent as the value.
    assert_eq!(
        knob(&["update", "concurrency", "live", "--value", "3"]).0,
        0
    );
    let (code, _, stderr) = knob(&["update", "duration", "live", "--value"]);
    assert_eq!(
        (code, stderr.trim()),
        (1, "error: give one value after the experiment's id, as `knob update duration live 4` (nnictl's `--value 4` is taken too)")
    );
    // A value the API refuses is refused before it is sent, as the API words it.
    let (code, _, stderr) = knob(&["update", "concurrency", "live", "-1"]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            1,
            "error: trialConcurrency must be a positive integer, got -1\n"
        )
    );
    let (code, _, stderr) = knob(&["update", "trialnum", "live", "1"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("maxTrialNumber 1 is below the ")
            && stderr.contains(" trials already created; give at least "),
        "{stderr}"
    );
    assert_eq!(knob(&["update", "trialnum", "live", "600"]).0, 0);
    assert_eq!(knob(&["update", "duration", "live", "2h"]).0, 0);
    let space_file = sandbox.path().join("space.json");
    // A bad space is refused before it is sent, at its file, line and column.
    std::fs::write(
        &space_file,
        "{\n  \"x\": {\"_type\": \"randint\", \"_value\": [5, 1]}\n}",
    )
    .unwrap();
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["update", "searchspace", "live"])
        .arg(&space_file));
    assert_eq!(code, 1);
    assert!(
        stderr.contains(&format!(
            "{}:2:3: search space parameter \"x\": randint needs low < high",
            space_file.display()
        )),
        "{stderr}"
    );
    std::fs::write(
        &space_file,
        r#"{"x": {"_type": "randint", "_value": [0, 3000000]}}"#,
    )
    .unwrap();
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["update", "searchspace", "live"])
        .arg(&space_file));
    assert_eq!(code, 0, "{stderr}");
    let config = get(&base, "/experiment").1["config"].clone();
    assert_eq!(
        (
            &config["trialConcurrency"],
            &config["maxTrialNumber"],
            &config["maxExperimentDuration"],
            &config["searchSpace"]["x"]["_value"][1]
        ),
        (&json!(3), &json!(600), &json!(7200), &json!(3000000))
    );
    let (_, added) = send(&base, "POST", "/trials", r#"{"parameters": {"x": 7}}"#);
    let added_id = added["trial_id"].as_str().unwrap().to_string();
    let (code, _, stderr) = knob(&["trial", "kill", "live", &added_id]);
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = knob(&["top", "live", "--iterations", "2", "--interval", "0.1"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("knob top — experiment live · RUNNING"),
        "{stdout}"
    );
    assert!(stdout.contains("concurrency 3"), "{stdout}");
    let (code, _, stderr) = knob(&["experiment", "delete", "live", "--yes"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("is running"), "{stderr}");

    // Stop through the API: the process ends, the experiment is STOPPED.
    let (status, _) = send(&base, "POST", "/experiment/stop", "");
    assert_eq!(status, 202);
    let deadline = Instant::now() + Duration::from_secs(60);
    let exit = loop {
        if let Some(status) = experiment.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the experiment did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success());
    assert_eq!(sandbox.export("live")["experiment"]["status"], "STOPPED");
    let (code, _, stderr) = knob(&["update", "concurrency", "live", "2"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("experiment live is not running"),
        "{stderr}"
    );
    // The value first: "not running" said of `-1`, then resumed, the update was refused anyway.
    let (code, _, stderr) = knob(&["update", "concurrency", "live", "-1"]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            1,
            "error: trialConcurrency must be a positive integer, got -1\n"
        )
    );

    // `knob view`: the same reads, and every write is refused with 409.
    let mut command = sandbox.knob();
    command.args(["view", "live", "--port", "0"]);
    let view = start(command, &[]);
    let base = view.base.clone();
    let (status, summary) = get(&base, "/experiment");
    assert_eq!(
        (status, &summary["status"], &summary["writable"]),
        (200, &json!("STOPPED"), &json!(false))
    );
    assert_eq!(
        trials(&base, "")["trials"][0]["trial_id"],
        first_id.as_str()
    );
    assert_refused(
        patch_at(&base, r#"{"trialConcurrency": 2}"#),
        409,
        "experiment is not running",
    );
    assert_refused(
        send(&base, "POST", "/experiment/stop", ""),
        409,
        "experiment is not running",
    );
    assert_refused(
        send(&base, "POST", "/trials", r#"{"parameters": {"x": 7}}"#),
        409,
        "not running",
    );
    assert_refused(
        send(&base, "POST", &format!("/trials/{added_id}/kill"), ""),
        409,
        "already ended",
    );
    every_documented_route_is_served(&base);

    // Read-only, the environments are those the trials recorded; importance, asked twice of a
    // stopped experiment, is computed once.
    let (status, environments) = get(&base, "/environments");
    assert_eq!(status, 200, "{environments}");
    assert_eq!(environments["live"], false, "{environments}");
    assert!(
        environments["note"]
            .as_str()
            .unwrap()
            .contains("not running"),
        "{environments}"
    );
    assert_eq!(
        environments["environments"][0]["id"], "local",
        "{environments}"
    );
    assert_eq!(
        environments["environments"][0]["running"], 0,
        "{environments}"
    );
    let (_, once) = get(&base, "/importance");
    let (_, twice) = get(&base, "/importance");
    assert_eq!(twice["cached"], true, "{twice}");
    let without_flag = |mut answer: Value| {
        answer.as_object_mut().unwrap().remove("cached");
        answer
    };
    assert_eq!(without_flag(once), without_flag(twice));
    drop(view);

    let (code, stdout, _) = knob(&["top", "live"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("STOPPED (not running)"), "{stdout}");
    let dir = sandbox.path().join("experiments/live");
    assert!(dir.exists());
    let (code, stdout, stderr) = knob(&["experiment", "delete", "live", "--yes"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("experiment live deleted"), "{stdout}");
    assert!(!dir.exists());
    assert!(knob(&["experiment", "list"])
        .1
        .contains("no experiments yet"));
}

/// A search space over the 2 MiB other writes may hold (3.4 MB here) is taken, as a config's
/// `searchSpaceFile` would be; a body over a route's limit gets a JSON error naming the limit,
/// over real HTTP. (An experiment of its own: GETs of `every_documented_route_is_served`, which
/// carry a body, lose their answer when it is as large as such a space.)
#[test]
fn a_large_search_space_is_taken_and_a_body_over_the_limit_is_refused_in_json() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(CONFIG, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let experiment = start(command, &["--id", "large", "--port", "0"]);
    let values: Vec<u32> = (0..500_000).collect();
    let big = json!({
        "x": {"_type": "randint", "_value": [0, 1000000]},
        "c": {"_type": "choice", "_value": values},
    })
    .to_string();
    assert!(big.len() > 3_000_000, "{}", big.len());
    let space_file = sandbox.path().join("space.json");
    std::fs::write(&space_file, &big).unwrap();
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .args(["update", "searchspace", "large"])
        .arg(&space_file));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "experiment large: searchSpace updated\n");
    let (status, summary) = get(&experiment.base, "/experiment");
    assert_eq!(status, 200);
    let choices = &summary["config"]["searchSpace"]["c"]["_value"];
    assert_eq!(choices.as_array().map(Vec::len), Some(500_000));
    let (status, body) = send(
        &experiment.base,
        "POST",
        "/trials",
        &format!("{{\"parameters\": {big}}}"),
    );
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        body["error"],
        "the request body is over 2 MiB, the most POST /api/v1/trials takes"
    );
}

fn patch_at(base: &str, body: &str) -> (u16, Value) {
    send(base, "PATCH", "/experiment", body)
}

/// Every operation in the served OpenAPI file reaches a handler (no 405, no fallback 404).
fn every_documented_route_is_served(base: &str) {
    let (status, yaml) = get(base, "/openapi.yaml");
    assert_eq!(status, 200);
    let yaml = yaml.as_str().unwrap().to_string();
    let mut path = String::new();
    let mut checked = 0;
    for line in yaml.lines() {
        if let Some(p) = line.strip_prefix("  /").and_then(|p| p.strip_suffix(':')) {
            path = format!("/{p}");
            continue;
        }
        let Some(method) = line.strip_prefix("    ").and_then(|m| m.strip_suffix(':')) else {
            continue;
        };
        if !["get", "put", "post", "patch"].contains(&method) || path.is_empty() {
            continue;
        }
        if path.ends_with("/stream") {
            continue; // endless; checked above
        }
        let url = path
            .replace("{trial_id}", "nosuch")
            .replace("{name}", "stdout");
        let (status, body) = call(
            &method.to_uppercase(),
            &format!("{base}{url}"),
            Some("{}"),
            None,
        );
        assert_ne!(status, 405, "{method} {path}: {body}");
        assert!(
            !body.to_string().contains("no such API route"),
            "{method} {path} is documented but not routed"
        );
        checked += 1;
    }
    assert!(
        checked >= 13,
        "only {checked} operations found in openapi.yaml"
    );
}

#[test]
fn a_token_guards_the_api_and_a_public_address_needs_one() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(CONFIG, &[]);
    let (code, _, stderr) = run(sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "open", "--bind", "0.0.0.0"]));
    assert_eq!(code, 1);
    assert!(stderr.contains("without a token"), "{stderr}");
    assert!(run(sandbox.knob().args(["experiment", "list"]))
        .1
        .contains("no experiments yet"));

    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let experiment = start(
        command,
        &[
            "--id", "guarded", "--bind", "0.0.0.0", "--port", "0", "--token", "s3cret",
        ],
    );
    let url = format!("{}/api/v1/experiment", experiment.base);
    assert_refused(call("GET", &url, None, None), 401, "token");
    assert_refused(call("GET", &url, None, Some("wrong")), 401, "token");
    let (status, body) = call("GET", &url, None, Some("s3cret"));
    assert_eq!((status, &body["id"]), (200, &json!("guarded")));
    // The dashboard's static files hold no data.
    assert_eq!(
        call("GET", &format!("{}/", experiment.base), None, None).0,
        200
    );
    // The CLI dials loopback for an API on every address, with the token from the environment.
    let (code, _, stderr) = run(sandbox.knob().env("KNOB_API_TOKEN", "s3cret").args([
        "update",
        "concurrency",
        "guarded",
        "3",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let (status, _) = call(
        "POST",
        &format!("{}/api/v1/experiment/stop", experiment.base),
        None,
        Some("s3cret"),
    );
    assert_eq!(status, 202);
}

#[test]
fn the_cli_reaches_an_api_bound_to_another_loopback_address() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(CONFIG, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let experiment = start(
        command,
        &["--id", "elsewhere", "--bind", "127.0.0.2", "--port", "0"],
    );
    assert!(experiment.base.contains("127.0.0.2"), "{}", experiment.base);
    // The CLI dials the address the API is bound to (it dialled 127.0.0.1 alone: refused).
    let knob = |args: &[&str]| run(sandbox.knob().args(args));
    let (code, _, stderr) = knob(&["update", "concurrency", "elsewhere", "3"]);
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = knob(&["top", "elsewhere", "--iterations", "1"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("experiment elsewhere"), "{stdout}");
    // `knob view`'s list links to its own dashboard at that address, not at the list's host.
    let mut command = sandbox.knob();
    command.args(["view", "--port", "0"]);
    let view = start(command, &[]);
    let listed = call(
        "GET",
        &format!("{}/api/v1/experiments", view.base),
        None,
        None,
    )
    .1;
    let entry = &listed["experiments"][0];
    assert_eq!(
        (&entry["id"], &entry["host"]),
        (&json!("elsewhere"), &json!("127.0.0.2")),
        "{listed}"
    );
    drop(view);
    let (code, _, stderr) = knob(&["stop", "elsewhere"]);
    assert_eq!(code, 0, "{stderr}");
}

/// `knob view` without an ID serves each experiment's API under `/e/ID/`, the routes with a
/// trial in their path too: they answered 500 there (the list's own `{id}` and `{*rest}` reached
/// the experiment's `Path` extractors), so a trial opened from the list showed nothing.
#[test]
fn the_experiment_list_serves_each_experiments_trial_routes() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &CONFIG.replace("maxTrialNumber: 1000", "maxTrialNumber: 2"),
        &[],
    );
    let (code, stdout, stderr) = sandbox.create(&config, "listed");
    assert_eq!(code, 0, "{stdout}{stderr}");
    let mut command = sandbox.knob();
    command.args(["view", "--port", "0"]);
    let view = start(command, &[]);
    let base = format!("{}/e/listed", view.base);
    let (status, trials) = get(&base, "/trials");
    assert_eq!(status, 200, "{trials}");
    let id = trials["trials"][0]["trial_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, trial) = get(&base, &format!("/trials/{id}"));
    assert_eq!((status, &trial["trial_id"]), (200, &json!(id)), "{trial}");
    let (status, metrics) = get(&base, &format!("/trials/{id}/metrics"));
    assert_eq!(status, 200, "{metrics}");
    let (status, stdout) = get(&base, &format!("/trials/{id}/logs/stdout"));
    assert_eq!(status, 200, "{stdout}");
    assert!(stdout.as_str().unwrap().contains("KNOB_FINAL"), "{stdout}");
    assert_refused(get(&base, "/trials/nosuch"), 404, "no trial nosuch");
    // The id percent-encoded is the same experiment: its API paths were answered with the
    // dashboard's page (the prefix was cut by the decoded id).
    let (status, encoded) = get(&format!("{}/e/%6Cisted", view.base), "/trials");
    assert_eq!((status, &encoded), (200, &trials));
    // `/e/ID` is sent on to the dashboard, `/e/ID/`, as written: a decoded id with a control
    // character made the redirect a 500 (no header value), and an unknown one is then a 404.
    let page = |path: &str| call("GET", &format!("{}{path}", view.base), None, None);
    let (status, dashboard) = page("/e/%6Cisted");
    assert_eq!(status, 200, "{dashboard}");
    assert!(dashboard
        .as_str()
        .is_some_and(|html| html.contains("<title>")));
    assert_refused(page("/e/a%0Ab"), 404, "no experiment a b in the registry");
}

/// Opens `GET /api/v1/stream?since=SINCE` of `base` (a `http://127.0.0.1:PORT...` URL) on a
/// connection of its own, asking the server to close it when the response ends.
fn open_stream(base: &str, since: u64) -> std::net::TcpStream {
    use std::io::Write;
    let rest = base.strip_prefix("http://").unwrap();
    let (address, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET {prefix}/api/v1/stream?since={since} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    stream
}

/// `knob experiment delete` of an experiment that `knob view ID` and the list's `/e/ID/` serve
/// goes ahead (a view holds no lock: it must not stop a delete, nor a `knob resume`), and both
/// then answer 410 naming the experiment as deleted: they answered 200 with the deleted store's
/// data from the connections still open on it, or 500 "cannot open the experiment store". A
/// live stream says so and ends; an experiment of the same id made again is served anew by the
/// list.
#[test]
fn an_experiment_deleted_under_knob_view_is_answered_410_as_deleted() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &CONFIG.replace("maxTrialNumber: 1000", "maxTrialNumber: 2"),
        &[],
    );
    let (code, stdout, stderr) = sandbox.create(&config, "doomed");
    assert_eq!(code, 0, "{stdout}{stderr}");
    let mut command = sandbox.knob();
    command.args(["view", "doomed", "--port", "0"]);
    let view = start(command, &[]);
    let mut command = sandbox.knob();
    command.args(["view", "--port", "0"]);
    let list = start(command, &[]);
    let bases = [view.base.clone(), format!("{}/e/doomed", list.base)];
    let mut streams = Vec::new();
    for base in &bases {
        let (status, summary) = get(base, "/experiment");
        assert_eq!(
            (status, &summary["id"]),
            (200, &json!("doomed")),
            "{summary}"
        );
        assert_eq!(trials(base, "")["total"], 2);
        streams.push(open_stream(base, summary["last_seq"].as_u64().unwrap()));
    }

    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "delete", "doomed", "--yes"]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("experiment doomed deleted"), "{stdout}");
    let deleted = "experiment doomed was deleted while this server showed it";
    for base in &bases {
        for path in [
            "/experiment",
            "/trials",
            "/trial-columns",
            "/export",
            "/stream",
        ] {
            assert_refused(get(base, path), 410, deleted);
        }
    }
    for mut stream in streams {
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .expect("the stream did not end within 30 s");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("event: error"), "{answer}");
        assert!(answer.contains(deleted), "{answer}");
    }

    // Made again: the list serves the new one; `knob view doomed` showed the one deleted.
    let (code, stdout, stderr) = sandbox.create(
        &sandbox.config(
            &CONFIG.replace("maxTrialNumber: 1000", "maxTrialNumber: 1"),
            &[],
        ),
        "doomed",
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let base = &bases[1];
    wait_for("the list to serve the new experiment", || {
        get(base, "/trials").0 == 200
    });
    assert_eq!(trials(base, "")["total"], 1);
    assert_refused(get(&bases[0], "/trials"), 410, deleted);
}

/// With a token, a client without it learns nothing from `/e/ID/` of `knob view`'s list: an id
/// the registry lacks is answered as one it has (401 on the API, the dashboard's page), not
/// with a 404 naming the registry's file.
#[test]
fn without_the_token_the_experiment_list_does_not_tell_which_ids_exist() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &CONFIG.replace("maxTrialNumber: 1000", "maxTrialNumber: 1"),
        &[],
    );
    let (code, stdout, stderr) = sandbox.create(&config, "known");
    assert_eq!(code, 0, "{stdout}{stderr}");
    let mut command = sandbox.knob();
    command.args(["view", "--port", "0", "--token", "s3cret"]);
    let view = start(command, &[]);
    let answer = |id: &str, path: &str, token: Option<&str>| {
        call("GET", &format!("{}/e/{id}{path}", view.base), None, token)
    };
    for path in ["/api/v1/experiment", "/api/v1/trials/x"] {
        let known = answer("known", path, None);
        let unknown = answer("unknown", path, None);
        assert_eq!(known.0, 401, "{known:?}");
        assert_eq!(known, unknown, "{path}");
    }
    let page = |id: &str| {
        let (status, body) = answer(id, "/", None);
        (status, body.as_str().map(str::len))
    };
    assert_eq!(page("unknown"), page("known"));
    assert_eq!(page("known").0, 200);
    // With the token, an unknown id is named as unknown.
    let (status, body) = answer("unknown", "/api/v1/experiment", Some("s3cret"));
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("no experiment unknown"),
        "{body}"
    );
    let (status, body) = answer("known", "/api/v1/experiment", Some("s3cret"));
    assert_eq!((status, &body["id"]), (200, &json!("known")), "{body}");
}

/// Trials that run until stopped, two at most: the tuner's first takes one of the two.
const LONG_TRIALS: &str = r#"trialCommand: sleep 60
trialConcurrency: 1
maxTrialNumber: 2
searchSpace:
  x: {_type: randint, _value: [0, 1000000]}
tuner:
  name: Random
  classArgs: {seed: 3}
trainingService:
  platform: local"#;

/// Stops a running experiment through its API and waits for its process to end.
fn stop_and_wait(experiment: &mut Experiment) {
    let (status, body) = send(&experiment.base, "POST", "/experiment/stop", "");
    assert_eq!(status, 202, "{body}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while experiment.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the experiment did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A trial added through the API counts against `maxTrialNumber` as the tuner's do: once the
/// trials created reach it, an added one is refused with 409 naming the budget and how to
/// raise it (every one was taken and run: "trial budget 41 / 6"); raised, one is taken again.
#[test]
fn an_added_trial_is_refused_once_max_trial_number_is_reached() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(LONG_TRIALS, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let mut experiment = start(command, &["--id", "budget", "--port", "0"]);
    let base = experiment.base.clone();
    wait_for("the tuner's trial", || {
        trials(&base, "")["total"].as_u64() == Some(1)
    });
    let add = || send(&base, "POST", "/trials", r#"{"parameters": {"x": 5}}"#);
    let (status, added) = add();
    assert_eq!(status, 201, "{added}");
    assert_refused(add(), 409, "maxTrialNumber is 2 and 2 trials were created");
    assert_refused(add(), 409, "`knob update trialnum budget 3`");
    assert_eq!(trials(&base, "")["total"], 2);

    let (code, _, stderr) = run(sandbox.knob().args(["update", "trialnum", "budget", "3"]));
    assert_eq!(code, 0, "{stderr}");
    let (status, added) = add();
    assert_eq!(status, 201, "{added}");
    assert_refused(add(), 409, "maxTrialNumber is 3 and 3 trials were created");
    assert_eq!(trials(&base, "")["total"], 3);
    stop_and_wait(&mut experiment);
}

/// A read-only server of an experiment another process runs (`knob view ID`, and the list's
/// `/e/ID/`) refuses writes saying it is read-only and where the experiment's own API is; it said
/// "experiment is not running" while its `GET /experiment` said RUNNING.
#[test]
fn a_read_only_server_of_a_running_experiment_names_the_experiments_own_api() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(LONG_TRIALS, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let mut experiment = start(command, &["--id", "busy", "--port", "0"]);
    let own_api = format!(
        "is running and serves its own API and dashboard at {}/",
        experiment.base
    );
    let mut command = sandbox.knob();
    command.args(["view", "busy", "--port", "0"]);
    let view = start(command, &[]);
    let mut command = sandbox.knob();
    command.args(["view", "--port", "0"]);
    let list = start(command, &[]);
    for base in [view.base.clone(), format!("{}/e/busy", list.base)] {
        let (status, summary) = get(&base, "/experiment");
        assert_eq!(
            (status, &summary["status"], &summary["writable"]),
            (200, &json!("RUNNING"), &json!(false))
        );
        for refused in [
            patch_at(&base, r#"{"trialConcurrency": 2}"#),
            send(&base, "POST", "/experiment/stop", ""),
            send(&base, "POST", "/trials", r#"{"parameters": {"x": 5}}"#),
        ] {
            assert_refused(refused.clone(), 409, "this server is read-only");
            assert_refused(refused, 409, &own_api);
        }
    }
    stop_and_wait(&mut experiment);
    // Stopped, it is not running, as before.
    assert_refused(
        patch_at(&view.base, r#"{"trialConcurrency": 2}"#),
        409,
        "experiment is not running",
    );
}

/// What an empty search space sent to a running experiment gets, whatever its tuner.
const EMPTY_SPACE_REFUSED: &str = "the search space is empty ({}): it would leave the tuner nothing to search and end the experiment; give at least one parameter; the experiment goes on with the search space it had";

/// An empty search space sent to a running experiment is refused for every tuner: Random and
/// TPE took it (200), had nothing left to try and ended the experiment DONE at once.
#[test]
fn an_empty_search_space_is_refused_and_the_experiment_goes_on() {
    let sandbox = Sandbox::new();
    let yaml = CONFIG.replace(
        "name: Random\n  classArgs: {seed: 3}",
        "name: TPE\n  classArgs: {optimize_mode: maximize}",
    );
    assert!(yaml.contains("name: TPE"), "{yaml}");
    let config = sandbox.config(&yaml, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let experiment = start(command, &["--id", "empty", "--port", "0"]);
    let base = experiment.base.clone();
    wait_for("a finished trial", || {
        trials(&base, "?status=SUCCEEDED")["total"].as_u64() >= Some(1)
    });
    let space = get(&base, "/experiment").1["config"]["searchSpace"].clone();
    assert_refused(
        send(&base, "PUT", "/experiment/search-space", "{}"),
        400,
        EMPTY_SPACE_REFUSED,
    );
    assert_refused(
        send(&base, "PATCH", "/experiment", r#"{"searchSpace": {}}"#),
        400,
        EMPTY_SPACE_REFUSED,
    );
    let empty = sandbox.path().join("empty.yml");
    std::fs::write(&empty, "{}\n").unwrap();
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["update", "searchspace", "empty"])
        .arg(&empty));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("{EMPTY_SPACE_REFUSED} (HTTP 400)")),
        "{stderr}"
    );
    // Still running, on the space it had, and still making trials.
    let done = trials(&base, "")["total"].as_u64().unwrap();
    wait_for("a later trial", || {
        trials(&base, "")["total"].as_u64().unwrap() > done + 1
    });
    let summary = get(&base, "/experiment").1;
    assert_eq!(
        (&summary["status"], &summary["config"]["searchSpace"]),
        (&json!("RUNNING"), &space)
    );
    let (code, _, stderr) = run(sandbox.knob().args(["stop", "empty"]));
    assert_eq!(code, 0, "{stderr}");
}

/// A search space the tuner refuses (GridSearch is given none) is refused with the tuner's
/// reason, on one line, and nothing changes: the experiment runs on with the space it had, its
/// trial too. Stored before the tuner was asked (as an earlier knob did), such a space ended the
/// experiment and every resume; a resume of such a store says to give `--search-space`, which
/// resumes it.
#[test]
fn a_search_space_the_tuner_refuses_is_refused_and_the_experiment_goes_on() {
    let sandbox = Sandbox::new();
    let hold = sandbox.path().join("hold");
    std::fs::write(&hold, "").unwrap();
    let yaml = format!(
        "trialCommand: 'if [ -e {} ]; then sleep 60; fi; echo KNOB_FINAL 1'\ntrialConcurrency: 1\nmaxTrialNumber: 3\nsearchSpace:\n  x: {{_type: choice, _value: [1, 2, 3]}}\ntuner:\n  name: GridSearch\ntrainingService:\n  platform: local",
        hold.display()
    );
    let config = sandbox.config(&yaml, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let experiment = start(command, &["--id", "grid", "--port", "0"]);
    let base = experiment.base.clone();
    wait_for("a running trial", || {
        trials(&base, "?status=RUNNING")["total"] == 1
    });
    let space = get(&base, "/experiment").1["config"]["searchSpace"].clone();
    assert_refused(
        send(&base, "PUT", "/experiment/search-space", "{}"),
        400,
        EMPTY_SPACE_REFUSED,
    );
    let empty = sandbox.path().join("empty.json");
    std::fs::write(&empty, "{}").unwrap();
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["update", "searchspace", "grid"])
        .arg(&empty));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("{EMPTY_SPACE_REFUSED} (HTTP 400)")),
        "{stderr}"
    );
    let summary = get(&base, "/experiment").1;
    assert_eq!(
        (&summary["status"], &summary["config"]["searchSpace"]),
        (&json!("RUNNING"), &space)
    );
    assert_eq!(trials(&base, "?status=RUNNING")["total"], 1);
    let (code, _, stderr) = run(sandbox.knob().args(["stop", "grid"]));
    assert_eq!(code, 0, "{stderr}");
    drop(experiment);
    let store =
        knob_core::store::Store::open_existing(&sandbox.path().join("experiments/grid")).unwrap();
    let state = store.replay().unwrap();
    assert_eq!(
        (state.config_updates.len(), &state.config["searchSpace"]),
        (0, &space)
    );

    // What an earlier knob stored: the refused space, recorded as applied.
    store
        .append(knob_core::store::StoreEvent::ConfigUpdated {
            field: "searchSpace".into(),
            value: json!({}),
        })
        .wait()
        .unwrap();
    store.close().unwrap();
    let (code, _, stderr) = run(sandbox.knob().args(["resume", "grid", "--port", "0"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("the search space is empty; give it at least one parameter to search over; this search space came from an update the tuner refused; resume with a space it takes: `knob resume grid --search-space FILE`"),
        "{stderr}"
    );
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["resume", "grid", "--port", "0", "--search-space"])
        .arg(&empty));
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!("error: {}: the search space is empty ({{}}): it would leave the tuner nothing to search and end the experiment; give at least one parameter", empty.display())
    );
    // A file that is not there is named with the option that gave it.
    let missing = sandbox.path().join("missing.json");
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["resume", "grid", "--port", "0", "--search-space"])
        .arg(&missing));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: --search-space: cannot read {}: ",
            missing.display()
        )),
        "{stderr}"
    );
    std::fs::remove_file(&hold).unwrap();
    let space_file = sandbox.path().join("space.json");
    std::fs::write(
        &space_file,
        r#"{"x": {"_type": "choice", "_value": [4, 5, 6]}}"#,
    )
    .unwrap();
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .args(["resume", "grid", "--port", "0", "--search-space"])
        .arg(&space_file));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("grid");
    assert_eq!(
        (
            &export["experiment"]["status"],
            &export["experiment"]["config"]["searchSpace"]["x"]["_value"]
        ),
        (&json!("DONE"), &json!([4, 5, 6]))
    );
}
