//! The services' own configs (checked by the services, not the core), and the clean-up a service
//! does for its own trials on resume.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use knob_plugin_api::service::{ConfigProblem, ServiceContext};
use knob_training_services::check_built_in;
use serde_json::{json, Value};

fn problems(platform: &str, config: Value, context: &ServiceContext) -> Vec<String> {
    let found: Vec<ConfigProblem> = check_built_in(platform, &config, context)
        .unwrap()
        .expect_err("a bad config");
    found
        .iter()
        .map(|problem| format!("{}: {}", problem.path, problem.message))
        .collect()
}

#[test]
fn local_applies_the_top_level_shortcuts_where_its_own_fields_are_unset() {
    let context = ServiceContext {
        shortcuts: json!({"useActiveGpu": true, "gpuIndices": [0, 1]})
            .as_object()
            .cloned()
            .unwrap(),
        ..ServiceContext::default()
    };
    let checked = check_built_in("local", &json!({"gpu_indices": "2"}), &context)
        .unwrap()
        .unwrap();
    assert_eq!(
        Value::Object(checked.config),
        json!({"useActiveGpu": true, "maxTrialNumberPerGpu": 1, "gpuIndices": [2], "reuseMode": false})
    );
    assert!(checked.secrets.is_empty());
    // It knows its one environment without starting: this machine, probed.
    let environments = checked.environments.expect("the local machine");
    assert_eq!(environments.len(), 1);
    assert_eq!(environments[0].id, "local");

    assert_eq!(
        problems(
            "local",
            json!({"useActiveGpus": true, "maxTrialNumberPerGpu": 0}),
            &ServiceContext::default()
        ),
        [
            "maxTrialNumberPerGpu: expected a positive integer, got 0",
            r#"useActiveGpus: unknown field "useActiveGpus" (did you mean "useActiveGpu"?)"#,
        ]
    );
}

/// An `sshKeyFile` that is a folder was said not to exist, and one that is a public key (or no
/// key at all) was found only once the experiment had started, as a "corrupt key" blaming the passphrase.
#[test]
fn remote_refuses_a_key_file_that_is_a_folder_a_public_key_or_no_key_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("id_ed25519");
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&private)
        .status()
        .expect("ssh-keygen (openssh-client)");
    assert!(made.success());
    let public = dir.path().join("id_ed25519.pub");
    let lone_public = dir.path().join("lone.pub");
    std::fs::copy(&public, &lone_public).unwrap();
    let machine =
        |host: &str, key: &std::path::Path| json!({"host": host, "user": "u", "sshKeyFile": key});
    let config = json!({"machineList": [
        machine("h0", dir.path()),
        machine("h1", &public),
        machine("h2", &lone_public),
        machine("h3", &private),
        machine("h4", &dir.path().join("missing")),
        machine("h5", &dir.path().join("notes.txt")),
    ]});
    std::fs::write(
        dir.path().join("notes.txt"),
        "my key is on the other laptop\n",
    )
    .unwrap();
    let shown = |path: &std::path::Path| format!("{:?}", path.display().to_string());
    assert_eq!(
        problems("remote", config, &ServiceContext::default()),
        [
            format!(
                "machineList[0].sshKeyFile: SSH key file {} is a folder; give the private key file in it (such as {})",
                shown(dir.path()),
                shown(&private)
            ),
            format!(
                "machineList[1].sshKeyFile: SSH key file {} is a public key; give its private key ({})",
                shown(&public),
                shown(&private)
            ),
            format!(
                "machineList[2].sshKeyFile: SSH key file {} is a public key; give its private key (the private key file)",
                shown(&lone_public)
            ),
            format!(
                "machineList[4].sshKeyFile: SSH key file {} does not exist",
                shown(&dir.path().join("missing"))
            ),
            format!(
                "machineList[5].sshKeyFile: SSH key file {} is not an SSH private key (no \"-----BEGIN ... PRIVATE KEY-----\" line); give the private key file, such as ~/.ssh/id_ed25519",
                shown(&dir.path().join("notes.txt"))
            ),
        ]
    );
}

