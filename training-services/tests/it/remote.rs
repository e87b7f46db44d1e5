//! The `remote` service against real sshd servers on 127.0.0.1 (see `sshd.rs`), with the real
//! knob-agent uploaded over SSH. Gated by `KNOB_TEST_SSHD`.

use std::path::{Path, PathBuf};

use knob_plugin_api::service::{MetricKind, ServiceEvent, TrialRequest};
use knob_plugin_api::TrainingService;
use knob_training_services::remote::RemoteService;
use serde_json::{json, Value};

use crate::sshd::{self, generate_key, password_login, sshd_binary, Sshd, SshdOptions};
use crate::support::{
    ending, is_end_of, metrics, of_trial, request, started_within, warnings, Events,
};

/// The agent binary the service uploads (built with this test binary).
fn agent_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_knob-agent"))
}

/// A test's world: a temp dir with known_hosts, trial code and local trial dirs.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("code")).unwrap();
        std::fs::write(dir.path().join("known_hosts"), "").unwrap();
        World { dir }
    }
    fn known_hosts(&self) -> PathBuf {
        self.dir.path().join("known_hosts")
    }
    fn trust(&self, sshd: &Sshd) {
        let mut text = std::fs::read_to_string(self.known_hosts()).unwrap();
        text.push_str(&sshd.known_hosts_line());
        text.push('\n');
        std::fs::write(self.known_hosts(), text).unwrap();
    }
    fn code_dir(&self) -> PathBuf {
        self.dir.path().join("code")
    }
    fn args(&self, machines: Vec<Value>) -> Value {
        json!({
            "experimentId": "exp1",
            "reuseMode": true,
            "knownHostsFile": self.known_hosts(),
            "agentBinary": agent_binary(),
            "hostLossTimeoutSecs": 3,
            "machineList": machines,
        })
    }
    fn request(&self, sshd: &Sshd, trial_id: &str, command: &str) -> TrialRequest {
        let mut request = request(
            &self.code_dir(),
            &self.dir.path().join("trials").join(trial_id),
            trial_id,
            command,
        );
        request.environment_id = environment_id(sshd);
        request
    }
}

fn environment_id(sshd: &Sshd) -> String {
    format!("remote:{}@127.0.0.1:{}", sshd.user(), sshd.port())
}

/// A machineList entry logging in with the fixture's key; the agent lives in its directory.
fn key_machine(sshd: &Sshd) -> Value {
    json!({
        "host": "127.0.0.1",
        "port": sshd.port(),
        "user": sshd.user(),
        "sshKeyFile": sshd.client_key_path(),
    })
}

fn agent_root(sshd: &Sshd) -> PathBuf {
    sshd.dir().join("agent-root")
}

fn start_sshd(options: SshdOptions) -> Option<Sshd> {
    let binary = sshd_binary()?;
    Some(Sshd::start(&binary, options).unwrap_or_else(|e| panic!("{e}")))
}

fn key_options() -> SshdOptions {
    SshdOptions {
        key_auth: true,
        ..SshdOptions::default()
    }
}

fn connect(args: Value, events: &Events, root: &Path) -> RemoteService {
    let mut args = args;
    args["agentRoot"] = json!(root);
    RemoteService::with_emitter(&args, events.emitter()).unwrap()
}

/// Why the service's hosts are not ready, as their environments' statuses say; none may be.
fn not_ready_reason(service: &RemoteService) -> String {
    let environments = service.environments_now();
    assert!(
        environments.iter().all(|e| !e.ready),
        "expected no ready host, got {environments:?}"
    );
    environments
        .iter()
        .map(why_not_ready)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why an environment is not ready: its inventory's status (`unavailable`, with the reason).
fn why_not_ready(environment: &knob_plugin_api::service::Environment) -> String {
    let status = &environment.inventory["status"];
    assert_eq!(status["state"], "unavailable", "{environment:?}");
    status["reason"].as_str().unwrap_or_default().to_string()
}

#[test]
fn key_auth_runs_a_trial_with_its_metrics_and_end() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    // Hashed entries, as `HashKnownHosts yes` writes them, are matched too.
    let hashed = std::process::Command::new("ssh-keygen")
        .arg("-H")
        .arg("-f")
        .arg(world.known_hosts())
        .output()
        .unwrap();
    assert!(hashed.status.success(), "{hashed:?}");
    assert!(std::fs::read_to_string(world.known_hosts())
        .unwrap()
        .starts_with("|1|"));
    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    let environments = service.environments_now();
    assert_eq!(environments.len(), 1);
    assert!(environments[0].ready, "{environments:?}");
    assert_eq!(environments[0].id, environment_id(&sshd));
    assert_eq!(environments[0].host, format!("127.0.0.1:{}", sshd.port()));
    assert_eq!(
        environments[0].inventory["id"],
        json!(environment_id(&sshd)),
        "the inventory carries the environment id: {:?}",
        environments[0].inventory
    );

    service
        .start(&world.request(&sshd, "t1", "echo KNOB_INTERMEDIATE 0.5; echo KNOB_INTERMEDIATE 0.7; echo KNOB_FINAL 0.9; pwd >&2; exit 0"))
        .unwrap();
    let trial = events.wait_ended("t1");
    assert!(
        matches!(trial[0], ServiceEvent::TrialStarted { .. }),
        "{trial:?}"
    );
    assert_eq!(
        metrics(&trial),
        vec![
            (MetricKind::Intermediate, 0, "0.5".to_string()),
            (MetricKind::Intermediate, 1, "0.7".to_string()),
            (MetricKind::Final, 0, "0.9".to_string()),
        ]
    );
    let (exit_code, _, killed, stderr) = ending(&trial);
    assert_eq!((exit_code, killed), (Some(0), None));
    // The trial ran in its experiment's copy of the code uploaded to the host, not the local
    // one.
    let code_copies = agent_root(&sshd).join("experiments/exp1");
    assert!(stderr.contains(code_copies.to_str().unwrap()), "{stderr}");
    service.stop();
}

/// A known_hosts line for the host whose key cannot be read (cut short) is skipped, as ssh
/// skips it, and the good line after it is used: russh refused the whole file for it ("Base64
/// decoding error"), so a host `ssh` reaches was refused for the run.
#[test]
fn an_unreadable_known_hosts_line_is_skipped_as_ssh_skips_it() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    let line = sshd.known_hosts_line();
    let (host, _) = line.split_once(' ').unwrap();
    std::fs::write(
        world.known_hosts(),
        format!(
            "# lab hosts\n{host} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK6nnwTRUNCATED\n{line}\n"
        ),
    )
    .unwrap();
    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    let environments = service.environments_now();
    assert!(environments[0].ready, "{environments:?}");
    service
        .start(&world.request(&sshd, "t1", "echo KNOB_FINAL 1"))
        .unwrap();
    assert_eq!(ending(&events.wait_ended("t1")).0, Some(0));
    service.stop();
    // A key that differs is still refused, its line named past the skipped one.
    let other = "AAAAC3NzaC1lZDI1NTE5AAAAIJRKOjW7u8pigJAGkWmO2WsWkRih/HA2mZb2EneqCOmr";
    std::fs::write(
        world.known_hosts(),
        format!("{host} ssh-ed25519 AAAATRUNCATED\n{host} ssh-ed25519 {other}\n"),
    )
    .unwrap();
    let events = Events::default();
    let service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    let reason = not_ready_reason(&service);
    assert!(
        reason.contains("host key changed") && reason.contains("line 2 records another"),
        "{reason}"
    );
    // A refused key is not tried again: the core is not told to wait for the host.
    assert_eq!(
        service.environments_now()[0].inventory.get("retrying"),
        None
    );
}

/// A host whose shell greets from `~/.bashrc`, as lab machines do ("Welcome to …", a quota
/// notice): the greeting comes before every command's output, and knob read it as the host's
/// platform ("host … is Welcome to the lab cluster!, this knob is Linux x86_64") and would
/// have read it as the start of the agent's frames. Set-up, the code upload and the agent's
/// stream all work, and the trial's metrics arrive.
#[test]
fn a_host_whose_shell_greets_on_every_login_runs_trials() {
    const GREETING: &str = "Welcome to the lab cluster! Quota: 80% used";
    runs_trials_on_a_host_whose_shell_prints(
        &format!("echo '{GREETING}'\n"),
        &format!("{GREETING}\n"),
    );
}

/// A `.bashrc` that prints without a final newline (the usual terminal-title escape, a
/// greeting by `printf`) glues its text to the line that marks where a command's output
/// begins: the agent's stream refused the host ("the command's output never began").
#[test]
fn a_host_whose_shell_sets_the_title_without_a_newline_runs_trials() {
    runs_trials_on_a_host_whose_shell_prints(
        "printf '\\033]0;me@lab\\007'; printf 'Welcome to the lab server'\n",
        "\u{1b}]0;me@lab\u{7}Welcome to the lab server",
    );
}

/// Runs a trial on a host whose `~/.bashrc` is `bashrc`, which prints `printed` before every
/// command's output.
fn runs_trials_on_a_host_whose_shell_prints(bashrc: &str, printed: &str) {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    std::fs::write(sshd.dir().join(".bashrc"), bashrc).unwrap();
    let world = World::new();
    world.trust(&sshd);
    // The premise: this host's shell prints the greeting before a command's output.
    let login = std::process::Command::new("ssh")
        .args(["-p", &sshd.port().to_string(), "-i"])
        .arg(sshd.client_key_path())
        .arg("-o")
        .arg(format!(
            "UserKnownHostsFile={}",
            world.known_hosts().display()
        ))
        .args(["-o", "BatchMode=yes"])
        .arg(format!("{}@127.0.0.1", sshd.user()))
        .arg("echo command")
        .output()
        .expect("the ssh client (openssh-client)");
    assert_eq!(
        String::from_utf8_lossy(&login.stdout),
        format!("{printed}command\n"),
        "root's login shell must be bash, which reads ~/.bashrc for a command sshd runs: {login:?}"
    );

    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    let environments = service.environments_now();
    assert!(environments[0].ready, "{environments:?}");
    std::fs::write(world.code_dir().join("train.sh"), "echo KNOB_FINAL 0.9\n").unwrap();
    service
        .start(&world.request(&sshd, "g1", "echo KNOB_INTERMEDIATE 0.5; sh train.sh"))
        .unwrap();
    let trial = events.wait_ended("g1");
    assert_eq!(
        metrics(&trial),
        vec![
            (MetricKind::Intermediate, 0, "0.5".to_string()),
            (MetricKind::Final, 0, "0.9".to_string()),
        ]
    );
    assert_eq!(ending(&trial).0, Some(0), "{trial:?}");
    service.stop();
}

#[test]
fn password_auth_works_and_a_wrong_password_is_named_without_it() {
    check_password_login(false, "authentication rejected (password)");
}

/// NNI answers keyboard-interactive prompts with the password (ssh2's `tryKeyboard`): a server
/// that takes passwords only that way (PAM) is a working `password` machine, and a wrong
/// password there is refused naming both ways tried, without the password.
#[test]
fn password_is_given_through_keyboard_interactive_when_the_server_takes_only_that() {
    check_password_login(
        true,
        "authentication rejected (password, and password through keyboard-interactive)",
    );
}

