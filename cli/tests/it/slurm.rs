//! `platform: slurm` end to end through the `knob` binary, from config files, against the real
//! single-node Slurm cluster `.ci/slurm.sh` starts (with the real knob-agent in each job).
//!
//! Gated by `KNOB_TEST_SLURM=1` like the service's own tests
//! (`training-services/tests/it/slurm.rs`, through the shared `prerequisite` helper): a
//! visible skip otherwise, a failure under `KNOB_TEST_REQUIRE_ALL=1`. The cluster has 2 CPUs, so the tests take it one at a time (in
//! this process and, by a lock file, against other test processes on the machine), each under
//! experiment ids of its own, and leave the queue empty and the node as they found it.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::create::Sandbox;
use crate::{repo_root, run};

static CLUSTER: Mutex<()> = Mutex::new(());

/// The cluster, held for one test: this process's lock and an exclusive lock on a file that
/// every knob Slurm test process on the machine takes (`training-services/tests/it/slurm.rs`
/// too).
struct Cluster {
    _file: File,
    _guard: MutexGuard<'static, ()>,
}

fn cluster() -> Option<Cluster> {
    if !crate::prerequisite::SLURM.enabled() {
        return None;
    }
    let guard = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let path = std::env::temp_dir().join("knob-slurm-tests.lock");
    let file = File::create(&path).unwrap();
    // Released when `file` closes.
    file.lock()
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", path.display()));
    Some(Cluster {
        _file: file,
        _guard: guard,
    })
}

/// An experiment id no other run of these tests uses (job names carry it).
fn unique(name: &str) -> String {
    format!("{name}{}", std::process::id())
}

/// (job id, state, reason) of each job in the queue whose name contains `needle`.
fn queue(needle: &str) -> Vec<(u64, String, String)> {
    let out = Command::new("squeue")
        .args(["--noheader", "--format=%i|%j|%T|%r"])
        .output()
        .expect("cannot run squeue");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').collect();
            match cells.as_slice() {
                [id, name, state, reason] if name.contains(needle) => Some((
                    id.trim().parse().ok()?,
                    state.to_string(),
                    reason.to_string(),
                )),
                _ => None,
            }
        })
        .collect()
}

fn job_ids(needle: &str) -> BTreeSet<u64> {
    queue(needle).into_iter().map(|(id, ..)| id).collect()
}

/// Polls `check` every 200 ms (bounded by `limit`), panicking with `what` if it never holds.
fn wait_for<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A `knob` process the test started: killed (SIGKILL) when dropped, and whatever job of the
/// experiment is still queued then is cancelled, so a failing test leaves nothing behind.
struct Running {
    child: Option<Child>,
    needle: String,
}

impl Running {
    fn spawn(mut command: Command, needle: &str) -> Running {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start knob");
        Running {
            child: Some(child),
            needle: needle.to_string(),
        }
    }

    /// SIGKILL, as a crash would: nothing of knob's shutdown runs.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its exit code, waiting at most `limit`; `None` while it runs.
    fn wait(&mut self, limit: Duration) -> Option<i32> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return Some(status.code().unwrap_or(-1));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
        let left: Vec<String> = job_ids(&self.needle)
            .iter()
            .map(|id| id.to_string())
            .collect();
        if !left.is_empty() {
            let _ = Command::new("scancel").args(&left).status();
        }
    }
}

/// Drains the node for its life, and resumes it on drop whatever happens.
struct Drained(String);

impl Drained {
    fn new() -> Drained {
        let out = Command::new("hostname").arg("-s").output().unwrap();
        let node = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let status = Command::new("scontrol")
            .args([
                "update",
                &format!("nodename={node}"),
                "state=drain",
                "reason=knob-cli-test",
            ])
            .status()
            .unwrap();
        assert!(status.success(), "cannot drain node {node}");
        Drained(node)
    }
}

impl Drop for Drained {
    fn drop(&mut self) {
        let _ = Command::new("scontrol")
            .args(["update", &format!("nodename={}", self.0), "state=resume"])
            .status();
    }
}

/// A Slurm experiment's config: `top` more top-level lines, `service` more lines of its
/// trainingService mapping.
fn slurm_config(sandbox: &Sandbox, top: &str, service: &str) -> PathBuf {
    sandbox.config(
        &format!(
            "searchSpace:
  x: {{_type: randint, _value: [0, 1000000]}}
tuner:
  name: Random
  classArgs: {{seed: 3}}
{top}
trainingService:
  platform: slurm
  pollIntervalSecs: 0.2
{service}"
        ),
        &[],
    )
}

