//! Population-based training end to end (issue 15): `examples/pbt` (8 members, 40 steps each)
//! under the real local service; lineage and checkpoints are checked against what each trial
//! itself wrote about where it started from (`$KNOB_TRIAL_DIR/pbt.json`), then the same after a
//! SIGKILL of the manager and `knob resume` (and the copies a crash leaves of successors that
//! had ended, deleted by the resume). Then on a remote host (a real sshd, gated by
//! `KNOB_TEST_SSHD`): replaced members' checkpoint folders are deleted there. Last, successors
//! whose first attempt fails, here and on a remote host: the retry starts from the same copy of
//! the parent's checkpoint as the first attempt (ray#28509); and a hybrid experiment (this
//! machine and a remote host), where a successor runs under another service than its parent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::create::Sandbox;
use crate::remote::sshd;
use crate::{repo_root, run};

const STEPS: u64 = 40;

/// A real sshd on 127.0.0.1 (key authentication, `env` in its sessions) that the sandbox
/// trusts, and the agent's root there; `None` (the test returns) without `KNOB_TEST_SSHD`.
struct RemoteHost {
    sshd: sshd::Sshd,
    known_hosts: PathBuf,
    agent_root: PathBuf,
}

impl RemoteHost {
    fn start(sandbox: &Sandbox, env: &[(&str, &str)]) -> Option<RemoteHost> {
        let binary = sshd::sshd_binary()?;
        let sshd = sshd::Sshd::start(
            &binary,
            sshd::SshdOptions {
                key_auth: true,
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..sshd::SshdOptions::default()
            },
        )
        .expect("start sshd");
        let known_hosts = sandbox.path().join("known_hosts");
        std::fs::write(&known_hosts, sshd.known_hosts_line() + "\n").unwrap();
        Some(RemoteHost {
            sshd,
            known_hosts,
            agent_root: sandbox.path().join("agent"),
        })
    }

    /// The remote service's mapping for this host, from `platform: remote` on; its other keys
    /// indented by `indent`.
    fn service(&self, indent: &str) -> String {
        format!(
            "platform: remote\n{indent}knownHostsFile: {}\n{indent}agentRoot: {}\n{indent}machineList:\n{indent}  - {{host: 127.0.0.1, port: {}, user: {}, sshKeyFile: '{}'}}",
            self.known_hosts.display(),
            self.agent_root.display(),
            self.sshd.port(),
            self.sshd.user(),
            self.sshd.client_key_path().display()
        )
    }

    /// `trainingService:` with this host's remote service alone.
    fn only_service(&self) -> String {
        format!("trainingService:\n  {}", self.service("  "))
    }

    /// Experiment `id`'s one environment folder on the host:
    /// `<agentRoot>/experiments/<id>/<environment>`, its trials under `trials/`.
    fn environment(&self, id: &str) -> PathBuf {
        let environments: Vec<PathBuf> =
            std::fs::read_dir(self.agent_root.join("experiments").join(id))
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join("trials").is_dir())
                .collect();
        assert_eq!(environments.len(), 1, "{environments:?}");
        environments.into_iter().next().unwrap()
    }
}

fn example(sandbox: &Sandbox) -> PathBuf {
    let root = repo_root().join("examples/pbt");
    let trial = std::fs::read_to_string(root.join("trial.py")).unwrap();
    let yaml = std::fs::read_to_string(root.join("config.yml"))
        .unwrap()
        .replace("maxExperimentDuration: 10m", "maxExperimentDuration: 3m");
    sandbox.config(&yaml, &[("trial.py", &trial)])
}

/// `knob create` of the example; its trials sleep `step_seconds` after each step.
fn create(sandbox: &Sandbox, config: &Path, id: &str, step_seconds: &str) -> Command {
    let mut command = sandbox.knob();
    command
        .env("PBT_STEP_SECONDS", step_seconds)
        .arg("create")
        .arg("--config")
        .arg(config)
        .args(["--id", id]);
    command
}

/// The text of file `name` in each attempt's folder that has one, by trial id: the trial's
/// own folder (its first attempt) first, then its `attempt-N` folders.
fn attempt_files(experiment_dir: &Path, name: &str) -> BTreeMap<String, Vec<String>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(experiment_dir.join("trials"))
        .unwrap()
        .flatten()
    {
        let id = entry.file_name().into_string().unwrap();
        let mut dirs = vec![entry.path()];
        dirs.extend(
            std::fs::read_dir(entry.path())
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("attempt-"))
                .map(|e| e.path()),
        );
        let texts = dirs
            .iter()
            .filter_map(|dir| std::fs::read_to_string(dir.join(name)).ok())
            .collect();
        files.insert(id, texts);
    }
    files
}

/// Each trial's step times (`SLOW_STOP`'s `step_times.txt`, its attempts' together, in order).
fn step_times(experiment_dir: &Path) -> BTreeMap<String, Vec<u64>> {
    attempt_files(experiment_dir, "step_times.txt")
        .into_iter()
        .map(|(id, texts)| {
            let mut steps: Vec<u64> = texts
                .iter()
                .flat_map(|text| text.lines().filter_map(|line| line.parse::<u64>().ok()))
                .collect();
            steps.sort_unstable();
            (id, steps)
        })
        .collect()
}

/// Every attempt's `pbt.json`, by trial id (an attempt run again after the kill writes its own).
fn trial_logs(experiment_dir: &Path) -> BTreeMap<String, Vec<Value>> {
    attempt_files(experiment_dir, "pbt.json")
        .into_iter()
        .map(|(id, texts)| {
            let logs = texts
                .iter()
                .map(|text| serde_json::from_str(text).unwrap())
                .collect();
            (id, logs)
        })
        .collect()
}