/// A trial runs on a password machine (the server taking passwords by the password method, or
/// by keyboard-interactive only), and a wrong password is refused with `refused`, naming the
/// machine and never either password.
fn check_password_login(keyboard_interactive_only: bool, refused: &str) {
    let password = "s3cret-Pw-42";
    if !password_login() {
        return;
    }
    let Some(sshd) = start_sshd(SshdOptions {
        password: Some(password.to_string()),
        keyboard_interactive_only,
        ..SshdOptions::default()
    }) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let machine = |password: &str| json!({"host": "127.0.0.1", "port": sshd.port(), "user": sshd.user(), "password": password});
    let events = Events::default();
    let mut service = connect(
        world.args(vec![machine(password)]),
        &events,
        &agent_root(&sshd),
    );
    assert!(
        service.environments_now()[0].ready,
        "{:?} sshd log: {}",
        service.environments_now(),
        sshd.log()
    );
    service
        .start(&world.request(&sshd, "p1", "echo KNOB_FINAL 1"))
        .unwrap();
    let trial = events.wait_ended("p1");
    assert_eq!(ending(&trial).0, Some(0), "{trial:?}");
    service.stop();

    let events = Events::default();
    let wrong = "wrong-Pw-99";
    let service = service_expecting_failure(world.args(vec![machine(wrong)]), &events, &sshd);
    let reason = not_ready_reason(&service);
    assert!(
        reason.contains(&format!("{}@127.0.0.1:{}", sshd.user(), sshd.port()))
            && reason.contains(refused),
        "{reason}"
    );
    let everything = format!("{reason} {:?}", events.all());
    assert!(
        !everything.contains(wrong) && !everything.contains(password),
        "{everything}"
    );
}

fn service_expecting_failure(args: Value, events: &Events, sshd: &Sshd) -> RemoteService {
    connect(args, events, &agent_root(sshd))
}

#[test]
fn an_unknown_host_key_is_refused_with_how_to_accept_it() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    let events = Events::default();
    let service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    let reason = not_ready_reason(&service);
    let port = sshd.port();
    for expected in [
        format!("{}@127.0.0.1:{port}", sshd.user()),
        "unknown host key ssh-ed25519 SHA256:".to_string(),
        world.known_hosts().display().to_string(),
        format!(
            "ssh-keyscan -p {port} 127.0.0.1 >> {}",
            world.known_hosts().display()
        ),
        "acceptNewHostKey: true".to_string(),
    ] {
        assert!(reason.contains(&expected), "{expected:?} not in: {reason}");
    }
    // Said once, as why the host's environment is not ready: no warning repeats it.
    assert!(
        reason.ends_with("; knob does not try this host again in this run"),
        "{reason}"
    );
    assert_eq!(warnings(&events.all()), Vec::<String>::new());
    assert_eq!(std::fs::read_to_string(world.known_hosts()).unwrap(), "");

    // A known-hosts file whose folder does not exist yet (a fresh user's `~/.ssh`): the
    // command said makes it first, since `>>` alone fails there.
    let folder = world.dir.path().join("fresh-home/.ssh");
    let mut args = world.args(vec![key_machine(&sshd)]);
    args["knownHostsFile"] = json!(folder.join("known_hosts"));
    let events = Events::default();
    let service = connect(args, &events, &agent_root(&sshd));
    let reason = not_ready_reason(&service);
    let expected = format!(
        "`mkdir -p -m 700 {} && ssh-keyscan -p {port} 127.0.0.1 >> {}`",
        folder.display(),
        folder.join("known_hosts").display()
    );
    assert!(reason.contains(&expected), "{expected:?} not in: {reason}");
}

#[test]
fn accept_new_host_key_appends_it_but_a_changed_key_is_refused() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    let mut machine = key_machine(&sshd);
    machine["acceptNewHostKey"] = json!(true);
    let events = Events::default();
    let mut service = connect(
        world.args(vec![machine.clone()]),
        &events,
        &agent_root(&sshd),
    );
    assert!(service.environments_now()[0].ready);
    service.stop();
    let learned = std::fs::read_to_string(world.known_hosts()).unwrap();
    let key = sshd.known_hosts_line();
    let key_blob = key.split_whitespace().nth(2).unwrap();
    assert!(
        learned.contains(&format!("[127.0.0.1]:{}", sshd.port())) && learned.contains(key_blob),
        "{learned}"
    );

    // Another key recorded for the host: refused, even with acceptNewHostKey.
    let other = world.dir.path().join("other_host_key");
    let other_line = generate_key(&other, "").unwrap();
    let other_blob = other_line.split_whitespace().nth(1).unwrap();
    let changed = format!("[127.0.0.1]:{} ssh-ed25519 {other_blob}\n", sshd.port());
    std::fs::write(world.known_hosts(), &changed).unwrap();
    let events = Events::default();
    let service = connect(world.args(vec![machine]), &events, &agent_root(&sshd));
    let reason = not_ready_reason(&service);
    assert!(
        reason.contains("host key changed") && reason.contains("line 1"),
        "{reason}"
    );
    assert_eq!(
        std::fs::read_to_string(world.known_hosts()).unwrap(),
        changed
    );

    // A known-hosts file not made yet (a fresh user's `~/.ssh/known_hosts`) was "cannot read
    // known hosts file": the host was refused for good, and acceptNewHostKey could not help.
    let fresh = world.dir.path().join("fresh-home/.ssh/known_hosts");
    let mut args = world.args(vec![key_machine(&sshd)]);
    args["knownHostsFile"] = json!(fresh);
    let events = Events::default();
    let service = connect(args.clone(), &events, &agent_root(&sshd));
    let reason = not_ready_reason(&service);
    assert!(
        reason.contains("unknown host key") && reason.contains("acceptNewHostKey: true"),
        "{reason}"
    );
    args["machineList"][0]["acceptNewHostKey"] = json!(true);
    let events = Events::default();
    let mut service = connect(args, &events, &agent_root(&sshd));
    assert!(service.environments_now()[0].ready);
    service.stop();
    let learned = std::fs::read_to_string(&fresh).unwrap();
    assert!(learned.contains(key_blob), "{learned}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(fresh.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}

/// A known_hosts that pins only the host's RSA key (`ssh-keyscan -t rsa`, an entry older than
/// the host's ed25519 key), as OpenSSH uses it: knob asked for the ed25519 key and called it a
/// "changed" key, advising the user to delete the valid pin. A comment line above it counts
/// in the line number named.
#[test]
fn a_known_hosts_that_pins_only_the_rsa_key_is_used_and_another_kind_is_never_changed() {
    let Some(sshd) = start_sshd(SshdOptions {
        rsa_host_key: true,
        ..key_options()
    }) else {
        return;
    };
    let world = World::new();
    std::fs::write(
        world.known_hosts(),
        format!("# pinned in 2019\n{}\n", sshd.rsa_known_hosts_line()),
    )
    .unwrap();
    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    assert!(
        service.environments_now()[0].ready,
        "{:?}",
        service.environments_now()
    );
    service.stop();
    drop(service);

    // A pin of a kind the host no longer has (its RSA key is gone; a recorded ECDSA key stands
    // for it here): refused, but not as a changed key, and acceptNewHostKey does not take it.
    let other = world.dir.path().join("ecdsa_key");
    let ecdsa = sshd::generate_key_of_type(&other, "ecdsa", "").unwrap();
    let pinned = format!(
        "# pinned in 2019\n[127.0.0.1]:{} {}\n",
        sshd.port(),
        ecdsa
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    );
    std::fs::write(world.known_hosts(), &pinned).unwrap();
    let mut machine = key_machine(&sshd);
    machine["acceptNewHostKey"] = json!(true);
    let events = Events::default();
    let service = connect(world.args(vec![machine]), &events, &agent_root(&sshd));
    let reason = not_ready_reason(&service);
    for expected in [
        "the server offers a ssh-ed25519 key (SHA256:",
        &format!(
            "and no ecdsa-sha2-nistp256 key, which {} line 2 records for this host",
            world.known_hosts().display()
        ),
        &format!("ssh-keyscan -p {} 127.0.0.1 >>", sshd.port()),
    ] {
        assert!(reason.contains(expected), "{expected:?} not in: {reason}");
    }
    assert!(!reason.contains("changed"), "{reason}");
    assert_eq!(
        std::fs::read_to_string(world.known_hosts()).unwrap(),
        pinned
    );
}

/// `@revoked` lines of known_hosts were ignored: knob connected to a host whose key is revoked
/// (ssh refuses it), and with only the `@revoked` line called the key unknown and suggested
/// recording it. A `@cert-authority` line, which knob cannot use, was passed over in silence.
#[test]
fn a_revoked_host_key_is_refused_even_when_recorded_or_accepted_as_new() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    let line = sshd.known_hosts_line();
    let key = line.split_once(' ').unwrap().1;
    let mut machine = key_machine(&sshd);
    machine["acceptNewHostKey"] = json!(true);
    for (text, revoked_line) in [
        (format!("{line}\n@revoked * {key}\n"), 2),
        (format!("@revoked [127.0.0.1]:{} {key}\n", sshd.port()), 1),
    ] {
        std::fs::write(world.known_hosts(), &text).unwrap();
        let events = Events::default();
        let service = connect(
            world.args(vec![machine.clone()]),
            &events,
            &agent_root(&sshd),
        );
        let reason = not_ready_reason(&service);
        assert!(
            reason.contains("host key revoked: the server offers ssh-ed25519 key SHA256:"),
            "{reason}"
        );
        let expected = format!(
            "{} line {revoked_line} marks @revoked",
            world.known_hosts().display()
        );
        assert!(reason.contains(&expected), "{expected:?} not in: {reason}");
        assert_eq!(std::fs::read_to_string(world.known_hosts()).unwrap(), text);
    }

    let authority = generate_key(&world.dir.path().join("ca"), "").unwrap();
    std::fs::write(
        world.known_hosts(),
        format!("@cert-authority [127.0.0.1]:* {authority}\n"),
    )
    .unwrap();
    let events = Events::default();
    let service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    let reason = not_ready_reason(&service);
    assert!(
        reason.contains("unknown host key")
            && reason.contains(
                "line 1 trusts a @cert-authority for this host, but knob checks host keys only"
            ),
        "{reason}"
    );
}

#[test]
fn code_upload_honours_nniignore_and_happens_once_per_host() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    std::fs::write(world.code_dir().join("train.sh"), "echo KNOB_FINAL 3\n").unwrap();
    std::fs::create_dir(world.code_dir().join("data")).unwrap();
    std::fs::write(world.code_dir().join("data/big.bin"), vec![0u8; 4096]).unwrap();
    std::fs::write(world.code_dir().join(".nniignore"), "data/\n").unwrap();

    let check = "test -f train.sh && test ! -e data && sh train.sh";
    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    service.start(&world.request(&sshd, "c1", check)).unwrap();
    service.start(&world.request(&sshd, "c2", check)).unwrap();
    for trial in ["c1", "c2"] {
        let events = events.wait_ended(trial);
        assert_eq!(ending(&events).0, Some(0), "{events:?}");
        assert_eq!(metrics(&events).len(), 1);
    }
    assert_eq!(service.code_uploads(), 1, "one upload for two trials");
    service.stop();
    drop(service);

    // A new service (a new manager) finds the code on the host and uploads nothing.
    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    service.start(&world.request(&sshd, "c3", check)).unwrap();
    assert_eq!(ending(&events.wait_ended("c3")).0, Some(0));
    assert_eq!(service.code_uploads(), 0, "the host already had this code");
    service.stop();
}

