//! `knob create` over SSH end to end: real `sshd` servers on 127.0.0.1 (each with its own port,
//! host key and client key; one with password login), the real `remote` training service and
//! the real `knob-agent` (built by `cargo build --workspace` beside `knob`).
//!
//! Gated by `KNOB_TEST_SSHD` (the sshd binary; see `prerequisite.rs`), the password tests also by
//! root, `unshare` and `openssl`: without them a test says it skips, or fails under
//! `KNOB_TEST_REQUIRE_ALL=1`.

#[path = "../../../training-services/tests/it/sshd.rs"]
pub(crate) mod sshd;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sshd::{Sshd, SshdOptions};

use crate::create::Sandbox;
use crate::run;

/// The password of the password-login host: a string that appears nowhere else, so that finding
/// it in a file means it leaked.
const PASSWORD: &str = "pw-9f3c1e7a-knob-leak-check";

/// How long a whole experiment of a test may take.
const EXPERIMENT_LIMIT: Duration = Duration::from_secs(180);

pub(crate) fn key_host(sshd: &Path, env: &[(&str, &str)]) -> Sshd {
    Sshd::start(
        sshd,
        SshdOptions {
            key_auth: true,
            password: None,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..SshdOptions::default()
        },
    )
    .expect("start sshd")
}

fn password_host(sshd: &Path, env: &[(&str, &str)]) -> Sshd {
    Sshd::start(
        sshd,
        SshdOptions {
            key_auth: false,
            password: Some(PASSWORD.to_string()),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..SshdOptions::default()
        },
    )
    .expect("start sshd with password login")
}

pub(crate) fn environment_id(host: &Sshd) -> String {
    format!("remote:{}@127.0.0.1:{}", host.user(), host.port())
}

fn machine(host: &Sshd) -> String {
    match host.password() {
        Some(password) => format!(
            "{{host: 127.0.0.1, port: {}, user: {}, password: '{password}'}}",
            host.port(),
            host.user()
        ),
        None => format!(
            "{{host: 127.0.0.1, port: {}, user: {}, sshKeyFile: '{}'}}",
            host.port(),
            host.user(),
            host.client_key_path().display()
        ),
    }
}

/// Writes a known_hosts file naming `hosts` and returns its path.
fn known_hosts(sandbox: &Sandbox, hosts: &[&Sshd]) -> PathBuf {
    let path = sandbox.path().join("known_hosts");
    let lines: String = hosts
        .iter()
        .map(|host| host.known_hosts_line() + "\n")
        .collect();
    std::fs::write(&path, lines).unwrap();
    path
}

/// How long a trial waits at [`barrier`] at most.
const BARRIER_LIMIT_SECS: u32 = 120;

/// A trial-command prefix that holds each trial until trials have started on `environments`
/// different environments, at most [`BARRIER_LIMIT_SECS`] (then it goes on, and the test's own
/// check that every environment ran a trial fails). Tests that check each host ran a trial use
/// it so that the hosts ready first cannot run every trial while a slower one (a password
/// login on a loaded machine) still sets up: with a per-environment limit (`cpu=N` hosts and
/// `trialCpuNumber: 1`, or simulated GPUs) and `trialConcurrency` above what all but one
/// environment can take, a trial is always left waiting for the last one.
///
/// The "hosts" are sshd servers on this machine, so they share the sandbox: each trial marks
/// its environment there, named by its host's `KNOB_TEST_SSHD_MARK` folder (`local` on this
/// machine, where the variable is not set).
fn barrier(sandbox: &Sandbox, environments: usize) -> String {
    let dir = sandbox.path().join("barrier");
    std::fs::create_dir_all(&dir).unwrap();
    let dir = dir.display();
    format!(
        "touch \"{dir}/$(basename \"${{KNOB_TEST_SSHD_MARK:-local}}\")\" && \
         end=$(($(date +%s) + {BARRIER_LIMIT_SECS})) && \
         while [ \"$(ls \"{dir}\" | wc -l)\" -lt {environments} ] && [ \"$(date +%s)\" -lt \"$end\" ]; \
         do sleep 0.1; done; "
    )
}

/// The config of a remote (or hybrid) experiment. `machines` are machineList entries; `extra`
/// more top-level lines.
/// What a test's experiment looks like.
struct Spec<'a> {
    trial_command: &'a str,
    concurrency: u32,
    trials: u32,
    /// machineList entries.
    machines: &'a [String],
    known_hosts: &'a Path,
    /// A local service too.
    hybrid: bool,
    /// More top-level config lines.
    extra: &'a str,
}

impl<'a> Spec<'a> {
    /// One trivial trial on `machines`: for tests about connecting, not about running.
    fn one_trial(machines: &'a [String], known_hosts: &'a Path) -> Spec<'a> {
        Spec {
            trial_command: "echo KNOB_FINAL 1",
            concurrency: 1,
            trials: 1,
            machines,
            known_hosts,
            hybrid: false,
            extra: "",
        }
    }
}

/// The `error:` line `knob create` printed on stderr.
fn error_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|line| line.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"))
}

fn remote_config(sandbox: &Sandbox, spec: Spec<'_>) -> PathBuf {
    let Spec {
        trial_command,
        concurrency,
        trials,
        machines,
        known_hosts,
        hybrid,
        extra,
    } = spec;
    let local = if hybrid { "  - platform: local\n" } else { "" };
    let trial_command = format!("'{}'", trial_command.replace('\'', "''"));
    let machine_list: String = machines
        .iter()
        .map(|m| format!("        - {m}\n"))
        .collect();
    let yaml = format!(
        "searchSpace:
  x: {{_type: randint, _value: [0, 1000000]}}
tuner:
  name: Random
  classArgs: {{seed: 3}}
trialCommand: {trial_command}
trialConcurrency: {concurrency}
maxTrialNumber: {trials}
{extra}
trainingService:
{local}  - platform: remote
    knownHostsFile: {known_hosts}
    agentRoot: {agent_root}
    hostLossTimeout: 3s
    machineList:
{machine_list}",
        known_hosts = known_hosts.display(),
        agent_root = sandbox.path().join("agent").display(),
    );
    sandbox.config(&yaml, &[])
}

/// Where each trial's attempts ran: (trial id, [(environment, status, message)]).
/// One attempt: (environment, status, message).
type Attempt = (String, Option<String>, Option<String>);

fn attempts(export: &Value) -> Vec<(String, Vec<Attempt>)> {
    export["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|trial| {
            let history = trial["attempt_history"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| {
                    (
                        a["environment_id"].as_str().unwrap().to_string(),
                        a["status"].as_str().map(str::to_string),
                        a["message"].as_str().map(str::to_string),
                    )
                })
                .collect();
            (trial["id"].as_str().unwrap().to_string(), history)
        })
        .collect()
}