/// An encrypted `sshKeyFile` without its `sshPassphrase`, or with a wrong one, passed
/// `config check` and `knob create`, and its host was then tried again for an hour while every
/// trial waited for it. The passphrase is never shown; a stored config's placeholder is not
/// checked (`knob resume` reads the passphrase again).
#[test]
fn remote_refuses_an_encrypted_key_without_its_passphrase_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id_ed25519");
    let passphrase = "right-Phrase-41";
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", passphrase, "-f"])
        .arg(&key)
        .status()
        .expect("ssh-keygen (openssh-client)");
    assert!(made.success());
    let machine = |host: &str, phrase: Option<&str>| {
        let mut machine = json!({"host": host, "user": "u", "sshKeyFile": key});
        if let Some(phrase) = phrase {
            machine["sshPassphrase"] = json!(phrase);
        }
        machine
    };
    let config = json!({"machineList": [
        machine("h0", None),
        machine("h1", Some("wrong-Phrase-13")),
        machine("h2", Some(passphrase)),
    ]});
    let shown = format!("{:?}", key.display().to_string());
    assert_eq!(
        problems("remote", config, &ServiceContext::default()),
        [
            format!("machineList[0].sshKeyFile: SSH key file {shown} is encrypted: give its passphrase as sshPassphrase"),
            format!("machineList[1].sshPassphrase: cannot decrypt SSH key file {shown} with this passphrase; give the key's own passphrase"),
        ]
    );
    let stored = ServiceContext {
        stored: true,
        ..ServiceContext::default()
    };
    let config = json!({"machineList": [machine("h0", Some(knob_plugin_api::config::REDACTED))]});
    let checked = check_built_in("remote", &config, &stored).unwrap();
    assert!(checked.is_ok(), "{checked:?}");
}

/// `user@host` and `host:port` in `host` passed `config check` and failed at the address
/// lookup, naming neither the field nor the fix; an IPv6 address is a host.
#[test]
fn remote_refuses_a_host_that_holds_a_user_or_a_port() {
    let machine = |host: &str| json!({"host": host, "user": "u", "password": "p"});
    let config = json!({"machineList": [
        machine("root@gpu1.lab"),
        machine("10.0.0.7:2222"),
        machine("::1"),
        machine("[fe80::1]"),
        machine("gpu2.lab"),
        machine(" "),
    ]});
    assert_eq!(
        problems("remote", config, &ServiceContext::default()),
        [
            r#"machineList[0].host: "root@gpu1.lab" holds a user: write host: "gpu1.lab" and user: "root""#,
            r#"machineList[1].host: "10.0.0.7:2222" holds a port: write host: "10.0.0.7" and port: 2222"#,
            r#"machineList[5].host: expected a non-empty string, got " ""#,
        ]
    );
}

/// A v2 config whose machine was copied from a v1 `machineList` (`ip`, `username`, ...) was
/// told "unknown field" with the whole list of known fields, and nothing led from `ip` to
/// `host`.
#[test]
fn remote_names_the_v2_field_for_a_machine_field_under_its_nni_v1_name() {
    let config = json!({"machineList": [{
        "ip": "10.0.0.1", "username": "bob", "passwd": "p", "sshKeyPath": "/k",
        "passphrase": "q", "maxTrialNumPerGpu": 2, "usr": "x"
    }]});
    let found = problems("remote", config, &ServiceContext::default());
    for (old, new) in [
        ("ip", "host"),
        ("username", "user"),
        ("passwd", "password"),
        ("sshKeyPath", "sshKeyFile"),
        ("passphrase", "sshPassphrase"),
        ("maxTrialNumPerGpu", "maxTrialNumberPerGpu"),
    ] {
        let expected = format!(
            r#"machineList[0].{old}: unknown field "{old}" (NNI v1's name; write "{new}")"#
        );
        assert!(found.contains(&expected), "{expected}\n{found:#?}");
    }
    // Any other unknown field is still told the closest known one.
    assert!(
        found.contains(
            &r#"machineList[0].usr: unknown field "usr" (did you mean "user"?)"#.to_string()
        ),
        "{found:#?}"
    );
}