/// Events of `trial` delivered more than once (same kind and sequence).
fn duplicates(events: &[ServiceEvent]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    events
        .iter()
        .map(|e| match e {
            ServiceEvent::Metric { kind, sequence, .. } => format!("metric {kind:?} {sequence}"),
            ServiceEvent::TrialStarted { .. } => "started".to_string(),
            ServiceEvent::TrialEnded { .. } => "ended".to_string(),
            other => format!("{other:?}"),
        })
        .filter(|key| !seen.insert(key.clone()))
        .collect()
}

#[test]
fn a_dropped_connection_is_restored_and_nothing_is_lost_or_doubled() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    // Reports a metric, waits for a file the test creates after the drop, reports the rest.
    let gate = world.dir.path().join("gate");
    let command = format!(
        "echo KNOB_INTERMEDIATE 1; n=0; while [ ! -e {gate} ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done; echo KNOB_INTERMEDIATE 2; echo KNOB_FINAL 3",
        gate = gate.display()
    );
    service
        .start(&world.request(&sshd, "d1", &command))
        .unwrap();
    events.wait_until("the first metric", |all| {
        metrics(&of_trial(all, "d1")).len() == 1
    });

    sshd.drop_connections();
    events.wait_until("the environment to go not ready", |all| {
        all.iter()
            .any(|e| matches!(e, ServiceEvent::Environment { environment } if !environment.ready))
    });
    // The trial keeps running on the host while the connection is down.
    std::fs::write(&gate, "").unwrap();
    let trial = events.wait_ended("d1");
    assert_eq!(
        metrics(&trial),
        vec![
            (MetricKind::Intermediate, 0, "1".to_string()),
            (MetricKind::Intermediate, 1, "2".to_string()),
            (MetricKind::Final, 0, "3".to_string()),
        ],
        "{trial:?}"
    );
    assert!(duplicates(&trial).is_empty(), "{trial:?}");
    let (exit_code, _, _, _) = ending(&trial);
    assert_eq!(exit_code, Some(0));
    assert!(
        !trial.iter().any(|e| matches!(
            e,
            ServiceEvent::TrialEnded {
                environment_lost: Some(_),
                ..
            }
        )),
        "{trial:?}"
    );
    events.wait_until("the environment to be ready again", |all| {
        matches!(all.iter().rev().find(|e| matches!(e, ServiceEvent::Environment { .. })),
            Some(ServiceEvent::Environment { environment }) if environment.ready)
    });
    // And the host takes new trials.
    service
        .start(&world.request(&sshd, "d2", "echo KNOB_FINAL 4"))
        .unwrap();
    assert_eq!(ending(&events.wait_ended("d2")).0, Some(0));
    service.stop();
}

#[test]
fn a_killed_host_ends_its_trials_as_lost() {
    let Some(mut sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    service
        .start(&world.request(&sshd, "k1", "echo KNOB_INTERMEDIATE 1; sleep 60"))
        .unwrap();
    events.wait_until("the first metric", |all| {
        metrics(&of_trial(all, "k1")).len() == 1
    });
    sshd.kill_host();
    let trial = events.wait_ended("k1");
    match trial.last() {
        Some(ServiceEvent::TrialEnded {
            environment_lost: Some(why),
            ..
        }) => assert!(
            why.starts_with(&format!("{}@127.0.0.1:{}: ", sshd.user(), sshd.port())),
            "{why}"
        ),
        other => panic!("expected a lost end, got {other:?}; all: {trial:?}"),
    }
    assert!(duplicates(&trial).is_empty(), "{trial:?}");
    assert!(!service.environments_now()[0].ready);
    let err = service
        .start(&world.request(&sshd, "k2", "true"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not connected"), "{err}");
    service.stop();
}

/// A host declared lost comes back while its agent still runs the trial's old attempt (here
/// one that ignores SIGTERM, so the kill the service sends at the hello takes the grace
/// period): the trial, run again, placed on that host at once, is refused by the agent as
/// already running. The refusal says the trial was not started, so the core tries it again;
/// it failed the trial for good.
#[test]
fn a_start_refused_by_the_agent_says_the_trial_was_not_started() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    service
        .start(&world.request(
            &sshd,
            "r1",
            "trap '' TERM; echo KNOB_INTERMEDIATE 1; for i in $(seq 600); do sleep 0.1; done",
        ))
        .unwrap();
    events.wait_until("the first metric", |all| {
        metrics(&of_trial(all, "r1")).len() == 1
    });
    // Nothing answers for longer than hostLossTimeout (3 s): the host is declared lost, once a
    // reconnection's hello has gone unanswered (20 s).
    sshd.pause_processes(true);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while !events.all().iter().any(|e| is_end_of(e, "r1")) {
        assert!(
            std::time::Instant::now() < deadline,
            "r1 was not lost: {:?}",
            events.all()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let lost = of_trial(&events.all(), "r1");
    assert!(
        matches!(
            lost.last(),
            Some(ServiceEvent::TrialEnded {
                environment_lost: Some(_),
                ..
            })
        ),
        "{lost:?}"
    );
    sshd.pause_processes(false);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !service.environments_now()[0].ready {
        assert!(
            std::time::Instant::now() < deadline,
            "the host did not come back"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut again = world.request(&sshd, "r1", "echo KNOB_FINAL 2");
    again.trial_dir = again.trial_dir.join("attempt-2");
    let error = service.start(&again).unwrap_err().to_string();
    assert!(
        error.contains("already running") && error.ends_with("the trial was not started"),
        "{error}"
    );
    service.stop();
}

/// A port where another server answers (a web server, say: it answers knob's SSH greeting
/// with an error and closes) was said as russh's bare "cannot connect: Disconnected".
#[test]
fn a_port_where_no_sshd_answers_is_said_so() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let web = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = web.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in web.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut greeting = [0u8; 256];
            let _ = stream.read(&mut greeting);
            let _ = stream.write_all(b"HTTP/1.0 400 Bad Request\r\n\r\n");
        }
    });
    let machine = json!({
        "host": "127.0.0.1", "port": port, "user": sshd.user(),
        "sshKeyFile": sshd.client_key_path(),
    });
    let events = Events::default();
    let service = connect(world.args(vec![machine]), &events, &agent_root(&sshd));
    let why = not_ready_reason(&service);
    assert!(
        why.contains(&format!(
            "cannot connect: the server on port {port} closed the connection before the SSH handshake was done (is it sshd?"
        )) && why.contains("knob keeps trying it"),
        "{why}"
    );
}

/// A login that runs something else than knob's commands (a nologin shell, here a forced
/// command in authorized_keys that says so) had what it printed dropped, and was said as
/// "`uname -sm` failed there: exit status 1" (or sshd's "Could not chdir to home directory").
#[test]
fn a_login_that_does_not_run_knobs_commands_says_what_it_printed() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let public_key = std::fs::read_to_string(sshd.client_key_path().with_extension("pub")).unwrap();
    std::fs::write(
        sshd.dir().join("authorized_keys"),
        format!(
            "command=\"echo This account is currently not available.; exit 1\" {}",
            public_key.trim()
        ),
    )
    .unwrap();
    let events = Events::default();
    let service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    let why = not_ready_reason(&service);
    assert!(
        why.contains(
            "knob's commands did not run there: the login printed \"This account is currently not available.\" (exit status 1); is "
        ),
        "{why}"
    );
}

/// A service of two hosts: first one on 127.0.0.1 at `port` (with `sshd`'s user and key),
/// which is not up, then `sshd`, which is. Returns it with the first one's environment as the
/// service returned.
fn connect_beside_a_host_not_up(
    world: &World,
    events: &Events,
    sshd: &Sshd,
    port: u16,
) -> (RemoteService, knob_plugin_api::service::Environment) {
    let not_up = json!({
        "host": "127.0.0.1", "port": port, "user": sshd.user(),
        "sshKeyFile": sshd.client_key_path(),
    });
    let service = connect(
        world.args(vec![not_up, key_machine(sshd)]),
        events,
        &agent_root(sshd),
    );
    let mut environments = service.environments_now();
    assert_eq!(
        environments.iter().map(|e| e.ready).collect::<Vec<_>>(),
        vec![false, true]
    );
    (service, environments.swap_remove(0))
}

#[test]
fn two_hosts_with_one_unreachable_run_on_the_other() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    // A port nothing listens on.
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let events = Events::default();
    let (mut service, dead) = connect_beside_a_host_not_up(&world, &events, &sshd, dead_port);
    // The unreachable host's environment says why; no warning repeats it.
    let why = why_not_ready(&dead);
    assert!(
        why.contains(&format!("127.0.0.1:{dead_port}"))
            && why.contains("connection refused")
            && why.contains("knob keeps trying it"),
        "{why}"
    );
    // Tried again (it may come up): the core waits for it rather than count it out.
    assert_eq!(dead.inventory["retrying"], true, "{dead:?}");
    assert_eq!(warnings(&events.all()), Vec::<String>::new());
    service
        .start(&world.request(&sshd, "h1", "echo KNOB_FINAL 1"))
        .unwrap();
    assert_eq!(ending(&events.wait_ended("h1")).0, Some(0));
    let mut on_dead = world.request(&sshd, "h2", "true");
    on_dead.environment_id = format!("remote:{}@127.0.0.1:{dead_port}", sshd.user());
    let err = service.start(&on_dead).unwrap_err().to_string();
    assert!(err.contains("is not connected"), "{err}");
    // A host that takes late start failures gets the same refusal as an event.
    service.set_late_start_failures(true);
    on_dead.trial_id = "h3".into();
    service.start(&on_dead).unwrap();
    let failed = events.wait_until("h3's start to fail", |events| {
        events
            .iter()
            .any(|e| matches!(e, ServiceEvent::StartFailed { trial_id, .. } if trial_id == "h3"))
    });
    let message = failed
        .iter()
        .find_map(|e| match e {
            ServiceEvent::StartFailed { message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap();
    // Tried again by the core: nothing ran.
    assert!(
        message.contains("trial h3") && message.contains("the trial was not started"),
        "{message}"
    );
    assert_eq!(of_trial(&failed, "h3").len(), 1, "{failed:#?}");
    service.stop();
}

/// A host that takes connections and never says a word (a hung sshd, a firewall that
/// swallows the banner) takes `ssh::CONNECT_TIMEOUT` (20 s) to fail: the service starts
/// without waiting for it once the other host is up, and it joins when it answers.
#[test]
fn a_stalled_host_does_not_hold_the_start_on_a_host_that_is_up() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    // Listening, never accepting: the kernel completes the TCP handshake, no banner comes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let events = Events::default();
    let (mut service, stalled) = connect_beside_a_host_not_up(&world, &events, &sshd, silent_port);
    // Returned while the silent host still connects, not once its attempt timed out.
    let why = why_not_ready(&stalled);
    assert!(why.ends_with("still connecting"), "{why}");
    service
        .start(&world.request(&sshd, "up", "echo KNOB_FINAL 1"))
        .unwrap();
    assert_eq!(ending(&events.wait_ended("up")).0, Some(0));
    service.stop();
    drop(silent);
}

/// A start whose code cannot be uploaded started nothing, and says so: the core tries it again
/// (a connection that dropped mid-upload) instead of failing the trial at once.
#[test]
fn a_start_whose_code_upload_fails_says_the_trial_was_not_started() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    let events = Events::default();
    let mut service = connect_all(&world, &events, [&sshd]);
    // A file where the host keeps trial code: every upload fails.
    let code = agent_root(&sshd).join("code");
    let _ = std::fs::remove_dir_all(&code);
    std::fs::write(&code, "in the way").unwrap();
    let error = service
        .start(&world.request(&sshd, "u1", "true"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("uploading the trial code") && error.contains("the trial was not started"),
        "{error}"
    );
    service.stop();
}

/// A host whose disk fills while knob-agent is uploaded (1 MiB against the agent's megabytes):
/// the upload's own error comes back at once, not "still connecting" for a minute while the rest
/// of the binary waited to be sent to a `cat` that had exited, and no partial binary is left to
/// keep the disk full for the next try.
#[test]
fn an_agent_upload_that_fills_the_disk_says_so_at_once_and_leaves_nothing() {
    if !crate::sshd::small_disk() {
        return;
    }
    let Some(sshd) = start_sshd(SshdOptions {
        disk_bytes: Some(1 << 20),
        ..key_options()
    }) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let events = Events::default();
    let started = std::time::Instant::now();
    let root = sshd.disk("agent-root");
    let service = connect(world.args(vec![key_machine(&sshd)]), &events, &root);
    let reason = not_ready_reason(&service);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(50),
        "the failed upload took {:?} to be reported: {reason}",
        started.elapsed()
    );
    assert!(
        reason.contains("uploading")
            && reason.contains("knob-agent")
            && reason.contains("No space left on device"),
        "{reason}"
    );
    // Tried again later (the disk may be freed), unlike a refused key.
    assert!(!reason.contains("does not try this host again"), "{reason}");
    assert_eq!(warnings(&events.all()), Vec::<String>::new());
    let bin = sshd.seen_from_here(&root.join("bin"));
    let left: Vec<_> = std::fs::read_dir(&bin)
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()))
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left in {}: {left:?}", bin.display());
    drop(service);
}