/// Every file under `dir`, read as bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                found.push((path, bytes));
            }
        }
    }
    found
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// `knob create` in the background, for tests that act while it runs.
fn spawn_create(sandbox: &Sandbox, config: &Path, id: &str) -> Child {
    sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(config)
        .args(["--id", id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start knob create")
}

/// Waits (bounded) for the experiment to finish; returns (exit code, stdout, stderr).
fn wait_create(mut child: Child) -> (i32, String, String) {
    let deadline = Instant::now() + EXPERIMENT_LIMIT;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Polls the store (through `knob experiment export`) until `ready` holds for it, bounded.
pub(crate) fn wait_for(sandbox: &Sandbox, id: &str, what: &str, ready: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        let (code, stdout, _) =
            run(sandbox
                .knob()
                .args(["experiment", "export", id, "--format", "json"]));
        if code == 0 {
            if let Ok(export) = serde_json::from_str::<Value>(&stdout) {
                if ready(&export) {
                    return;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("timed out waiting for {what}");
}

pub(crate) fn running_on(export: &Value, environment: &str) -> usize {
    export["trials"]
        .as_array()
        .map(|trials| {
            trials
                .iter()
                .filter(|t| t["status"] == "RUNNING")
                .filter(|t| {
                    t["attempt_history"]
                        .as_array()
                        .and_then(|h| h.last())
                        .is_some_and(|a| a["environment_id"] == environment)
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn an_experiment_spreads_over_three_hosts_with_key_and_password_login_and_keeps_no_password() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    if !sshd::password_login() {
        return;
    }
    // One trial at a time per host (one CPU each, one per trial), three at once: see
    // [`barrier`].
    let one_cpu = [("KNOB_SIMULATE_GPUS", "cpu=1")];
    let hosts = [
        key_host(&sshd, &one_cpu),
        key_host(&sshd, &one_cpu),
        password_host(&sshd, &one_cpu),
    ];
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &hosts.iter().collect::<Vec<_>>());
    let machines: Vec<String> = hosts.iter().map(machine).collect();
    // The config (with the password) sits in the trial code directory, as NNI users keep it,
    // with no ignore file: it is left out of the upload all the same. The trials check that the
    // rest of the code is there and the config is not.
    std::fs::create_dir_all(sandbox.path().join("code")).unwrap();
    std::fs::write(sandbox.path().join("code/helper.txt"), "trial code\n").unwrap();
    let config = remote_config(
        &sandbox,
        Spec {
            trial_command: &format!(
                "{}test -f helper.txt && test ! -e config.yml && echo KNOB_FINAL 1",
                barrier(&sandbox, hosts.len())
            ),
            concurrency: 3,
            trials: 9,
            machines: &machines,
            known_hosts: &known,
            hybrid: false,
            extra: "trialCpuNumber: 1",
        },
    );
    let (code, stdout, stderr) = sandbox.create(&config, "spread");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment spread DONE: 9 trials (9 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
    let export = sandbox.export("spread");
    let history = attempts(&export);
    for host in &hosts {
        let environment = environment_id(host);
        assert!(
            history
                .iter()
                .any(|(_, attempts)| attempts.iter().any(|(env, _, _)| *env == environment)),
            "no trial ran on {environment}: {history:?}"
        );
    }
    for (trial, attempts) in &history {
        assert_eq!(attempts.len(), 1, "{trial}: {attempts:?}");
    }

    // The password is nowhere: not in the store, logs or any file of the experiment, nor in
    // what `knob experiment show` and `export` print.
    let experiment_dir = sandbox.path().join("experiments").join("spread");
    for (path, bytes) in files_under(&experiment_dir) {
        assert!(
            !contains(&bytes, PASSWORD),
            "{} holds the password",
            path.display()
        );
    }
    for (path, bytes) in files_under(&sandbox.path().join("home")) {
        assert!(
            !contains(&bytes, PASSWORD),
            "{} holds the password",
            path.display()
        );
    }
    // Nor on the hosts: the agent's folder holds the uploaded code, daemons' logs and trials.
    let on_hosts = files_under(&sandbox.path().join("agent"));
    assert!(
        on_hosts.len() > 3,
        "nothing under the agent root? {on_hosts:?}"
    );
    let names = |name: &str| {
        on_hosts
            .iter()
            .filter(|(path, _)| path.file_name().is_some_and(|n| n == name))
            .count()
    };
    assert!(names("helper.txt") > 0, "no trial code on the hosts");
    assert_eq!(names("config.yml"), 0, "the config was uploaded");
    for (path, bytes) in on_hosts {
        assert!(
            !contains(&bytes, PASSWORD),
            "{} holds the password",
            path.display()
        );
    }
    // Said once, as a note: nothing is asked of the user.
    let notes: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("holds a secret (trainingService[0].machineList["))
        .collect();
    assert!(
        notes.len() == 1
            && notes[0].starts_with("note: ")
            && notes[0]
                .contains("left out of the code that training services copy to other machines"),
        "{stderr}"
    );
    assert!(!export.to_string().contains(PASSWORD));
    let (_, shown, _) = run(sandbox.knob().args(["experiment", "show", "spread"]));
    assert!(shown.contains("\"password\":\"***\""), "{shown}");
    assert!(!shown.contains(PASSWORD));
    assert!(!stdout.contains(PASSWORD) && !stderr.contains(PASSWORD));
    assert_api_never_serves(&sandbox, "spread", PASSWORD);
}

/// Serves the finished experiment read-only (`knob view`) and reads every route that returns
/// the experiment or its config; none may hold `secret`.
fn assert_api_never_serves(sandbox: &Sandbox, id: &str, secret: &str) {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut view = sandbox
        .knob()
        .args(["view", id, "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}/api/v1");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut bodies = Vec::new();
    for route in ["/experiment", "/trials", "/events"] {
        loop {
            match ureq::get(&format!("{base}{route}")).call() {
                Ok(mut response) => {
                    bodies.push((route, response.body_mut().read_to_string().unwrap()));
                    break;
                }
                Err(ureq::Error::StatusCode(_)) => break,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => panic!("knob view did not answer {route}: {e}"),
            }
        }
    }
    let _ = view.kill();
    let _ = view.wait();
    assert!(
        bodies.iter().any(|(_, body)| body.contains("machineList")),
        "no route served the config: {bodies:?}"
    );
    for (route, body) in bodies {
        assert!(
            !body.contains(secret),
            "{route} serves the password: {body}"
        );
    }
}

#[test]
fn a_hybrid_experiment_runs_trials_locally_and_remotely() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    // One trial at a time on each side (one CPU each, one per trial), two at once: see
    // [`barrier`].
    let host = key_host(&sshd, &[("KNOB_SIMULATE_GPUS", "cpu=1")]);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&host]);
    let config = remote_config(
        &sandbox,
        Spec {
            trial_command: &format!("{}echo KNOB_FINAL 2", barrier(&sandbox, 2)),
            concurrency: 2,
            trials: 8,
            machines: &[machine(&host)],
            known_hosts: &known,
            hybrid: true,
            extra: "trialCpuNumber: 1",
        },
    );
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "cpu=1")
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "hybrid"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment hybrid DONE: 8 trials (8 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
    let history = attempts(&sandbox.export("hybrid"));
    for environment in ["local".to_string(), environment_id(&host)] {
        assert!(
            history
                .iter()
                .any(|(_, attempts)| attempts.iter().any(|(env, _, _)| *env == environment)),
            "no trial ran on {environment}: {history:?}"
        );
    }
    // A remote trial's stdout stays on its host: the API says so, not that it wrote none.
    let (remote_trial, _) = history
        .iter()
        .find(|(_, attempts)| attempts[0].0 == environment_id(&host))
        .unwrap();
    let mut command = sandbox.knob();
    command.args(["view", "hybrid", "--port", "0"]);
    let view = crate::api::start(command, &[]);
    let (status, body) =
        crate::api::get(&view.base, &format!("/trials/{remote_trial}/logs/stdout"));
    assert_eq!(status, 404, "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "trial {remote_trial} ran on {}: its stdout is in its folder there",
            environment_id(&host)
        )),
        "{message}"
    );
}

#[test]
fn an_unknown_host_key_is_refused_with_a_clear_message() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let host = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[]);
    let config = remote_config(&sandbox, Spec::one_trial(&[machine(&host)], &known));
    let (code, stdout, stderr) = sandbox.create(&config, "unknownkey");
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    let error = error_line(&stderr);
    assert!(error.contains("unknown host key"), "{error}");
    assert!(
        error.contains(&format!("127.0.0.1:{}", host.port())),
        "{error}"
    );
    assert!(error.contains("acceptNewHostKey"), "{error}");

    // With acceptNewHostKey the same host is accepted and its key recorded.
    let accepting = machine(&host).replace('}', ", acceptNewHostKey: true}");
    let config = remote_config(&sandbox, Spec::one_trial(&[accepting], &known));
    let (code, stdout, stderr) = sandbox.create(&config, "acceptkey");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let recorded = std::fs::read_to_string(&known).unwrap();
    let key = host.known_hosts_line();
    let key_material = key.split_whitespace().nth(2).unwrap();
    assert!(recorded.contains(key_material), "{recorded}");
}

/// NNI's default key is `~/.ssh/id_rsa`, read with the machine's `ssh_passphrase`: a machine
/// with `sshPassphrase` and no `sshKeyFile` works under NNI. knob read its default keys without
/// the passphrase and said "no credentials", naming only `id_ed25519`.
#[test]
fn the_default_rsa_key_is_read_with_the_machines_passphrase_and_named_when_it_cannot_be() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let host = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let home = sandbox.path().join("user-home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    let passphrase = "MyPassPhr4se";
    let public_key =
        sshd::generate_key_of_type(&home.join(".ssh/id_rsa"), "rsa", passphrase).unwrap();
    host.authorize(&public_key).unwrap();
    let known = known_hosts(&sandbox, &[&host]);
    let create = |machine: String, id: &str| {
        let config = remote_config(&sandbox, Spec::one_trial(&[machine], &known));
        let mut command = sandbox.create_command(&config, id);
        command.env("HOME", &home).env_remove("SSH_AUTH_SOCK");
        run(&mut command)
    };
    let without_key = format!(
        "{{host: 127.0.0.1, port: {}, user: {}",
        host.port(),
        host.user()
    );

    let (code, stdout, stderr) = create(
        format!("{without_key}, sshPassphrase: {passphrase}}}"),
        "defaultrsa",
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");

    let (code, stdout, stderr) = create(format!("{without_key}}}"), "nophrase");
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    let error = error_line(&stderr);
    let skipped = format!(
        "{} skipped: it is encrypted and the machine gives no sshPassphrase",
        home.join(".ssh/id_rsa").display()
    );
    assert!(
        error.contains("no credentials") && error.contains(&skipped),
        "{error}"
    );
}

#[test]
fn a_host_unreachable_at_start_is_named_and_the_others_run_the_experiment() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let host = key_host(&sshd, &[]);
    let mut gone = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&host, &gone]);
    gone.kill_host();
    // One line says it, with the reason (it was three: the service's, the core's without a
    // reason, the host's).
    let about_gone = the_line_about_a_host_not_up(&sandbox, &known, &host, &machine(&gone), 4);
    assert!(
        about_gone.contains("cannot connect: connection refused"),
        "{about_gone}"
    );
}

/// A host that takes the connection and never answers (a hung sshd, a firewall that swallows
/// the banner) takes 20 s to time out: the experiment runs on the host that is up meanwhile,
/// and says once why the silent one is not used.
#[test]
fn a_silent_host_does_not_hold_the_experiment_on_the_host_that_is_up() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let host = key_host(&sshd, &[]);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&host]);
    let silent_machine = machine(&host).replace(
        &format!("port: {}", host.port()),
        &format!("port: {silent_port}"),
    );
    let about_silent = the_line_about_a_host_not_up(&sandbox, &known, &host, &silent_machine, 2);
    drop(silent);
    assert!(
        about_silent.contains("still connecting; no trial starts there until it is"),
        "{about_silent}"
    );
}

