//! The `slurm` service against a real single-node Slurm cluster (`.ci/slurm.sh`), with the
//! real knob-agent in each job. Gated by `KNOB_TEST_SLURM=1`; a visible skip otherwise, a
//! failure under `KNOB_TEST_REQUIRE_ALL=1`.
//!
//! The tests share the one cluster (2 CPUs), so they run one at a time ([`cluster`]), each
//! under its own experiment id, and leave the queue empty and the node undrained.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use knob_plugin_api::service::{
    Environment, MetricKind, ServiceContext, ServiceEvent, TrialRequest, TrialSettings,
    NOT_STARTED, SHUTDOWN_PATIENCE,
};
use knob_plugin_api::TrainingService;
use knob_training_services::slurm::{check_config, SlurmService, QUEUE_ENVIRONMENT};
use serde_json::{json, Value};

use crate::support::{ending, metrics, of_trial, request, started_within, warnings, Events};

static CLUSTER: Mutex<()> = Mutex::new(());

/// The cluster, held for one test: this process's lock and an exclusive lock on a file that
/// every knob Slurm test process on the machine takes (`cli/tests/it/slurm.rs` too), so test
/// runs side by side do not fill the 2 CPUs or drain the node under each other.
struct Cluster {
    _file: std::fs::File,
    _guard: MutexGuard<'static, ()>,
}

/// The cluster for one test at a time, or `None` (after a visible skip) when there is none.
fn cluster() -> Option<Cluster> {
    if !crate::prerequisite::SLURM.enabled() {
        return None;
    }
    let guard = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let path = std::env::temp_dir().join("knob-slurm-tests.lock");
    let file = std::fs::File::create(&path).unwrap();
    file.lock()
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", path.display()));
    Some(Cluster {
        _file: file,
        _guard: guard,
    })
}

fn agent_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_knob-agent"))
}