#[test]
fn remote_declares_its_secrets_and_builds_its_class_args_from_the_context() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id_ed25519");
    std::fs::write(&key, "-----BEGIN OPENSSH PRIVATE KEY-----\nnot really a key\n-----END OPENSSH PRIVATE KEY-----\n").unwrap();
    let config_file = dir.path().join("exp.yml");
    // `experimentWorkingDirectory: ./experiments`, inside the trial code directory.
    let working_dir = dir.path().join("experiments");
    let context = ServiceContext {
        experiment_id: "exp1".into(),
        experiment_dir: Some(working_dir.join("exp1")),
        config_dir: dir.path().to_path_buf(),
        config_file: Some(config_file.clone()),
        ..ServiceContext::default()
    };
    let written = json!({
        "hostLossTimeout": "5s",
        "machineList": [
            {"host": "h1", "user": "alice", "password": "hunter2"},
            {"host": "h2", "user": "bob", "ssh_key_file": "id_ed25519", "sshPassphrase": "phrase"},
        ]
    });
    let checked = check_built_in("remote", &written, &context)
        .unwrap()
        .unwrap();
    let secrets: Vec<(String, Option<String>)> = checked
        .secrets
        .iter()
        .map(|secret| (secret.path.to_string(), secret.env_var.clone()))
        .collect();
    assert_eq!(
        secrets,
        [
            (
                "machineList[0].password".to_string(),
                Some("KNOB_SSH_PASSWORD".to_string())
            ),
            (
                "machineList[1].sshPassphrase".to_string(),
                Some("KNOB_SSH_PASSPHRASE".to_string())
            ),
        ]
    );
    let config = Value::Object(checked.config);
    assert_eq!(config["hostLossTimeout"], 5);
    let args = knob_training_services::remote::config::class_args(&config, &context);
    assert_eq!(args["experimentId"], "exp1");
    assert_eq!(args["hostLossTimeoutSecs"], 5);
    assert_eq!(args["machineList"][0]["password"], "hunter2");
    // What may hold a secret in clear is left out of the code uploaded to the hosts, and so are
    // the experiment's folder and the working directory that holds it.
    assert_eq!(
        args["excludeFiles"],
        json!([
            config_file.display().to_string(),
            working_dir.display().to_string(),
            working_dir.join("exp1").display().to_string(),
            key.display().to_string()
        ])
    );
    knob_training_services::remote::args::RemoteArgs::parse(&args).expect("args the service reads");

    // A machine listed twice (port 22 written or not) is refused here, where the config's
    // line is known, not when the experiment is being created.
    let twice = json!({"machineList": [
        {"host": "h1", "user": "alice", "password": "pw"},
        {"host": "h2", "user": "alice", "password": "pw"},
        {"host": "h1", "port": 22, "user": "alice", "password": "pw"},
    ]});
    assert_eq!(
        problems("remote", twice, &ServiceContext::default()),
        ["machineList[2]: repeats machineList[0] (alice@h1:22); list each machine once"]
    );
    // A host name in another case is the same machine; a user name in another case is
    // another user.
    let twice = json!({"machineList": [
        {"host": "gpu1.lab", "user": "alice", "password": "pw"},
        {"host": "GPU1.Lab", "user": "alice", "password": "pw"},
        {"host": "GPU1.Lab", "user": "Alice", "password": "pw"},
    ]});
    assert_eq!(
        problems("remote", twice, &ServiceContext::default()),
        ["machineList[1]: repeats machineList[0] (alice@gpu1.lab:22); list each machine once"]
    );

    // The placeholder knob prints is refused in a config the user wrote, not in a stored one.
    let placeholder = json!({"machineList": [{"host": "h1", "user": "alice", "password": "***"}]});
    assert_eq!(
        problems("remote", placeholder.clone(), &ServiceContext::default()),
        [
            r#"machineList[0].password: "***" is the placeholder knob prints instead of a secret; write the real value"#
        ]
    );
    // An unquoted all-digit password (or passphrase) reads as a number: refused without
    // printing it, since the error goes to the terminal and the log.
    let digits = json!({"machineList": [
        {"host": "h1", "user": "alice", "password": 98765432123u64},
        {"host": "h2", "user": "alice", "sshKeyFile": key, "sshPassphrase": 4242.5},
    ]});
    let refused = problems("remote", digits, &ServiceContext::default());
    assert_eq!(
        refused,
        [
            "machineList[0].password: expected a string, got a number (quote it; knob never shows a secret's value)",
            "machineList[1].sshPassphrase: expected a string, got a number (quote it; knob never shows a secret's value)",
        ]
    );

    let stored = ServiceContext {
        stored: true,
        ..ServiceContext::default()
    };
    assert!(check_built_in("remote", &placeholder, &stored)
        .unwrap()
        .is_ok());
}