/// Runs `trials` trivial trials, two at a time, on `host` and on the machineList entry
/// `not_up`; every trial succeeds on `host`. Returns the one line of the run's stderr that
/// names `not_up`'s address: a warning about its environment.
fn the_line_about_a_host_not_up(
    sandbox: &Sandbox,
    known: &Path,
    host: &Sshd,
    not_up: &str,
    trials: u32,
) -> String {
    let machines = [machine(host), not_up.to_string()];
    let config = remote_config(
        sandbox,
        Spec {
            trial_command: "echo KNOB_FINAL 1",
            concurrency: 2,
            trials,
            machines: &machines,
            known_hosts: known,
            hybrid: false,
            extra: "",
        },
    );
    let (code, stdout, stderr) = sandbox.create(&config, "onenotup");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with(&format!(
            "experiment onenotup DONE: {trials} trials ({trials} succeeded, 0 failed)"
        )),
        "{stdout}\n{stderr}"
    );
    let port = not_up
        .split("port: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap();
    let address = format!("127.0.0.1:{port}");
    let about: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains(&address))
        .collect();
    assert!(
        about.len() == 1 && about[0].starts_with("warning: environment "),
        "not one warning names {address}: {stderr}"
    );
    let history = attempts(&sandbox.export("onenotup"));
    assert!(history
        .iter()
        .all(|(_, a)| a.iter().all(|(env, _, _)| *env == environment_id(host))));
    about[0].to_string()
}

/// The only host's sshd is not up when the experiment starts, and comes up a few seconds
/// later: knob keeps trying it, its trials wait for it saying so, and run once it answers.
/// The experiment ended in ERROR at once ("no environment can run trials") while the service
/// still tried the host.
#[test]
fn the_only_host_not_up_at_start_is_waited_for_and_runs_the_experiment_once_up() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let mut host = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&host]);
    let machines = [machine(&host)];
    host.kill_host();
    let config = remote_config(
        &sandbox,
        Spec {
            trials: 2,
            ..Spec::one_trial(&machines, &known)
        },
    );
    let child = spawn_create(&sandbox, &config, "late");
    wait_until("a trial waiting for the host", || {
        stored_events(&sandbox, "late", "warning", "not reached yet") > 0
    });
    let (_, listing, _) = run(sandbox.knob().args(["trial", "ls", "late"]));
    let env = environment_id(&host);
    assert!(
        listing.contains("WAITING")
            && listing.contains(&format!(
                "waiting for {env} (127.0.0.1:{}), not reached yet: ",
                host.port()
            ))
            && listing.contains("connection refused"),
        "{listing}"
    );
    // `experiment show` says it too, for the experiment as a whole.
    let (_, shown, _) = run(sandbox.knob().args(["experiment", "show", "late"]));
    assert!(
        shown.lines().any(|line| line.starts_with("waiting:   ")
            && line.contains(&format!(
                "waiting for {env} (127.0.0.1:{}), not reached yet: ",
                host.port()
            ))),
        "{shown}"
    );
    host.restart().expect("sshd starts");
    let (code, stdout, stderr) = wait_create(child);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment late DONE: 2 trials (2 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "environment {env} (127.0.0.1:{}) is not ready: ",
            host.port()
        )) && stderr.contains("knob keeps trying it")
            && stderr.contains(&format!(
                "environment {env} (127.0.0.1:{}) is ready",
                host.port()
            )),
        "{stderr}"
    );
}