fn node() -> String {
    let out = Command::new("hostname").arg("-s").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The Slurm job ids of the queue (any state but ended) whose name contains `needle`.
fn queued_jobs(needle: &str) -> Vec<u64> {
    let out = Command::new("squeue")
        .args(["--noheader", "--format=%i|%j"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_once('|'))
        .filter(|(_, name)| name.contains(needle))
        .filter_map(|(id, _)| id.trim().parse().ok())
        .collect()
}

fn scontrol_job(id: u64) -> String {
    let out = Command::new("scontrol")
        .args(["show", "job", &id.to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `check` (bounded by `limit`), panicking with `what` if it never holds.
fn wait_for<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A test's world: its experiment id (unique, so job names never collide), directory and events.
struct World {
    experiment_id: String,
    dir: tempfile::TempDir,
    /// The experiment folder the service is given: `dir` unless [`World::in_folder`].
    experiment_dir: PathBuf,
    events: Events,
}

impl World {
    fn new(test: &str) -> World {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("code")).unwrap();
        World {
            experiment_id: format!("{test}{}", std::process::id()),
            experiment_dir: dir.path().to_path_buf(),
            dir,
            events: Events::default(),
        }
    }

    /// A world whose experiment folder is `name` inside its directory.
    fn in_folder(test: &str, name: &str) -> World {
        let mut world = World::new(test);
        world.experiment_dir = world.dir.path().join(name);
        std::fs::create_dir(&world.experiment_dir).unwrap();
        world
    }

    /// The service's config and its experiment's context: `extra` holds fields of either (the
    /// trial settings, as an experiment config has them at top level, go to the context).
    fn args(&self, extra: Value) -> (Value, ServiceContext) {
        let mut config = json!({
            "agentBinary": agent_binary(),
            "pollIntervalSecs": 0.2,
            "orphanTimeoutSecs": 60,
        });
        let mut trial = TrialSettings {
            trial_concurrency: 1,
            trial_cpu_number: Some(1),
            ..TrialSettings::default()
        };
        let mut late_start_failures = false;
        for (key, value) in extra.as_object().unwrap() {
            match key.as_str() {
                "lateStartFailures" => late_start_failures = value.as_bool().unwrap(),
                "trialConcurrency" => trial.trial_concurrency = value.as_u64().unwrap() as u32,
                "trialCpuNumber" => trial.trial_cpu_number = value.as_u64().map(|n| n as u32),
                "trialMemorySizeMib" => trial.trial_memory_size_mib = value.as_u64(),
                "maxTrialDurationSecs" => trial.max_trial_duration_secs = value.as_u64(),
                _ => {
                    config
                        .as_object_mut()
                        .unwrap()
                        .insert(key.clone(), value.clone());
                }
            }
        }
        let context = ServiceContext {
            experiment_id: self.experiment_id.clone(),
            experiment_dir: Some(self.experiment_dir.clone()),
            config_dir: self.dir.path().to_path_buf(),
            trial,
            late_start_failures,
            ..ServiceContext::default()
        };
        (config, context)
    }

    fn service_with(&self, extra: Value, events: &Events) -> Result<SlurmService, String> {
        let (config, context) = self.args(extra);
        let checked =
            check_config(&config, &context).map_err(|problems| format!("{problems:?}"))?;
        SlurmService::with_emitter(&Value::Object(checked.config), &context, events.emitter())
            .map_err(|e| e.to_string())
    }

    fn service(&self, extra: Value) -> SlurmService {
        self.service_with(extra, &self.events).unwrap()
    }

    fn request(&self, environment_id: &str, trial_id: &str, command: &str) -> TrialRequest {
        let mut request = request(
            &self.dir.path().join("code"),
            &self.dir.path().join("trials").join(trial_id),
            trial_id,
            command,
        );
        request.experiment_id = self.experiment_id.clone();
        request.environment_id = environment_id.to_string();
        request
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// The ready environments the service reports now.
fn ready(service: &SlurmService) -> Vec<Environment> {
    service
        .environments_now()
        .into_iter()
        .filter(|e| e.ready)
        .collect()
}

fn wait_ready(service: &SlurmService, count: usize) -> Vec<String> {
    wait_for(
        &format!("{count} allocation(s) ready"),
        Duration::from_secs(60),
        || {
            let ready = ready(service);
            (ready.len() >= count).then(|| ready.into_iter().map(|e| e.id).collect())
        },
    )
}

/// Starts trial `trial_id` in allocation `slurm:env1`, sleeping for 5 minutes, and returns once
/// it runs (it wrote a marker file).
fn start_long_trial(world: &World, service: &mut SlurmService, trial_id: &str) {
    let marker = world.file(&format!("{trial_id}-started"));
    service
        .start(world.request(
            "slurm:env1",
            trial_id,
            &format!("touch {}; sleep 300", marker.display()),
        ))
        .unwrap();
    wait_for(
        &format!("trial {trial_id} to start"),
        Duration::from_secs(30),
        || marker.exists().then_some(()),
    );
}

fn lost_reason(events: &[ServiceEvent]) -> Option<String> {
    match events.last() {
        Some(ServiceEvent::TrialEnded {
            environment_lost, ..
        }) => environment_lost.clone(),
        _ => None,
    }
}

#[test]
fn reuse_mode_runs_trials_in_one_allocation_and_stop_leaves_no_job() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("reuse");
    let mut service = world.service(json!({}));
    let environments = wait_ready(&service, 1);
    assert_eq!(environments, vec!["slurm:env1".to_string()]);
    let job_ids = service.job_ids();
    assert_eq!(job_ids.len(), 1);

    for trial in ["t1", "t2"] {
        let command = "echo \"KNOB_INTERMEDIATE 1\"; echo \"KNOB_FINAL $(echo $KNOB_PARAMETERS | wc -c)\"; echo \"job $SLURM_JOB_ID\" >&2; exit 3";
        service
            .start(world.request("slurm:env1", trial, command))
            .unwrap();
        let events = world.events.wait_ended(trial);
        assert!(
            matches!(events[0], ServiceEvent::TrialStarted { .. }),
            "{events:#?}"
        );
        let finals: Vec<_> = metrics(&events)
            .into_iter()
            .filter(|(kind, ..)| *kind == MetricKind::Final)
            .collect();
        assert_eq!(finals.len(), 1, "{events:#?}");
        let (exit_code, _, killed, stderr) = ending(&events);
        assert_eq!((exit_code, killed), (Some(3), None));
        // The trial ran inside the allocation.
        assert!(stderr.contains(&format!("job {}", job_ids[0])), "{stderr}");
    }

    // A trial still running when the experiment stops is killed, and nothing stays queued.
    start_long_trial(&world, &mut service, "t3");
    service.stop();
    let events = of_trial(&world.events.all(), "t3");
    let (_, _, killed, _) = ending(&events);
    assert!(killed.is_some(), "{events:#?}");
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

#[test]
fn fifty_trials_through_two_allocations() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("fifty");
    let mut service = world.service(json!({"maxEnvironments": 2}));
    let environments = wait_ready(&service, 2);
    let jobs = service.job_ids();
    assert_eq!(jobs.len(), 2);
    // Two at a time, one per allocation, as gpu-sched would place them (one CPU each).
    for pair in 0..25 {
        let mut started = Vec::new();
        for (slot, environment) in environments.iter().enumerate() {
            let trial = format!("n{}", pair * 2 + slot);
            service
                .start(world.request(
                    environment,
                    &trial,
                    &format!("echo KNOB_FINAL {}", pair * 2 + slot),
                ))
                .unwrap();
            started.push(trial);
        }
        for trial in started {
            let events = world.events.wait_ended(&trial);
            assert_eq!(ending(&events).0, Some(0), "{events:#?}");
        }
    }
    let all = world.events.all();
    let finals = metrics(&all)
        .into_iter()
        .filter(|(kind, ..)| *kind == MetricKind::Final)
        .count();
    assert_eq!(finals, 50);
    // Still the same two allocations.
    assert_eq!(service.job_ids(), jobs);
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

#[test]
fn per_job_mode_gives_each_trial_its_job_with_its_cpus_and_memory_request() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("perjob");
    let mut service = world.service(json!({
        "reuseMode": false,
        "trialConcurrency": 2,
        "trialCpuNumber": 1,
        "trialMemorySizeMib": 100,
    }));
    let environments = service.environments_now();
    assert_eq!(environments.len(), 1);
    assert_eq!(environments[0].id, QUEUE_ENVIRONMENT);
    let release = world.file("release");
    for trial in ["a", "b"] {
        let started = world.file(&format!("{trial}-started"));
        let mut request = world.request(
            QUEUE_ENVIRONMENT,
            trial,
            &format!(
                "echo $SLURM_JOB_ID > {}; while [ ! -e {} ]; do sleep 0.1; done; echo KNOB_FINAL 1",
                started.display(),
                release.display()
            ),
        );
        if trial == "b" {
            // An attempt after an out-of-memory end, with the request the core raised: its
            // job must ask Slurm for that, not trialMemorySize, or it hits the same limit.
            request.resources.memory_mib = Some(250);
        }
        service.start(request).unwrap();
    }
    // A third is refused while two jobs are queued (trialConcurrency).
    let refused = service
        .start(world.request(QUEUE_ENVIRONMENT, "c", "true"))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("trialConcurrency 2"), "{refused}");

    let mut job_ids = BTreeSet::new();
    for trial in ["a", "b"] {
        let started = world.file(&format!("{trial}-started"));
        let id: u64 = wait_for(
            &format!("trial {trial} running in its job"),
            Duration::from_secs(60),
            || {
                std::fs::read_to_string(&started)
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
            },
        );
        let shown = scontrol_job(id);
        assert!(shown.contains("NumCPUs=1"), "{shown}");
        let memory = if trial == "b" { "250M" } else { "100M" };
        assert!(
            shown.contains(&format!("MinMemoryNode={memory}")),
            "{shown}"
        );
        assert!(
            shown.contains(&format!("JobName=knob-{}-{trial}", world.experiment_id)),
            "{shown}"
        );
        job_ids.insert(id);
    }
    assert_eq!(job_ids.len(), 2, "one job per trial");
    std::fs::write(&release, "").unwrap();
    for trial in ["a", "b"] {
        let events = world.events.wait_ended(trial);
        assert_eq!(ending(&events).0, Some(0), "{events:#?}");
    }
    // Each job ends with its trial.
    wait_for(
        "the trials' jobs to leave the queue",
        Duration::from_secs(30),
        || queued_jobs(&world.experiment_id).is_empty().then_some(()),
    );
    service.stop();
}

#[test]
fn per_job_mode_follows_a_trial_concurrency_raised_while_it_runs() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("perjobconc");
    let mut service = world.service(json!({"reuseMode": false, "trialConcurrency": 1}));
    let release = world.file("release");
    let trial = |trial: &str| {
        let started = world.file(&format!("{trial}-started"));
        let command = format!(
            "touch {}; while [ ! -e {} ]; do sleep 0.1; done; echo KNOB_FINAL 1",
            started.display(),
            release.display()
        );
        (world.request(QUEUE_ENVIRONMENT, trial, &command), started)
    };
    let (first, first_started) = trial("c1");
    service.start(first).unwrap();
    wait_for("c1 to start", Duration::from_secs(60), || {
        first_started.exists().then_some(())
    });
    // `knob update concurrency ID 2`: the second trial gets its own job beside the first (it
    // was refused: "1 jobs are in the queue already (trialConcurrency 1)"), and the queue's
    // report has room for both.
    service.set_trial_concurrency(2);
    let queue = service.environments_now();
    let inventory: knob_gpu_sched::Environment =
        serde_json::from_value(queue[0].inventory.clone()).unwrap();
    assert_eq!(inventory.host_resources.cpu_count, 2, "{queue:?}");
    let (second, second_started) = trial("c2");
    service.start(second).unwrap();
    wait_for("c2 to start beside c1", Duration::from_secs(60), || {
        second_started.exists().then_some(())
    });
    std::fs::write(&release, "").unwrap();
    for trial in ["c1", "c2"] {
        let events = world.events.wait_ended(trial);
        assert_eq!(ending(&events).0, Some(0), "{events:#?}");
    }
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

#[test]
fn reuse_mode_holds_as_many_allocations_as_a_trial_concurrency_updated_while_it_runs() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("reuseconc");
    let mut service = world.service(json!({"trialConcurrency": 1}));
    wait_ready(&service, 1);
    // Raised (`knob update concurrency ID 2`, no maxEnvironments): a second allocation is
    // requested; it was not, and trials waited for the one.
    service.set_trial_concurrency(2);
    wait_ready(&service, 2);
    assert_eq!(queued_jobs(&world.experiment_id).len(), 2);
    // Lowered again: the idle allocation beyond it is cancelled; it was held for nothing.
    service.set_trial_concurrency(1);
    wait_for(
        "one allocation to be released",
        Duration::from_secs(30),
        || (queued_jobs(&world.experiment_id).len() == 1).then_some(()),
    );
    assert_eq!(ready(&service).len(), 1);
    // The one left takes trials; none is asked for in place of the one released.
    let environment = ready(&service)[0].id.clone();
    service
        .start(world.request(&environment, "r1", "echo KNOB_FINAL 1"))
        .unwrap();
    let events = world.events.wait_ended("r1");
    assert_eq!(ending(&events).0, Some(0), "{events:#?}");
    assert_eq!(queued_jobs(&world.experiment_id).len(), 1);
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

#[test]
fn a_job_cancelled_outside_knob_loses_its_trial_and_is_replaced() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("scancel");
    let mut service = world.service(json!({}));
    wait_ready(&service, 1);
    let job = service.job_ids()[0];
    start_long_trial(&world, &mut service, "x1");
    let status = Command::new("scancel")
        .arg(job.to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let events = world.events.wait_ended("x1");
    let lost = lost_reason(&events).unwrap_or_else(|| panic!("{events:#?}"));
    assert!(
        lost.contains(&format!(
            "Slurm job {job} (slurm:env1) was cancelled outside knob (scancel)"
        )),
        "{lost}"
    );
    // The core runs the trial again elsewhere: a new allocation takes it.
    let environments = wait_ready(&service, 1);
    assert_eq!(environments, vec!["slurm:env2".to_string()]);
    service
        .start(world.request("slurm:env2", "x1", "echo KNOB_FINAL 2"))
        .unwrap();
    wait_for(
        "the re-queued trial to end",
        Duration::from_secs(30),
        || {
            let all = world.events.all();
            (of_trial(&all, "x1")
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        ServiceEvent::TrialEnded {
                            exit_code: Some(0),
                            ..
                        }
                    )
                })
                .count()
                == 1)
                .then_some(())
        },
    );
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

#[test]
fn a_bad_partition_is_one_line_naming_it_and_quoting_sbatch() {
    let Some(_cluster) = cluster() else {
        return;
    };
    // In both modes: a trial's own job (`reuseMode: false`) was first submitted as its trial
    // started, and every trial failed so in turn.
    for reuse in [true, false] {
        let world = World::new("badpart");
        let error = world
            .service_with(
                json!({"partition": "nosuchpartition", "reuseMode": reuse}),
                &world.events,
            )
            .err()
            .expect("a bad partition must fail the start");
        assert!(!error.contains('\n'), "{error}");
        assert!(error.contains("partition \"nosuchpartition\""), "{error}");
        assert!(error.contains("sbatch: error:"), "{error}");
        assert!(error.contains("invalid partition"), "{error}");
        assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
    }
}

#[test]
fn a_job_slurm_can_never_run_fails_the_start_naming_slurms_reason_and_the_field() {
    let Some(_cluster) = cluster() else {
        return;
    };
    // The node has 2 CPUs; the test cluster does not set EnforcePartLimits, so sbatch takes
    // the job and Slurm holds it pending (PartitionConfig) for ever: knob waited for ever.
    for reuse in [true, false] {
        let world = World::new("never");
        let error = world
            .service_with(
                json!({"trialCpuNumber": 3, "reuseMode": reuse}),
                &world.events,
            )
            .err()
            .expect("a job no node can run must fail the start");
        assert!(!error.contains('\n'), "{error}");
        assert!(error.contains("can never start"), "{error}");
        assert!(error.contains("(PartitionConfig)"), "{error}");
        assert!(error.contains("trialCpuNumber (3)"), "{error}");
        assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
    }
}

/// Makes job `id`, held (`sbatchArgs: [--hold]` keeps it from starting), one Slurm can never
/// run: its CPUs raised past the node's, then released.
fn make_never_runnable(id: u64) {
    for args in [
        vec![
            "update".to_string(),
            format!("jobid={id}"),
            "NumCPUs=3".to_string(),
        ],
        vec!["release".to_string(), id.to_string()],
    ] {
        let _ = Command::new("scontrol").args(&args).output().unwrap();
    }
}

#[test]
fn a_job_that_becomes_one_slurm_can_never_run_is_cancelled_and_nothing_more_is_submitted() {
    let Some(_cluster) = cluster() else {
        return;
    };
    for reuse in [true, false] {
        let world = World::new(if reuse { "neverlate" } else { "neverlatequeue" });
        let mut service = world.service(json!({
            "reuseMode": reuse,
            "sbatchArgs": ["--hold"],
            "lateStartFailures": true,
        }));
        if !reuse {
            service
                .start(world.request(QUEUE_ENVIRONMENT, "n1", "echo KNOB_FINAL 1"))
                .unwrap();
        }
        let id = wait_for("the job to be queued", Duration::from_secs(30), || {
            queued_jobs(&world.experiment_id).first().copied()
        });
        make_never_runnable(id);
        let events = world.events.wait_until("the never-runs warning", |events| {
            warnings(events)
                .iter()
                .any(|w| w.contains("can never start"))
        });
        let warning = warnings(&events)
            .into_iter()
            .find(|w| w.contains("can never start"))
            .unwrap();
        assert!(!warning.contains('\n'), "{warning}");
        assert!(
            warning.contains(&format!("Slurm job {id} can never start"))
                && warning.contains("(PartitionConfig)")
                && warning.contains("trialCpuNumber (1)"),
            "{warning}"
        );
        if !reuse {
            // The trial's start fails with Slurm's reason (it is not run again elsewhere),
            // and no other trial is taken.
            let events = world
                .events
                .wait_until("the trial's start to fail", |events| {
                    events
                        .iter()
                        .any(|e| matches!(e, ServiceEvent::StartFailed { .. }))
                });
            let failed: Vec<ServiceEvent> = of_trial(&events, "n1")
                .into_iter()
                .filter(|e| !matches!(e, ServiceEvent::Warning { .. }))
                .collect();
            assert!(
                matches!(failed.as_slice(), [ServiceEvent::StartFailed { message, .. }] if message.contains("(PartitionConfig)")),
                "{events:#?}"
            );
            service
                .start(world.request(QUEUE_ENVIRONMENT, "n2", "echo KNOB_FINAL 1"))
                .unwrap();
            world
                .events
                .wait_until("the next start to fail so", |events| {
                    events.iter().any(|e| {
                        matches!(e, ServiceEvent::StartFailed { trial_id, message }
                        if trial_id == "n2" && message.contains("(PartitionConfig)"))
                    })
                });
        }
        wait_for("the job to be cancelled", Duration::from_secs(30), || {
            queued_jobs(&world.experiment_id).is_empty().then_some(())
        });
        // No environment is left to wait for, and no allocation is asked for in its place.
        std::thread::sleep(Duration::from_secs(1));
        assert!(
            service.environments_now().iter().all(|e| !e.ready),
            "{:?}",
            service.environments_now()
        );
        assert_eq!(service.job_ids(), Vec::<u64>::new());
        assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
        service.stop();
    }
}

#[test]
fn a_folder_with_spaces_quotes_and_percent_signs_runs_trials() {
    let Some(_cluster) = cluster() else {
        return;
    };
    // sbatch refused a space in its #SBATCH --output line, and expanded %j in the folder's
    // name (the job failed, its log nowhere).
    let world = World::in_folder("oddfolder", "my exp #1 100%j \"q\" 'a'");
    let mut service = world.service(json!({}));
    wait_ready(&service, 1);
    let job = service.job_ids()[0];
    service
        .start(world.request("slurm:env1", "t1", "echo KNOB_FINAL 1"))
        .unwrap();
    let events = world.events.wait_ended("t1");
    let (exit_code, _, killed, _) = ending(&events);
    assert_eq!((exit_code, killed), (Some(0), None), "{events:#?}");
    service.stop();
    // Slurm's own log is where knob reads it from.
    let runs: Vec<_> = std::fs::read_dir(world.experiment_dir.join("services/slurm"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    let log = runs[0].join("env1").join(format!("slurm-{job}.out"));
    assert!(log.is_file(), "{} missing", log.display());
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

#[test]
fn a_job_renamed_outside_knob_is_cancelled_by_id_not_left_queued() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("renamed");
    let mut service = world.service(json!({}));
    wait_ready(&service, 1);
    let job = service.job_ids()[0];
    // Named so that `queued_jobs` still finds it, but not knob's name for it.
    let renamed = format!("other-{}", world.experiment_id);
    let status = Command::new("scontrol")
        .args([
            "update",
            &format!("JobId={job}"),
            &format!("JobName={renamed}"),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let events = world.events.wait_until("the renamed job to end", |events| {
        warnings(events)
            .iter()
            .any(|w| w.contains(&format!("Slurm job {job} (slurm:env1) ended")))
    });
    let said = warnings(&events).join("\n");
    assert!(
        said.contains(&format!(
            "squeue lists it under the name \"{renamed}\", not knob's"
        )),
        "{said}"
    );
    // Knob no longer uses it, so it holds no allocation: cancelled by its id.
    wait_for(
        "the renamed job to be cancelled",
        Duration::from_secs(30),
        || {
            let now = queued_jobs(&world.experiment_id);
            (!now.contains(&job)).then_some(())
        },
    );
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

/// Drains the node for its life, and resumes it on drop whatever happens.
struct Drained(String);

impl Drained {
    fn new() -> Drained {
        let node = node();
        let status = Command::new("scontrol")
            .args([
                "update",
                &format!("nodename={node}"),
                "state=drain",
                "reason=knob-test",
            ])
            .status()
            .unwrap();
        assert!(status.success());
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

#[test]
fn on_a_drained_node_trials_wait_with_slurms_reason() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("drain");
    let drained = Drained::new();
    let mut service = world.service(json!({"reuseMode": false}));
    service
        .start(world.request(QUEUE_ENVIRONMENT, "w1", "echo KNOB_FINAL 1"))
        .unwrap();
    // Slurm says why: the node is not available (drained). A job's first reason may be none
    // (the scheduler has not looked at it yet); the service reports each new one.
    let with_reason = |w: &String| {
        // Slurm spells a reason with underscores in `squeue` and with spaces elsewhere.
        let w = w.replace('_', " ");
        w.starts_with("waiting: Slurm job")
            && (w.contains("ReqNodeNotAvail")
                || w.contains("Resources")
                || w.contains("Nodes required"))
    };
    let all = world
        .events
        .wait_until("the trial to wait with Slurm's reason", |events| {
            warnings(events).iter().any(with_reason)
        });
    assert!(!all
        .iter()
        .any(|e| matches!(e, ServiceEvent::TrialStarted { .. })));
    drop(drained);
    let events = world.events.wait_ended("w1");
    assert_eq!(ending(&events).0, Some(0), "{events:#?}");
    service.stop();
}

#[test]
fn a_killed_trial_ends_with_the_kills_reason_whether_it_runs_or_waits_in_the_queue() {
    let Some(_cluster) = cluster() else {
        return;
    };
    // Running in an allocation: its agent kills it, and the allocation takes the next trial.
    let world = World::new("killrun");
    let mut service = world.service(json!({}));
    wait_ready(&service, 1);
    start_long_trial(&world, &mut service, "long");
    service.kill("long", "stopped early by the assessor");
    let events = world.events.wait_ended("long");
    let (_, _, killed, _) = ending(&events);
    assert_eq!(
        killed.as_deref(),
        Some("stopped early by the assessor"),
        "{events:#?}"
    );
    service
        .start(world.request("slurm:env1", "next", "echo KNOB_FINAL 1"))
        .unwrap();
    let events = world.events.wait_ended("next");
    assert_eq!(ending(&events).0, Some(0), "{events:#?}");
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());

    // Still in the queue (the node drained): its job is cancelled, and it ends with the
    // kill's reason, not as an environment lost.
    let world = World::new("killqueued");
    let drained = Drained::new();
    let mut service = world.service(json!({"reuseMode": false}));
    service
        .start(world.request(QUEUE_ENVIRONMENT, "queued", "echo KNOB_FINAL 1"))
        .unwrap();
    wait_for(
        "the trial's job in the queue",
        Duration::from_secs(30),
        || (!queued_jobs(&world.experiment_id).is_empty()).then_some(()),
    );
    service.kill("queued", "stopped by the user");
    let events = world.events.wait_ended("queued");
    drop(drained);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, ServiceEvent::TrialStarted { .. })),
        "{events:#?}"
    );
    let (_, _, killed, _) = ending(&events);
    assert_eq!(
        killed.as_deref(),
        Some("stopped by the user"),
        "{events:#?}"
    );
    assert!(lost_reason(&events).is_none(), "{events:#?}");
    wait_for(
        "the cancelled job to leave the queue",
        Duration::from_secs(30),
        || queued_jobs(&world.experiment_id).is_empty().then_some(()),
    );
    service.stop();
}

/// Sends `signal` to the `srun` step that links the service to job `job_id`'s agent (the agent
/// itself goes on running in the job): `KILL` breaks the link, `STOP` stalls it.
fn signal_link(job_id: u64, signal: &str) {
    let step = format!("^srun --jobid={job_id} --overlap");
    let status = Command::new("pkill")
        .args([&format!("-{signal}"), "-f", &step])
        .status()
        .unwrap();
    assert!(status.success(), "no srun step linked to job {job_id}");
}

#[test]
fn a_kill_asked_for_as_the_agents_link_breaks_is_not_lost() {
    let Some(_cluster) = cluster() else {
        return;
    };
    // In an allocation: the kill goes once the agent is reconnected, and the allocation, which
    // may run other trials, is not cancelled for it.
    let world = World::new("killrelink");
    let mut service = world.service(json!({}));
    wait_ready(&service, 1);
    let allocation = service.job_ids();
    start_long_trial(&world, &mut service, "long");
    signal_link(allocation[0], "KILL");
    service.kill("long", "stopped early by the assessor");
    let events = world.events.wait_ended("long");
    assert_eq!(
        ending(&events).2.as_deref(),
        Some("stopped early by the assessor"),
        "{events:#?}"
    );
    assert!(lost_reason(&events).is_none(), "{events:#?}");
    wait_ready(&service, 1);
    assert_eq!(service.job_ids(), allocation);
    let command = "echo \"job $SLURM_JOB_ID\" >&2; echo KNOB_FINAL 1";
    service
        .start(world.request("slurm:env1", "next", command))
        .unwrap();
    let events = world.events.wait_ended("next");
    let (exit_code, _, _, stderr) = ending(&events);
    assert_eq!(exit_code, Some(0), "{events:#?}");
    assert!(
        stderr.contains(&format!("job {}", allocation[0])),
        "{stderr}"
    );

    // The link stalls (its srun stopped) as the kill is sent: the agent, not heard from for the
    // protocol's heartbeat timeout, is connected to again, before the kill's own reply timeout
    // would have told, and the kill goes then.
    start_long_trial(&world, &mut service, "stalled");
    signal_link(allocation[0], "STOP");
    service.kill("stalled", "stopped by the user");
    // The heartbeat finds the link silent 15–20 s after it stalled; the kill's reply timeout
    // (30 s) would say "did not answer" instead. The wait is generous for a loaded machine.
    let unconfirmed = wait_for(
        "the kill to be found unconfirmed",
        Duration::from_secs(60),
        || {
            let said = warnings(&of_trial(&world.events.all(), "stalled"));
            said.iter()
                .find(|w| w.contains("was not confirmed"))
                .cloned()
        },
    );
    assert!(
        unconfirmed.contains("not confirmed (the connection to the agent closed)"),
        "{unconfirmed}"
    );
    let events = world.events.wait_ended("stalled");
    assert_eq!(
        ending(&events).2.as_deref(),
        Some("stopped by the user"),
        "{events:#?}"
    );
    assert_eq!(service.job_ids(), allocation);
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());

    // In a job of its own: the job is cancelled, and the trial ends with the kill's reason.
    let world = World::new("killrelinksolo");
    let mut service = world.service(json!({"reuseMode": false}));
    let marker = world.file("solo-started");
    service
        .start(world.request(
            QUEUE_ENVIRONMENT,
            "solo",
            &format!("touch {}; sleep 300", marker.display()),
        ))
        .unwrap();
    wait_for("trial solo to start", Duration::from_secs(60), || {
        marker.exists().then_some(())
    });
    signal_link(service.job_ids()[0], "KILL");
    service.kill("solo", "stopped by the user");
    let events = world.events.wait_ended("solo");
    assert_eq!(
        ending(&events).2.as_deref(),
        Some("stopped by the user"),
        "{events:#?}"
    );
    assert!(lost_reason(&events).is_none(), "{events:#?}");
    wait_for(
        "the cancelled job to leave the queue",
        Duration::from_secs(30),
        || queued_jobs(&world.experiment_id).is_empty().then_some(()),
    );
    service.stop();
}

/// A start in an allocation waits for its agent's answer over `srun`; an allocation whose link
/// stalls must not hold the starts in another, nor lose the kill of a trial whose start is
/// still under way.
#[test]
fn a_start_in_a_stalled_allocation_holds_no_start_in_another() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("stalledstart");
    let mut service = world.service(json!({"maxEnvironments": 2, "lateStartFailures": true}));
    let environments = wait_ready(&service, 2);
    let jobs = service.job_ids();
    assert_eq!(jobs.len(), 2);
    let (stalled, quick) = (environments[0].as_str(), environments[1].as_str());
    signal_link(jobs[0], "STOP");
    service
        .start(world.request(stalled, "held", "echo KNOB_FINAL 1"))
        .unwrap();
    service
        .start(world.request(stalled, "killed", "sleep 60"))
        .unwrap();
    service.kill("killed", "stopped early by the assessor");
    service
        .start(world.request(quick, "quick", "echo KNOB_FINAL 2"))
        .unwrap();
    // The stalled link goes on once the quick trial started, or after 10 s (less than the 15 s
    // heartbeat timeout, so it is not connected to again): waiting behind the stalled starts,
    // the quick trial would start only after that.
    let quick_started = started_within(&world.events, "quick", Duration::from_secs(10));
    let held_meanwhile = of_trial(&world.events.all(), "held");
    signal_link(jobs[0], "CONT");
    assert!(
        quick_started,
        "the quick allocation's trial waited for the stalled one"
    );
    assert!(held_meanwhile.is_empty(), "{held_meanwhile:#?}");
    assert_eq!(ending(&world.events.wait_ended("quick")).0, Some(0));
    assert_eq!(ending(&world.events.wait_ended("held")).0, Some(0));
    let killed = world.events.wait_ended("killed");
    assert_eq!(
        ending(&killed).2.as_deref(),
        Some("stopped early by the assessor"),
        "{killed:#?}"
    );
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

/// Stops slurmctld (`SIGSTOP`) for its life: every Slurm command waits, as on a controller
/// too busy to answer; it goes on (`SIGCONT`) on drop, whatever happens.
struct ControllerStalled;

impl ControllerStalled {
    fn new() -> ControllerStalled {
        let status = Command::new("pkill")
            .args(["-STOP", "-x", "slurmctld"])
            .status()
            .unwrap();
        assert!(status.success(), "no slurmctld to stop");
        ControllerStalled
    }
}

impl Drop for ControllerStalled {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .args(["-CONT", "-x", "slurmctld"])
            .status();
    }
}

/// Stops slurmctld: every Slurm command fails at once ("Unable to contact slurm controller").
/// It is started again by [`ControllerDown::restart`] or on drop.
///
/// `SIGTERM`, not `SIGKILL`: slurmctld saves its job state in the background, seconds behind,
/// and a killed one came back without the jobs submitted just before (their ids were handed out
/// again), so the test could not see what became of them. A controller shut down for
/// maintenance saves its state first, as this one does.
struct ControllerDown(bool);

impl ControllerDown {
    fn new() -> ControllerDown {
        let status = Command::new("pkill")
            .args(["-TERM", "-x", "slurmctld"])
            .status()
            .unwrap();
        assert!(status.success(), "no slurmctld to stop");
        wait_for("slurmctld to exit", Duration::from_secs(60), || {
            let running = Command::new("pgrep")
                .args(["-x", "slurmctld"])
                .status()
                .unwrap();
            (!running.success()).then_some(())
        });
        ControllerDown(true)
    }

    /// Starts slurmctld again, alone: `.ci/slurm.sh` would also cancel every job still queued,
    /// the very jobs the test watches the service cancel.
    fn restart(&mut self) {
        if std::mem::take(&mut self.0) {
            let status = Command::new("/usr/sbin/slurmctld")
                .args(["-L", "/var/log/slurm/slurmctld.log"])
                .status()
                .unwrap();
            assert!(status.success(), "slurmctld did not start: {status}");
            wait_for("slurmctld to answer", Duration::from_secs(60), || {
                let ping = Command::new("squeue").arg("--noheader").output().unwrap();
                ping.status.success().then_some(())
            });
        }
    }
}

impl Drop for ControllerDown {
    fn drop(&mut self) {
        self.restart();
    }
}

#[test]
fn a_stop_while_the_controller_is_down_cancels_the_jobs_once_it_is_back() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("ctlddown");
    let mut service = world.service(json!({}));
    wait_ready(&service, 1);
    let job = service.job_ids()[0];
    let mut down = ControllerDown::new();
    let stopping = std::thread::spawn(move || {
        service.stop();
        service.not_cancelled()
    });
    // Longer than one scancel takes to fail (about 9 s): the one scancel of the shutdown
    // failed, and the job stayed queued, then ran idle, with no word of it.
    std::thread::sleep(Duration::from_secs(12));
    down.restart();
    let not_cancelled = stopping.join().unwrap();
    assert_eq!(not_cancelled, None);
    // A step that could not report its end while the controller was down is retried by slurmd
    // 60 s later: until then the cancelled job stays in the queue, completing.
    wait_for(
        "the job to leave the queue",
        Duration::from_secs(150),
        || (!queued_jobs(&world.experiment_id).contains(&job)).then_some(()),
    );
    let shown = scontrol_job(job);
    assert!(
        shown.contains("JobState=CANCELLED"),
        "scontrol show job {job}: {shown:?}"
    );
}

/// A controller down for the whole shutdown: the service gives up within its budget, well
/// inside the host's patience, names the job it could not cancel, and reports its trial's end;
/// it had tried `scancel` for 60 s after waiting 20 s for the trials, so the host gave up on
/// it first and its last word was lost.
#[test]
fn a_stop_with_the_controller_down_throughout_ends_within_the_hosts_patience() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("ctlddownlong");
    let mut service = world.service(json!({}));
    wait_ready(&service, 1);
    let job = service.job_ids()[0];
    start_long_trial(&world, &mut service, "held");
    let mut down = ControllerDown::new();
    let began = Instant::now();
    service.stop();
    let took = began.elapsed();
    let not_cancelled = service.not_cancelled();
    down.restart();
    let _ = Command::new("scancel").arg(job.to_string()).status();
    assert!(
        took < SHUTDOWN_PATIENCE - Duration::from_secs(10),
        "the shutdown took {took:?}"
    );
    let said = not_cancelled.unwrap_or_else(|| panic!("no word of the job left queued"));
    assert!(
        said.contains(&format!("Slurm job {job} ")) && said.contains(&format!("`scancel {job}`")),
        "{said}"
    );
    let events = of_trial(&world.events.all(), "held");
    assert!(ending(&events).2.is_some(), "{events:#?}");
}

