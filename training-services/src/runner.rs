//! Runs one trial from start to end: prepares its directory, starts its process group, feeds
//! every protocol into its [`TrialRecorder`], stops it on request, and reports its end.
//!
//! Nothing here is specific to the local machine: the local service uses it directly, and the
//! knob-agent will use it inside remote environments.
//!
//! Architecture invariant: a trial's `TrialEnded` is emitted after its process has exited,
//! its stdout has been read to the end, and its metric files have been read one last time, so
//! every metric it wrote before exiting reaches the core before its end.

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knob_plugin_api::service::{ServiceEvent, TrialRequest};
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdout};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::knob_protocol::{self as knob, LineSource};
use crate::metrics::{Emit, LineScanner, ScannedLine, TrialRecorder, MAX_METRIC_BYTES};
use crate::nni_file;
use crate::nni_http::ChannelServer;
use crate::process::{
    new_trial_run_mark, open_trial_file, spawn_in_own_group, stderr_tail, BeforeSpawn, Leader,
    TrialTree, TRIAL_RUN_ENV,
};
use crate::tail::{tail_files, FileTail, FileWatcher};
use crate::trial_python;

/// Files in a trial's directory that the runner writes.
pub const STDOUT_FILE_NAME: &str = "stdout";
pub const STDERR_FILE_NAME: &str = "stderr";

/// How often, while a finished trial's leftover processes are given their grace period, its
/// processes are looked at again: no event says when a process that is not our child exits.
const LEFTOVER_RECHECK: Duration = Duration::from_millis(50);

/// How long, at most, a trial's end waits for its processes to be gone once they were sent
/// SIGKILL (or the grace period, if longer). A killed process still has to be given a CPU to
/// exit on: on the 2-vCPU VM under load, one in a session of its own waited up to 5 s (the 1 s
/// allowed before ended its trial while it still ran). What still runs after this is stuck in
/// the kernel (an uninterruptible wait) and is warned about.
const LEFTOVER_KILL_PATIENCE: Duration = Duration::from_secs(30);

/// How often a running trial's resident memory is sampled when it has a memory request
/// (`TrialResources::memory_mib`), over which it is killed: one scan of `/proc` per trial and
/// interval; an allocation that rises and falls between two samples is not seen.
pub const MEMORY_SAMPLE_INTERVAL: Duration = Duration::from_millis(200);
/// Without a request, only its peak is learned (reported at its end as `TrialUsage`, for a
/// larger request after the kernel's OOM killer ended it): a slower pace costs less.
pub const PEAK_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// When a trial's memory is sampled first, after its spawn: a trial that ends sooner reports no
/// peak (`TrialUsage` with none).
pub const FIRST_MEMORY_SAMPLE: Duration = Duration::from_millis(50);

const MIB: u64 = 1024 * 1024;

/// NVML, opened once for every trial of the process; `None` where there is no NVIDIA driver
/// (or it cannot be read): a trial's GPU memory is then unknown, silently.
fn nvml() -> Option<&'static knob_gpu_sched::probe::NvmlProbe> {
    static NVML: std::sync::OnceLock<Option<knob_gpu_sched::probe::NvmlProbe>> =
        std::sync::OnceLock::new();
    NVML.get_or_init(|| knob_gpu_sched::probe::NvmlProbe::init().ok())
        .as_ref()
}

/// Simulation only (`KNOB_SIMULATE_GPUS`): the variable naming the file in which a trial on
/// simulated GPUs writes how much GPU memory it uses now, in MiB (`echo 3000 >
/// "$KNOB_SIMULATED_GPU_MEMORY_FILE"`). Simulated GPUs have no processes for NVML to list, so
/// this file stands in for NVML's per-process figures: the runner samples it as it would
/// sample NVML, for the trial's GPU memory peak and its `trialGpuMemory` kill. Set only for a
/// trial given GPUs while the service simulates them; never read on real GPUs.
pub const SIMULATED_GPU_MEMORY_FILE_ENV: &str = "KNOB_SIMULATED_GPU_MEMORY_FILE";
const SIMULATED_GPU_MEMORY_FILE_NAME: &str = "simulated-gpu-memory-mib";

/// Whether this process's GPUs are simulated (`KNOB_SIMULATE_GPUS`, read once, as the probe
/// reads it).
fn simulating_gpus() -> bool {
    static SIMULATING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SIMULATING.get_or_init(|| {
        matches!(
            knob_gpu_sched::probe::SimulatedInventory::from_env(),
            Ok(Some(_))
        )
    })
}

