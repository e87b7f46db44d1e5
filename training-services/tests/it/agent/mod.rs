//! knob-agent, the real binary, driven over the pipes of `knob-agent attach` as the remote
//! service drives it over SSH (no SSH here: the pipes are what SSH would carry).

mod client;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use knob_plugin_api::service::{MetricKind, ServiceEvent, TrialRequest};
use knob_training_services::agent_protocol::{
    FromAgent, ToAgent, CODE_COMPLETE_MARKER, PROTOCOL_VERSION,
};

use crate::support::{
    cpu_used_over, in_child_process, metrics, process_runs, use_up_descriptors_but_one, WAIT,
};
use client::{of_trial, read_pid, wait_gone, welcome_pid, Attached, Host, AGENT, ENVIRONMENT};

#[test]
fn version_line_names_version_protocol_and_architecture() {
    let output = Command::new(AGENT).arg("--version").output().unwrap();
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8(output.stdout).unwrap().trim(),
        format!(
            "knob-agent {} protocol {PROTOCOL_VERSION} {}",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::ARCH
        )
    );
}

#[test]
fn hello_is_welcomed_with_the_hosts_inventory() {
    let host = Host::new();
    let mut agent = Attached::start(&host.dir(), &[], &[("KNOB_SIMULATE_GPUS", "2x16GiB")]);
    let welcome = agent.hello(0, true);
    let FromAgent::Welcome {
        protocol,
        inventory,
        running,
        agent_version,
        ..
    } = &welcome
    else {
        panic!("expected a welcome, got {welcome:?}");
    };
    assert_eq!(*protocol, PROTOCOL_VERSION);
    assert_eq!(agent_version, env!("CARGO_PKG_VERSION"));
    assert!(running.is_empty());
    let environment: knob_gpu_sched::Environment =
        serde_json::from_value(inventory.clone()).unwrap();
    assert_eq!(environment.id.0, ENVIRONMENT);
    assert_eq!(environment.gpus.len(), 2);
    assert!(environment.host_resources.cpu_count > 0);

    agent.send(&ToAgent::Ping { nonce: 9 });
    assert_eq!(agent.next(), FromAgent::Pong { nonce: 9 });
    agent.send(&ToAgent::Shutdown);
    assert!(agent.wait_exit().success());
    wait_gone(welcome_pid(&welcome) as i32, "the daemon");
    assert!(!host.dir().join("agent.sock").exists());
}

/// A host whose lease ledger cannot be read (a `gpu-ledger.json` knob did not write) is
/// welcomed with its GPUs, as the `local` service reports this machine, and the service is told
/// once why other experiments' trials are not seen there. The agent refused such a host to every
/// experiment ("knob-agent cannot describe this host").
#[test]
fn a_host_whose_lease_ledger_cannot_be_read_is_welcomed_and_says_so_once() {
    let host = Host::new();
    let home = host.dir().join("knob-home");
    std::fs::create_dir_all(&home).unwrap();
    let ledger = home.join("gpu-ledger.json");
    std::fs::write(&ledger, "garbage{").unwrap();
    let mut agent = Attached::start(&host.dir(), &[], &[("KNOB_SIMULATE_GPUS", "2x16GiB")]);
    let welcome = agent.hello(0, true);
    let FromAgent::Welcome { inventory, .. } = &welcome else {
        panic!("expected a welcome, got {welcome:?}");
    };
    let environment: knob_gpu_sched::Environment =
        serde_json::from_value(inventory.clone()).unwrap();
    assert_eq!(environment.gpus.len(), 2);
    agent.start_trial(1, host.request("t", "echo KNOB_FINAL 1"), false);
    agent.until_ended("t");
    // The end's probe finds the same ledger: not said again.
    let probes = agent.inventories.len();
    let deadline = Instant::now() + WAIT;
    while agent.inventories.len() == probes {
        assert!(Instant::now() < deadline, "no probe after the trial's end");
        agent.next_any();
    }
    let warnings: Vec<&String> = agent
        .events
        .iter()
        .filter_map(|(_, event)| match event {
            ServiceEvent::Warning { message, .. } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].starts_with("cannot read this host's lease ledger")
            && warnings[0].contains(&ledger.display().to_string()),
        "{}",
        warnings[0]
    );
    agent.send(&ToAgent::Shutdown);
    assert!(agent.wait_exit().success());
}