/// `knob trial ls ID` rows, split into cells on runs of two spaces or more (the parameters and
/// the reason hold single spaces).
fn trial_rows(sandbox: &Sandbox, id: &str) -> Vec<Vec<String>> {
    let (code, stdout, stderr) = run(sandbox.knob().args(["trial", "ls", id]));
    assert_eq!(code, 0, "{stderr}");
    stdout
        .lines()
        .skip(1)
        .map(|line| {
            line.split("  ")
                .map(str::trim)
                .filter(|cell| !cell.is_empty())
                .map(String::from)
                .collect()
        })
        .collect()
}

/// Waits (bounded) until nothing of experiment `id` is left in the queue.
fn wait_for_empty_queue(id: &str) {
    wait_for(
        &format!("experiment {id}'s jobs to leave the queue"),
        Duration::from_secs(30),
        || queue(&format!("-{id}-")).is_empty().then_some(()),
    );
}

/// The `error: ` line of `knob create`'s stderr.
fn error_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|line| line.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"))
}

/// `Key=value` of `scontrol show job` output.
fn field<'a>(shown: &'a str, key: &str) -> &'a str {
    shown
        .split_whitespace()
        .find_map(|word| word.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {shown}"))
}

#[test]
fn both_reuse_modes_run_an_experiment_and_each_job_gets_the_trials_cpus_and_memory() {
    let Some(_cluster) = cluster() else {
        return;
    };
    for reuse in [true, false] {
        let id = unique(if reuse { "reuse" } else { "perjob" });
        let sandbox = Sandbox::new();
        let jobs = sandbox.path().join("jobs");
        std::fs::create_dir(&jobs).unwrap();
        // Each trial records what Slurm says of the job it runs in, and its environment; each
        // job's setup commands, theirs.
        let config = slurm_config(
            &sandbox,
            &format!(
                "trialCommand: scontrol show job $SLURM_JOB_ID > {jobs}/$NNI_TRIAL_JOB_ID && env > {jobs}/$NNI_TRIAL_JOB_ID.env && echo KNOB_FINAL 1
trialConcurrency: 2
maxTrialNumber: 3
trialCpuNumber: 1
trialMemorySize: 100mb",
                jobs = jobs.display()
            ),
            &format!(
                "  reuseMode: {reuse}\n  setupCommands:\n    - env > {}/setup-$SLURM_JOB_ID.env\n",
                jobs.display()
            ),
        );
        let _cleanup = Running {
            child: None,
            needle: format!("-{id}-"),
        };
        // Secrets exported where knob runs reach neither a trial nor a job (sbatch would copy
        // them into the job).
        let (code, stdout, stderr) = run(crate::secrets::with_secrets(
            &mut sandbox.create_command(&config, &id),
        ));
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        assert!(
            stdout.contains(&format!(
                "experiment {id} DONE: 3 trials (3 succeeded, 0 failed)"
            )),
            "{stdout}\n{stderr}"
        );
        if reuse {
            // An allocation that starts is news on the console, not a warning.
            let ready: Vec<&str> = stderr
                .lines()
                .filter(|line| line.ends_with(") is ready"))
                .collect();
            assert!(!ready.is_empty(), "{stderr}");
            assert!(
                ready
                    .iter()
                    .all(|line| line.starts_with("notice: environment slurm:env")),
                "{stderr}"
            );
        }
        let export = sandbox.export(&id);
        let trials = export["trials"].as_array().unwrap();
        let mut job_ids = BTreeSet::new();
        for trial in trials {
            let trial_id = trial["id"].as_str().unwrap();
            let environment = trial["attempt_history"][0]["environment_id"]
                .as_str()
                .unwrap();
            let shown = std::fs::read_to_string(jobs.join(trial_id)).unwrap();
            // trialCpuNumber and trialMemorySize reached the job.
            assert_eq!(field(&shown, "NumCPUs"), "1", "{shown}");
            assert_eq!(field(&shown, "MinMemoryNode"), "100M", "{shown}");
            let name = field(&shown, "JobName");
            if reuse {
                assert!(environment.starts_with("slurm:env"), "{trial}");
                assert!(name.starts_with(&format!("knob-{id}-env")), "{shown}");
            } else {
                assert_eq!(environment, "slurm:queue", "{trial}");
                assert_eq!(name, format!("knob-{id}-{trial_id}"), "{shown}");
            }
            job_ids.insert(field(&shown, "JobId").to_string());
        }
        let mut environments = 0;
        for entry in std::fs::read_dir(&jobs).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "env") {
                let environment = std::fs::read_to_string(&path).unwrap();
                crate::secrets::assert_sealed(&environment, &path.display().to_string());
                environments += 1;
            }
        }
        // Every trial's, and at least one job's setup commands'.
        assert!(environments > trials.len(), "{environments} environments");
        if reuse {
            // Allocations run many trials: at most trialConcurrency of them for 3 trials.
            assert!(job_ids.len() <= 2, "{job_ids:?}");
        } else {
            assert_eq!(job_ids.len(), 3, "one job per trial: {job_ids:?}");
        }
        // Nothing of the experiment stays in the queue once it is over.
        wait_for_empty_queue(&id);
    }
}