/// A trial's own job (`reuseMode: false`) waits for `sbatch`, seconds or more on a busy
/// controller: the start must not hold the service's other calls (nor the manager's loop, which
/// awaits each), a kill asked for meanwhile must cancel the job once it is in, and a job Slurm
/// refuses comes as a late `StartFailed`.
#[test]
fn a_trials_own_job_waiting_on_a_stalled_controller_holds_no_other_call() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("stalledsbatch");
    let mut service = world.service(json!({
        "reuseMode": false,
        "lateStartFailures": true,
        "trialConcurrency": 3,
    }));
    let stalled = ControllerStalled::new();
    let asked = Instant::now();
    service
        .start(world.request(QUEUE_ENVIRONMENT, "first", "echo KNOB_FINAL 1"))
        .unwrap();
    service
        .start(world.request(QUEUE_ENVIRONMENT, "killed", "sleep 60"))
        .unwrap();
    service.kill("killed", "stopped by the user");
    let mut refused = world.request(QUEUE_ENVIRONMENT, "refused", "echo KNOB_FINAL 2");
    // More memory than any node has: sbatch refuses the job.
    refused.resources.memory_mib = Some(64 * 1024 * 1024);
    service.start(refused).unwrap();
    let calls = asked.elapsed();
    // Long enough that a start waiting for sbatch would have shown it.
    std::thread::sleep(Duration::from_secs(3));
    let meanwhile = world.events.all();
    drop(stalled);
    assert!(
        calls < Duration::from_secs(2),
        "three calls took {calls:?} with slurmctld stopped: a start waited for sbatch"
    );
    // Nothing failed for the wait: sbatch waits for a stalled controller, then goes on.
    assert!(
        !meanwhile
            .iter()
            .any(|e| matches!(e, ServiceEvent::StartFailed { .. })),
        "{meanwhile:#?}"
    );
    assert_eq!(ending(&world.events.wait_ended("first")).0, Some(0));
    let killed = world.events.wait_ended("killed");
    assert!(
        !killed
            .iter()
            .any(|e| matches!(e, ServiceEvent::TrialStarted { .. })),
        "{killed:#?}"
    );
    assert_eq!(
        ending(&killed).2.as_deref(),
        Some("stopped by the user"),
        "{killed:#?}"
    );
    let refusal = wait_for(
        "the refused job's StartFailed",
        Duration::from_secs(60),
        || {
            world
                .events
                .all()
                .into_iter()
                .find_map(|event| match event {
                    ServiceEvent::StartFailed { trial_id, message } if trial_id == "refused" => {
                        Some(message)
                    }
                    _ => None,
                })
        },
    );
    assert!(refusal.contains("sbatch"), "{refusal}");
    assert!(!refusal.contains('\n'), "{refusal}");
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