/// Checks lineage, checkpoints and the population against the trials' own logs;
/// `resumed_run`: the manager was killed and the experiment resumed.
fn check_population(sandbox: &Sandbox, id: &str, resumed_run: bool) -> Value {
    let export = sandbox.export(id);
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    let experiment_dir = sandbox.path().join("experiments").join(id);
    let logs = trial_logs(&experiment_dir);
    let trials = export["trials"].as_array().unwrap();
    let by_id: BTreeMap<&str, &Value> = trials
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t))
        .collect();
    let mut slots_done: BTreeMap<String, u32> = BTreeMap::new();
    let mut first_generation = 0;
    let mut successors = 0;
    for trial in trials {
        let tid = trial["id"].as_str().unwrap();
        let lineage = &trial["lineage"];
        assert!(lineage.is_object(), "every trial is a member: {trial:#}");
        let label = trial["parameter_label"].as_str().unwrap();
        let slot = label.split('-').next().unwrap().to_string();
        match trial["status"].as_str().unwrap() {
            "SUCCEEDED" => {
                *slots_done.entry(slot).or_default() += 1;
                // It trained to the end, and wrote so itself.
                let last = logs[tid]
                    .last()
                    .unwrap_or_else(|| panic!("{tid} wrote no log"));
                assert_eq!(last["steps"], STEPS, "{tid}: {last}");
                assert!(
                    experiment_dir
                        .join("trials")
                        .join(tid)
                        .join("checkpoint/state.json")
                        .exists(),
                    "a finished member keeps its checkpoint: {tid}"
                );
            }
            "EARLY_STOPPED" => {
                let message = trial["message"].as_str().unwrap();
                assert!(message.starts_with("PBT: bottom 25% at step "), "{message}");
            }
            other => panic!("{tid} ended {other}: {trial:#}"),
        }
        let Some(parent) = lineage["parent"].as_str() else {
            first_generation += 1;
            // It started from scratch, or (run again after the kill) from its own checkpoint.
            for log in &logs[tid] {
                assert!(log["restored"].is_null(), "{tid}: {log}");
                assert!(log["restore_from"].is_null(), "{tid}: {log}");
            }
            continue;
        };
        successors += 1;
        let replaced = lineage["replaces"].as_str().unwrap();
        assert_eq!(by_id[replaced]["status"], "EARLY_STOPPED", "{trial:#}");
        assert_ne!(parent, replaced);
        let parent_step = lineage["parent_step"].as_u64().unwrap();
        // The trial's own record: it started from the copy of the parent's checkpoint folder
        // made as it was created (its own `restore/`), or, when the manager was killed before
        // the copy was done, from the parent's folder; either held weights the parent wrote at
        // or after the step it was cloned at. The copy is gone once it ended.
        let first = logs[tid]
            .first()
            .unwrap_or_else(|| panic!("{tid} wrote no log"));
        let restore_from = first["restore_from"].as_str().unwrap();
        assert!(
            restore_from.ends_with(&format!("trials/{tid}/restore"))
                || (resumed_run && restore_from.ends_with(&format!("trials/{parent}/checkpoint"))),
            "{tid}: {first}"
        );
        let snapshot = experiment_dir.join("trials").join(tid).join("restore");
        assert!(!snapshot.exists(), "{} kept", snapshot.display());
        if first["resumed"].is_null() {
            let restored = &first["restored"];
            assert_eq!(restored["written_by"], parent, "{tid}: {first}");
            assert!(
                restored["step"].as_u64().unwrap() >= parent_step,
                "{tid}: {first}"
            );
        }
    }
    check_schedules(trials, &logs);
    assert_eq!(first_generation, 8, "{export:#}");
    assert!(
        successors > 0,
        "nobody was exploited in 40 steps: {export:#}"
    );
    // No member lost or duplicated: each of the 8 slots ends with exactly one member that
    // trained to the end.
    let members = || {
        trials
            .iter()
            .map(|t| {
                // Each trial without its results and parameters, one line each.
                let mut t = t.clone();
                if let Some(fields) = t.as_object_mut() {
                    fields.retain(|key, _| !key.contains("metric") && key != "parameters");
                }
                t.to_string()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(slots_done.len(), 8, "{slots_done:?}\n{}", members());
    assert!(
        slots_done.values().all(|n| *n == 1),
        "{slots_done:?}\n{}",
        members()
    );
    // Checkpoints of replaced members are deleted once no member starts from them.
    for trial in trials.iter().filter(|t| t["status"] == "EARLY_STOPPED") {
        let tid = trial["id"].as_str().unwrap();
        let dir = experiment_dir.join("trials").join(tid).join("checkpoint");
        assert!(!dir.exists(), "{} kept", dir.display());
    }
    export
}

/// Each member's `schedule` in the export against the members' own logs: its ancestors,
/// oldest first, are the chain of trials each restored from (`restored.written_by` in its
/// `pbt.json`), each with the parameters it says it trained with, from the step its lineage
/// says it was cloned at (0 for the first generation); the last one is the member itself.
fn check_schedules(trials: &[Value], logs: &BTreeMap<String, Vec<Value>>) {
    let by_id: BTreeMap<&str, &Value> = trials
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t))
        .collect();
    for trial in trials {
        let tid = trial["id"].as_str().unwrap();
        let schedule = trial["schedule"]
            .as_array()
            .unwrap_or_else(|| panic!("{tid} has no schedule: {trial:#}"));
        // From the member back through the parents its own logs name.
        let mut expected = Vec::new();
        let mut current = tid.to_string();
        for _ in 0..trials.len() {
            let log = logs[&current]
                .first()
                .unwrap_or_else(|| panic!("{current} wrote no log"));
            let from_step = by_id[current.as_str()]["lineage"]["parent_step"]
                .as_u64()
                .unwrap_or(0);
            expected.push(serde_json::json!({
                "trial_id": current,
                "from_step": from_step,
                "parameters": log["parameters"],
            }));
            // A first log that resumed from the member's own checkpoint was written by a run
            // whose start the manager had not recorded when it was killed: that run restored
            // from the parent, and this one, the same attempt in the same folder, took its
            // place. The lineage names the parent then.
            let parent = match log["restored"]["written_by"].as_str() {
                Some(parent) => Some(parent),
                None if !log["resumed"].is_null() => {
                    by_id[current.as_str()]["lineage"]["parent"].as_str()
                }
                None => None,
            };
            match parent {
                Some(parent) => current = parent.to_string(),
                None => break,
            }
        }
        expected.reverse();
        assert_eq!(
            schedule, &expected,
            "{tid}'s schedule against its ancestors' logs: {:?}",
            logs[tid]
        );
        assert_eq!(
            schedule.last().unwrap()["parameters"],
            trial["parameters"],
            "{tid}"
        );
    }
}

