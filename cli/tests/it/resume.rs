//! Resume, stop and retries, end to end, including SIGKILL of the manager at random moments.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use knob_core::experiment::MARKER_FILE_NAME;
use knob_core::registry::{Registry, RegistryEntry};
use knob_core::store::{ExperimentStatus, Store, StoreEvent};

use crate::create::{Sandbox, SPACE};
use crate::run;

fn spawn(mut command: Command) -> Child {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The child's exit code (-1 for a signal) once it exits within `limit`; `None` (it is killed)
/// if it does not.
pub(crate) fn wait_bounded(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status.code().unwrap_or(-1));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigkill(child: &mut Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

#[test]
fn a_finished_experiment_resumes_with_a_raised_trial_budget_and_fresh_ids() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 2\nmaxTrialNumber: 3\n{SPACE}"
        ),
        &[],
    );
    assert_eq!(sandbox.create(&config, "more").0, 0);
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["resume", "more", "--max-trial-number", "5"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("more");
    assert_eq!(export["experiment"]["status"], "DONE");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 5);
    let sequences: Vec<u64> = trials
        .iter()
        .map(|t| t["sequence"].as_u64().unwrap())
        .collect();
    assert_eq!(sequences, [0, 1, 2, 3, 4]);
    let mut ids: Vec<&str> = trials.iter().map(|t| t["id"].as_str().unwrap()).collect();
    let mut parameter_ids: Vec<u64> = trials
        .iter()
        .map(|t| t["parameter_id"].as_u64().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    parameter_ids.sort();
    parameter_ids.dedup();
    assert_eq!(
        (ids.len(), parameter_ids.len()),
        (5, 5),
        "ids repeat: {trials:?}"
    );
    assert!(trials.iter().all(|t| t["status"] == "SUCCEEDED"));
}