/// Where a trial's GPU memory is read from.
#[derive(Clone, Debug)]
enum GpuUsageSource {
    /// Nowhere: the trial was given no GPU (`CUDA_VISIBLE_DEVICES` empty hides them all), so
    /// NVML is not asked at every sample for processes that cannot be there.
    NoGpu,
    /// NVML's compute processes, matched against the trial's process group.
    Nvml,
    /// Simulated GPUs: the file the trial writes (see [`SIMULATED_GPU_MEMORY_FILE_ENV`]).
    SimulatedFile(PathBuf),
}

/// The GPU memory (bytes) the trial's processes use now on its fullest GPU, from NVML's
/// compute processes (or, on simulated GPUs, from the trial's file); `None` without NVML or
/// when none of them is listed.
fn sample_gpu_memory(tree: &TrialTree, source: &GpuUsageSource) -> Option<u64> {
    match source {
        GpuUsageSource::NoGpu => return None,
        GpuUsageSource::SimulatedFile(path) => {
            let file = open_trial_file(path, std::fs::OpenOptions::new().read(true)).ok()?;
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::Read::take(file, 4096), &mut text).ok()?;
            return simulated_gpu_memory(&text);
        }
        GpuUsageSource::Nvml => {}
    }
    let probe = nvml()?;
    let processes = probe.compute_processes_by_gpu();
    if processes.is_empty() {
        return None;
    }
    knob_gpu_sched::probe::trial_gpu_memory(&tree.group_pids(), &processes).map(|b| b.0)
}

/// The bytes a trial's simulated-GPU file says it uses (MiB, a whole number). A size past what
/// bytes can count is as far over any request as can be (it used to overflow the multiply and
/// panic the thread that watches the trials, and the trial was recorded as succeeded).
fn simulated_gpu_memory(text: &str) -> Option<u64> {
    let mib: u64 = text.trim().parse().ok()?;
    (mib > 0).then(|| mib.saturating_mul(MIB))
}

/// What the trials of one service share.
pub struct TrialHost {
    /// `NNI_PLATFORM` for the trials ("local").
    pub platform: String,
    /// SIGTERM to SIGKILL.
    pub grace_period: Duration,
    pub channels: Arc<ChannelServer>,
    pub watcher: Arc<FileWatcher>,
    pub emit: Emit,
}

/// A trial that could not start; no event follows for it.
#[derive(Debug, thiserror::Error)]
pub enum TrialError {
    #[error("trial {trial_id}: trialCodeDirectory {} does not exist or is not a directory", code_dir.display())]
    CodeDirectory { trial_id: String, code_dir: PathBuf },
    #[error("trial {trial_id}: cannot prepare {}: {source}{}", path.display(), crate::process::start_failure_note(source))]
    TrialDirectory {
        trial_id: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("trial {trial_id}: cannot start /bin/bash in {}: {source}{}", code_dir.display(), crate::process::start_failure_note(source))]
    Spawn {
        trial_id: String,
        code_dir: PathBuf,
        source: std::io::Error,
    },
}

/// A started trial, as its service holds it.
pub struct TrialHandle {
    kill: Mutex<Option<oneshot::Sender<String>>>,
    pid: Option<u32>,
}

impl TrialHandle {
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Asks the trial to stop (SIGTERM to its group, SIGKILL after the grace period). The
    /// first reason given is the one its `TrialEnded` carries; later calls do nothing.
    pub fn kill(&self, reason: &str) {
        let sender = self.kill.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(sender) = sender {
            let _ = sender.send(reason.to_string());
        }
    }
}

/// The paths of one trial's directory.
struct TrialPaths {
    dir: PathBuf,
    code_dir: PathBuf,
    stdout: PathBuf,
    stderr: PathBuf,
    nni_parameters: PathBuf,
    nni_metrics: PathBuf,
    knob_parameters: PathBuf,
    knob_metrics: PathBuf,
}