#[test]
fn a_host_killed_mid_experiment_has_its_trials_run_again_elsewhere() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    // At most two trials at a time per host (two CPUs, one per trial), four at once: the
    // victim gets trials however late it is ready (see [`barrier`]).
    let two_cpus = [("KNOB_SIMULATE_GPUS", "cpu=2")];
    let survivor = key_host(&sshd, &two_cpus);
    let mut victim = key_host(&sshd, &two_cpus);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&survivor, &victim]);
    let config = remote_config(
        &sandbox,
        Spec {
            trial_command: &format!("{}sleep 4; echo KNOB_FINAL 1", barrier(&sandbox, 2)),
            concurrency: 4,
            trials: 8,
            machines: &[machine(&survivor), machine(&victim)],
            known_hosts: &known,
            hybrid: false,
            extra: "trialCpuNumber: 1",
        },
    );
    let child = spawn_create(&sandbox, &config, "killed");
    let victim_env = environment_id(&victim);
    wait_for(&sandbox, "killed", "a trial running on the victim", |e| {
        running_on(e, &victim_env) > 0
    });
    victim.kill_host();
    let (code, stdout, stderr) = wait_create(child);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment killed DONE: 8 trials (8 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
    let history = attempts(&sandbox.export("killed"));
    assert_eq!(history.len(), 8);
    let mut moved = 0;
    for (trial, attempts) in &history {
        let (last_env, last_status, _) = attempts.last().unwrap();
        assert_eq!(
            last_status.as_deref(),
            Some("SUCCEEDED"),
            "{trial}: {attempts:?}"
        );
        for (env, status, message) in &attempts[..attempts.len() - 1] {
            assert_eq!(env, &victim_env, "{trial}: {attempts:?}");
            assert_eq!(status.as_deref(), Some("FAILED"), "{trial}: {attempts:?}");
            assert!(
                message.as_deref().is_some_and(|m| m.contains("lost")),
                "{trial}: {attempts:?}"
            );
        }
        if attempts.len() > 1 {
            moved += 1;
            assert_eq!(
                last_env,
                &environment_id(&survivor),
                "{trial}: {attempts:?}"
            );
        }
    }
    assert!(
        moved > 0,
        "no trial was moved off the killed host: {history:?}"
    );
    // Said twice: down (reconnecting), then lost. It was five lines: the service's own log and
    // warning, and the core's changed reason, said the same again.
    let victim_address = format!("127.0.0.1:{}", victim.port());
    let about_victim: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains(&victim_address))
        .collect();
    assert!(
        about_victim.len() == 2
            && about_victim[0].contains(") is not ready: ")
            && about_victim[0].contains("reconnecting for up to")
            && about_victim[1].starts_with(&format!("warning: environment {victim_env} lost: ")),
        "{stderr}"
    );
    // `knob trial ls` shows the attempts and where the last one ran.
    let (_, listing, _) = run(sandbox.knob().args(["trial", "ls", "killed"]));
    assert!(
        listing.lines().next().unwrap().contains("attempts"),
        "{listing}"
    );
    let survivor_env = environment_id(&survivor);
    assert!(
        listing
            .lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .any(|cells| cells.get(2) == Some(&"SUCCEEDED")
                && cells.get(5) == Some(&"2")
                && cells.get(6) == Some(&survivor_env.as_str())),
        "{listing}"
    );
}

/// The agent on an experiment's only host is killed (the OOM killer's SIGKILL) while it runs
/// trials: knob reconnects to a new agent, the trials it lost run again there, and the
/// experiment finishes. The host was forgotten as if lost ("no environment can run trials"),
/// and once that was fixed, the new attempts' events were dropped as the old daemon's and the
/// trials waited for ever. The first attempts, left running by the dead agent, are killed by
/// the new one rather than finishing beside their retries.
#[test]
fn a_killed_agent_is_replaced_and_its_trials_run_again_on_the_same_host() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let host = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&host]);
    // Each attempt that runs to its end leaves a file.
    let ends = sandbox.path().join("ends");
    std::fs::create_dir_all(&ends).unwrap();
    let command = format!(
        "sleep 8; touch '{}/'\"$(basename \"$KNOB_TRIAL_DIR\")-$NNI_TRIAL_JOB_ID\"; echo KNOB_FINAL 1",
        ends.display()
    );
    let config = remote_config(
        &sandbox,
        Spec {
            trial_command: &command,
            concurrency: 2,
            trials: 2,
            machines: &[machine(&host)],
            known_hosts: &known,
            hybrid: false,
            extra: "",
        },
    );
    let child = spawn_create(&sandbox, &config, "agentkilled");
    let env = environment_id(&host);
    wait_for(&sandbox, "agentkilled", "both trials running", |e| {
        running_on(e, &env) == 2
    });
    assert_eq!(host.kill_agent_daemons(), 1);
    let (code, stdout, stderr) = wait_create(child);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment agentkilled DONE: 2 trials (2 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
    for (trial, attempts) in attempts(&sandbox.export("agentkilled")) {
        assert_eq!(attempts.len(), 2, "{trial}: {attempts:?}");
        let (first_env, first_status, message) = &attempts[0];
        assert_eq!(
            (first_env, first_status.as_deref()),
            (&env, Some("FAILED")),
            "{trial}: {attempts:?}"
        );
        assert!(
            message
                .as_deref()
                .is_some_and(|m| m.contains("started again")),
            "{trial}: {attempts:?}"
        );
        assert_eq!(
            (&attempts[1].0, attempts[1].1.as_deref()),
            (&env, Some("SUCCEEDED")),
            "{trial}: {attempts:?}"
        );
    }
    // Only the second attempts ran to their ends.
    let mut ended: Vec<String> = std::fs::read_dir(&ends)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    ended.sort();
    assert!(
        ended.len() == 2 && ended.iter().all(|name| name.starts_with("attempt-2-")),
        "{ended:?}"
    );
}

