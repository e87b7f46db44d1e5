//! What a web page in the user's browser could do to the loopback API, tried over real HTTP on
//! 127.0.0.1 against a real `knob create`: requests with a foreign `Host` (DNS rebinding),
//! writes as a form or `text/plain` (no CORS preflight) or from another `Origin`, the token's
//! `Bearer` scheme in any case, a blank `--token`. Requests are written by hand on a socket, so
//! every header is exactly what a browser could send.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use crate::api::{start, Experiment};
use crate::create::Sandbox;
use crate::run;

/// Every trial sleeps, so the experiment keeps running while the test sends its requests.
const SLEEPING: &str = r#"trialCommand: 'sleep 60'
trialConcurrency: 1
maxTrialNumber: 1000
searchSpace:
  x: {_type: randint, _value: [0, 1000]}
tuner:
  name: Random
trainingService:
  platform: local"#;

/// One trial that ends at once.
const QUICK: &str = r#"trialCommand: 'echo KNOB_FINAL 1'
trialConcurrency: 1
maxTrialNumber: 1
searchSpace:
  x: {_type: randint, _value: [0, 1000]}
tuner:
  name: Random
trainingService:
  platform: local"#;

/// A raw HTTP/1.1 exchange: `method path` with `headers` (Host among them when the caller
/// wants one) and `body`; the status and the body (JSON, or a string when not JSON).
fn raw(base: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
    let address = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, value)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// A refusal: `code` and a one-line `{"error"}` containing `needle`.
#[track_caller]
fn assert_refused((status, body): (u16, Value), code: u16, needle: &str) {
    assert_eq!(status, code, "{body}");
    let message = body["error"].as_str().unwrap_or_else(|| panic!("{body}"));
    assert!(!message.contains('\n'), "{message}");
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
}

fn trial_count(base: &str, host: &str) -> usize {
    let (status, trials) = raw(base, "GET", "/api/v1/trials", &[("Host", host)], "");
    assert_eq!(status, 200, "{trials}");
    trials["total"]
        .as_u64()
        .unwrap_or_else(|| panic!("{trials}")) as usize
}

#[test]
fn foreign_hosts_cross_site_writes_and_non_json_writes_are_refused() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(SLEEPING, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let experiment = start(
        command,
        &[
            "--id",
            "guarded",
            "--port",
            "0",
            "--allow-host",
            "knob.lab",
            "--allow-host",
            "10.0.0.5",
        ],
    );
    let base = experiment.base.clone();
    let own = base.trim_start_matches("http://").to_string();
    let port = own.rsplit_once(':').unwrap().1.to_string();

    // DNS rebinding: a page on evil.example that resolves to 127.0.0.1 sends its own name.
    for path in ["/api/v1/experiment", "/api/v1/trials", "/"] {
        for host in [
            "evil.example",
            &format!("evil.example:{port}"),
            "10.0.0.6:9000",
        ] {
            assert_refused(
                raw(&base, "GET", path, &[("Host", host)], ""),
                403,
                "--allow-host",
            );
        }
    }
    for host in [
        own.clone(),
        format!("localhost:{port}"),
        "localhost".to_string(),
        format!("knob.lab:{port}"),
        // Where a port forward listens (`ssh -L 10.0.0.5:9000:localhost:PORT`): the page's
        // origin, and so its Host, is the forward's address.
        "10.0.0.5:9000".to_string(),
    ] {
        let (status, body) = raw(&base, "GET", "/api/v1/experiment", &[("Host", &host)], "");
        assert_eq!(
            (status, &body["id"]),
            (200, &Value::from("guarded")),
            "{host}"
        );
    }

    // Writes a page can send without a CORS preflight: a form, text/plain, no type at all.
    let before = trial_count(&base, &own);
    let trial = r#"{"parameters": {"x": 5}}"#;
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let mut headers = vec![("Host", own.as_str())];
        headers.extend(content_type.map(|t| ("Content-Type", t)));
        assert_refused(
            raw(&base, "POST", "/api/v1/trials", &headers, trial),
            415,
            "application/json",
        );
        assert_refused(
            raw(&base, "POST", "/api/v1/experiment/stop", &headers, ""),
            415,
            "application/json",
        );
        assert_refused(
            raw(
                &base,
                "PATCH",
                "/api/v1/experiment",
                &headers,
                r#"{"trialConcurrency": 2}"#,
            ),
            415,
            "application/json",
        );
    }
    // JSON with another site's Origin (a preflight would have failed, but say so plainly).
    let json = [("Host", own.as_str()), ("Content-Type", "application/json")];
    for origin in [
        "http://evil.example",
        "null",
        &format!("http://localhost.evil.example:{port}"),
    ] {
        let mut headers = json.to_vec();
        headers.push(("Origin", origin));
        assert_refused(
            raw(&base, "POST", "/api/v1/trials", &headers, trial),
            403,
            "Origin",
        );
        assert_refused(
            raw(&base, "POST", "/api/v1/experiment/stop", &headers, ""),
            403,
            "Origin",
        );
    }
    assert_eq!(
        trial_count(&base, &own),
        before,
        "a refused write added a trial"
    );
    let (status, summary) = raw(&base, "GET", "/api/v1/experiment", &[("Host", &own)], "");
    assert_eq!(
        (status, &summary["status"]),
        (200, &Value::from("RUNNING")),
        "{summary}"
    );

    // The dashboard's own writes: JSON, from its own origin (or from a client that sends none).
    let dashboard = format!("http://{own}");
    let mut headers = json.to_vec();
    headers.push(("Origin", &dashboard));
    let (status, added) = raw(&base, "POST", "/api/v1/trials", &headers, trial);
    assert_eq!(status, 201, "{added}");
    let (status, added) = raw(&base, "POST", "/api/v1/trials", &json, trial);
    assert_eq!(status, 201, "{added}");
    assert_eq!(trial_count(&base, &own), before + 2);
    let (status, stopped) = raw(&base, "POST", "/api/v1/experiment/stop", &headers, "");
    assert_eq!(status, 202, "{stopped}");
}