impl TrialPaths {
    fn new(request: &TrialRequest) -> std::io::Result<TrialPaths> {
        // Trials run in their code directory; a relative path would point somewhere else there.
        let dir = std::path::absolute(&request.trial_dir)?;
        let nni_dir = dir.join(nni_file::METRICS_DIR_NAME);
        Ok(TrialPaths {
            code_dir: std::path::absolute(&request.code_dir)?,
            stdout: dir.join(STDOUT_FILE_NAME),
            stderr: dir.join(STDERR_FILE_NAME),
            nni_parameters: dir.join(nni_file::PARAMETER_FILE_NAME),
            nni_metrics: nni_dir.join(nni_file::METRICS_FILE_NAME),
            knob_parameters: dir.join(knob::PARAMETERS_FILE_NAME),
            knob_metrics: dir.join(knob::METRICS_FILE_NAME),
            dir,
        })
    }
}

/// Writes the trial's directory, opens its channels and starts its process; the rest runs on
/// `runtime`. `before_end` runs once its processes are gone, just before its `TrialEnded` is
/// emitted (what it held is free by the time the core hears of the end); `on_finished` runs
/// after.
pub fn start_trial(
    host: &Arc<TrialHost>,
    runtime: &tokio::runtime::Handle,
    request: &TrialRequest,
    before_end: Box<dyn FnOnce() + Send>,
    on_finished: Box<dyn FnOnce() + Send>,
) -> Result<TrialHandle, TrialError> {
    let trial_id = request.trial_id.clone();
    let dir_error = |path: &Path, source| TrialError::TrialDirectory {
        trial_id: trial_id.clone(),
        path: path.to_path_buf(),
        source,
    };
    let paths = TrialPaths::new(request).map_err(|e| dir_error(&request.trial_dir, e))?;
    if !paths.code_dir.is_dir() {
        return Err(TrialError::CodeDirectory {
            trial_id,
            code_dir: paths.code_dir,
        });
    }
    let parameter_record = nni_file::parameter_record(
        request.parameter_id,
        request.parameter_label.as_deref(),
        &request.parameters,
    );
    let (stderr, python_folder) = prepare_directory(&paths, request, &parameter_record)?;
    let stdout_file = File::create(&paths.stdout).map_err(|e| dir_error(&paths.stdout, e))?;

    let recorder = TrialRecorder::watching_checkpoints(
        &trial_id,
        host.emit.clone(),
        Some(trial_python::checkpoint_dir(&paths.dir)),
    );
    let env_id = request.environment_id.clone();
    host.channels
        .register(&env_id, recorder.clone(), parameter_record);
    let channel_url = host.channels.url_for(&env_id, &trial_id);
    let mark = new_trial_run_mark();
    let mut env = trial_environment(host, request, &paths, &python_folder, channel_url);
    env.push((TRIAL_RUN_ENV.to_string(), mark.clone().into()));
    let has_gpus = request
        .gpu_indices
        .as_ref()
        .is_some_and(|gpus| !gpus.is_empty());
    // `None`: no placement decided (a service without GPU scheduling); every GPU is visible.
    let given_none = request.gpu_indices.as_ref().is_some_and(Vec::is_empty);
    let gpu_usage = if given_none {
        GpuUsageSource::NoGpu
    } else if has_gpus && simulating_gpus() {
        let file = paths.dir.join(SIMULATED_GPU_MEMORY_FILE_NAME);
        env.push((
            SIMULATED_GPU_MEMORY_FILE_ENV.to_string(),
            file.clone().into(),
        ));
        GpuUsageSource::SimulatedFile(file)
    } else {
        GpuUsageSource::Nvml
    };

    let not_before = BeforeSpawn::now();
    let spawned = {
        let _in_runtime = runtime.enter();
        spawn_in_own_group(&request.command, &paths.code_dir, &env, stderr)
    };
    let (mut child, leader) = match spawned {
        Ok(spawned) => spawned,
        Err(source) => {
            host.channels.unregister(&env_id, &trial_id);
            return Err(TrialError::Spawn {
                trial_id,
                code_dir: paths.code_dir,
                source,
            });
        }
    };
    let pid = child.id();
    recorder.started(pid);
    let stdout = child.stdout.take();
    let stdout_task = runtime.spawn(pump_stdout(
        stdout,
        tokio::fs::File::from_std(stdout_file),
        recorder.clone(),
    ));
    let (finish_tails, tails_finish) = oneshot::channel();
    let tails = vec![
        FileTail::knob_lines(paths.knob_metrics.clone()),
        FileTail::nni_records(paths.nni_metrics.clone()),
        FileTail::nni_trial_log(paths.dir.join(knob::NNI_TRIAL_LOG_FILE_NAME)),
    ];
    let tail_task = runtime.spawn(tail_files(
        tails,
        recorder.clone(),
        host.watcher.clone(),
        tails_finish,
    ));
    let (kill, kill_requests) = oneshot::channel();
    let tree = TrialTree::new(pid, &mark, not_before);
    let peak_memory = Arc::new(AtomicU64::new(0));
    let peak_gpu_memory = Arc::new(AtomicU64::new(0));
    let memory_task = runtime.spawn(watch_memory(
        tree.clone(),
        MemoryLimits {
            host_mib: request.resources.memory_mib,
            // A GPU memory request binds only a trial that has GPUs.
            gpu_mib: request.resources.gpu_memory_mib.filter(|_| has_gpus),
        },
        gpu_usage,
        paths.stderr.clone(),
        peak_memory.clone(),
        peak_gpu_memory.clone(),
    ));
    let supervision = Supervision {
        host: host.clone(),
        child,
        _leader: leader,
        tree,
        memory_task,
        peak_memory,
        peak_gpu_memory,
        recorder,
        stdout_task,
        tail_task,
        finish_tails,
        kill_requests,
        env_id,
        stderr_path: paths.stderr,
        before_end,
        on_finished,
    };
    runtime.spawn(supervision.run());
    Ok(TrialHandle {
        kill: Mutex::new(Some(kill)),
        pid,
    })
}