/// A host whose agentRoot is on a `noexec` mount: the uploaded agent cannot run, which was found
/// out only as "the agent did not answer the hello: connection closed". The setup says so, with
/// the shell's own error.
#[test]
fn an_agent_root_where_programs_may_not_run_is_named() {
    if !crate::sshd::small_disk() {
        return;
    }
    let Some(sshd) = start_sshd(SshdOptions {
        disk_bytes: Some(256 << 20),
        disk_noexec: true,
        ..key_options()
    }) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let events = Events::default();
    let root = sshd.disk("agent-root");
    let service = connect(world.args(vec![key_machine(&sshd)]), &events, &root);
    let reason = not_ready_reason(&service);
    assert!(
        reason.contains("cannot run the uploaded")
            && reason.contains("Permission denied")
            && reason.contains("noexec"),
        "{reason}"
    );
    drop(service);
}

/// The part of the agent an upload cut short left under its final name (knob killed while it
/// uploaded, by an older knob that published what had arrived): it is replaced and the host
/// runs trials. It was taken for the agent (`test -x`), failed to run, and the host was refused
/// ("cannot run the uploaded ... noexec") by every later experiment.
#[test]
fn a_part_of_the_agent_left_by_a_cut_upload_is_replaced() {
    use knob_training_services::remote::setup::AgentBinary;
    use std::os::unix::fs::PermissionsExt;
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let agent = AgentBinary::load(&agent_binary()).unwrap();
    let published = agent_root(&sshd)
        .join("bin")
        .join(format!("knob-agent-{}", agent.hash));
    std::fs::create_dir_all(published.parent().unwrap()).unwrap();
    std::fs::write(&published, &agent.bytes[..655_360]).unwrap();
    std::fs::set_permissions(&published, std::fs::Permissions::from_mode(0o755)).unwrap();

    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&sshd)]),
        &events,
        &agent_root(&sshd),
    );
    let environments = service.environments_now();
    assert!(environments[0].ready, "{environments:?}");
    assert!(
        std::fs::read(&published).unwrap() == agent.bytes,
        "{} was not replaced by the whole agent",
        published.display()
    );
    service
        .start(&world.request(&sshd, "t1", "echo KNOB_FINAL 1"))
        .unwrap();
    let trial = events.wait_ended("t1");
    assert_eq!(ending(&trial).0, Some(0), "{trial:?}");
    service.stop();
}

/// A key-login sshd whose disk (`Sshd::disk`) has room for the agent and a few MiB more;
/// `None` (the test returns) where a small disk cannot be made or sshd is missing.
fn small_disk_sshd() -> Option<Sshd> {
    if !crate::sshd::small_disk() {
        return None;
    }
    let agent_bytes = std::fs::metadata(agent_binary()).unwrap().len();
    start_sshd(SshdOptions {
        disk_bytes: Some(agent_bytes + (4 << 20)),
        ..key_options()
    })
}