#[test]
fn a_failing_setup_command_ends_its_job_and_the_experiment_saying_which_command() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let id = unique("setupfails");
    let sandbox = Sandbox::new();
    // Before, the job ran on past the failed command; once a job ended before running a trial
    // three times, no more were requested and the trials waited for ever (here: until
    // maxExperimentDuration, which then ended the experiment DONE).
    let config = slurm_config(
        &sandbox,
        "trialCommand: echo KNOB_FINAL 1
trialConcurrency: 1
maxTrialNumber: 2
maxExperimentDuration: 3m",
        "  reuseMode: true
  setupCommands:
    - echo preparing
    - no-such-module-command load cuda
",
    );
    let _cleanup = Running {
        child: None,
        needle: format!("-{id}-"),
    };
    let (code, stdout, stderr) = sandbox.create(&config, &id);
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("experiment {id} ERROR")),
        "{stdout}\n{stderr}"
    );
    let error = error_line(&stderr);
    for part in [
        "no environment can run trials: slurm:env1 (slurm job ",
        "knob: trainingService.setupCommands[1] failed (exit 127): no-such-module-command load cuda",
        "3 allocations in a row ended before running a trial or could not be submitted; no more are requested",
    ] {
        assert!(error.contains(part), "{part} missing: {error}");
    }
    // Each ended allocation said so as news, not as a warning.
    assert!(
        stderr.contains("notice: environment slurm:env1 (slurm job ")
            && stderr.contains(") is retired: it takes no new trials"),
        "{stderr}"
    );
    wait_for_empty_queue(&id);

    // A trial's own job (reuseMode: false): the trial fails once its job was lost 4 times, and
    // its reason quotes the job's log.
    let id = unique("setupfailsperjob");
    let config = slurm_config(
        &sandbox,
        "trialCommand: echo KNOB_FINAL 1
trialConcurrency: 1
maxTrialNumber: 1
maxExperimentDuration: 3m",
        "  reuseMode: false
  setupCommands: [no-such-module-command load cuda]
",
    );
    let _cleanup = Running {
        child: None,
        needle: format!("-{id}-"),
    };
    let (code, stdout, stderr) = sandbox.create(&config, &id);
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    let trial = &sandbox.export(&id)["trials"][0];
    assert_eq!(trial["status"], "FAILED", "{trial:#}");
    let message = trial["message"].as_str().unwrap();
    assert!(
        message.starts_with("environment lost: Slurm job ")
            && message.contains(" (slurm:queue) ended: FAILED; its log ends: ")
            && message.contains(
                "knob: trainingService.setupCommands[0] failed (exit 127): no-such-module-command load cuda"
            ),
        "{message}"
    );
    wait_for_empty_queue(&id);
}

