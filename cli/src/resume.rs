//! `knob resume` and `knob stop`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use knob_core::config::ExperimentConfig;
use knob_core::manager::{self, Experiment};
use knob_core::registry::{Registry, RegistryEntry, CRASHED};
use knob_core::store::{ExperimentState, ExperimentStatus, Store, StoreEvent};
use knob_plugin_api::host::PluginRegistry;
use knob_plugin_api::service::ServiceContext;
use serde_json::Value;

use crate::create::{preflight, run_in_foreground, Launch, Started};
use crate::serve::ServeArgs;

#[derive(clap::Args)]
pub struct ResumeArgs {
    id: String,
    /// Raise (or set) maxTrialNumber, e.g. to continue a finished experiment.
    #[arg(long, value_parser = parse_max_trial_number)]
    max_trial_number: Option<u64>,
    /// Raise (or set) maxExperimentDuration (`30m`, `2h`, or seconds); time already spent counts.
    #[arg(long, value_parser = parse_duration)]
    max_experiment_duration: Option<Duration>,
    /// Replace the search space with this file's (JSON or YAML, as `knob update searchspace`
    /// takes), e.g. for one the tuner refused.
    #[arg(long, value_name = "FILE")]
    search_space: Option<std::path::PathBuf>,
    /// Run in the background; print where the log goes (appended to the experiment's log).
    #[arg(long)]
    detach: bool,
    #[command(flatten)]
    serve: ServeArgs,
}

/// A trial budget as `knob create` and `knob update trialnum` take it: 0 is refused there, and
/// was stored here (for an experiment killed before its first trial), a config no create takes.
fn parse_max_trial_number(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("must be at least 1, got 0".to_string()),
        Ok(max) => Ok(max),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    knob_core::config::duration_text_seconds(text).map(Duration::from_secs)
}

pub fn resume(args: ResumeArgs) -> anyhow::Result<ExitCode> {
    args.serve.check()?;
    let registry = Registry::open_default()?;
    let entry = registry.get(&args.id)?;
    if let Some(pid) = entry.running_pid().filter(|&pid| pid != std::process::id()) {
        return Err(crate::experiment::still_held(&entry, pid));
    }
    crate::experiment::refuse_gone(&entry)?;
    if args.detach {
        let mut command: Vec<std::ffi::OsString> = vec!["resume".into(), args.id.clone().into()];
        if let Some(max) = args.max_trial_number {
            command.extend(["--max-trial-number".into(), max.to_string().into()]);
        }
        if let Some(max) = args.max_experiment_duration {
            command.extend([
                "--max-experiment-duration".into(),
                max.as_secs().to_string().into(),
            ]);
        }
        if let Some(file) = &args.search_space {
            // The detached run may start elsewhere than here.
            let file = std::path::absolute(file).unwrap_or_else(|_| file.clone());
            command.extend(["--search-space".into(), file.into_os_string()]);
        }
        command.extend(args.serve.to_args().into_iter().map(Into::into));
        return crate::create::run_detached(&args.id, command, &args.serve);
    }
    // Bound before the store is changed (--max-trial-number, --max-experiment-duration): a
    // busy --port fails with the experiment as it was.
    let listener = args.serve.bind()?;
    // Not `Store::open`, which makes a folder and a store that are missing: one deleted since
    // the check above (`knob experiment delete` holds the lock while it removes them) is an
    // error, not a new empty experiment.
    let store =
        Store::open_existing(&entry.dir).map_err(|e| crate::experiment::store_error(&entry, &e))?;
    // Recorded as the runner at once, holding the store's writer lock: a `knob stop` from now
    // on signals this process, and one that finds the lock held but no runner recorded yet
    // waits for this (see `stop`). The signals are caught first: a stop that comes while the
    // run is prepared waits in them, and stops the run as soon as its manager runs. Recorded
    // only once the run was prepared (checks, plugins), a stop in between was told "not
    // running" and the resume ran on.
    let launch = Launch::prepare(Started::Resumed)?;
    // The address a crashed run left recorded is no one's now: cleared, so that a command
    // while this run starts waits for its API instead of failing to reach the old one.
    registry.set_api(&args.id, None)?;
    registry.set_status(
        &args.id,
        ExperimentStatus::Running.as_str(),
        Some(std::process::id()),
    )?;
    match prepare(&args, &entry, &store) {
        Ok((experiment, plugins)) => run_in_foreground(
            experiment,
            store,
            &plugins,
            &registry,
            listener,
            &args.serve,
            launch,
        ),
        Err(e) => {
            // Not started: the entry says again what it said (a crashed run stays crashed).
            if let Err(restoring) = registry.restore_status(&entry) {
                errln!("warning: {restoring}");
            }
            Err(e)
        }
    }
}

