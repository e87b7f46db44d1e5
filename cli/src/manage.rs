//! Commands that change or serve an experiment: `knob view`, `knob trial kill`,
//! `knob update …`, `knob experiment delete`. A running experiment is changed through its API.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Subcommand;
use knob_core::experiment::{FolderHold, RemoveError};
use knob_core::registry::{Registry, RegistryEntry};
use serde_json::{json, Value};

use crate::client::ApiClient;
use crate::experiment;
use crate::serve::{dashboard_url, spawn_api, ServeArgs};

#[derive(Subcommand)]
pub enum ExperimentCommand {
    #[command(flatten)]
    Read(experiment::ExperimentCommand),
    /// Delete a stopped or finished experiment: its directory and its registry entry.
    Delete {
        id: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Register an experiment's folder that this registry does not list (copied from another
    /// machine, made with another KNOB_HOME, or left by a lost registry), so that every
    /// command finds it by its id.
    Register {
        /// The folder that holds its `experiment.db` (`<experimentWorkingDirectory>/<id>`).
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
pub enum TrialCommand {
    #[command(flatten)]
    Read(experiment::TrialCommand),
    /// Kill a waiting or running trial of a running experiment (recorded USER_CANCELED).
    Kill { id: String, trial: String },
}

#[derive(Subcommand)]
pub enum UpdateCommand {
    /// Trials running at once.
    Concurrency(NewValue),
    /// maxTrialNumber.
    Trialnum(NewValue),
    /// maxExperimentDuration (`30m`, `2h`, or seconds).
    Duration(NewValue),
    /// Replace the search space with the one in a JSON file.
    Searchspace { id: String, file: PathBuf },
}

/// An experiment and the new value of one of its settings: `ID VALUE`, or nnictl's
/// `ID --value VALUE`.
#[derive(clap::Args)]
pub struct NewValue {
    id: String,
    /// The new value (nnictl's `--value VALUE` is taken too); a negative number reaches the
    /// experiment, which refuses it with its reason.
    #[arg(allow_hyphen_values = true, num_args = 1..=2, value_name = "VALUE", required = true)]
    value: Vec<String>,
}

impl NewValue {
    /// The id and the value as JSON. nnictl's `--value V` arrives as two values (the hyphen
    /// values a negative number needs take `--value` too): it was "unexpected argument 'V'",
    /// and a lone `--value` was sent to the experiment as the value.
    fn id_and_value(self, command: &str) -> anyhow::Result<(String, serde_json::Value)> {
        let value = match self.value.as_slice() {
            [value] if value != "--value" => value,
            [flag, value] if flag == "--value" => value,
            _ => anyhow::bail!(
                "give one value after the experiment's id, as `knob update {command} {} 4` (nnictl's `--value 4` is taken too)",
                self.id
            ),
        };
        let value = json_scalar(value);
        Ok((self.id, value))
    }
}

#[derive(clap::Args)]
pub struct ViewArgs {
    /// The experiment; without one, every experiment of the registry is listed, each opening
    /// its own (read-only) dashboard.
    id: Option<String>,
    #[command(flatten)]
    serve: ServeArgs,
}

pub fn run_experiment(command: ExperimentCommand) -> anyhow::Result<ExitCode> {
    match command {
        ExperimentCommand::Read(command) => experiment::run(command),
        ExperimentCommand::Delete { id, yes } => delete(&id, yes),
        ExperimentCommand::Register { dir } => register(&dir),
    }
}

pub fn run_trial(command: TrialCommand) -> anyhow::Result<ExitCode> {
    match command {
        TrialCommand::Read(command) => experiment::run_trial(command),
        TrialCommand::Kill { id, trial } => {
            let client = running_api(&id)?;
            let path = format!("/trials/{}/kill", crate::client::path_segment(&trial));
            let answer = client.send("POST", &path, None)?;
            // The trial's host cannot be reached: the API says what was done and what is left.
            match answer["message"]
                .as_str()
                .filter(|_| answer["pending"] == true)
            {
                Some(message) => outln!("trial {trial} of experiment {id}: {message}"),
                None => outln!("trial {trial} of experiment {id} killed"),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// How long a command waits for the API of a run that is starting: its process is recorded
/// before it serves its API (a resume first loads its plugins and checks the run), and a
/// command right after `knob resume --detach` comes in between. Bounded, since a run that
/// never serves one (stuck in its preparation) should not hold the command for ever.
const STARTING_RUN_WAIT: Duration = Duration::from_secs(30);
/// After this long waiting for a starting run, say why the command has not answered yet.
const STARTING_RUN_NOTE_AFTER: Duration = Duration::from_secs(2);

/// The API of a running experiment, or a one-line error saying what to do instead. A run
/// still starting is waited for (up to [`STARTING_RUN_WAIT`]); one that is ending is not.
fn running_api(id: &str) -> anyhow::Result<ApiClient> {
    let registry = Registry::open_default()?;
    let waiting_since = Instant::now();
    let mut noted = false;
    loop {
        let entry = registry.get(id)?;
        if let Some(client) = ApiClient::for_running(&entry) {
            return Ok(client);
        }
        let Some(pid) = entry.running_pid() else {
            anyhow::bail!(
                "experiment {id} is not running ({}); `knob resume {id}` continues it",
                entry.shown_status()
            )
        };
        if entry.run_over() {
            // Its API closed with the run's end; the process still sends its notifications
            // and records the end (it said "not running (RUNNING)").
            anyhow::bail!(
                "experiment {id} is ending: its run is over and its process is closing; `knob resume {id}` continues it once that process has exited"
            )
        }
        let waited = waiting_since.elapsed();
        if waited >= STARTING_RUN_WAIT {
            anyhow::bail!(
                "experiment {id} is still starting after {} s (pid {pid}) and serves no API yet; try again in a moment (the run's output says what it is doing: {} for a detached run)",
                STARTING_RUN_WAIT.as_secs(),
                crate::create::log_path(id).display()
            )
        }
        if !noted && waited >= STARTING_RUN_NOTE_AFTER {
            errln!(
                "experiment {id} is starting (pid {pid}); waiting up to {} s for its API",
                STARTING_RUN_WAIT.as_secs()
            );
            noted = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A number stays a number (so the API can say why -1 is refused); anything else is text.
fn json_scalar(text: &str) -> Value {
    serde_json::from_str::<Value>(text.trim())
        .ok()
        .filter(Value::is_number)
        .unwrap_or_else(|| Value::String(text.to_string()))
}

fn with_field((id, value): (String, Value), field: &'static str) -> (String, &'static str, Value) {
    (id, field, value)
}

pub fn update(command: UpdateCommand) -> anyhow::Result<ExitCode> {
    let (id, field, value) = match command {
        UpdateCommand::Concurrency(new) => {
            with_field(new.id_and_value("concurrency")?, "trialConcurrency")
        }
        UpdateCommand::Trialnum(new) => with_field(new.id_and_value("trialnum")?, "maxTrialNumber"),
        UpdateCommand::Duration(new) => {
            with_field(new.id_and_value("duration")?, "maxExperimentDuration")
        }
        UpdateCommand::Searchspace { id, file } => {
            // Checked here as `knob space validate` checks it, so that a problem names the file,
            // line and column; the experiment checks it again against its tuner. Sent to the
            // route of its own, which takes a space as large as a config's searchSpaceFile.
            let (_, space) = crate::space::read_space_value(&file)?;
            let client = running_api(&id)?;
            client.send("PUT", "/experiment/search-space", Some(&space))?;
            outln!("experiment {id}: searchSpace updated");
            return Ok(ExitCode::SUCCESS);
        }
    };
    let body = json!({ field: value });
    knob_core::api::check_update(&body).map_err(|why| anyhow::anyhow!("{why}"))?;
    let client = running_api(&id)?;
    client.send("PATCH", "/experiment", Some(&body))?;
    outln!("experiment {id}: {field} updated");
    Ok(ExitCode::SUCCESS)
}

/// `knob view`: serves the dashboard and a read-only API from the store until Ctrl-C.
pub fn view(args: ViewArgs) -> anyhow::Result<ExitCode> {
    let Some(id) = args.id.clone() else {
        return view_every_experiment(args);
    };
    let entry = Registry::open_default()?.get(&id)?;
    crate::experiment::open(&entry)?;
    if ApiClient::for_running(&entry).is_some() {
        errln!(
            "note: experiment {id} is running and serves its own dashboard on port {}",
            entry.port.unwrap_or_default()
        );
    }
    let listener = args.serve.bind()?;
    let address = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        spawn_api(
            listener,
            entry.id.clone(),
            entry.dir.clone(),
            None,
            None,
            &args.serve,
        )?;
        outln!(
            "experiment {} (read-only): {} — Ctrl-C to quit",
            entry.id,
            dashboard_url(address)
        );
        let _ = std::io::stdout().flush();
        tokio::signal::ctrl_c().await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `knob view` with no id: a list of every experiment, each opening its read-only dashboard.
fn view_every_experiment(args: ViewArgs) -> anyhow::Result<ExitCode> {
    let registry = Registry::open_default()?;
    let listener = args.serve.bind()?;
    let address = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let config = knob_core::api::CatalogConfig {
            token: args.serve.token(),
            allowed_hosts: args.serve.allow_host.clone(),
        };
        tokio::spawn(async move {
            if let Err(e) = knob_core::api::serve_catalog(listener, registry, config).await {
                errln!("error: {e}");
            }
        });
        outln!(
            "every experiment (read-only): {} — Ctrl-C to quit",
            dashboard_url(address)
        );
        let _ = std::io::stdout().flush();
        tokio::signal::ctrl_c().await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn register(dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    use knob_core::store::{StoreReader, DB_FILE_NAME};
    let dir = std::fs::canonicalize(dir)
        .map_err(|e| anyhow::anyhow!("cannot find {}: {e}", dir.display()))?;
    if !dir.join(DB_FILE_NAME).is_file() {
        anyhow::bail!(
            "{}: no {DB_FILE_NAME} here, so not a knob experiment's folder; give the folder that holds it (<experimentWorkingDirectory>/<id>)",
            dir.display()
        );
    }
    let summary = StoreReader::open(&dir)
        .and_then(|reader| reader.experiment())
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{}: no experiment was created in this store (its create failed); there is nothing to register",
                dir.display()
            )
        })?;
    let id = summary.experiment_id;
    let registry = Registry::open_default()?;
    if let Ok(existing) = registry.get(&id) {
        if existing.dir == dir {
            outln!("experiment {id} is registered already ({})", dir.display());
            return Ok(ExitCode::SUCCESS);
        }
        // The folder moved (renamed, copied back from a backup elsewhere): the entry names a
        // place that holds nothing any more, and pointing to `knob experiment list` left the
        // user without a way on. Only a folder gone whole: one whose store alone is missing
        // still holds trials' files, which a delete would remove.
        if existing.directory_gone() && !existing.dir.exists() {
            anyhow::bail!(
                "experiment {id} is registered with the folder {}, which is gone (moved or deleted outside knob); `knob experiment delete {id} --yes` forgets that entry (it removes nothing from {}), then `knob experiment register {}` registers this folder",
                existing.dir.display(),
                dir.display(),
                dir.display()
            );
        }
        anyhow::bail!(
            "experiment {id} is registered already, with the folder {}: a registry lists one folder per id; `knob experiment list` shows it",
            existing.dir.display()
        );
    }
    // Nothing runs it from this registry's point of view: one its store says is running was
    // copied while it ran, or its process is gone; to users that is a crash, which resume ends.
    let status = if summary.status.is_active() {
        knob_core::registry::CRASHED.to_string()
    } else {
        summary.status.as_str().to_string()
    };
    let entry = RegistryEntry {
        id: id.clone(),
        name: summary
            .config
            .get("experimentName")
            .and_then(Value::as_str)
            .map(str::to_string),
        dir: dir.clone(),
        status: status.clone(),
        pid: None,
        pid_start: None,
        port: None,
        api_host: None,
        created_ms: summary.start_time_ms,
    };
    if !registry.insert(&entry)? {
        anyhow::bail!("experiment {id} was registered by another knob meanwhile; `knob experiment list` shows it");
    }
    outln!(
        "experiment {id} registered ({status}, {}): `knob experiment show {id}`, `knob view {id}`, `knob resume {id}`",
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn delete(id: &str, yes: bool) -> anyhow::Result<ExitCode> {
    let registry = Registry::open_default()?;
    let entry: RegistryEntry = registry.get(id)?;
    if let Some(pid) = entry.running_pid() {
        return Err(crate::experiment::still_held(&entry, pid));
    }
    // Never the files of another experiment put at its path.
    crate::experiment::refuse_other_experiment(
        &entry,
        &format!(": deleting {id} would remove them"),
    )?;
    if !yes {
        eprint!(
            "delete experiment {id} and what knob made in {}? [y/N] ",
            entry.dir.display()
        );
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            outln!("experiment {id} kept");
            return Ok(ExitCode::FAILURE);
        }
    }
    // Held until its folder is gone. A run takes this lock first, before the registry says it
    // runs (`knob resume` opens the store, then marks itself RUNNING, then checks it): the
    // registry alone let a delete remove a resume's experiment under it. A run that starts
    // while this is held fails on the lock, or finds its store gone.
    let hold = match FolderHold::take(&entry.dir) {
        Err(RemoveError::Running { .. }) => anyhow::bail!(
            "experiment {id} is running (a knob process holds its store: it runs or is starting); stop it first with `knob stop {id}`"
        ),
        hold => hold?,
    };
    if entry.crashed() {
        for line in crate::resume::end_leftover_trials(&entry) {
            errln!("{line}");
        }
    }
    let left = hold.remove()?;
    registry.remove(id)?;
    // Its detached runs' output: knob's, and a new experiment of the same id would append to it.
    let _ = std::fs::remove_file(crate::create::log_path(id));
    if left.is_empty() {
        outln!("experiment {id} deleted ({})", entry.dir.display());
    } else {
        // `trials/` itself is left only when the store could not be read to tell the trials'
        // folders from what someone put beside them: it is knob's, so not "not made by knob".
        let trials_whole = entry.dir.join("trials");
        let (whole, left): (Vec<PathBuf>, Vec<PathBuf>) =
            left.into_iter().partition(|p| *p == trials_whole);
        // Relative to the folder: what is kept in `trials/` is named `trials/NAME`.
        let names: Vec<String> = left
            .iter()
            .filter_map(|p| p.strip_prefix(&entry.dir).ok())
            .map(|n| crate::table::printable(&n.to_string_lossy()))
            .collect();
        let mut kept = Vec::new();
        if !whole.is_empty() {
            kept.push(
                "trials/ whole (its store could not be read to tell the trials' folders from what was put beside them)"
                    .to_string(),
            );
        }
        if !names.is_empty() {
            kept.push(format!(
                "what knob did not make in it: {}",
                names.join(", ")
            ));
        }
        outln!(
            "experiment {id} deleted; {} is kept with {}",
            entry.dir.display(),
            kept.join("; and ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