#[test]
fn shared_machine_limits_apply_per_environment_with_the_top_level_fields_as_defaults() {
    // The core hands the top-level limits on canonical (percent numbers, MiB).
    let context = ServiceContext {
        experiment_id: "exp1".into(),
        shortcuts: json!({"maxCpuUtilization": 90.0, "gpuMemoryReserve": 1024})
            .as_object()
            .cloned()
            .unwrap(),
        ..ServiceContext::default()
    };
    let checked = check_built_in(
        "local",
        &json!({"maxMemoryUtilization": "80%", "memory_reserve": "2GiB", "maxCpuUtilization": 50}),
        &context,
    )
    .unwrap()
    .unwrap();
    let config = Value::Object(checked.config);
    assert_eq!(config["maxCpuUtilization"], 50.0);
    assert_eq!(config["maxMemoryUtilization"], 80.0);
    assert_eq!(config["memoryReserve"], 2048);
    assert_eq!(config.get("maxGpuMemoryUtilization"), None);
    assert_eq!(config["gpuMemoryReserve"], 1024);
    // What the service reports of this machine carries them, for gpu-sched to enforce.
    let inventory = &checked.environments.expect("the local machine")[0].inventory;
    assert_eq!(
        inventory["limits"],
        json!({
            "gpuIndices": null, "maxTrialNumberPerGpu": 1, "useActiveGpu": false,
            "maxCpuUtilization": 50.0, "minAvailableMemory": 2147483648u64,
            "maxMemoryUtilization": 80.0, "maxGpuMemoryUtilization": null,
            "gpuMemoryReserve": 1073741824u64,
        })
    );

    // Each remote machine has its own, defaulting to the top-level ones.
    let written = json!({"machineList": [
        {"host": "h1", "user": "alice", "maxGpuMemoryUtilization": 75},
        {"host": "h2", "user": "bob"},
    ]});
    let checked = check_built_in("remote", &written, &context)
        .unwrap()
        .unwrap();
    let machines = &checked.config["machineList"];
    assert_eq!(machines[0]["maxGpuMemoryUtilization"], 75.0);
    assert_eq!(machines[0]["maxCpuUtilization"], 90.0);
    assert_eq!(machines[1].get("maxGpuMemoryUtilization"), None);
    let args = knob_training_services::remote::config::class_args(
        &Value::Object(checked.config.clone()),
        &context,
    );
    let parsed = knob_training_services::remote::args::RemoteArgs::parse(&args).unwrap();
    assert_eq!(
        parsed.machines[0].limits.max_gpu_memory_utilization,
        Some(75.0)
    );
    assert_eq!(
        parsed.machines[1].limits.gpu_memory_reserve,
        Some(knob_gpu_sched::ByteSize::gib(1))
    );

    // Bad values name the field and what to write.
    assert_eq!(
        problems(
            "local",
            json!({"maxCpuUtilization": 150, "gpuMemoryReserve": "lots"}),
            &ServiceContext::default()
        ),
        [
            r#"maxCpuUtilization: expected a percentage above 0 and at most 100, like 90 or "90%", got 150"#,
            r#"gpuMemoryReserve: expected a size like "10GiB", "500MB" or a number of MiB, got "lots""#,
        ]
    );
    assert_eq!(
        problems(
            "remote",
            json!({"machineList": [{"host": "h1", "user": "a", "maxMemoryUtilization": 0}]}),
            &ServiceContext::default()
        ),
        [
            "machineList[0].maxMemoryUtilization: expected a percentage above 0 and at most 100, like 90 or \"90%\", got 0"
        ]
    );
}

