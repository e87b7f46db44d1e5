//! Notifications end to end: a real SMTP server (aiosmtpd from PyPI, `notify/smtpd.py`, with
//! STARTTLS under a test CA and AUTH) and an HTTP receiver in this test, both on 127.0.0.1; the
//! real `knob create`, `knob resume` and `knob notify test`. The SMTP password and the webhook
//! secret must reach the servers and nothing else: no file of the experiment or of `$KNOB_HOME`,
//! no output, no API answer.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use expect_test::expect;
use serde_json::Value;

use crate::create::Sandbox;
use crate::prerequisite;
use crate::run;

const PASSWORD: &str = "pw-Wq7c-never-stored";
const WEBHOOK_SECRET: &str = "hook-Zr2k-never-stored";
/// The path of the receivers' URL: a Slack webhook's path is its key, so it is a secret too.
const WEBHOOK_PATH: &str = "/hooks/knob-Tq9x-never-stored";

/// Trials report their `x` as final result; Random with a seed, so the best differs per trial.
const EXPERIMENT: &str = r#"experimentName: notified
trialCommand: 'x=$(echo "$KNOB_PARAMETERS" | tr -dc 0-9); echo KNOB_FINAL $x'
trialConcurrency: 2
maxTrialNumber: 4
searchSpace:
  x: {_type: randint, _value: [0, 1000]}
tuner:
  name: Random
  classArgs: {seed: 5, optimize_mode: maximize}
trainingService:
  platform: local"#;

/// aiosmtpd on 127.0.0.1, saving each mail as `<dir>/mail-N.eml`; ends with the test.
struct Smtpd {
    child: Child,
    _stdin: ChildStdin,
    port: u16,
    dir: PathBuf,
}

impl Smtpd {
    fn start(python: &Path, dir: &Path, args: &[&str]) -> Smtpd {
        std::fs::create_dir_all(dir).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/notify/smtpd.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(dir)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut line = String::new();
        // The server prints its port once it listens (or dies, closing stdout).
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .strip_prefix("PORT ")
            .and_then(|port| port.trim().parse().ok())
            .unwrap_or_else(|| panic!("smtpd.py did not start: {line:?}"));
        Smtpd {
            child,
            _stdin: stdin,
            port,
            dir: dir.to_path_buf(),
        }
    }

    /// Every mail received so far, as text, oldest first.
    fn mails(&self) -> Vec<String> {
        let mut mails: Vec<(u32, String)> = std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                let number = name
                    .strip_prefix("mail-")?
                    .strip_suffix(".eml")?
                    .parse()
                    .ok()?;
                Some((number, std::fs::read_to_string(self.dir.join(&name)).ok()?))
            })
            .collect();
        mails.sort();
        mails.into_iter().map(|(_, text)| text).collect()
    }

    fn auth_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("auth.log")).unwrap_or_default()
    }
}

impl Drop for Smtpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request the receiver got: header lines (names lowercase) and the body.
#[derive(Debug, Clone)]
struct Received {
    headers: Vec<(String, String)>,
    body: String,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

/// A webhook receiver on 127.0.0.1: answers every POST with `status`, keeps what it got.
struct Receiver {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    fn start(status: u16) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}{WEBHOOK_PATH}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let keep = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut headers = Vec::new();
                let mut line = String::new();
                let _ = reader.read_line(&mut line); // the request line
                loop {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                        break;
                    }
                    if let Some((key, value)) = line.trim_end().split_once(':') {
                        headers.push((key.to_ascii_lowercase(), value.trim().to_owned()));
                    }
                }
                let length: usize = headers
                    .iter()
                    .find(|(key, _)| key == "content-length")
                    .and_then(|(_, value)| value.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                keep.lock().unwrap().push(Received {
                    headers,
                    body: String::from_utf8_lossy(&body).into_owned(),
                });
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                );
            }
        });
        Receiver { url, received }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// A test CA and a certificate for localhost/127.0.0.1 signed by it, made with openssl:
/// (ca.pem, server.pem, server.key). `None` (after saying so) without openssl.
fn certificates(dir: &Path) -> Option<(PathBuf, PathBuf, PathBuf)> {
    certificates_for(dir, "DNS:localhost,IP:127.0.0.1")
}

/// [`certificates`] with a server certificate for `names` (openssl's `subjectAltName`).
fn certificates_for(dir: &Path, names: &str) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let openssl = |args: &[&str]| {
        Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
    };
    std::fs::create_dir_all(dir).unwrap();
    if openssl(&["version"]).is_err() {
        prerequisite::missing("needs openssl on PATH (Debian: apt-get install openssl)");
        return None;
    }
    std::fs::write(
        dir.join("server.ext"),
        format!("subjectAltName={names}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"),
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let steps: [Vec<&str>; 3] = [
        [
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=knob test CA",
            ],
        ]
        .concat(),
        [
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat(),
        vec![
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    ];
    for step in steps {
        let output = openssl(&step).unwrap();
        assert!(
            output.status.success(),
            "openssl {step:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Some((
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    ))
}

/// Waits (at most 30 s) until `done` holds.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if let Ok(bytes) = std::fs::read(&path) {
            if bytes
                .windows(needle.len())
                .any(|window| window == needle.as_bytes())
            {
                found.push(path);
            }
        }
    }
    found
}