#[test]
fn a_trials_own_job_reaching_its_time_limit_fails_the_trial_once_naming_time() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let id = unique("owntimeout");
    let sandbox = Sandbox::new();
    // Slurm's least time limit is a minute. The trial needs longer: it was counted a lost host
    // and run again, to the same limit, three more times before it failed.
    let config = slurm_config(
        &sandbox,
        "trialCommand: sleep 300; echo KNOB_FINAL 1
trialConcurrency: 1
maxTrialNumber: 1
maxExperimentDuration: 5m",
        "  reuseMode: false
  time: 1
",
    );
    let _cleanup = Running {
        child: None,
        needle: format!("-{id}-"),
    };
    // Every trial failed: knob create says so by its exit code.
    let (code, stdout, stderr) = sandbox.create(&config, &id);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "experiment {id} DONE: 1 trial (0 succeeded, 1 failed)"
        )),
        "{stdout}\n{stderr}"
    );
    let trial = &sandbox.export(&id)["trials"][0];
    assert_eq!(trial["status"], "FAILED", "{trial:#}");
    assert_eq!(
        trial["attempt_history"].as_array().unwrap().len(),
        1,
        "{trial:#}"
    );
    let message = trial["message"].as_str().unwrap();
    assert!(
        message.starts_with("killed by signal 15: TIMEOUT: Slurm job ")
            && message.ends_with(" (slurm:queue) reached its time limit (trainingService.time \"1\") before the trial ended; raise time for trials this long"),
        "{message}"
    );
    wait_for_empty_queue(&id);
}

/// No cluster needed: the service checks its config without Slurm.
#[test]
fn config_check_refuses_a_working_directory_slurm_cannot_take_naming_it() {
    let sandbox = Sandbox::new();
    // A line break ended the #SBATCH --output line: the rest of the path ran as a command of
    // the job, and every later #SBATCH line (--time, --mem) was ignored.
    let config = slurm_config(
        &sandbox,
        "trialCommand: echo KNOB_FINAL 1
trialConcurrency: 1",
        "",
    );
    let yaml = std::fs::read_to_string(&config).unwrap().replace(
        &format!(
            "experimentWorkingDirectory: {}",
            sandbox.path().join("experiments").display()
        ),
        "experimentWorkingDirectory: \"/tmp/nl\\ntouch /tmp/INJECTED;: \"",
    );
    std::fs::write(&config, yaml).unwrap();
    let (code, stdout, stderr) = run(sandbox.knob().arg("config").arg("check").arg(&config));
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    let error = error_line(&stderr);
    assert!(
        error.contains(
            "trainingService: experimentWorkingDirectory \"/tmp/nl\\ntouch /tmp/INJECTED;: \" holds a line break, which Slurm cannot take in a job's log path (#SBATCH --output); choose a folder without one"
        ),
        "{stderr}"
    );
}

#[test]
fn a_start_sbatch_refuses_takes_back_the_folder_and_the_id_can_be_used_again() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let id = unique("refusedstart");
    let sandbox = Sandbox::new();
    let _cleanup = Running {
        child: None,
        needle: format!("-{id}-"),
    };
    let top = "trialCommand: echo KNOB_FINAL 1