/// A crashed remote experiment's agent runs its trials on without their manager (until its
/// orphan timeout, 10 minutes). `knob experiment delete` ends them and the agent, and says so,
/// as it does for a local experiment's; it said nothing and ended nothing, the remote service
/// having no clean-up of its own.
#[test]
fn deleting_a_crashed_remote_experiment_ends_its_agent_and_trials_on_the_host() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let host = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&host]);
    let pids = sandbox.path().join("trial.pids");
    let config = remote_config(
        &sandbox,
        Spec {
            trial_command: &format!(
                "echo $$ >> '{}'; sleep 300; echo KNOB_FINAL 1",
                pids.display()
            ),
            concurrency: 2,
            trials: 4,
            machines: &[machine(&host)],
            known_hosts: &known,
            hybrid: false,
            extra: "",
        },
    );
    let mut child = spawn_create(&sandbox, &config, "orphaned");
    let env = environment_id(&host);
    wait_for(&sandbox, "orphaned", "both trials running", |e| {
        running_on(e, &env) == 2
    });
    let trial_pids = || -> Vec<i32> {
        std::fs::read_to_string(&pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while trial_pids().len() < 2 {
        assert!(Instant::now() < deadline, "the trials did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let trials: Vec<String> = sandbox.export("orphaned")["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    child.kill().unwrap();
    child.wait().unwrap();
    let pids = trial_pids();
    assert!(
        pids.iter().all(|&pid| crate::resume::running(pid)),
        "the trials should run on after their manager's crash"
    );

    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "delete", "orphaned", "--yes"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let note = stderr
        .lines()
        .find(|line| line.starts_with("note: killed trials "))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        trials.iter().all(|t| note.contains(t.as_str()))
            && note.contains(&format!(
                "left running on {}@127.0.0.1:{} by an earlier run, and its knob-agent",
                host.user(),
                host.port()
            )),
        "{stderr}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Some(pid) = pids.iter().find(|&&pid| crate::resume::running(pid)) {
        assert!(
            Instant::now() < deadline,
            "trial process {pid} still runs after the delete"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(host.kill_agent_daemons(), 0, "its knob-agent still runs");
}

/// A new experiment reusing an id on a host (the earlier one deleted) ran its trials in the
/// earlier one's code copy on the host, with what those trials changed there: a counter file
/// carried over. The new experiment's first connection empties the host's folder for the id;
/// a resume keeps it.
#[test]
fn a_new_experiment_of_a_deleted_ones_id_starts_from_fresh_code_on_the_host() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let host = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&host]);
    let config = remote_config(
        &sandbox,
        Spec {
            trial_command: "c=$(cat counter 2>/dev/null || echo 0); c=$((c + 1)); echo $c > counter; echo KNOB_FINAL $c",
            ..Spec::one_trial(&[machine(&host)], &known)
        },
    );
    let finals = |sandbox: &Sandbox| -> Vec<f64> {
        sandbox.export("reused")["trials"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["final"].as_f64())
            .collect()
    };
    for round in 0..2 {
        let (code, stdout, stderr) = sandbox.create(&config, "reused");
        assert_eq!(code, 0, "round {round}: {stdout}\n{stderr}");
        assert_eq!(finals(&sandbox), [1.0], "round {round}: {stderr}");
        let (code, _, stderr) =
            run(sandbox
                .knob()
                .args(["experiment", "delete", "reused", "--yes"]));
        assert_eq!(code, 0, "{stderr}");
    }
}

#[test]
fn dropped_connections_lose_and_duplicate_no_trial() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    // At most two trials at a time per host (two CPUs, one per trial), four at once: both
    // hosts get trials however late one is ready (see [`barrier`]).
    let two_cpus = [("KNOB_SIMULATE_GPUS", "cpu=2")];
    let first = key_host(&sshd, &two_cpus);
    let second = key_host(&sshd, &two_cpus);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&first, &second]);
    let config = remote_config(
        &sandbox,
        Spec {
            trial_command: &format!("{}sleep 3; echo KNOB_FINAL 1", barrier(&sandbox, 2)),
            concurrency: 4,
            trials: 8,
            machines: &[machine(&first), machine(&second)],
            known_hosts: &known,
            hybrid: false,
            extra: "trialCpuNumber: 1",
        },
    );
    // Long enough that the hosts are never declared lost while their connections recover.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("hostLossTimeout: 3s", "hostLossTimeout: 60s");
    std::fs::write(&config, text).unwrap();
    let child = spawn_create(&sandbox, &config, "dropped");
    let (first_env, second_env) = (environment_id(&first), environment_id(&second));
    wait_for(&sandbox, "dropped", "trials running on both hosts", |e| {
        running_on(e, &first_env) > 0 && running_on(e, &second_env) > 0
    });
    first.drop_connections();
    second.drop_connections();
    let (code, stdout, stderr) = wait_create(child);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let history = attempts(&sandbox.export("dropped"));
    assert!(
        stdout.starts_with("experiment dropped DONE: 8 trials (8 succeeded, 0 failed)"),
        "{stdout}\n{stderr}\n{history:?}"
    );
    for (trial, attempts) in history {
        assert_eq!(
            attempts.len(),
            1,
            "{trial} ran more than once: {attempts:?}"
        );
        assert_eq!(attempts[0].1.as_deref(), Some("SUCCEEDED"), "{trial}");
    }
}

#[test]
fn simulated_gpus_on_two_hosts_are_never_shared_by_concurrent_trials() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let gpus = [("KNOB_SIMULATE_GPUS", "2x16GiB")];
    let hosts = [key_host(&sshd, &gpus), key_host(&sshd, &gpus)];
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &hosts.iter().collect::<Vec<_>>());
    let config = remote_config(
        &sandbox,
        Spec {
            // Two GPUs per host, four trials at once: both hosts get trials however late one is
            // ready (see [`barrier`]).
            trial_command: &format!(
                r#"{}sleep 2; echo "KNOB_FINAL {{\"default\": 1, \"gpus\": \"$CUDA_VISIBLE_DEVICES\"}}""#,
                barrier(&sandbox, 2)
            ),
            concurrency: 4,
            trials: 8,
            machines: &hosts.iter().map(machine).collect::<Vec<_>>(),
            known_hosts: &known,
            hybrid: false,
            extra: "trialGpuNumber: 1",
        },
    );
    let (code, stdout, stderr) = sandbox.create(&config, "gpus");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment gpus DONE: 8 trials (8 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
    let export = sandbox.export("gpus");
    // (environment, gpu, started, ended) of every attempt.
    let mut slots = Vec::new();
    for trial in export["trials"].as_array().unwrap() {
        let attempt = &trial["attempt_history"][0];
        let gpu_indices = attempt["gpu_indices"].as_array().unwrap();
        assert_eq!(gpu_indices.len(), 1, "{trial}");
        let gpu = gpu_indices[0].as_u64().unwrap();
        // The trial saw the GPU it was given.
        let raw: Value = serde_json::from_str(trial["final_raw"].as_str().unwrap()).unwrap();
        assert_eq!(raw["gpus"], gpu.to_string(), "{trial}");
        slots.push((
            attempt["environment_id"].as_str().unwrap().to_string(),
            gpu,
            attempt["started_ms"].as_i64().unwrap(),
            attempt["ended_ms"].as_i64().unwrap(),
        ));
    }
    for (i, a) in slots.iter().enumerate() {
        for b in &slots[i + 1..] {
            let overlap = a.2 < b.3 && b.2 < a.3;
            assert!(
                !(overlap && a.0 == b.0 && a.1 == b.1),
                "two trials at once on {} GPU {}: {slots:?}",
                a.0,
                a.1
            );
        }
    }
    for host in &hosts {
        let environment = environment_id(host);
        assert!(
            slots.iter().any(|slot| slot.0 == environment),
            "no trial ran on {environment}: {slots:?}"
        );
    }
}

#[test]
fn resuming_a_password_experiment_reads_the_password_again_and_says_when_it_cannot() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    if !sshd::password_login() {
        return;
    }
    let host = password_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&host]);
    let config = remote_config(
        &sandbox,
        Spec {
            trial_command: "echo KNOB_FINAL 1",
            concurrency: 2,
            trials: 2,
            machines: &[machine(&host)],
            known_hosts: &known,
            hybrid: false,
            extra: "",
        },
    );
    let (code, stdout, stderr) = sandbox.create(&config, "again");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    // The config lies in the trial code directory: the user is told it stays here.
    assert!(
        stderr.lines().any(|line| line.starts_with("note:")
            && line.contains("holds a secret")
            && line.contains("left out of the code that training services copy")),
        "{stderr}"
    );
    let resume = |max: &str, password: Option<&str>| {
        let mut command = sandbox.knob();
        command.args(["resume", "again", "--max-trial-number", max]);
        command.env_remove("KNOB_SSH_PASSWORD");
        if let Some(password) = password {
            command.env("KNOB_SSH_PASSWORD", password);
        }
        run(&mut command)
    };

    // The config file is still there: the password comes from it.
    let (code, stdout, stderr) = resume("3", None);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("3 trials (3 succeeded"),
        "{stdout}\n{stderr}"
    );

    // Gone: the error names the secret's field and what to do.
    std::fs::remove_file(&config).unwrap();
    let (code, stdout, stderr) = resume("4", None);
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    let error = error_line(&stderr);
    assert!(
        error.contains("trainingService[0].machineList[0].password: this secret is not known")
            && error.contains("KNOB_SSH_PASSWORD"),
        "{error}"
    );
    // Refused before anything changed: still DONE, its budget still 3, no dashboard offered.
    assert!(!stderr.contains("dashboard"), "{stderr}");
    let (_, show, _) = run(sandbox.knob().args(["experiment", "show", "again"]));
    assert!(show.contains("status:    DONE"), "{show}");
    let (_, export, _) =
        run(sandbox
            .knob()
            .args(["experiment", "export", "again", "--format", "json"]));
    let export: serde_json::Value = serde_json::from_str(&export).unwrap();
    assert_eq!(export["experiment"]["config"]["maxTrialNumber"], 3);

    // From the environment.
    let (code, stdout, stderr) = resume("4", Some(PASSWORD));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("4 trials (4 succeeded"),
        "{stdout}\n{stderr}"
    );
    // Neither here nor on the host, after a create and three resumes.
    let experiment_dir = sandbox.path().join("experiments").join("again");
    let on_host = files_under(&sandbox.path().join("agent"));
    assert!(!on_host.is_empty(), "nothing under the agent root");
    for (path, bytes) in files_under(&experiment_dir).into_iter().chain(on_host) {
        assert!(
            !contains(&bytes, PASSWORD),
            "{} holds the password",
            path.display()
        );
    }
}