#[test]
fn pbt_replaces_bottom_members_with_clones_of_top_members_checked_from_the_trials_logs() {
    let sandbox = Sandbox::new();
    let config = example(&sandbox);
    let (code, stdout, stderr) = run(&mut create(&sandbox, &config, "pbt", "0.1"));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = check_population(&sandbox, "pbt", false);
    // A population that ran its course ends as a tuner that ran out, not with a warning that
    // it deferred parameters and gave none (hunt H3 F2).
    assert!(!stderr.contains("warning:"), "{stderr}");
    assert_eq!(export["experiment"]["status"], "DONE");
    assert!(
        export["experiment"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("the tuner has no more parameters to try")),
        "{:#}",
        export["experiment"]
    );
    // `knob trial ls` shows where each member comes from.
    let (code, stdout, stderr) = run(sandbox.knob().args(["trial", "ls", "pbt"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.lines().next().unwrap().contains("lineage"),
        "{stdout}"
    );
    let successor = export["trials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["lineage"]["parent"].is_string())
        .unwrap();
    let cell = format!(
        "from {}@{}, replaces {}",
        successor["lineage"]["parent"].as_str().unwrap(),
        successor["lineage"]["parent_step"],
        successor["lineage"]["replaces"].as_str().unwrap()
    );
    assert!(stdout.contains(&cell), "{cell} not in\n{stdout}");
    // And the schedule of its parameters: a parameter that changed from its parent's value
    // shows the new one at the step it took over from.
    let header = stdout.lines().next().unwrap();
    assert!(header.contains("schedule"), "{stdout}");
    let schedule = successor["schedule"].as_array().unwrap();
    let (parent, own) = (
        &schedule[schedule.len() - 2]["parameters"],
        &schedule[schedule.len() - 1],
    );
    let changed = ["lr", "h0", "h1"]
        .into_iter()
        .find(|name| parent[*name] != own["parameters"][*name])
        .expect("explored parameters differ from the parent's");
    let row = stdout
        .lines()
        .find(|l| l.starts_with(successor["id"].as_str().unwrap()))
        .unwrap();
    assert!(
        row.contains(&format!("{changed} ")) && row.contains(&format!("@{}", own["from_step"])),
        "{changed} from step {} not in\n{row}",
        own["from_step"]
    );
    // The CSV export has the same schedule, as JSON in one column, and the lineage.
    let (code, csv, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "export", "pbt", "--format", "csv"]));
    assert_eq!(code, 0, "{stderr}");
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let headers = reader.headers().unwrap().clone();
    let column = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (id_at, lineage_at, schedule_at) =
        (column("trial_id"), column("lineage"), column("schedule"));
    let by_id: BTreeMap<&str, &Value> = export["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t))
        .collect();
    let mut rows = 0;
    for record in reader.records() {
        let record = record.unwrap();
        let trial = by_id[&record[id_at]];
        let cell: Value = serde_json::from_str(&record[schedule_at]).unwrap();
        assert_eq!(cell, trial["schedule"], "{}", &record[id_at]);
        let cell: Value = serde_json::from_str(&record[lineage_at]).unwrap();
        assert_eq!(cell, trial["lineage"], "{}", &record[id_at]);
        rows += 1;
    }
    assert_eq!(rows, by_id.len());
    // The API gives each member the same schedule (one function makes both).
    let mut command = sandbox.knob();
    command.args(["view", "pbt", "--port", "0"]);
    let view = crate::api::start(command, &[]);
    for (id, trial) in &by_id {
        let (status, body) = crate::api::get(&view.base, &format!("/trials/{id}"));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["schedule"], trial["schedule"], "{id}");
        assert_eq!(body["lineage"], trial["lineage"], "{id}");
    }
}

/// `knob create` of the example as `id`, its output discarded, not waited for.
fn start_in_background(sandbox: &Sandbox, id: &str) -> std::process::Child {
    let config = example(sandbox);
    create(sandbox, &config, id, "0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// `knob resume id`, its trials twice as fast, run until the experiment ends.
fn resume_to_the_end(sandbox: &Sandbox, id: &str) {
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .env("PBT_STEP_SECONDS", "0.05")
        .args(["resume", id]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
}

#[test]
fn a_pbt_experiment_killed_with_sigkill_resumes_with_no_member_lost_or_duplicated() {
    let sandbox = Sandbox::new();
    let mut child = start_in_background(&sandbox, "pbtk");
    // Kill the manager once some member was replaced (a successor's trial folder exists next to
    // the first eight) and members are mid-training.
    let trials_dir = sandbox.path().join("experiments/pbtk/trials");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let count = std::fs::read_dir(&trials_dir).map_or(0, |d| d.count());
        if count > 9 {
            break;
        }
        assert!(Instant::now() < deadline, "no member was replaced in time");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    resume_to_the_end(&sandbox, "pbtk");
    let export = check_population(&sandbox, "pbtk", true);
    // Members running at the kill ran again from their own checkpoints.
    let logs = trial_logs(&sandbox.path().join("experiments/pbtk"));
    let resumed: BTreeSet<&String> = logs
        .iter()
        .filter(|(_, attempts)| attempts.iter().any(|a| !a["resumed"].is_null()))
        .map(|(id, _)| id)
        .collect();
    assert!(
        !resumed.is_empty(),
        "no member resumed from its checkpoint: {export:#}"
    );
}

#[test]
fn a_pbt_experiment_stopped_gracefully_goes_on_replacing_members_after_resume() {
    // `knob stop` records the running members USER_CANCELED "stopped with the experiment"; they
    // run again on resume and must be judged again as after a crash. Imported as ended, they
    // trained out their steps and no member was ever replaced again.
    let sandbox = Sandbox::new();
    let mut child = start_in_background(&sandbox, "pbts");
    let trials_dir = sandbox.path().join("experiments/pbts/trials");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let count = std::fs::read_dir(&trials_dir).map_or(0, |d| d.count());
        if count > 9 {
            break;
        }
        assert!(Instant::now() < deadline, "no member was replaced in time");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, stdout, stderr) = run(sandbox.knob().args(["stop", "pbts"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let _ = child.wait();
    let before = sandbox.export("pbts");
    let cancelled = before["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == "USER_CANCELED")
        .count();
    assert!(cancelled > 0, "the stop cancelled no member: {before:#}");
    let created_before = before["trials"].as_array().unwrap().len();

    resume_to_the_end(&sandbox, "pbts");
    let export = check_population(&sandbox, "pbts", true);
    let created_after = export["trials"].as_array().unwrap().len();
    assert!(
        created_after > created_before,
        "no member was replaced after the resume ({created_before} trials before it): {export:#}"
    );
}

/// A crash between a successor's recorded end and the deletion of the copy of its parent's
/// checkpoint it started from leaves that copy; the resume deletes it. The window is too short
/// to hit with a kill, so after the kill each successor that had ended for good gets back the
/// `restore/` folder such a crash would have left.
#[test]
fn copies_left_by_a_crash_after_successors_ended_are_deleted_at_resume() {
    let sandbox = Sandbox::new();
    let mut child = start_in_background(&sandbox, "pbtc");
    let ended_successors = |export: &Value| -> Vec<String> {
        export["trials"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| !t["lineage"]["parent"].is_null())
            .filter(|t| {
                matches!(
                    t["status"].as_str(),
                    Some("SUCCEEDED" | "EARLY_STOPPED" | "FAILED")
                )
            })
            .map(|t| t["id"].as_str().unwrap().to_string())
            .collect()
    };
    // The export of the running experiment (none until `knob create` has registered it).
    let export_now = || {
        let (code, stdout, _) =
            run(sandbox
                .knob()
                .args(["experiment", "export", "pbtc", "--format", "json"]));
        (code == 0).then(|| serde_json::from_str::<Value>(&stdout).unwrap())
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while export_now().is_none_or(|export| ended_successors(&export).is_empty()) {
        assert!(Instant::now() < deadline, "no successor ended in time");
        std::thread::sleep(Duration::from_millis(200));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let export = sandbox.export("pbtc");
    assert_ne!(export["experiment"]["status"], "DONE", "{export:#}");
    let trials_dir = sandbox.path().join("experiments/pbtc/trials");
    let planted: Vec<PathBuf> = ended_successors(&export)
        .iter()
        .map(|id| trials_dir.join(id).join("restore"))
        .collect();
    assert!(!planted.is_empty());
    for restore in &planted {
        std::fs::create_dir_all(restore).unwrap();
        std::fs::write(restore.join("state.json"), "{}").unwrap();
    }

    resume_to_the_end(&sandbox, "pbtc");
    check_population(&sandbox, "pbtc", true);
    let left: Vec<&PathBuf> = planted.iter().filter(|r| r.exists()).collect();
    assert!(left.is_empty(), "copies left after the resume: {left:?}");
}

/// The example on one SSH host (a real sshd on 127.0.0.1): the checkpoint folders of replaced
/// members are deleted on the host once no member needs them, those of finished members stay.
#[test]
fn a_remote_pbt_experiment_deletes_replaced_members_checkpoints_on_the_host() {
    let sandbox = Sandbox::new();
    let Some(host) = RemoteHost::start(&sandbox, &[]) else {
        return;
    };
    let root = repo_root().join("examples/pbt");
    let trial = std::fs::read_to_string(root.join("trial.py")).unwrap();
    let yaml = std::fs::read_to_string(root.join("config.yml"))
        .unwrap()
        .replace("maxExperimentDuration: 10m", "maxExperimentDuration: 3m")
        .replace(
            "trialCommand: python3 trial.py",
            "trialCommand: PBT_STEP_SECONDS=0.1 python3 trial.py",
        )
        .replace("trainingService:\n  platform: local", &host.only_service());
    assert!(yaml.contains("platform: remote"), "{yaml}");
    let config = sandbox.config(&yaml, &[("trial.py", &trial)]);
    let (code, stdout, stderr) = run(&mut create(&sandbox, &config, "pbtr", "0.1"));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("pbtr");
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    let trials_dir = host.environment("pbtr").join("trials");
    let trials = export["trials"].as_array().unwrap();
    let (mut replaced, mut finished) = (0, 0);
    for trial in trials {
        let tid = trial["id"].as_str().unwrap();
        let folder = trials_dir.join(tid);
        assert!(folder.is_dir(), "{} missing", folder.display());
        let checkpoint = folder.join("checkpoint");
        match trial["status"].as_str().unwrap() {
            "EARLY_STOPPED" => {
                replaced += 1;
                // Deleted in the background once its successor no longer needs it (bounded).
                let deadline = Instant::now() + Duration::from_secs(30);
                while checkpoint.exists() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(100));
                }
                assert!(!checkpoint.exists(), "{} kept", checkpoint.display());
                assert!(folder.is_dir(), "the trial's folder goes too: {tid}");
            }
            "SUCCEEDED" => {
                finished += 1;
                assert!(
                    checkpoint.join("state.json").exists(),
                    "a finished member keeps its checkpoint: {}",
                    checkpoint.display()
                );
            }
            other => panic!("{tid} ended {other}: {trial:#}"),
        }
    }
    // The population ends with its 8 members: a successor the tuner handed out for a member
    // whose own end reached the manager before the tuner's stop did is not created (seen in CI
    // on a loaded machine before it was dropped).
    assert_eq!(finished, 8, "{export:#}");
    assert!(replaced > 0, "nobody was replaced in 40 steps: {export:#}");
    // Successors started from a copy of their parent's checkpoint on the host.
    assert!(
        trials.iter().any(|t| t["lineage"]["parent"].is_string()),
        "{export:#}"
    );
}

/// Starts `trial.py` with a SIGTERM handler that takes `PBT_STOP_SECONDS` to exit, as a trainer
/// that saves on the way out: a stopped member holds its place that long, and its successor
/// waits for it while the parent trains on. Each step's time (ms since the epoch, taken as the
/// step is reported, just after it is saved) is appended to `step_times.txt` in the attempt's
/// folder: the trial's own clock, not the time its report reached the manager, which lags by
/// seconds on a loaded machine.
const SLOW_STOP: &str = r#"import builtins, os, runpy, signal, sys, time


def stop(*_):
    time.sleep(float(os.environ.get("PBT_STOP_SECONDS", "0")))
    sys.exit(0)


step_times = open(os.path.join(os.environ["KNOB_TRIAL_DIR"], "step_times.txt"), "a")
plain_print = builtins.print


def print_noting_steps(*args, **kwargs):
    if args and args[0] == "KNOB_INTERMEDIATE":
        step_times.write("%d\n" % (time.time() * 1000))
        step_times.flush()
    plain_print(*args, **kwargs)


builtins.print = print_noting_steps
signal.signal(signal.SIGTERM, stop)
runpy.run_path("trial.py", run_name="__main__")
"#;

/// Ray Tune's ray#28509 ("restores the wrong weights") on a remote host: the host has 8 GPUs
/// (simulated) for 8 members of one GPU each and `trialConcurrency` leaves room, so a
/// successor is created at the exploitation and then waits for the GPU of the member it
/// replaces, which takes 8 s to stop (the remote agent's 5 s grace period ends it sooner), while
/// its parent keeps overwriting its checkpoint folder.
/// Every successor must still start from its parent's state at the exploitation (the copy the
/// remote service takes when the successor is created), as its own `pbt.json` says: not the
/// 20 steps the parent trained on meanwhile.
///
/// The copy's delay is not bounded by a fixed time: the remote service runs its calls one at a
/// time, so on a loaded machine the copy waits behind the kills and starts asked before it (this
/// test failed 2 of 10 runs under load when it allowed 4 s). What is checked is what a copy taken
/// at the start instead would break: each successor restored a state its parent saved between
/// the successor's creation and its start, and some parent saved more after the copy.
#[test]
fn a_remote_successor_that_waits_starts_from_its_parents_state_at_the_exploitation() {
    let sandbox = Sandbox::new();
    let Some(host) = RemoteHost::start(&sandbox, &[("KNOB_SIMULATE_GPUS", "8x16GiB")]) else {
        return;
    };
    let root = repo_root().join("examples/pbt");
    let trial = std::fs::read_to_string(root.join("trial.py")).unwrap();
    let yaml = std::fs::read_to_string(root.join("config.yml"))
        .unwrap()
        .replace("maxExperimentDuration: 10m", "maxExperimentDuration: 4m")
        .replace(
            "trialConcurrency: 8",
            "trialConcurrency: 10\ntrialGpuNumber: 1",
        )
        .replace(
            "trialCommand: python3 trial.py",
            "trialCommand: PBT_STEPS=100 PBT_STEP_SECONDS=0.2 PBT_STOP_SECONDS=8 python3 slow_stop.py",
        )
        .replace("max_steps: 40", "max_steps: 100")
        .replace("trainingService:\n  platform: local", &host.only_service());
    assert!(yaml.contains("slow_stop.py"), "{yaml}");
    let config = sandbox.config(&yaml, &[("trial.py", &trial), ("slow_stop.py", SLOW_STOP)]);
    let (code, stdout, stderr) = run(&mut create(&sandbox, &config, "pbtw", "0.2"));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("pbtw");
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    let logs = trial_logs(&host.environment("pbtw"));
    let trials = export["trials"].as_array().unwrap();
    let step_times = step_times(&host.environment("pbtw"));
    // A member's step at `time_ms`, from its own log (the step it restored, for a successor)
    // and the steps it had saved by then by its own clock (`SLOW_STOP`; a member saves, then
    // notes the time: its folder may be one step further).
    let step_at = |tid: &str, time_ms: u64| -> u64 {
        let base = logs[tid]
            .first()
            .and_then(|log| log["restored"]["step"].as_u64())
            .unwrap_or(0);
        let saved = step_times
            .get(tid)
            .map_or(0, |times| times.iter().filter(|t| **t <= time_ms).count())
            as u64;
        base + saved
    };
    // (trial, parent's step at its creation, restored, parent's step at its start)
    let mut checked = Vec::new();
    for trial in trials {
        let Some(parent) = trial["lineage"]["parent"].as_str() else {
            continue;
        };
        let tid = trial["id"].as_str().unwrap();
        let first = logs[tid]
            .first()
            .unwrap_or_else(|| panic!("{tid} wrote no log"));
        assert!(
            first["restore_from"]
                .as_str()
                .unwrap()
                .ends_with(&format!("trials/{tid}/restore")),
            "{tid}: {first}"
        );
        let restored = &first["restored"];
        assert_eq!(restored["written_by"], parent, "{tid}: {first}");
        let step = restored["step"].as_u64().unwrap();
        let created = trial["created_ms"].as_u64().unwrap();
        // Reported once the trial runs on the host, after the copy (the service takes the copy
        // before it starts the successor, which starts from it).
        let started = trial["started_ms"].as_u64().unwrap();
        let (at_creation, at_start) = (step_at(parent, created), step_at(parent, started));
        assert!(
            (at_creation..=at_start + 1).contains(&step),
            "{tid} restored {parent}'s step {step}; {parent} was at step {at_creation} when {tid} was created, {at_start} when it started: {first}"
        );
        checked.push((tid.to_string(), at_creation, step, at_start));
    }
    // The test can fail: some parent trained on after the copy and before its successor started
    // (a copy taken at the start would have restored that later step).
    assert!(
        checked
            .iter()
            .any(|(_, _, restored, at_start)| *at_start > restored + 1),
        "no successor waited while its parent trained on past the copy: {checked:?}\n{export:#}"
    );
    eprintln!("successors (trial, parent's step at creation, restored, at start): {checked:?}");
}

/// Starts `trial.py`, except for a successor's first attempt (`KNOB_RESTORE_FROM` set, and the
/// trial's folder not an `attempt-N`): that one writes what it would restore to
/// `first_attempt.json` in its folder, gives its parent a second to train on, and fails.
const FAIL_FIRST: &str = r#"import json, os, runpy, sys, time

trial_dir = os.environ["KNOB_TRIAL_DIR"]
restore = os.environ.get("KNOB_RESTORE_FROM")
if restore and not os.path.basename(trial_dir.rstrip("/")).startswith("attempt-"):
    with open(os.path.join(restore, "state.json")) as f:
        state = json.load(f)
    with open(os.path.join(trial_dir, "first_attempt.json"), "w") as f:
        json.dump({"restore_from": restore, "restored": state}, f)
    time.sleep(1)
    sys.exit(3)
runpy.run_path("trial.py", run_name="__main__")
"#;

/// The example with `maxTrialRetries: 1` and every successor's first attempt failing
/// ([`FAIL_FIRST`]); `service` replaces the local training service when given.
fn fail_first_config(sandbox: &Sandbox, service: Option<&str>) -> PathBuf {
    let root = repo_root().join("examples/pbt");
    let trial = std::fs::read_to_string(root.join("trial.py")).unwrap();
    let mut yaml = std::fs::read_to_string(root.join("config.yml"))
        .unwrap()
        .replace("maxExperimentDuration: 10m", "maxExperimentDuration: 3m")
        .replace(
            "trialConcurrency: 8",
            "trialConcurrency: 8\nmaxTrialRetries: 1",
        )
        .replace(
            "trialCommand: python3 trial.py",
            "trialCommand: PBT_STEP_SECONDS=0.1 python3 fail_first.py",
        );
    if let Some(service) = service {
        yaml = yaml.replace("trainingService:\n  platform: local", service);
    }
    assert!(
        yaml.contains("fail_first.py") && yaml.contains("maxTrialRetries: 1"),
        "{yaml}"
    );
    sandbox.config(
        &yaml,
        &[("trial.py", &trial), ("fail_first.py", FAIL_FIRST)],
    )
}

/// Checks, from the trials' own logs under `trials_dir` (where they ran), that every
/// successor's first attempt failed and its retry started from the very state the first attempt
/// saw (the copy of the parent's checkpoint taken at its creation, in its own `restore/`), and
/// that some parent trained on in between (so the test can fail); the copies are gone at the
/// end (waiting for `wait_s` at most: a remote host deletes them in the background).
fn check_retries_restore_the_same_copy(export: &Value, trials_dir: &Path, wait_s: u64) {
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    let trials = export["trials"].as_array().unwrap();
    let by_id: BTreeMap<&str, &Value> = trials
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t))
        .collect();
    let logs = trial_logs(trials_dir.parent().unwrap());
    let mut retried = Vec::new();
    for trial in trials {
        let Some(parent) = trial["lineage"]["parent"].as_str() else {
            continue;
        };
        let tid = trial["id"].as_str().unwrap();
        let folder = trials_dir.join(tid);
        let first: Value = serde_json::from_str(
            &std::fs::read_to_string(folder.join("first_attempt.json"))
                .unwrap_or_else(|e| panic!("{tid}'s first attempt wrote nothing: {e}")),
        )
        .unwrap();
        assert!(
            first["restore_from"]
                .as_str()
                .unwrap()
                .ends_with(&format!("trials/{tid}/restore")),
            "{tid}: {first}"
        );
        assert_eq!(first["restored"]["written_by"], parent, "{tid}: {first}");
        let copy = folder.join("restore");
        let deadline = Instant::now() + Duration::from_secs(wait_s);
        while copy.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(!copy.exists(), "{} kept", copy.display());
        let Some(retry) = logs[tid].first() else {
            // Stopped by the tuner before its retry started (bottom quantile at once).
            assert_eq!(trial["status"], "EARLY_STOPPED", "{tid}: {trial:#}");
            continue;
        };
        assert!(
            retry["restore_from"]
                .as_str()
                .unwrap()
                .ends_with(&format!("trials/{tid}/restore")),
            "{tid}'s retry: {retry}"
        );
        assert_eq!(
            retry["restored"], first["restored"],
            "{tid}'s retry restored another state than its first attempt"
        );
        // The parent's step when the retry started, from its own reports.
        let started = trial["started_ms"].as_u64().unwrap();
        let parent_base = logs[parent]
            .first()
            .and_then(|log| log["restored"]["step"].as_u64())
            .unwrap_or(0);
        let reported = by_id[parent]["intermediate"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["time_ms"].as_u64().unwrap() <= started)
            .count() as u64;
        retried.push((
            tid.to_string(),
            first["restored"]["step"].as_u64().unwrap(),
            parent_base + reported,
        ));
    }
    // The test can fail: some parent had trained past the copy when its successor's retry
    // started (its folder then held another state than the copy).
    assert!(
        retried
            .iter()
            .any(|(_, copied, at_retry)| at_retry > copied),
        "no parent trained on before its successor's retry: {retried:?}\n{export:#}"
    );
    eprintln!("retried successors (trial, step copied, parent's step at the retry): {retried:?}");
}

#[test]
fn a_successors_retry_starts_from_the_same_copy_of_its_parents_checkpoint() {
    let sandbox = Sandbox::new();
    let config = fail_first_config(&sandbox, None);
    let (code, stdout, stderr) = run(&mut create(&sandbox, &config, "pbtf", "0.1"));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("pbtf");
    let trials_dir = sandbox.path().join("experiments/pbtf/trials");
    check_retries_restore_the_same_copy(&export, &trials_dir, 0);
}

/// The same on a remote host (a real sshd on 127.0.0.1), where the copy is the remote
/// service's, on the host.
#[test]
fn a_remote_successors_retry_starts_from_the_same_copy_of_its_parents_checkpoint() {
    let sandbox = Sandbox::new();
    let Some(host) = RemoteHost::start(&sandbox, &[]) else {
        return;
    };
    let config = fail_first_config(&sandbox, Some(&host.only_service()));
    let (code, stdout, stderr) = run(&mut create(&sandbox, &config, "pbtrf", "0.1"));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("pbtrf");
    check_retries_restore_the_same_copy(&export, &host.environment("pbtrf").join("trials"), 30);
}

/// A hybrid experiment: the example on this machine and a remote host (a real sshd on
/// 127.0.0.1), 4 members each (4 simulated CPUs on each side, one CPU a trial). A successor
/// takes the place of the member it replaces, on either side, and its parent may have run on the
/// other: the copy of the parent's checkpoint goes to it (uploaded from this machine, or brought
/// here from the host). Every successor must start from its parent's weights at or after the
/// step it was cloned at, as its own `pbt.json` says.
#[test]
fn a_hybrid_pbt_experiment_starts_successors_from_their_parents_checkpoint_across_services() {
    let sandbox = Sandbox::new();
    let Some(host) = RemoteHost::start(&sandbox, &[("KNOB_SIMULATE_GPUS", "cpu=4")]) else {
        return;
    };
    let root = repo_root().join("examples/pbt");
    let trial = std::fs::read_to_string(root.join("trial.py")).unwrap();
    let yaml = std::fs::read_to_string(root.join("config.yml"))
        .unwrap()
        .replace("maxExperimentDuration: 10m", "maxExperimentDuration: 3m")
        .replace(
            "trialConcurrency: 8",
            "trialConcurrency: 8\ntrialCpuNumber: 1",
        )
        .replace(
            "trialCommand: python3 trial.py",
            "trialCommand: PBT_STEP_SECONDS=0.1 python3 trial.py",
        )
        .replace(
            "trainingService:\n  platform: local",
            &format!(
                "trainingService:\n  - platform: local\n  - {}",
                host.service("    ")
            ),
        );
    assert!(yaml.contains("- platform: remote"), "{yaml}");
    let config = sandbox.config(&yaml, &[("trial.py", &trial)]);
    // Which side a successor lands on depends on which members the tuner replaces when, and so
    // on timing: a run may by chance keep every successor beside its parent (seen once in CI,
    // eight successors all on the host). Such a run is still checked in full; the experiment
    // then runs again, at most three times, until a successor has crossed sides.
    let mut all_pairs = Vec::new();
    for round in 1..=3 {
        let pairs = run_hybrid_population(&sandbox, &host, &config, &format!("pbth{round}"));
        let crossed = pairs.iter().any(|(parent, own)| parent != own);
        eprintln!("run {round}: successors (parent's environment, own environment): {pairs:?}");
        all_pairs.extend(pairs);
        if crossed {
            return;
        }
    }
    panic!("in three runs no successor ran on the other side of its parent: {all_pairs:?}");
}

/// One run of the hybrid population (experiment `id`), checked in full; returns the
/// (parent's environment, own environment) of each successor.
fn run_hybrid_population(
    sandbox: &Sandbox,
    host: &RemoteHost,
    config: &Path,
    id: &str,
) -> Vec<(String, String)> {
    let (code, stdout, stderr) =
        run(create(sandbox, config, id, "0.1").env("KNOB_SIMULATE_GPUS", "cpu=4"));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export(id);
    assert_eq!(export["experiment"]["status"], "DONE", "{export:#}");
    // The trials' own logs, where each ran: this machine's experiment folder and the host's.
    let mut logs = trial_logs(&sandbox.path().join("experiments").join(id));
    for (tid, attempts) in trial_logs(&host.environment(id)) {
        logs.entry(tid).or_default().extend(attempts);
    }
    let trials = export["trials"].as_array().unwrap();
    let ran_on = |trial: &Value| -> String {
        trial["attempt_history"][0]["environment_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let by_id: BTreeMap<&str, &Value> = trials
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t))
        .collect();
    // (parent's environment, successor's environment) of each successor.
    let mut pairs = Vec::new();
    for trial in trials {
        let tid = trial["id"].as_str().unwrap();
        let status = trial["status"].as_str().unwrap();
        assert!(
            status == "SUCCEEDED" || status == "EARLY_STOPPED",
            "{tid} ended {status}: {trial:#}"
        );
        let Some(parent) = trial["lineage"]["parent"].as_str() else {
            continue;
        };
        let first = logs[tid]
            .first()
            .unwrap_or_else(|| panic!("{tid} wrote no log"));
        assert!(
            first["restore_from"]
                .as_str()
                .unwrap()
                .ends_with(&format!("trials/{tid}/restore")),
            "{tid}: {first}"
        );
        let restored = &first["restored"];
        assert_eq!(restored["written_by"], parent, "{tid}: {first}");
        let parent_step = trial["lineage"]["parent_step"].as_u64().unwrap();
        assert!(
            restored["step"].as_u64().unwrap() >= parent_step,
            "{tid}: {first}"
        );
        pairs.push((ran_on(by_id[parent]), ran_on(trial)));
    }
    let environments: BTreeSet<String> = trials.iter().map(ran_on).collect();
    assert_eq!(
        environments.len(),
        2,
        "members ran on both sides: {environments:?}"
    );
    pairs
}

/// With `maxTrialNumber` no larger than the population, no successor can ever be created: a
/// member PBT would replace runs on to its end (its final result kept), with a warning, rather
/// than being stopped "replaced by a clone" that never comes.
#[test]
fn a_member_is_not_stopped_for_a_successor_the_trial_budget_leaves_no_room_for() {
    let sandbox = Sandbox::new();
    let config = example(&sandbox);
    let yaml = std::fs::read_to_string(&config)
        .unwrap()
        .replace(
            "trialConcurrency: 8",
            "trialConcurrency: 4\nmaxTrialNumber: 4",
        )
        .replace("population_size: 8", "population_size: 4");
    std::fs::write(&config, yaml).unwrap();
    let (code, stdout, stderr) = run(&mut create(&sandbox, &config, "budget", "0.02"));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("budget");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "{export:#}");
    for trial in trials {
        assert_eq!(trial["status"], "SUCCEEDED", "{trial:#}");
        assert!(trial["final"].is_number(), "{trial:#}");
    }
    let text = serde_json::to_string(&export["warnings"]).unwrap();
    assert!(
        text.contains("asked to replace this member, but maxTrialNumber leaves no trial for its successor; it runs on"),
        "PBT never tried to replace a member: {text}"
    );
}

/// Members are processes side by side: with `trialConcurrency` below `population_size` the first
/// members are ranked among themselves while the others have not started. The run goes on (the
/// README asks for enough places) but says so once, rather than quietly running a smaller
/// population.
#[test]
fn ranking_a_population_that_has_not_all_started_is_warned_once() {
    let sandbox = Sandbox::new();
    let config = example(&sandbox);
    let yaml = std::fs::read_to_string(&config)
        .unwrap()
        .replace(
            "trialConcurrency: 8",
            "trialConcurrency: 2\nmaxTrialNumber: 6",
        )
        .replace("population_size: 8", "population_size: 4");
    std::fs::write(&config, yaml).unwrap();
    let (code, stdout, stderr) = run(&mut create(&sandbox, &config, "partial", "0.02"));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    // A plugin's warnings are the process's own lines (stderr; a detached run's log).
    let warning = "ranking 2 members while only 2 of population_size 4 have started";
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");
    assert!(stderr.contains("make both at least 4"), "{stderr}");
}