/// What `resume` checks, loads and records in its `store` before its run starts: the
/// experiment to run, and its plugins.
fn prepare(
    args: &ResumeArgs,
    entry: &knob_core::registry::RegistryEntry,
    store: &Store,
) -> anyhow::Result<(Experiment, PluginRegistry)> {
    let state = store.replay()?;
    let mut config: ExperimentConfig =
        serde_json::from_value(state.config.clone()).with_context(|| {
            format!(
                "experiment {}: its stored config cannot be read by this knob",
                args.id
            )
        })?;
    // Checked before anything is changed: without it no trial can start, and each one the
    // budget still allows would be created only to fail.
    if !config.trial_code_directory.is_dir() {
        // Something else at that path (a file, a dangling link): "gone" would send the user
        // looking for a missing path that is there.
        if config.trial_code_directory.symlink_metadata().is_ok() {
            anyhow::bail!(
                "experiment {}: its trialCodeDirectory {} is not a folder any more (something else is at that path), so no trial could start; put the folder back there (a copy will do) and resume again",
                args.id,
                config.trial_code_directory.display()
            );
        }
        anyhow::bail!(
            "experiment {}: its trialCodeDirectory {} is gone, so no trial could start; put it back (a copy at that path will do) and resume again",
            args.id,
            config.trial_code_directory.display()
        );
    }
    let trials_so_far = state.trials.len() as u64;
    if let Some(max) = args.max_trial_number.filter(|&max| max < trials_so_far) {
        anyhow::bail!(
            "--max-trial-number {max} is below the {trials_so_far} trials experiment {} already has; give at least {} to run more, or leave it out",
            args.id,
            trials_so_far + 1
        );
    }
    // Every check before the store is changed: a resume refused (a secret not known, a plugin
    // gone) leaves the experiment as it was, its budgets and status included.
    let search_space = match &args.search_space {
        Some(file) => {
            let (_, space) = crate::space::read_space_value(file).context("--search-space")?;
            manager::check_new_search_space(&space)
                .map_err(|refusal| anyhow::anyhow!("{}: {refusal}", file.display()))?;
            Some(space)
        }
        None => None,
    };
    let (plugins, _context) = stored_services(&args.id, &entry.dir, &mut config)?;
    preflight(&config, &plugins)?;
    manager::check_secrets(&config).map_err(|e| anyhow::anyhow!("experiment {}: {e}", args.id))?;
    if let Some(max) = args.max_trial_number {
        store
            .append(StoreEvent::ConfigUpdated {
                field: "maxTrialNumber".into(),
                value: Value::from(max),
            })
            .wait()?;
        config.max_trial_number = Some(max);
    }
    if let Some(duration) = args.max_experiment_duration {
        let value = Value::from(duration.as_secs());
        store
            .append(StoreEvent::ConfigUpdated {
                field: "maxExperimentDuration".into(),
                value,
            })
            .wait()?;
        config.max_experiment_duration = Some(Duration::from_secs(duration.as_secs()));
    }
    // Recorded as `knob update searchspace` would; the tuner, asked when the run starts, may
    // still refuse it, and the next resume may give another.
    if let Some(space) = search_space {
        store
            .append(StoreEvent::ConfigUpdated {
                field: "searchSpace".into(),
                value: space.clone(),
            })
            .wait()?;
        config.search_space = space;
    }
    if let Some(note) = budget_note(&args.id, &config, &state) {
        errln!("note: {note}");
    }
    errln!(
        "resuming experiment {} ({}, {} trials so far)",
        args.id,
        // Its last recorded status (RUNNING) is not how a crashed run ended.
        if entry.crashed() {
            "crashed"
        } else {
            entry
                .end_missing_from_store(state.status)
                .unwrap_or(state.status.as_str())
        },
        state.trials.len()
    );
    let experiment = Experiment {
        id: args.id.clone(),
        config_file: crate::create::config_source(&entry.dir),
        dir: entry.dir.clone(),
        config,
        history: Some(state),
    };
    Ok((experiment, plugins))
}