trialConcurrency: 1
maxTrialNumber: 1";
    let config = slurm_config(&sandbox, top, "  partition: nosuchpartition\n");
    let (code, stdout, stderr) = sandbox.create(&config, &id);
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    // The job files the service wrote were left, and said to be the user's.
    let error = error_line(&stderr);
    assert!(
        error.starts_with(&format!(
            "error: experiment {id} did not start, and was not kept: "
        )) && error.contains("invalid partition"),
        "{error}"
    );
    let dir = sandbox.path().join("experiments").join(&id);
    assert!(!dir.exists(), "{} left behind", dir.display());

    // Fixed, the same id starts; `experiment delete` then takes back its job files too.
    let config = slurm_config(&sandbox, top, "  partition: debug\n");
    let (code, stdout, stderr) = sandbox.create(&config, &id);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(dir.join("services/slurm").is_dir());
    wait_for_empty_queue(&id);
    let (code, stdout, stderr) = run(sandbox.knob().args(["experiment", "delete", &id, "--yes"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.contains("did not make"), "{stdout}");
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn in_reuse_mode_trials_that_ask_no_cpus_spread_over_the_allocations() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let id = unique("spread");
    let sandbox = Sandbox::new();
    let started = sandbox.path().join("started");
    std::fs::create_dir(&started).unwrap();
    // No trialCpuNumber, as in NNI's configs: each allocation is sized for one trial of one
    // core. Each trial waits (bounded) until both have started, so that two in one allocation
    // run side by side, as they did: every trial went into the first allocation ready.
    let config = slurm_config(
        &sandbox,
        &format!(
            "trialCommand: touch {started}/$NNI_TRIAL_JOB_ID; for i in $(seq 600); do [ $(ls {started} | wc -l) -ge 2 ] && break; sleep 0.1; done; echo KNOB_FINAL 1
trialConcurrency: 2
maxTrialNumber: 2",
            started = started.display()
        ),
        "  reuseMode: true\n",
    );
    let _cleanup = Running {
        child: None,
        needle: format!("-{id}-"),
    };
    let (code, stdout, stderr) = sandbox.create(&config, &id);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export(&id);
    let environments: BTreeSet<&str> = export["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|trial| {
            trial["attempt_history"][0]["environment_id"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(environments.len(), 2, "{export:#}");
    wait_for_empty_queue(&id);
}

#[test]
fn an_sbatch_refusal_names_the_config_field_that_set_the_option_once() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new();
    // The node has no GPU: sbatch refuses --gpus, which only trialGpuNumber sets; a valid
    // partition was named instead, and the service twice. In both modes: with `reuseMode:
    // false`, `knob create` went on, and every trial failed so in turn.
    let cases = [
        ("trialGpuNumber: 1", "", "for trialGpuNumber 1 (--gpus=1)"),
        (
            "trialMemorySize: 500gb",
            "",
            "for memory 500 GiB (--mem, from trialMemorySize)",
        ),
        (
            "",
            "  constraint: nosuchfeature\n",
            "(partition \"debug\", constraint \"nosuchfeature\")",
        ),
    ];
    for ((top, service, field), reuse) in cases
        .into_iter()
        .flat_map(|case| [(case, true), (case, false)])
    {
        let id = unique("refusedfield");
        let _cleanup = Running {
            child: None,
            needle: format!("-{id}-"),
        };
        let config = slurm_config(
            &sandbox,
            &format!(
                "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 3\n{top}"
            ),
            &format!("  partition: debug\n  reuseMode: {reuse}\n{service}"),
        );
        let (code, stdout, stderr) = sandbox.create(&config, &id);
        assert_ne!(code, 0, "{stdout}\n{stderr}");
        let error = error_line(&stderr);
        assert!(
            error.starts_with(&format!(
                "error: experiment {id} did not start, and was not kept: "
            )) && error.contains(&format!("sbatch refused the job {field}: ")),
            "{error}"
        );
        assert_eq!(
            error.matches("training service slurm").count(),
            1,
            "{error}"
        );
        if service.is_empty() {
            assert!(!error.contains("partition"), "{error}");
        }
    }
}

#[test]
fn a_job_slurm_can_never_run_fails_create_naming_the_reason_and_the_field() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new();
    // More CPUs than the node has: sbatch takes the job (no EnforcePartLimits) and Slurm holds
    // it pending (PartitionConfig) for ever; `knob create` waited for ever.
    // In both modes: a trial's own job (`reuseMode: false`) is tried at the start too.
    for service in ["  reuseMode: true\n", "  reuseMode: false\n"] {
        let id = unique("neverruns");
        let _cleanup = Running {
            child: None,
            needle: format!("-{id}-"),
        };
        let config = slurm_config(
            &sandbox,
            "trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 2\ntrialCpuNumber: 3",
            service,
        );
        let (code, stdout, stderr) = sandbox.create(&config, &id);
        assert_ne!(code, 0, "{stdout}\n{stderr}");
        let error = error_line(&stderr);
        assert!(
            error.contains("can never start: Slurm holds it pending (PartitionConfig)")
                && error.contains("change trialCpuNumber (3)"),
            "{error}"
        );
        assert!(
            error.starts_with(&format!(
                "error: experiment {id} did not start, and was not kept: "
            )),
            "{error}"
        );
        wait_for_empty_queue(&id);
    }
}

#[test]
fn knob_update_concurrency_is_followed_by_the_jobs_in_the_queue() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new();
    let started = sandbox.path().join("started");
    std::fs::create_dir(&started).unwrap();
    let release = sandbox.path().join("release");
    // reuseMode true: one allocation per trial, as many as trialConcurrency (no maxEnvironments).
    for service in ["  reuseMode: false\n", "  reuseMode: true\n"] {
        let _ = std::fs::remove_file(&release);
        for entry in std::fs::read_dir(&started).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        let id = unique(if service.contains("true") {
            "updconcreuse"
        } else {
            "updconc"
        });
        let config = slurm_config(
            &sandbox,
            &format!(
                "trialCommand: touch {started}/$NNI_TRIAL_JOB_ID; while [ ! -e {release} ]; do sleep 0.1; done; echo KNOB_FINAL 1
trialConcurrency: 1
trialCpuNumber: 1
maxTrialNumber: 3",
                started = started.display(),
                release = release.display()
            ),
            service,
        );
        let mut create = Running::spawn(sandbox.create_command(&config, &id), &format!("-{id}-"));
        let count = || std::fs::read_dir(&started).unwrap().count();
        wait_for("the first trial to run", Duration::from_secs(60), || {
            (count() == 1).then_some(())
        });
        let (code, stdout, stderr) = run(sandbox.knob().args(["update", "concurrency", &id, "2"]));
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        // A second trial runs beside the first: its start was refused ("1 jobs are in the
        // queue already (trialConcurrency 1)") and every later trial FAILED so.
        wait_for(
            "a second trial to run beside it",
            Duration::from_secs(60),
            || (count() == 2).then_some(()),
        );
        std::fs::write(&release, "").unwrap();
        assert_eq!(create.wait(Duration::from_secs(120)), Some(0));
        let rows = trial_rows(&sandbox, &id);
        assert!(
            rows.len() == 3 && rows.iter().all(|r| r[2] == "SUCCEEDED"),
            "{rows:?}"
        );
        wait_for_empty_queue(&id);
    }
}