/// The body of a mail: what follows the first blank line, decoded from quoted-printable when
/// the mail says so (lettre chooses it for lines over 76 characters), with `\n` line ends.
fn mail_body(mail: &str) -> String {
    let mail = mail.replace("\r\n", "\n");
    let (head, body) = mail.split_once("\n\n").unwrap_or(("", &mail));
    if !head.contains("Content-Transfer-Encoding: quoted-printable") {
        return body.to_owned();
    }
    let joined = body.replace("=\n", "");
    let bytes = joined.as_bytes();
    let mut decoded = Vec::new();
    let mut index = 0;
    while index < bytes.len() {
        let hex = (bytes[index] == b'=')
            .then(|| joined.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match hex {
            Some(byte) => {
                decoded.push(byte);
                index += 3;
            }
            None => {
                decoded.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8(decoded).unwrap().replace("\r\n", "\n")
}

fn subject(mail: &str) -> String {
    mail.lines()
        .find_map(|line| line.strip_prefix("Subject: "))
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn the_end_of_an_experiment_is_mailed_and_posted_and_its_secrets_are_stored_nowhere() {
    let Some(python) = prerequisite::SMTPD_PYTHON.path() else {
        return;
    };
    let sandbox = Sandbox::new();
    let Some((ca, cert, key)) = certificates(&sandbox.path().join("tls")) else {
        return;
    };
    let smtpd = Smtpd::start(
        &python,
        &sandbox.path().join("smtpd"),
        &[
            "--user",
            "me",
            "--password",
            PASSWORD,
            "--cert",
            cert.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ],
    );
    let receiver = Receiver::start(200);
    let config = sandbox.config(
        &format!(
            "{EXPERIMENT}
notifications:
  webhook:
    url: {url}
    secret: {WEBHOOK_SECRET}
  email:
    host: localhost
    port: {port}
    security: starttls
    caFile: {ca}
    user: me
    password: {PASSWORD}
    from: knob <knob@example.com>
    to: [me@example.com, team@example.com]",
            url = receiver.url,
            port = smtpd.port,
            ca = ca.display()
        ),
        &[],
    );
    let (code, stdout, stderr) = sandbox.create(&config, "mailed");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(!stderr.contains("notifications:"), "{stderr}");

    // The best trial, as knob recorded it.
    let export = sandbox.export("mailed");
    let best = export["trials"]
        .as_array()
        .unwrap()
        .iter()
        .max_by(|a, b| {
            a["final"]
                .as_f64()
                .partial_cmp(&b["final"].as_f64())
                .unwrap()
        })
        .unwrap()
        .clone();
    let best_id = best["id"].as_str().unwrap().to_owned();
    let best_x = best["parameters"]["x"].as_i64().unwrap();

    // The mail: sent over STARTTLS (the server requires it before AUTH), logged in, to both.
    wait_for("the DONE mail", || {
        smtpd
            .mails()
            .iter()
            .any(|mail| subject(mail).contains("DONE"))
    });
    let mails = smtpd.mails();
    assert_eq!(mails.len(), 1, "{mails:#?}");
    let mail = &mails[0];
    assert!(
        mail.contains("X-Envelope-To: me@example.com, team@example.com"),
        "{mail}"
    );
    assert!(smtpd.auth_log().contains("me ok"), "{}", smtpd.auth_log());
    assert!(
        subject(mail).starts_with("knob: experiment mailed DONE, best"),
        "{mail}"
    );
    let body = &mail_body(mail);
    assert!(
        body.contains("Experiment mailed (notified) is DONE after"),
        "{body}"
    );
    assert!(body.contains("Trials: 4 (4 succeeded)"), "{body}");
    assert!(
        body.contains(&format!(
            "  1. trial {best_id}: {best_x}  {{\"x\":{best_x}}}"
        )),
        "{best_id} {best_x}: {body}"
    );
    assert!(body.contains("Dashboard: http://127.0.0.1:"), "{body}");

    // The webhook: Slack's `text`, knob's fields, and the secret in its header.
    wait_for("the webhook", || !receiver.received().is_empty());
    let posts = receiver.received();
    assert_eq!(posts.len(), 1, "{posts:#?}");
    let post = &posts[0];
    assert_eq!(
        post.header("x-knob-secret"),
        Some(WEBHOOK_SECRET),
        "{post:?}"
    );
    assert!(
        post.header("content-type")
            .is_some_and(|kind| kind.starts_with("application/json")),
        "{post:?}"
    );
    let json = post.json();
    assert!(
        json["text"].as_str().unwrap().contains("is DONE after"),
        "{json}"
    );
    assert_eq!(json["knob"]["status"], "DONE", "{json}");
    assert_eq!(
        json["knob"]["best"][0]["trialId"],
        best_id.as_str(),
        "{json}"
    );
    assert_eq!(json["knob"]["best"][0]["parameters"]["x"], best_x, "{json}");
    assert_eq!(json["knob"]["trials"]["SUCCEEDED"], 4, "{json}");

    // The secrets: in no file of the experiment or of KNOB_HOME, and in no output.
    let mut outputs = vec![stdout, stderr];
    for args in [
        vec!["experiment", "show", "mailed"],
        vec!["experiment", "export", "mailed", "--format", "json"],
        vec!["experiment", "export", "mailed", "--format", "csv"],
        vec!["trial", "ls", "mailed"],
    ] {
        let (code, stdout, stderr) = run(sandbox.knob().args(&args));
        assert_eq!(code, 0, "{args:?}: {stderr}");
        outputs.push(stdout + &stderr);
    }
    let (_, stdout, stderr) = run(sandbox.knob().arg("config").arg("check").arg(&config));
    assert!(stdout.contains("password: \"***\""), "{stdout}");
    outputs.push(stdout + &stderr);
    let (_, stdout, stderr) = run(sandbox
        .knob()
        .args(["config", "check", "--v2"])
        .arg(&config));
    assert!(stdout.contains("password: \"***\""), "{stdout}");
    assert!(stdout.contains("secret: \"***\""), "{stdout}");
    outputs.push(stdout + &stderr);
    let mut command = sandbox.knob();
    command.args(["view", "mailed", "--port", "0"]);
    let view = crate::api::start(command, &[]);
    for path in ["/experiment", "/export?format=json", "/trials"] {
        let (status, body) = crate::api::get(&view.base, path);
        assert_eq!(status, 200, "{path}: {body}");
        outputs.push(body.to_string());
    }
    drop(view);
    for secret in [PASSWORD, WEBHOOK_SECRET, WEBHOOK_PATH] {
        for output in &outputs {
            assert!(!output.contains(secret), "{secret} shown: {output}");
        }
        for dir in [
            sandbox.path().join("experiments"),
            sandbox.path().join("home"),
        ] {
            assert_eq!(
                files_containing(&dir, secret),
                Vec::<PathBuf>::new(),
                "{secret}"
            );
        }
    }
}

#[test]
fn new_bests_and_failures_in_a_row_are_posted_when_asked() {
    let sandbox = Sandbox::new();
    let receiver = Receiver::start(200);
    // Trial x fails when x is odd, after reporting its final: the seeded draws give runs of
    // failures and successes, and a failed trial's final is never a new best.
    let config = sandbox.config(
        &format!(
            r#"trialCommand: 'x=$(echo "$KNOB_PARAMETERS" | tr -dc 0-9); echo KNOB_FINAL $x; if [ $((x % 2)) = 1 ]; then echo odd >&2; exit 3; fi'
trialConcurrency: 1
maxTrialNumber: 12
searchSpace:
  x: {{_type: randint, _value: [0, 1000]}}
tuner:
  name: Random
  classArgs: {{seed: 11, optimize_mode: minimize}}
trainingService:
  platform: local
notifications:
  newBest: true
  failuresInARow: 2
  webhook: {{url: "{url}"}}"#,
            url = receiver.url
        ),
        &[],
    );
    let (code, stdout, stderr) = sandbox.create(&config, "bests");
    assert!(code == 0 || code == 1, "{stdout}\n{stderr}");
    let export = sandbox.export("bests");
    let trials = export["trials"].as_array().unwrap().clone();
    wait_for("the end", || {
        receiver
            .received()
            .iter()
            .any(|post| post.json()["knob"]["event"] == "done")
    });
    let posts: Vec<Value> = receiver.received().iter().map(Received::json).collect();
    assert!(
        posts.iter().all(|post| post.get("text").is_some()),
        "{posts:#?}"
    );

    // What the trials did, in order: each new minimum was a new best; every second failure in a
    // run of failures was reported once.
    let mut expected_bests = Vec::new();
    let mut expected_runs = Vec::new();
    let (mut best, mut run): (Option<f64>, Vec<String>) = (None, Vec::new());
    let mut failed_below_best = 0;
    let mut ordered = trials.clone();
    ordered.sort_by_key(|trial| trial["sequence"].as_u64());
    for trial in &ordered {
        let id = trial["id"].as_str().unwrap().to_owned();
        match trial["status"].as_str().unwrap() {
            "FAILED" => {
                let value = trial["final"].as_f64().unwrap();
                if best.is_none_or(|best| value < best) {
                    failed_below_best += 1;
                }
                run.push(id);
                if run.len() == 2 {
                    expected_runs.push(run.clone());
                }
            }
            _ => {
                run.clear();
                let value = trial["final"].as_f64().unwrap();
                if best.is_none_or(|best| value < best) {
                    best = Some(value);
                    expected_bests.push(id);
                }
            }
        }
    }
    assert!(
        !expected_runs.is_empty() && expected_bests.len() >= 2 && failed_below_best > 0,
        "the seed no longer gives every case: {ordered:#?}"
    );
    let bests: Vec<&str> = posts
        .iter()
        .filter(|post| post["knob"]["event"] == "new_best")
        .map(|post| post["knob"]["best"][0]["trialId"].as_str().unwrap())
        .collect();
    assert_eq!(bests, expected_bests, "{posts:#?}");
    let runs: Vec<Vec<&str>> = posts
        .iter()
        .filter(|post| post["knob"]["event"] == "failures_in_a_row")
        .map(|post| {
            post["knob"]["failed"]
                .as_array()
                .unwrap()
                .iter()
                .map(|failed| failed["trialId"].as_str().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(runs, expected_runs, "{posts:#?}");
    let failures_text = posts
        .iter()
        .find(|post| post["knob"]["event"] == "failures_in_a_row")
        .unwrap()["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        failures_text.contains("2 trials failed in a row"),
        "{failures_text}"
    );
    assert!(failures_text.contains("exit code 3"), "{failures_text}");
    assert_eq!(posts.last().unwrap()["knob"]["event"], "done", "{posts:#?}");
}

#[test]
fn a_sink_that_is_down_is_retried_then_logged_and_the_experiment_still_ends_done() {
    let sandbox = Sandbox::new();
    // A port nothing listens on: taken, then freed.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let failing = Receiver::start(500);
    let config = sandbox.config(
        &format!(
            "{EXPERIMENT}
notifications:
  webhook: {{url: \"{url}\"}}
  email: {{host: 127.0.0.1, port: {closed}, security: none, from: knob@example.com, to: me@example.com}}",
            url = failing.url
        ),
        &[],
    );
    let (code, stdout, stderr) = sandbox.create(&config, "down");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment down DONE: 4 trials (4 succeeded, 0 failed)"),
        "{stdout}"
    );
    assert!(
        stderr.contains("warning: notifications: \"knob: experiment down DONE, best")
            && stderr.contains(&format!(
                "to email to me@example.com via 127.0.0.1:{closed} not sent (4 tries): "
            )),
        "{stderr}"
    );
    assert!(stderr.contains("to webhook http://127.0.0.1:"), "{stderr}");
    assert!(
        stderr.contains("not sent (4 tries): the server answered 500"),
        "{stderr}"
    );
    // Every try reached the receiver.
    assert_eq!(failing.received().len(), 4);
    assert_eq!(sandbox.export("down")["experiment"]["status"], "DONE");
}

#[test]
fn notify_test_reports_each_sink_in_one_line() {
    let Some(python) = prerequisite::SMTPD_PYTHON.path() else {
        return;
    };
    let sandbox = Sandbox::new();
    let smtpd = Smtpd::start(
        &python,
        &sandbox.path().join("smtpd"),
        &["--user", "me", "--password", PASSWORD],
    );
    let receiver = Receiver::start(200);
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let notify_test = |email: &str, webhook_url: &str| {
        let config = sandbox.config(
            &format!(
                "{EXPERIMENT}
notifications:
  webhook: {{url: \"{webhook_url}\", secret: {WEBHOOK_SECRET}, secretHeader: X-Hook-Token}}
  email: {email}"
            ),
            &[],
        );
        let (code, stdout, stderr) = run(sandbox
            .knob()
            .args(["notify", "test", "--config"])
            .arg(&config));
        for secret in [PASSWORD, WEBHOOK_SECRET] {
            assert!(
                !stdout.contains(secret) && !stderr.contains(secret),
                "{stdout}{stderr}"
            );
        }
        (
            code,
            stdout
                .replace(&smtpd.port.to_string(), "PORT")
                .replace(&closed.to_string(), "CLOSED"),
            stderr,
        )
    };

    let (code, stdout, stderr) = notify_test(
        &format!("{{host: 127.0.0.1, port: {}, security: none, user: me, password: {PASSWORD}, to: [me@example.com], from: knob@example.com}}", smtpd.port),
        &receiver.url,
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let port = receiver
        .url
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    expect![[r#"
        webhook http://127.0.0.1:HOOK/…: sent
        email to me@example.com via 127.0.0.1:PORT: sent
    "#]]
    .assert_eq(&stdout.replace(&port, "HOOK"));
    assert_eq!(
        receiver.received()[0].header("x-hook-token"),
        Some(WEBHOOK_SECRET)
    );
    assert_eq!(receiver.received()[0].json()["knob"]["event"], "test");
    wait_for("the test mail", || smtpd.mails().len() == 1);
    assert!(subject(&smtpd.mails()[0]).contains("knob: test notification"));

    // A wrong password, a server that is not there, a webhook that refuses: each one line.
    let (code, stdout, _) = notify_test(
        &format!("{{host: 127.0.0.1, port: {}, security: none, user: me, password: wrong, to: [me@example.com], from: knob@example.com}}", smtpd.port),
        "http://127.0.0.1:1/nothing-listens",
    );
    assert_eq!(code, 1, "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].starts_with("webhook http://127.0.0.1:1/…: failed: "),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("email to me@example.com via 127.0.0.1:PORT: failed: ")
            && lines[1].contains("535"),
        "{stdout}"
    );
    assert!(
        smtpd.auth_log().contains("me refused"),
        "{}",
        smtpd.auth_log()
    );

    let (code, stdout, _) = notify_test(
        &format!("{{host: 127.0.0.1, port: {closed}, security: starttls, to: me@example.com, from: knob@example.com}}"),
        &receiver.url.replace("/hooks/knob", "/x"),
    );
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("email to me@example.com via 127.0.0.1:CLOSED: failed: ")
            && stdout.contains("onnection refused"),
        "{stdout}"
    );

    // `security` that does not fit the server: lettre's own words ("internal client error",
    // "corrupt message of type InvalidContentType") named neither the setting nor the port.
    for (security, advice) in [
        ("starttls", "the server on port PORT does not offer STARTTLS: set notifications.email.security to tls"),
        ("tls", "the server on port PORT does not speak TLS at once: set notifications.email.security to starttls"),
    ] {
        let (code, stdout, _) = notify_test(
            &format!("{{host: 127.0.0.1, port: {}, security: {security}, to: [me@example.com], from: knob@example.com}}", smtpd.port),
            &receiver.url,
        );
        assert_eq!(code, 1, "{stdout}");
        let line = stdout.lines().nth(1).unwrap();
        assert!(
            line.starts_with("email to me@example.com via 127.0.0.1:PORT: failed: ")
                && line.contains(advice),
            "{security}: {stdout}"
        );
    }

    // A config without notifications.
    let plain = sandbox.config(EXPERIMENT, &[]);
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["notify", "test", "--config"])
        .arg(&plain));
    assert_eq!(code, 1);
    assert!(stderr.contains("no notifications to test"), "{stderr}");
}

#[test]
fn bad_notifications_are_refused_naming_the_field() {
    let sandbox = Sandbox::new();
    let check = |notifications: &str| {
        let config = sandbox.config(
            &format!("{EXPERIMENT}\nnotifications:\n{notifications}"),
            &[],
        );
        let (code, stdout, stderr) = run(sandbox.knob().arg("config").arg("check").arg(&config));
        assert_eq!(code, 1, "{stdout}");
        stderr
            .replace(&config.display().to_string(), "CONFIG")
            .replace(&sandbox.path().display().to_string(), "SANDBOX")
    };
    expect![[r#"
        error: CONFIG:13:18: notifications.webhook.url: "ftp://example.com/***": scheme "ftp" is not supported; write http://... or https://...
    "#]]
    .assert_eq(&check("  webhook: {url: ftp://example.com/x}"));
    expect![[r#"
        error: CONFIG:13:18: notifications.webhook.url: "not a url" is not a URL (invalid uri character); write http://... or https://...
        error: CONFIG:13:43: notifications.webhook.secretHeader: expected an HTTP header name like "X-Knob-Secret", got "a b"
    "#]]
    .assert_eq(&check("  webhook: {url: not a url, secretHeader: a b}"));
    // Sent as a header: a line break in the secret failed every send, a header the request
    // sets itself (Host) was replaced by the secret, and a blank one was told to "quote it".
    expect![[r#"
        error: CONFIG:13:50: notifications.webhook.secret: must not hold a line break or another control character: it is sent as an HTTP header's value
    "#]]
    .assert_eq(&check(r#"  webhook: {url: "http://127.0.0.1:1/a", secret: "a\r\nX-Evil: 1"}"#));
    expect![[r#"
        error: CONFIG:13:67: notifications.webhook.secretHeader: Host is a header the request itself sets, which the secret would replace; name one of your own, like "X-Knob-Secret"
    "#]]
    .assert_eq(&check(r#"  webhook: {url: "http://127.0.0.1:1/a", secret: s, secretHeader: Host}"#));
    expect![[r#"
        error: CONFIG:13:50: notifications.webhook.secret: is blank: give the value the other end expects (knob never shows a secret's value)
    "#]]
    .assert_eq(&check(r#"  webhook: {url: "http://127.0.0.1:1/a", secret: "  "}"#));
    expect![[r#"
        error: CONFIG:13:10: notifications.email.to: required: the recipients, e.g. [me@example.com]
    "#]]
    .assert_eq(&check(
        "  email: {host: smtp.example.com, from: me@example.com}",
    ));
    expect![[r#"
        error: CONFIG:13:74: notifications.email.to: expected one or more mail addresses, e.g. [me@example.com], got an empty list
    "#]]
    .assert_eq(&check("  email: {host: smtp.example.com, user: me@example.com, password: x, to: []}"));
    expect![[r#"
        error: CONFIG:13:41: notifications.email.password: required with user: the SMTP password (a secret: never stored or shown)
        error: CONFIG:13:69: notifications.email.to[1]: "nobody" is not a mail address (Invalid input)
    "#]]
    .assert_eq(&check("  email: {host: smtp.example.com, user: me@example.com, to: [a@b.c, nobody]}"));
    expect![[r#"
        error: CONFIG:13:45: notifications.email.security: expected one of "starttls", "tls", "none", got "ssl"
        error: CONFIG:13:70: notifications.email.password: "***" is the placeholder knob prints instead of a secret; write the real value
    "#]]
    .assert_eq(&check("  email: {host: smtp.example.com, security: ssl, user: me, password: '***', from: a@b.c, to: a@b.c}"));
    expect![[r#"
        error: CONFIG:13:17: notifications.email.host: expected a non-empty string, got ""
        error: CONFIG:13:27: notifications.email.port: expected a positive integer, got 0
        error: CONFIG:13:40: notifications.email.password: a password without user; add user, or remove password
        error: CONFIG:13:51: notifications.email.caFile: cannot read "SANDBOX/code/missing.pem": No such file or directory
    "#]]
    .assert_eq(&check("  email: {host: '', port: 0, password: x, caFile: missing.pem, from: a@b.c, to: a@b.c}"));
    // lettre connects to (host, port): a host with a port, a scheme or brackets passed here and
    // every send failed with "failed to lookup address information".
    expect![[r#"
        error: CONFIG:13:17: notifications.email.host: "127.0.0.1:2525" holds a port (2525); write the server's name or address alone, e.g. smtp.example.com (the port goes under port, TLS under security)
    "#]]
    .assert_eq(&check("  email: {host: 127.0.0.1:2525, from: a@b.c, to: a@b.c}"));
    expect![[r#"
        error: CONFIG:13:17: notifications.email.host: "smtps://smtp.example.com" is a URL (smtps://); write the server's name or address alone, e.g. smtp.example.com (the port goes under port, TLS under security)
    "#]]
    .assert_eq(&check("  email: {host: smtps://smtp.example.com, from: a@b.c, to: a@b.c}"));
    expect![[r#"
        error: CONFIG:13:17: notifications.email.host: "[::1]": write an IPv6 address without brackets (::1)
    "#]]
    .assert_eq(&check("  email: {host: '[::1]', from: a@b.c, to: a@b.c}"));
    // A caFile without a certificate in it: lettre took it as none and the mail failed later,
    // at the TLS handshake, for a reason that did not name the file.
    let code = sandbox.path().join("code");
    std::fs::write(
        code.join("key.pem"),
        "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    std::fs::write(code.join("cut.pem"), "-----BEGIN CERTIFICATE-----\nMIIB\n").unwrap();
    let ca_file = |path: &str| {
        check(&format!(
            "  email: {{host: 127.0.0.1, security: tls, caFile: {path}, from: a@b.c, to: a@b.c}}"
        ))
    };
    expect![[r#"
        error: CONFIG:13:51: notifications.email.caFile: "/dev/null" holds no PEM certificate (-----BEGIN CERTIFICATE-----); give the private CA's certificates in PEM
    "#]]
    .assert_eq(&ca_file("/dev/null"));
    expect![[r#"
        error: CONFIG:13:51: notifications.email.caFile: "SANDBOX/code/key.pem" holds no PEM certificate (-----BEGIN CERTIFICATE-----); give the private CA's certificates in PEM
    "#]]
    .assert_eq(&ca_file("key.pem"));
    expect![[r#"
        error: CONFIG:13:51: notifications.email.caFile: "SANDBOX/code/cut.pem" cannot be read as PEM certificates: a block has no END line
    "#]]
    .assert_eq(&ca_file("cut.pem"));
    expect![[r#"
        error: CONFIG:13:3: notifications: says where to send nothing: add webhook: {url: ...} or email: {host: ..., to: [...]}, or remove notifications
    "#]]
    .assert_eq(&check("  newBest: true"));
    expect![[r#"
        error: CONFIG:13:3: notifications: unknown field "failuresInRow" (did you mean "failuresInARow"?)
    "#]]
    .assert_eq(&check("  failuresInRow: 3\n  webhook: {url: http://127.0.0.1:9/}"));
}

#[test]
fn resume_gets_the_password_from_the_config_file_or_its_variable_else_runs_without_mail() {
    let Some(python) = prerequisite::SMTPD_PYTHON.path() else {
        return;
    };
    let sandbox = Sandbox::new();
    let smtpd = Smtpd::start(
        &python,
        &sandbox.path().join("smtpd"),
        &["--user", "me", "--password", PASSWORD],
    );
    let config = sandbox.config(
        &format!(
            "{}
notifications:
  email: {{host: 127.0.0.1, port: {}, security: none, user: me, password: {PASSWORD}, from: knob@example.com, to: me@example.com}}",
            EXPERIMENT.replace("maxTrialNumber: 4", "maxTrialNumber: 2"),
            smtpd.port
        ),
        &[],
    );
    let (code, stdout, stderr) = sandbox.create(&config, "again");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    wait_for("the first DONE mail", || smtpd.mails().len() == 1);
    let resume = |max: u32, password_variable: Option<&str>| {
        let mut command = sandbox.knob();
        command
            .args(["resume", "again", "--max-trial-number", &max.to_string()])
            .env_remove("KNOB_SMTP_PASSWORD");
        if let Some(password) = password_variable {
            command.env("KNOB_SMTP_PASSWORD", password);
        }
        let (code, stdout, stderr) = run(&mut command);
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        assert!(
            !stdout.contains(PASSWORD) && !stderr.contains(PASSWORD),
            "{stderr}"
        );
        stderr
    };

    // From the config file the experiment was created from (its path is in config-source).
    resume(3, None);
    wait_for("the second DONE mail", || smtpd.mails().len() == 2);
    assert!(subject(&smtpd.mails()[1]).contains("knob: experiment again DONE"));
    assert!(mail_body(&smtpd.mails()[1]).contains("Trials: 3 (3 succeeded)"));

    // The file is gone: from KNOB_SMTP_PASSWORD.
    std::fs::remove_file(&config).unwrap();
    resume(4, Some(PASSWORD));
    wait_for("the third DONE mail", || smtpd.mails().len() == 3);
    assert_eq!(smtpd.auth_log(), "me ok\nme ok\nme ok\n");

    // Neither: the experiment runs, without mail, and says why.
    let stderr = resume(5, None);
    assert!(
        stderr.contains("warning: notifications: notifications.email.password is not stored, and the config file the experiment was created from no longer has it; set KNOB_SMTP_PASSWORD; that sink is off for this run"),
        "{stderr}"
    );
    assert_eq!(
        sandbox.export("again")["trials"].as_array().unwrap().len(),
        5
    );
    assert_eq!(smtpd.mails().len(), 3);
    for dir in [
        sandbox.path().join("experiments"),
        sandbox.path().join("home"),
    ] {
        assert_eq!(files_containing(&dir, PASSWORD), Vec::<PathBuf>::new());
    }
}

#[test]
fn resume_gets_the_webhooks_url_from_the_config_file_or_its_variable_else_runs_without_it() {
    let sandbox = Sandbox::new();
    let receiver = Receiver::start(200);
    let config = sandbox.config(
        &format!(
            "{}
notifications:
  webhook: {{url: \"{}\"}}",
            EXPERIMENT.replace("maxTrialNumber: 4", "maxTrialNumber: 2"),
            receiver.url
        ),
        &[],
    );
    let (code, stdout, stderr) = sandbox.create(&config, "hooked");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    wait_for("the first DONE post", || receiver.received().len() == 1);
    let resume = |max: u32, url_variable: Option<&str>| {
        let mut command = sandbox.knob();
        command
            .args(["resume", "hooked", "--max-trial-number", &max.to_string()])
            .env_remove("KNOB_WEBHOOK_URL");
        if let Some(url) = url_variable {
            command.env("KNOB_WEBHOOK_URL", url);
        }
        let (code, stdout, stderr) = run(&mut command);
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        assert!(
            !stdout.contains(WEBHOOK_PATH) && !stderr.contains(WEBHOOK_PATH),
            "{stderr}"
        );
        stderr
    };
    let host = receiver.url.strip_suffix(WEBHOOK_PATH).unwrap();

    // From the config file the experiment was created from.
    resume(3, None);
    wait_for("the second DONE post", || receiver.received().len() == 2);

    // The file is gone: from KNOB_WEBHOOK_URL; one to another host is refused.
    std::fs::remove_file(&config).unwrap();
    resume(4, Some(&receiver.url));
    wait_for("the third DONE post", || receiver.received().len() == 3);
    let json = receiver.received()[2].json();
    assert!(
        json["text"].as_str().unwrap().contains("Trials: 4"),
        "{json}"
    );
    let stderr = resume(5, Some("http://127.0.0.2:9/elsewhere"));
    assert!(
        stderr.contains(&format!("warning: notifications: KNOB_WEBHOOK_URL goes to http://127.0.0.2:9/***, not to the experiment's webhook {host}/***; set it to that webhook's URL; that sink is off for this run")),
        "{stderr}"
    );

    // Neither: the experiment runs, without the webhook, and says why.
    let stderr = resume(6, None);
    assert!(
        stderr.contains(&format!("warning: notifications: notifications.webhook.url is not stored (only {host}/*** is), and the config file the experiment was created from no longer has it; set KNOB_WEBHOOK_URL; that sink is off for this run")),
        "{stderr}"
    );
    assert_eq!(
        sandbox.export("hooked")["trials"].as_array().unwrap().len(),
        6
    );
    assert_eq!(receiver.received().len(), 3);
    for dir in [
        sandbox.path().join("experiments"),
        sandbox.path().join("home"),
    ] {
        assert_eq!(files_containing(&dir, WEBHOOK_PATH), Vec::<PathBuf>::new());
    }
}

#[test]
fn a_stopped_experiment_posts_its_summary() {
    let sandbox = Sandbox::new();
    let receiver = Receiver::start(200);
    // The first trial ends at once, the others run until the stop.
    let config = sandbox.config(
        &format!(
            r#"trialCommand: 'x=$(echo "$KNOB_PARAMETERS" | tr -dc 0-9); echo KNOB_FINAL $x; if [ -e started ]; then sleep 60; fi; touch started'
trialConcurrency: 1
maxTrialNumber: 10
searchSpace:
  x: {{_type: randint, _value: [0, 1000]}}
tuner: {{name: Random, classArgs: {{seed: 2}}}}
trainingService: {{platform: local}}
notifications:
  webhook: {{url: "{url}"}}"#,
            url = receiver.url
        ),
        &[],
    );
    let mut command = sandbox.knob();
    command
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "halted"]);
    let experiment = crate::api::start(command, &[]);
    wait_for("a second trial running", || {
        let (_, trials) = crate::api::get(&experiment.base, "/trials");
        trials.to_string().matches("RUNNING").count() == 1
            && trials.to_string().contains("SUCCEEDED")
    });
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "halted"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    wait_for("the STOPPED post", || !receiver.received().is_empty());
    let posts = receiver.received();
    assert_eq!(posts.len(), 1, "{posts:#?}");
    let json = posts[0].json();
    assert_eq!(json["knob"]["event"], "stopped", "{json}");
    assert_eq!(json["knob"]["trials"]["SUCCEEDED"], 1, "{json}");
    assert_eq!(json["knob"]["trials"]["USER_CANCELED"], 1, "{json}");
    let text = json["text"].as_str().unwrap();
    assert!(
        text.starts_with("knob: experiment halted STOPPED, best "),
        "{text}"
    );
    assert!(
        text.contains("Trials: 2 (1 succeeded, 1 user_canceled)"),
        "{text}"
    );
    drop(experiment);
}

#[test]
fn an_experiment_ending_in_error_posts_the_reason_and_the_counts() {
    // A tuner that hands out good parameters for two trials, then parameters outside the search
    // space: with the default tunerErrorPolicy (error) the experiment ends in ERROR.
    let library = crate::tuner_output::misbehaving_tuner();
    let sandbox = Sandbox::new();
    let receiver = Receiver::start(200);
    let config = sandbox.config(
        &format!(
            "experimentName: failing
trialCommand: echo KNOB_FINAL 1
trialConcurrency: 1
maxTrialNumber: 5
searchSpace: {{x: {{_type: uniform, _value: [0, 1]}}}}
pluginPaths: [{library}]
tuner: {{name: Misbehaving, classArgs: {{output: bad_from_2}}}}
trainingService: {{platform: local}}
notifications:
  webhook: {{url: \"{url}\"}}",
            library = library.display(),
            url = receiver.url
        ),
        &[],
    );
    let (code, stdout, stderr) = sandbox.create(&config, "broken");
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let reason = r#"tuner Misbehaving handed out parameters the search space does not hold (parameter id 2): trial parameter "x": 7.5 is outside uniform [0, 1] (tunerErrorPolicy: skip drops such parameters instead, allow runs them as NNI does)"#;
    let export = sandbox.export("broken");
    assert_eq!(export["experiment"]["status"], "ERROR");
    assert_eq!(export["experiment"]["message"], reason);
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2, "{export}");

    wait_for("the ERROR post", || !receiver.received().is_empty());
    let posts = receiver.received();
    assert_eq!(posts.len(), 1, "{posts:#?}");
    let json = posts[0].json();
    assert_eq!(json["knob"]["event"], "error", "{json}");
    assert_eq!(json["knob"]["experimentId"], "broken", "{json}");
    assert_eq!(json["knob"]["experimentName"], "failing", "{json}");
    assert_eq!(json["knob"]["status"], "ERROR", "{json}");
    assert_eq!(json["knob"]["message"], reason, "{json}");
    assert_eq!(json["knob"]["trials"]["SUCCEEDED"], 2, "{json}");
    // Both trials reported 1: the best is one of them, with its value.
    let best = &json["knob"]["best"][0];
    assert!(
        trials.iter().any(|trial| trial["id"] == best["trialId"]),
        "{json}"
    );
    assert_eq!(best["value"], 1.0, "{json}");
    let text = json["text"].as_str().unwrap();
    assert!(
        text.starts_with("knob: experiment broken ERROR, best 1 (trial "),
        "{text}"
    );
    assert!(
        text.contains("Experiment broken (failing) is ERROR after"),
        "{text}"
    );
    assert!(text.contains(&format!("Reason: {reason}\n")), "{text}");
    assert!(text.contains("Trials: 2 (2 succeeded)"), "{text}");
}

/// A run whose folder is deleted while it runs ends in ERROR without its store recording it,
/// and the notifier follows the store: no message went out at all. It is told the end.
#[test]
fn an_experiment_whose_folder_is_deleted_posts_its_error() {
    let sandbox = Sandbox::new();
    let receiver = Receiver::start(200);
    let config = sandbox.config(
        &format!(
            r#"trialCommand: 'echo KNOB_FINAL 1; sleep 1'
trialConcurrency: 1
maxTrialNumber: 20
searchSpace:
  x: {{_type: randint, _value: [0, 1000]}}
tuner: {{name: Random}}
trainingService: {{platform: local}}
notifications:
  webhook: {{url: "{url}"}}"#,
            url = receiver.url
        ),
        &[],
    );
    let mut command = sandbox.knob();
    command
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "deleted"]);
    let mut experiment = crate::api::start(command, &[]);
    wait_for("a trial that succeeded", || {
        let (_, trials) = crate::api::get(&experiment.base, "/trials");
        trials.to_string().contains("SUCCEEDED")
    });
    // knob writes into the folder as it goes, so a file made during the removal can leave a
    // directory not empty ("Directory not empty"): removed again, a bounded number of times.
    let folder = sandbox.path().join("experiments/deleted");
    let mut tries = 0;
    while let Err(e) = std::fs::remove_dir_all(&folder) {
        if !folder.exists() {
            break;
        }
        tries += 1;
        assert!(tries < 50, "cannot remove {folder:?}: {e}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = experiment.wait_exit(Duration::from_secs(60));
    assert!(status.is_some_and(|status| !status.success()), "{status:?}");
    wait_for("the ERROR post", || !receiver.received().is_empty());
    let posts = receiver.received();
    assert_eq!(posts.len(), 1, "{posts:#?}");
    let json = posts[0].json();
    assert_eq!(json["knob"]["event"], "error", "{json}");
    assert_eq!(json["knob"]["status"], "ERROR", "{json}");
    let message = json["knob"]["message"].as_str().unwrap();
    assert!(
        message.contains("the experiment's files were deleted while it ran"),
        "{json}"
    );
    assert!(
        json["knob"]["trials"]["SUCCEEDED"].as_u64() >= Some(1),
        "{json}"
    );
}

/// Once a run is over its process may linger (its end notification, up to 90 s): its API is
/// closed then, and `knob update` said "is not running (RUNNING)". A stop then gives up on the
/// notifications at once; it waited them out.
#[test]
fn while_the_run_is_ending_an_update_says_so_and_a_stop_gives_up_the_notifications() {
    let sandbox = Sandbox::new();
    // Accepts and never answers: the process waits on its end notification.
    let (address, held) = never_answering();
    let url = format!("http://{address}{WEBHOOK_PATH}");
    let config = sandbox.config(
        &format!("{EXPERIMENT}\nnotifications:\n  webhook: {{url: \"{url}\"}}"),
        &[],
    );
    let child = sandbox
        .create_command(&config, "ending")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    // Before the run: not registered yet; during it: updated; then, its run over, ending.
    let said = loop {
        let (code, _, stderr) = run(sandbox
            .knob()
            .args(["update", "concurrency", "ending", "3"]));
        if code != 0 && stderr.contains("ending is ") && !stderr.contains("no experiment") {
            break stderr;
        }
        assert!(Instant::now() < deadline, "{stderr}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        said.trim(),
        "error: experiment ending is ending: its run is over and its process is closing; `knob resume ending` continues it once that process has exited"
    );
    // The list says how the run ended, as `experiment show` does, while the process closes.
    let (code, list, _) = run(sandbox.knob().args(["experiment", "list"]));
    assert_eq!(code, 0);
    assert!(
        list.lines()
            .any(|l| l.starts_with("ending ") && l.contains(" DONE ")),
        "{list}"
    );
    // Resume and delete say the same, not "is running" against a list that says DONE.
    for command in [
        &["resume", "ending"][..],
        &["experiment", "delete", "ending", "--yes"],
    ] {
        let (code, _, stderr) = run(sandbox.knob().args(command));
        assert_eq!(code, 1, "{command:?}");
        assert!(
            stderr.starts_with("error: experiment ending has ended (DONE) and its process ")
                && stderr.contains(" is sending its last notifications (at most 90s); wait for it to exit, or `knob stop ending` gives them up"),
            "{command:?}: {stderr}"
        );
    }
    // Past 3 s of that wait the run says what it waits for (it looked hung, its bar at done).
    std::thread::sleep(Duration::from_secs(4));
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "ending"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("note: experiment ending's process was sending its last notifications; the stop gave up on them"),
        "{stdout}\n{stderr}"
    );
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("note: the experiment has ended; waiting for its last notifications to be sent, at most ")
            && stderr.contains("s more (Ctrl-C gives up on them)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: notifications: not all sent; given up on (SIGTERM or knob stop)"),
        "{stderr}"
    );
    assert!(!held.lock().unwrap().is_empty(), "no notification was sent");
}

/// A webhook that redirects is not followed: ureq turned the POST into a GET without the message,
/// sent the secret header on to the host the redirect named, and `notify test` said "sent". A
/// sink that accepts and never answers is told as such (it was "timeout: global" and "Resource
/// temporarily unavailable (os error 11)").
#[test]
fn a_redirecting_webhook_is_not_followed_and_a_silent_server_is_named_as_one() {
    let sandbox = Sandbox::new();
    // Where the redirect points: it must receive nothing.
    let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
    elsewhere.set_nonblocking(true).unwrap();
    let to = format!("http://{}/taken", elsewhere.local_addr().unwrap());
    let redirecting = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}{WEBHOOK_PATH}", redirecting.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut stream in redirecting.incoming().flatten() {
            let mut request = [0u8; 65536];
            let _ = stream.read(&mut request);
            let _ = write!(
                stream,
                "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    // Accepts and never answers.
    let (silent, _held) = never_answering();
    let silent_port = silent.port();
    let config = sandbox.config(
        &format!(
            "{EXPERIMENT}
notifications:
  webhook: {{url: \"{url}\", secret: {WEBHOOK_SECRET}}}
  email: {{host: 127.0.0.1, port: {silent_port}, security: none, to: [me@example.com], from: knob@example.com}}"
        ),
        &[],
    );
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .args(["notify", "test", "--config"])
        .arg(&config));
    assert_eq!(code, 1, "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].ends_with(": failed: the server answered 302 Found, a redirect, which knob does not follow (the secret would go along): give the URL it redirects to"),
        "{stdout}"
    );
    assert_eq!(
        lines[1],
        format!(
            "email to me@example.com via 127.0.0.1:{silent_port}: failed: no answer within 15 s"
        )
    );
    assert!(elsewhere.accept().is_err(), "the redirect was followed");
}

/// An aiosmtpd speaking STARTTLS with a certificate for `names` (openssl's `subjectAltName`),
/// signed by a CA of its own; the server and that CA's certificate.
fn starttls_smtpd(sandbox: &Sandbox, python: &Path, names: &str) -> Option<(Smtpd, PathBuf)> {
    let (ca, cert, key) = certificates_for(&sandbox.path().join("tls"), names)?;
    let smtpd = Smtpd::start(
        python,
        &sandbox.path().join("smtpd"),
        &[
            "--cert",
            cert.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ],
    );
    Some((smtpd, ca))
}

/// `knob notify test` of mail to `smtpd` at localhost over STARTTLS, `extra` appended to the
/// `email` mapping (`, caFile: ...`); its exit code, stdout (the port written `PORT`), stderr.
fn notify_test_starttls(sandbox: &Sandbox, smtpd: &Smtpd, extra: &str) -> (i32, String, String) {
    let config = sandbox.config(
        &format!(
            "{EXPERIMENT}\nnotifications:\n  email: {{host: localhost, port: {}, security: starttls, from: knob@example.com, to: me@example.com{extra}}}",
            smtpd.port
        ),
        &[],
    );
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .args(["notify", "test", "--config"])
        .arg(&config));
    (
        code,
        stdout.replace(&smtpd.port.to_string(), "PORT"),
        stderr,
    )
}

/// A server whose certificate a private CA signed, without `caFile`: the failure was rustls's
/// "invalid peer certificate: UnknownIssuer" alone, which named neither caFile nor the CA.
#[test]
fn a_private_cas_server_without_ca_file_says_to_give_it() {
    let Some(python) = prerequisite::SMTPD_PYTHON.path() else {
        return;
    };
    let sandbox = Sandbox::new();
    let Some((smtpd, ca)) = starttls_smtpd(&sandbox, &python, "DNS:localhost,IP:127.0.0.1") else {
        return;
    };
    let (code, stdout, stderr) = notify_test_starttls(&sandbox, &smtpd, "");
    assert_eq!(code, 1, "{stdout}{stderr}");
    expect![[r#"
        email to me@example.com via localhost:PORT: failed: network error: invalid peer certificate: UnknownIssuer; the server's certificate is not signed by a CA knob trusts (Mozilla's roots): give its CA's certificate (PEM) as notifications.email.caFile
    "#]]
    .assert_eq(&stdout);
    let (code, stdout, stderr) =
        notify_test_starttls(&sandbox, &smtpd, &format!(", caFile: {}", ca.display()));
    assert_eq!(code, 0, "{stdout}{stderr}");
    wait_for("the test mail", || smtpd.mails().len() == 1);
}

/// Mail to a server whose certificate names another host than `host` failed with rustls's
/// words alone ("certificate not valid for name"), naming neither the setting nor the fix.
#[test]
fn a_server_certificate_for_another_name_says_to_write_a_name_it_holds() {
    let Some(python) = prerequisite::SMTPD_PYTHON.path() else {
        return;
    };
    let sandbox = Sandbox::new();
    let Some((smtpd, ca)) = starttls_smtpd(&sandbox, &python, "DNS:mail.example.com") else {
        return;
    };
    let (code, stdout, stderr) =
        notify_test_starttls(&sandbox, &smtpd, &format!(", caFile: {}", ca.display()));
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.trim_end().ends_with(
            "; the server's certificate is not for localhost, the host knob connects to: set notifications.email.host to a name the certificate holds (its subject alternative names)"
        ),
        "{stdout}{stderr}"
    );
}

/// An `https://` webhook URL whose port serves plain HTTP failed with rustls's words alone
/// ("received corrupt message of type InvalidContentType"), naming neither TLS nor the scheme.
#[test]
fn an_https_webhook_on_a_plain_http_port_says_the_server_does_not_speak_tls() {
    let sandbox = Sandbox::new();
    let plain = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}{WEBHOOK_PATH}", plain.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut stream in plain.incoming().flatten() {
            let mut request = [0u8; 65536];
            let _ = stream.read(&mut request);
            let _ = write!(
                stream,
                "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    let config = sandbox.config(
        &format!("{EXPERIMENT}\nnotifications:\n  webhook: {{url: \"{url}\"}}"),
        &[],
    );
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .args(["notify", "test", "--config"])
        .arg(&config));
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.trim_end().ends_with(": failed: io: received corrupt message of type InvalidContentType; the server on that port does not speak TLS: write http:// for a plain HTTP server (only on a trusted network), or give the port it serves HTTPS on"),
        "{stdout}"
    );
    assert!(!stdout.contains(WEBHOOK_PATH), "{stdout}");
}

/// A webhook that accepts and reads every request and never answers; keeps each request's
/// `knob.event`, in the order they came.
struct Silent {
    url: String,
    events: Arc<Mutex<Vec<String>>>,
}

impl Silent {
    fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}{WEBHOOK_PATH}", listener.local_addr().unwrap());
        let events = Arc::new(Mutex::new(Vec::new()));
        let keep = events.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming().flatten() {
                let keep = keep.clone();
                let reader = stream.try_clone().unwrap();
                held.push(stream);
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(reader);
                    let mut length = 0;
                    let mut line = String::new();
                    while reader.read_line(&mut line).unwrap_or(0) > 0 && !line.trim().is_empty() {
                        if let Some((key, value)) = line.trim_end().split_once(':') {
                            if key.eq_ignore_ascii_case("content-length") {
                                length = value.trim().parse().unwrap_or(0);
                            }
                        }
                        line.clear();
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_ok() {
                        let body: Value = serde_json::from_slice(&body).unwrap();
                        let event = body["knob"]["event"].as_str().unwrap_or("?").to_owned();
                        keep.lock().unwrap().push(event);
                    }
                });
            }
        });
        Silent { url, events }
    }

    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }
}

/// The end of the experiment goes before what waits for a sink that does not answer: in a
/// strict queue, the DONE waited for the new bests before it (the first had 4 tries of 15 s) and
/// got its first try 83 s after the end, of the 90 s `knob create` waits. Now it is tried once
/// the try under way runs out. A stop that gives up on it names the message and the sink.
#[test]
fn the_end_message_goes_before_the_messages_a_silent_sink_holds_up() {
    let sandbox = Sandbox::new();
    let silent = Silent::start();
    let config = sandbox.config(
        &format!(
            "{EXPERIMENT}\nnotifications:\n  newBest: true\n  webhook: {{url: \"{url}\"}}",
            url = silent.url
        ),
        &[],
    );
    let child = sandbox
        .create_command(&config, "first")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the first new best's try", || !silent.events().is_empty());
    // That try runs out at 15 s; the DONE is tried then, not after the new bests' tries.
    wait_for("the end's first try", || {
        silent.events().iter().any(|event| event == "done")
    });
    assert_eq!(silent.events()[0], "new_best");
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "first"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "not sent (1 try): no answer within 15 s; the experiment ended, and its end message goes first"
        ),
        "{stderr}"
    );
    let host = silent.url.strip_suffix(WEBHOOK_PATH).unwrap();
    let closing = stderr
        .lines()
        .find(|line| line.contains("not all sent"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        closing.starts_with("warning: notifications: not all sent; given up on (SIGTERM or knob stop): the end message \"knob: experiment first DONE, best ")
            && closing.ends_with(&format!("\" was not delivered to webhook {host}/…")),
        "{closing}"
    );
}

/// `knob stop` of a run whose webhook accepts and never answers: the run recorded STOPPED at
/// once, then sent its end notification for up to 90 s, and the stop waited all that time
/// saying "its running trials are being killed". It now says what it waits for (and how to cut
/// it short), and a second stop gives up on the notifications.
#[test]
fn a_stop_waiting_for_the_last_notifications_says_so() {
    let sandbox = Sandbox::new();
    // Accepts and never answers.
    let (address, held) = never_answering();
    let url = format!("http://{address}{WEBHOOK_PATH}");
    let config = sandbox.config(
        &format!(
            "trialCommand: touch started; sleep 60\ntrialConcurrency: 1\nmaxTrialNumber: 2\n\
             searchSpace:\n  x: {{_type: randint, _value: [0, 1000]}}\n\
             tuner:\n  name: Random\ntrainingService:\n  platform: local\n\
             notifications:\n  webhook: {{url: \"{url}\"}}"
        ),
        &[],
    );
    let child = sandbox
        .create_command(&config, "muted")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = sandbox.path().join("code/started");
    wait_for("the trial's start", || started.exists());
    let mut stop = sandbox
        .knob()
        .args(["stop", "muted"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its lines, as they come, until it names the notifications (bounded: it waited ~67 s).
    let (lines, said) = std::sync::mpsc::channel();
    let stop_err = stop.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stop_err).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen
        .iter()
        .any(|l: &String| l.contains("last notifications"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match said.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("the stop did not name the notifications in 30 s: {seen:?}"),
        }
    }
    assert_eq!(
        seen,
        ["experiment muted has recorded its end (STOPPED); waiting for its process to send its last notifications, at most 90s (`knob stop muted` again gives up on them)"
            .replace("its process", &format!("its process {}", child.id()))],
    );
    // The second stop gives up on them: both end at once, STOPPED.
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "muted"]));
    let stopped = "experiment muted stopped (STOPPED); continue it with `knob resume muted`\n";
    assert_eq!((code, stdout.as_str()), (0, stopped), "{stderr}");
    let code = crate::resume::wait_bounded(&mut stop, Duration::from_secs(10));
    let mut stdout = String::new();
    stop.stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert_eq!((code, stdout.as_str()), (Some(0), stopped));
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: notifications: not all sent; given up on (SIGTERM or knob stop)"),
        "{stderr}"
    );
    assert!(!held.lock().unwrap().is_empty(), "no notification was sent");
}

/// A loopback listener that accepts connections and never answers (a sink that hangs), and
/// the connections it holds open.
fn never_answering() -> (std::net::SocketAddr, Arc<Mutex<Vec<std::net::TcpStream>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let holding = held.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            holding.lock().unwrap().push(stream);
        }
    });
    (address, held)
}