#[test]
fn a_trial_that_fails_twice_then_succeeds_is_retried_and_every_attempt_recorded() {
    let sandbox = Sandbox::new();
    let script = "count=count-$NNI_TRIAL_JOB_ID\nn=$(cat $count 2>/dev/null || echo 0)\necho $((n + 1)) > $count\n\
                  echo KNOB_FINAL $n\n\
                  if [ $n -lt 2 ]; then echo \"attempt $n fails\" >&2; exit 3; fi\n";
    let yaml = format!("trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1\nmaxTrialRetries: 2\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "retry");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let trial = &sandbox.export("retry")["trials"][0];
    assert_eq!(trial["status"], "SUCCEEDED", "{trial}");
    assert_eq!(trial["attempts"], 3, "{trial}");
    assert_eq!(trial["final"], 2.0, "{trial}");
    // Each attempt's own final stays in the export, the failed attempts' too.
    let finals: Vec<&serde_json::Value> = trial["attempt_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attempt| &attempt["final"])
        .collect();
    assert_eq!(finals, [0.0, 1.0, 2.0], "{trial}");
    // Each attempt ran in its own directory.
    let dir = sandbox
        .path()
        .join("experiments/retry/trials")
        .join(trial["id"].as_str().unwrap());
    assert!(
        dir.join("stderr").exists()
            && dir.join("attempt-2/stderr").exists()
            && dir.join("attempt-3/stdout").exists()
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("attempt-2/stderr")).unwrap(),
        "attempt 1 fails\n"
    );
}

#[test]
fn an_out_of_memory_kill_is_named_as_such() {
    let sandbox = Sandbox::new();
    let yaml = format!("trialCommand: kill -9 $$\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    // Its only trial failed: non-zero exit.
    assert_eq!(sandbox.create(&config, "oom").0, 1);
    let trial = &sandbox.export("oom")["trials"][0];
    assert_eq!(trial["status"], "FAILED");
    let message = trial["message"].as_str().unwrap();
    assert!(
        message.starts_with("out of memory? killed by signal 9"),
        "{message}"
    );
}

/// `knob resume --detach` runs on in the background as `knob create --detach` does, passing on
/// its options, and its output goes on in the experiment's log after the earlier run's.
#[test]
fn a_detached_resume_runs_in_the_background_and_its_log_goes_on() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: sleep 1; echo KNOB_FINAL 1\ntrialConcurrency: 2\nmaxTrialNumber: 2\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[]);
    let (code, _, stderr) = run(sandbox
        .knob()
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "bg", "--detach"]));
    assert_eq!(code, 0, "{stderr}");
    // A second runner is refused at once, in the foreground.
    let (code, _, stderr) = run(sandbox.knob().args(["resume", "bg", "--detach"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.starts_with("error: experiment bg is running (pid ")
            && stderr.ends_with("stop it first with `knob stop bg`\n"),
        "{stderr}"
    );
    // Done once its runner recorded the end in the registry, after closing the store: the next
    // resume is not refused as a second runner.
    let done = |trials: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, list, _) = run(sandbox.knob().args(["experiment", "list"]));
            let export = sandbox.export("bg");
            if list
                .lines()
                .any(|l| l.starts_with("bg ") && l.contains(" DONE "))
            {
                assert_eq!(export["trials"].as_array().unwrap().len(), trials);
                break;
            }
            assert!(Instant::now() < deadline, "not done in time: {export}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    done(2);

    let (code, stdout, stderr) = run(sandbox.knob().args([
        "resume",
        "bg",
        "--detach",
        "--max-trial-number",
        "4",
        "--port",
        "0",
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with("experiment bg runs in the background (pid ")
            && stdout.contains("stop it with `knob stop bg`"),
        "{stdout}"
    );
    done(4);
    let log = std::fs::read_to_string(sandbox.path().join("home/logs/bg.log")).unwrap();
    assert_eq!(
        log.matches("experiment bg DONE: ").count(),
        2,
        "both runs are in the log:\n{log}"
    );
    assert!(
        log.contains("resuming experiment bg (DONE, 2 trials so far)"),
        "{log}"
    );

    // An experiment whose folder is gone is refused before anything starts in the background.
    std::fs::rename(
        sandbox.path().join("experiments/bg"),
        sandbox.path().join("moved"),
    )
    .unwrap();
    let (code, _, stderr) = run(sandbox.knob().args(["resume", "bg", "--detach"]));
    assert_eq!(code, 1);
    assert!(stderr.contains("its directory"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(sandbox.path().join("home/logs/bg.log")).unwrap(),
        log
    );

    // Deleted, the experiment takes its log along: it used to stay in KNOB_HOME for good, and a
    // new experiment of the same id appended to it.
    let (code, _, stderr) = run(sandbox.knob().args(["experiment", "delete", "bg", "--yes"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(!sandbox.path().join("home/logs/bg.log").exists());
}

/// Right after `knob resume --detach` returns, the run is recorded as the experiment's runner but
/// still prepares itself, its API not served yet. `knob update` and `knob trial kill` wait for
/// that API: they used to say the experiment was "ending" and to resume it (a second resume),
/// while `knob experiment list` said RUNNING.
#[test]
fn commands_right_after_a_detached_resume_wait_for_its_api() {
    let sandbox = Sandbox::new();
    let yaml = format!("trialCommand: sleep 30\ntrialConcurrency: 1\nmaxTrialNumber: 20\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let (code, stdout, stderr) = run(sandbox.create_command(&config, "again").arg("--detach"));
    assert_eq!(code, 0, "{stderr}");
    let first = crate::Background::from_output(&stdout);
    let (code, _, stderr) = run(sandbox.knob().args(["stop", "again"]));
    assert_eq!(code, 0, "{stderr}");
    drop(first);
    commands_wait_for_a_detached_resume(&sandbox, "again");
}

/// As [`commands_right_after_a_detached_resume_wait_for_its_api`], after a crash: the crashed
/// run's API address, still recorded, is not taken for the starting run's (a command failed to
/// reach it).
#[test]
fn commands_right_after_a_crashed_experiments_detached_resume_wait_for_its_api() {
    let sandbox = Sandbox::new();
    crash_an_experiment(&sandbox, "wrecked", 20);
    commands_wait_for_a_detached_resume(&sandbox, "wrecked");
}

/// Resumes `id` in the background and at once (both together) updates it and kills a trial,
/// which must reach the new run's API; then stops it.
fn commands_wait_for_a_detached_resume(sandbox: &Sandbox, id: &str) {
    let (code, stdout, stderr) = run(sandbox.knob().args(["resume", id, "--detach"]));
    assert_eq!(code, 0, "{stderr}");
    let _resumed = crate::Background::from_output(&stdout);
    let kill = sandbox
        .knob()
        .args(["trial", "kill", id, "no-such-trial"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, stdout, stderr) = run(sandbox.knob().args(["update", "concurrency", id, "2"]));
    assert_eq!(
        (code, stdout.as_str()),
        (
            0,
            format!("experiment {id}: trialConcurrency updated\n").as_str()
        ),
        "{stderr}"
    );
    let kill = kill.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&kill.stderr);
    assert_eq!(kill.status.code(), Some(1), "{stderr}");
    // The API's refusal of an unknown trial, not one of the CLI's own.
    assert!(stderr.contains("(HTTP 404)"), "{stderr}");
    let (code, _, stderr) = run(sandbox.knob().args(["stop", id]));
    assert_eq!(code, 0, "{stderr}");
}

/// A `trialConcurrency` far beyond what the machine runs (one simulated GPU, so one trial at a
/// time and the rest waiting) keeps the manager creating waiting trials; a stop still gets
/// through at once. One turn used to create trials for as long as the budget lasted (here a
/// hundred million), and nothing else was heard meanwhile.
#[test]
fn a_huge_concurrency_does_not_keep_a_stop_from_being_heard() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: sleep 30\ntrialConcurrency: 100000000\nmaxTrialNumber: 100000000\ntrialGpuNumber: 1\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[]);
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "1x16GiB")
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "flood", "--detach"]));
    assert_eq!(code, 0, "{stderr}");
    // Killed whatever happens, not left creating trials.
    let _background = crate::Background::from_output(&stdout);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, show, _) = run(sandbox.knob().args(["experiment", "show", "flood"]));
        let waiting: u64 = show
            .split("WAITING ")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if waiting > 3000 {
            break;
        }
        assert!(Instant::now() < deadline, "no trials waiting: {show}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // `knob stop` gives up after 2 minutes of waiting for the experiment to end.
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "flood"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("experiment flood stopped (STOPPED)"),
        "{stdout}"
    );
    let export = sandbox.export("flood");
    let trials = export["trials"].as_array().unwrap();
    assert!(trials.len() < 1_000_000, "{}", trials.len());
    assert!(
        trials.iter().all(|t| t["status"] == "USER_CANCELED"),
        "every trial was cancelled by the stop"
    );
}

/// A resume whose trial code directory was removed is refused before it changes anything: each
/// trial would fail to start, using up the budget it was resumed to spend.
#[test]
fn a_resume_without_its_code_directory_is_refused_and_changes_nothing() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}"
        ),
        &[],
    );
    assert_eq!(sandbox.create(&config, "nocode").0, 0);
    let code_dir = sandbox.path().join("code");
    std::fs::rename(&code_dir, sandbox.path().join("code-moved")).unwrap();
    let (code, _, stderr) =
        run(sandbox
            .knob()
            .args(["resume", "nocode", "--max-trial-number", "5"]));
    assert_eq!(code, 1);
    assert_eq!(
        stderr,
        format!(
            "error: experiment nocode: its trialCodeDirectory {} is gone, so no trial could start; put it back (a copy at that path will do) and resume again\n",
            code_dir.display()
        )
    );
    let export = sandbox.export("nocode");
    assert_eq!(export["trials"].as_array().unwrap().len(), 1);
    assert_eq!(export["experiment"]["config"]["maxTrialNumber"], 1);
    // The resume recorded itself as the runner before its checks (so that `knob stop` finds
    // it); refused, it put the entry back: DONE, not "crashed (resume it)".
    let (_, list, _) = run(sandbox.knob().args(["experiment", "list"]));
    let row = list
        .lines()
        .find(|l| l.starts_with("nocode "))
        .unwrap_or_default();
    assert!(row.contains(" DONE ") && !row.contains("crashed"), "{list}");
    // A file where the folder was is not said to be gone.
    std::fs::write(&code_dir, "not a folder").unwrap();
    let (code, _, stderr) =
        run(sandbox
            .knob()
            .args(["resume", "nocode", "--max-trial-number", "5"]));
    assert_eq!(code, 1);
    assert_eq!(
        stderr,
        format!(
            "error: experiment nocode: its trialCodeDirectory {} is not a folder any more (something else is at that path), so no trial could start; put the folder back there (a copy will do) and resume again\n",
            code_dir.display()
        )
    );
    assert_eq!(
        sandbox.export("nocode")["trials"].as_array().unwrap().len(),
        1
    );
    std::fs::remove_file(&code_dir).unwrap();

    std::fs::rename(sandbox.path().join("code-moved"), &code_dir).unwrap();
    let (status, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["resume", "nocode", "--max-trial-number", "2"]));
    assert_eq!(status, 0, "{stdout}\n{stderr}");
    assert_eq!(
        sandbox.export("nocode")["trials"].as_array().unwrap().len(),
        2
    );
}