/// An allocation retired as its time runs out keeps its running trial to the end even when no
/// allocation can replace it: the experiment ends in ERROR only after that trial's result is in.
#[test]
fn a_trial_running_in_a_retired_allocation_finishes_before_the_experiment_ends_for_want_of_one() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let id = unique("retiredruns");
    let sandbox = Sandbox::new();
    // Only the first allocation's setup works (mkdir succeeds once): the ones that replace it
    // fail. It holds one trial (one CPU); the other waits. Slurm's shortest limit is a minute;
    // maxTrialDuration 45 s retires the allocation after about 15 s, while its trial runs 30 s.
    let first = sandbox.path().join("first-allocation");
    let config = slurm_config(
        &sandbox,
        "trialCommand: sleep 30 && echo KNOB_FINAL 1
trialConcurrency: 2
maxTrialNumber: 2
trialCpuNumber: 1
maxTrialDuration: 45s",
        &format!(
            "  reuseMode: true
  maxEnvironments: 1
  time: \"1\"
  setupCommands: [mkdir {}]
",
            first.display()
        ),
    );
    let _cleanup = Running {
        child: None,
        needle: format!("-{id}-"),
    };
    let (code, stdout, stderr) = sandbox.create(&config, &id);
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export(&id);
    assert_eq!(export["experiment"]["status"], "ERROR", "{export:#}");
    let trials = export["trials"].as_array().unwrap();
    let done: Vec<&serde_json::Value> = trials
        .iter()
        .filter(|t| t["status"] == "SUCCEEDED")
        .collect();
    assert_eq!(done.len(), 1, "{export:#}\n{stderr}");
    assert_eq!(done[0]["final"], 1.0, "{export:#}");
    let error = error_line(&stderr);
    assert!(
        error.contains("no environment can run trials")
            && error.contains("allocations in a row ended before running a trial"),
        "{error}"
    );
    wait_for_empty_queue(&id);
}

#[test]
fn in_reuse_mode_a_request_raised_beyond_the_allocations_memory_is_refused_saying_so() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let id = unique("reuseoom");
    let sandbox = Sandbox::new();
    // 150 MiB touched against trialMemorySize 64 MiB: knob kills it in its allocation, and the
    // retry would ask for twice what it was seen using, more than any allocation (--mem=64M) holds.
    let config = slurm_config(
        &sandbox,
        "trialCommand: python3 -c \"import time; b = b'x' * (150 << 20); time.sleep(1.5); print('KNOB_FINAL 1')\"
trialConcurrency: 1
maxTrialNumber: 1
trialCpuNumber: 1
trialMemorySize: 64mb
maxOomRetries: 2",
        "  reuseMode: true\n",
    );
    let _cleanup = Running {
        child: None,
        needle: format!("-{id}-"),
    };
    let (code, stdout, stderr) = sandbox.create(&config, &id);
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export(&id);
    let trial = &export["trials"][0];
    assert_eq!(trial["status"], "FAILED", "{trial:#}");
    let attempts = trial["attempt_history"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "never placed again: {trial:#}");
    let raised = trial["memory_request_mib"].as_u64().unwrap();
    assert!(raised > 64, "{trial:#}");
    let message = trial["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "after it ran out of memory its request was raised to {raised} MiB of memory (maxOomRetries), which no environment can give: "
        )) && message.contains("slurm:env")
            && message.contains("64 MiB of memory")
            && message.ends_with(&format!(
                "; to run it, set trialMemorySize to {raised} MiB or more (an environment sized by trialMemorySize then holds it), or lower maxOomRetries to fail sooner"
            ))
            && !message.contains("lower trialMemorySize")
            && !message.contains('\n'),
        "{message}"
    );
    wait_for_empty_queue(&id);
}