#[test]
fn a_new_run_cancels_the_jobs_an_earlier_run_left() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("resume");
    // What a knob killed with -9 leaves: its allocation still running, found by its comment.
    let mut earlier = world.service(json!({}));
    wait_ready(&earlier, 1);
    start_long_trial(&world, &mut earlier, "r1");
    let left = earlier.job_ids();
    // Forget the service without its shutdown: its job stays in the queue as after a crash.
    earlier.abandon();
    assert_eq!(queued_jobs(&world.experiment_id), left);

    // What `knob resume` does first: the service's clean-up finds the job by its comment.
    let ended = <SlurmService as TrainingService>::clean_up_leftovers(
        &json!({}),
        &world.args(json!({})).1,
        &["r1".to_string()],
    )
    .unwrap();
    assert_eq!(
        ended,
        vec![format!(
            "cancelled Slurm job {}, left in the queue by an earlier run",
            left[0]
        )]
    );
    wait_for(
        "the earlier job to leave the queue",
        Duration::from_secs(30),
        || queued_jobs(&world.experiment_id).is_empty().then_some(()),
    );

    // A service started while an earlier run's job is still queued cancels it itself.
    let again = world.service_with(json!({}), &Events::default()).unwrap();
    let left = again.job_ids();
    again.abandon();
    let later_events = Events::default();
    let mut later = world.service_with(json!({}), &later_events).unwrap();
    let said = warnings(&later_events.all()).join("\n");
    assert!(
        said.contains(&format!(
            "cancelled 1 job(s) an earlier run of experiment {} left in the queue: {left:?}",
            world.experiment_id
        )),
        "{said}"
    );
    wait_for(
        "the earlier job to leave the queue",
        Duration::from_secs(30),
        || {
            let now = queued_jobs(&world.experiment_id);
            (!now.iter().any(|id| left.contains(id))).then_some(())
        },
    );
    wait_ready(&later, 1);
    later.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

