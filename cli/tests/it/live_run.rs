//! A live run and what happens around it: `knob experiment delete` while a run starts, a signal
//! the moment a run becomes visible, its folder deleted while it runs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::create::{Sandbox, SPACE};
use crate::resume::{running, wait_bounded};
use crate::run;

/// `knob resume` takes its store's writer lock before the registry says it runs; `knob
/// experiment delete`, which looked only at the registry, deleted an experiment whose resume was
/// between the two (its manager ran on without a store or a registry entry). Here the lock is
/// held as a starting run holds it, with nothing in the registry: delete refuses, and changes
/// nothing.
#[test]
fn delete_refuses_an_experiment_whose_store_a_run_holds() {
    let sandbox = Sandbox::new();
    let yaml =
        format!("trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let (code, _, stderr) = sandbox.create(&config, "held");
    assert_eq!(code, 0, "{stderr}");
    let dir = sandbox.path().join("experiments/held");

    let lock = rusqlite::Connection::open(dir.join("experiment.db.writer-lock")).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "delete", "held", "--yes"]));
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert_eq!(
        stderr,
        "error: experiment held is running (a knob process holds its store: it runs or is starting); stop it first with `knob stop held`\n"
    );
    assert!(dir.join("experiment.db").is_file());
    assert_eq!(sandbox.export("held")["experiment"]["status"], "DONE");
    let (_, list, _) = run(sandbox.knob().args(["experiment", "list"]));
    assert!(list.lines().any(|l| l.starts_with("held ")), "{list}");

    // Once the run lets go, the delete goes through.
    drop(lock);
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "delete", "held", "--yes"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("experiment held deleted ("), "{stdout}");
    assert!(!dir.exists());
}