/// The plugins and the training services' context of a stored experiment (`id`, in `dir`), its
/// `config` checked again by its services and given back the secrets the store keeps as `***`.
pub(crate) fn stored_services(
    id: &str,
    dir: &std::path::Path,
    config: &mut ExperimentConfig,
) -> anyhow::Result<(PluginRegistry, ServiceContext)> {
    let plugins = PluginRegistry::load(&config.plugin_paths);
    for problem in plugins.problems() {
        errln!("warning: {problem}");
    }
    // Each service declares its secrets again (the store keeps them as `***`) and says what it
    // knows of its environments.
    let context = manager::service_context(
        id,
        dir,
        config,
        crate::create::config_source(dir).as_deref(),
        false,
    );
    knob_core::config::recheck_services(config, &plugins, &context).map_err(|problems| {
        anyhow::anyhow!(
            "the stored config of experiment {id} no longer passes its training services' checks: {}",
            problems.join("; ")
        )
    })?;
    restore_secrets(config, dir, &plugins);
    Ok((plugins, context))
}

/// What a crashed run left running (its manager died, its trials ran on, holding their GPUs and
/// writing into its folder): each service ends it, as `knob resume` does before it runs those
/// trials again; for `knob stop` and `knob experiment delete` of a crashed experiment. Returns
/// lines for the user: what was ended, or why it could not be (the caller goes on: a broken
/// experiment must stay deletable).
pub(crate) fn end_leftover_trials(entry: &knob_core::registry::RegistryEntry) -> Vec<String> {
    let ended = || -> anyhow::Result<Vec<String>> {
        let (unfinished, config) = unfinished_trials(&entry.dir)?;
        kill_trials(&entry.id, &entry.dir, &unfinished, config)
    };
    match ended() {
        Ok(reports) => reports
            .into_iter()
            .map(|line| format!("note: {line}"))
            .collect(),
        Err(e) => vec![format!(
            "warning: experiment {}: what its crashed run left running may still run: {e:#}",
            entry.id
        )],
    }
}

/// The trials of the experiment in `dir` that its store has not recorded as ended, and its
/// stored config.
pub(crate) fn unfinished_trials(dir: &std::path::Path) -> anyhow::Result<(Vec<String>, Value)> {
    let state = knob_core::store::StoreReader::open(dir)?.replay()?;
    let unfinished = state
        .trials
        .iter()
        .filter(|t| !t.status.is_final())
        .map(|t| t.trial_id.clone())
        .collect();
    Ok((unfinished, state.config))
}

/// Has each training service of experiment `id` (in `dir`, with this stored `config`) kill
/// (SIGKILL) whatever runs of `trials`, found as a resume finds a crashed run's. Returns the
/// services' one-line reports.
pub(crate) fn kill_trials(
    id: &str,
    dir: &std::path::Path,
    trials: &[String],
    config: Value,
) -> anyhow::Result<Vec<String>> {
    if trials.is_empty() {
        return Ok(Vec::new());
    }
    let mut config: ExperimentConfig = serde_json::from_value(config)?;
    let (plugins, context) = stored_services(id, dir, &mut config)?;
    Ok(knob_core::manager::clean_up_leftovers(
        &context, &config, &plugins, trials,
    ))
}

/// What a resume with no budget left still runs: `unfinished` trials again, said in the number
/// it has ("1 unfinished trial runs").
fn rerun_note(unfinished: usize) -> String {
    match unfinished {
        0 => "nothing is left to run".to_string(),
        1 => "only the 1 unfinished trial runs again".to_string(),
        n => format!("only the {n} unfinished trials run again"),
    }
}