#[test]
fn a_resume_reports_each_job_it_cancelled_once() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("resumeonce");
    // An earlier run killed with -9: one allocation running a trial, one pending (the node's
    // 2 CPUs are the first's).
    let mut earlier = world.service(json!({"trialCpuNumber": 2, "maxEnvironments": 2}));
    wait_ready(&earlier, 1);
    start_long_trial(&world, &mut earlier, "r1");
    wait_for(
        "the second allocation to be queued",
        Duration::from_secs(30),
        || (earlier.job_ids().len() == 2).then_some(()),
    );
    let left = earlier.job_ids();
    earlier.abandon();
    // `knob resume`: the clean-up cancels both and says so; the service started right after
    // finds the running one still COMPLETING, and said it cancelled only that one.
    let ended = <SlurmService as TrainingService>::clean_up_leftovers(
        &json!({}),
        &world.args(json!({})).1,
        &["r1".to_string()],
    )
    .unwrap();
    assert_eq!(ended.len(), 2, "{ended:?}");
    let later_events = Events::default();
    let mut later = world.service_with(json!({}), &later_events).unwrap();
    let said = warnings(&later_events.all()).join("\n");
    assert!(!said.contains("an earlier run"), "{said}");
    wait_for(
        "the earlier jobs to leave the queue",
        Duration::from_secs(30),
        || {
            let now = queued_jobs(&world.experiment_id);
            (!now.iter().any(|id| left.contains(id))).then_some(())
        },
    );
    later.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