/// Creates the trial's directory and protocol files, and returns its stderr file and the folder
/// to put first on its PYTHONPATH (shared with the experiment's other trials on this host,
/// written by the first of them).
///
/// The two metric files (`metrics.knob`, `.nni/metrics`) are not created here: a trial that
/// writes one creates it (`>>`, NNI's `open(..., 'wb')`), and one that runs on past
/// [`crate::tail::WATCH_AFTER`] gets them created, empty, when they are watched. A short trial
/// that reports on stdout or over HTTP costs two inodes fewer (on a file system where creating
/// one is dear, such as ext4 without a journal, which skips recently freed inodes one by one).
/// `.nni` is still created, before the start: NNI's trial side creates it only after checking
/// that it is missing, and would fail if knob created it in between.
fn prepare_directory(
    paths: &TrialPaths,
    request: &TrialRequest,
    parameter_record: &str,
) -> Result<(File, PathBuf), TrialError> {
    let fail = |path: &Path, source| TrialError::TrialDirectory {
        trial_id: request.trial_id.clone(),
        path: path.to_path_buf(),
        source,
    };
    let nni_dir = paths.dir.join(nni_file::METRICS_DIR_NAME);
    std::fs::create_dir_all(&nni_dir).map_err(|e| fail(&nni_dir, e))?;
    let write =
        |path: &Path, contents: &str| std::fs::write(path, contents).map_err(|e| fail(path, e));
    write(&paths.nni_parameters, parameter_record)?;
    write(&paths.knob_parameters, &request.parameters.to_string())?;
    let python_folder =
        trial_python::shared_folder(&paths.dir, trial_python::shim_wanted(&request.env))
            .map_err(|(folder, e)| fail(&folder, e))?;
    let stderr = File::create(&paths.stderr).map_err(|e| fail(&paths.stderr, e))?;
    Ok((stderr, python_folder))
}