#[test]
fn the_bearer_scheme_is_case_insensitive_and_the_api_description_is_public() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(SLEEPING, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let experiment = start(
        command,
        &["--id", "tokened", "--port", "0", "--token", "s3cret"],
    );
    let base = experiment.base.clone();
    let own = base.trim_start_matches("http://").to_string();
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let authorization = format!("{scheme} s3cret");
        let headers = [("Host", own.as_str()), ("Authorization", &authorization)];
        let (status, body) = raw(&base, "GET", "/api/v1/experiment", &headers, "");
        assert_eq!(
            (status, &body["id"]),
            (200, &Value::from("tokened")),
            "{scheme}"
        );
    }
    let headers = [("Host", own.as_str()), ("Authorization", "Basic s3cret")];
    assert_refused(
        raw(&base, "GET", "/api/v1/experiment", &headers, ""),
        401,
        "Bearer",
    );
    assert_refused(
        raw(&base, "GET", "/api/v1/trials", &[("Host", &own)], ""),
        401,
        "Bearer",
    );
    // openapi.yaml says `security: []` for itself.
    let (status, yaml) = raw(&base, "GET", "/api/v1/openapi.yaml", &[("Host", &own)], "");
    assert_eq!(status, 200, "{yaml}");
    assert!(yaml.as_str().unwrap().contains("openapi: 3"), "{yaml}");
}

#[test]
fn a_method_a_route_does_not_serve_is_answered_with_what_it_does() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(SLEEPING, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let experiment = start(command, &["--id", "methods", "--port", "0"]);
    for (method, path, allowed) in [
        ("DELETE", "/api/v1/experiment", "GET,HEAD,PATCH,PUT"),
        ("DELETE", "/api/v1/trials/0", "GET,HEAD"),
        ("GET", "/api/v1/experiment/stop", "POST"),
        ("POST", "/", "GET,HEAD"),
    ] {
        assert_not_allowed(&experiment.base, method, path, path, allowed);
    }

    // knob view's list answers as an experiment's own server does: its 405s say what is
    // allowed (an experiment's under /e/ID/ what the experiment's router allows), a path it
    // does not serve and a malformed one get a JSON error; they were empty or plain text.
    let mut command = sandbox.knob();
    command.args(["view", "--port", "0"]);
    let list = start(command, &[]);
    for (method, path, shown, allowed) in [
        (
            "POST",
            "/api/v1/experiments",
            "/api/v1/experiments",
            "GET,HEAD",
        ),
        ("DELETE", "/e/methods", "/e/methods", "GET,HEAD"),
        ("POST", "/", "/", "GET,HEAD"),
        (
            "DELETE",
            "/e/methods/api/v1/trials/0",
            "/api/v1/trials/0",
            "GET,HEAD",
        ),
    ] {
        assert_not_allowed(&list.base, method, path, shown, allowed);
    }
    let own = list.base.trim_start_matches("http://").to_string();
    let host = [("Host", own.as_str())];
    for path in ["/e/", "/nothing"] {
        assert_refused(raw(&list.base, "GET", path, &host, ""), 404, "/e/ID/");
    }
    assert_refused(
        raw(&list.base, "GET", "/e/%ff/", &host, ""),
        400,
        "Invalid UTF-8",
    );
}

