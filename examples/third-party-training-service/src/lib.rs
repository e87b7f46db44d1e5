//! `platform: nice`, a third-party knob training service: each trial runs on this machine as
//! `nice -n <niceLevel> /bin/bash -c <trialCommand>`, so that tuning never slows down what else
//! the machine does. It is an example of everything a training service gives knob through
//! `knob-plugin-api` alone:
//!
//! - its own config, checked here ([`check_config`]), with errors that name the field:
//!   ```yaml
//!   trainingService:
//!     platform: nice
//!     niceLevel: 15        # 0 to 19, default 10
//!     apiToken: s3cret     # a secret: knob never stores or shows it
//!   pluginPaths: [path/to/libknob_nice_service.so]
//!   ```
//! - a secret field (`apiToken`, handed to each trial as `NICE_API_TOKEN`, as a service would
//!   pass a credential its trials need); on `knob resume` knob asks for it again, from the
//!   original config file or `NICE_API_TOKEN`;
//! - one environment (`nice`) with its inventory, CPUs and memory of this machine, no GPU;
//! - trials' metrics from knob's stdout protocol (`KNOB_INTERMEDIATE <json>`, `KNOB_FINAL
//!   <json>`), and their end;
//! - clean-up on resume of the trials an earlier run left, found by their environment.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use knob_plugin_api::config::ConfigReader;
use knob_plugin_api::service::{
    CheckedConfig, ConfigProblem, Environment, FieldPath, MetricKind, ServiceContext, ServiceEvent,
    TrialRequest,
};
use knob_plugin_api::{EventSink, PluginError, TrainingService};
use serde_json::{json, Map, Value};

/// The one environment's id.
const ENVIRONMENT: &str = "nice";
/// Where `knob resume` finds the token when the original config file is gone.
const TOKEN_VARIABLE: &str = "NICE_API_TOKEN";
const FIELDS: [&str; 2] = ["niceLevel", "apiToken"];

/// Checks a `nice` config: `niceLevel` (0 to 19, default 10) and the secret `apiToken`
/// (required).
pub fn check_config(
    config: &Value,
    context: &ServiceContext,
) -> Result<CheckedConfig, Vec<ConfigProblem>> {
    let mut reader = ConfigReader::new(context);
    let Some(mut fields) = reader.mapping(config, FieldPath::root()) else {
        return reader.finish(Map::new());
    };
    let level = fields.take("niceLevel").and_then(|field| {
        let level = reader.integer::<u32>(&field, 0)?;
        if level > 19 {
            reader.error(
                &field.path,
                format!("must be from 0 to 19 (nice's range), got {level}"),
            );
            return None;
        }
        Some(level)
    });
    let token = fields
        .require(&mut reader, "apiToken", "the token trials use (a secret)")
        .and_then(|field| reader.secret(&field, Some(TOKEN_VARIABLE)));
    fields.finish(&mut reader, &FIELDS);
    let mut canonical = Map::new();
    canonical.insert("niceLevel".into(), json!(level.unwrap_or(10)));
    canonical.insert("apiToken".into(), json!(token));
    reader.finish(canonical)
}

/// A running trial: its process group's id.
type Running = Arc<Mutex<HashMap<String, u32>>>;

pub struct NiceService {
    level: u32,
    token: String,
    events: EventSink,
    running: Running,
    shut_down: bool,
}

impl TrainingService for NiceService {
    fn check_config(
        config: &Value,
        context: &ServiceContext,
    ) -> Result<CheckedConfig, Vec<ConfigProblem>> {
        check_config(config, context)
    }

    fn create(
        config: &Value,
        _context: &ServiceContext,
        events: EventSink,
    ) -> Result<Self, PluginError> {
        // The config is the canonical one `check_config` made, with the secret in clear.
        let level = config["niceLevel"].as_u64().unwrap_or(10) as u32;
        let token = config["apiToken"]
            .as_str()
            .ok_or_else(|| PluginError::new("training service nice: apiToken is missing"))?
            .to_owned();
        Ok(NiceService {
            level,
            token,
            events,
            running: Arc::default(),
            shut_down: false,
        })
    }

    fn clean_up_leftovers(
        _config: &Value,
        context: &ServiceContext,
        trial_ids: &[String],
    ) -> Result<Vec<String>, PluginError> {
        Ok(kill_leftovers(&context.experiment_id, trial_ids))
    }

    fn environments(&mut self) -> Result<Vec<Environment>, PluginError> {
        Ok(vec![Environment {
            id: ENVIRONMENT.into(),
            host: hostname(),
            ready: !self.shut_down,
            inventory: inventory(),
        }])
    }

