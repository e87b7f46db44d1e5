//! A trial's life on the local service: start, environment, metrics, exit, kill.

use knob_plugin_api::service::{MetricKind, ServiceEvent};
use serde_json::json;

use crate::support::*;

#[test]
fn environment_is_this_machine_with_its_inventory() {
    let mut h = Harness::new();
    let env = h.service.environment().unwrap();
    assert_eq!(env.id, "local");
    assert!(env.ready);
    assert!(!env.host.is_empty());
    // The service probes this machine itself (the core no longer does): gpu-sched's JSON, under
    // the environment's id, with CPUs counted.
    let inventory: knob_gpu_sched::Environment =
        serde_json::from_value(env.inventory).expect("a gpu-sched inventory");
    assert_eq!(inventory.id.as_str(), "local");
    assert!(inventory.host_resources.cpu_count > 0, "{inventory:?}");
}

#[test]
fn successful_trial_reports_knob_metrics_from_stdout_and_file_before_it_ends() {
    let mut h = Harness::new();
    let command = r#"
        echo "starting with $KNOB_PARAMETERS"
        echo KNOB_INTERMEDIATE 0.25
        echo 'KNOB_INTERMEDIATE {"default": 0.5, "loss": 1.5}' >> "$KNOB_METRICS_FILE"
        echo KNOB_INTERMEDIATE 0.75
        printf 'KNOB_FINAL {"default": 0.9}' >> "$KNOB_METRICS_FILE"
    "#;
    let events = h.run(h.request("ok1", command));
    assert!(
        matches!(&events[0], ServiceEvent::TrialStarted { pid: Some(_), .. }),
        "{events:#?}"
    );
    let mut intermediate: Vec<_> = metrics(&events)
        .into_iter()
        .filter(|m| m.0 == MetricKind::Intermediate)
        .collect();
    // stdout and the file are read independently, so the two sources may interleave; each
    // metric is numbered in the order it was recorded.
    let sequences: Vec<u64> = intermediate.iter().map(|m| m.1).collect();
    assert_eq!(sequences, [0, 1, 2]);
    intermediate.sort_by(|a, b| a.2.cmp(&b.2));
    let values: Vec<&str> = intermediate.iter().map(|m| m.2.as_str()).collect();
    assert_eq!(values, ["0.25", "0.75", r#"{"default": 0.5, "loss": 1.5}"#]);
    let finals: Vec<_> = metrics(&events)
        .into_iter()
        .filter(|m| m.0 == MetricKind::Final)
        .collect();
    assert_eq!(
        finals,
        [(MetricKind::Final, 0, r#"{"default": 0.9}"#.to_string())]
    );
    assert_eq!(ending(&events), (Some(0), None, None, String::new()));
    assert_eq!(warnings(&events), Vec::<String>::new());

    let stdout = std::fs::read_to_string(h.trial_dir("ok1").join("stdout")).unwrap();
    assert_eq!(
        stdout,
        "starting with {\"lr\":0.01,\"layers\":3,\"act\":\"relu\"}\nKNOB_INTERMEDIATE 0.25\nKNOB_INTERMEDIATE 0.75\n"
    );
    let parameters = std::fs::read_to_string(h.trial_dir("ok1").join("parameters.json")).unwrap();
    assert_eq!(parameters, r#"{"lr":0.01,"layers":3,"act":"relu"}"#);
}

#[test]
fn every_metric_written_just_before_exit_comes_before_the_end() {
    let mut h = Harness::new();
    // Many metrics as fast as possible, the last ones right before exit, on both paths.
    let command = r#"
        for i in $(seq 0 199); do echo "KNOB_INTERMEDIATE $i"; echo "KNOB_INTERMEDIATE $i" >> "$KNOB_METRICS_FILE"; done
        echo KNOB_FINAL 1; exit 0
    "#;
    for round in 0..5 {
        let id = format!("fast{round}");
        let events = h.run(h.request(&id, command));
        let found = metrics(&events);
        assert_eq!(found.len(), 401, "round {round}");
        assert_eq!(found.iter().filter(|m| m.0 == MetricKind::Final).count(), 1);
        assert_eq!(ending(&events).0, Some(0));
    }
}

#[test]
fn failing_trial_reports_its_exit_code_and_stderr_tail() {
    let mut h = Harness::new();
    let command = r#"
        for i in $(seq 1 30); do echo "noise $i" >&2; done
        echo "Traceback: ValueError: learning rate must be positive" >&2
        exit 3
    "#;
    let events = h.run(h.request("fail1", command));
    let (code, signal, killed, tail) = ending(&events);
    assert_eq!((code, signal, killed), (Some(3), None, None));
    assert_eq!(tail.lines().count(), 20);
    assert!(tail.starts_with("noise 12\n"), "{tail}");
    assert!(
        tail.ends_with("Traceback: ValueError: learning rate must be positive"),
        "{tail}"
    );
}

#[test]
fn command_not_found_fails_with_bash_s_message() {
    let mut h = Harness::new();
    let events = h.run(h.request("nf1", "knob-no-such-command --epochs 3"));
    let (code, _, _, tail) = ending(&events);
    assert_eq!(code, Some(127));
    assert!(
        tail.contains("knob-no-such-command: command not found"),
        "{tail}"
    );
}

#[test]
fn missing_code_directory_is_refused_before_anything_starts() {
    let mut h = Harness::new();
    let mut request = h.request("nocode", "true");
    request.code_dir = h.dir.path().join("does-not-exist");
    let err = h.service.start(&request).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "trial nocode: trialCodeDirectory {} does not exist or is not a directory",
            request.code_dir.display()
        )
    );
    let mut request = h.request("elsewhere", "true");
    request.environment_id = "gpu-box".into();
    let err = h.service.start(&request).unwrap_err().to_string();
    assert_eq!(
        err,
        "training service local has no environment \"gpu-box\"; its only environment is \"local\""
    );
    assert!(h.events.all().is_empty());
}

#[test]
fn trial_environment_follows_nni_and_knob_conventions() {
    let mut h = Harness::new();
    let mut request = h.request(
        "env1",
        "env > \"$KNOB_TRIAL_DIR/env.txt\"; pwd > \"$KNOB_TRIAL_DIR/pwd.txt\"",
    );
    request.gpu_indices = Some(vec![1, 3]);
    request.env.insert("MY_SETTING".into(), "yes".into());
    // The protocol variables cannot be overridden by the request by mistake.
    request
        .env
        .insert("NNI_TRIAL_JOB_ID".into(), "spoofed".into());
    let events = h.run(request.clone());
    assert_eq!(ending(&events).0, Some(0));
    let dir = h.trial_dir("env1");
    let env = std::fs::read_to_string(dir.join("env.txt")).unwrap();
    let var = |name: &str| {
        env.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} not set; env:\n{env}"))
            .to_string()
    };
    let dir_text = dir.display().to_string();
    assert_eq!(var("NNI_PLATFORM"), "local");
    assert_eq!(var("NNI_EXP_ID"), "exp1");
    assert_eq!(var("NNI_TRIAL_JOB_ID"), "env1");
    assert_eq!(var("NNI_SYS_DIR"), dir_text);
    assert_eq!(var("NNI_OUTPUT_DIR"), dir_text);
    assert_eq!(var("NNI_TRIAL_SEQ_ID"), "7");
    assert_eq!(var("NNI_CODE_DIR"), h.code_dir().display().to_string());
    assert_eq!(
        var("NNI_TRIAL_COMMAND_CHANNEL"),
        format!("http://{}/env/local/env1", h.service.channel_address())
    );
    assert_eq!(var("KNOB_TRIAL_ID"), "env1");
    assert_eq!(var("KNOB_TRIAL_DIR"), dir_text);
    assert_eq!(
        var("KNOB_PARAMETERS"),
        r#"{"lr":0.01,"layers":3,"act":"relu"}"#
    );
    assert_eq!(
        var("KNOB_PARAMETERS_FILE"),
        format!("{dir_text}/parameters.json")
    );
    assert_eq!(var("KNOB_METRICS_FILE"), format!("{dir_text}/metrics.knob"));
    assert_eq!(var("CUDA_VISIBLE_DEVICES"), "1,3");
    // The indices are NVML's (PCI bus order): CUDA numbers GPUs the same way only when told.
    assert_eq!(var("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
    assert_eq!(var("MY_SETTING"), "yes");
    let pwd = std::fs::read_to_string(dir.join("pwd.txt")).unwrap();
    assert_eq!(pwd.trim(), h.code_dir().display().to_string());

    // An empty GPU list hides every GPU; no list leaves the variable as it was.
    let mut request = h.request("env2", "echo \"KNOB_FINAL {\\\"default\\\": 1, \\\"cuda\\\": \\\"${CUDA_VISIBLE_DEVICES-unset}\\\"}\"");
    request.gpu_indices = Some(vec![]);
    let events = h.run(request);
    assert_eq!(metrics(&events)[0].2, r#"{"default": 1, "cuda": ""}"#);
    let request = h.request("env3", "echo \"KNOB_FINAL {\\\"default\\\": 1, \\\"cuda\\\": \\\"${CUDA_VISIBLE_DEVICES-unset}\\\"}\"");
    let events = h.run(request);
    let inherited = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into());
    assert_eq!(
        metrics(&events)[0].2,
        format!(r#"{{"default": 1, "cuda": "{inherited}"}}"#)
    );
}

/// Parameters over 100 KiB of JSON (a `choice` of long strings) are only in the file: Linux
/// refuses an environment string over 128 KiB, so `KNOB_PARAMETERS` is left out, and the first
/// such trial is named in one warning with its size and the file to read. A trial that read the
/// variable found it empty without a word of why.
#[test]
fn parameters_too_large_for_the_environment_are_in_the_file_and_said_once() {
    let mut h = Harness::new();
    let long = "a".repeat(150 * 1024);
    let command = r#"[ -z "${KNOB_PARAMETERS+set}" ] && echo "KNOB_FINAL $(wc -c < "$KNOB_PARAMETERS_FILE")""#;
    let mut sizes = Vec::new();
    for trial_id in ["big1", "big2"] {
        let mut request = h.request(trial_id, command);
        request.parameters = json!({ "text": long });
        sizes.push(request.parameters.to_string().len());
        let events = h.run(request);
        assert_eq!(ending(&events).0, Some(0), "{events:?}");
        assert_eq!(metrics(&events)[0].2, sizes[0].to_string());
    }
    let warnings: Vec<String> = h
        .events
        .all()
        .into_iter()
        .filter_map(|event| match event {
            ServiceEvent::Warning {
                trial_id: None,
                message,
            } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with(&format!(
            "trial big1: its parameters are {} bytes of JSON, over the 100 KiB that environment variable KNOB_PARAMETERS takes",
            sizes[0]
        )) && warnings[0].contains("trials should read that file"),
        "{}",
        warnings[0]
    );
}

#[test]
fn kill_stops_the_whole_group_with_sigterm_then_sigkill() {
    let mut h = Harness::with_args(json!({"gracePeriodSecs": 0.3}));
    // Leader and child both ignore SIGTERM; only SIGKILL ends them.
    let command = r#"
        trap '' TERM
        sleep 1000 &
        echo $! > "$KNOB_TRIAL_DIR/child.pid"
        wait
    "#;
    let request = h.request("stubborn", command);
    h.service.start(&request).unwrap();
    let child_pid_file = h.trial_dir("stubborn").join("child.pid");
    let child_pid: i32 = wait_for_line(&child_pid_file).parse().unwrap();
    let leader_pid = match &h.events.all()[0] {
        ServiceEvent::TrialStarted { pid: Some(pid), .. } => *pid as i32,
        other => panic!("{other:?}"),
    };
    assert!(process_runs(child_pid) && process_runs(leader_pid));

    h.service.kill("stubborn", "early stopped by the assessor");
    let events = h.events.wait_ended("stubborn");
    let (code, signal, killed, _) = ending(&events);
    assert_eq!((code, signal), (None, Some(9)));
    assert_eq!(killed.as_deref(), Some("early stopped by the assessor"));
    assert!(!process_runs(leader_pid));
    assert!(!process_runs(child_pid), "the child outlived its trial");

    // Killing it again, or a trial that never ran, changes nothing.
    h.service.kill("stubborn", "again");
    h.service.kill("never-ran", "whatever");
}

#[test]
fn kill_of_a_trial_that_obeys_sigterm_ends_it_without_waiting_for_the_grace_period() {
    // A grace period longer than every wait here: the trial must end on SIGTERM alone.
    let mut h = Harness::with_args(json!({"gracePeriodSecs": 600}));
    let request = h.request(
        "polite",
        "echo ready > \"$KNOB_TRIAL_DIR/ready\"; exec sleep 1000",
    );
    h.service.start(&request).unwrap();
    wait_for_file(&h.trial_dir("polite").join("ready"));
    h.service.kill("polite", "user canceled");
    let events = h.events.wait_ended("polite");
    let (code, signal, killed, _) = ending(&events);
    assert_eq!((code, signal), (None, Some(15)));
    assert_eq!(killed.as_deref(), Some("user canceled"));
}

#[test]
fn processes_left_behind_by_a_finished_trial_are_stopped() {
    let mut h = Harness::new();
    let command = "sleep 1000 & echo $! > \"$KNOB_TRIAL_DIR/child.pid\"; echo KNOB_FINAL 1";
    let events = h.run(h.request("leaves", command));
    assert_eq!(ending(&events).0, Some(0));
    assert_eq!(metrics(&events).len(), 1);
    let child_pid: i32 = std::fs::read_to_string(h.trial_dir("leaves").join("child.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !process_runs(child_pid),
        "a process of the trial outlived it"
    );
}

#[test]
fn shutdown_kills_running_trials_and_refuses_new_ones() {
    let mut h = Harness::new();
    for id in ["s1", "s2"] {
        let request = h.request(
            id,
            "trap '' TERM; echo ready > \"$KNOB_TRIAL_DIR/ready\"; sleep 1000 & wait",
        );
        h.service.start(&request).unwrap();
        wait_for_file(&h.trial_dir(id).join("ready"));
    }
    h.service.stop();
    // `stop` returns once both have ended.
    let events = h.events.all();
    for id in ["s1", "s2"] {
        let trial = of_trial(&events, id);
        let (_, signal, killed, _) = ending(&trial);
        assert_eq!(signal, Some(9));
        assert_eq!(
            killed.as_deref(),
            Some("the training service is shutting down")
        );
    }
    let err = h.service.start(&h.request("late", "true")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "training service local is shut down; no trial can start"
    );
    assert!(!h.service.environment().unwrap().ready);
}

#[test]
fn duplicate_trial_ids_are_refused() {
    let mut h = Harness::new();
    let request = h.request(
        "dup",
        "echo ready > \"$KNOB_TRIAL_DIR/ready\"; exec sleep 1000",
    );
    h.service.start(&request).unwrap();
    wait_for_file(&h.trial_dir("dup").join("ready"));
    let err = h.service.start(&request).unwrap_err();
    assert_eq!(
        err.to_string(),
        "trial dup is already running on training service local; trial ids must be unique"
    );
    h.service.kill("dup", "done");
    h.events.wait_ended("dup");
}

/// A `setsid` child and a double-forked daemon leave the trial's process group; they end with
/// the trial all the same (issue 20 item 3).
#[test]
fn processes_that_left_the_group_do_not_outlive_a_finished_trial() {
    let mut h = Harness::new();
    let events = h.run(h.request("escapes", &leaves_its_group_then("echo KNOB_FINAL 1")));
    assert_eq!(ending(&events).0, Some(0));
    for pid in escaped_pids(&h.trial_dir("escapes")) {
        assert!(!process_runs(pid), "{pid} outlived its trial");
    }
}

/// A process that left the group shows an empty environment for a moment whenever it calls
/// execve(2) (the `setsid` of `setsid sleep` does, right after leaving): the scan after the
/// leader's exit must not take it for a stranger then, or it outlives the trial. This one
/// execs itself without end, so a scan often lands in that moment; without the re-read one
/// of these runs left it running (about one scan in twelve lands there).
#[test]
fn a_process_that_left_the_group_is_stopped_even_while_it_execs() {
    let mut h = Harness::new();
    let command = r#"printf 'exec /bin/sh "$0"\n' > "$KNOB_TRIAL_DIR/loop.sh"
setsid /bin/sh "$KNOB_TRIAL_DIR/loop.sh" </dev/null >/dev/null 2>&1 & echo $! > "$KNOB_TRIAL_DIR/looper.pid"
sleep 0.05
echo KNOB_FINAL 1"#;
    for run in 0..40 {
        let trial_id = format!("exec{run}");
        let events = h.run(h.request(&trial_id, command));
        assert_eq!(ending(&events).0, Some(0), "run {run}: {events:?}");
        let looper: i32 = wait_for_line(&h.trial_dir(&trial_id).join("looper.pid"))
            .parse()
            .unwrap();
        assert!(
            !process_runs(looper),
            "run {run}: {looper} outlived its trial: {}",
            std::fs::read_to_string(format!("/proc/{looper}/stat")).unwrap_or_default()
        );
    }
}

#[test]
fn killing_a_trial_kills_the_processes_that_left_its_group() {
    let mut h = Harness::with_args(json!({"gracePeriodSecs": 0.3}));
    let request = h.request(
        "killed",
        &leaves_its_group_then("echo $$ > \"$KNOB_TRIAL_DIR/leader.pid\"; sleep 1000"),
    );
    h.service.start(&request).unwrap();
    let dir = h.trial_dir("killed");
    let escaped = escaped_pids(&dir);
    let leader: i32 = wait_for_line(&dir.join("leader.pid")).parse().unwrap();
    assert_left_the_group(leader, escaped);
    h.service.kill("killed", "user canceled");
    let (_, _, killed, _) = ending(&h.events.wait_ended("killed"));
    assert_eq!(killed.as_deref(), Some("user canceled"));
    for pid in escaped {
        assert!(!process_runs(pid), "{pid} outlived its killed trial");
    }
}

/// The end of an experiment (the service shut down) ends them too, and an identical trial id
/// of another service on this host (another experiment) is left alone.
#[test]
fn shutdown_kills_the_processes_that_left_the_group_and_nothing_of_another_service() {
    let mut h = Harness::new();
    let mut other = Harness::new();
    let command = leaves_its_group_then("echo ready > \"$KNOB_TRIAL_DIR/ready\"; sleep 1000");
    h.service.start(&h.request("t", &command)).unwrap();
    other.service.start(&other.request("t", &command)).unwrap();
    let escaped = escaped_pids(&h.trial_dir("t"));
    let others = escaped_pids(&other.trial_dir("t"));
    wait_for_file(&h.trial_dir("t").join("ready"));
    h.service.stop();
    for pid in escaped {
        assert!(!process_runs(pid), "{pid} outlived the service");
    }
    for pid in others {
        assert!(process_runs(pid), "{pid} of the other service was killed");
    }
    other.service.stop();
    for pid in others {
        assert!(!process_runs(pid), "{pid} outlived the other service");
    }
}

/// The core starts a trial's next attempt (same id, its own folder) as soon as it hears of the
/// previous attempt's end: that start must not be refused as a duplicate. Started from the
/// event sink itself, at the moment the end is emitted.
#[test]
fn a_new_attempt_started_on_hearing_of_the_end_is_not_refused() {
    use knob_training_services::trial_pool::TrialPool;
    use std::sync::{Arc, Mutex, OnceLock, Weak};

    let root = tempfile::tempdir().unwrap();
    let code = root.path().join("code");
    std::fs::create_dir_all(&code).unwrap();
    let first = request(&code, &root.path().join("t"), "t", "echo KNOB_FINAL 1");
    let next = request(
        &code,
        &root.path().join("t/attempt-2"),
        "t",
        "echo KNOB_FINAL 2",
    );
    std::fs::create_dir_all(&next.trial_dir).unwrap();

    let pool_slot: Arc<OnceLock<Weak<TrialPool>>> = Arc::default();
    let answers: Arc<Mutex<Vec<Result<(), String>>>> = Arc::default();
    let events = Events::default();
    let emit: knob_training_services::metrics::Emit = {
        let (pool_slot, answers, events) = (pool_slot.clone(), answers.clone(), events.clone());
        Arc::new(move |event: ServiceEvent| {
            let first_end = matches!(event, ServiceEvent::TrialEnded { .. })
                && !events
                    .all()
                    .iter()
                    .any(|e| matches!(e, ServiceEvent::TrialEnded { .. }));
            if first_end {
                let pool = pool_slot.get().and_then(Weak::upgrade).unwrap();
                let answer = pool.start(&next).map(|_| ()).map_err(|e| e.to_string());
                answers.lock().unwrap().push(answer);
            }
            events.push(event);
        })
    };
    let pool =
        Arc::new(TrialPool::new("test", std::time::Duration::from_millis(500), emit).unwrap());
    pool_slot.set(Arc::downgrade(&pool)).unwrap();
    pool.start(&first).unwrap();
    events.wait_until("both attempts' ends", |events| {
        events
            .iter()
            .filter(|e| matches!(e, ServiceEvent::TrialEnded { .. }))
            .count()
            == 2
    });
    assert_eq!(*answers.lock().unwrap(), [Ok(())]);
    assert!(pool.stop("test over").is_empty());
}