#[test]
fn trials_report_metrics_over_knob_and_nni_protocols_then_end() {
    let host = Host::new();
    let mut agent = host.attach();
    agent.hello(0, true);
    let knob = "echo KNOB_INTERMEDIATE 0.5; echo KNOB_FINAL '{\"default\": 0.9}'; echo oops >&2";
    agent.start_trial(1, host.request("knob", knob), false);
    let nni = r#"rec='{"parameter_id": 42, "trial_job_id": "nni", "type": "FINAL", "sequence": 0, "value": "0.75"}'; printf 'ME%06d%s\n' $((${#rec} + 1)) "$rec" >> "$NNI_SYS_DIR/.nni/metrics"; test "$NNI_PLATFORM" = local"#;
    agent.start_trial(2, host.request("nni", nni), false);
    agent.until_ended("knob");
    agent.until_ended("nni");

    let knob_events = of_trial(&agent.events, "knob");
    assert!(matches!(knob_events[0], ServiceEvent::TrialStarted { .. }));
    assert_eq!(
        metrics(&knob_events),
        [
            (MetricKind::Intermediate, 0, "0.5".to_string()),
            (MetricKind::Final, 0, r#"{"default": 0.9}"#.to_string()),
        ]
    );
    let (exit_code, _, killed, stderr) = crate::support::ending(&knob_events);
    assert_eq!(
        (exit_code, killed, stderr.as_str()),
        (Some(0), None, "oops")
    );
    let nni_events = of_trial(&agent.events, "nni");
    assert_eq!(
        metrics(&nni_events),
        [(MetricKind::Final, 0, "0.75".to_string())]
    );
    assert_eq!(crate::support::ending(&nni_events).0, Some(0));
    // Numbered 1, 2, 3, ... without gaps.
    let seqs: Vec<u64> = agent.events.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert!(host.trial_dir("knob").join("stdout").exists());
    // The host is probed again after trials end.
    let deadline = Instant::now() + WAIT;
    while agent.inventories.is_empty() {
        assert!(Instant::now() < deadline, "no inventory after trials ended");
        agent.next_any();
    }
    assert_eq!(agent.inventories[0].id.0, ENVIRONMENT);

    // Errors are one-line replies: a second attempt of a running trial, a missing code
    // directory, an unknown kill. (The same attempt again is answered like the first: see
    // `a_start_sent_again_runs_its_attempt_once_and_a_new_attempt_runs`.)
    let sleeper = host.request("dup", "sleep 30");
    agent.start_trial(3, sleeper.clone(), false);
    let mut second_attempt = sleeper;
    second_attempt.trial_dir = second_attempt.trial_dir.join("attempt-2");
    agent.send(&ToAgent::Start {
        id: 4,
        request: Box::new(second_attempt),
        fresh_code_copy: false,
    });
    assert_eq!(
        agent.reply_to(4).unwrap(),
        "trial dup is already running; trial ids must be unique"
    );
    let mut missing = host.request("missing", "true");
    missing.code_dir = host.root.path().join("nowhere");
    agent.send(&ToAgent::Start {
        id: 5,
        request: Box::new(missing),
        fresh_code_copy: false,
    });
    let error = agent.reply_to(5).unwrap();
    assert!(error.contains("nowhere does not exist"), "{error}");
    agent.send(&ToAgent::Kill {
        id: 6,
        trial_id: "ghost".into(),
        reason: "x".into(),
    });
    assert_eq!(
        agent.reply_to(6).unwrap(),
        "trial ghost is not running on this host (it may have just ended)"
    );
    agent.send(&ToAgent::Kill {
        id: 7,
        trial_id: "dup".into(),
        reason: "early stop at step 3".into(),
    });
    assert_eq!(agent.reply_to(7), None);
    agent.until_ended("dup");
    let (_, signal, killed, _) = crate::support::ending(&of_trial(&agent.events, "dup"));
    assert_eq!(killed.as_deref(), Some("early stop at step 3"));
    assert_eq!(signal, Some(15));
    agent.send(&ToAgent::Shutdown);
    assert!(agent.wait_exit().success());
}

#[test]
fn reattach_replays_missed_events_exactly_once_and_the_trial_keeps_running() {
    let host = Host::new();
    let mut first = host.attach();
    let daemon = welcome_pid(&first.hello(0, true));
    let go = host.root.path().join("go");
    let command = format!(
        "echo $$ > \"$KNOB_TRIAL_DIR/pid\"; echo KNOB_INTERMEDIATE 1; while [ ! -e {go} ]; do sleep 0.05; done; echo KNOB_FINAL 2",
        go = go.display()
    );
    first.start_trial(1, host.request("t", &command), false);
    first.until("the first metric", |events| {
        events
            .iter()
            .any(|(_, e)| matches!(e, ServiceEvent::Metric { .. }))
    });
    let seen = first.events.last().unwrap().0;
    first.send(&ToAgent::Ack { seq: seen });
    let trial_pid = read_pid(&host.trial_dir("t").join("pid"));
    // The SSH connection drops: attach dies, the trial goes on and reports while no one listens.
    first.kill();
    std::fs::write(&go, "").unwrap();
    let deadline = Instant::now() + WAIT;
    while process_runs(trial_pid) {
        assert!(Instant::now() < deadline, "the trial never finished");
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut second = host.attach();
    let welcome = second.hello(seen, false);
    assert_eq!(welcome_pid(&welcome), daemon, "the same daemon answers");
    second.until_ended("t");
    let replayed: Vec<ServiceEvent> = second.events.iter().map(|(_, e)| e.clone()).collect();
    assert_eq!(
        metrics(&replayed),
        [(MetricKind::Final, 0, "2".to_string())],
        "{replayed:#?}"
    );
    assert_eq!(second.events.first().unwrap().0, seen + 1);
    let (exit_code, _, killed, _) = crate::support::ending(&replayed);
    assert_eq!((exit_code, killed), (Some(0), None));
    // The final, the trial's memory use, its end.
    assert_eq!(replayed.len(), 3, "{replayed:#?}");
    assert!(
        matches!(replayed[1], ServiceEvent::TrialUsage { .. }),
        "{replayed:#?}"
    );

    // Acknowledged: a third connection gets nothing again.
    let last = second.events.last().unwrap().0;
    second.send(&ToAgent::Ack { seq: last });
    second.send(&ToAgent::Ping { nonce: 1 });
    assert_eq!(second.next(), FromAgent::Pong { nonce: 1 });
    second.kill();
    let mut third = host.attach();
    third.hello(last, false);
    third.send(&ToAgent::Ping { nonce: 2 });
    assert_eq!(third.next(), FromAgent::Pong { nonce: 2 });
    assert!(third.events.is_empty(), "{:#?}", third.events);
    third.send(&ToAgent::Shutdown);
    assert!(third.wait_exit().success());
}

#[test]
fn a_start_sent_again_runs_its_attempt_once_and_a_new_attempt_runs() {
    let host = Host::new();
    let runs = host.root.path().join("runs");
    let go = host.root.path().join("go");
    let command = format!(
        "echo \"$KNOB_TRIAL_DIR\" >> {runs}; while [ ! -e {go} ]; do sleep 0.05; done; echo KNOB_FINAL 1",
        runs = runs.display(),
        go = go.display()
    );
    let request = host.request("t", &command);
    let mut first = host.attach();
    first.hello(0, true);
    first.start_trial(1, request.clone(), false);
    // The reply is lost with the connection: the service sends the same start again.
    first.kill();
    let mut second = host.attach();
    second.hello(0, false);
    second.start_trial(2, request.clone(), false);
    // Twice at once on one connection, while it runs: both answered.
    second.send(&ToAgent::Start {
        id: 3,
        request: Box::new(request.clone()),
        fresh_code_copy: false,
    });
    second.start_trial(4, request.clone(), false);
    assert_eq!(second.reply_to(3), None);
    std::fs::write(&go, "").unwrap();
    second.until_ended("t");
    // After it ended too.
    second.start_trial(5, request.clone(), false);
    // Another attempt of the same trial (its own folder) is a new start.
    let mut retry = request.clone();
    retry.trial_dir = retry.trial_dir.join("attempt-2");
    std::fs::create_dir_all(&retry.trial_dir).unwrap();
    second.start_trial(6, retry.clone(), false);
    second.until("the second attempt's end", |events| {
        events
            .iter()
            .filter(|(_, e)| client::is_end_of(e, "t"))
            .count()
            == 2
    });
    let ran = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(
        ran.lines().collect::<Vec<_>>(),
        [
            request.trial_dir.to_str().unwrap(),
            retry.trial_dir.to_str().unwrap()
        ],
        "each attempt runs once"
    );
    second.send(&ToAgent::Shutdown);
    assert!(second.wait_exit().success());
}

#[test]
fn fresh_start_kills_what_a_previous_manager_left_running() {
    let host = Host::new();
    let mut first = host.attach();
    first.hello(0, true);
    first.start_trial(
        1,
        host.request("old", "echo $$ > \"$KNOB_TRIAL_DIR/pid\"; sleep 60"),
        false,
    );
    let pid = read_pid(&host.trial_dir("old").join("pid"));
    first.kill();

    let mut second = host.attach();
    let welcome = second.hello(0, true);
    let FromAgent::Welcome { running, .. } = &welcome else {
        panic!("{welcome:?}");
    };
    assert!(running.is_empty(), "{running:?}");
    assert!(!process_runs(pid));
    // The old trial's events were dropped with the rest of the buffer.
    second.send(&ToAgent::Ping { nonce: 3 });
    assert_eq!(second.next(), FromAgent::Pong { nonce: 3 });
    assert!(second.events.is_empty(), "{:#?}", second.events);
    second.send(&ToAgent::Shutdown);
    assert!(second.wait_exit().success());
}

/// A new experiment reusing an id on a host (the earlier one deleted, or of another knob home)
/// found the earlier one's environment folder: its shared code copy, with what its trials
/// changed there, and its trial folders. Its first hello (`new_experiment`) empties the folder
/// but for the daemon's own files; a fresh start of a resumed experiment keeps it.
#[test]
fn a_new_experiments_first_hello_removes_what_an_earlier_one_of_its_id_left() {
    let host = Host::new();
    let mut first = host.attach();
    first.hello(0, true);
    first.start_trial(
        1,
        host.request("old", "echo 1 > \"$KNOB_TRIAL_DIR/mark\""),
        false,
    );
    first.until_ended("old");
    let copy = host.dir().join("code-abc");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::write(copy.join("counter"), "41").unwrap();
    first.kill();

    // A resume's first hello keeps what the experiment left.
    let mut resumed = host.attach();
    resumed.hello(0, true);
    assert!(copy.join("counter").is_file());
    assert!(host.trial_dir("old").join("mark").is_file());
    resumed.kill();

    let mut created = host.attach();
    let welcome = created.hello_new_experiment();
    assert!(matches!(welcome, FromAgent::Welcome { .. }), "{welcome:?}");
    let mut left: Vec<String> = std::fs::read_dir(host.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["agent.lock", "agent.log", "agent.sock"]);
    // The daemon serves the new experiment as before.
    created.start_trial(
        2,
        host.request("new", "echo 2 > \"$KNOB_TRIAL_DIR/mark\""),
        false,
    );
    created.until_ended("new");
    assert!(host.trial_dir("new").join("mark").is_file());
    created.send(&ToAgent::Shutdown);
    assert!(created.wait_exit().success());
}

/// Two experiments of one id on one host's agentRoot (two knobs, on two machines) share the
/// daemon: each connection replaced the other's, in turn, for as long as both ran, and each
/// fresh start killed the other's trials. Another manager's hello is refused while the one
/// served was connected moments before; once that one is gone, another is served.
#[test]
fn another_managers_hello_is_refused_while_the_one_served_is_connected() {
    let host = Host::new();
    let mut first = host.attach();
    first.hello_as("laptop:11:1", 0, true);
    first.start_trial(
        1,
        host.request("mine", "echo $$ > \"$KNOB_TRIAL_DIR/pid\"; sleep 60"),
        false,
    );
    let pid = read_pid(&host.trial_dir("mine").join("pid"));

    let mut second = host.attach();
    match second.hello_as("desktop:22:2", 0, true) {
        FromAgent::Refused { message } => assert!(
            message.contains("serves experiment exp1 for another knob (pid 11 on laptop)")
                && message.contains("give this one another id"),
            "{message}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        process_runs(pid),
        "the other manager's fresh start killed the trial"
    );

    // The manager served connects again and finds its trial.
    let mut again = host.attach();
    let welcome = again.hello_as("laptop:11:1", 0, false);
    let FromAgent::Welcome { running, .. } = &welcome else {
        panic!("{welcome:?}");
    };
    assert_eq!(running, &["mine".to_string()]);

    // Gone (its connection closed): another manager is served, and its fresh start ends what
    // the first left.
    again.kill();
    let log = host.dir().join("agent.log");
    let began = std::time::Instant::now();
    while !std::fs::read_to_string(&log).is_ok_and(|text| text.contains("client 3 dropped")) {
        assert!(began.elapsed() < WAIT, "the daemon did not see client 3 go");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut third = host.attach();
    let welcome = third.hello_as("desktop:22:2", 0, true);
    assert!(matches!(welcome, FromAgent::Welcome { .. }), "{welcome:?}");
    assert!(!process_runs(pid));
    third.send(&ToAgent::Shutdown);
    assert!(third.wait_exit().success());
}

#[test]
fn shutdown_kills_whole_process_groups_reports_their_ends_and_exits() {
    let host = Host::new();
    let mut agent = host.attach();
    let daemon = welcome_pid(&agent.hello(0, true));
    agent.start_trial(
        1,
        host.request(
            "t",
            "sleep 60 & echo $! > \"$KNOB_TRIAL_DIR/child\"; sleep 60",
        ),
        false,
    );
    let child = read_pid(&host.trial_dir("t").join("child"));
    agent.send(&ToAgent::Shutdown);
    agent.until_ended("t");
    let (_, _, killed, _) = crate::support::ending(&of_trial(&agent.events, "t"));
    assert_eq!(killed.as_deref(), Some("experiment stopped"));
    assert!(agent.wait_exit().success());
    wait_gone(daemon as i32, "the daemon");
    assert!(
        !process_runs(child),
        "the trial's background child survived"
    );
}

#[test]
fn a_protocol_mismatch_is_refused_naming_both_versions() {
    let host = Host::new();
    let mut agent = host.attach();
    agent.send(&ToAgent::Hello {
        protocol: 999,
        experiment_id: "exp1".into(),
        environment_id: ENVIRONMENT.into(),
        last_seq: 0,
        fresh_start: true,
        new_experiment: false,
        manager: String::new(),
    });
    match agent.next() {
        FromAgent::Refused { message } => assert_eq!(
            message,
            format!("knob-agent {} on this host speaks agent protocol {PROTOCOL_VERSION}, the service speaks 999; upload the knob-agent built with this knob", env!("CARGO_PKG_VERSION"))
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(agent.wait_exit().success());
    let mut again = host.attach();
    again.send(&ToAgent::Ack { seq: 1 });
    assert!(matches!(
        again.next(),
        FromAgent::Refused { message } if message == "the first message must be a hello"
    ));
    let mut last = host.attach();
    last.hello(0, true);
    last.send(&ToAgent::Shutdown);
    assert!(last.wait_exit().success());
}

#[test]
fn a_garbage_frame_closes_that_connection_but_not_the_daemon() {
    let host = Host::new();
    let mut agent = host.attach();
    let daemon = welcome_pid(&agent.hello(0, true));
    agent.start_trial(
        1,
        host.request("t", "echo $$ > \"$KNOB_TRIAL_DIR/pid\"; sleep 60"),
        false,
    );
    let trial = read_pid(&host.trial_dir("t").join("pid"));
    let stdin = agent.stdin.as_mut().unwrap();
    stdin.write_all(&5u32.to_be_bytes()).unwrap();
    stdin.write_all(b"{oops").unwrap();
    stdin.flush().unwrap();
    assert!(agent.wait_exit().success());
    assert!(process_runs(daemon as i32));
    assert!(process_runs(trial));

    let mut again = host.attach();
    let welcome = again.hello(0, false);
    assert_eq!(welcome_pid(&welcome), daemon);
    let FromAgent::Welcome { running, .. } = &welcome else {
        unreachable!()
    };
    assert_eq!(running, &["t".to_string()]);
    again.send(&ToAgent::Shutdown);
    again.until_ended("t");
    assert!(again.wait_exit().success());
}

#[test]
fn with_no_manager_for_the_orphan_timeout_trials_are_killed_and_the_daemon_exits() {
    let host = Host::new();
    let mut agent = Attached::start(&host.dir(), &["--orphan-timeout-secs", "1"], &[]);
    let daemon = welcome_pid(&agent.hello(0, true));
    agent.start_trial(
        1,
        host.request("t", "echo $$ > \"$KNOB_TRIAL_DIR/pid\"; sleep 60"),
        false,
    );
    let trial = read_pid(&host.trial_dir("t").join("pid"));
    agent.kill();
    wait_gone(daemon as i32, "the orphaned daemon");
    assert!(!process_runs(trial));
    let log = std::fs::read_to_string(host.dir().join("agent.log")).unwrap();
    assert!(log.contains("no service connected for 1 s"), "{log}");
}

/// A daemon `attach` started whose connection closes before any hello (knob gave up waiting
/// for the welcome, or did not keep the experiment) exits at once: nothing would ever connect
/// to it again, and it waited out the orphan timeout (10 minutes by default).
#[test]
fn a_daemon_whose_first_connection_closes_before_a_hello_exits() {
    let host = Host::new();
    let mut agent = Attached::start(&host.dir(), &["--orphan-timeout-secs", "600"], &[]);
    let log_path = host.dir().join("agent.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log().contains("client 1 connected") {
        assert!(Instant::now() < deadline, "no client connected: {}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
    agent.kill();
    let socket = host.dir().join("agent.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while socket.exists() {
        assert!(Instant::now() < deadline, "the daemon stayed: {}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        log().contains("no hello came before the client left"),
        "{}",
        log()
    );
}

#[test]
fn fresh_code_copy_runs_each_trial_in_its_own_copy() {
    let host = Host::new();
    std::fs::write(host.code().join("data.txt"), "shared\n").unwrap();
    std::fs::write(host.code().join(CODE_COMPLETE_MARKER), "").unwrap();
    let mut agent = host.attach();
    agent.hello(0, true);
    let command = "echo mine >> data.txt; echo KNOB_FINAL $(wc -l < data.txt); pwd > where";
    agent.start_trial(1, host.request("a", command), true);
    agent.start_trial(2, host.request("b", command), true);
    agent.until_ended("a");
    agent.until_ended("b");
    for trial in ["a", "b"] {
        let events = of_trial(&agent.events, trial);
        assert_eq!(metrics(&events), [(MetricKind::Final, 0, "2".to_string())]);
        let copy = host.trial_dir(trial).join("code");
        assert_eq!(
            std::fs::read_to_string(copy.join("where")).unwrap().trim(),
            copy.to_str().unwrap()
        );
        assert!(!copy.join(CODE_COMPLETE_MARKER).exists());
    }
    assert_eq!(
        std::fs::read_to_string(host.code().join("data.txt")).unwrap(),
        "shared\n"
    );
    agent.send(&ToAgent::Shutdown);
    assert!(agent.wait_exit().success());
}

#[test]
fn a_second_daemon_for_the_same_directory_refuses_and_bad_directories_fail_clearly() {
    let host = Host::new();
    let mut agent = host.attach();
    agent.hello(0, true);
    let second = Command::new(AGENT)
        .args(["serve", "--dir"])
        .arg(host.dir())
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8(second.stderr).unwrap();
    assert_eq!(
        stderr.trim(),
        format!(
            "knob-agent: another daemon already serves {} (it holds {}/agent.lock); attach to it instead",
            host.dir().display(),
            host.dir().display()
        )
    );
    agent.send(&ToAgent::Shutdown);
    assert!(agent.wait_exit().success());

    let file = host.root.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let output = Command::new(AGENT)
        .arg("attach")
        .arg("--dir")
        .arg(file.join("env"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.starts_with(&format!(
            "knob-agent: cannot create {}",
            file.join("env").display()
        )) && stderr.lines().count() == 1,
        "{stderr}"
    );
    let output = Command::new(AGENT)
        .args(["serve", "--dir", "/tmp", "--orphan-timeout-secs=-1"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8(output.stderr)
        .unwrap()
        .contains("--orphan-timeout-secs must be a number of seconds from 0 to 604800, got -1"));
}

#[test]
fn receive_code_unpacks_an_archive_from_stdin() {
    use knob_training_services::code_archive::{create, ArchiveLimits};
    let source = tempfile::tempdir().unwrap();
    std::fs::write(source.path().join("train.py"), "print(1)").unwrap();
    let archive = create(source.path(), &ArchiveLimits::default(), &[]).unwrap();
    let hosts = tempfile::tempdir().unwrap();
    let dest = hosts.path().join("code").join(&archive.hash);
    let receive = |bytes: &[u8]| {
        let mut child = Command::new(AGENT)
            .arg("receive-code")
            .arg("--dest")
            .arg(&dest)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The agent may refuse garbage before reading all of it.
        let _ = child.stdin.take().unwrap().write_all(bytes);
        child.wait_with_output().unwrap()
    };
    let output = receive(&archive.bytes);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        std::fs::read_to_string(dest.join("train.py")).unwrap(),
        "print(1)"
    );
    assert!(dest.join(CODE_COMPLETE_MARKER).exists());
    let again = receive(&archive.bytes);
    assert!(String::from_utf8(again.stdout)
        .unwrap()
        .contains("already complete"));

    std::fs::remove_dir_all(&dest).unwrap();
    let output = receive(b"garbage");
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.starts_with("knob-agent receive-code: code archive is not a valid gzip tar"),
        "{stderr}"
    );
    assert!(!dest.exists());
}

#[test]
fn sigterm_to_the_daemon_kills_its_trials_first() {
    let host = Host::new();
    let mut agent = host.attach();
    let daemon = welcome_pid(&agent.hello(0, true));
    agent.start_trial(
        1,
        host.request("t", "echo $$ > \"$KNOB_TRIAL_DIR/pid\"; sleep 60"),
        false,
    );
    let trial = read_pid(&host.trial_dir("t").join("pid"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    agent.until_ended("t");
    let (_, _, killed, _) = crate::support::ending(&of_trial(&agent.events, "t"));
    assert_eq!(
        killed.as_deref(),
        Some("knob-agent on this host was stopped (SIGTERM)")
    );
    assert!(agent.wait_exit().success());
    wait_gone(daemon as i32, "the daemon");
    assert!(!process_runs(trial));
}

#[test]
fn a_silent_client_is_dropped_and_a_new_client_replaces_the_old_one() {
    let host = Host::new();
    let args = [
        "--orphan-timeout-secs",
        "30",
        "--heartbeat-timeout-secs",
        "2",
    ];
    let mut silent = Attached::start(&host.dir(), &args, &[]);
    let daemon = welcome_pid(&silent.hello(0, true));
    silent.start_trial(
        1,
        host.request("t", "echo $$ > \"$KNOB_TRIAL_DIR/pid\"; sleep 60"),
        false,
    );
    let trial = read_pid(&host.trial_dir("t").join("pid"));
    // Nothing sent for the heartbeat timeout: the daemon closes the connection, attach exits,
    // the trial runs on.
    assert!(silent.wait_exit().success());
    assert!(process_runs(trial));

    let mut first = host.attach();
    first.hello(0, false);
    let mut second = host.attach();
    let welcome = second.hello(0, false);
    assert_eq!(welcome_pid(&welcome), daemon);
    // The first connection was closed when the second arrived.
    assert!(first.wait_exit().success());
    let FromAgent::Welcome { running, .. } = &welcome else {
        unreachable!()
    };
    assert_eq!(running, &["t".to_string()]);
    second.send(&ToAgent::Shutdown);
    second.until_ended("t");
    // The trial's whole history, replayed once to the connection that asked from seq 0.
    let events = of_trial(&second.events, "t");
    assert!(
        matches!(events[0], ServiceEvent::TrialStarted { .. }),
        "{events:#?}"
    );
    assert!(second.wait_exit().success());
}

#[test]
fn a_directory_deeper_than_a_socket_path_allows_still_works() {
    let host = Host::new();
    let deep = host.dir().join("d".repeat(60)).join("e".repeat(60));
    assert!(deep.join("agent.sock").as_os_str().len() > 108);
    let mut agent = Attached::start(&deep, &[], &[]);
    agent.hello(0, true);
    let request = TrialRequest {
        trial_dir: deep.join("trials").join("t"),
        ..host.request("t", "echo KNOB_FINAL 1")
    };
    agent.start_trial(1, request, false);
    agent.until_ended("t");
    agent.send(&ToAgent::Shutdown);
    assert!(agent.wait_exit().success());
}

/// Hosts that share a home folder (NFS) upload the agent to the same path: an `attach` started
/// from a binary that was replaced or removed since must still start its daemon (its own
/// path then reads "… (deleted)").
#[test]
fn an_agent_whose_binary_was_removed_after_it_started_still_starts_its_daemon() {
    let host = Host::new();
    let copy = host.root.path().join("knob-agent-copy");
    std::fs::copy(AGENT, &copy).unwrap();
    // Opened, removed, then run from the open file: the running agent's file is gone.
    let mut command = Command::new("/bin/bash");
    command
        .arg("-c")
        .arg(r#"exec 3<"$0" && rm -f "$0" && exec /proc/self/fd/3 "$@""#)
        .arg(&copy);
    let mut agent = Attached::start_from(command, &host.dir(), &[], &[]);
    agent.hello(0, true);
    assert!(!copy.exists());
    agent.start_trial(1, host.request("t", "echo KNOB_FINAL 1"), false);
    agent.until_ended("t");
    agent.send(&ToAgent::Shutdown);
    assert!(agent.wait_exit().success());
}

#[test]
fn a_daemon_that_cannot_start_is_reported_in_one_line_with_its_log() {
    let host = Host::new();
    // The lock file cannot be opened when a directory has its name.
    std::fs::create_dir_all(host.dir().join("agent.lock")).unwrap();
    let output = Command::new(AGENT)
        .arg("attach")
        .arg("--dir")
        .arg(host.dir())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "knob-agent: the daemon for {} did not start within",
            host.dir().display()
        )) && stderr.contains("cannot open")
            && stderr.contains("agent.lock"),
        "{stderr}"
    );
}

#[test]
fn the_nni_v3_channel_is_served_on_the_host_under_the_remote_environment_id() {
    let host = Host::new();
    let mut agent = host.attach();
    agent.hello(0, true);
    // An HTTP client in plain bash (/dev/tcp), talking as nni 3's trial command channel does.
    let script = r#"
url=$NNI_TRIAL_COMMAND_CHANNEL; rest=${url#http://}; hostport=${rest%%/*}; path=/${rest#*/}
send() {
  exec 3<>/dev/tcp/${hostport%:*}/${hostport##*:}
  printf '%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %s\r\n\r\n%s' "$1" "$path" "$hostport" "${#2}" "$2" >&3
  cat <&3; exec 3<&-
}
echo "$NNI_TRIAL_COMMAND_CHANNEL" > "$KNOB_TRIAL_DIR/url"
send PUT '{"type":"request_parameter"}' > /dev/null
send GET '' > "$KNOB_TRIAL_DIR/parameter"
send PUT '{"type":"metric","metric":"{\"parameter_id\": 42, \"trial_job_id\": \"v3\", \"type\": \"FINAL\", \"sequence\": 0, \"value\": \"0.5\"}"}' > /dev/null
"#;
    agent.start_trial(1, host.request("v3", script), false);
    agent.until_ended("v3");
    let events = of_trial(&agent.events, "v3");
    assert_eq!(
        metrics(&events),
        [(MetricKind::Final, 0, "0.5".to_string())],
        "{events:#?}"
    );
    let url = std::fs::read_to_string(host.trial_dir("v3").join("url")).unwrap();
    assert!(
        url.trim()
            .ends_with("/env/remote%3Aroot%40127.0.0.1%3A2222/v3"),
        "{url}"
    );
    let parameter = std::fs::read_to_string(host.trial_dir("v3").join("parameter")).unwrap();
    assert!(
        parameter.starts_with("HTTP/1.1 200")
            && parameter.contains(r#"\"parameters\":{\"lr\":0.01,"#),
        "{parameter}"
    );
    agent.send(&ToAgent::Shutdown);
    assert!(agent.wait_exit().success());
}

/// A `setsid` child and a double-forked daemon of a trial run by the agent end with the trial,
/// and with the agent's shutdown at the end of the experiment (issue 20 item 3).
#[test]
fn processes_that_left_a_trials_group_end_with_the_trial_and_with_the_daemon() {
    use crate::support::{assert_left_the_group, escaped_pids, leaves_its_group_then};
    let host = Host::new();
    let mut agent = host.attach();
    let daemon = welcome_pid(&agent.hello(0, true));
    agent.start_trial(
        1,
        host.request("done", &leaves_its_group_then("echo KNOB_FINAL 1")),
        false,
    );
    agent.until_ended("done");
    for pid in escaped_pids(&host.trial_dir("done")) {
        assert!(!process_runs(pid), "{pid} outlived its trial");
    }

    let command = leaves_its_group_then("echo $$ > \"$KNOB_TRIAL_DIR/leader.pid\"; sleep 60");
    agent.start_trial(2, host.request("running", &command), false);
    let escaped = escaped_pids(&host.trial_dir("running"));
    let leader = read_pid(&host.trial_dir("running").join("leader.pid"));
    assert_left_the_group(leader, escaped);
    agent.send(&ToAgent::Shutdown);
    agent.until_ended("running");
    assert!(agent.wait_exit().success());
    wait_gone(daemon as i32, "the daemon");
    for pid in escaped {
        assert!(!process_runs(pid), "{pid} outlived the agent's shutdown");
    }
}

#[test]
fn only_the_user_the_agent_runs_as_may_connect() {
    use std::os::unix::fs::PermissionsExt;
    let host = Host::new();
    let mut agent = Attached::start(&host.dir(), &[], &[]);
    agent.hello(0, true);
    let socket = host.dir().join("agent.sock");
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode();
    assert_eq!(
        mode(&socket) & 0o777,
        0o600,
        "the socket is the user's alone"
    );
    // The system's Python: another user may not reach one under root's home (pyenv).
    let python = "/usr/bin/python3";
    if !nix::unistd::geteuid().is_root() || !std::path::Path::new(python).exists() {
        crate::prerequisite::missing(
            "root and /usr/bin/python3, to connect to the agent as another user",
        );
        agent.send(&ToAgent::Shutdown);
        agent.wait_exit();
        return;
    }
    // Open the way, as a umask of 0 and a group-shared folder on a cluster's filesystem do,
    // then connect as `nobody`: the manager's connection must stay the agent's client.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    for dir in socket.ancestors().skip(1) {
        if mode(dir) & 0o001 == 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode(dir) | 0o755))
                .unwrap();
        }
    }
    let stranger = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            python,
            "-c",
        ])
        .arg(
            "import socket, sys, time\n\
             s = socket.socket(socket.AF_UNIX)\n\
             s.connect(sys.argv[1])\n\
             time.sleep(1)\n\
             print('connected')",
        )
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&stranger.stdout).trim(),
        "connected",
        "{}",
        String::from_utf8_lossy(&stranger.stderr)
    );
    agent.send(&ToAgent::Ping { nonce: 3 });
    assert_eq!(agent.next(), FromAgent::Pong { nonce: 3 });
    agent.send(&ToAgent::Shutdown);
    assert!(agent.wait_exit().success());
}

/// Out of file descriptors (many trials' output files under a low `ulimit -n`), the daemon's
/// accept fails while a connection waits in its backlog, and the socket reads as ready again
/// at once: the daemon must wait before it tries again and say so once, not spin a core and
/// write a line a failure to its log (it did, thousands a second) until a descriptor frees.
/// Then it accepts again. Run in a child process, since it uses up the process's descriptors.
#[test]
fn the_daemon_waits_instead_of_spinning_when_out_of_descriptors() {
    let name = "agent::the_daemon_waits_instead_of_spinning_when_out_of_descriptors";
    let no_leases = [(knob_training_services::lease::LEDGER_VAR, "0")];
    if let Some(output) = in_child_process(name, &no_leases) {
        assert_eq!(output.matches("accept failed").count(), 1, "{output}");
        assert!(
            output.contains("accepting connections again after"),
            "{output}"
        );
        return;
    }
    use knob_training_services::agent::daemon::{serve, ServeOptions};
    let host = Host::new();
    let dir = host.dir();
    let options = ServeOptions {
        orphan_timeout: Duration::from_secs(60),
        ..ServeOptions::new(dir.clone())
    };
    std::thread::spawn(move || serve(options));
    let socket = dir.join("agent.sock");
    let deadline = Instant::now() + WAIT;
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "the daemon never made {socket:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The daemon cannot accept the client's connection.
    let held = use_up_descriptors_but_one();
    let _client = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let used = cpu_used_over(Duration::from_secs(1));
    drop(held);
    assert!(
        used < Duration::from_millis(100),
        "the daemon used {used:?} of CPU in 1 s while out of descriptors"
    );
    // Descriptors free again: the waiting connection is accepted within the longest pause.
    std::thread::sleep(Duration::from_millis(500));
}