#[test]
fn a_hybrid_gpu_experiment_runs_on_remote_gpus_when_this_machine_has_none() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let host = key_host(&sshd, &[("KNOB_SIMULATE_GPUS", "2x16GiB")]);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&host]);
    let config = remote_config(
        &sandbox,
        Spec {
            trial_command: "echo KNOB_FINAL 1",
            concurrency: 2,
            trials: 4,
            machines: &[machine(&host)],
            known_hosts: &known,
            hybrid: true,
            extra: "trialGpuNumber: 1",
        },
    );
    // This machine: CPUs and memory, no GPU.
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "cpu=4")
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "hybridgpu"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment hybridgpu DONE: 4 trials (4 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
    for (trial, attempts) in attempts(&sandbox.export("hybridgpu")) {
        assert_eq!(
            attempts[0].0,
            environment_id(&host),
            "{trial}: {attempts:?}"
        );
    }

    // Without the remote host, the same config is refused before it starts, with the reason.
    let text = std::fs::read_to_string(&config).unwrap();
    let working_directory = text
        .lines()
        .find(|line| line.starts_with("experimentWorkingDirectory"))
        .unwrap();
    let local_only = text.split("  - platform: remote").next().unwrap();
    std::fs::write(&config, format!("{local_only}{working_directory}\n")).unwrap();
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "cpu=4")
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "localgpu"]));
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    assert!(stderr.contains("cannot place trials"), "{stderr}");
}

/// A trial that takes its host down with it: the sshd listener and the host's agent processes
/// (the trial's own daemon among them), then itself. Only knob-agent processes are killed, not
/// everything started through the host: a login shell killed halfway through its start-up
/// files can leave their locks behind for every later login (pyenv's rehash lock, say).
const KILL_OWN_HOST: &str = r#"set -u
mark="$KNOB_TEST_SSHD_MARK"
kill -KILL "$(cat "$mark/sshd.pid")"
for process in /proc/[0-9]*; do
  case "$(cat "$process/comm" 2>/dev/null)" in knob-agent*) ;; *) continue ;; esac
  if tr '\0' '\n' < "$process/environ" 2>/dev/null | grep -qx "KNOB_TEST_SSHD_MARK=$mark"; then
    kill -KILL "${process#/proc/}" 2>/dev/null
  fi
done
kill -KILL $$
"#;

#[test]
fn a_trial_whose_host_is_lost_again_and_again_is_failed_after_three_requeues() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let hosts: Vec<Sshd> = (0..4).map(|_| key_host(&sshd, &[])).collect();
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &hosts.iter().collect::<Vec<_>>());
    std::fs::create_dir_all(sandbox.path().join("code")).unwrap();
    std::fs::write(sandbox.path().join("code/kill_own_host.sh"), KILL_OWN_HOST).unwrap();
    let config = remote_config(
        &sandbox,
        Spec {
            trial_command: "bash kill_own_host.sh",
            concurrency: 1,
            trials: 1,
            machines: &hosts.iter().map(machine).collect::<Vec<_>>(),
            known_hosts: &known,
            hybrid: false,
            extra: "",
        },
    );
    let child = spawn_create(&sandbox, &config, "cursed");
    let (code, stdout, stderr) = wait_create(child);
    // Its only trial failed, so `knob create` exits non-zero.
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment cursed DONE: 1 trial (0 succeeded, 1 failed)"),
        "{stdout}\n{stderr}"
    );
    let history = attempts(&sandbox.export("cursed"));
    let (trial, attempts) = &history[0];
    assert_eq!(attempts.len(), 4, "{trial}: {attempts:?}");
    let mut environments: Vec<&String> = attempts.iter().map(|(env, _, _)| env).collect();
    environments.sort();
    environments.dedup();
    assert_eq!(
        environments.len(),
        4,
        "each attempt on another host: {attempts:?}"
    );
    for (_, status, message) in attempts {
        assert_eq!(status.as_deref(), Some("FAILED"), "{attempts:?}");
        assert!(
            message.as_deref().is_some_and(|m| m.contains("lost")),
            "{attempts:?}"
        );
    }
    let last = attempts.last().unwrap().2.as_deref().unwrap();
    assert!(last.contains("not run again"), "{last}");
}

/// A trial code directory the remote service cannot send to its hosts (over 2000 files after
/// the ignore files, a link out of it) is refused by `knob config check` and `knob create` in
/// one line naming trialCodeDirectory, and nothing is registered. Both passed, and every trial
/// of the experiment then failed on it, one by one (40 FAILED in 1.5 s), using up
/// maxTrialNumber. No host is reached for this: the check is the config's.
#[test]
fn a_trial_code_directory_that_cannot_be_archived_is_refused_before_anything_runs() {
    let sandbox = Sandbox::new();
    let key = sandbox.path().join("client_key");
    // Never read (no host is reached), but it must look like a private key to pass the check.
    std::fs::write(
        &key,
        "-----BEGIN OPENSSH PRIVATE KEY-----\nnot read\n-----END OPENSSH PRIVATE KEY-----\n",
    )
    .unwrap();
    let machines = [format!(
        "{{host: 127.0.0.1, port: 1, user: nobody, sshKeyFile: '{}'}}",
        key.display()
    )];
    let known = known_hosts(&sandbox, &[]);
    let config = remote_config(&sandbox, Spec::one_trial(&machines, &known));
    let many = sandbox.path().join("code/many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..2100 {
        std::fs::write(many.join(format!("f{i}")), "").unwrap();
    }
    let refused = |what: &str| {
        let (code, stdout, stderr) = run(sandbox.knob().args(["config", "check"]).arg(&config));
        assert_ne!(code, 0, "{stdout}\n{stderr}");
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("trialCodeDirectory"))
            .collect();
        assert!(
            errors.len() == 1 && errors[0].contains(what) && errors[0].contains(".nniignore"),
            "{stderr}"
        );
        let (code, stdout, stderr) = sandbox.create(&config, "unarchivable");
        assert_ne!(code, 0, "{stdout}\n{stderr}");
        assert!(
            stderr.contains("trialCodeDirectory") && stderr.contains(what),
            "{stderr}"
        );
        let (_, list, _) = run(sandbox.knob().args(["experiment", "list"]));
        assert!(!list.contains("unarchivable"), "{list}");
    };
    refused("holds more than 2000 files");
    // Left out by an ignore file, the same folder is fine.
    std::fs::write(sandbox.path().join("code/.nniignore"), "many/\n").unwrap();
    let (code, stdout, stderr) = run(sandbox.knob().args(["config", "check"]).arg(&config));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    // A link that points out of the directory.
    std::os::unix::fs::symlink("/etc/hostname", sandbox.path().join("code/outside")).unwrap();
    refused("outside the trial code directory");
}