/// When Slurm ends job `id` (`EndTime`), by `scontrol`.
fn end_time(id: u64) -> std::time::SystemTime {
    let out = Command::new("scontrol")
        .args(["show", "job", "--oneliner", &id.to_string()])
        .env("SLURM_TIME_FORMAT", "%s")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let seconds: u64 = text
        .split_whitespace()
        .find_map(|field| field.strip_prefix("EndTime="))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no EndTime in {text}"));
    std::time::UNIX_EPOCH + Duration::from_secs(seconds)
}

/// A start between two polls, on an allocation whose end is nearer than a trial is given at
/// least: the time left is the end time's, now, not the last poll's; the allocation is retired
/// and a fresh one requested, and the trial is not started (the core places it again), where it
/// had been started and killed by Slurm's time limit.
#[test]
fn a_start_on_an_allocation_about_to_end_is_not_started_and_a_fresh_one_is_requested() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("ending");
    // A minute's time limit, no maxTrialDuration, and polls 25 s apart: the last poll before
    // the start below read more than 30 s left.
    let mut service = world.service(json!({"time": "1", "pollIntervalSecs": 25}));
    wait_ready(&service, 1);
    let job = service.job_ids()[0];
    let start_at = end_time(job) - Duration::from_secs(25);
    if let Ok(wait) = start_at.duration_since(std::time::SystemTime::now()) {
        std::thread::sleep(wait);
    }
    let refused = service
        .start(world.request("slurm:env1", "late", "echo KNOB_FINAL 1"))
        .unwrap_err()
        .to_string();
    assert!(refused.ends_with(NOT_STARTED), "{refused}");
    assert!(refused.contains("s left, less than the 30 s"), "{refused}");
    wait_for("a fresh allocation", Duration::from_secs(30), || {
        service
            .environments_now()
            .iter()
            .any(|e| e.id == "slurm:env2")
            .then_some(())
    });
    assert!(
        service
            .environments_now()
            .iter()
            .all(|e| e.id != "slurm:env1"),
        "{:?}",
        service.environments_now()
    );
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