/// The registry's `pid` and `status` of experiment `id`; `None` while it has no entry.
fn registry_row(registry: &rusqlite::Connection, id: &str) -> Option<(Option<u32>, String)> {
    use rusqlite::OptionalExtension;
    registry
        .query_row(
            "SELECT pid, status FROM experiments WHERE id = ?1",
            [id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .unwrap()
}

/// Starts `command` with its stderr in `log`.
fn spawn_logged(mut command: Command, log: &Path) -> Child {
    command
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// SIGINT to `child` as soon as the registry names it as the runner of `id` (`status`, when
/// given, too), polling every millisecond for at most 60 s; then its exit code (bounded).
fn interrupt_once_visible(
    registry: &rusqlite::Connection,
    mut child: Child,
    id: &str,
    status: Option<&str>,
) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row = registry_row(registry, id);
        let visible = row.as_ref().is_some_and(|(pid, shown)| {
            *pid == Some(child.id()) && status.is_none_or(|status| shown == status)
        });
        if visible {
            break;
        }
        if let Some(exit) = child.try_wait().unwrap() {
            panic!("{id}: knob ended ({exit}) before it was visible in the registry");
        }
        assert!(
            Instant::now() < deadline,
            "{id} not in the registry: {row:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: signalling our own child, not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    wait_bounded(&mut child, Duration::from_secs(60))
}

/// The signals were caught only once the manager ran: a SIGINT, SIGTERM or SIGHUP in between
/// (the registry said RUNNING, with the pid, already) took the default action, and the
/// experiment was left crashed with no line said. Caught before the run is visible, a signal
/// that comes that early stops the run as one later does, for `create` and for `resume`.
#[test]
fn ctrl_c_the_moment_a_run_is_visible_stops_it_cleanly() {
    let sandbox = Sandbox::new();
    let yaml = format!("trialCommand: sleep 30\ntrialConcurrency: 1\nmaxTrialNumber: 5\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    // The registry exists before the runs, so that polling it never races its creation.
    assert_eq!(
        run(sandbox.knob().args(["experiment", "list"])).0,
        0,
        "knob experiment list"
    );
    let registry = rusqlite::Connection::open_with_flags(
        sandbox.path().join("home/registry.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let log = sandbox.path().join("stderr.log");
    let check = |what: &str, id: &str, code: Option<i32>| {
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(code, Some(0), "{what}: {stderr}");
        assert!(stderr.contains("stopping (Ctrl-C)"), "{what}: {stderr}");
        assert_eq!(
            registry_row(&registry, id),
            Some((None, "STOPPED".to_string())),
            "{what}: {stderr}"
        );
        assert_eq!(
            sandbox.export(id)["experiment"]["status"],
            "STOPPED",
            "{what}: {stderr}"
        );
    };
    for round in 0..4 {
        let id = format!("early{round}");
        let child = spawn_logged(sandbox.create_command(&config, &id), &log);
        let code = interrupt_once_visible(&registry, child, &id, None);
        check(&format!("create {id}"), &id, code);
    }
    for round in 0..4 {
        let mut command = sandbox.knob();
        command.args(["resume", "early0"]);
        let child = spawn_logged(command, &log);
        let code = interrupt_once_visible(&registry, child, "early0", Some("RUNNING"));
        check(&format!("resume {round}"), "early0", code);
    }
}

/// The experiment's folder deleted while its manager runs (`rm -rf`): the manager went on,
/// finishing trials into a store no one could open again, and said nothing. It notices at the
/// next commit, stops its trials and ends with one line naming the folder.
#[test]
fn an_experiment_folder_deleted_while_it_runs_ends_the_run_with_one_line() {
    let sandbox = Sandbox::new();
    // Each trial notes its shell's pid, then reports a result every 0.1 s for 20 s.
    let script = "echo $$ >> trial.pids\n\
                  for i in $(seq 200); do echo \"KNOB_INTERMEDIATE $i\"; sleep 0.1; done\n\
                  echo KNOB_FINAL 1\n";
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 2\nmaxTrialNumber: 4\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let log = sandbox.path().join("stderr.log");
    let mut child = spawn_logged(sandbox.create_command(&config, "doomed"), &log);
    let dir: PathBuf = sandbox.path().join("experiments/doomed");
    let pids = sandbox.path().join("code/trial.pids");
    let deadline = Instant::now() + Duration::from_secs(60);
    let trial_pids: Vec<i32> = loop {
        let text = std::fs::read_to_string(&pids).unwrap_or_default();
        let found: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if found.len() >= 2 {
            break found;
        }
        assert!(Instant::now() < deadline, "the trials did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    // As `rm -rf` does it; tried again (bounded) should a trial add a file meanwhile.
    for attempt in 1.. {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => break,
            Err(e) if attempt < 10 => eprintln!("removing {}: {e}; again", dir.display()),
            Err(e) => panic!("cannot remove {}: {e}", dir.display()),
        }
    }

    let code = wait_bounded(&mut child, Duration::from_secs(15));
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(1), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error") || l.contains("deleted"))
        .collect();
    assert_eq!(
        errors,
        [format!(
            "error: experiment doomed: {}: the experiment's files were deleted while it ran; its trials are stopped and nothing more can be recorded; `knob experiment delete doomed --yes` forgets it",
            dir.display()
        )],
        "{stderr}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    for pid in trial_pids {
        while running(pid) {
            assert!(
                Instant::now() < deadline,
                "trial process {pid} runs on after its experiment ended"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["experiment", "delete", "doomed", "--yes"]));
    assert_eq!(code, 0, "{stderr}");
}

/// A second Ctrl-C while a stop waits for trials that trap SIGTERM (to save a checkpoint, say):
/// it exited at once, saying only "exiting without waiting for trials", and left them running
/// unwatched until a `knob stop`. It now has them killed (SIGKILL, without their grace period)
/// before it exits, and says so.
#[test]
fn a_second_ctrl_c_kills_the_trials_that_ignore_sigterm_before_exiting() {
    let sandbox = Sandbox::new();
    // Each trial ignores SIGTERM (as do the children it starts) and notes its pids.
    let script = "trap '' TERM\n\
                  sleep 60 &\n\
                  echo $$ $! >> trial.pids\n\
                  wait\n";
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 2\nmaxTrialNumber: 4\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let log = sandbox.path().join("stderr.log");
    let mut child = spawn_logged(sandbox.create_command(&config, "stubborn"), &log);
    let pids = sandbox.path().join("code/trial.pids");
    let deadline = Instant::now() + Duration::from_secs(60);
    let trial_pids: Vec<i32> = loop {
        let text = std::fs::read_to_string(&pids).unwrap_or_default();
        let found: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if found.len() >= 4 {
            break found;
        }
        assert!(Instant::now() < deadline, "the trials did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: signalling our own child, not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    // The second only once the first is being acted on.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("stopping (Ctrl-C)")
    {
        assert!(
            Instant::now() < deadline,
            "the first Ctrl-C was not acted on"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for &pid in &trial_pids {
        assert!(running(pid), "trial process {pid} ended on SIGTERM");
    }
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let code = wait_bounded(&mut child, Duration::from_secs(30));
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        stderr.contains("stopping at once: killing the running trials without their grace period"),
        "{stderr}"
    );
    match code {
        Some(130) => assert!(
            stderr.contains(
                "exiting: its trials are killed; `knob resume stubborn` continues the experiment"
            ),
            "{stderr}"
        ),
        // The manager saw the killed trials end before the services said they were done, and
        // ended the run as after one Ctrl-C.
        Some(0) => assert_eq!(
            sandbox.export("stubborn")["experiment"]["status"],
            "STOPPED",
            "{stderr}"
        ),
        _ => panic!("exit code {code:?} (None: still running after 30 s): {stderr}"),
    }
    // SIGKILLed: gone at once, but a loaded machine may take a moment to reap them.
    let deadline = Instant::now() + Duration::from_secs(10);
    for pid in trial_pids {
        while running(pid) {
            assert!(
                Instant::now() < deadline,
                "trial process {pid} runs on after the second Ctrl-C: {stderr}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `knob stop` while a `knob resume` starts: the resume holds the store's writer lock before
/// the registry names it as the runner, and the stop, finding no runner, said "is not running"
/// (exit 0) while the resume ran on. Here the registry is held (a write transaction, as another
/// knob's would be) while the resume holds the lock, so the resume cannot record itself yet:
/// the stop sees the run starting, waits for it, and stops it.
#[test]
fn stop_during_a_starting_resume_stops_it() {
    let (sandbox, config, registry_path) = sleeping_experiment_and_registry();
    let reader = rusqlite::Connection::open_with_flags(
        &registry_path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let log = sandbox.path().join("stderr.log");
    let child = spawn_logged(sandbox.create_command(&config, "starting"), &log);
    let code = interrupt_once_visible(&reader, child, "starting", None);
    assert_eq!(code, Some(0), "{}", std::fs::read_to_string(&log).unwrap());
    assert_eq!(
        registry_row(&reader, "starting"),
        Some((None, "STOPPED".to_string()))
    );

    let writer = rusqlite::Connection::open(&registry_path).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    let resume_log = sandbox.path().join("resume.log");
    let mut resume = sandbox.knob();
    resume.args(["resume", "starting"]);
    let mut resume = spawn_logged(resume, &resume_log);
    // Until the resume holds the store's writer lock (a read of it is refused at once).
    let lock = rusqlite::Connection::open_with_flags(
        sandbox
            .path()
            .join("experiments/starting/experiment.db.writer-lock"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    lock.busy_timeout(Duration::ZERO).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock
        .query_row("SELECT count(*) FROM writer", [], |row| {
            row.get::<_, i64>(0)
        })
        .is_ok()
    {
        if let Some(exit) = resume.try_wait().unwrap() {
            panic!(
                "resume ended ({exit}): {}",
                std::fs::read_to_string(&resume_log).unwrap()
            );
        }
        assert!(Instant::now() < deadline, "the resume never took its store");
        std::thread::sleep(Duration::from_millis(5));
    }

    // Its first line: waiting for the starting run (an old knob said "not running" and ended).
    let (mut stop, first) = spawn_stop(&sandbox, "starting");
    assert_eq!(
        first,
        "experiment starting is starting (a knob process holds its store); waiting for it to record its process, at most 10s\n"
    );
    // The resume may record itself now.
    writer.execute_batch("COMMIT").unwrap();
    assert_stopped(&mut stop, "starting");
    let code = wait_bounded(&mut resume, Duration::from_secs(60));
    let stderr = std::fs::read_to_string(&resume_log).unwrap();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("stopping (SIGTERM or knob stop)"),
        "{stderr}"
    );
    assert_eq!(
        registry_row(&reader, "starting"),
        Some((None, "STOPPED".to_string())),
        "{stderr}"
    );
    assert_eq!(
        sandbox.export("starting")["experiment"]["status"],
        "STOPPED"
    );
}

/// `knob stop` of an experiment whose `knob create` has not registered it yet (its config and
/// plugins are still being checked, a second or more): the stop said "no experiment ID in the
/// registry" and the experiment then ran to its end. Here the registry is held (a write
/// transaction) so the create cannot register: the stop finds the create, waits for it, and
/// stops the experiment once it is registered.
#[test]
fn stop_during_a_create_not_yet_registered_stops_it() {
    let (sandbox, config, registry_path) = sleeping_experiment_and_registry();
    let writer = rusqlite::Connection::open(&registry_path).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    let log = sandbox.path().join("create.log");
    let mut create = spawn_logged(sandbox.create_command(&config, "creating"), &log);

    let (mut stop, first) = spawn_stop(&sandbox, "creating");
    assert_eq!(
        first,
        format!(
            "experiment creating is being created (knob create, pid {}); waiting for it to be registered, at most 30s\n",
            create.id()
        )
    );
    // The create may register now.
    writer.execute_batch("COMMIT").unwrap();
    assert_stopped(&mut stop, "creating");
    let code = wait_bounded(&mut create, Duration::from_secs(60));
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        sandbox.export("creating")["experiment"]["status"],
        "STOPPED",
        "{stderr}"
    );

    // A create that ends without registering (here: the registry stays held past its 10 s
    // wait): the stop says so, rather than that no such experiment exists.
    let writer = rusqlite::Connection::open(&registry_path).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut refused = spawn_logged(sandbox.create_command(&config, "refused"), &log);
    let (code, _, stderr) = run(sandbox.knob().args(["stop", "refused"]));
    wait_bounded(&mut refused, Duration::from_secs(60));
    writer.execute_batch("COMMIT").unwrap();
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("error: no experiment refused: the knob create that was making it (pid {}) ended before registering it", refused.id())),
        "{stderr}"
    );
}

/// A sandbox with a config of five 30 s trials, one at a time, and its registry made (by a
/// `knob experiment list`), for the tests that hold the registry while a run starts; the
/// config and the registry's path.
fn sleeping_experiment_and_registry() -> (Sandbox, PathBuf, PathBuf) {
    let sandbox = Sandbox::new();
    let yaml = format!("trialCommand: sleep 30\ntrialConcurrency: 1\nmaxTrialNumber: 5\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    assert_eq!(run(sandbox.knob().args(["experiment", "list"])).0, 0);
    let registry_path = sandbox.path().join("home/registry.db");
    (sandbox, config, registry_path)
}

/// Starts `knob stop ID`; returns it with the first line it writes on stderr (what it waits
/// for, in the tests of a run that is starting).
fn spawn_stop(sandbox: &Sandbox, id: &str) -> (Child, String) {
    use std::io::BufRead;
    let mut stop = sandbox
        .knob()
        .args(["stop", id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(stop.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    // Read on, so that what it says later (that it waits) never meets a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    (stop, first)
}

/// Waits (bounded) for a [`spawn_stop`] to end saying that it stopped the experiment.
fn assert_stopped(stop: &mut Child, id: &str) {
    let code = wait_bounded(stop, Duration::from_secs(60));
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut stop.stdout.take().unwrap(), &mut stdout).unwrap();
    assert_eq!(code, Some(0), "{stdout}");
    assert_eq!(
        stdout,
        format!("experiment {id} stopped (STOPPED); continue it with `knob resume {id}`\n")
    );
}

/// Waits (bounded) until `log` holds `text`, failing with the log if `child` ends first.
fn wait_for_log(log: &Path, child: &mut Child, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(log).unwrap().contains(text) {
        if let Some(exit) = child.try_wait().unwrap() {
            panic!(
                "knob ended ({exit}) before it said {text:?}: {}",
                std::fs::read_to_string(log).unwrap()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no {text:?} within 60 s: {}",
            std::fs::read_to_string(log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A second stop while the first waits for trials that use their grace period (they trap
/// SIGTERM to save a checkpoint, then report): `knob stop` sent SIGINT, which the runner took for
/// a second Ctrl-C the second time; it killed the trials without their grace period, exited
/// without recording its end (crashed), and both stops failed. The same with two SIGTERMs, as
/// `timeout` sends (to the process, then to its group). Now a repeated SIGTERM, which `knob stop`
/// sends, waits for the stop under way: both stops say STOPPED, and the results the trials
/// reported in their grace period are recorded.
#[test]
fn a_second_knob_stop_or_sigterm_waits_for_the_stop_under_way() {
    // On SIGTERM each trial notes it, saves for 3 s (of the 5 s grace period), reports and exits.
    let script = "trap 'touch term-$NNI_TRIAL_JOB_ID; sleep 3; echo KNOB_FINAL 0.5; exit 0' TERM\n\
                  touch started-$NNI_TRIAL_JOB_ID\n\
                  for i in $(seq 600); do sleep 0.1; done\n\
                  echo KNOB_FINAL 1\n";
    let yaml = "trialCommand: bash trial.sh\ntrialConcurrency: 2\nmaxTrialNumber: 10\n\
                searchSpace:\n  x: {_type: randint, _value: [0, 1000000]}\n\
                tuner:\n  name: Random\n\
                trainingService:\n  platform: local";
    let sandbox = Sandbox::new();
    let config = sandbox.config(yaml, &[("trial.sh", script)]);
    let code_dir = sandbox.path().join("code");
    let count = |prefix: &str| {
        std::fs::read_dir(&code_dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .count()
    };
    let wait_for_files = |prefix: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while count(prefix) < 2 {
            assert!(Instant::now() < deadline, "no two {prefix}* files");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    for (round, id) in ["stops", "terms"].into_iter().enumerate() {
        for file in std::fs::read_dir(&code_dir).unwrap().flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.starts_with("started-") || name.starts_with("term-") {
                std::fs::remove_file(file.path()).unwrap();
            }
        }
        let log = sandbox.path().join(format!("{id}.log"));
        let mut child = spawn_logged(sandbox.create_command(&config, id), &log);
        wait_for_files("started-");
        let first_stop = if round == 0 {
            let stop = sandbox
                .knob()
                .args(["stop", id])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            Some(stop)
        } else {
            // SAFETY: signalling our own child, not reaped yet.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            None
        };
        // The second signal only once the first is acted on and the trials save.
        wait_for_log(&log, &mut child, "stopping (");
        wait_for_files("term-");
        if round == 0 {
            let (code, stdout, stderr) = run(sandbox.knob().args(["stop", id]));
            assert_eq!(
                (code, stdout.as_str()),
                (
                    0,
                    format!(
                        "experiment {id} stopped (STOPPED); continue it with `knob resume {id}`\n"
                    )
                    .as_str()
                ),
                "the second stop: {stderr}\n{}",
                std::fs::read_to_string(&log).unwrap()
            );
            let output = first_stop.unwrap().wait_with_output().unwrap();
            assert_eq!(
                (
                    output.status.code(),
                    String::from_utf8_lossy(&output.stdout).into_owned()
                ),
                (
                    Some(0),
                    format!(
                        "experiment {id} stopped (STOPPED); continue it with `knob resume {id}`\n"
                    )
                ),
                "the first stop: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        } else {
            // SAFETY: as above.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let code = wait_bounded(&mut child, Duration::from_secs(60));
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(code, Some(0), "{id}: {stderr}");
        assert!(
            stderr.contains("already stopping (SIGTERM or knob stop again)")
                && !stderr.contains("stopping at once"),
            "{id}: {stderr}"
        );
        let export = sandbox.export(id);
        assert_eq!(export["experiment"]["status"], "STOPPED", "{id}: {stderr}");
        let trials = export["trials"].as_array().unwrap();
        assert_eq!(trials.len(), 2, "{id}: {export}");
        for trial in trials {
            assert_eq!(
                trial["final"], 0.5,
                "{id}: the grace period's result: {trial}"
            );
        }
    }
}

/// A run suspended (Ctrl-Z in its terminal, SIGSTOP) takes no SIGTERM until it is continued:
/// `knob stop` waited its 2 minutes, then failed advising `kill -INT`, which a suspended process
/// does not take either. It now sends SIGCONT after its SIGTERM, and the stop goes as for a run
/// that was not suspended. Before that, the commands that ask its API (`knob update`, `knob
/// trial kill`, `knob top`) waited a minute each for an answer that could not come, then said
/// "timeout: global"; they say at once that it is suspended and what to do.
#[test]
fn knob_stop_stops_a_suspended_run() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: touch started-$NNI_TRIAL_JOB_ID; sleep 60; echo KNOB_FINAL 1\n\
         trialConcurrency: 1\nmaxTrialNumber: 2\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[]);
    let code_dir = sandbox.path().join("code");
    let log = sandbox.path().join("suspended.log");
    let mut child = spawn_logged(sandbox.create_command(&config, "suspended"), &log);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_dir(&code_dir)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("started-"))
    {
        assert!(child.try_wait().unwrap().is_none(), "knob create ended");
        assert!(Instant::now() < deadline, "no trial started within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling our own child, not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    let pid = child.id();
    let suspended = format!(
        "error: experiment suspended's process {pid} is suspended (Ctrl-Z in its terminal, or SIGSTOP), so its API cannot answer; `kill -CONT {pid}` (or `fg` in its terminal) continues it, `knob stop suspended` stops it\n"
    );
    for args in [
        &["update", "concurrency", "suspended", "2"][..],
        &["top", "suspended", "--iterations", "1"],
    ] {
        let mut asked = sandbox
            .knob()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let code = wait_bounded(&mut asked, Duration::from_secs(20));
        let mut stderr = String::new();
        use std::io::Read;
        asked
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(
            (code, stderr.as_str()),
            (Some(1), suspended.as_str()),
            "{args:?}"
        );
    }
    let mut stop = sandbox
        .knob()
        .args(["stop", "suspended"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let code = wait_bounded(&mut stop, Duration::from_secs(60));
    // Whatever the stop did, the run must not stay suspended past the test.
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    let mut stdout = String::new();
    let mut stderr = String::new();
    use std::io::Read;
    stop.stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    stop.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(
        (code, stdout.as_str()),
        (
            Some(0),
            "experiment suspended stopped (STOPPED); continue it with `knob resume suspended`\n"
        ),
        "{stderr}"
    );
    assert_eq!(wait_bounded(&mut child, Duration::from_secs(30)), Some(0));
    assert_eq!(
        sandbox.export("suspended")["experiment"]["status"],
        "STOPPED"
    );
}

/// `knob stop --all` (nnictl's `stop --all`) stops every experiment whose process runs, and
/// leaves the others as they are; with none running it says so; an id and `--all` together,
/// or neither, are refused.
#[test]
fn knob_stop_all_stops_every_running_experiment() {
    let (sandbox, config, registry_path) = sleeping_experiment_and_registry();
    let registry = rusqlite::Connection::open(&registry_path).unwrap();
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "--all"]));
    assert_eq!(
        (code, stdout.as_str()),
        (0, "no experiment is running\n"),
        "{stderr}"
    );
    // One already stopped, not running: left STOPPED, not named.
    let earlier = spawn_logged(
        sandbox.create_command(&config, "earlier"),
        &sandbox.path().join("earlier.log"),
    );
    assert_eq!(
        interrupt_once_visible(&registry, earlier, "earlier", Some("RUNNING")),
        Some(0)
    );
    let mut runs = Vec::new();
    for id in ["first", "second"] {
        let log = sandbox.path().join(format!("{id}.log"));
        let mut child = spawn_logged(sandbox.create_command(&config, id), &log);
        wait_for_log(&log, &mut child, "dashboard and API: ");
        runs.push((id, child, log));
    }
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "--all"]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    for (id, mut child, log) in runs {
        assert!(
            stdout.contains(&format!("experiment {id} stopped (STOPPED)")),
            "{stdout}"
        );
        let code = wait_bounded(&mut child, Duration::from_secs(60));
        assert_eq!(code, Some(0), "{}", std::fs::read_to_string(&log).unwrap());
        assert_eq!(sandbox.export(id)["experiment"]["status"], "STOPPED");
    }
    assert!(!stdout.contains("earlier"), "{stdout}");
    assert_eq!(sandbox.export("earlier")["experiment"]["status"], "STOPPED");

    let (code, _, stderr) = run(sandbox.knob().args(["stop", "first", "--all"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    let (code, _, stderr) = run(sandbox.knob().args(["stop"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("<ID>") || stderr.contains("--all"),
        "{stderr}"
    );
}