/// Runs experiment `id` (`trials` of `sleep_command` then a final, one at a time) on one host,
/// kills the host while a trial runs there, and waits past hostLossTimeout (3 s) until that
/// trial's attempt is failed as lost. Returns the host (down), the sandbox and `knob create`.
fn lose_the_only_host(
    sshd: &Path,
    id: &str,
    sleep_command: &str,
    trials: u32,
) -> (Sshd, Sandbox, Child) {
    let mut host = key_host(sshd, &[]);
    let sandbox = Sandbox::new();
    let known = known_hosts(&sandbox, &[&host]);
    let trial_command = format!("{sleep_command}; echo KNOB_FINAL 1");
    let config = remote_config(
        &sandbox,
        Spec {
            trial_command: &trial_command,
            concurrency: 1,
            trials,
            machines: &[machine(&host)],
            known_hosts: &known,
            hybrid: false,
            extra: "",
        },
    );
    let child = spawn_create(&sandbox, &config, id);
    let env = environment_id(&host);
    wait_for(&sandbox, id, "a trial running on the host", |e| {
        running_on(e, &env) > 0
    });
    host.kill_host();
    wait_for(&sandbox, id, "an attempt failed as lost", |e| {
        attempts(e).iter().any(|(_, a)| {
            a.iter()
                .any(|(_, status, _)| status.as_deref() == Some("FAILED"))
        })
    });
    (host, sandbox, child)
}

/// The experiment's only host is gone for longer than `hostLossTimeout` (a lab server that
/// reboots) and comes back: the trial it ran is failed as lost and runs again there once it is
/// back, and the experiment finishes. It ended in ERROR ("no environment can run trials")
/// seconds after the loss, although knob still tried the host, as it does for about an hour.
#[test]
fn the_only_host_lost_and_back_runs_the_lost_trial_again_and_the_experiment_finishes() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let (mut host, sandbox, child) = lose_the_only_host(&sshd, "reboot", "sleep 3", 2);
    let env = environment_id(&host);
    host.restart().expect("sshd starts again");
    let (code, stdout, stderr) = wait_create(child);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment reboot DONE: 2 trials (2 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
    let history = attempts(&sandbox.export("reboot"));
    let moved: Vec<&Vec<Attempt>> = history
        .iter()
        .map(|(_, a)| a)
        .filter(|a| a.len() > 1)
        .collect();
    assert_eq!(moved.len(), 1, "{history:?}");
    let (first_env, first_status, first_message) = &moved[0][0];
    assert_eq!(
        (first_env, first_status.as_deref()),
        (&env, Some("FAILED")),
        "{history:?}"
    );
    assert!(
        first_message.as_deref().is_some_and(|m| m.contains("lost")),
        "{history:?}"
    );
    assert_eq!(
        moved[0].last().unwrap().1.as_deref(),
        Some("SUCCEEDED"),
        "{history:?}"
    );
    assert!(
        stderr.contains(&format!("environment {env} lost: ")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "environment {env} (127.0.0.1:{}) is ready again",
            host.port()
        )),
        "{stderr}"
    );
}

/// The only host, lost, comes back with another host key: knob refuses it and stops trying
/// (a key does not change back by itself), and with nothing left to wait for the experiment
/// ends in ERROR naming the host and why, instead of its trial waiting for it.
#[test]
fn the_only_host_lost_and_back_with_another_key_ends_the_experiment_saying_why() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let (mut host, _sandbox, child) = lose_the_only_host(&sshd, "rekeyed", "sleep 60", 1);
    let env = environment_id(&host);
    let key = host.dir().join("host_key");
    std::fs::remove_file(&key).unwrap();
    std::fs::remove_file(key.with_extension("pub")).unwrap();
    sshd::generate_key(&key, "").unwrap();
    host.restart().expect("sshd starts again");
    let (code, stdout, stderr) = wait_create(child);
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    let error = error_line(&stderr);
    assert!(
        error.contains(&format!("no environment can run trials: {env} "))
            && error.contains("host key changed")
            && error.contains("knob no longer tries this host"),
        "{error}"
    );
}

/// Rows of the experiment's events table of `kind` whose payload holds `text`, read from its
/// store as it runs.
pub(crate) fn stored_events(sandbox: &Sandbox, id: &str, kind: &str, text: &str) -> i64 {
    let path = sandbox
        .path()
        .join("experiments")
        .join(id)
        .join("experiment.db");
    let Ok(store) =
        rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    else {
        return 0;
    };
    store
        .query_row(
            "SELECT COUNT(*) FROM events WHERE kind = ?1 AND instr(payload, ?2) > 0",
            [kind, text],
            |row| row.get(0),
        )
        .unwrap_or(0)
}

/// Waits (bounded) until `ready` holds.
pub(crate) fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A config whose one host's link is cut in the tests below: long trials, reuse mode, and a
/// `hostLossTimeout` far longer than the tests' outages.
pub(crate) fn unreachable_host_config(
    sandbox: &Sandbox,
    host: &Sshd,
    trial_command: &str,
    extra: &str,
) -> PathBuf {
    let known = known_hosts(sandbox, &[host]);
    let config = remote_config(
        sandbox,
        Spec {
            trial_command,
            concurrency: 2,
            trials: 2,
            machines: &[machine(host)],
            known_hosts: &known,
            hybrid: false,
            extra,
        },
    );
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("hostLossTimeout: 3s", "hostLossTimeout: 5m");
    std::fs::write(&config, text).unwrap();
    config
}