#[test]
fn an_allocation_reaching_its_time_limit_drains_and_loses_its_trial() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("timelimit");
    // Slurm's smallest time limit is a minute; maxTrialDuration 50 s makes the allocation stop
    // taking trials after about 10 s.
    let mut service = world.service(json!({"time": "1", "maxTrialDurationSecs": 50}));
    wait_ready(&service, 1);
    let job = service.job_ids()[0];
    let marker = world.file("started");
    service
        .start(world.request(
            "slurm:env1",
            "tl",
            &format!("touch {}; sleep 600", marker.display()),
        ))
        .unwrap();
    wait_for("the trial to start", Duration::from_secs(30), || {
        marker.exists().then_some(())
    });
    // The allocation drains: no new trial, and a new allocation is requested. Its report comes
    // as an event, after that request; a re-probe no longer lists it.
    wait_for("the allocation to drain", Duration::from_secs(40), || {
        world
            .events
            .all()
            .iter()
            .any(|event| {
                matches!(event, ServiceEvent::Environment { environment: e }
                    if e.id == "slurm:env1" && !e.ready
                        && e.inventory["status"]["state"] == "draining")
            })
            .then_some(())
    });
    assert!(
        service
            .environments_now()
            .iter()
            .all(|e| e.id != "slurm:env1"),
        "{:?}",
        service.environments_now()
    );
    let refused = service
        .start(world.request("slurm:env1", "late", "true"))
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("takes no trials now") && refused.ends_with(NOT_STARTED),
        "{refused}"
    );
    // Its agent's link closes and is connected again: it stays retired (it had come back
    // ready, and taken trials it had no time for).
    let link_pids = || {
        let step = format!("^srun --jobid={job} --overlap");
        let out = Command::new("pgrep").args(["-f", &step]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = link_pids();
    let reports_before = world.events.all().len();
    signal_link(job, "KILL");
    wait_for(
        "the agent to be reconnected",
        Duration::from_secs(20),
        || {
            let now = link_pids();
            (!now.trim().is_empty() && now != first).then_some(())
        },
    );
    // The reconnection's report, if one were sent, comes as the link is up.
    std::thread::sleep(Duration::from_secs(2));
    let since: Vec<_> = world.events.all().split_off(reports_before);
    assert!(
        !since.iter().any(|event| matches!(event,
            ServiceEvent::Environment { environment: e }
                if e.id == "slurm:env1" && e.inventory["status"]["state"] != "draining")),
        "{since:#?}"
    );
    assert!(
        service
            .environments_now()
            .iter()
            .all(|e| e.id != "slurm:env1"),
        "{:?}",
        service.environments_now()
    );
    wait_for("a second allocation", Duration::from_secs(30), || {
        service
            .environments_now()
            .iter()
            .any(|e| e.id == "slurm:env2")
            .then_some(())
    });
    let all = wait_for(
        "the trial to end with its allocation",
        Duration::from_secs(150),
        || {
            let all = world.events.all();
            all.iter()
                .any(|e| crate::support::is_end_of(e, "tl"))
                .then_some(all)
        },
    );
    let events = of_trial(&all, "tl");
    let lost = lost_reason(&events).unwrap_or_else(|| panic!("{events:#?}"));
    assert!(
        lost.contains(&format!("Slurm job {job} (slurm:env1) ended: TIMEOUT")),
        "{lost}"
    );
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

#[test]
fn a_retired_allocation_is_cancelled_once_its_trials_ended() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("retiredidle");
    // A minute's time limit, maxTrialDuration 50 s: retired after about 10 s.
    let mut service = world.service(json!({"time": "1", "maxTrialDurationSecs": 50}));
    wait_ready(&service, 1);
    let job = service.job_ids()[0];
    let submitted = Instant::now();
    let release = world.file("release");
    service
        .start(world.request(
            "slurm:env1",
            "rt",
            &format!(
                "while [ ! -e {} ]; do sleep 0.1; done; echo KNOB_FINAL 1",
                release.display()
            ),
        ))
        .unwrap();
    wait_for(
        "the allocation to be retired",
        Duration::from_secs(40),
        || {
            service
                .environments_now()
                .iter()
                .all(|e| e.id != "slurm:env1")
                .then_some(())
        },
    );
    std::fs::write(&release, "").unwrap();
    let events = world.events.wait_ended("rt");
    assert_eq!(ending(&events).0, Some(0), "{events:#?}");
    // Its last trial ended: cancelled at once, well before Slurm's TIMEOUT (a minute after it
    // started), which it sat idle until, holding its CPU from its own replacement.
    wait_for(
        "the retired allocation to leave the queue",
        Duration::from_secs(20),
        || (!queued_jobs(&world.experiment_id).contains(&job)).then_some(()),
    );
    assert!(submitted.elapsed() < Duration::from_secs(55));
    let shown = scontrol_job(job);
    assert!(shown.contains("JobState=CANCELLED"), "{shown}");
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}

#[test]
fn a_requeued_allocation_loses_its_trials_once_and_takes_new_ones() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let world = World::new("requeue");
    // knob submits with --no-requeue; a user who wants requeues (preemption) says so.
    let mut service = world.service(json!({"sbatchArgs": ["--requeue"]}));
    wait_ready(&service, 1);
    let job = service.job_ids()[0];
    start_long_trial(&world, &mut service, "q1");
    let status = Command::new("scontrol")
        .args(["requeue", &job.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // Slurm signals the job's processes and waits for them (KillWait) before it requeues.
    let events = wait_for("q1 to end", Duration::from_secs(90), || {
        let events = of_trial(&world.events.all(), "q1");
        events
            .iter()
            .any(|e| crate::support::is_end_of(e, "q1"))
            .then_some(events)
    });
    let lost = lost_reason(&events).unwrap_or_else(|| panic!("{events:#?}"));
    assert!(
        lost.starts_with(&format!("Slurm job {job} (slurm:env1) "))
            && (lost.contains("was requeued by Slurm") || lost.contains("new agent")),
        "{lost}"
    );
    // Slurm holds a requeued job back for a while (its begin time); not in a test.
    wait_for(
        "the job to be pending again",
        Duration::from_secs(60),
        || {
            let shown = scontrol_job(job);
            shown.contains("JobState=PENDING").then_some(())
        },
    );
    // Not at once: slurmd refuses to launch a job again within the second its credential was
    // revoked (the kill of the first run): "Killing non-startable batch JobId: Job credential
    // revoked", and the job ends FAILED (seen under load, 1 run in 6), which knob rightly
    // replaces with a new allocation. (`StartTime=now+2` would wait for the next scheduling
    // cycle; `now` starts it at once.)
    std::thread::sleep(Duration::from_secs(2));
    let status = Command::new("scontrol")
        .args(["update", &format!("jobid={job}"), "StartTime=now"])
        .status()
        .unwrap();
    assert!(status.success());
    // The same job runs again, with a new agent that takes trials.
    wait_for(
        "the requeued allocation to be ready again",
        Duration::from_secs(60),
        || (ready(&service).len() == 1).then_some(()),
    );
    assert_eq!(service.job_ids(), vec![job], "{}", scontrol_job(job));
    service
        .start(world.request("slurm:env1", "q2", "echo KNOB_FINAL 2"))
        .unwrap();
    let events = world.events.wait_ended("q2");
    assert_eq!(ending(&events).0, Some(0), "{events:#?}");
    // q1 ended once.
    let all = world.events.all();
    assert_eq!(
        all.iter()
            .filter(|e| crate::support::is_end_of(e, "q1"))
            .count(),
        1
    );
    service.stop();
    assert_eq!(queued_jobs(&world.experiment_id), Vec::<u64>::new());
}