#[test]
fn knob_stop_stops_a_running_experiment_and_resume_finishes_it() {
    let sandbox = Sandbox::new();
    let yaml = format!("trialCommand: sleep 0.5; echo KNOB_FINAL 1\ntrialConcurrency: 2\nmaxTrialNumber: 6\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let mut child = spawn(sandbox.create_command(&config, "paused"));
    // Bounded wait until it registered and runs trials.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sandbox.path().join("experiments/paused/trials").exists() {
        assert!(Instant::now() < deadline, "the experiment did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "paused"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("experiment paused stopped (STOPPED)"),
        "{stdout}"
    );
    assert_eq!(wait_bounded(&mut child, Duration::from_secs(10)), Some(0));
    let stopped = sandbox.export("paused");
    assert_eq!(stopped["experiment"]["status"], "STOPPED");
    let before = stopped["trials"].as_array().unwrap().len();
    assert!(before < 6, "stopped too late to test anything");

    let (code, stdout, stderr) = run(sandbox.knob().args(["resume", "paused"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let done = sandbox.export("paused");
    assert_eq!(done["experiment"]["status"], "DONE");
    let trials = done["trials"].as_array().unwrap();
    assert_eq!(
        trials.iter().filter(|t| t["status"] == "SUCCEEDED").count()
            + trials
                .iter()
                .filter(|t| t["status"] == "USER_CANCELED")
                .count(),
        trials.len()
    );
    assert_eq!(
        trials.len(),
        6,
        "the trial budget continues where it stopped"
    );
}

/// Kills the manager with SIGKILL at seeded random moments, resumes each time, and checks from
/// the trials' own records that nothing reported by a finished trial was lost or doubled, that no
/// id repeats, and that the budget was completed.
#[test]
fn sigkill_at_random_moments_loses_nothing() {
    let sandbox = Sandbox::new();
    // Each attempt records what it reported, in its own directory, and marks when it is done.
    // A process whose start the manager never recorded (killed between spawn and record) runs
    // in the directory of the attempt that follows; each process marks where its lines begin.
    let script = "echo start >> \"$NNI_OUTPUT_DIR/own.log\"\nfor i in 1 2 3 4 5; do\n  v=$((RANDOM % 1000))\n  echo \"KNOB_INTERMEDIATE $v\"\n  echo \"$v\" >> \"$NNI_OUTPUT_DIR/own.log\"\n  sleep 0.05\ndone\n\
                  echo \"KNOB_FINAL $v\"\necho done >> \"$NNI_OUTPUT_DIR/own.log\"\n";
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 3\nmaxTrialNumber: 30\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);

    let mut seed: u64 = 0x5eed_1234;
    let mut next_delay = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        Duration::from_millis(150 + (seed >> 33) % 900)
    };
    let mut child = spawn(sandbox.create_command(&config, "crashy"));
    // The first kill comes only once the experiment is registered: killed before that, `create`
    // made nothing to resume (right, but not what this test is about), and under load a debug
    // build can take longer than the shortest delay to get there.
    let registered_by = Instant::now() + Duration::from_secs(60);
    while run(sandbox.knob().args(["experiment", "show", "crashy"])).0 != 0 {
        assert!(
            Instant::now() < registered_by,
            "knob create did not register the experiment within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(next_delay());
    sigkill(&mut child);
    for _round in 1..20 {
        let mut command = sandbox.knob();
        command.args(["resume", "crashy"]);
        let mut child = spawn(command);
        std::thread::sleep(next_delay());
        sigkill(&mut child);
    }
    let mut command = sandbox.knob();
    command.args(["resume", "crashy"]);
    let mut child = spawn(command);
    assert_eq!(
        wait_bounded(&mut child, Duration::from_secs(120)),
        Some(0),
        "the final resume did not finish"
    );

    let export = sandbox.export("crashy");
    assert_eq!(export["experiment"]["status"], "DONE");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 30, "the budget is 30 trials");
    let mut ids: Vec<&str> = trials.iter().map(|t| t["id"].as_str().unwrap()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 30, "a trial id repeats");
    let sequences: Vec<u64> = trials
        .iter()
        .map(|t| t["sequence"].as_u64().unwrap())
        .collect();
    assert_eq!(sequences, (0..30).collect::<Vec<_>>());
    let mut parameter_ids: Vec<u64> = trials
        .iter()
        .map(|t| t["parameter_id"].as_u64().unwrap())
        .collect();
    parameter_ids.sort();
    parameter_ids.dedup();
    assert_eq!(parameter_ids.len(), 30, "a parameter id repeats");

    for trial in trials {
        assert_eq!(trial["status"], "SUCCEEDED", "{trial}");
        let attempts = trial["attempts"].as_u64().unwrap();
        let dir = sandbox
            .path()
            .join("experiments/crashy/trials")
            .join(trial["id"].as_str().unwrap());
        let dir = if attempts == 1 {
            dir
        } else {
            dir.join(format!("attempt-{attempts}"))
        };
        let own = std::fs::read_to_string(dir.join("own.log")).unwrap();
        let own: Vec<&str> = own.lines().collect();
        let last_start = own.iter().rposition(|l| *l == "start").unwrap();
        let own = &own[last_start + 1..];
        assert_eq!(own.last(), Some(&"done"), "{}: {own:?}", dir.display());
        let reported: Vec<f64> = own[..own.len() - 1]
            .iter()
            .map(|v| v.parse().unwrap())
            .collect();
        let stored: Vec<f64> = trial["intermediate"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["attempt"].as_u64() == Some(attempts))
            .map(|m| m["value"].as_f64().unwrap())
            .collect();
        assert_eq!(stored, reported, "{trial}");
        assert_eq!(trial["final"].as_f64(), reported.last().copied(), "{trial}");
    }
}

#[test]
fn out_of_memory_failures_have_their_own_retry_limit() {
    let sandbox = Sandbox::new();
    // The first two attempts die as the OOM killer would make them; the third succeeds.
    let script = "count=count-$NNI_TRIAL_JOB_ID\nn=$(cat $count 2>/dev/null || echo 0)\necho $((n + 1)) > $count\n\
                  if [ $n -lt 2 ]; then kill -9 $$; fi\necho KNOB_FINAL 1\n";
    let yaml = format!("trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1\nmaxOomRetries: 2\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "oomretry");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let trial = &sandbox.export("oomretry")["trials"][0];
    assert_eq!(
        (trial["status"].as_str(), trial["attempts"].as_u64()),
        (Some("SUCCEEDED"), Some(3)),
        "{trial}"
    );

    // An ordinary failure is not retried under the OOM limit.
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: exit 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\nmaxOomRetries: 2\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[]);
    assert_eq!(sandbox.create(&config, "plainfail").0, 1);
    let trial = &sandbox.export("plainfail")["trials"][0];
    assert_eq!(
        (trial["status"].as_str(), trial["attempts"].as_u64()),
        (Some("FAILED"), Some(1)),
        "{trial}"
    );
}

/// Waits (bounded) until `file` holds at least `lines` lines; returns them.
fn wait_for_lines(file: &std::path::Path, lines: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let found: Vec<String> = text.lines().map(String::from).collect();
        if found.len() >= lines {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{} has {} of {lines} lines",
            file.display(),
            found.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn resume_runs_again_what_a_stop_cancelled_but_not_what_the_user_killed() {
    let sandbox = Sandbox::new();
    // Each trial notes its id, then waits (bounded) for `go` before it reports.
    let script = "echo \"$NNI_TRIAL_JOB_ID\" >> started\n\
                  for i in $(seq 600); do [ -e go ] && break; sleep 0.05; done\n\
                  echo KNOB_FINAL 1\n";
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 2\nmaxTrialNumber: 4\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let started = sandbox.path().join("code/started");
    let mut child = spawn(sandbox.create_command(&config, "halted"));
    let first_two = wait_for_lines(&started, 2);
    let killed = first_two[0].clone();
    let (code, stdout, stderr) = run(sandbox.knob().args(["trial", "kill", "halted", &killed]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    // The killed trial's place is taken by a third; then the whole experiment is stopped.
    wait_for_lines(&started, 3);
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "halted"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(wait_bounded(&mut child, Duration::from_secs(20)), Some(0));
    let stopped = sandbox.export("halted");
    let trials = stopped["trials"].as_array().unwrap();
    let message = |t: &serde_json::Value| t["message"].as_str().unwrap_or_default().to_string();
    for trial in trials {
        assert_eq!(trial["status"], "USER_CANCELED", "{trial}");
        let expected = if trial["id"] == killed.as_str() {
            "killed by the user"
        } else {
            "stopped with the experiment; `knob resume` runs it again"
        };
        assert_eq!(message(trial), expected, "{trial}");
    }
    let stopped_ids: Vec<String> = trials
        .iter()
        .filter(|t| t["id"] != killed.as_str())
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    assert!(!stopped_ids.is_empty(), "{stopped}");

    std::fs::write(sandbox.path().join("code/go"), "").unwrap();
    let (code, stdout, stderr) = run(sandbox.knob().args(["resume", "halted"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let done = sandbox.export("halted");
    let trials = done["trials"].as_array().unwrap();
    assert_eq!(
        trials.len(),
        4,
        "the budget is not spent on stopped trials: {done}"
    );
    for trial in trials {
        let id = trial["id"].as_str().unwrap();
        if id == killed {
            assert_eq!(trial["status"], "USER_CANCELED", "{trial}");
            assert_eq!(trial["attempts"], 1, "{trial}");
        } else {
            assert_eq!(trial["status"], "SUCCEEDED", "{trial}");
            assert_eq!(trial["final"], 1.0, "{trial}");
        }
    }
    // The two trials running at the stop ran again as a second attempt; the stopped attempt
    // stays in their history.
    let all_started = wait_for_lines(&started, 3);
    for id in &all_started[1..3] {
        let trial = trials.iter().find(|t| t["id"] == id.as_str()).unwrap();
        assert_eq!(trial["attempts"], 2, "{trial}");
        let stopped_attempt = &trial["attempt_history"][0];
        assert_eq!(stopped_attempt["status"], "USER_CANCELED", "{trial}");
        assert_eq!(
            stopped_attempt["message"], "stopped with the experiment; `knob resume` runs it again",
            "{trial}"
        );
    }
}

/// A trial a stop cancelled, which the resumed run did not start again before it was stopped
/// too (one at a time, and the other trial ran first), keeps the end its one attempt had: that
/// stop moved its end (and so its duration) to its own time, and each later stop again.
#[test]
fn a_trial_a_resumed_run_never_started_keeps_its_end_through_the_next_stop() {
    let sandbox = Sandbox::new();
    // Each trial notes its id, then waits (bounded) for `go`, which never comes.
    let script = "echo \"$NNI_TRIAL_JOB_ID\" >> started\n\
                  for i in $(seq 600); do [ -e go ] && break; sleep 0.05; done\n\
                  echo KNOB_FINAL 1\n";
    let yaml =
        format!("trialCommand: bash trial.sh\ntrialConcurrency: 2\nmaxTrialNumber: 2\n{SPACE}");
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let started = sandbox.path().join("code/started");
    let mut child = spawn(sandbox.create_command(&config, "kept"));
    wait_for_lines(&started, 2);
    // One at a time from now on: the resumed run starts one of the two again, the other waits.
    let (code, stdout, stderr) = run(sandbox.knob().args(["update", "concurrency", "kept", "1"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "kept"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(wait_bounded(&mut child, Duration::from_secs(20)), Some(0));
    let first = sandbox.export("kept");

    let mut resume = sandbox.knob();
    resume.args(["resume", "kept"]);
    let mut child = spawn(resume);
    let rerun = wait_for_lines(&started, 3)[2].clone();
    // Later than the first stop by more than the clock's grain.
    std::thread::sleep(Duration::from_millis(300));
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "kept"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(wait_bounded(&mut child, Duration::from_secs(20)), Some(0));
    let second = sandbox.export("kept");

    // The trial that ran again (`true`) or the other one, in `export`.
    let trial = |export: &serde_json::Value, ran_again: bool| {
        export["trials"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| (t["id"] == rerun.as_str()) == ran_again)
            .unwrap()
            .clone()
    };
    let (before, after) = (trial(&first, false), trial(&second, false));
    assert_eq!(after["status"], "USER_CANCELED", "{after}");
    assert_eq!(after["attempts"], 1, "{after}");
    assert_eq!(after["ended_ms"], before["ended_ms"], "{before}\n{after}");
    assert_eq!(
        after["attempt_history"][0]["ended_ms"], before["ended_ms"],
        "{after}"
    );
    // The one that ran again ended with the second stop, in its second attempt.
    let again = trial(&second, true);
    assert_eq!(again["attempts"], 2, "{again}");
    assert!(
        again["ended_ms"].as_i64() > trial(&first, true)["ended_ms"].as_i64(),
        "{again}"
    );
}

/// An experiment that failed (here its tuner handed out bad parameters) cancels the trials it
/// was running; they did not end on their own, so `knob resume`, once the cause is fixed, runs
/// them again as a new attempt, as after a crash or a stop.
#[test]
fn resume_runs_again_what_a_failure_of_the_experiment_cancelled() {
    let library = crate::tuner_output::misbehaving_tuner();
    let sandbox = Sandbox::new();
    let fixed = sandbox.path().join("tuner-fixed");
    // The first trial to make the folder `quick` (an atomic step) ends once the other has
    // noted its id in `waited`, so the tuner is asked for a third (bad) parameter set while the
    // other waits (bounded) for `go`.
    let script = "if mkdir quick 2>/dev/null; then\n\
                  for i in $(seq 600); do [ -s waited ] && break; sleep 0.05; done\n\
                  else\n\
                  echo \"$NNI_TRIAL_JOB_ID\" >> waited\n\
                  for i in $(seq 600); do [ -e go ] && break; sleep 0.05; done\n\
                  fi\n\
                  echo KNOB_FINAL 1\n";
    let yaml = format!(
        "trialCommand: bash trial.sh
trialConcurrency: 2
maxTrialNumber: 4
searchSpace: {{x: {{_type: uniform, _value: [0, 1]}}}}
pluginPaths: [{library}]
tuner: {{name: Misbehaving, classArgs: {{output: bad_from_2, fixed: {fixed}}}}}
trainingService: {{platform: local}}",
        library = library.display(),
        fixed = fixed.display()
    );
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "failed");
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let failed = sandbox.export("failed");
    assert_eq!(failed["experiment"]["status"], "ERROR", "{failed}");
    let waited = wait_for_lines(&sandbox.path().join("code/waited"), 1);
    let cancelled = failed["trials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == waited[0].as_str())
        .unwrap()
        .clone();
    assert_eq!(cancelled["status"], "SYS_CANCELED", "{failed}");
    assert_eq!(
        cancelled["message"], "the experiment failed; `knob resume` runs it again",
        "{failed}"
    );

    std::fs::write(&fixed, "").unwrap();
    std::fs::write(sandbox.path().join("code/go"), "").unwrap();
    let (code, stdout, stderr) = run(sandbox.knob().args(["resume", "failed"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let done = sandbox.export("failed");
    assert_eq!(done["experiment"]["status"], "DONE", "{done}");
    let trials = done["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "{done}");
    for trial in trials {
        assert_eq!(trial["status"], "SUCCEEDED", "{trial}");
    }
    let rerun = trials.iter().find(|t| t["id"] == cancelled["id"]).unwrap();
    assert_eq!(rerun["attempts"], 2, "{rerun}");
    let first = &rerun["attempt_history"][0];
    assert_eq!(first["status"], "SYS_CANCELED", "{rerun}");
    assert_eq!(
        first["requeued"], "the experiment failed before it ended",
        "{rerun}"
    );
}

/// Experiment `id` of `trials` trials, one at a time, each waiting for a file `go` in the code
/// folder (and noting its shell's pid in `trial.pids`): its runner is killed with SIGKILL once
/// the first trial has started.
fn crash_an_experiment(sandbox: &Sandbox, id: &str, trials: u32) {
    let script = "echo $$ >> trial.pids\n\
                  echo \"$NNI_TRIAL_JOB_ID\" >> started\n\
                  for i in $(seq 600); do [ -e go ] && break; sleep 0.05; done\n\
                  echo KNOB_FINAL 1\n";
    let yaml = format!(
        "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: {trials}\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let mut child = spawn(sandbox.create_command(&config, id));
    wait_for_lines(&sandbox.path().join("code/started"), 1);
    sigkill(&mut child);
}

#[test]
fn after_a_crash_every_command_says_crashed_and_to_resume_it() {
    let sandbox = Sandbox::new();
    crash_an_experiment(&sandbox, "wreck", 2);

    // The first trial runs on without its manager; `knob stop` ends it, and says the
    // experiment stays crashed. Ending it is what was asked: it succeeds (it exited 1).
    let pid = std::fs::read_to_string(sandbox.path().join("code/trial.pids")).unwrap();
    let pid: i32 = pid.trim().parse().unwrap();
    assert!(
        running(pid),
        "the trial should run on after its manager's crash"
    );
    // `knob experiment export` (so the Python launcher's `knob.load()`) says it as the API does;
    // it said RUNNING for ever, and a script polling until it was not RUNNING waited for ever.
    let exported = || {
        let (code, stdout, stderr) =
            run(sandbox
                .knob()
                .args(["experiment", "export", "wreck", "--format", "json"]));
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        let export: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        export["experiment"].clone()
    };
    let experiment = exported();
    assert_eq!(experiment["status"], "CRASHED", "{experiment}");
    assert!(
        experiment["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(
                "crashed (resume it): the process running it is gone; `knob resume wreck`"
            )),
        "{experiment}"
    );
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "wreck"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("experiment wreck crashed (resume it)")
            && stdout.contains("what it left running is ended")
            && stdout.contains("`knob resume wreck`"),
        "{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("error"), "{stderr}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(pid) {
        assert!(
            Instant::now() < deadline,
            "trial process {pid} still runs after the stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, stdout, _) = run(sandbox.knob().args(["experiment", "list"]));
    let row = stdout.lines().find(|l| l.starts_with("wreck")).unwrap();
    assert!(row.contains("crashed (resume it)"), "{stdout}");
    assert_eq!(exported()["status"], "CRASHED");
    let (_, stdout, _) = run(sandbox.knob().args(["experiment", "show", "wreck"]));
    assert!(
        stdout.contains("status:    crashed (resume it)") && stdout.contains("knob resume wreck"),
        "{stdout}"
    );
    let (_, stdout, _) = run(sandbox.knob().args(["top", "wreck", "--iterations", "1"]));
    assert!(stdout.contains("crashed (resume it)"), "{stdout}");
    // Zero refreshes is not a number of frames to draw: refused (it drew one).
    let (code, stdout, stderr) = run(sandbox.knob().args(["top", "wreck", "--iterations", "0"]));
    assert_eq!((code, stdout.as_str()), (2, ""), "{stderr}");
    assert!(stderr.contains("--iterations"), "{stderr}");
    let mut command = sandbox.knob();
    command.args(["view", "wreck", "--port", "0"]);
    let view = crate::api::start(command, &[]);
    let (status, summary) = crate::api::get(&view.base, "/experiment");
    assert_eq!(
        (status, &summary["status"]),
        (200, &serde_json::json!("CRASHED"))
    );
    // Its clock stopped with its process: elapsed does not grow while nothing runs (it used to
    // count on to now, in the API, the dashboard and `knob top`).
    std::thread::sleep(Duration::from_millis(1100));
    let (_, again) = crate::api::get(&view.base, "/experiment");
    assert_eq!(again["elapsed_ms"], summary["elapsed_ms"], "{again}");
    let top = || run(sandbox.knob().args(["top", "wreck", "--iterations", "1"])).1;
    let before = top();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(top(), before);
    assert!(
        summary["status_message"]
            .as_str()
            .is_some_and(|m| m.contains("knob resume wreck")),
        "{summary}"
    );
    // The dashboard's download is the export, status and message alike.
    let (status, export) = crate::api::get(&view.base, "/export?format=json");
    assert_eq!(status, 200, "{export}");
    assert_eq!(
        (
            &export["experiment"]["status"],
            &export["experiment"]["message"]
        ),
        (&summary["status"], &summary["status_message"]),
        "{export}"
    );
    drop(view);
    // `knob view`'s list has no live dashboard for it: nothing serves its old port.
    let mut command = sandbox.knob();
    command.args(["view", "--port", "0"]);
    let view = crate::api::start(command, &[]);
    let (_, listed) = crate::api::get(&view.base, "/experiments");
    let entry = &listed["experiments"][0];
    assert_eq!(
        (&entry["status"], &entry["port"]),
        (&serde_json::json!("CRASHED"), &serde_json::Value::Null),
        "{listed}"
    );
    drop(view);

    // Resumed, it is an ordinary experiment again.
    std::fs::write(sandbox.path().join("code/go"), "").unwrap();
    let (code, stdout, stderr) = run(sandbox.knob().args(["resume", "wreck"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    // How it was left, not its last recorded status (it said RUNNING).
    assert!(
        stderr.contains("resuming experiment wreck (crashed, "),
        "{stderr}"
    );
    let (_, stdout, _) = run(sandbox.knob().args(["experiment", "list"]));
    let row = stdout.lines().find(|l| l.starts_with("wreck")).unwrap();
    assert!(row.contains("DONE"), "{stdout}");
}

/// Whether process `pid` runs (exists and is not a zombie).
pub(crate) fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|state| !state.trim_start().starts_with('Z'))
    })
}

/// A crashed run's trials run on without their manager. `knob experiment delete` ends them
/// before their folder goes, as `knob resume` does before it runs them again; they had run on,
/// writing into a deleted folder and holding their GPUs.
#[test]
fn deleting_a_crashed_experiment_ends_the_trials_it_left_running() {
    let sandbox = Sandbox::new();
    crash_an_experiment(&sandbox, "orphans", 2);
    let pid: i32 = std::fs::read_to_string(sandbox.path().join("code/trial.pids"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        running(pid),
        "the trial should run on after its manager's crash"
    );

    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "delete", "orphans", "--yes"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("note: killed ") && stderr.contains(" left from an earlier run"),
        "{stderr}"
    );
    assert!(
        stdout.starts_with("experiment orphans deleted ("),
        "{stdout}"
    );
    assert!(!sandbox.path().join("experiments/orphans").exists());
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(pid) {
        assert!(
            Instant::now() < deadline,
            "trial process {pid} still runs after the delete"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A runner that crashed leaves its pid in the registry, and the system hands pids out again
/// (after a reboot, or a pid space's worth of processes later). The process that got it is no
/// experiment: `knob stop` must not signal it, `knob experiment list` still says crashed, and
/// `knob resume` runs it (it refused it as running before; `knob experiment delete` used the
/// same check, now `RegistryEntry::running_pid` for all three).
#[test]
fn a_crashed_runners_pid_taken_by_another_process_is_not_the_experiment() {
    let sandbox = Sandbox::new();
    crash_an_experiment(&sandbox, "reused", 1);
    // The dead runner's pid, as if the system had given it to this process since.
    let mut stranger = Command::new("sleep").arg("300").spawn().unwrap();
    let registry = rusqlite::Connection::open(sandbox.path().join("home/registry.db")).unwrap();
    let changed = registry
        .execute(
            "UPDATE experiments SET pid = ?1 WHERE id = 'reused'",
            [stranger.id()],
        )
        .unwrap();
    assert_eq!(changed, 1);

    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "reused"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("experiment reused crashed (resume it)"),
        "{stdout}\n{stderr}"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        stranger.try_wait().unwrap().is_none(),
        "knob stop signalled the process that got the crashed runner's pid"
    );
    let (_, stdout, _) = run(sandbox.knob().args(["experiment", "list"]));
    let row = stdout.lines().find(|l| l.starts_with("reused")).unwrap();
    assert!(row.contains("crashed (resume it)"), "{stdout}");
    std::fs::write(sandbox.path().join("code/go"), "").unwrap();
    let (code, stdout, stderr) = run(sandbox.knob().args(["resume", "reused"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let (_, stdout, _) = run(sandbox.knob().args(["experiment", "list"]));
    let row = stdout.lines().find(|l| l.starts_with("reused")).unwrap();
    assert!(row.contains("DONE"), "{stdout}");
    assert!(stranger.try_wait().unwrap().is_none());
    stranger.kill().unwrap();
    stranger.wait().unwrap();
}

#[test]
fn resume_says_when_the_budget_is_used_up_and_refuses_a_budget_below_what_is_done() {
    let sandbox = Sandbox::new();
    let yaml =
        format!("trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 2\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    assert_eq!(sandbox.create(&config, "spent").0, 0);

    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["resume", "spent", "--max-trial-number", "1"]));
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stderr.lines().any(|l| l == "error: --max-trial-number 1 is below the 2 trials experiment spent already has; give at least 3 to run more, or leave it out"),
        "{stderr}"
    );
    assert_eq!(
        sandbox.export("spent")["experiment"]["config"]["maxTrialNumber"],
        2,
        "a refused resume changes nothing"
    );
    // 0, which create and `knob update trialnum` refuse, is refused whatever the trials so far
    // (an experiment killed before its first trial stored it).
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["resume", "spent", "--max-trial-number", "0"]));
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stderr.starts_with("error: invalid value '0' for '--max-trial-number <MAX_TRIAL_NUMBER>': must be at least 1, got 0"),
        "{stderr}"
    );

    let (code, stdout, stderr) = run(sandbox.knob().args(["resume", "spent"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("note: experiment spent has used its trial budget (2 of maxTrialNumber 2): nothing is left to run; raise it with `knob resume spent --max-trial-number N`"),
        "{stderr}"
    );
    assert_eq!(
        sandbox.export("spent")["trials"].as_array().unwrap().len(),
        2
    );
}

/// The time budget spent, a resume starts nothing: it used to start a turn's worth of new
/// trials (using up `maxTrialNumber`) and cancel them at once, at every resume.
#[test]
fn a_resume_after_the_time_budget_is_spent_starts_no_trial() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: sleep 30\ntrialConcurrency: 2\nmaxTrialNumber: 10\nmaxExperimentDuration: 2s\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, "timed");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment timed DONE: 2 trials (0 succeeded, 0 failed, 2 canceled)"),
        "{stdout}"
    );
    for _ in 0..2 {
        let (code, stdout, stderr) = run(sandbox.knob().args(["resume", "timed"]));
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        assert!(
            stderr.contains("note: experiment timed has used its time budget"),
            "{stderr}"
        );
        assert!(
            stdout
                .starts_with("experiment timed DONE: 2 trials (0 succeeded, 0 failed, 2 canceled)"),
            "{stdout}\n{stderr}"
        );
    }
    // Raised, the budget runs new trials again.
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["resume", "timed", "--max-experiment-duration", "4s"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment timed DONE: 4 trials (0 succeeded, 0 failed, 4 canceled)"),
        "{stdout}\n{stderr}"
    );
}

/// A run killed in a quiet stretch (its trial reporting nothing) left no event saying how long it
/// lived; the store writer's alive mark does, and the resume counts it against
/// `maxExperimentDuration` (it used to grant the whole budget again after every crash). The
/// mark is moved past the budget here rather than waited for.
#[test]
fn a_crashed_runs_quiet_time_counts_against_the_time_budget() {
    let sandbox = Sandbox::new();
    let script = "echo \"$NNI_TRIAL_JOB_ID\" >> started\n\
                  for i in $(seq 600); do [ -e go ] && break; sleep 0.05; done\n\
                  echo KNOB_FINAL 1\n";
    let yaml = format!(
        "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 3\nmaxExperimentDuration: 30s\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let mut child = spawn(sandbox.create_command(&config, "quiet"));
    wait_for_lines(&sandbox.path().join("code/started"), 1);
    sigkill(&mut child);
    let alive = sandbox
        .path()
        .join("experiments/quiet")
        .join(knob_core::store::ALIVE_FILE_NAME);
    let lived_until = std::time::SystemTime::now() + std::time::Duration::from_secs(31);
    std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&alive)
        .unwrap()
        .set_modified(lived_until)
        .unwrap();
    let (code, stdout, stderr) = run(sandbox.knob().args(["resume", "quiet"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("note: experiment quiet has used its time budget (3"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(sandbox.path().join("code/started"))
            .unwrap()
            .lines()
            .count(),
        1,
        "no trial starts again"
    );
}

#[test]
fn the_api_shows_the_metrics_of_a_trials_latest_attempt_unless_asked_for_all() {
    let sandbox = Sandbox::new();
    // Attempt 1 reports and then fails; attempt 2 reports and succeeds.
    let script = "n=$(cat count 2>/dev/null || echo 0)\necho $((n + 1)) > count\n\
                  echo \"KNOB_INTERMEDIATE $((n + 1))\"\necho \"KNOB_FINAL $((n + 1))\"\n\
                  [ $n -ge 1 ]\n";
    let yaml = format!(
        "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1\nmaxTrialRetries: 1\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "twice");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let trial = &sandbox.export("twice")["trials"][0];
    assert_eq!(
        (&trial["attempts"], &trial["final"]),
        (&serde_json::json!(2), &serde_json::json!(2.0)),
        "{trial}"
    );
    let id = trial["id"].as_str().unwrap();

    let mut command = sandbox.knob();
    command.args(["view", "twice", "--port", "0"]);
    let view = crate::api::start(command, &[]);
    let attempts_of = |path: &str| -> Vec<(u64, String, String)> {
        let (status, body) = crate::api::get(&view.base, path);
        assert_eq!(status, 200, "{path}: {body}");
        body["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["attempt"].as_u64().unwrap(),
                    m["kind"].as_str().unwrap().to_string(),
                    m["raw"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let latest = [
        (2, "intermediate".to_string(), "2".to_string()),
        (2, "final".to_string(), "2".to_string()),
    ];
    let every = [
        (1, "intermediate".to_string(), "1".to_string()),
        (1, "final".to_string(), "1".to_string()),
        latest[0].clone(),
        latest[1].clone(),
    ];
    for path in [
        format!("/trials/{id}/metrics"),
        format!("/trials/{id}"),
        "/metrics".to_string(),
    ] {
        let joiner = if path.contains('?') { '&' } else { '?' };
        assert_eq!(attempts_of(&path), latest, "{path}");
        assert_eq!(
            attempts_of(&format!("{path}{joiner}attempt=all")),
            every,
            "{path}"
        );
        assert_eq!(
            attempts_of(&format!("{path}{joiner}attempt=1")),
            every[..2],
            "{path}"
        );
    }
    // An attempt the trial never had is refused on every route of one trial, as on its logs'.
    for path in [
        format!("/trials/{id}/metrics?attempt=3"),
        format!("/trials/{id}?attempt=3"),
        format!("/trials/{id}/logs/stdout?attempt=3"),
    ] {
        let (status, body) = crate::api::get(&view.base, &path);
        assert_eq!(
            (status, body["error"].as_str()),
            (
                400,
                Some(format!("trial {id} has attempts 1 to 2").as_str())
            ),
            "{path}"
        );
    }
    let (status, body) = crate::api::get(&view.base, &format!("/trials/{id}/metrics?attempt=0"));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("query parameter attempt must be all, latest or an attempt number"),
        "{body}"
    );
}

/// A seeded tuner resumed after trials that failed without a result continues the run it would
/// have made uninterrupted: it is told of every trial it handed out, not only of those with a
/// result (it drew the failed ones' parameters again, found by hand: Random's trial 4 was trial
/// 1 again, TPE's trial 5 trial 3).
#[test]
fn a_seeded_tuner_resumed_after_failures_continues_its_run_without_repeats() {
    // Odd trials fail before reporting; the others report a result.
    let trial = "import json, os, sys\n\
                 p = json.loads(os.environ['KNOB_PARAMETERS'])\n\
                 if int(os.environ['NNI_TRIAL_SEQ_ID']) % 2 == 1:\n    sys.exit(3)\n\
                 print('KNOB_FINAL', p['x'] + p['y'])\n";
    let config = |sandbox: &Sandbox, tuner: &str, trials: u32| {
        let yaml = format!(
            "trialCommand: python3 trial.py\ntrialConcurrency: 1\nmaxTrialNumber: {trials}\n\
             searchSpace:\n  x: {{_type: uniform, _value: [0, 1]}}\n  y: {{_type: uniform, _value: [0, 1]}}\n\
             tuner:\n  name: {tuner}\n  classArgs: {{optimize_mode: minimize, seed: 7}}\n\
             trainingService:\n  platform: local"
        );
        sandbox.config(&yaml, &[("trial.py", trial)])
    };
    let parameters = |export: &serde_json::Value| -> Vec<String> {
        let mut trials = export["trials"].as_array().unwrap().clone();
        trials.sort_by_key(|t| t["sequence"].as_u64());
        trials.iter().map(|t| t["parameters"].to_string()).collect()
    };
    // Exact where the first 8 suggestions are drawn from the seed alone (Random; TPE's and
    // GPTuner's start-up phases); Evolution's replay is not exact, but never repeats.
    for (tuner, exact) in [
        ("Random", true),
        ("TPE", true),
        ("GPTuner", true),
        ("Anneal", false),
        ("Evolution", false),
    ] {
        let whole = Sandbox::new();
        let (code, stdout, stderr) = whole.create(&config(&whole, tuner, 8), "whole");
        assert_eq!(code, 0, "{tuner}: {stdout}\n{stderr}");
        let export = whole.export("whole");
        let failed = export["trials"].as_array().unwrap().iter();
        let failed = failed.filter(|t| t["status"] == "FAILED").count();
        assert_eq!(failed, 4, "{tuner}: {export:#}");
        let uninterrupted = parameters(&export);

        let resumed = Sandbox::new();
        resumed.create(&config(&resumed, tuner, 4), "halves");
        let (_, stdout, stderr) =
            run(resumed
                .knob()
                .args(["resume", "halves", "--max-trial-number", "8"]));
        let export = resumed.export("halves");
        let both = parameters(&export);
        assert_eq!(both.len(), 8, "{tuner}: {stdout}\n{stderr}\n{export:#}");
        let mut distinct = both.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 8, "{tuner} repeated parameters: {both:#?}");
        if exact {
            assert_eq!(both, uninterrupted, "{tuner}");
        }
    }
}

/// What a `knob create` of `id` killed with SIGKILL before its store recorded the experiment
/// left, made by the code paths create takes: the registry's claim (INITIALIZED, naming the
/// creating process, here one killed since), and `with_store`: the marked folder and a store
/// opened but given no record; `recorded`: and the experiment's first record too.
fn killed_create(sandbox: &Sandbox, id: &str, with_store: bool, recorded: bool) -> PathBuf {
    let dir = sandbox.path().join("experiments").join(id);
    let mut creator = Command::new("sleep").arg("300").spawn().unwrap();
    let registry = Registry::open(&sandbox.path().join("home/registry.db")).unwrap();
    let entry = RegistryEntry {
        id: id.to_string(),
        name: None,
        dir: dir.clone(),
        status: ExperimentStatus::Initialized.as_str().to_string(),
        pid: Some(creator.id()),
        pid_start: None,
        port: None,
        api_host: None,
        created_ms: 1_700_000_000_000,
    };
    assert!(registry.insert(&entry).unwrap());
    if with_store {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(MARKER_FILE_NAME), "").unwrap();
        let store = Store::open(&dir).unwrap();
        if recorded {
            let created = StoreEvent::ExperimentCreated {
                experiment_id: id.to_string(),
                config: serde_json::json!({}),
                start_time_ms: entry.created_ms,
            };
            store.append(created).wait().unwrap();
        }
    }
    sigkill(&mut creator);
    dir
}

/// A `knob create` killed in its first moments (the id claimed, the folder not made yet or its
/// store still empty) was listed "crashed (resume it)" by every command, and no resume could
/// run it. It never started: the first command that meets it takes it back, whichever command
/// that is, and the id is free again (H4 F1). One whose store holds the experiment stays.
#[test]
fn a_create_killed_before_its_store_held_the_experiment_is_taken_back() {
    let sandbox = Sandbox::new();
    let yaml =
        format!("trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let commands: [&[&str]; 5] = [
        &["experiment", "list"],
        &["experiment", "show", "half"],
        &["resume", "half"],
        &["stop", "half"],
        &["create", "--id", "half", "--config"],
    ];
    for with_store in [false, true] {
        for args in commands {
            let dir = killed_create(&sandbox, "half", with_store, false);
            let mut command = sandbox.knob();
            command.args(args);
            if args[0] == "create" {
                command.arg(&config);
            }
            let (code, stdout, stderr) = run(&mut command);
            let what = format!("{args:?} with_store {with_store}: {stdout}\n{stderr}");
            match args[1] {
                "list" => assert!(code == 0 && !stdout.contains("half"), "{what}"),
                "--id" => {
                    assert_eq!(code, 0, "{what}");
                    let deleted =
                        run(sandbox
                            .knob()
                            .args(["experiment", "delete", "half", "--yes"]));
                    assert_eq!(deleted.0, 0, "{deleted:?}");
                }
                _ => assert!(
                    code == 1 && stderr.starts_with("error: no experiment half in the registry"),
                    "{what}"
                ),
            }
            assert!(!dir.exists(), "{what}");
            let (_, listed, _) = run(sandbox.knob().args(["experiment", "list"]));
            assert!(!listed.contains("half"), "{what}\n{listed}");
        }
    }
    let dir = killed_create(&sandbox, "whole", true, true);
    let (_, listed, _) = run(sandbox.knob().args(["experiment", "list"]));
    let row = listed.lines().find(|l| l.starts_with("whole"));
    assert!(
        row.is_some_and(|row| row.contains("crashed (resume it)")),
        "{listed}"
    );
    assert!(dir.join("experiment.db").exists());
}

/// `knob top` and the dashboard showed the wall time since creation next to
/// maxExperimentDuration, which counts running time only: a stopped spell counted, and a resumed
/// run looked past its budget. The API now gives `running_ms` (what the budget counts, across
/// runs) beside `elapsed_ms` (wall time since creation), and `knob top` shows the running time.
#[test]
fn top_and_the_api_show_the_running_time_that_max_experiment_duration_counts() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: echo $NNI_TRIAL_JOB_ID >> started; sleep 60\ntrialConcurrency: 1\nmaxTrialNumber: 5\nmaxExperimentDuration: 10m\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[]);
    // One line per trial start (a resume runs the stopped trial again, with its id).
    let started = sandbox.path().join("code/started");
    let trials_started = || {
        std::fs::read_to_string(&started)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let run_until_a_trial_starts_then_stop = |command: &[&str], started_before: usize| {
        let (code, _, stderr) = run(sandbox.knob().args(command));
        assert_eq!(code, 0, "{stderr}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while trials_started() <= started_before {
            assert!(Instant::now() < deadline, "no trial started");
            std::thread::sleep(Duration::from_millis(20));
        }
        let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "paced"]));
        assert_eq!(code, 0, "{stdout}\n{stderr}");
    };
    run_until_a_trial_starts_then_stop(
        &[
            "create",
            "--config",
            config.to_str().unwrap(),
            "--id",
            "paced",
            "--detach",
        ],
        0,
    );
    // Stopped for 3 s: counted by wall time, not by the budget.
    std::thread::sleep(Duration::from_secs(3));
    run_until_a_trial_starts_then_stop(&["resume", "paced", "--detach"], 1);

    let mut command = sandbox.knob();
    command.args(["view", "paced", "--port", "0"]);
    let view = crate::api::start(command, &[]);
    let (status, summary) = crate::api::get(&view.base, "/experiment");
    assert_eq!(status, 200, "{summary}");
    let elapsed = summary["elapsed_ms"].as_i64().unwrap();
    let running = summary["running_ms"].as_i64().expect("running_ms");
    assert!(
        running > 0 && elapsed - running >= 3000,
        "the stopped 3 s are counted as running: {summary}"
    );
    drop(view);
    let (code, stdout, stderr) = run(sandbox.knob().args(["top", "paced", "--iterations", "1"]));
    assert_eq!(code, 0, "{stderr}");
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first.contains(&format!(" · running time {}s · ", running / 1000)),
        "{stdout}"
    );
}