/// Trials that end, with their final result, while their host cannot be reached are recorded
/// as they ended once it is back: SUCCEEDED, with their own end time. knob recorded the time it
/// heard of the ends (the reconnection), and its `maxTrialDuration` timer, which ran out
/// meanwhile, had them SYS_CANCELED "maxTrialDuration reached" although they had ended
/// before it.
#[test]
fn trials_that_ended_while_their_host_was_unreachable_are_recorded_as_they_ended() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let mut host = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let ended = sandbox.path().join("ended");
    std::fs::create_dir_all(&ended).unwrap();
    let config = unreachable_host_config(
        &sandbox,
        &host,
        &format!(
            "sleep 2; echo KNOB_FINAL 1; touch '{}'/$NNI_TRIAL_JOB_ID",
            ended.display()
        ),
        "maxTrialDuration: 5s",
    );
    let child = spawn_create(&sandbox, &config, "outage");
    let env = environment_id(&host);
    wait_for(&sandbox, "outage", "both trials running", |e| {
        running_on(e, &env) == 2
    });
    host.cut_link();
    wait_until("both trials to end on the host", || {
        std::fs::read_dir(&ended).map_or(0, |d| d.count()) == 2
    });
    // knob's maxTrialDuration ran out for both while the host could not be reached.
    wait_until("maxTrialDuration's kills", || {
        stored_events(&sandbox, "outage", "trial_stopping", "maxTrialDuration") == 2
    });
    host.restart().expect("sshd starts again");
    let (code, stdout, stderr) = wait_create(child);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment outage DONE: 2 trials (2 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
    let export = sandbox.export("outage");
    let store = rusqlite::Connection::open(sandbox.path().join("experiments/outage/experiment.db"))
        .unwrap();
    for trial in export["trials"].as_array().unwrap() {
        assert_eq!(trial["status"], "SUCCEEDED", "{trial}");
        assert_eq!(trial["final"], 1.0, "{trial}");
        let duration = trial["ended_ms"].as_i64().unwrap() - trial["started_ms"].as_i64().unwrap();
        assert!(
            (1500..5000).contains(&duration),
            "a 2 s trial recorded as {duration} ms: {trial}"
        );
        // The trials table (the API's and `knob trial ls`'s) has the same end.
        let stored: i64 = store
            .query_row(
                "SELECT ended_ms FROM trials WHERE id = ?1",
                [trial["id"].as_str().unwrap()],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(Some(stored), trial["ended_ms"].as_i64(), "{trial}");
    }
}

/// `knob stop` of an experiment whose only host cannot be reached (its `hostLossTimeout`
/// minutes away) ends promptly, STOPPED, and says which trials may still run there and how to
/// end them. It waited silently for 2 minutes, then said "stopped (RUNNING)" of a run that had
/// exited unrecorded, claiming its trials killed.
#[test]
fn stopping_an_experiment_whose_host_is_unreachable_ends_promptly_and_names_what_may_still_run() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let mut host = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let config = unreachable_host_config(&sandbox, &host, "sleep 300", "");
    let child = spawn_create(&sandbox, &config, "cutoff");
    let env = environment_id(&host);
    wait_for(&sandbox, "cutoff", "both trials running", |e| {
        running_on(e, &env) == 2
    });
    host.cut_link();
    wait_until("the host reported unreachable", || {
        stored_events(&sandbox, "cutoff", "warning", "is not ready") > 0
    });
    // Before, it waited for the host up to `hostLossTimeout`, and gave up after 2 minutes.
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "cutoff"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(
        stdout, "experiment cutoff stopped (STOPPED); continue it with `knob resume cutoff`\n",
        "{stderr}"
    );
    let export = sandbox.export("cutoff");
    assert_eq!(export["experiment"]["status"], "STOPPED", "{export}");
    let mut trials: Vec<String> = Vec::new();
    for trial in export["trials"].as_array().unwrap() {
        assert_eq!(trial["status"], "USER_CANCELED", "{trial}");
        trials.push(trial["id"].as_str().unwrap().to_string());
    }
    trials.sort();
    let warning = stderr
        .lines()
        .find(|line| line.contains("could not be killed"))
        .unwrap_or_else(|| panic!("no warning naming the trials left running: {stderr}"));
    assert!(
        warning.contains(&format!(
            "trial(s) {} could not be killed",
            trials.join(", ")
        )) && warning.contains(&format!("environment {env} cannot be reached"))
            && warning.contains("`knob resume cutoff` ends them"),
        "{warning}"
    );
    let (code, create_out, create_err) = wait_create(child);
    assert_eq!(code, 0, "{create_out}\n{create_err}");
    assert!(create_err.contains("could not be killed"), "{create_err}");
    let (_, listing, _) = run(sandbox.knob().args(["experiment", "list"]));
    assert!(
        listing
            .lines()
            .any(|l| l.contains("cutoff") && l.contains("STOPPED")),
        "{listing}"
    );
}

/// `knob trial kill` (and the API's kill) of a trial whose host cannot be reached says that the
/// kill is recorded and not carried out yet (the API answers 202), and knob kills the trial once
/// the host answers again. It said "killed" (200) of a trial that nothing had reached.
#[test]
fn killing_a_trial_whose_host_cannot_be_reached_says_so_and_kills_it_once_the_host_answers() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let mut host = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let config = unreachable_host_config(&sandbox, &host, "sleep 300", "");
    let config = config.display().to_string();
    let mut running = crate::api::start(
        sandbox.knob(),
        &["create", "--config", &config, "--id", "pending"],
    );
    let env = environment_id(&host);
    wait_for(&sandbox, "pending", "both trials running", |e| {
        running_on(e, &env) == 2
    });
    let mut trials: Vec<String> = sandbox.export("pending")["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    trials.sort();
    host.cut_link();
    wait_until("the host reported unreachable", || {
        stored_events(&sandbox, "pending", "warning", "is not ready") > 0
    });
    let pending = format!(
        "kill recorded, not yet carried out: 127.0.0.1:{} cannot be reached; knob kills the trial when it answers",
        host.port()
    );
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .args(["trial", "kill", "pending", &trials[0]]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(
        stdout,
        format!("trial {} of experiment pending: {pending}\n", trials[0]),
        "{stderr}"
    );
    let (status, body) = crate::api::send(
        &running.base,
        "POST",
        &format!("/trials/{}/kill", trials[1]),
        "",
    );
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        (&body["kill_recorded"], &body["pending"], &body["message"]),
        (
            &Value::Bool(true),
            &Value::Bool(true),
            &Value::String(pending)
        ),
        "{body}"
    );
    // Nothing reached them: they still run on the host.
    for trial in &trials {
        assert!(trial_runs_here(trial), "trial {trial} no longer runs");
    }
    host.restart().expect("sshd starts again");
    wait_for(&sandbox, "pending", "both trials killed", |e| {
        e["trials"]
            .as_array()
            .is_some_and(|t| t.iter().all(|t| t["status"] == "USER_CANCELED"))
    });
    for trial in &trials {
        wait_until(&format!("trial {trial}'s processes to end"), || {
            !trial_runs_here(trial)
        });
    }
    assert!(running.wait_exit(EXPERIMENT_LIMIT).is_some());
}

/// Whether a process of trial `trial_id` runs on this machine (the test's hosts are sshd's
/// here): one has `NNI_TRIAL_JOB_ID=<trial_id>` in its environment.
fn trial_runs_here(trial_id: &str) -> bool {
    let entry = format!("NNI_TRIAL_JOB_ID={trial_id}");
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return false;
    };
    processes.flatten().any(|process| {
        std::fs::read(process.path().join("environ"))
            .is_ok_and(|environ| environ.split(|b| *b == 0).any(|v| v == entry.as_bytes()))
    })
}

/// `knob resume` of a crashed experiment whose only host now refuses knob (its host key
/// changed: knob does not try it again) fails saying why, and the trials the crashed run left
/// RUNNING are recorded SYS_CANCELED, named in the error, so that a later resume runs them
/// again. They stayed RUNNING for ever.
#[test]
fn a_resume_whose_host_refuses_knob_ends_the_earlier_runs_trials_and_names_them() {
    let Some(sshd) = sshd::sshd_binary() else {
        return;
    };
    let mut host = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let config = unreachable_host_config(&sandbox, &host, "sleep 300", "");
    let config = config.display().to_string();
    let mut crashed = crate::api::start(
        sandbox.knob(),
        &["create", "--config", &config, "--id", "rekeyedresume"],
    );
    let env = environment_id(&host);
    wait_for(&sandbox, "rekeyedresume", "both trials running", |e| {
        running_on(e, &env) == 2
    });
    crashed.kill();
    host.kill_host();
    let key = host.dir().join("host_key");
    std::fs::remove_file(&key).unwrap();
    std::fs::remove_file(key.with_extension("pub")).unwrap();
    sshd::generate_key(&key, "").unwrap();
    host.restart().expect("sshd starts again");
    let (code, stdout, stderr) = run(sandbox.knob().args(["resume", "rekeyedresume"]));
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("rekeyedresume");
    // The error names them in the order they were created.
    let mut trials: Vec<(u64, String)> = Vec::new();
    for trial in export["trials"].as_array().unwrap() {
        assert_eq!(trial["status"], "SYS_CANCELED", "{trial}");
        let sequence = trial["sequence"].as_u64().expect("a trial's sequence");
        trials.push((sequence, trial["id"].as_str().unwrap().to_string()));
    }
    trials.sort();
    let trials: Vec<String> = trials.into_iter().map(|(_, id)| id).collect();
    let error = error_line(&stderr);
    assert!(
        error.contains("host key changed")
            && error.contains(&format!(
                "trial(s) {} of the earlier run did not run again and are recorded SYS_CANCELED; `knob resume rekeyedresume` runs them again",
                trials.join(", ")
            )),
        "{error}"
    );
}