/// A process that looks like a trial of `experiment` (the environment every trial gets).
fn fake_trial(experiment: &str, trial: &str) -> std::process::Child {
    Command::new("sleep")
        .arg("60")
        .env("NNI_EXP_ID", experiment)
        .env("NNI_TRIAL_JOB_ID", trial)
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_exited(child: &mut std::process::Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Waits until `/proc` shows the process's own environment (set at its first exec).
fn wait_for_environment(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let environ = format!("/proc/{pid}/environ");
    while !std::fs::read(&environ)
        .map(|bytes| bytes.windows(10).any(|w| w == b"NNI_EXP_ID"))
        .unwrap_or(false)
    {
        assert!(Instant::now() < deadline, "no environment in {environ}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn local_clean_up_kills_a_leftover_that_is_forever_in_the_middle_of_an_exec() {
    // A shell script that execs itself in a loop: its environment reads empty whenever a look
    // meets it between the two halves of an exec, and one look at /proc missed it now and then.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("exec_loop.sh");
    std::fs::write(&script, "exec /bin/sh \"$0\"\n").unwrap();
    for round in 0..20 {
        let mut looper = Command::new("/bin/sh")
            .arg(&script)
            .env("NNI_EXP_ID", "exp-exec")
            .env("NNI_TRIAL_JOB_ID", "t1")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_environment(looper.id());
        let reports = knob_training_services::local::kill_leftovers("exp-exec", &["t1".into()]);
        assert_eq!(
            reports,
            ["killed 1 process(es) of trial t1 left from an earlier run"],
            "round {round}"
        );
        assert!(
            wait_exited(&mut looper),
            "round {round}: the looper still runs"
        );
    }
}

#[test]
fn local_clean_up_ends_only_the_named_trials_of_its_experiment() {
    let mut mine = fake_trial("exp-clean", "t1");
    let mut other_trial = fake_trial("exp-clean", "t2");
    let mut other_experiment = fake_trial("exp-other", "t1");
    // The children's environment is set at exec; wait until /proc shows it.
    for child in [&mine, &other_trial, &other_experiment] {
        wait_for_environment(child.id());
    }
    let reports = knob_training_services::local::kill_leftovers("exp-clean", &["t1".into()]);
    assert_eq!(
        reports,
        ["killed 1 process(es) of trial t1 left from an earlier run"]
    );
    assert!(wait_exited(&mut mine), "the leftover trial still runs");
    assert!(other_trial.try_wait().unwrap().is_none());
    assert!(other_experiment.try_wait().unwrap().is_none());
    for child in [&mut other_trial, &mut other_experiment] {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// While only checking (no experiment folder yet), an `experimentWorkingDirectory` inside the
/// trial code directory, full of earlier experiments' files, does not count against the code's
/// 2000 files: it is never uploaded. The same files elsewhere in the directory do.
#[test]
fn remote_checks_its_code_directory_without_the_experiments_kept_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id_ed25519");
    std::fs::write(
        &key,
        "-----BEGIN OPENSSH PRIVATE KEY-----\nnot really a key\n-----END OPENSSH PRIVATE KEY-----\n",
    )
    .unwrap();
    let working_dir = dir.path().join("experiments");
    let earlier = working_dir.join("earlier/trials");
    std::fs::create_dir_all(&earlier).unwrap();
    for i in 0..2100 {
        std::fs::write(earlier.join(format!("f{i}")), "").unwrap();
    }
    let mut context = ServiceContext {
        config_dir: dir.path().to_path_buf(),
        working_directory: Some(working_dir.clone()),
        ..ServiceContext::default()
    };
    context.trial.trial_code_directory = dir.path().to_path_buf();
    let config = json!({"machineList": [{"host": "h", "user": "u", "sshKeyFile": key}]});
    assert!(check_built_in("remote", &config, &context).unwrap().is_ok());
    context.working_directory = Some(dir.path().join("elsewhere"));
    let found = problems("remote", config, &context);
    assert!(
        found.len() == 1
            && found[0].starts_with(": trialCodeDirectory cannot be sent to the hosts: ")
            && found[0].contains("holds more than 2000 files"),
        "{found:?}"
    );
}