/// One line when the budget is used up, so that a resume that will start no new trial says so
/// (it still runs again what was unfinished, and serves the dashboard).
fn budget_note(id: &str, config: &ExperimentConfig, state: &ExperimentState) -> Option<String> {
    let unfinished = state
        .trials
        .iter()
        .filter(|t| {
            !t.status.is_final() || t.end.as_ref().is_some_and(|e| e.stopped_with_experiment())
        })
        .count();
    let rerun = rerun_note(unfinished);
    let trials = state.trials.len() as u64;
    if let Some(max) = config.max_trial_number.filter(|&max| trials >= max) {
        return Some(format!(
            "experiment {id} has used its trial budget ({trials} of maxTrialNumber {max}): {rerun}; raise it with `knob resume {id} --max-trial-number N`"
        ));
    }
    let spent =
        Duration::from_millis(u64::try_from(state.active_time_ms(state.last_alive_ms)).ok()?);
    let max = config.max_experiment_duration.filter(|&max| spent >= max)?;
    Some(format!(
        "experiment {id} has used its time budget ({}s of maxExperimentDuration {}s): no trial starts; raise it with `knob resume {id} --max-experiment-duration D`",
        spent.as_secs(),
        max.as_secs()
    ))
}

/// Gives back the secrets the store does not keep (each training service declared its own, and
/// the notifications' password, webhook URL and webhook secret): from the config file the experiment was
/// created from (if it is still there and has the same mapping around each secret), else from
/// the environment variable named for it. A training service's secret still missing makes the
/// manager's start fail with a line saying which and what to do; a notification sink's turns
/// that sink off with a warning (notifications never stop an experiment).
fn restore_secrets(config: &mut ExperimentConfig, dir: &std::path::Path, plugins: &PluginRegistry) {
    let needs_secret = config
        .training_service
        .iter()
        .any(|service| !service.missing_secrets().is_empty());
    let notifications_need_secret = config
        .notifications
        .as_ref()
        .is_some_and(|n| n.needs_secrets());
    if !needs_secret && !notifications_need_secret {
        return;
    }
    let original = crate::create::config_source(dir)
        .and_then(|path| knob_core::config::load_file(&path, plugins).ok())
        .map(|loaded| loaded.config);
    let variable = |name: &str| std::env::var(name).ok();
    manager::restore_secrets(config, original.as_ref(), &variable);
    if let Some(notifications) = &mut config.notifications {
        let theirs = original
            .as_ref()
            .and_then(|original| original.notifications.as_ref());
        for unknown in notifications.restore_secrets(theirs, &variable) {
            errln!("warning: notifications: {unknown}; that sink is off for this run");
        }
        notifications.drop_sinks_without_secrets();
        if notifications.webhook.is_none() && notifications.email.is_none() {
            config.notifications = None;
        }
    }
}

#[derive(clap::Args)]
pub struct StopArgs {
    /// The experiment to stop.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    id: Option<String>,
    /// Stop every running experiment (nnictl's `stop --all`).
    #[arg(long)]
    all: bool,
}

pub fn stop_command(args: StopArgs) -> anyhow::Result<ExitCode> {
    match args.id {
        Some(id) => stop(&id),
        None => stop_all(),
    }
}