/// The variables the trial gets on top of knob's own environment. Later entries win, so the
/// protocol variables cannot be overridden by the request's `env` by mistake.
fn trial_environment(
    host: &TrialHost,
    request: &TrialRequest,
    paths: &TrialPaths,
    python_folder: &Path,
    channel_url: String,
) -> Vec<(String, OsString)> {
    let mut env: Vec<(String, OsString)> = request
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.into()))
        .collect();
    let mut set = |name: &str, value: OsString| env.push((name.to_string(), value));
    set("NNI_PLATFORM", host.platform.clone().into());
    set("NNI_EXP_ID", request.experiment_id.clone().into());
    set("NNI_TRIAL_JOB_ID", request.trial_id.clone().into());
    set("NNI_SYS_DIR", paths.dir.clone().into());
    set("NNI_OUTPUT_DIR", paths.dir.clone().into());
    set("NNI_TRIAL_SEQ_ID", request.sequence.to_string().into());
    set("NNI_CODE_DIR", paths.code_dir.clone().into());
    set("NNI_TRIAL_COMMAND_CHANNEL", channel_url.into());
    set(knob::TRIAL_ID_ENV, request.trial_id.clone().into());
    set(knob::TRIAL_DIR_ENV, paths.dir.clone().into());
    let parameters = request.parameters.to_string();
    if parameters.len() <= knob::MAX_ENV_PARAMETERS_BYTES {
        set(knob::PARAMETERS_ENV, parameters.into());
    }
    set(
        knob::PARAMETERS_FILE_ENV,
        paths.knob_parameters.clone().into(),
    );
    set(knob::METRICS_FILE_ENV, paths.knob_metrics.clone().into());
    set(
        trial_python::CHECKPOINT_DIR_ENV,
        trial_python::checkpoint_dir(&paths.dir).into(),
    );
    if let Some(donor) = request.env.get(trial_python::RESTORE_TRIAL_ENV) {
        if let Some(path) = trial_python::restore_dir(&paths.dir, donor) {
            set(trial_python::RESTORE_FROM_ENV, path.into());
        }
    }
    let inherited_python_path = request
        .env
        .get("PYTHONPATH")
        .map(OsString::from)
        .or_else(|| std::env::var_os("PYTHONPATH"));
    set(
        "PYTHONPATH",
        trial_python::python_path(python_folder, inherited_python_path),
    );
    // An empty list hides every GPU, which is what a trial given none should see.
    for (name, value) in knob_gpu_sched::cuda_environment(request.gpu_indices.as_deref()) {
        set(name, value.into());
    }
    env
}

/// Copies the trial's stdout to its file and reads knob protocol lines from it.
async fn pump_stdout(
    stdout: Option<ChildStdout>,
    mut file: tokio::fs::File,
    recorder: Arc<TrialRecorder>,
) {
    let Some(mut stdout) = stdout else { return };
    let mut scanner = LineScanner::new(knob::LINE_PREFIX, MAX_METRIC_BYTES);
    let mut on_line = |line: ScannedLine<'_>| match line {
        ScannedLine::Line(line) => knob::handle_line(&recorder, LineSource::Stdout, line),
        ScannedLine::TooLong => {
            knob::warn_too_long(&recorder, LineSource::Stdout, MAX_METRIC_BYTES)
        }
    };
    // Read into its spare capacity (`read_buf`), never zeroed: zeroing 64 KiB for each trial
    // (`vec![0; ..]`) cost more than a short trial's whole stdout.
    let mut buffer: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut file_ok = true;
    loop {
        buffer.clear();
        let read = match stdout.read_buf(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if file_ok {
            if let Err(e) = file.write_all(&buffer[..read]).await {
                file_ok = false;
                recorder.warn(format_args!("cannot write its stdout file: {e}"));
            }
        }
        scanner.feed(&buffer[..read], &mut on_line);
    }
    scanner.finish(&mut on_line);
    let _ = file.flush().await;
}

/// The memory a trial asked for, beyond which it is killed as out of memory.
#[derive(Clone, Copy, Debug)]
struct MemoryLimits {
    /// Host memory (MiB): `trialMemorySize`, or more after an out-of-memory end.
    host_mib: Option<u64>,
    /// GPU memory (MiB) on its fullest GPU: `trialGpuMemory`, or more after an out-of-GPU-memory
    /// end; only for a trial given GPUs.
    gpu_mib: Option<u64>,
}