#[test]
fn waiting_trials_show_slurms_reason_and_resume_and_stop_leave_no_job() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let id = unique("drain");
    let needle = format!("-{id}-");
    let sandbox = Sandbox::new();
    let started = sandbox.path().join("started");
    // Each run of a trial appends a line; it then runs until it is stopped.
    let config = slurm_config(
        &sandbox,
        &format!(
            "trialCommand: echo run >> {}/$NNI_TRIAL_JOB_ID; exec sleep 600
trialConcurrency: 1
maxTrialNumber: 2
trialCpuNumber: 1",
            started.display()
        ),
        "",
    );
    std::fs::create_dir(&started).unwrap();
    let runs = || -> usize {
        std::fs::read_dir(&started)
            .unwrap()
            .flatten()
            .map(|entry| {
                std::fs::read_to_string(entry.path())
                    .unwrap_or_default()
                    .lines()
                    .count()
            })
            .sum()
    };

    // With the node drained the allocation stays pending, and its trial waits with Slurm's
    // reason, in `knob trial ls` and in the API the dashboard reads.
    let drained = Drained::new();
    let experiment = crate::api::start(
        {
            let mut command = sandbox.knob();
            command
                .arg("create")
                .arg("--config")
                .arg(&config)
                .args(["--id", &id, "--port", "0"]);
            command
        },
        &[],
    );
    let _cleanup = Running {
        child: None,
        needle: needle.clone(),
    };
    let slurm_reason = |reason: &str| {
        // Slurm spells a reason with underscores in `squeue` and with spaces elsewhere
        // ("Nodes required for job are DOWN, DRAINED or reserved ...").
        let reason = reason.replace('_', " ");
        reason.contains("Slurm job")
            && ["ReqNodeNotAvail", "Resources", "Nodes required", "Priority"]
                .iter()
                .any(|why| reason.contains(why))
    };
    let row = wait_for(
        "a trial WAITING with Slurm's reason in knob trial ls",
        Duration::from_secs(60),
        || {
            trial_rows(&sandbox, &id)
                .into_iter()
                .find(|cells| cells.get(2).map(String::as_str) == Some("WAITING"))
                .filter(|cells| cells.last().is_some_and(|reason| slurm_reason(reason)))
        },
    );
    let pending = queue(&needle);
    assert!(
        pending.iter().all(|(_, state, _)| state == "PENDING") && !pending.is_empty(),
        "{pending:?}"
    );
    let (status, body) = crate::api::get(&experiment.base, "/trials?status=WAITING");
    assert_eq!(status, 200, "{body}");
    let waiting = body["trials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["trial_id"] == row[0].as_str())
        .unwrap_or_else(|| panic!("{body}"));
    assert!(
        waiting["waiting_reason"].as_str().is_some_and(slurm_reason),
        "{waiting}"
    );
    assert_eq!(runs(), 0);

    // Resumed, the node runs the allocation, and the trial starts in it.
    drop(drained);
    wait_for("the trial to run", Duration::from_secs(60), || {
        (runs() == 1).then_some(())
    });
    let earlier = job_ids(&needle);
    assert_eq!(earlier.len(), 1, "{:?}", queue(&needle));

    // knob killed (-9): its allocation is still in the queue. `knob resume` cancels it and runs
    // the trial again in a new one; no job of the earlier run is left.
    drop(experiment);
    assert_eq!(job_ids(&needle), earlier);
    let mut resumed = {
        let mut command = sandbox.knob();
        command.args(["resume", &id]);
        Running::spawn(command, &needle)
    };
    let resumed_jobs = wait_for(
        "the resumed run's trial to run in a new allocation",
        Duration::from_secs(90),
        || {
            let now = job_ids(&needle);
            (runs() == 2 && now.is_disjoint(&earlier) && !now.is_empty()).then_some(now)
        },
    );

    // Its only allocation cancelled from outside: the trial is run again in the allocation
    // that replaces it, and the experiment goes on (it used to end in ERROR, with no
    // environment left for a moment).
    let ids: Vec<String> = resumed_jobs.iter().map(u64::to_string).collect();
    assert!(Command::new("scancel")
        .args(&ids)
        .status()
        .unwrap()
        .success());
    wait_for(
        "the trial to run again in a replacement allocation",
        Duration::from_secs(90),
        || {
            let now = job_ids(&needle);
            (runs() == 3 && now.is_disjoint(&resumed_jobs) && !now.is_empty()).then_some(())
        },
    );
    assert_eq!(resumed.wait(Duration::ZERO), None, "the experiment ended");

    // `knob stop`: the run ends, its trial is cancelled, and the queue holds nothing of it.
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", &id]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(resumed.wait(Duration::from_secs(60)), Some(0));
    assert_eq!(queue(&needle), Vec::new());
    let export = sandbox.export(&id);
    assert_eq!(export["experiment"]["status"], "STOPPED", "{export}");
}