/// `method path` on `base` is a JSON 405 that names `shown` and lists `allowed`, as `Allow`
/// does.
#[track_caller]
fn assert_not_allowed(base: &str, method: &str, path: &str, shown: &str, allowed: &str) {
    let own = base.trim_start_matches("http://").to_string();
    let json = [("Host", own.as_str()), ("Content-Type", "application/json")];
    let (status, body) = raw(base, method, path, &json, "");
    assert_eq!(status, 405, "{method} {path}: {body}");
    let message = body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{method} {path}: {body:?}"));
    let listed: String = message
        .split("allowed: ")
        .nth(1)
        .unwrap_or("")
        .replace(' ', "");
    let mut listed: Vec<&str> = listed.split(',').collect();
    listed.sort();
    assert_eq!(listed.join(","), allowed, "{method} {path}: {message}");
    assert!(
        message.starts_with(&format!("{method} is not allowed on {shown}")),
        "{message}"
    );
}

/// A token given as `--token` is in the command line, which every user of the machine can
/// read while knob runs: knob says so and what to do; the same token from the environment, or
/// handed by `--detach` to its background `knob` there, is not.
#[test]
fn a_token_on_the_command_line_is_warned_of() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(QUICK, &[]);
    let warning = "warning: --token shows the token to every user of this machine";
    let (code, _, stderr) = run(sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--port", "0", "--token", "s3cret"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(warning) && stderr.contains("export KNOB_API_TOKEN instead"),
        "{stderr}"
    );
    let (code, _, stderr) = run(sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .env("KNOB_API_TOKEN", "s3cret")
        .args(["--port", "0"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains(warning), "{stderr}");
}

/// A blank token, and one no request can send back (every request would get 401, `knob stop`
/// included), are refused before anything is made, without the token in the message.
#[test]
fn a_blank_or_unsendable_token_is_refused_in_one_line() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(QUICK, &[]);
    for token in ["", "   "] {
        let (code, _, stderr) = run(sandbox
            .knob()
            .arg("create")
            .arg("--config")
            .arg(&config)
            .args(["--port", "0", "--token", token]));
        assert_eq!(code, 1, "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("--token is blank"), "{stderr}");
    }
    for (token, problem) in [
        (" s3cret ", "begins or ends with a space"),
        ("s3cret\n", "begins or ends with a space"),
        ("s3\x01cret", "holds a control character"),
        ("s3crét", "holds a character beyond ASCII"),
    ] {
        for from_env in [false, true] {
            let mut command = sandbox.knob();
            command.arg("create").arg("--config").arg(&config);
            command.args(["--port", "0"]);
            let source = if from_env {
                command.env("KNOB_API_TOKEN", token);
                "$KNOB_API_TOKEN"
            } else {
                command.args(["--token", token]);
                "--token"
            };
            let (code, _, stderr) = run(&mut command);
            assert_eq!(code, 1, "{stderr}");
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(
                stderr.contains(&format!("{source} {problem}")) && !stderr.contains("s3"),
                "{stderr}"
            );
        }
    }
    assert!(run(sandbox.knob().args(["experiment", "list"]))
        .1
        .contains("no experiments yet"));
    let (code, _, stderr) = run(sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .env("KNOB_API_TOKEN", " ")
        .args(["--port", "0"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("KNOB_API_TOKEN is blank"), "{stderr}");
    let (code, _, stderr) = run(sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--port", "0", "--allow-host", "http://knob.lab:80"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("--allow-host"), "{stderr}");
}

#[test]
fn a_detached_experiment_keeps_its_token() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(SLEEPING, &[]);
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--detach", "--id", "bg", "--port", "0", "--token", "s3cret"]));
    assert_eq!(code, 0, "{stderr}");
    let _background = crate::Background::from_output(&stdout);
    let log = sandbox.path().join("home/logs/bg.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let base = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(url) = text
            .lines()
            .find_map(|line| line.split_whitespace().find(|w| w.starts_with("http://")))
        {
            break url.trim_end_matches('/').to_string();
        }
        assert!(std::time::Instant::now() < deadline, "no URL in {text:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let own = base.trim_start_matches("http://").to_string();
    assert_refused(
        raw(&base, "GET", "/api/v1/experiment", &[("Host", &own)], ""),
        401,
        "token",
    );
    let headers = [("Host", own.as_str()), ("Authorization", "Bearer s3cret")];
    let (status, body) = raw(&base, "GET", "/api/v1/experiment", &headers, "");
    assert_eq!((status, &body["id"]), (200, &Value::from("bg")), "{body}");
    let (code, _, stderr) = run(sandbox
        .knob()
        .env("KNOB_API_TOKEN", "s3cret")
        .args(["stop", "bg"]));
    assert_eq!(code, 0, "{stderr}");
}

/// `knob update`, `knob trial kill` and `knob top` read the token from `$KNOB_API_TOKEN`; a 401
/// says to set it (unset) or that it is wrong (set), not which header to send.
#[test]
fn the_commands_that_use_the_api_say_to_set_knob_api_token() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(SLEEPING, &[]);
    let mut command = sandbox.knob();
    command
        .env_remove("KNOB_API_TOKEN")
        .arg("create")
        .arg("--config")
        .arg(&config);
    let _experiment = start(
        command,
        &["--id", "guarded", "--port", "0", "--token", "s3cret"],
    );
    let knob = |token: Option<&str>, args: &[&str]| {
        let mut command = sandbox.knob();
        command.env_remove("KNOB_API_TOKEN");
        if let Some(token) = token {
            command.env("KNOB_API_TOKEN", token);
        }
        run(command.args(args))
    };
    let commands: [&[&str]; 3] = [
        &["update", "concurrency", "guarded", "2"],
        &["trial", "kill", "guarded", "x"],
        &["top", "guarded", "--iterations", "1"],
    ];
    for args in commands {
        let (code, _, stderr) = knob(None, args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end(),
            "error: experiment guarded needs its API token: set $KNOB_API_TOKEN to the token it was started with (--token) (HTTP 401)",
            "{args:?}"
        );
        let (code, _, stderr) = knob(Some("wrong"), args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end(),
            "error: $KNOB_API_TOKEN is set, but not to experiment guarded's API token: set it to the token the experiment was started with (HTTP 401)",
            "{args:?}"
        );
    }
    let (code, stdout, stderr) = knob(Some("s3cret"), &["update", "concurrency", "guarded", "2"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("trialConcurrency updated"), "{stdout}");
    // A trial id is one path segment, whatever it holds.
    for trial in ["../x", ".."] {
        let (code, _, stderr) = knob(Some("s3cret"), &["trial", "kill", "guarded", trial]);
        assert_eq!(code, 1, "{stderr}");
        assert_eq!(
            stderr.trim_end(),
            format!("error: no trial {trial} in experiment guarded (HTTP 404)")
        );
    }
}

/// The header block of a raw `GET path`, lowercased.
fn head_of(base: &str, path: &str) -> String {
    let address = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    answer.split("\r\n\r\n").next().unwrap().to_string()
}

/// A finished experiment `id` of one trial, served by `knob view id`, and the list of
/// `knob view`: both of knob's read-only servers.
fn one_view_and_the_list(sandbox: &Sandbox, id: &str) -> (Experiment, Experiment) {
    let config = sandbox.config(QUICK, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, id);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let mut one = sandbox.knob();
    one.args(["view", id, "--port", "0"]);
    let mut list = sandbox.knob();
    list.args(["view", "--port", "0"]);
    (start(one, &[]), start(list, &[]))
}

/// A hostile page could load the dashboard (same-origin with the API, so past every check) in
/// an invisible frame and have the user click its Stop or Kill: no page of either server may
/// be framed.
#[test]
fn no_page_may_be_put_in_another_sites_frame() {
    let sandbox = Sandbox::new();
    let (one, list) = one_view_and_the_list(&sandbox, "framed");
    for (base, path) in [
        (&one.base, "/"),
        (&one.base, "/api/v1/experiment"),
        (&one.base, "/nosuch"),
        (&list.base, "/"),
        (&list.base, "/e/framed/"),
        (&list.base, "/api/v1/experiments"),
    ] {
        let head = head_of(base, path);
        assert!(head.contains("\r\nx-frame-options: deny"), "{path}: {head}");
        assert!(
            head.contains("\r\ncontent-security-policy: frame-ancestors 'none'"),
            "{path}: {head}"
        );
    }
}

/// A client that sends half a request's head and then nothing (a slowloris) is cut off once
/// hyper's header timeout passes, and others are answered meanwhile. Each such connection was
/// held for ever (`axum::serve` gives hyper no timer, so the timeout never ran), and enough of
/// them used up the descriptors of the process that runs the experiment.
#[test]
fn a_request_head_that_never_ends_is_cut_off_and_others_are_served() {
    let sandbox = Sandbox::new();
    let (one, list) = one_view_and_the_list(&sandbox, "slow");
    for base in [&one.base, &list.base] {
        let address = base.trim_start_matches("http://");
        let mut stalled = TcpStream::connect(address).unwrap();
        stalled
            .write_all(format!("GET / HTTP/1.1\r\nHost: {address}\r\nAccept: ").as_bytes())
            .unwrap();
        stalled
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let head = head_of(base, "/");
        assert!(head.starts_with("http/1.1 200"), "{base}: {head}");
        let mut answer = Vec::new();
        // Closed by the server (an end, or a reset), not left open until this read gives up.
        match stalled.read_to_end(&mut answer) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("{base}: the half-sent request was still open after 60 s: {e}"),
        }
        assert!(
            !String::from_utf8_lossy(&answer).contains(" 200 "),
            "{base}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
}