/// `knob stop --all`: every experiment whose process runs is stopped as `knob stop ID` stops it,
/// all at once (their trials' grace periods pass together), each saying what it says alone. One
/// that cannot be stopped is named and the others are stopped all the same; the exit is then
/// non-zero. A crashed experiment is not running: `knob stop ID` of it ends what it left
/// running.
fn stop_all() -> anyhow::Result<ExitCode> {
    let running: Vec<String> = Registry::open_default()?
        .list()?
        .into_iter()
        .filter(|entry| entry.running_pid().is_some())
        .map(|entry| entry.id)
        .collect();
    if running.is_empty() {
        outln!("no experiment is running");
        return Ok(ExitCode::SUCCESS);
    }
    let failed = std::thread::scope(|scope| {
        let stops: Vec<_> = running
            .iter()
            .map(|id| scope.spawn(move || stop(id)))
            .collect();
        let mut failed = 0;
        for stopped in stops {
            match stopped.join() {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    errln!("error: {error:#}");
                    failed += 1;
                }
                Err(_) => failed += 1,
            }
        }
        failed
    });
    if failed > 0 {
        anyhow::bail!(
            "{failed} of the {} running experiments did not stop as asked (above)",
            running.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Asks the process running an experiment to stop, as Ctrl-C would, and waits for it.
///
/// With SIGTERM, not SIGINT: the runner takes a SIGINT during a stop as a second Ctrl-C (kill
/// the trials without their grace period, exit unrecorded), and a second `knob stop`, typed by a
/// user who saw the first one wait, crashed the experiment it asked to stop. A SIGTERM during a
/// stop changes nothing, so a second `knob stop` waits for the stop under way, as the first does.
pub fn stop(id: &str) -> anyhow::Result<ExitCode> {
    let registry = Registry::open_default()?;
    let entry = match registry.get(id) {
        Ok(entry) => entry,
        Err(unknown) => match being_created(id) {
            Some(pid) => registered_once_created(&registry, id, pid)?,
            None => return Err(unknown.into()),
        },
    };
    if entry.crashed() {
        // Its trials may run on without it: those are what is left to stop. Ending them is
        // what was asked, so it succeeds unless a service could not (a `warning:` line).
        let lines = end_leftover_trials(&entry);
        for line in &lines {
            errln!("{line}");
        }
        let pid = entry.pid.unwrap_or_default();
        if lines.iter().any(|line| line.starts_with("warning:")) {
            anyhow::bail!(
                "experiment {id} {CRASHED}: its process {pid} is gone, and what it left running may still run (above); `knob resume {id}` continues it"
            );
        }
        outln!(
            "experiment {id} {CRASHED}: its process {pid} is gone (what it left running is ended); `knob resume {id}` continues it"
        );
        return Ok(ExitCode::SUCCESS);
    }
    // A run already over whose process still sends its last notifications: the stop gives
    // them up (SIGTERM), which it then says.
    let was_ending = entry.run_over();
    // Only the recorded process itself, not one that got its pid since (see `signal_runner`).
    let (entry, pid) = match ask_to_stop(&entry) {
        Ok(Some(pid)) => (entry, pid),
        Ok(None) => match runner_once_started(&registry, entry)? {
            Found::Runner(entry, pid) => (entry, pid),
            Found::NotRunning(entry) => {
                outln!("experiment {id} is not running ({})", entry.status);
                return Ok(ExitCode::SUCCESS);
            }
        },
        Err(error) => anyhow::bail!(
            "cannot signal process {} of experiment {id}: {error}",
            entry.pid.unwrap_or_default()
        ),
    };
    let asked_ms = unix_ms();
    let started = Instant::now();
    let mut said_trials = false;
    let mut said_sending = false;
    // When the run was seen to have recorded its end (its status final, its pid still set): what
    // is left is its process sending the last notifications, up to NOTIFY_AT_EXIT to a sink that
    // does not answer. The stop waits for that too, and says so: until the process exits it
    // still holds the experiment (a `knob resume` right after the stop, as a script does, would
    // be refused as running), and the wait is bounded and can be cut short. Said to be killing
    // trials all that time, the wait looked hung on trials long gone.
    let mut ended: Option<Instant> = None;
    while entry.running_pid().is_some() {
        if ended.is_none() {
            ended = end_recorded(&registry, id, pid).then(Instant::now);
        }
        let waited = started.elapsed();
        match ended {
            None if waited >= STOP_PATIENCE => anyhow::bail!(
                "experiment {id} (pid {pid}) has not stopped after 2 minutes; `kill -INT {pid}` kills its trials at once, without their grace period"
            ),
            None if waited >= STOP_QUIET && !said_trials => {
                errln!("waiting for experiment {id} (pid {pid}) to stop: its running trials are being killed");
                said_trials = true;
            }
            Some(at) if at.elapsed() >= crate::create::NOTIFY_AT_EXIT + STOP_QUIET => {
                anyhow::bail!(
                    "experiment {id} has recorded its end, but its process {pid} has not exited {}s after; `knob stop {id}` again gives up on its last notifications",
                    at.elapsed().as_secs()
                )
            }
            Some(_) if waited >= STOP_QUIET && !said_sending => {
                errln!(
                    "experiment {id} has recorded its end ({}); waiting for its process {pid} to send its last notifications, at most {}s (`knob stop {id}` again gives up on them)",
                    registry.get(id).map(|e| e.status).unwrap_or_default(),
                    crate::create::NOTIFY_AT_EXIT.as_secs()
                );
                said_sending = true;
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let entry = registry.get(id)?;
    if entry.crashed() {
        // It exited without recording its end (killed by a second signal, say): its trials
        // were not seen to end, and it is not stopped.
        anyhow::bail!(
            "experiment {id}: its process {pid} exited without recording its end ({CRASHED}); its trials may still run: `knob stop {id}` again ends them, `knob resume {id}` continues it"
        );
    }
    // What the run said as it stopped about the experiment as a whole: above all, trials it
    // could not kill (their host cannot be reached), which may still run.
    if let Ok(state) = knob_core::store::StoreReader::open(&entry.dir).and_then(|r| r.replay()) {
        for warning in state
            .warnings
            .iter()
            .filter(|w| w.trial_id.is_none() && w.time_ms >= asked_ms)
        {
            errln!("warning: {}", warning.message);
        }
    }
    let status = entry.status;
    if status == ExperimentStatus::Stopped.as_str() {
        outln!("experiment {id} stopped ({status}); continue it with `knob resume {id}`");
    } else {
        // It ended by itself (its last trial, its time budget) before the stop took effect.
        outln!("experiment {id} ended ({status}) before the stop took effect");
        if was_ending {
            errln!("note: experiment {id}'s process was sending its last notifications; the stop gave up on them");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether the run of experiment `id`, process `pid`, has recorded its end in the registry
/// while it still runs: it is then sending its last notifications (`run_in_foreground`).
fn end_recorded(registry: &Registry, id: &str, pid: u32) -> bool {
    registry
        .get(id)
        .is_ok_and(|entry| entry.pid == Some(pid) && entry.run_over())
}

/// How long `knob stop` waits for a `knob create` under way to register its experiment.
const CREATING_PATIENCE: Duration = Duration::from_secs(30);

/// The pid of a `knob create --id ID` (or `--id=ID`) that runs now: the experiment it makes is
/// registered only once its config, plugins and port are checked, a second or more after it
/// started, and a `knob stop ID` in between (a script's `knob create ... &` then `knob stop`)
/// was told "no experiment ID" while the experiment then ran to its end.
fn being_created(id: &str) -> Option<u32> {
    let own = std::process::id();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            if pid == own {
                return None;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let program = std::path::Path::new(
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(args.first()?),
            );
            let is_knob = program
                .file_name()
                .is_some_and(|name| name.as_encoded_bytes().starts_with(b"knob"));
            let creates = args.iter().any(|arg| *arg == b"create");
            let names_id = args
                .windows(2)
                .any(|pair| pair[0] == b"--id" && pair[1] == id.as_bytes())
                || args
                    .iter()
                    .any(|arg| arg.strip_prefix(b"--id=") == Some(id.as_bytes()));
            (is_knob && creates && names_id).then_some(pid)
        })
}

/// Waits, at most [`CREATING_PATIENCE`], for the `knob create` `pid` to register experiment
/// `id`, and returns its entry; fails once that process ended without registering it (its
/// config refused, say: nothing runs, so nothing is left to stop).
fn registered_once_created(
    registry: &Registry,
    id: &str,
    pid: u32,
) -> anyhow::Result<RegistryEntry> {
    errln!(
        "experiment {id} is being created (knob create, pid {pid}); waiting for it to be registered, at most {}s",
        CREATING_PATIENCE.as_secs()
    );
    let deadline = Instant::now() + CREATING_PATIENCE;
    // `None` for a zombie too: one that exited stays one until its parent waits for it, which
    // a script's parent may never do. Compared, so that another process given the pid since
    // is not taken for it.
    let started = knob_core::registry::process_start(pid);
    loop {
        if let Ok(entry) = registry.get(id) {
            return Ok(entry);
        }
        if started.is_none() || knob_core::registry::process_start(pid) != started {
            // Registered just before it ended, or never.
            return registry.get(id).map_err(|_| {
                anyhow::anyhow!(
                    "no experiment {id}: the knob create that was making it (pid {pid}) ended before registering it (its own output says why); there is nothing to stop"
                )
            });
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "experiment {id} is still being created by knob create (pid {pid}) after {}s, not registered yet; try `knob stop {id}` again in a moment",
                CREATING_PATIENCE.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `knob stop` sends the runner (see [`stop`]).
const STOP_SIGNAL: i32 = libc::SIGTERM;

/// Sends the runner [`STOP_SIGNAL`], then SIGCONT; returns its pid, as
/// [`RegistryEntry::signal_runner`] does. A runner suspended (Ctrl-Z in its terminal, SIGSTOP)
/// takes no signal until it is continued: the stop waited its 2 minutes for nothing, then
/// advised a `kill -INT` that a suspended process does not take either. SIGCONT changes nothing
/// for a runner that runs; a service manager (systemd) and a shell's `kill` of a stopped job
/// send it after SIGTERM for the same reason.
fn ask_to_stop(entry: &RegistryEntry) -> std::io::Result<Option<u32>> {
    let sent = entry.signal_runner(STOP_SIGNAL)?;
    if sent.is_some() {
        // Through the same pinned check: never to a process that took the pid since.
        let _ = entry.signal_runner(libc::SIGCONT);
    }
    Ok(sent)
}

/// How long `knob stop` waits for the run to stop (its trials' grace period, their kills).
const STOP_PATIENCE: Duration = Duration::from_secs(120);
/// How long `knob stop` waits silently before it says that it waits.
const STOP_QUIET: Duration = Duration::from_secs(3);

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

/// What [`runner_once_started`] found.
enum Found {
    /// The runner, signalled ([`STOP_SIGNAL`]), as the registry names it now.
    Runner(knob_core::registry::RegistryEntry, u32),
    NotRunning(knob_core::registry::RegistryEntry),
}

/// How long `knob stop` waits for a starting run to record itself as the runner.
const STARTING_PATIENCE: Duration = Duration::from_secs(10);

/// For an experiment whose registry names no runner: a knob process that holds its store's
/// writer lock (as `knob experiment delete` tells, `FolderHold`) is a run starting (`knob
/// resume` records itself right after it takes the lock), or a delete under way. Waits, at most
/// [`STARTING_PATIENCE`], for the registry to name a runner (then signals it with
/// [`STOP_SIGNAL`], which stops it as Ctrl-C would) or for the lock to be let go (nothing
/// runs). Told "not running" there, a stop during a resume's start succeeded and the resume ran
/// on.
fn runner_once_started(
    registry: &Registry,
    mut entry: knob_core::registry::RegistryEntry,
) -> anyhow::Result<Found> {
    use knob_core::experiment::{FolderHold, RemoveError};
    let deadline = Instant::now() + STARTING_PATIENCE;
    let mut said = false;
    loop {
        match FolderHold::take(&entry.dir) {
            Err(RemoveError::Running { .. }) => {}
            // Let go at once: holding it would keep a resume from starting.
            Ok(_) | Err(RemoveError::Failed { .. }) => return Ok(Found::NotRunning(entry)),
        }
        if !said {
            errln!(
                "experiment {} is starting (a knob process holds its store); waiting for it to record its process, at most {}s",
                entry.id,
                STARTING_PATIENCE.as_secs()
            );
            said = true;
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "experiment {} is starting (a knob process holds its store, and has not yet recorded itself as the runner); try `knob stop {}` again in a moment",
                entry.id,
                entry.id
            );
        }
        std::thread::sleep(Duration::from_millis(20));
        entry = registry.get(&entry.id)?;
        match ask_to_stop(&entry) {
            Ok(Some(pid)) => return Ok(Found::Runner(entry, pid)),
            Ok(None) => {}
            Err(error) => anyhow::bail!(
                "cannot signal process {} of experiment {}: {error}",
                entry.pid.unwrap_or_default(),
                entry.id
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_rerun_note_says_one_trial_in_the_singular() {
        assert_eq!(super::rerun_note(0), "nothing is left to run");
        assert_eq!(
            super::rerun_note(1),
            "only the 1 unfinished trial runs again"
        );
        assert_eq!(
            super::rerun_note(3),
            "only the 3 unfinished trials run again"
        );
    }
}