/// The README's complete `platform: slurm` config runs here, with only what is particular to a
/// site changed for this one-node cluster without GPUs, features or environment modules.
#[test]
fn the_readmes_slurm_config_runs() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let section = &readme[readme
        .find("## Clusters (Slurm)")
        .expect("README has a Clusters (Slurm) section")..];
    let start = section.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let mut yaml = section[start..][..section[start..].find("```").unwrap()].to_string();
    let id = unique("readme");
    let sandbox = Sandbox::new();
    let space = (
        "search_space.json",
        r#"{"lr": {"_type": "loguniform", "_value": [0.0001, 0.1]}}"#,
    );
    // As written, every field is valid (with a knob-agent where it names one).
    let agent = crate::bin_dir().join("knob-agent").display().to_string();
    assert!(yaml.contains("/shared/me/bin/knob-agent"), "{yaml}");
    yaml = yaml.replace("/shared/me/bin/knob-agent", &agent);
    let as_written = sandbox.path().join("as-written");
    std::fs::create_dir(&as_written).unwrap();
    std::fs::write(as_written.join(space.0), space.1).unwrap();
    std::fs::write(as_written.join("config.yml"), &yaml).unwrap();
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .args(["config", "check"])
        .arg(as_written.join("config.yml")));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    // What differs from a GPU cluster's login node: no GPU, 2 CPUs, no `a100` feature, no
    // node07, no environment modules; the trial prints its job id as its result. The
    // experiment folder is the sandbox's (Sandbox::config appends it).
    let replacements: [(&str, String); 10] = [
        ("python3 mnist.py", "echo KNOB_FINAL $SLURM_JOB_ID".into()),
        ("maxTrialNumber: 100", "maxTrialNumber: 3".into()),
        ("trialGpuNumber: 1 ", "trialGpuNumber: 0 ".into()),
        ("trialCpuNumber: 4 ", "trialCpuNumber: 1 ".into()),
        ("trialMemorySize: 16gb", "trialMemorySize: 100mb".into()),
        (
            "experimentWorkingDirectory: /shared/me/knob-experiments",
            String::new(),
        ),
        ("partition: gpu", "partition: debug".into()),
        ("  constraint: a100\n", String::new()),
        ("  exclude: node[07-08]\n", String::new()),
        (
            "    - module load cuda/12.2\n    - source /shared/me/venv/bin/activate\n",
            "    - 'true'\n".into(),
        ),
    ];
    for (from, to) in &replacements {
        assert!(yaml.contains(from), "the README's config has no {from:?}");
        yaml = yaml.replace(from, to);
    }
    let config = sandbox.config(&yaml, &[space]);
    let _cleanup = Running {
        child: None,
        needle: format!("-{id}-"),
    };
    let (code, stdout, stderr) = sandbox.create(&config, &id);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "experiment {id} DONE: 3 trials (3 succeeded, 0 failed)"
        )),
        "{stdout}\n{stderr}"
    );
    let export = sandbox.export(&id);
    for trial in export["trials"].as_array().unwrap() {
        assert!(
            trial["final"].as_f64().is_some_and(|job| job > 0.0),
            "{trial}"
        );
    }
}
