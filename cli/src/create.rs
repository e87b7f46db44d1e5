//! `knob create`: run an experiment in the foreground with a progress bar, or detached.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use knob_core::config::{ExperimentConfig, ServicePlugins};
use knob_core::experiment;
use knob_core::manager::{self, Command, Experiment, Notice, Outcome, Progress};
use knob_core::notify;
use knob_core::registry::{knob_home, Registry};
use knob_core::store::{Direction, ExperimentStatus, Store, StoreError};
use knob_plugin_api::host::PluginRegistry;
use tokio::sync::{mpsc, oneshot, watch};

use crate::serve::{dashboard_url, spawn_api, ServeArgs};
use crate::table::best_trials_table;

#[derive(clap::Args)]
pub struct CreateArgs {
    /// The experiment config (NNI v2 YAML or JSON).
    #[arg(long, short = 'c')]
    config: PathBuf,
    /// Use this id instead of a random one (refused if it exists: resume it instead).
    #[arg(long)]
    id: Option<String>,
    /// Run in the background; print the id and where the log goes.
    #[arg(long)]
    detach: bool,
    #[command(flatten)]
    serve: ServeArgs,
}

pub fn run(args: CreateArgs) -> anyhow::Result<ExitCode> {
    args.serve.check()?;
    if args.detach {
        return detach(&args);
    }
    let services = ServicePlugins::with_notices(|notice| errln!("note: {notice}"));
    let (config, warnings) = experiment::load_config(&args.config, &services)?;
    for warning in warnings {
        errln!("warning: {warning}");
    }
    if let Some(notice) = secret_config_left_out_notice(&config, &args.config) {
        errln!("note: {notice}");
    }
    let plugins = services.registry(&config.plugin_paths);
    for problem in plugins.problems() {
        errln!("warning: {problem}");
    }
    preflight(&config, plugins).map_err(|e| {
        anyhow::anyhow!(
            "{}",
            knob_core::config::as_written(&args.config, &e.to_string())
        )
    })?;
    // Bound before the id is registered: a busy --port or an address this machine does not
    // have fails here, leaving no registry entry or folder that would block the id.
    let listener = args.serve.bind()?;
    let registry = Registry::open_default()?;
    // Before the registry entry, which names this process as the experiment's runner.
    let launch = Launch::prepare(Started::Created)?;
    let (mut experiment, store) = experiment::create(config, args.id.as_deref(), &registry)?;
    experiment.config_file = Some(remember_config_source(&experiment.dir, &args.config));
    run_in_foreground(
        experiment,
        store,
        plugins,
        &registry,
        listener,
        &args.serve,
        launch,
    )
}

/// Whether `run_in_foreground` runs an experiment made by this process, which it takes back
/// if it never starts, or one resumed, which stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    Created,
    Resumed,
}

/// What a run needs from before it becomes visible (the registry entry `create` makes, the
/// RUNNING `resume` records, both with this process's pid): the runtime its manager runs on,
/// with the stop signals already caught on it. Caught only once the manager ran, a Ctrl-C,
/// SIGTERM or SIGHUP in between took the default action: the process died without a word and
/// the experiment was left crashed.
pub struct Launch {
    runtime: tokio::runtime::Runtime,
    signals: StopSignals,
    started: Started,
}

impl Launch {
    /// Builds the runtime and catches the stop signals: call it just before the run becomes
    /// visible (not earlier: until then the default action, ending the process at once, is
    /// what a Ctrl-C should do).
    pub fn prepare(started: Started) -> anyhow::Result<Launch> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let signals = {
            let _entered = runtime.enter();
            StopSignals::catch().context("cannot catch Ctrl-C, SIGTERM and SIGHUP")?
        };
        Ok(Launch {
            runtime,
            signals,
            started,
        })
    }
}

/// Ctrl-C, SIGTERM and SIGHUP, caught from the moment these streams exist: one that comes
/// before the manager runs waits in its stream, and [`forward_stop_signals`] acts on it as soon
/// as the manager runs.
struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    /// Which of stdout and stderr were on a terminal when the run started: where a hang-up's
    /// output goes to the log ([`go_on_without_the_terminal`]). Asked only at the hang-up, a
    /// terminal really gone (its tty hung up, `isatty` failing with EIO) read as none, and the
    /// output was lost instead.
    on_terminal: Vec<i32>,
}

impl StopSignals {
    /// Inside a runtime (its signal driver delivers them).
    fn catch() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            on_terminal: [libc::STDOUT_FILENO, libc::STDERR_FILENO]
                .into_iter()
                // SAFETY: isatty only reads the state of a descriptor number.
                .filter(|fd| unsafe { libc::isatty(*fd) } == 1)
                .collect(),
        })
    }
}

/// The file in an experiment's directory that names the config file it was created from:
/// `knob resume` reads SSH passwords and passphrases from there again, since knob never stores
/// them.
pub const CONFIG_SOURCE_FILE: &str = knob_core::experiment::CONFIG_SOURCE_FILE;