    fn start_trial(&mut self, request: TrialRequest) -> Result<(), PluginError> {
        if self.shut_down {
            return Err(PluginError::new("training service nice is shut down"));
        }
        std::fs::create_dir_all(&request.trial_dir).map_err(|e| {
            PluginError::new(format!(
                "training service nice: cannot create {}: {e}",
                request.trial_dir.display()
            ))
        })?;
        let mut command = Command::new("nice");
        command
            .arg("-n")
            .arg(self.level.to_string())
            .args(["/bin/bash", "-c", &request.command])
            .current_dir(&request.code_dir)
            .envs(&request.env)
            .env("NICE_API_TOKEN", &self.token)
            .env("NNI_PLATFORM", "nice")
            .env("NNI_EXP_ID", &request.experiment_id)
            .env("NNI_TRIAL_JOB_ID", &request.trial_id)
            .env("NNI_TRIAL_SEQ_ID", request.sequence.to_string())
            .env("NNI_OUTPUT_DIR", &request.trial_dir)
            .env("NNI_SYS_DIR", &request.trial_dir)
            .env("KNOB_PARAMETERS", request.parameters.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(gpus) = &request.gpu_indices {
            let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
            command.env("CUDA_VISIBLE_DEVICES", list.join(","));
        }
        // Its own process group, so that a kill reaches everything the trial started.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn().map_err(|e| {
            PluginError::new(format!("training service nice: cannot run nice: {e}"))
        })?;
        let pid = child.id();
        self.running
            .lock()
            .unwrap()
            .insert(request.trial_id.clone(), pid);
        self.events.emit(&ServiceEvent::TrialStarted {
            trial_id: request.trial_id.clone(),
            pid: Some(pid),
        });
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let events = self.events.clone();
        let running = self.running.clone();
        let trial_id = request.trial_id;
        std::thread::spawn(move || {
            let stderr_reader = std::thread::spawn(move || {
                let mut text = String::new();
                let _ = stderr.read_to_string(&mut text);
                text
            });
            let mut sequences = [0u64, 0u64];
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let (kind, slot, value) = if let Some(v) = line.strip_prefix("KNOB_FINAL ") {
                    (MetricKind::Final, 1, v)
                } else if let Some(v) = line.strip_prefix("KNOB_INTERMEDIATE ") {
                    (MetricKind::Intermediate, 0, v)
                } else {
                    continue;
                };
                events.emit(&ServiceEvent::Metric {
                    trial_id: trial_id.clone(),
                    kind,
                    sequence: sequences[slot],
                    value: value.trim().to_owned(),
                });
                sequences[slot] += 1;
            }
            let status = child.wait();
            let stderr_text = stderr_reader.join().unwrap_or_default();
            let killed_reason = running.lock().unwrap().remove(&trial_id).is_none();
            let (exit_code, signal) = match status {
                Ok(status) => (
                    status.code(),
                    std::os::unix::process::ExitStatusExt::signal(&status),
                ),
                Err(_) => (None, None),
            };
            let tail: Vec<&str> = stderr_text.lines().rev().take(20).collect();
            events.emit(&ServiceEvent::TrialEnded {
                trial_id,
                exit_code,
                signal,
                killed_reason: killed_reason.then(|| "killed by knob".to_owned()),
                stderr_tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                ended_ms: None,
                environment_lost: None,
            });
        });
        Ok(())
    }

    fn kill_trial(&mut self, trial_id: &str, _reason: &str) -> Result<(), PluginError> {
        // Removed first: the trial's thread then reports it as killed.
        if let Some(group) = self.running.lock().unwrap().remove(trial_id) {
            kill_group(group);
        }
        Ok(())
    }

    fn shutdown(&mut self) -> Result<(), PluginError> {
        self.shut_down = true;
        let groups: Vec<u32> = self
            .running
            .lock()
            .unwrap()
            .drain()
            .map(|(_, g)| g)
            .collect();
        for group in groups {
            kill_group(group);
        }
        Ok(())
    }
}

fn kill_group(group: u32) {
    // `kill -KILL -- -GROUP`: the trial's whole process group.
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status();
}

/// Ends what an earlier run of the experiment left of these trials: processes whose environment
/// names the experiment and the trial (set for every trial), found in `/proc`, never by a
/// recorded pid, which another process may have by now.
fn kill_leftovers(experiment_id: &str, trial_ids: &[String]) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let experiment = format!("NNI_EXP_ID={experiment_id}");
    let mut reports = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(environ) = read_environ(&entry.path().join("environ")) else {
            continue;
        };
        let variables: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        let ours = variables.contains(&experiment.as_bytes())
            && variables.contains(&b"NNI_PLATFORM=nice".as_slice());
        let trial = trial_ids.iter().find(|id| {
            variables
                .iter()
                .any(|v| *v == format!("NNI_TRIAL_JOB_ID={id}").as_bytes())
        });
        if let (true, Some(trial)) = (ours, trial) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            reports.push(format!(
                "training service nice: ended process {pid} of trial {trial} left from an earlier run"
            ));
        }
    }
    reports
}

/// A `/proc/<pid>/environ` in one `read(2)` where it fits 128 KiB: the kernel reads it from the
/// memory the process had when the file was opened and gives nothing once that is gone, so a
/// process that execs between two smaller reads (`std::fs::read` starts with 32 bytes) would
/// show only the start of its environment.
fn read_environ(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    let mut environ = vec![0; 128 * 1024];
    let mut length = 0;
    loop {
        match file.read(&mut environ[length..]) {
            Ok(0) => break,
            Ok(n) => length += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if length == environ.len() {
            environ.resize(length * 2, 0);
        }
    }
    environ.truncate(length);
    Ok(environ)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
}

/// This machine as knob-gpu-sched's inventory JSON: its CPUs and memory, no GPU.
fn inventory() -> Value {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    json!({
        "id": ENVIRONMENT,
        "host": hostname(),
        "status": {"state": "ready"},
        "gpus": [],
        "gpu_source": {"source": "unavailable", "reason": "the nice service runs trials without GPUs"},
        "host_resources": {
            "cpu_count": cpus,
            "cpu_utilization_percent": null,
            "memory_total": kib("MemTotal:") * 1024,
            "memory_available": kib("MemAvailable:") * 1024,
        },
        "limits": {},
    })
}

knob_plugin_api::export_plugin! {
    training_service "nice": NiceService = "runs each trial on this machine under nice, at a configurable niceness";
}