/// A host whose disk fills under running trials: the trial that failed for it is warned about
/// (its error could not be written: Python exits 120 with nothing said), a start meanwhile says
/// the disk is full and that the trial was not started (so the core tries it again later rather
/// than failing every trial left), and once there is room the same start runs.
#[test]
fn trials_on_a_full_host_disk_say_so_and_start_again_once_there_is_room() {
    let Some(sshd) = small_disk_sshd() else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let events = Events::default();
    let root = sshd.disk("agent-root");
    let mut service = connect(world.args(vec![key_machine(&sshd)]), &events, &root);
    assert_eq!(service.environments_now().len(), 1);

    // Writes until the disk is full, outside its own folder so that it stays when the trial is
    // gone, then fails as a trial on a full disk does.
    let filler = root.join("filler");
    let fill = format!(
        "head -c 16777216 /dev/zero > '{}'; exit 3",
        filler.display()
    );
    service.start(&world.request(&sshd, "f1", &fill)).unwrap();
    let ended = events.wait_ended("f1");
    assert_eq!(ending(&of_trial(&ended, "f1")).0, Some(3), "{ended:?}");
    assert!(
        warnings(&of_trial(&ended, "f1"))
            .iter()
            .any(|w| w.contains("the disk under the trial's folder is full")),
        "{ended:?}"
    );

    let error = service
        .start(&world.request(&sshd, "f2", "echo KNOB_FINAL 2"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("No space left on device")
            && error.contains("the disk under the trial's folder is full")
            && error.ends_with("the trial was not started")
            && !error.contains("trial f2: trial f2"),
        "{error}"
    );

    std::fs::remove_file(sshd.seen_from_here(&filler)).unwrap();
    service
        .start(&world.request(&sshd, "f2", "echo KNOB_FINAL 2"))
        .unwrap();
    let ended = events.wait_ended("f2");
    assert_eq!(ending(&of_trial(&ended, "f2")).0, Some(0), "{ended:?}");
    service.stop();
}

/// A host whose disk is full when a new experiment's agent daemon starts: the daemon cannot
/// even write its log, and the refusal said only "connection closed". It now names the full disk
/// (what `knob-agent attach` says on its stderr), and is tried again later.
#[test]
fn an_agent_daemon_that_cannot_start_on_a_full_disk_says_so() {
    let Some(sshd) = small_disk_sshd() else {
        return;
    };
    let root = sshd.disk("agent-root");
    {
        let world = World::new();
        world.trust(&sshd);
        let events = Events::default();
        let mut service = connect(world.args(vec![key_machine(&sshd)]), &events, &root);
        assert!(service.environments_now()[0].ready, "{}", sshd.log());
        service.stop();
    }
    // Fill what is left (the agent and the code are already there).
    let filler = sshd.seen_from_here(&root.join("filler"));
    let mut file = std::fs::File::create(&filler).unwrap();
    let block = vec![0u8; 64 << 10];
    while std::io::Write::write_all(&mut file, &block).is_ok() {}
    drop(file);

    // Another experiment: a daemon of its own must start.
    let world = World::new();
    world.trust(&sshd);
    let events = Events::default();
    let mut args = world.args(vec![key_machine(&sshd)]);
    args["experimentId"] = json!("exp2");
    let service = connect(args, &events, &root);
    let reason = not_ready_reason(&service);
    assert!(
        reason.contains("the agent did not answer the hello")
            && reason.contains("did not start")
            && reason.contains("no space left on the disk of"),
        "{reason}"
    );
    assert!(!reason.contains("does not try this host again"), "{reason}");
    drop(service);
}

/// A start waits for its host's agent to answer; a host that stalls (its connection up, its
/// agent stopped) must not hold the starts on other hosts, nor the kill of a trial whose start
/// is still under way (issue 16's loop that never waits on a service, inside the service).
#[test]
fn a_start_on_a_stalled_host_holds_no_start_on_another() {
    let Some((stalled, quick)) = two_key_hosts() else {
        return;
    };
    let world = World::new();
    let events = Events::default();
    let mut service = connect_all(&world, &events, [&stalled, &quick]);
    service.set_late_start_failures(true);
    stalled.pause_processes(true);
    service
        .start(&world.request(&stalled, "held", "echo KNOB_FINAL 1"))
        .unwrap();
    service
        .start(&world.request(&stalled, "killed", "sleep 60"))
        .unwrap();
    service.kill("killed", "stopped early by the assessor");
    service
        .start(&world.request(&quick, "quick", "echo KNOB_FINAL 2"))
        .unwrap();
    // The stalled host is let go once the quick one's trial started, or after 10 s (less than
    // the 15 s heartbeat timeout, so its link stays up): waiting behind the stalled starts,
    // the quick trial would start only after that.
    let quick_started = started_within(&events, "quick", std::time::Duration::from_secs(10));
    let held_meanwhile = of_trial(&events.all(), "held");
    stalled.pause_processes(false);
    assert!(
        quick_started,
        "the quick host's trial waited for the stalled host"
    );
    assert!(held_meanwhile.is_empty(), "{held_meanwhile:#?}");
    assert_eq!(ending(&events.wait_ended("quick")).0, Some(0));
    // The stalled host's starts finish once it answers; the kill asked for meanwhile is not lost.
    assert_eq!(ending(&events.wait_ended("held")).0, Some(0));
    let killed = events.wait_ended("killed");
    assert_eq!(
        ending(&killed).2.as_deref(),
        Some("stopped early by the assessor"),
        "{killed:#?}"
    );
    service.stop();
}

#[test]
fn bad_class_args_are_one_line_errors() {
    let events = Events::default();
    let err = |args: Value| {
        RemoteService::with_emitter(&args, events.emitter())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert_eq!(
        err(json!({"experimentId": "e", "machineList": [{"host": "h", "user": "u", "sshKeyFile": "/nonexistent/key"}]})),
        "classArgs of training service remote: machineList[0].sshKeyFile /nonexistent/key of u@h:22 is not a readable file"
    );
    assert_eq!(
        err(json!({"experimentId": "e", "agentBinary": "/nonexistent/knob-agent", "machineList": [{"host": "h", "user": "u"}]})),
        "training service remote cannot start: agentBinary: cannot read the agent binary /nonexistent/knob-agent: No such file or directory (os error 2)"
    );
}

#[test]
fn without_reuse_each_trial_gets_its_own_code_copy_and_python_path_leads_path() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    std::fs::write(world.code_dir().join("train.sh"), "echo KNOB_FINAL 5\n").unwrap();
    let mut args = world.args(vec![key_machine(&sshd)]);
    args["reuseMode"] = json!(false);
    args["machineList"][0]["pythonPath"] = json!("/opt/knob-test-python/bin");
    let events = Events::default();
    let mut service = connect(args, &events, &agent_root(&sshd));
    let command = "touch scribble; sh train.sh; pwd >&2; echo \"PATH=$PATH\" >&2";
    service.start(&world.request(&sshd, "r1", command)).unwrap();
    service.start(&world.request(&sshd, "r2", command)).unwrap();
    for trial in ["r1", "r2"] {
        let events = events.wait_ended(trial);
        let (exit_code, _, _, stderr) = ending(&events);
        assert_eq!(exit_code, Some(0), "{events:?}");
        assert_eq!(metrics(&events).len(), 1);
        let code_root = agent_root(&sshd).join("code");
        let cwd = stderr
            .lines()
            .find(|l| l.starts_with('/'))
            .unwrap_or_default();
        assert!(
            !cwd.starts_with(code_root.to_str().unwrap()) && cwd.contains(trial),
            "{trial} ran in {cwd:?}, not a copy of its own: {stderr}"
        );
        assert!(
            stderr.contains("PATH=/opt/knob-test-python/bin:"),
            "{stderr}"
        );
    }
    // The shared code directory was never written to.
    let shared: Vec<_> = std::fs::read_dir(agent_root(&sshd).join("code"))
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(!shared.iter().any(|n| n == "scribble"), "{shared:?}");
    service.stop();
}

/// A `pythonPath` written with `~` (`~/venv/bin`, as NNI users write it: NNI's unquoted
/// `export PATH=...` expands it) went into `PATH` as `~/venv/bin`, which only bash's own lookup
/// finds: `env python3`, a `#!/usr/bin/env python3` script and a trial's `subprocess` ran the
/// system's Python instead. It is the host's home now.
#[test]
fn a_python_path_under_the_home_folder_leads_path_for_every_program() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    // The fixture's sessions have its folder as their home.
    let venv = sshd.dir().join("venv/bin");
    std::fs::create_dir_all(&venv).unwrap();
    let python = venv.join("python3");
    std::fs::write(&python, "#!/bin/sh\necho KNOB_FINAL 7\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut args = world.args(vec![key_machine(&sshd)]);
    args["machineList"][0]["pythonPath"] = json!("~/venv/bin");
    let events = Events::default();
    let mut service = connect(args, &events, &agent_root(&sshd));
    let command = "echo \"PATH=$PATH\" >&2; env python3";
    service.start(&world.request(&sshd, "p1", command)).unwrap();
    let events = events.wait_ended("p1");
    let (exit_code, _, _, stderr) = ending(&events);
    assert_eq!(exit_code, Some(0), "{events:?}");
    assert!(
        stderr.contains(&format!("PATH={}:", venv.display())),
        "{stderr}"
    );
    assert_eq!(metrics(&events).len(), 1, "{events:?}");
    service.stop();
}

/// The host keeps one upload of the code (`code/<hash>/`) for every experiment that sends the
/// same code, and trials ran in it: what one experiment's trial wrote there (an edited config, a
/// saved model, a deleted file) was what the next experiment's trials found, days later, under
/// the name of the original content. Each experiment now runs in its own copy, which its trials
/// share as NNI's trials of one environment share the uploaded code; the upload is still made
/// once per host.
#[test]
fn a_trial_that_changes_its_code_folder_changes_it_for_its_experiment_only() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    std::fs::write(world.code_dir().join("settings.txt"), "lr=0.1\n").unwrap();
    std::fs::write(world.code_dir().join("data.txt"), "data\n").unwrap();
    // What a trial saw goes to stderr first, so that a failed check shows it.
    let show = "pwd >&2; ls >&2; cat settings.txt >&2; ";
    let sees_the_original = format!(
        "{show}test \"$(cat settings.txt)\" = lr=0.1 && test -f data.txt && test ! -e model.pt"
    );
    let changes_it = format!(
        "{sees_the_original} && echo 'edited by a trial' >> settings.txt && touch model.pt && rm data.txt"
    );
    let sees_the_change = format!(
        "{show}test \"$(tail -n 1 settings.txt)\" = 'edited by a trial' && test -e model.pt && test ! -e data.txt"
    );
    let run = |experiment: &str, reuse: bool, trials: &[(&str, &str)]| {
        let mut args = world.args(vec![key_machine(&sshd)]);
        args["experimentId"] = json!(experiment);
        args["reuseMode"] = json!(reuse);
        let events = Events::default();
        let mut service = connect(args, &events, &agent_root(&sshd));
        let mut stderrs = Vec::new();
        // One after the other: the second trial of the first experiment sees the first's change.
        for (trial, command) in trials {
            service
                .start(&world.request(&sshd, trial, command))
                .unwrap();
            let trial_events = events.wait_ended(trial);
            let (exit_code, _, _, stderr) = ending(&trial_events);
            assert_eq!(
                exit_code,
                Some(0),
                "{experiment}'s {trial} did not find the code folder it expected; it saw: {stderr}"
            );
            stderrs.push(stderr);
        }
        let uploads = service.code_uploads();
        service.stop();
        (uploads, stderrs)
    };

    let (uploads, stderrs) = run(
        "exp1",
        true,
        &[
            ("a1", changes_it.as_str()),
            ("a2", sees_the_change.as_str()),
        ],
    );
    assert_eq!(uploads, 1);
    // Another experiment of the same code, sharing the trials' folder or each with its own.
    let (uploads, _) = run("exp2", true, &[("b1", sees_the_original.as_str())]);
    assert_eq!(uploads, 0, "the host keeps the upload for every experiment");
    run("exp3", false, &[("c1", sees_the_original.as_str())]);
    let own_copy = agent_root(&sshd).join("experiments/exp1");
    assert!(
        stderrs[0].starts_with(own_copy.to_str().unwrap()),
        "exp1's trials run in its own copy, under {}: {}",
        own_copy.display(),
        stderrs[0]
    );
    // The host's cache of the upload holds what was uploaded.
    let cached: Vec<_> = std::fs::read_dir(agent_root(&sshd).join("code"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    assert_eq!(
        std::fs::read_to_string(cached[0].join("settings.txt")).unwrap(),
        "lr=0.1\n"
    );
    assert!(cached[0].join("data.txt").exists() && !cached[0].join("model.pt").exists());
}

#[test]
fn an_encrypted_key_needs_its_passphrase_and_errors_never_show_it() {
    let passphrase = "key-Phrase-77";
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    sshd.encrypt_client_key(passphrase).unwrap();
    let world = World::new();
    world.trust(&sshd);
    let with = |phrase: Option<&str>| {
        let mut machine = key_machine(&sshd);
        if let Some(phrase) = phrase {
            machine["sshPassphrase"] = json!(phrase);
        }
        world.args(vec![machine])
    };

    let events = Events::default();
    let mut service = connect(with(Some(passphrase)), &events, &agent_root(&sshd));
    assert!(service.environments_now()[0].ready);
    service.stop();

    let events = Events::default();
    let service = connect(with(None), &events, &agent_root(&sshd));
    let reason = not_ready_reason(&service);
    assert!(
        reason.contains("is encrypted: give its sshPassphrase"),
        "{reason}"
    );
    // The same file with the same passphrase is read the same way again: the host was tried
    // for an hour while every trial waited for it.
    let given_up = "; knob does not try this host again in this run";
    assert!(reason.ends_with(given_up), "{reason}");

    let events = Events::default();
    let wrong = "wrong-Phrase-13";
    let service = connect(with(Some(wrong)), &events, &agent_root(&sshd));
    let reason = not_ready_reason(&service);
    assert!(reason.contains("cannot load sshKeyFile"), "{reason}");
    assert!(reason.ends_with(given_up), "{reason}");
    let everything = format!("{reason} {:?}", events.all());
    assert!(
        !everything.contains(wrong) && !everything.contains(passphrase),
        "{everything}"
    );

    // A file that is no key, with no passphrase given: the passphrase is not blamed.
    std::fs::write(sshd.client_key_path(), "not a key\n").unwrap();
    let events = Events::default();
    let service = connect(with(None), &events, &agent_root(&sshd));
    let reason = not_ready_reason(&service);
    assert!(
        reason.contains("cannot load sshKeyFile")
            && reason.contains("give an SSH private key file")
            && !reason.contains("sshPassphrase"),
        "{reason}"
    );
}

#[test]
fn trials_spread_over_two_hosts_with_their_own_keys() {
    let Some(first) = start_sshd(key_options()) else {
        return;
    };
    let second = start_sshd(key_options()).unwrap();
    let world = World::new();
    world.trust(&first);
    world.trust(&second);
    let events = Events::default();
    // One agent root for both: each host's environment directory is its own.
    let mut service = connect(
        world.args(vec![key_machine(&first), key_machine(&second)]),
        &events,
        &agent_root(&first),
    );
    // The service is ready once one host is; the other may still be connecting (a CI run of
    // the whole suite saw it so).
    wait_for("both hosts ready", || {
        service.environments_now().iter().all(|e| e.ready)
    });
    let environments = service.environments_now();
    assert!(environments.iter().all(|e| e.ready), "{environments:?}");
    let mut trials = Vec::new();
    for index in 0..6 {
        let host = if index % 2 == 0 { &first } else { &second };
        let trial = format!("s{index}");
        service
            .start(&world.request(host, &trial, "echo KNOB_FINAL 1"))
            .unwrap();
        trials.push(trial);
    }
    for trial in &trials {
        assert_eq!(ending(&events.wait_ended(trial)).0, Some(0));
    }
    service.stop();
}

#[test]
fn without_an_agent_to_upload_the_one_on_the_hosts_path_is_used() {
    let Some(binary) = sshd_binary() else {
        return;
    };
    let bin = tempfile::tempdir().unwrap();
    std::fs::copy(agent_binary(), bin.path().join("knob-agent")).unwrap();
    let sshd = Sshd::start(
        &binary,
        SshdOptions {
            key_auth: true,
            password: None,
            env: vec![(
                "PATH".to_string(),
                format!("{}:/usr/local/bin:/usr/bin:/bin", bin.path().display()),
            )],
            ..SshdOptions::default()
        },
    )
    .unwrap();
    let world = World::new();
    world.trust(&sshd);
    let mut args = world.args(vec![key_machine(&sshd)]);
    args.as_object_mut().unwrap().remove("agentBinary");
    let events = Events::default();
    let mut service = connect(args.clone(), &events, &agent_root(&sshd));
    service
        .start(&world.request(&sshd, "a1", "echo KNOB_FINAL 1"))
        .unwrap();
    assert_eq!(ending(&events.wait_ended("a1")).0, Some(0));
    service.stop();
    assert!(
        !agent_root(&sshd).join("bin").exists(),
        "nothing was uploaded"
    );

    // And none there: the error says what to do.
    std::fs::remove_file(bin.path().join("knob-agent")).unwrap();
    let events = Events::default();
    let service = connect(args, &events, &agent_root(&sshd));
    let reason = not_ready_reason(&service);
    assert!(
        reason.contains("no knob-agent binary to upload") && reason.contains("set agentBinary"),
        "{reason}"
    );
}

/// The end of an experiment shuts the agent down, confirmed: in every round the daemon's log
/// ends with its shutdown and the daemon is gone. The rounds stop with no trial, after a trial
/// ended, and through drop as well as `stop`; the shutdown message used to be lost when the
/// connection closed right after it (2 of 8 real runs left the daemon running, its log ending
/// with "client dropped") (issue 20 item 13).
#[test]
fn the_end_of_the_experiment_shuts_the_agent_down_every_time() {
    use knob_training_services::agent_protocol::HostLayout;
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    const ROUNDS: usize = 8;
    for round in 0..ROUNDS {
        let experiment = format!("stop{round}");
        let events = Events::default();
        let mut args = world.args(vec![key_machine(&sshd)]);
        args["experimentId"] = json!(experiment);
        let mut service = connect(args, &events, &agent_root(&sshd));
        if round % 4 == 1 {
            service
                .start(&world.request(&sshd, "t", "echo KNOB_FINAL 1"))
                .unwrap();
            events.wait_ended("t");
        }
        if round % 2 == 0 {
            service.stop();
        }
        drop(service);

        let log_path = HostLayout {
            root: agent_root(&sshd),
        }
        .environment_dir(&experiment, &environment_id(&sshd))
        .join("agent.log");
        let deadline = std::time::Instant::now() + crate::support::WAIT;
        let log = loop {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if log.trim_end().ends_with("] exited") {
                break log;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: the agent did not exit after the experiment ended; {}:\n{log}",
                log_path.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert!(
            log.contains("shutdown requested"),
            "round {round}: the agent exited without being told to shut down:\n{log}"
        );
        let pid: i32 = log
            .lines()
            .last()
            .and_then(|line| line.strip_prefix("knob-agent["))
            .and_then(|rest| rest.split(']').next())
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("no pid in the log:\n{log}"));
        let gone_by = std::time::Instant::now() + crate::support::WAIT;
        while crate::support::process_runs(pid) {
            assert!(
                std::time::Instant::now() < gone_by,
                "round {round}: {pid} runs"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// The lease ledger of the fixture's "host" (the agents' `$KNOB_HOME` default under the
/// fixture's `HOME`).
fn host_ledger(sshd: &Sshd) -> knob_gpu_sched::ledger::Ledger {
    knob_gpu_sched::ledger::Ledger::open(sshd.dir().join(".local/share/knob")).unwrap()
}

/// Calls `check` until it returns `Some` (at most [`crate::support::WAIT`], every 100 ms);
/// panics naming `what` otherwise.
fn poll<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + crate::support::WAIT;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Two experiments share one remote host (one simulated GPU, `maxTrialNumberPerGpu: 1`), each
/// through its own agent, and both agents use the host's one ledger. The second one's trials
/// wait in its manager while the first holds the GPU: its inventory names the holder, and its
/// service (asked for environments again, as the core does while a trial waits) has its agent
/// stand in the host ledger's line. The first frees the GPU and at once asks for it again (an
/// experiment that refills): it waits behind the second, naming it, and the second's trial
/// runs first. The ledger's journal shows the GPU never held twice.
#[test]
fn two_experiments_on_one_host_share_its_ledger_first_come_first_served() {
    use knob_gpu_sched::ledger::{JournalEntry, STANDING};
    use knob_plugin_api::TrainingService;
    let Some(sshd) = start_sshd(SshdOptions {
        env: vec![("KNOB_SIMULATE_GPUS".into(), "1x16GiB".into())],
        ..key_options()
    }) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let machine = || {
        let mut machine = key_machine(&sshd);
        machine["maxTrialNumberPerGpu"] = json!(1);
        machine
    };
    let service_of = |experiment: &str, events: &Events| {
        let mut args = world.args(vec![machine()]);
        args["experimentId"] = json!(experiment);
        connect(args, events, &agent_root(&sshd))
    };
    let on_gpu = |experiment: &str, trial: &str, command: &str| {
        let mut request = world.request(&sshd, trial, command);
        request.experiment_id = experiment.into();
        request.gpu_indices = Some(vec![0]);
        request
    };
    let first_events = Events::default();
    let mut first = service_of("first", &first_events);
    let second_events = Events::default();
    let mut second = service_of("second", &second_events);

    let release = world.dir.path().join("release-a1");
    let hold = |path: &Path| {
        format!(
            "for i in $(seq 600); do [ -e {} ] && exit 0; sleep 0.05; done; exit 1",
            path.display()
        )
    };
    first
        .start(&on_gpu("first", "a1", &hold(&release)))
        .unwrap();
    first_events.wait_until("a1 started", |events| {
        events
            .iter()
            .any(|e| matches!(e, ServiceEvent::TrialStarted { trial_id, .. } if trial_id == "a1"))
    });

    // The second experiment's manager sees the GPU held by the first (its trial would wait,
    // naming it), and asks again while it waits: its agent stands in the host's line.
    let held_by = |service: &RemoteService| {
        let inventory = &service.environments_now()[0].inventory;
        inventory["gpus"][0]["held_elsewhere"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    TrainingService::environments(&mut second).unwrap();
    let holders = poll("the second's inventory to name a1 of first", || {
        let holders = held_by(&second);
        holders
            .iter()
            .any(|h| h["experiment"] == "first" && h["trial"] == "a1")
            .then_some(holders)
    });
    assert_eq!(holders.len(), 1, "{holders:?}");
    let standing_ticket = poll("the second's agent to stand in line", || {
        // Renewed as the core does while a trial waits.
        TrainingService::environments(&mut second).unwrap();
        let state = host_ledger(&sshd).snapshot().unwrap();
        state
            .requests
            .iter()
            .find(|r| r.lease.trial == STANDING && r.lease.holder.experiment == "second")
            .map(|r| (r.lease.ticket, r.lease.gpus.clone()))
    });
    assert_eq!(standing_ticket.1, vec![0]);

    // The first frees the GPU and refills it at once: its new trial waits behind the second.
    std::fs::write(&release, "").unwrap();
    first_events.wait_ended("a1");
    first
        .start(&on_gpu("first", "a2", "echo KNOB_FINAL 2"))
        .unwrap();
    let reason = poll("a2 to wait, naming the second experiment", || {
        TrainingService::environments(&mut second).unwrap();
        warnings(&of_trial(&first_events.all(), "a2"))
            .into_iter()
            .find(|w| w.starts_with("waiting: "))
    });
    assert!(
        reason.contains("promised first to the waiting trials of experiment second (pid "),
        "{reason}"
    );
    assert!(
        !first_events
            .all()
            .iter()
            .any(|e| matches!(e, ServiceEvent::TrialStarted { trial_id, .. } if trial_id == "a2")),
        "a2 started before the second experiment's waiting trial"
    );
    // The second's trial takes the place it stood in, and runs.
    second
        .start(&on_gpu("second", "b1", "sleep 0.5; echo KNOB_FINAL 1"))
        .unwrap();
    let b1 = second_events.wait_ended("b1");
    assert_eq!(ending(&b1).0, Some(0), "{b1:#?}");
    let a2 = first_events.wait_ended("a2");
    assert_eq!(ending(&a2).0, Some(0), "{a2:#?}");

    // Replayed, the journal never has two trials on the GPU, and b1 was granted before a2.
    let journal = std::fs::read_to_string(host_ledger(&sshd).journal_path()).unwrap();
    let entries: Vec<JournalEntry> = journal
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let mut holding: Vec<String> = Vec::new();
    for entry in &entries {
        let who = format!("{}/{}", entry.experiment, entry.trial);
        match entry.op.as_str() {
            "grant" => {
                holding.push(who);
                assert!(holding.len() <= 1, "GPU 0 held by {holding:?}:\n{journal}");
            }
            _ => holding.retain(|h| *h != who),
        }
    }
    let grants: Vec<String> = entries
        .iter()
        .filter(|e| e.op == "grant")
        .map(|e| format!("{}/{}", e.experiment, e.trial))
        .collect();
    assert_eq!(
        grants,
        ["first/a1", "second/b1", "first/a2"],
        "served first come, first served:\n{journal}"
    );
    first.stop();
    second.stop();
}

/// Once none of an experiment's trials waits any more (the host's `nothing_waits`), its agent
/// leaves the host ledger's line at once: the GPU it stood for is granted to another
/// experiment now, not once its place lapses (`STANDING_TTL`, 12 s), as it was before the agent
/// protocol could say so.
#[test]
fn a_remote_experiment_whose_trials_no_longer_wait_leaves_the_hosts_line_at_once() {
    use knob_gpu_sched::ledger::{Acquired, Holder, STANDING, STANDING_TTL};
    use knob_plugin_api::TrainingService;
    let Some(sshd) = start_sshd(SshdOptions {
        env: vec![("KNOB_SIMULATE_GPUS".into(), "1x16GiB".into())],
        ..key_options()
    }) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let mut machine = key_machine(&sshd);
    machine["maxTrialNumberPerGpu"] = json!(1);
    let mut args = world.args(vec![machine]);
    args["experimentId"] = json!("second");
    let events = Events::default();
    let mut second = connect(args, &events, &agent_root(&sshd));
    // Another experiment holds the GPU, so the second's waiting trials stand in line for it.
    let ledger = host_ledger(&sshd);
    let first = Holder::this_process("first");
    let on_gpu_0 = |trial: &str| {
        crate::support::gpu_0_lease(&first, trial, knob_gpu_sched::ledger::THIS_MACHINE)
    };
    assert_eq!(ledger.acquire(&on_gpu_0("a1")).unwrap(), Acquired::Granted);
    let stands = || {
        ledger
            .snapshot()
            .unwrap()
            .requests
            .iter()
            .any(|r| r.lease.trial == STANDING && r.lease.holder.experiment == "second")
    };
    TrainingService::environments(&mut second).unwrap();
    poll("the second's agent to stand in line", || {
        TrainingService::environments(&mut second).unwrap();
        stands().then_some(())
    });
    let stood = std::time::Instant::now();
    // The first frees the GPU and asks for it again: the second's place comes first.
    ledger.release(&first, "a1").unwrap();
    assert!(matches!(
        ledger.acquire(&on_gpu_0("a2")).unwrap(),
        Acquired::Waiting(_)
    ));
    // The second's manager has nothing waiting any more.
    TrainingService::nothing_waits(&mut second).unwrap();
    poll("the second's agent to leave the line", || {
        (!stands()).then_some(())
    });
    assert!(
        stood.elapsed() < STANDING_TTL,
        "left only as the place lapsed ({:?})",
        stood.elapsed()
    );
    assert_eq!(ledger.acquire(&on_gpu_0("a2")).unwrap(), Acquired::Granted);
    ledger.release(&first, "a2").unwrap();
    second.stop();
}

/// The folder named after `from=` in a trial's stderr.
fn restore_from(stderr: &str) -> PathBuf {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("from="))
        .unwrap_or_else(|| panic!("no from= line: {stderr}"));
    PathBuf::from(line)
}

#[test]
fn a_successor_starts_from_a_copy_of_its_parents_checkpoint_on_either_host() {
    let Some(first) = start_sshd(key_options()) else {
        return;
    };
    let second = start_sshd(key_options()).unwrap();
    let world = World::new();
    world.trust(&first);
    world.trust(&second);
    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&first), key_machine(&second)]),
        &events,
        &agent_root(&first),
    );
    // The parent saves a checkpoint on the first host.
    service
        .start(&world.request(
            &first,
            "parent",
            "mkdir -p \"$KNOB_CHECKPOINT_DIR/sub\" && echo step-7 > \"$KNOB_CHECKPOINT_DIR/sub/state\" && echo KNOB_FINAL 1",
        ))
        .unwrap();
    assert_eq!(ending(&events.wait_ended("parent")).0, Some(0));
    // Its successors, on the other host (a copy through this machine) and on the same one.
    let mut copies = Vec::new();
    for (host, child) in [(&second, "child-there"), (&first, "child-here")] {
        let mut request = world.request(
            host,
            child,
            "echo \"from=$KNOB_RESTORE_FROM\" >&2; cat \"$KNOB_RESTORE_FROM/sub/state\" >&2; echo KNOB_FINAL 1",
        );
        request
            .env
            .insert("KNOB_RESTORE_TRIAL".to_string(), "parent".to_string());
        service.start(&request).unwrap();
        let (code, _, _, stderr) = ending(&events.wait_ended(child));
        assert_eq!(code, Some(0), "{stderr}");
        assert!(stderr.contains("step-7"), "{child}: {stderr}");
        let from = restore_from(&stderr);
        assert!(
            from.ends_with(format!("trials/{child}/restore")),
            "{child}: {stderr}"
        );
        copies.push(from);
    }
    // The copies stay when an attempt ends (a retry starts from them too), and are deleted
    // on their hosts once the successors need them no more; the parent's folder stays.
    std::thread::sleep(std::time::Duration::from_millis(300));
    for (copy, child) in copies.iter().zip(["child-there", "child-here"]) {
        assert!(copy.join("sub/state").exists(), "{} gone", copy.display());
        TrainingService::delete_snapshot(&mut service, child).unwrap();
    }
    for copy in &copies {
        for _ in 0..100 {
            if !copy.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(!copy.exists(), "{} kept", copy.display());
    }
    assert!(copies[1]
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("parent/checkpoint/sub/state")
        .exists());
    service.stop();
}

/// The folder named after `ckpt=` in a trial's stderr.
fn checkpoint_from(stderr: &str) -> PathBuf {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("ckpt="))
        .unwrap_or_else(|| panic!("no ckpt= line: {stderr}"));
    PathBuf::from(line)
}

/// Waits (at most 10 s) until `dir` is gone.
fn wait_gone(dir: &Path) -> bool {
    for _ in 0..100 {
        if !dir.exists() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    !dir.exists()
}

#[test]
fn a_checkpoint_no_member_needs_is_deleted_on_every_host_that_has_it_and_the_others_stay() {
    let Some(first) = start_sshd(key_options()) else {
        return;
    };
    let second = start_sshd(key_options()).unwrap();
    let world = World::new();
    world.trust(&first);
    world.trust(&second);
    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&first), key_machine(&second)]),
        &events,
        &agent_root(&first),
    );
    // Both hosts connected (bounded): each runs a trial.
    for _ in 0..600 {
        if service
            .environments_now()
            .iter()
            .filter(|e| e.ready)
            .count()
            == 2
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let save = "mkdir -p \"$KNOB_CHECKPOINT_DIR/sub\" && echo state > \"$KNOB_CHECKPOINT_DIR/sub/state\" && echo \"ckpt=$KNOB_CHECKPOINT_DIR\" >&2 && echo KNOB_FINAL 1";
    // `replaced` ran on both hosts (run again after a host loss, say), `living` on the first.
    let mut folders = Vec::new();
    for (host, trial, run) in [
        (&first, "replaced", 1),
        (&second, "replaced", 2),
        (&first, "living", 1),
    ] {
        service.start(&world.request(host, trial, save)).unwrap();
        let all = events.wait_until(&format!("run {run} of {trial} to end"), |events| {
            events.iter().filter(|e| is_end_of(e, trial)).count() == run
        });
        let (code, _, _, stderr) = ending(&of_trial(&all, trial));
        assert_eq!(code, Some(0), "{stderr}");
        let folder = checkpoint_from(&stderr);
        assert!(folder.join("sub/state").exists(), "{}", folder.display());
        folders.push(folder);
    }
    assert_ne!(folders[0], folders[1], "one folder per host");
    // An id that is not a plain trial id deletes nothing.
    TrainingService::delete_checkpoint(&mut service, "replaced/../living").unwrap();
    TrainingService::delete_checkpoint(&mut service, "replaced").unwrap();
    for folder in &folders[..2] {
        assert!(wait_gone(folder), "{} kept", folder.display());
        // Only the checkpoint goes: the trial's folder, with its logs, stays.
        assert!(folder.parent().unwrap().is_dir(), "{}", folder.display());
    }
    assert!(
        folders[2].join("sub/state").exists(),
        "a checkpoint still needed was deleted: {}",
        folders[2].display()
    );
    service.stop();
}

/// Waits (at most 30 s) until `check` holds.
fn wait_for(what: &str, check: impl Fn() -> bool) {
    for _ in 0..300 {
        if check() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(check(), "{what} did not happen within 30 s");
}

/// Two sshd's on 127.0.0.1 with key authentication; `None` (the test returns) without
/// `KNOB_TEST_SSHD`.
fn two_key_hosts() -> Option<(Sshd, Sshd)> {
    let first = start_sshd(key_options())?;
    Some((first, start_sshd(key_options()).unwrap()))
}

/// A remote service of `hosts` (trusted by `world`; the agent's root under the first), once
/// every host is connected and ready.
fn connect_all<const N: usize>(world: &World, events: &Events, hosts: [&Sshd; N]) -> RemoteService {
    for host in hosts {
        world.trust(host);
    }
    let service = connect(
        world.args(hosts.iter().map(|host| key_machine(host)).collect()),
        events,
        &agent_root(hosts[0]),
    );
    wait_for("every host connected", || {
        service
            .environments_now()
            .iter()
            .filter(|e| e.ready)
            .count()
            == N
    });
    service
}

/// Starts trial `parent` on `host`: it writes `step-1` to `state` (a path in its checkpoint
/// folder), then waits (at most 30 s) for the file `go` before it writes `step-2` there and
/// ends. Returns once step 1 is saved, with the parent's checkpoint folder and `go`.
fn start_parent_at_step_one(
    world: &World,
    service: &mut RemoteService,
    host: &Sshd,
    state: &str,
) -> (PathBuf, PathBuf) {
    let (told, go) = (
        world.dir.path().join("parent-ckpt"),
        world.dir.path().join("go"),
    );
    let parent = format!(
        "mkdir -p \"$(dirname \"$KNOB_CHECKPOINT_DIR/{state}\")\" && echo step-1 > \"$KNOB_CHECKPOINT_DIR/{state}\" && echo \"$KNOB_CHECKPOINT_DIR\" > {told}.tmp && mv {told}.tmp {told} && echo KNOB_INTERMEDIATE 1 && for i in $(seq 600); do [ -e {go} ] && break; sleep 0.05; done && echo step-2 > \"$KNOB_CHECKPOINT_DIR/{state}\" && echo KNOB_FINAL 2",
        told = told.display(),
        go = go.display()
    );
    service
        .start(&world.request(host, "parent", &parent))
        .unwrap();
    wait_for("the parent's step 1", || told.exists());
    let folder = PathBuf::from(std::fs::read_to_string(&told).unwrap().trim());
    (folder, go)
}

/// The bug of Ray Tune's ray#28509: a successor that starts after its parent overwrote its
/// checkpoint must still start from the parent's state when it was created. The parent saves
/// step 1, its successors are created (snapshots asked for), then it saves step 2, and only
/// then do they start: on the other host (the copy moved through this machine) and on the
/// parent's. A successor created without a snapshot (a service that takes none) gets step 2:
/// what the snapshot is for.
#[test]
fn a_successor_starts_from_its_parents_checkpoint_as_it_was_when_it_was_created() {
    let Some((first, second)) = two_key_hosts() else {
        return;
    };
    let (world, events) = (World::new(), Events::default());
    let mut service = connect_all(&world, &events, [&first, &second]);
    let (parent_folder, go) = start_parent_at_step_one(&world, &mut service, &first, "state");
    let trials = parent_folder
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    // The exploitation: the successors are created now; the parent keeps training.
    for child in ["child-there", "child-here"] {
        assert_eq!(
            TrainingService::snapshot_checkpoint(&mut service, child, "parent"),
            Ok(true)
        );
    }
    // A donor this service never ran: no copy (its successor starts from the folder as it is).
    assert_eq!(
        TrainingService::snapshot_checkpoint(&mut service, "child-x", "stranger"),
        Ok(false)
    );
    for child in ["child-there", "child-here"] {
        let copy = trials.join(child).join("restore/state");
        wait_for(&format!("the copy for {child}"), || copy.exists());
    }
    std::fs::write(&go, "").unwrap();
    assert_eq!(ending(&events.wait_ended("parent")).0, Some(0));
    assert_eq!(
        std::fs::read_to_string(parent_folder.join("state")).unwrap(),
        "step-2\n"
    );
    let successor = "echo \"from=$KNOB_RESTORE_FROM\" >&2; cat \"$KNOB_RESTORE_FROM/state\" >&2; echo KNOB_FINAL 1";
    for (host, child, restored) in [
        (&second, "child-there", "step-1"),
        (&first, "child-here", "step-1"),
        (&second, "child-late", "step-2"),
    ] {
        let mut request = world.request(host, child, successor);
        request
            .env
            .insert("KNOB_RESTORE_TRIAL".to_string(), "parent".to_string());
        service.start(&request).unwrap();
        let (code, _, _, stderr) = ending(&events.wait_ended(child));
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            stderr.lines().any(|l| l == restored),
            "{child} restored something else than {restored}: {stderr}"
        );
        assert!(
            restore_from(&stderr).ends_with(format!("trials/{child}/restore")),
            "{child}: {stderr}"
        );
    }
    // The copy moved with the successor to the other host: none is left on the parent's.
    assert!(!trials.join("child-there/restore").exists());
    assert!(warnings(&events.all()).is_empty(), "{:?}", events.all());
    service.stop();
}

/// The bug of ray#28509 again, for a retry: a successor's first attempt fails after its parent
/// overwrote its checkpoint, and its second attempt, on the other host, must start from the
/// same frozen copy as the first (the parent's state when the successor was created), not from
/// the parent's folder as it is by then. The copy stays until the successor needs it no more
/// (`delete_snapshot`).
#[test]
fn a_successors_retry_starts_from_the_same_copy_as_its_first_attempt() {
    let Some((first, second)) = two_key_hosts() else {
        return;
    };
    let (world, events) = (World::new(), Events::default());
    let mut service = connect_all(&world, &events, [&first, &second]);
    let (parent_folder, go) = start_parent_at_step_one(&world, &mut service, &first, "state");
    assert_eq!(
        TrainingService::snapshot_checkpoint(&mut service, "child", "parent"),
        Ok(true)
    );
    let first_trials = parent_folder.parent().unwrap().parent().unwrap();
    wait_for("the copy for child", || {
        first_trials.join("child/restore/state").exists()
    });
    std::fs::write(&go, "").unwrap();
    assert_eq!(ending(&events.wait_ended("parent")).0, Some(0));
    // The first attempt, on the parent's host, fails; the second runs on the other host.
    let report = "echo \"from=$KNOB_RESTORE_FROM\" >&2; cat \"$KNOB_RESTORE_FROM/state\" >&2";
    let mut attempt = world.request(&first, "child", &format!("{report}; exit 1"));
    attempt
        .env
        .insert("KNOB_RESTORE_TRIAL".to_string(), "parent".to_string());
    service.start(&attempt).unwrap();
    let (code, _, _, stderr) = ending(&events.wait_ended("child"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.lines().any(|l| l == "step-1"), "{stderr}");
    let mut retry = world.request(&second, "child", &format!("{report}; echo KNOB_FINAL 1"));
    retry.trial_dir = world.dir.path().join("trials/child/attempt-2");
    retry
        .env
        .insert("KNOB_RESTORE_TRIAL".to_string(), "parent".to_string());
    service.start(&retry).unwrap();
    let all = events.wait_until("the second attempt of child to end", |events| {
        events.iter().filter(|e| is_end_of(e, "child")).count() == 2
    });
    let (code, _, _, stderr) = ending(&of_trial(&all, "child"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.lines().any(|l| l == "step-1"),
        "the retry restored something else than the first attempt's step-1: {stderr}"
    );
    let copy = restore_from(&stderr);
    assert!(copy.ends_with("trials/child/restore"), "{stderr}");
    assert!(
        !first_trials.join("child/restore").exists(),
        "moved, not copied"
    );
    // Kept after the end of an attempt; deleted once asked.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(copy.join("state").exists(), "{} gone", copy.display());
    TrainingService::delete_snapshot(&mut service, "child").unwrap();
    assert!(wait_gone(&copy), "{} kept", copy.display());
    assert!(warnings(&events.all()).is_empty(), "{:?}", events.all());
    service.stop();
}

/// A successor that ends before it starts (stopped as it was created): the deletion of its
/// checkpoint folder comes while the copy of its donor's folder is still being taken, and must
/// not leave that copy behind once it lands (it did: the `rm -rf` ran first).
#[test]
fn a_checkpoint_deletion_waits_for_the_copy_still_being_taken_for_it() {
    let Some(host) = start_sshd(key_options()) else {
        return;
    };
    let (world, events) = (World::new(), Events::default());
    let mut service = connect_all(&world, &events, [&host]);
    let (parent_folder, go) = start_parent_at_step_one(&world, &mut service, &host, "state");
    // Enough files that the copy takes a while.
    let bulk = parent_folder.join("bulk");
    std::fs::create_dir_all(&bulk).unwrap();
    for i in 0..3000 {
        std::fs::write(bulk.join(i.to_string()), "x").unwrap();
    }
    let child = parent_folder
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("child");
    assert_eq!(
        TrainingService::snapshot_checkpoint(&mut service, "child", "parent"),
        Ok(true)
    );
    TrainingService::delete_checkpoint(&mut service, "child").unwrap();
    std::fs::write(&go, "").unwrap();
    assert_eq!(ending(&events.wait_ended("parent")).0, Some(0));
    // Stopping waits for the deletions under way.
    service.stop();
    for left in ["restore", "restore.partial"] {
        assert!(
            !child.join(left).exists(),
            "{} kept",
            child.join(left).display()
        );
    }
    assert!(
        parent_folder.join("bulk/2999").exists(),
        "the donor's own folder goes only when asked"
    );
}

/// Mixed services: a parent that ran on this machine (the local service; its folder is here,
/// and the core copied it to the successor's `restore/` here as the successor was created)
/// with its successor placed on a remote host. The successor starts from that copy, uploaded;
/// without one, from the parent's folder here.
#[test]
fn a_successor_of_a_parent_that_ran_on_this_machine_starts_from_the_cores_copy_uploaded() {
    let Some(host) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    world.trust(&host);
    let events = Events::default();
    let mut service = connect(
        world.args(vec![key_machine(&host)]),
        &events,
        &agent_root(&host),
    );
    let trials = world.dir.path().join("trials");
    // The parent's folder here has moved on to step 2; the core's copy holds step 1.
    std::fs::create_dir_all(trials.join("parent/checkpoint/sub")).unwrap();
    std::fs::write(trials.join("parent/checkpoint/sub/state"), "step-2\n").unwrap();
    std::fs::create_dir_all(trials.join("child/restore/sub")).unwrap();
    std::fs::write(trials.join("child/restore/sub/state"), "step-1\n").unwrap();
    let report = "echo \"from=$KNOB_RESTORE_FROM\" >&2; cat \"$KNOB_RESTORE_FROM/sub/state\" >&2; echo KNOB_FINAL 1";
    for (child, restored) in [("child", "step-1"), ("child-uncopied", "step-2")] {
        let mut request = world.request(&host, child, report);
        request
            .env
            .insert("KNOB_RESTORE_TRIAL".to_string(), "parent".to_string());
        service.start(&request).unwrap();
        let (code, _, _, stderr) = ending(&events.wait_ended(child));
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            stderr.lines().any(|l| l == restored),
            "{child} restored something else than {restored}: {stderr}"
        );
        let from = restore_from(&stderr);
        assert!(
            from.ends_with(format!("trials/{child}/restore")),
            "{stderr}"
        );
        assert!(
            !from.starts_with(world.dir.path()),
            "the host's own: {stderr}"
        );
    }
    assert!(warnings(&events.all()).is_empty(), "{:?}", events.all());
    service.stop();
}

/// Mixed services the other way: a parent that ran on a remote host with its successor under
/// another service (the local one): the copy taken as the successor was created comes to this
/// machine (`fetch_snapshot`), moved, even though the parent trained on; without a copy, the
/// parent's folder as it is; a donor no host has a folder of brings nothing.
#[test]
fn a_successor_under_another_service_gets_the_copy_brought_to_this_machine() {
    let Some(host) = start_sshd(key_options()) else {
        return;
    };
    let (world, events) = (World::new(), Events::default());
    let mut service = connect_all(&world, &events, [&host]);
    let (parent_folder, go) = start_parent_at_step_one(&world, &mut service, &host, "sub/state");
    let host_trials = parent_folder.parent().unwrap().parent().unwrap();
    assert_eq!(
        TrainingService::snapshot_checkpoint(&mut service, "child", "parent"),
        Ok(true)
    );
    wait_for("the copy for child", || {
        host_trials.join("child/restore/sub/state").exists()
    });
    std::fs::write(&go, "").unwrap();
    assert_eq!(ending(&events.wait_ended("parent")).0, Some(0));
    let here = world.dir.path().join("trials");
    for (child, restored) in [("child", "step-1\n"), ("child-late", "step-2\n")] {
        let dest = here.join(child).join("restore");
        assert_eq!(
            TrainingService::fetch_snapshot(&mut service, child, "parent", &dest),
            Ok(true)
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("sub/state")).unwrap(),
            restored,
            "{child}"
        );
        assert!(!dest.with_extension("partial").exists());
    }
    assert!(
        !host_trials.join("child/restore").exists(),
        "moved, not copied"
    );
    assert!(host_trials.join("parent/checkpoint/sub/state").exists());
    let stranger = here.join("child-x/restore");
    assert_eq!(
        TrainingService::fetch_snapshot(&mut service, "child-x", "stranger", &stranger),
        Ok(false)
    );
    assert!(!stranger.exists());
    assert!(warnings(&events.all()).is_empty(), "{:?}", events.all());
    service.stop();
}

/// A code directory that cannot be archived (`knob config check` refuses it; here it became so
/// after the check: files added) fails its first start without walking the directory again for
/// every trial, and makes the hosts not ready with the reason, so that trials wait instead of
/// each failing on it in turn (40 trials FAILED in 1.5 s, each walking and compressing the
/// directory again). Once the directory can be archived again the hosts are ready and trials
/// start.
#[test]
fn a_code_directory_that_cannot_be_archived_makes_the_hosts_wait_until_it_can() {
    let Some(sshd) = start_sshd(key_options()) else {
        return;
    };
    let world = World::new();
    let events = Events::default();
    let mut service = connect_all(&world, &events, [&sshd]);
    let many = world.code_dir().join("many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..2100 {
        std::fs::write(many.join(format!("f{i}")), "").unwrap();
    }
    let error = service
        .start(&world.request(&sshd, "a1", "echo KNOB_FINAL 1"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("holds more than 2000 files") && error.contains("the trial was not started"),
        "{error}"
    );
    // The host is not ready, with the reason, in its report and in an event at once.
    let reason = not_ready_reason(&service);
    assert!(reason.contains("holds more than 2000 files"), "{reason}");
    assert!(
        events.all().iter().any(|event| matches!(
            event,
            ServiceEvent::Environment { environment } if !environment.ready
                && why_not_ready(environment).contains("holds more than 2000 files")
        )),
        "{:?}",
        events.all()
    );
    // The failure is kept: a directory that could be archived now but was not walked again
    // (asked for no environments since) fails the next start the same way at once.
    std::fs::remove_dir_all(&many).unwrap();
    let error = service
        .start(&world.request(&sshd, "a2", "echo KNOB_FINAL 1"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("holds more than 2000 files"), "{error}");
    // The core asks for the environments while trials wait: the directory is walked again,
    // and the host is ready.
    let environments = service.environments().unwrap();
    assert!(environments[0].ready, "{environments:?}");
    service
        .start(&world.request(&sshd, "a3", "echo KNOB_FINAL 1"))
        .unwrap();
    assert_eq!(ending(&events.wait_ended("a3")).0, Some(0));
    service.stop();
}

/// Many commands asked of one host at once (a resume deleting a dozen replaced members'
/// checkpoint folders) all run: sshd refuses session channels past its `MaxSessions` (10 by
/// default, "no more sessions"), and a third of such deletions failed with "Failed to open
/// channel (ConnectFailed)", the folders kept.
#[test]
fn many_commands_at_once_on_one_connection_all_run() {
    // OpenSSH's default.
    let Some(sshd) = start_sshd(SshdOptions {
        max_sessions: Some(10),
        ..key_options()
    }) else {
        return;
    };
    let world = World::new();
    world.trust(&sshd);
    let args =
        knob_training_services::remote::RemoteArgs::parse(&world.args(vec![key_machine(&sshd)]))
            .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let failures: Vec<String> = runtime.block_on(async {
        let connection = std::sync::Arc::new(
            knob_training_services::remote::ssh::connect(
                &args.machines[0],
                &args.known_hosts_file,
                std::time::Duration::from_secs(5),
            )
            .await
            .unwrap(),
        );
        let runs: Vec<_> = (0..24)
            .map(|i| {
                let connection = connection.clone();
                tokio::spawn(async move {
                    let limit = std::time::Duration::from_secs(60);
                    let output = connection
                        .run(&format!("sleep 0.3; echo {i}"), None, limit)
                        .await;
                    match output {
                        Ok(output)
                            if output.status == Some(0)
                                && output.stdout_text().trim() == i.to_string() =>
                        {
                            None
                        }
                        Ok(output) => Some(format!("{i}: {output:?}")),
                        Err(e) => Some(format!("{i}: {e}")),
                    }
                })
            })
            .collect();
        let mut failures = Vec::new();
        for run in runs {
            failures.extend(run.await.unwrap());
        }
        failures
    });
    assert!(failures.is_empty(), "{failures:#?}");
}