/// Samples the trial's resident memory into `peak` (and its GPU memory into `peak_gpu`) until
/// aborted; past a limit it notes why in the trial's stderr and kills the whole trial with
/// SIGKILL, as the kernel's OOM killer would (the core then counts it as out of memory, or out
/// of GPU memory, `maxOomRetries`). A trial over its GPU memory request is killed because on a
/// GPU shared by several trials (`maxTrialNumberPerGpu`, other experiments) it would take
/// memory promised to them, and they, not it, would fail.
async fn watch_memory(
    tree: TrialTree,
    limits: MemoryLimits,
    gpu_usage: GpuUsageSource,
    stderr: PathBuf,
    peak: Arc<AtomicU64>,
    peak_gpu: Arc<AtomicU64>,
) {
    let every = if limits.host_mib.is_some() || limits.gpu_mib.is_some() {
        MEMORY_SAMPLE_INTERVAL
    } else {
        PEAK_SAMPLE_INTERVAL
    };
    // Not at once: at its spawn a trial is a `bash` that has just started, nothing worth a
    // scan of `/proc`, and a trial that ends within the delay (most of `trial_overhead.sh`'s)
    // is never sampled. After that, on the ticks every trial's sampler shares (one reading of
    // `/proc` serves them all, see `process::next_sample_tick`).
    let mut next = Instant::now() + FIRST_MEMORY_SAMPLE;
    loop {
        tokio::time::sleep_until(next).await;
        next = crate::process::next_sample_tick(Instant::now(), every);
        let sampled = tree.clone();
        let source = gpu_usage.clone();
        let Ok((used, gpu_used)) = tokio::task::spawn_blocking(move || {
            (
                sampled.resident_bytes(),
                sample_gpu_memory(&sampled, &source),
            )
        })
        .await
        else {
            return;
        };
        peak.fetch_max(used, Ordering::Relaxed);
        if let Some(gpu_used) = gpu_used {
            peak_gpu.fetch_max(gpu_used, Ordering::Relaxed);
        }
        let over = match (limits.host_mib, limits.gpu_mib, gpu_used) {
            (Some(limit), _, _) if used > limit * MIB => Some(format!(
                "knob: the trial used {} MiB of memory, more than its {limit} MiB request (trialMemorySize); killed as out of memory\n",
                used.div_ceil(MIB)
            )),
            (_, Some(limit), Some(gpu_used)) if gpu_used > limit * MIB => Some(format!(
                "knob: the trial used {} MiB of GPU memory, more than its {limit} MiB request (trialGpuMemory); killed as out of GPU memory\n",
                gpu_used.div_ceil(MIB)
            )),
            _ => None,
        };
        if let Some(note) = over {
            if let Ok(mut file) = open_trial_file(&stderr, std::fs::OpenOptions::new().append(true))
            {
                let _ = std::io::Write::write_all(&mut file, note.as_bytes());
            }
            tree.signal(Signal::SIGKILL).await;
            return;
        }
    }
}

/// Everything the task that watches over one trial owns.
struct Supervision {
    host: Arc<TrialHost>,
    child: Child,
    /// Keeps the leader's pid known as knob's until the trial's last scan is done.
    _leader: Leader,
    /// The trial's process group and the processes that left it.
    tree: TrialTree,
    memory_task: JoinHandle<()>,
    /// Bytes, the largest resident memory sampled.
    peak_memory: Arc<AtomicU64>,
    /// Bytes, the largest GPU memory sampled on one GPU (NVML); 0: unknown or none.
    peak_gpu_memory: Arc<AtomicU64>,
    recorder: Arc<TrialRecorder>,
    stdout_task: JoinHandle<()>,
    /// Its result: the metric files it watched.
    tail_task: JoinHandle<Vec<PathBuf>>,
    finish_tails: oneshot::Sender<()>,
    kill_requests: oneshot::Receiver<String>,
    env_id: String,
    stderr_path: PathBuf,
    before_end: Box<dyn FnOnce() + Send>,
    on_finished: Box<dyn FnOnce() + Send>,
}

impl Supervision {
    async fn run(mut self) {
        let grace = self.host.grace_period;
        let tree = self.tree.clone();

        let mut leader = None;
        let mut stdout_open = true;
        let mut listening_for_kill = true;
        let mut killed_reason = None;
        // Set when the group got SIGTERM (or, with nothing left to signal, when the leader
        // exited): at this instant whatever is left of the group gets SIGKILL.
        let mut hard_kill_at: Option<Instant> = None;
        let mut hard_killed = false;
        // After SIGKILL, how long stdout may stay open (held by a process that left the group).
        let mut stdout_give_up_at: Option<Instant> = None;
        // Set once a scan after the leader's exit found none of the trial's processes: none
        // can appear again (only a live process starts others), so it is not scanned again.
        let mut gone = false;
        loop {
            if leader.is_some() {
                // The trial is over when its leader has exited: processes it left behind are
                // stopped like a killed trial's, then the trial ends.
                let alive = !hard_killed && !gone && tree.alive().await;
                gone |= !hard_killed && !alive;
                if !stdout_open && !alive {
                    break;
                }
                if hard_kill_at.is_none() {
                    if alive {
                        tree.signal(Signal::SIGTERM).await;
                    }
                    hard_kill_at = Some(Instant::now() + grace);
                }
            }
            let far = Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                status = self.child.wait(), if leader.is_none() => leader = Some(status),
                _ = &mut self.stdout_task, if stdout_open => stdout_open = false,
                reason = &mut self.kill_requests, if listening_for_kill => {
                    listening_for_kill = false;
                    // A kill that comes after the leader exited changes nothing: it ended on its own.
                    if let (Ok(reason), None) = (reason, &leader) {
                        killed_reason = Some(reason);
                        if hard_kill_at.is_none() {
                            tree.signal(Signal::SIGTERM).await;
                            hard_kill_at = Some(Instant::now() + grace);
                        }
                    }
                }
                _ = tokio::time::sleep_until(hard_kill_at.unwrap_or(far)),
                    if hard_kill_at.is_some() && !hard_killed => {
                    tree.signal(Signal::SIGKILL).await;
                    hard_killed = true;
                    stdout_give_up_at = Some(Instant::now() + grace);
                }
                _ = tokio::time::sleep_until(stdout_give_up_at.unwrap_or(far)),
                    if stdout_open && stdout_give_up_at.is_some() => {
                    self.stdout_task.abort();
                    stdout_open = false;
                    self.recorder.warn(
                        "a process that left the trial's process group still holds its stdout; stopped reading it",
                    );
                }
                _ = tokio::time::sleep(LEFTOVER_RECHECK),
                    if leader.is_some() && !stdout_open && !hard_killed => {}
            }
        }