/// Writes [`CONFIG_SOURCE_FILE`]; returns the config's canonical path.
fn remember_config_source(dir: &Path, config: &Path) -> PathBuf {
    let absolute = std::fs::canonicalize(config).unwrap_or_else(|_| config.to_path_buf());
    if let Err(e) = std::fs::write(
        dir.join(CONFIG_SOURCE_FILE),
        absolute.as_os_str().as_encoded_bytes(),
    ) {
        // Only a resume that needs a password again depends on it, and it says what to do.
        errln!(
            "warning: cannot write {}: {e}",
            dir.join(CONFIG_SOURCE_FILE).display()
        );
    }
    absolute
}

/// The config file named in an experiment's [`CONFIG_SOURCE_FILE`], if it was written.
pub fn config_source(dir: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(dir.join(CONFIG_SOURCE_FILE)).ok()?;
    let path = text.trim();
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// The experiment's config file is named to the training services (`ServiceContext::config_file`)
/// so that those that copy the trial code elsewhere (to SSH hosts, say) leave it out, whatever it
/// holds. When it holds a secret and lies inside `trialCodeDirectory`, say so once, since that
/// is the case where it matters: NNI would have copied the password in clear.
fn secret_config_left_out_notice(config: &ExperimentConfig, config_path: &Path) -> Option<String> {
    let (index, secret) =
        config
            .training_service
            .iter()
            .enumerate()
            .find_map(|(index, service)| {
                service
                    .secrets
                    .iter()
                    .find(|secret| service.secret(&secret.path).is_some())
                    .map(|secret| (index, secret))
            })?;
    let code_dir = std::fs::canonicalize(&config.trial_code_directory).ok()?;
    let file = std::fs::canonicalize(config_path).ok()?;
    file.starts_with(&code_dir).then(|| {
        format!(
            "{} holds a secret (trainingService[{index}].{}); it lies in trialCodeDirectory {} but is left out of the code that training services copy to other machines",
            config_path.display(),
            secret.path,
            code_dir.display()
        )
    })
}

/// Checks what can be checked before an experiment starts: every plugin component it names
/// exists, and this machine can place its trials (a GPU experiment without usable GPUs fails
/// here, with the probe's reason).
pub fn preflight(config: &ExperimentConfig, plugins: &PluginRegistry) -> anyhow::Result<()> {
    for (kind, name) in manager::required_components(config, plugins)? {
        plugins.find(kind, &name)?;
    }
    manager::Placer::preflight(config)
        .map_err(|reason| anyhow::anyhow!("cannot place trials: {reason}"))?;
    Ok(())
}

/// `knob config check [--v2] FILE`: the config as `create` would run it, or every error, one a
/// line. A config that `create` would refuse on this machine only because of what the machine
/// has (more cores or GPUs asked for than it has) is still a valid config, for another machine:
/// that is said in a warning, with the field's line, and the check passes.
pub fn check_config(file: &Path, v2: bool) -> anyhow::Result<ExitCode> {
    let services = ServicePlugins::with_notices(|notice| errln!("note: {notice}"));
    match knob_core::config::check_file_rendered(file, &services, v2) {
        Ok((text, config)) => {
            if let Err(reason) = manager::Placer::preflight(&config) {
                let message =
                    format!("knob create on this machine would refuse the config: {reason}");
                errln!("warning: {}", knob_core::config::as_written(file, &message));
            }
            use std::io::Write as _;
            let mut stdout = std::io::stdout();
            stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(crate::stdout_error)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            for error in errors {
                errln!("error: {error}");
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Runs the manager with a progress bar, and its HTTP API and dashboard on `listener` (bound
/// by the caller before it changed anything, with [`ServeArgs::bind`]), until the experiment
/// ends; Ctrl-C stops it (caught since `launch` was prepared).
pub fn run_in_foreground(
    experiment: Experiment,
    store: Store,
    plugins: &PluginRegistry,
    registry: &Registry,
    listener: std::net::TcpListener,
    serve: &ServeArgs,
    launch: Launch,
) -> anyhow::Result<ExitCode> {
    let Launch {
        runtime,
        signals,
        started,
    } = launch;
    let id = experiment.id.clone();
    let dir = experiment.dir.clone();
    let maximize = experiment.config.direction() == Direction::Maximize;
    errln!("experiment {id}: {}", dir.display());
    let api_address = listener.local_addr()?;
    registry.set_api(&id, Some(api_address))?;
    let dashboard = dashboard_url(api_address);
    errln!("dashboard and API: {dashboard}");
    registry.set_status(
        &id,
        ExperimentStatus::Running.as_str(),
        Some(std::process::id()),
    )?;

    // Started before the manager, so that it sees everything the manager records.
    let notifier = experiment.config.notifications.as_ref().map(|config| {
        let context = notify::ExperimentContext {
            experiment_id: id.clone(),
            dir: dir.clone(),
            ranking: knob_core::objectives::Ranking::new(
                experiment.config.direction(),
                &experiment.config.objectives,
            ),
            dashboard_url: Some(dashboard.clone()),
        };
        let log: notify::Log = Arc::new(|line| errln!("warning: {line}"));
        notify::Notifier::start(
            config,
            context,
            store.commits(),
            notify::Retry::default(),
            log,
        )
    });
    let result = runtime.block_on(async {
        let (commands, command_inbox) = mpsc::unbounded_channel();
        let (progress_tx, progress_rx) = watch::channel(Progress::default());
        let (api, api_state) = spawn_api(
            listener,
            id.clone(),
            dir.clone(),
            Some(commands.clone()),
            Some(store.commits()),
            serve,
        )?;
        // Made here, so that a hang-up can stop it drawing before its output goes to the log.
        let bar = (std::env::var(PROGRESS_LINES_ENV).as_deref() != Ok("lines")).then(progress_bar);
        let stops = tokio::spawn(forward_stop_signals(
            signals,
            commands,
            id.clone(),
            dir.clone(),
            bar.clone(),
        ));
        let (manager_ended, ended) = oneshot::channel::<()>();
        let display = tokio::spawn(show_progress(progress_rx, Pace::new(ended), maximize, bar));
        let result = manager::run(experiment, store, plugins, command_inbox, progress_tx).await;
        // A stop from now on is for the end's notifications (below), not for the run.
        stops.abort();
        // The display's pause ends now: the experiment's last state is shown at once.
        drop(manager_ended);
        let _ = display.await;
        // A page open on the dashboard reads the end (its stream says `end` once the store is
        // closed) and then closes its stream; until then the API stays, PAGES_READ_THE_END at
        // most. Exiting at once had left such a page with what it had read up to a second
        // before the end (trials still running, the experiment RUNNING), shown as the last
        // known state. With no page open this costs nothing; a page that never closes its
        // stream (asleep, or another client of `/stream`) holds the exit that long at most.
        api_state.streams_closed(PAGES_READ_THE_END).await;
        api.abort();
        anyhow::Ok(result)
    })?;
    registry.set_api(&id, None)?;
    let status = match &result {
        Ok(outcome) => outcome.status,
        Err(_) => ExperimentStatus::Error,
    };
    let taken_back = matches!(
        (&result, started),
        (Err(manager::ManagerError::NotStarted(_)), Started::Created)
    );
    if let Some(notifier) = notifier {
        if !taken_back {
            // The run is over: `knob experiment list` says how it ended while the last
            // notifications go out (it said RUNNING for up to NOTIFY_AT_EXIT more, against
            // `experiment show`). The pid stays recorded until they are sent: the process is
            // closing, which `knob update` says and `knob stop` cuts short.
            registry.set_status(&id, status.as_str(), Some(std::process::id()))?;
        }
        // The manager closed the store: what is left to send is the end of the experiment. A
        // sink that is down holds the process up to NOTIFY_AT_EXIT; Ctrl-C, SIGTERM or `knob
        // stop` then gives up on it at once (they waited it out, having nothing left to stop).
        let mut notifier = notifier;
        // A run the store failed under (its files deleted or moved, its disk full) could not
        // record its end, which is what the notifier follows: told here, it is sent anyway.
        if let Err(manager::ManagerError::Store(error)) = &result {
            notifier.end_unrecorded(ExperimentStatus::Error, error.to_string());
        }
        let sending = runtime.block_on(finish_notifications(&mut notifier));
        // Which sink the end message did not reach, when that is what was left.
        let unsent = notifier
            .end_not_delivered()
            .map(|end| format!(": {end}"))
            .unwrap_or_default();
        match sending {
            Sending::Done => {}
            Sending::TimedOut => errln!(
                "warning: notifications: not all sent within {}s of the end; giving up{unsent}",
                NOTIFY_AT_EXIT.as_secs()
            ),
            Sending::Stopped(what) => {
                errln!("warning: notifications: not all sent; given up on ({what}){unsent}")
            }
        }
    }
    if let (Err(manager::ManagerError::NotStarted(e)), Started::Created) = (&result, started) {
        // Nothing ran: the experiment is taken back, so that a failure to build what it needs
        // (a training service, its environments) leaves no dead entry blocking the id.
        return Err(take_back(&id, &dir, registry, e));
    }
    registry.set_status(&id, status.as_str(), None)?;
    match result {
        Ok(outcome) => Ok(report(&id, &dir, &outcome, maximize)),
        Err(e) => {
            // Its registry entry is all that is left.
            let forget = match &e {
                manager::ManagerError::Store(StoreError::FilesDeleted { .. }) => {
                    format!("; `knob experiment delete {id} --yes` forgets it")
                }
                manager::ManagerError::Store(StoreError::FilesMoved { .. }) => format!(
                    "; to run it from its new folder: `knob experiment delete {id} --yes`, then `knob experiment register NEW_FOLDER` and `knob resume {id}`"
                ),
                _ => String::new(),
            };
            errln!("error: experiment {id}: {e}{forget}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// How long `knob create`/`resume` keeps its API up after the experiment ended while a page
/// of its dashboard still follows the stream: enough for a page to read the last changes
/// (`/experiment` and the trials that changed), short enough not to hold a script waiting on
/// the exit.
const PAGES_READ_THE_END: Duration = Duration::from_secs(5);

/// How long `knob create`/`resume` waits, once the experiment ended, for its last notifications
/// (each sink's retries take about 7 s plus a 15 s timeout per try at worst; the end goes
/// before earlier messages that wait, `notify::EARLIER_MESSAGES_AFTER_THE_END`, to fit in it).
pub(crate) const NOTIFY_AT_EXIT: Duration = Duration::from_secs(90);

/// How long that wait goes before it is said, as `knob stop` says its own.
const NOTIFY_NOTICE_AFTER: Duration = Duration::from_secs(3);

/// Unregisters an experiment that never started and removes what knob made of its folder;
/// the error says so.
fn take_back(
    id: &str,
    dir: &Path,
    registry: &Registry,
    error: &manager::ManagerError,
) -> anyhow::Error {
    // The folder first: while the entry exists, `knob experiment delete` can still finish.
    let removed = experiment::remove_experiment_folder(dir)
        .map_err(anyhow::Error::from)
        .and_then(|left| Ok(registry.remove(id).map(|()| left)?));
    match removed {
        Ok(left) if left.is_empty() => {
            anyhow::anyhow!("experiment {id} did not start, and was not kept: {error}")
        }
        Ok(left) => anyhow::anyhow!(
            "experiment {id} did not start, and was not kept (left in {}: {}, which knob did not make): {error}",
            dir.display(),
            left.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
        Err(removing) => anyhow::anyhow!(
            "experiment {id} did not start: {error}; removing it failed too ({removing:#}): `knob experiment delete {id}`"
        ),
    }
}

/// How the wait for the end's notifications ended.
enum Sending {
    Done,
    TimedOut,
    Stopped(&'static str),
}

/// Waits for the end's notifications, at most [`NOTIFY_AT_EXIT`], or until a stop signal.
async fn finish_notifications(notifier: &mut notify::Notifier) -> Sending {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return match tokio::task::block_in_place(|| notifier.finish(NOTIFY_AT_EXIT)) {
            true => Sending::Done,
            false => Sending::TimedOut,
        };
    };
    let started = tokio::time::Instant::now();
    let deadline = started + NOTIFY_AT_EXIT;
    let mut said_waiting = false;
    while !notifier.finished() {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Sending::TimedOut;
        }
        // A sink that does not answer holds the end up to NOTIFY_AT_EXIT: without a word the
        // finished run, its progress bar at "done", looked hung (as `knob stop` says it).
        if !said_waiting && now - started >= NOTIFY_NOTICE_AFTER {
            said_waiting = true;
            errln!(
                "note: the experiment has ended; waiting for its last notifications to be sent, at most {}s more (Ctrl-C gives up on them)",
                deadline.saturating_duration_since(now).as_secs()
            );
        }
        tokio::select! {
            _ = interrupt.recv() => return Sending::Stopped("Ctrl-C"),
            _ = terminate.recv() => return Sending::Stopped("SIGTERM or knob stop"),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    Sending::Done
}

/// First Ctrl-C or SIGTERM (what `knob stop`, a service manager, a batch scheduler or `kill`
/// sends, with SIGKILL only after a wait): stop gracefully, so running trials are killed and
/// recorded, not left behind. A Ctrl-C (SIGINT) while the stop is under way: kill the trials at
/// once, without their grace period, and exit ([`kill_trials_and_exit`]). A SIGTERM while it is
/// under way changes nothing: SIGTERM is what programs send, and they send it again without
/// meaning "hurry" (a second `knob stop` from a user who saw the first wait, `timeout`, which
/// signals the process and then its whole group); taken as a second Ctrl-C, it cut the trials'
/// grace period short and left the experiment crashed. Their way to insist is SIGKILL, or
/// SIGINT, which a person at the terminal sends. A hang-up (the terminal or the SSH session
/// closed) stops nothing: the experiment goes on in the background as with `--detach`, its
/// output from then on in the same log file ([`go_on_without_the_terminal`]). Its default
/// action killed the manager at once and left the trials running unwatched. A signal caught
/// before the manager ran (see [`Launch`]) is acted on at once.
async fn forward_stop_signals(
    signals: StopSignals,
    commands: mpsc::UnboundedSender<Command>,
    id: String,
    dir: PathBuf,
    bar: Option<ProgressBar>,
) {
    let StopSignals {
        mut interrupt,
        mut terminate,
        mut hangup,
        mut on_terminal,
    } = signals;
    let mut hung_up = || go_on_without_the_terminal(&id, &mut on_terminal, bar.as_ref());
    let pid = std::process::id();
    loop {
        tokio::select! {
            _ = interrupt.recv() => {
                errln!("stopping (Ctrl-C): killing running trials (a second Ctrl-C kills them at once and exits)");
                break;
            }
            _ = terminate.recv() => {
                errln!("stopping (SIGTERM or knob stop): killing running trials, each with its grace period (Ctrl-C, or `kill -INT {pid}`, kills them at once and exits)");
                break;
            }
            _ = hangup.recv() => hung_up(),
        }
    }
    let _ = commands.send(Command::Stop);
    let mut said_again = false;
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => {
                if !said_again {
                    errln!("already stopping (SIGTERM or knob stop again): still waiting for the trials to end (Ctrl-C, or `kill -INT {pid}`, kills them at once)");
                    said_again = true;
                }
            }
            _ = hangup.recv() => hung_up(),
        }
    }
    kill_trials_and_exit(&id, dir, interrupt).await
}

/// How long a Ctrl-C during a stop waits for the training services to kill the trials (under
/// the Python launcher's 15 s after its second interrupt, `python/knob`).
const KILL_AT_ONCE: Duration = Duration::from_secs(10);

/// A Ctrl-C during a stop: the trials' grace period (a trial that traps SIGTERM to save a
/// checkpoint may take it all) is cut short. Each training service kills (SIGKILL) what runs of
/// the trials not recorded as ended, as it ends a crashed run's leftovers, and the process exits
/// with 130 (as a shell reports an interrupted command). Exiting without it left such trials
/// running unwatched, holding their GPUs. One more Ctrl-C, or services that take over
/// [`KILL_AT_ONCE`], exit without waiting, naming the trials that may still run and how to end
/// them; a SIGTERM still changes nothing (see [`forward_stop_signals`]). A manager that sees the
/// killed trials end first ends the run as after one signal (this task is then aborted),
/// recorded STOPPED.
async fn kill_trials_and_exit(
    id: &str,
    dir: PathBuf,
    mut interrupt: tokio::signal::unix::Signal,
) -> ! {
    let code = 130;
    errln!("stopping at once: killing the running trials without their grace period (one more Ctrl-C exits without waiting)");
    let (trials, config) = match tokio::task::block_in_place(|| {
        crate::resume::unfinished_trials(&dir)
    }) {
        Ok(found) => found,
        Err(e) => {
            errln!("warning: experiment {id}: its trials may still run ({e:#}); `knob stop {id}` ends them");
            std::process::exit(code)
        }
    };
    let may_still_run = |why: &str| {
        errln!(
            "warning: experiment {id}: trials {} may still run ({why}); `knob stop {id}` ends them",
            trials.join(", ")
        )
    };
    let killing = tokio::task::spawn_blocking({
        let (id, trials) = (id.to_string(), trials.clone());
        move || crate::resume::kill_trials(&id, &dir, &trials, config)
    });
    let killed = tokio::select! {
        killed = tokio::time::timeout(KILL_AT_ONCE, killing) => killed,
        _ = interrupt.recv() => {
            may_still_run("exited without waiting for them");
            std::process::exit(code)
        }
    };
    match killed {
        Ok(Ok(Ok(reports))) => {
            for line in reports {
                errln!("note: {line}");
            }
            errln!("exiting: its trials are killed; `knob resume {id}` continues the experiment");
        }
        Ok(Ok(Err(e))) => may_still_run(&format!("{e:#}")),
        Ok(Err(e)) => may_still_run(&e.to_string()),
        Err(_) => may_still_run(&format!(
            "their training services did not kill them within {}s",
            KILL_AT_ONCE.as_secs()
        )),
    }
    std::process::exit(code)
}

/// After a hang-up: whichever of stdout and stderr was on a terminal when the run started
/// (`on_terminal`, emptied here: a second hang-up has nothing left to move) goes to
/// `$KNOB_HOME/logs/ID.log` (where `--detach` writes), which says when and why; one that is a
/// file or a pipe (`nohup`, a logger) is left as it is, and is told where the rest went. If the
/// log cannot be opened, what the terminal cannot take is dropped (`errln!`; SIGPIPE is ignored
/// while an experiment runs). The progress `bar` stops drawing first: its redraws are for a
/// terminal, and would fill the log.
fn go_on_without_the_terminal(id: &str, on_terminal: &mut Vec<i32>, bar: Option<&ProgressBar>) {
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;
    let on_terminal = std::mem::take(on_terminal);
    if on_terminal.is_empty() {
        return;
    }
    if let Some(bar) = bar.filter(|_| on_terminal.contains(&libc::STDERR_FILENO)) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let log_path = log_path(id);
    let said = format!(
        "the terminal hung up (SIGHUP); experiment {id} goes on in the background, its output in {}: `knob top {id}` shows it, `knob stop {id}` stops it",
        log_path.display()
    );
    errln!("{said}");
    let log = std::fs::create_dir_all(log_dir()).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
    });
    let Ok(mut log) = log else { return };
    let _ = writeln!(log, "{said}");
    for fd in on_terminal {
        // SAFETY: dup2 onto one of this process's own standard descriptors, from one open here.
        unsafe { libc::dup2(log.as_raw_fd(), fd) };
    }
}

/// `KNOB_PROGRESS=lines`: progress as plain lines on stderr, at most one a second, for a reader
/// that is not a terminal (the Python launcher, `python/knob`), where the bar draws nothing.
const PROGRESS_LINES_ENV: &str = "KNOB_PROGRESS";

/// The bar when there is one (`bar`), else plain lines ([`PROGRESS_LINES_ENV`]).
async fn show_progress(
    progress: watch::Receiver<Progress>,
    pace: Pace,
    maximize: bool,
    bar: Option<ProgressBar>,
) {
    match bar {
        Some(bar) => show_progress_bar(progress, pace, maximize, bar).await,
        None => show_progress_lines(progress, pace, maximize).await,
    }
}

/// The least time between two looks of the progress display at the experiment's progress.
/// The manager publishes it at every trial event; a display woken at each one cost a thread
/// wake-up, a copy of the progress and a formatted message per event, a tenth of `knob
/// create`'s own CPU in `trial_overhead.sh` (short trials) while nothing was drawn (stderr not
/// a terminal). Ten looks a second draw the same bar.
const PROGRESS_PACE: Duration = Duration::from_millis(100);

/// The display's pause between two looks: [`PROGRESS_PACE`], cut short once the manager has
/// ended, so that `knob create` does not wait for it to show the end.
struct Pace {
    /// Closed when the manager ends; `None` once seen closed.
    ended: Option<oneshot::Receiver<()>>,
}

impl Pace {
    fn new(ended: oneshot::Receiver<()>) -> Pace {
        Pace { ended: Some(ended) }
    }

    async fn pause(&mut self) {
        let Some(ended) = self.ended.as_mut() else {
            return;
        };
        let closed = tokio::select! {
            _ = tokio::time::sleep(PROGRESS_PACE) => false,
            _ = ended => true,
        };
        if closed {
            self.ended = None;
        }
    }
}

fn console_line(notice: &Notice) -> String {
    let label = if notice.warning { "warning" } else { "notice" };
    format!("{label}: {}", notice.text)
}

async fn show_progress_lines(
    mut progress: watch::Receiver<Progress>,
    mut pace: Pace,
    maximize: bool,
) {
    let mut notices_shown = 0;
    let mut last_line = String::new();
    let mut last_time: Option<tokio::time::Instant> = None;
    let mut clock = ExperimentClock::default();
    loop {
        let snapshot = progress.borrow_and_update().clone();
        for notice in snapshot.notices.iter().skip(notices_shown) {
            errln!("{}", console_line(notice));
        }
        notices_shown = snapshot.notices.len();
        let done = snapshot.succeeded + snapshot.failed + snapshot.other_ended;
        let total = match snapshot.max_trial_number {
            Some(max) => max.max(done).to_string(),
            None => "?".to_string(),
        };
        let line = format!(
            "progress: {done}/{total} {}",
            progress_message(&snapshot, clock.now(&snapshot), maximize)
        );
        let finished = snapshot.status.is_some_and(ExperimentStatus::has_ended);
        let due = last_time.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        let held = line != last_line && !(due || finished);
        if line != last_line && !held {
            errln!("{line}");
            last_line = line;
            last_time = Some(tokio::time::Instant::now());
        }
        if finished {
            break;
        }
        pace.pause().await;
        if held {
            // Held back by the one-second limit: printed when the second is up, if nothing
            // newer came first.
            match tokio::time::timeout(Duration::from_secs(1), progress.changed()).await {
                Ok(Err(_)) => break,
                Ok(Ok(())) | Err(_) => continue,
            }
        }
        if progress.changed().await.is_err() {
            break;
        }
    }
}

/// The progress bar on stderr (drawing nothing where stderr is not a terminal), not ticking yet.
fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

async fn show_progress_bar(
    mut progress: watch::Receiver<Progress>,
    mut pace: Pace,
    maximize: bool,
    bar: ProgressBar,
) {
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut notices_shown = 0;
    let mut clock = ExperimentClock::default();
    loop {
        let snapshot = progress.borrow_and_update().clone();
        for notice in snapshot.notices.iter().skip(notices_shown) {
            bar.suspend(|| errln!("{}", console_line(notice)));
        }
        notices_shown = snapshot.notices.len();
        let done = snapshot.succeeded + snapshot.failed + snapshot.other_ended;
        bar.set_length(
            snapshot
                .max_trial_number
                .unwrap_or(snapshot.submitted)
                .max(done),
        );
        bar.set_position(done);
        bar.set_message(progress_message(&snapshot, clock.now(&snapshot), maximize));
        let finished = snapshot.status.is_some_and(ExperimentStatus::has_ended);
        if finished {
            break;
        }
        pace.pause().await;
        // The time left moves on between snapshots: a run of only intermediate results
        // publishes none, for as long as its trials run.
        if let Ok(Err(_)) = tokio::time::timeout(Duration::from_secs(1), progress.changed()).await {
            break;
        }
    }
    bar.finish_and_clear();
}

/// The experiment's elapsed time between [`Progress`] snapshots: the latest snapshot's, plus
/// the time since it first showed that value.
#[derive(Default)]
struct ExperimentClock {
    seen: Option<(Duration, tokio::time::Instant)>,
}

impl ExperimentClock {
    fn now(&mut self, snapshot: &Progress) -> Duration {
        if snapshot.status.is_some_and(ExperimentStatus::has_ended) {
            return snapshot.elapsed;
        }
        let now = tokio::time::Instant::now();
        match self.seen {
            Some((elapsed, at)) if elapsed == snapshot.elapsed => elapsed + (now - at),
            _ => {
                self.seen = Some((snapshot.elapsed, now));
                snapshot.elapsed
            }
        }
    }
}

/// `elapsed`: the experiment's time now (the snapshot's, carried forward by the display).
fn progress_message(p: &Progress, elapsed: Duration, maximize: bool) -> String {
    let mut message = format!(
        "done {} · running {} · failed {}",
        p.succeeded, p.running, p.failed
    );
    if p.other_ended > 0 {
        message.push_str(&format!(" · stopped {}", p.other_ended));
    }
    if p.dropped_suggestions > 0 {
        message.push_str(&format!(" · dropped {}", p.dropped_suggestions));
    }
    if let Some((trial, value)) = &p.best {
        let word = if maximize { "max" } else { "min" };
        // As the tables write it (`table::metric`): six decimals said 0.000000 of a loss of
        // 1.5e-9 that the table after the run shows as 1.500000e-9.
        let value = crate::table::metric(Some(*value));
        message.push_str(&format!(" · best ({word}) {value} ({trial})"));
    }
    if let Some(max) = p.max_duration {
        let left = max.saturating_sub(elapsed);
        message.push_str(&format!(" · {} left", humanize(left)));
    }
    message
}

fn humanize(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60),
    }
}

fn report(id: &str, dir: &Path, outcome: &Outcome, maximize: bool) -> ExitCode {
    let count =
        |f: &dyn Fn(&manager::TrialSummary) -> bool| outcome.trials.iter().filter(|t| f(t)).count();
    use knob_core::store::TrialStatus;
    let succeeded = count(&|t| t.status == TrialStatus::Succeeded);
    let failed = count(&|t| t.status == TrialStatus::Failed);
    let early_stopped = count(&|t| t.status == TrialStatus::EarlyStopped);
    let canceled = count(&|t| {
        matches!(
            t.status,
            TrialStatus::UserCanceled | TrialStatus::SysCanceled
        )
    });
    let mut counts = format!("{succeeded} succeeded, {failed} failed");
    if early_stopped > 0 {
        counts.push_str(&format!(", {early_stopped} early-stopped"));
    }
    if canceled > 0 {
        counts.push_str(&format!(", {canceled} canceled"));
    }
    outln!(
        "experiment {id} {}: {} ({counts})",
        outcome.status.as_str(),
        crate::table::counted(outcome.trials.len(), "trial")
    );
    outln!("{}", best_trials_table(id, &outcome.trials, maximize, 5));
    outln!(
        "results: knob trial ls {id} · knob experiment export {id} --format csv · {}",
        dir.display()
    );
    match outcome.status {
        ExperimentStatus::Error => {
            errln!(
                "error: experiment {id}: {}",
                outcome.message.as_deref().unwrap_or("failed")
            );
            ExitCode::FAILURE
        }
        // A run in which no trial got anywhere is a failure a script must notice, even though
        // the experiment itself ended normally.
        _ if failed > 0 && succeeded == 0 && early_stopped == 0 => {
            errln!(
                "error: experiment {id}: every trial that ended failed ({failed} failed{}); see `knob trial ls {id} --status failed`",
                if canceled > 0 { format!(", {canceled} canceled") } else { String::new() }
            );
            ExitCode::FAILURE
        }
        ExperimentStatus::Done => {
            if let Some(why) = &outcome.message {
                errln!("note: experiment {id}: {why}");
            }
            ExitCode::SUCCESS
        }
        _ => ExitCode::SUCCESS,
    }
}

/// Starts `knob create` again in a new session, its output in a log file, and returns once the
/// experiment is registered (or the child has failed).
fn detach(args: &CreateArgs) -> anyhow::Result<ExitCode> {
    // Checked here, not only by the `create` in the background: the id names the log file
    // opened below, and `../x` or `a/b` would have put it elsewhere or failed on the path.
    if let Some(id) = &args.id {
        experiment::check_id(id)?;
    }
    let id = args
        .id
        .clone()
        .unwrap_or_else(experiment::new_experiment_id);
    let mut command: Vec<std::ffi::OsString> = vec![
        "create".into(),
        "--config".into(),
        args.config.clone().into(),
        "--id".into(),
        id.clone().into(),
    ];
    command.extend(args.serve.to_args().into_iter().map(Into::into));
    run_detached(&id, command, &args.serve)
}

/// Where knob keeps the output of experiments that run without a terminal.
fn log_dir() -> std::path::PathBuf {
    knob_home().join("logs")
}

/// The output of experiment `id` when it ran detached (or after its terminal hung up);
/// `knob experiment delete` removes it with the experiment.
pub(crate) fn log_path(id: &str) -> std::path::PathBuf {
    log_dir().join(format!("{id}.log"))
}

/// Runs `knob COMMAND` (a `create` or `resume` of experiment `id`, without `--detach`) in a new
/// session, its output appended to `$KNOB_HOME/logs/ID.log`, and returns once it has
/// registered itself as the experiment's runner, or with its error line if it stopped first.
pub(crate) fn run_detached(
    id: &str,
    command: Vec<std::ffi::OsString>,
    serve: &ServeArgs,
) -> anyhow::Result<ExitCode> {
    let log_dir = log_dir();
    std::fs::create_dir_all(&log_dir)
        .with_context(|| format!("cannot create {}", log_dir.display()))?;
    let log_path = log_path(id);
    // Appended to: a resumed experiment's log goes on after its earlier runs'.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    let earlier_log = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe().context("cannot find the knob executable")?;
    let mut child = std::process::Command::new(exe);
    child.args(command);
    if let Some(token) = serve.token() {
        child.env(knob_plugin_api::secrets::API_TOKEN, token);
    }
    child
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    {
        use std::os::unix::process::CommandExt;
        // A new session: closing this terminal does not send the experiment SIGHUP.
        // SAFETY: setsid is async-signal-safe and touches no memory.
        unsafe {
            child.pre_exec(|| {
                if libc::setsid() == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = child
        .spawn()
        .context("cannot start the background knob process")?;
    let registry = Registry::open_default()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read(&log_path).unwrap_or_default();
            let this_run = String::from_utf8_lossy(log.get(earlier_log as usize..).unwrap_or(&[]))
                .into_owned();
            let last = this_run
                .lines()
                .rev()
                .find(|l| l.starts_with("error"))
                .unwrap_or("see the log");
            anyhow::bail!(
                "the experiment stopped at once ({status}): {last} (log: {})",
                log_path.display()
            );
        }
        if let Ok(entry) = registry.get(id) {
            // Registered, and its store readable: a `knob trial ls` right after this returns
            // must find the experiment (the registry names the process before a new store
            // holds it; under load a command in between said "no experiment has been created").
            if entry.pid == Some(child.id()) && crate::experiment::open(&entry).is_ok() {
                outln!(
                    "experiment {id} runs in the background (pid {}); log: {}",
                    child.id(),
                    log_path.display()
                );
                outln!("follow it with `knob trial ls {id}` or `knob top {id}`; stop it with `knob stop {id}`");
                return Ok(ExitCode::SUCCESS);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!(
        "the background experiment did not register within 30 s; log: {}",
        log_path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_left_moves_on_between_snapshots_and_stops_at_the_end() {
        let mut clock = ExperimentClock::default();
        let mut snapshot = Progress {
            elapsed: Duration::from_secs(10),
            max_duration: Some(Duration::from_secs(60)),
            ..Progress::default()
        };
        assert_eq!(clock.now(&snapshot), Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
        let later = clock.now(&snapshot);
        assert!(later >= Duration::from_millis(10_020), "{later:?}");
        assert!(progress_message(&snapshot, later, true).ends_with(" · 49s left"));

        snapshot.elapsed = Duration::from_secs(11);
        assert_eq!(clock.now(&snapshot), Duration::from_secs(11));
        snapshot.status = Some(ExperimentStatus::Done);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(clock.now(&snapshot), Duration::from_secs(11));
    }

    #[test]
    fn the_best_result_in_the_progress_line_is_written_as_the_tables_write_it() {
        let mut snapshot = Progress {
            best: Some(("t1".into(), 1.5e-9)),
            ..Progress::default()
        };
        let line = |p: &Progress| progress_message(p, Duration::ZERO, false);
        assert!(
            line(&snapshot).contains(" · best (min) 1.500000e-9 (t1)"),
            "{}",
            line(&snapshot)
        );
        snapshot.best = Some(("t2".into(), 1.79e308));
        assert!(
            line(&snapshot).contains(" · best (min) 1.790000e308 (t2)"),
            "{}",
            line(&snapshot)
        );
        snapshot.best = Some(("t3".into(), 0.25));
        assert!(
            line(&snapshot).contains(" · best (min) 0.250000 (t3)"),
            "{}",
            line(&snapshot)
        );
    }
}