        // Nothing the trial started outlives its end: what is still alive after the signals
        // above (after SIGKILL they are not looked at again; a marked process may have forked
        // while they were sent) gets SIGKILL until none is left, for a bounded time.
        let sweep_until = Instant::now() + grace.max(LEFTOVER_KILL_PATIENCE);
        while !gone && self.tree.alive().await {
            if Instant::now() >= sweep_until {
                self.recorder.warn(
                    "a process the trial started is still alive after SIGKILL (stuck in the kernel?)",
                );
                break;
            }
            self.tree.signal(Signal::SIGKILL).await;
            tokio::time::sleep(LEFTOVER_RECHECK).await;
        }

        let (exit_code, signal_number) = match leader {
            Some(Ok(status)) => (status.code(), status.signal()),
            Some(Err(e)) => {
                self.recorder
                    .warn(format_args!("cannot read its exit status: {e}"));
                (None, None)
            }
            None => (None, None),
        };
        let _ = self.finish_tails.send(());
        let watched = (&mut self.tail_task).await.unwrap_or_default();
        self.memory_task.abort();
        let stderr_tail = stderr_tail(&self.stderr_path);
        knob::warn_metric_on_stderr(&self.recorder, &stderr_tail);
        if exit_code != Some(0) && killed_reason.is_none() {
            // A trial that failed on a full disk often could not write why (Python exits 120
            // when even its traceback cannot be flushed): its end alone said "exit code 120".
            if let Some(free) = crate::process::nearly_full(&self.stderr_path) {
                self.recorder.warn(format_args!(
                    "the disk under the trial's folder is full ({free} bytes free): the trial may have failed for it, and what it wrote there, its errors too, may be cut short"
                ));
            }
        }
        let peak = self.peak_memory.load(Ordering::Relaxed);
        let peak_gpu = self.peak_gpu_memory.load(Ordering::Relaxed);
        (self.host.emit)(ServiceEvent::TrialUsage {
            trial_id: self.recorder.trial_id().to_string(),
            peak_memory_mib: (peak > 0).then(|| peak.div_ceil(MIB)),
            peak_gpu_memory_mib: (peak_gpu > 0).then(|| peak_gpu.div_ceil(MIB)),
        });
        (self.before_end)();
        // Closed before the end is emitted, so that once the core has seen the end, the
        // channel answers "not running" to anything more.
        self.host
            .channels
            .unregister(&self.env_id, self.recorder.trial_id());
        self.recorder.end(ServiceEvent::TrialEnded {
            trial_id: self.recorder.trial_id().to_string(),
            exit_code,
            signal: signal_number,
            killed_reason,
            stderr_tail,
            ended_ms: None,
            environment_lost: None,
        });
        for path in &watched {
            self.host.watcher.unwatch(path);
        }
        (self.on_finished)();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_gpu_memory_file_is_read_in_mib_and_saturates() {
        assert_eq!(simulated_gpu_memory("3000\n"), Some(3000 * MIB));
        assert_eq!(simulated_gpu_memory("0"), None);
        assert_eq!(simulated_gpu_memory("abc"), None);
        assert_eq!(simulated_gpu_memory("17592186044416"), Some(u64::MAX));
        assert_eq!(simulated_gpu_memory(&u64::MAX.to_string()), Some(u64::MAX));
    }
}
