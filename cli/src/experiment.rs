//! `knob experiment list|show|export` and `knob trial ls`: read an experiment's store, found
//! through the registry.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use knob_core::objectives::Ranking;
use knob_core::registry::{Registry, RegistryEntry, CRASHED};
use knob_core::store::{Direction, StoreReader, TrialQuery, TrialStatus, DB_FILE_NAME};

use serde_json::Value;

use crate::table::{final_cell, render};

#[derive(Subcommand)]
pub enum ExperimentCommand {
    /// Every experiment knob knows, oldest first.
    List {
        /// Accepted for nnictl's `experiment list --all`: knob always lists every experiment,
        /// running or not.
        #[arg(long)]
        all: bool,
    },
    /// One experiment's status, config and trial counts.
    Show { id: String },
    /// Every trial with its parameters, status, times and metrics.
    Export {
        id: String,
        /// json or csv; without it, the `-o` file's extension (`.csv`, `.json`) decides, and
        /// JSON is written otherwise.
        #[arg(long, value_enum)]
        format: Option<ExportFormat>,
        /// Write here instead of standard output.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
    },
    /// The Pareto front of a multi-objective experiment (`objectives`): its feasible,
    /// non-dominated trials with each listed metric, best of the first objective first.
    Pareto {
        id: String,
        /// Every succeeded trial with a final result, with `front` and `feasible` columns.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Clone, Copy, PartialEq, Debug, ValueEnum)]
pub enum ExportFormat {
    Json,
    Csv,
}

impl ExportFormat {
    fn name(self) -> &'static str {
        match self {
            ExportFormat::Json => "json",
            ExportFormat::Csv => "csv",
        }
    }

    /// The format a file's extension names (`.csv`, `.json`, any case), if any.
    fn of_file(path: &std::path::Path) -> Option<ExportFormat> {
        let extension = path.extension()?.to_str()?.to_ascii_lowercase();
        match extension.as_str() {
            "csv" => Some(ExportFormat::Csv),
            "json" => Some(ExportFormat::Json),
            _ => None,
        }
    }

    /// What `knob experiment export` writes: `--format`, else what the `-o` file's extension
    /// names, else JSON. A `--format` that contradicts the extension is refused rather than
    /// obeyed with a warning: a `.csv` holding JSON (or the reverse) breaks whatever opens it
    /// later by its name (a spreadsheet, `pandas.read_csv`), long after a warning has scrolled
    /// by, and either fix (rename the file, drop `--format`) costs the user one word.
    fn for_export(
        format: Option<ExportFormat>,
        output: Option<&std::path::Path>,
    ) -> anyhow::Result<ExportFormat> {
        let named = output.and_then(|path| Some((path, ExportFormat::of_file(path)?)));
        match (format, named) {
            (Some(format), Some((path, named))) if format != named => anyhow::bail!(
                "--format {} contradicts the output file {}, whose extension says {}; name the file .{} or drop --format",
                format.name(),
                path.display(),
                named.name(),
                format.name()
            ),
            (Some(format), _) => Ok(format),
            (None, Some((_, named))) => Ok(named),
            (None, None) => Ok(ExportFormat::Json),
        }
    }
}

#[derive(Subcommand)]
pub enum TrialCommand {
    /// The trials of an experiment, in submission order.
    Ls {
        id: String,
        /// Only trials with this status (e.g. FAILED); repeat for several.
        #[arg(long)]
        status: Vec<String>,
        /// Only the N best trials by final result (by the tuner's optimize_mode), best first,
        /// as nnictl's `trial ls --head N`.
        #[arg(long, value_name = "N", conflicts_with = "tail")]
        head: Option<usize>,
        /// Only the N worst trials by final result, worst first (nnictl's `--tail N`).
        #[arg(long, value_name = "N")]
        tail: Option<usize>,
    },
}

pub fn run(command: ExperimentCommand) -> anyhow::Result<ExitCode> {
    let registry = Registry::open_default()?;
    match command {
        ExperimentCommand::List { all: _ } => list(&registry),
        ExperimentCommand::Show { id } => show(&registry.get(&id)?),
        ExperimentCommand::Export { id, format, output } => {
            let format = ExportFormat::for_export(format, output.as_deref())?;
            // Before the store is opened: reading a file to tell what it is, then closing it,
            // drops the POSIX locks SQLite holds on it for this whole process (the registry's
            // are dropped only where its file is refused, and the command ends there).
            if let Some(path) = &output {
                refuse_a_database(path)?;
            }
            let entry = registry.get(&id)?;
            let state = open(&entry)?.replay()?;
            // Written as it is made (the JSON of a million intermediate results is 160 MB, and
            // took 2 GB as one value); a failed write (a full disk) names the file.
            let write = |out: &mut dyn Write| -> anyhow::Result<()> {
                match format {
                    ExportFormat::Json => {
                        knob_core::export::write_json(&state, entry.crashed(), out)?
                    }
                    ExportFormat::Csv => knob_core::export::write_csv(&state, out)?,
                }
                Ok(out.flush()?)
            };
            match &output {
                Some(path) => write_replacing(path, write)
                    .with_context(|| format!("cannot write {}", path.display()))?,
                None => write(&mut std::io::BufWriter::new(std::io::stdout().lock()))
                    .context("cannot write to standard output")?,
            }
            Ok(ExitCode::SUCCESS)
        }
        ExperimentCommand::Pareto { id, all } => {
            let entry = registry.get(&id)?;
            let state = open(&entry)?.replay()?;
            stdoutln!("{}", pareto_table(&id, &state, all)?)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Writes a file with `write` so that it is either the old file or the whole new one: into a
/// new file beside it, renamed over it once written. Truncated first and then written, a failed
/// export (a full disk, a Ctrl-C in a long one) had left half a file where the previous export
/// was. A path that is not a regular file (`/dev/stdout`, a named pipe) is written in place, and
/// so is a file whose folder takes no new file; a link is followed, and the file it names
/// replaced; the old file's permissions are kept.
fn write_replacing(
    path: &std::path::Path,
    write: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let existing = std::fs::metadata(path).ok();
    if existing.as_ref().is_some_and(|meta| !meta.is_file()) {
        return write_in_place(path, write);
    }
    let target = match &existing {
        Some(_) => std::fs::canonicalize(path)?,
        None => path.to_path_buf(),
    };
    let name = target
        .file_name()
        .ok_or_else(|| anyhow::anyhow!("names no file"))?;
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(name);
    temporary_name.push(format!(".knob-export-{}", std::process::id()));
    let temporary = target.with_file_name(temporary_name);
    // As File::create makes it (0666 less the umask).
    let file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)
    {
        Ok(file) => file,
        // A writable file in a folder that takes no new file: written in place, as before.
        Err(_) if existing.is_some() => return write_in_place(path, write),
        Err(e) => return Err(e.into()),
    };
    let written = (|| -> anyhow::Result<()> {
        if let Some(meta) = &existing {
            file.set_permissions(meta.permissions())?;
        }
        let mut out = std::io::BufWriter::new(file);
        write(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(std::fs::rename(&temporary, &target)?)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

fn write_in_place(
    path: &std::path::Path,
    write: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let file = std::fs::File::create(path)?;
    write(&mut std::io::BufWriter::new(file))
}

/// An export written over an SQLite database, or over the write-ahead log, shared-memory index
/// or rollback journal beside one, destroys what that database holds: `-o` completed to the
/// experiment's own `experiment.db` (or to knob's `registry.db`) lost every trial. Any other
/// file is replaced, as nnictl's export replaces it.
fn refuse_a_database(path: &std::path::Path) -> anyhow::Result<()> {
    // Through symbolic links, so that a link to a store is seen as the store.
    let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let database = if is_sqlite_database(&resolved) {
        Some(resolved.clone())
    } else {
        let name = resolved.file_name().and_then(|name| name.to_str());
        name.and_then(|name| {
            ["-wal", "-shm", "-journal"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
        })
        .map(|main| resolved.with_file_name(main))
        .filter(|main| is_sqlite_database(main))
    };
    match database {
        Some(database) if database == resolved => anyhow::bail!(
            "cannot write {}: it is an SQLite database (an experiment's store or knob's registry), which the export would destroy; give -o another file",
            path.display()
        ),
        Some(database) => anyhow::bail!(
            "cannot write {}: it belongs to the SQLite database {} (an experiment's store or knob's registry), which the export would damage; give -o another file",
            path.display(),
            database.display()
        ),
        None => Ok(()),
    }
}

/// Whether `path` is a regular file that starts with SQLite's header. Only a regular file is
/// read: reading `-o /dev/stdout` on a terminal, or a named pipe, would wait for input.
fn is_sqlite_database(path: &std::path::Path) -> bool {
    use std::io::Read;
    const HEADER: &[u8; 16] = b"SQLite format 3\0";
    if !std::fs::metadata(path).is_ok_and(|meta| meta.is_file()) {
        return false;
    }
    let mut start = [0u8; 16];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut start))
        .is_ok_and(|()| &start == HEADER)
}

fn pareto_table(
    id: &str,
    state: &knob_core::store::ExperimentState,
    all: bool,
) -> anyhow::Result<String> {
    let (objectives, mut entries) = knob_core::objectives::of_state(state);
    if objectives.is_empty() {
        anyhow::bail!(
            "experiment {id} lists no objectives, so it has no Pareto front; `knob trial ls {id} --head 10` shows its best trials"
        );
    }
    if !all {
        let infeasible = entries.iter().filter(|e| !e.feasible).count();
        let incomplete = entries.iter().filter(|e| e.feasible && !e.complete).count();
        entries.retain(|e| e.pareto);
        // An empty front says why, rather than a header alone.
        if entries.is_empty() && infeasible + incomplete > 0 {
            let mut why = Vec::new();
            if infeasible > 0 {
                why.push(format!("{infeasible} broke a constraint"));
            }
            if incomplete > 0 {
                why.push(format!(
                    "{incomplete} reported an objective that is NaN or infinite"
                ));
            }
            return Ok(format!(
                "no trial is on the Pareto front ({}: `knob experiment pareto {id} --all` lists them)",
                why.join(", ")
            ));
        }
        if entries.is_empty() {
            return Ok(format!(
                "no trial of experiment {id} has reported its objectives yet"
            ));
        }
    }
    // Best of the first objective first, so the front reads as a curve.
    let first = objectives
        .iter()
        .position(|o| o.constraint.is_none())
        .unwrap_or(0);
    let maximize = objectives[first].direction() == Direction::Maximize;
    // A trial without a finite first objective goes last (a NaN had sorted first, as if best).
    entries.sort_by(|a, b| match (a.values[first], b.values[first]) {
        (Some(a), Some(b)) if maximize => b.total_cmp(&a),
        (Some(a), Some(b)) => a.total_cmp(&b),
        (a, b) => b.is_some().cmp(&a.is_some()),
    });
    let mut header: Vec<String> = vec!["trial".into()];
    for objective in &objectives {
        header.push(match (&objective.mode, &objective.constraint) {
            (_, Some(constraint)) => {
                format!("{} ({})", objective.metric, String::from(*constraint))
            }
            (Some(mode), None) => format!("{} ({mode})", objective.metric),
            (None, None) => objective.metric.clone(),
        });
    }
    if all {
        header.push("feasible".into());
        header.push("front".into());
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let mut row = vec![e.trial_id.clone()];
            row.extend(e.reported.iter().map(|v| reported_cell(*v)));
            if all {
                row.push(if e.feasible { "yes" } else { "no" }.into());
                row.push(if e.pareto { "yes" } else { "no" }.into());
            }
            row
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    Ok(render(&header, &rows))
}

/// An objective's cell as the trial reported it: a NaN or infinity spelt so (it is never on the
/// front, and a blank would not say why), `-` for a metric it did not report as a number.
fn reported_cell(value: Option<f64>) -> String {
    match value {
        Some(v) if v.is_nan() => "nan".into(),
        Some(v) if v.is_infinite() => if v > 0.0 { "inf" } else { "-inf" }.into(),
        other => crate::table::metric(other),
    }
}

pub fn run_trial(command: TrialCommand) -> anyhow::Result<ExitCode> {
    let registry = Registry::open_default()?;
    match command {
        TrialCommand::Ls {
            id,
            status,
            head,
            tail,
        } => {
            let statuses = status
                .iter()
                .map(|s| {
                    TrialStatus::parse(&s.to_ascii_uppercase()).ok_or_else(|| {
                        let known: Vec<&str> =
                            TrialStatus::ALL.iter().map(|s| s.as_str()).collect();
                        anyhow::anyhow!(
                            "unknown trial status {s:?}; use one of {}",
                            known.join(", ")
                        )
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let reader = open(&registry.get(&id)?)?;
            let mut trials = reader.trials(&TrialQuery {
                statuses,
                offset: 0,
                limit: None,
            })?;
            if let Some((count, best_first)) = head.map(|n| (n, true)).or(tail.map(|n| (n, false)))
            {
                let ranking = match reader.experiment()? {
                    Some(summary) => Ranking::of_config(&summary.config),
                    None => Ranking::new(Direction::Maximize, &[]),
                };
                trials = ranked(trials, &ranking, best_first, count);
            }
            // Population members (PBT) show where they come from; other experiments have no
            // such column.
            let lineages = reader.lineages()?;
            let mut schedules = std::collections::HashMap::new();
            for t in &trials {
                let steps = knob_core::export::schedule(&t.trial_id, &lineages, |id| {
                    Ok::<_, knob_core::store::StoreError>(reader.trial(id)?.map(|r| r.parameters))
                })?;
                if let Some(steps) = steps {
                    schedules.insert(t.trial_id.clone(), schedule_cell(&steps));
                }
            }
            let rows: Vec<Vec<String>> = trials
                .iter()
                .map(|t| {
                    let duration = match (t.started_ms, t.ended_ms) {
                        (Some(start), Some(end)) => {
                            format!("{:.1}s", (end - start) as f64 / 1000.0)
                        }
                        _ => "-".into(),
                    };
                    let mut row = vec![
                        t.trial_id.clone(),
                        t.sequence.to_string(),
                        t.status.as_str().to_string(),
                        final_cell(t.final_value, t.final_raw.as_deref()),
                        duration,
                        t.attempts.to_string(),
                        t.environment_id.clone().unwrap_or_else(|| "-".into()),
                        crate::table::parameters_cell(&t.parameters),
                        // A waiting trial: why it has not started (a cluster job's pending
                        // reason, no free GPU); else why it ended (or its last attempt did).
                        // A memory request raised after running out of memory is said too.
                        reason_cell(
                            t.waiting_reason.clone().or_else(|| t.end_message.clone()),
                            [t.memory_request_mib, t.memory_request_peak_mib],
                            [t.gpu_memory_request_mib, t.gpu_memory_request_peak_mib],
                        ),
                    ];
                    if !lineages.is_empty() {
                        row.insert(7, lineage_cell(lineages.get(&t.trial_id)));
                        let schedule = schedules.get(&t.trial_id).cloned();
                        row.insert(8, schedule.unwrap_or_else(|| "-".into()));
                    }
                    row
                })
                .collect();
            let mut header = vec![
                "trial",
                "seq",
                "status",
                "final",
                "duration",
                "attempts",
                "environment",
                "parameters",
                "reason",
            ];
            if !lineages.is_empty() {
                header.insert(7, "lineage");
                header.insert(8, "schedule");
            }
            stdoutln!("{}", render(&header, &rows))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `knob trial ls`'s schedule column for a population member: each parameter that changed
/// along its ancestors, as its value from step 0 and each later value `@` the step it took
/// over from, e.g. `lr 0.05 0.06@4 0.072@12`; `-` where none changed (the first generation).
fn schedule_cell(steps: &[knob_core::export::ScheduleStep]) -> String {
    let mut names: Vec<&String> = Vec::new();
    for step in steps {
        if let Some(Value::Object(map)) = &step.parameters {
            for key in map.keys() {
                if !names.contains(&key) {
                    names.push(key);
                }
            }
        }
    }
    let mut parts = Vec::new();
    for name in names {
        let values: Vec<(u64, Option<&Value>)> = steps
            .iter()
            .map(|s| (s.from_step, s.parameters.as_ref().and_then(|p| p.get(name))))
            .collect();
        if values.windows(2).all(|w| w[0].1 == w[1].1) {
            continue;
        }
        let mut cell = name.clone();
        let mut last: Option<Option<&Value>> = None;
        for (index, (step, value)) in values.iter().enumerate() {
            if last == Some(*value) {
                continue;
            }
            last = Some(*value);
            let shown = value.map_or_else(|| "-".to_string(), short_value);
            if index == 0 {
                cell.push_str(&format!(" {shown}"));
            } else {
                cell.push_str(&format!(" {shown}@{step}"));
            }
        }
        parts.push(cell);
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// A parameter value for a table: numbers to 4 significant digits, strings as they are.
fn short_value(value: &Value) -> String {
    match value {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            let text = format!("{x:.3e}");
            text.parse::<f64>()
                .map(|rounded| rounded.to_string())
                .unwrap_or(text)
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `knob trial ls`'s lineage column for a population member: `from <parent>@<step>, replaces
/// <trial>`, or `-` for one of the first generation.
fn lineage_cell(lineage: Option<&knob_core::store::Lineage>) -> String {
    let Some(lineage) = lineage else {
        return "-".into();
    };
    let mut parts = Vec::new();
    if let Some(parent) = &lineage.parent {
        match lineage.parent_step {
            Some(step) => parts.push(format!("from {parent}@{step}")),
            None => parts.push(format!("from {parent}")),
        }
    }
    if let Some(replaced) = &lineage.replaces {
        parts.push(format!("replaces {replaced}"));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// `knob trial ls`'s reason column: the reason, and the memory requests that were raised,
/// each `[request, peak of the attempt it was learned from]`.
fn reason_cell(
    reason: Option<String>,
    [memory_request_mib, memory_peak_mib]: [Option<u64>; 2],
    [gpu_memory_request_mib, gpu_memory_peak_mib]: [Option<u64>; 2],
) -> String {
    let used =
        |peak: Option<u64>| peak.map_or(String::new(), |mib| format!(" at a {mib} MiB peak"));
    let raised: Vec<String> = [
        memory_request_mib.map(|mib| {
            format!(
                "memory request {mib} MiB after out of memory{}",
                used(memory_peak_mib)
            )
        }),
        gpu_memory_request_mib.map(|mib| {
            format!(
                "GPU memory request {mib} MiB after out of GPU memory{}",
                used(gpu_memory_peak_mib)
            )
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    match (reason, raised.is_empty()) {
        (reason, true) => reason.unwrap_or_default(),
        (Some(reason), false) => format!("{reason} ({})", raised.join(", ")),
        (None, false) => raised.join(", "),
    }
}

/// The `count` trials that rank (`Ranking`) first: best first when `best_first`, worst first
/// otherwise. Ties keep submission order.
fn ranked(
    trials: Vec<knob_core::store::TrialRow>,
    ranking: &Ranking,
    best_first: bool,
    count: usize,
) -> Vec<knob_core::store::TrialRow> {
    // A trial that does not rank (failed, NaN, breaks a constraint) is neither among the best
    // nor among the worst (`knob experiment pareto --all` shows the infeasible ones).
    let mut valued: Vec<_> = trials
        .into_iter()
        .filter(|t| ranking.ranks_row(t))
        .collect();
    let value = |t: &knob_core::store::TrialRow| t.final_value.unwrap_or(f64::NAN);
    valued.sort_by(|a, b| {
        // `best_first` on the values alone, then the earlier trial first either way.
        let by_value = ranking.best_first((value(a), 0), (value(b), 0));
        let by_value = if best_first {
            by_value
        } else {
            by_value.reverse()
        };
        by_value.then(a.sequence.cmp(&b.sequence))
    });
    valued.truncate(count);
    valued
}

/// The store of a registered experiment, or a one-line error; one whose directory was moved or
/// deleted by hand says so and how to forget it, rather than "no such file".
pub(crate) fn open(entry: &RegistryEntry) -> anyhow::Result<StoreReader> {
    refuse_gone_folder(entry)?;
    let reader = StoreReader::open(&entry.dir).map_err(|e| store_error(entry, &e))?;
    refuse_other_store(entry, &reader, "")?;
    Ok(reader)
}

/// Why a command that needs an experiment's process gone (resume, delete) cannot go on while
/// process `pid` holds it: a run, or one already over whose process sends its last
/// notifications (which `knob experiment list` shows ended, so "is running" read as false).
pub(crate) fn still_held(entry: &RegistryEntry, pid: u32) -> anyhow::Error {
    let id = &entry.id;
    if entry.run_over() {
        anyhow::anyhow!(
            "experiment {id} has ended ({}) and its process {pid} is sending its last notifications (at most {}s); wait for it to exit, or `knob stop {id}` gives them up",
            entry.status,
            crate::create::NOTIFY_AT_EXIT.as_secs()
        )
    } else {
        anyhow::anyhow!(
            "experiment {id} is running (pid {pid}); stop it first with `knob stop {id}`"
        )
    }
}

/// A store error of a registered experiment as one line naming it, with its id in the
/// `knob experiment delete ID` the advice gives (the store knows its file, not the id it is
/// registered under).
pub(crate) fn store_error(
    entry: &RegistryEntry,
    error: &knob_core::store::StoreError,
) -> anyhow::Error {
    let text = error.to_string().replace(
        "`knob experiment delete ID ",
        &format!("`knob experiment delete {} ", entry.id),
    );
    anyhow::anyhow!("experiment {}: {text}", entry.id)
}

/// The error of an experiment whose directory was moved or deleted by hand, or holds another
/// experiment's store, for a command that needs its store.
pub(crate) fn refuse_gone(entry: &RegistryEntry) -> anyhow::Result<()> {
    refuse_gone_folder(entry)?;
    refuse_other_experiment(entry, "")
}

/// [`refuse_gone`] without looking into the store.
fn refuse_gone_folder(entry: &RegistryEntry) -> anyhow::Result<()> {
    if entry.directory_gone() && entry.dir.is_dir() {
        // The folder (trials' files, the config's copy) is there; only the store went.
        anyhow::bail!(
            "experiment {id}: its store {store} is missing (its folder is still there): put the file back from a backup, or `knob experiment delete {id} --yes` forgets the experiment",
            id = entry.id,
            store = entry.dir.join(DB_FILE_NAME).display()
        );
    }
    if entry.directory_gone() {
        anyhow::bail!(
            "experiment {id}: its directory {dir} is gone (moved or deleted outside knob); `knob experiment delete {id} --yes` forgets it",
            id = entry.id,
            dir = entry.dir.display()
        );
    }
    Ok(())
}

/// Refuses an entry whose folder holds another experiment's store (that folder moved or copied
/// to this path by hand): its commands showed, resumed and deleted the other experiment under
/// this id, and a delete removed the other's files. `doing` says what is refused, for a delete.
/// A store that cannot be read is left to the command's own opening of it.
pub(crate) fn refuse_other_experiment(entry: &RegistryEntry, doing: &str) -> anyhow::Result<()> {
    match StoreReader::open(&entry.dir) {
        Ok(reader) => refuse_other_store(entry, &reader, doing),
        Err(_) => Ok(()),
    }
}

/// [`refuse_other_experiment`] with the store already open.
fn refuse_other_store(
    entry: &RegistryEntry,
    reader: &StoreReader,
    doing: &str,
) -> anyhow::Result<()> {
    let Some(other) = reader
        .experiment()
        .ok()
        .flatten()
        .map(|summary| summary.experiment_id)
        .filter(|other| *other != entry.id)
    else {
        return Ok(());
    };
    anyhow::bail!(
        "experiment {id}: its folder {dir} holds the store of experiment {other}, not {id}'s (a folder moved or copied there by hand){doing}; move that folder away (`knob experiment register` finds {other} wherever it is put) and put {id}'s back at {dir}",
        id = entry.id,
        dir = entry.dir.display()
    )
}

fn list(registry: &Registry) -> anyhow::Result<ExitCode> {
    let entries = registry.list()?;
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let (trials, dir) = if e.directory_gone() && e.dir.is_dir() {
                ("-".into(), format!("{} (store missing)", e.dir.display()))
            } else if e.directory_gone() {
                ("-".into(), format!("{} (gone)", e.dir.display()))
            } else {
                let trials = StoreReader::open(&e.dir)
                    .and_then(|r| r.trial_counts())
                    .map(|counts| counts.values().sum::<u64>().to_string())
                    .unwrap_or_else(|_| "?".into());
                (trials, e.dir.display().to_string())
            };
            vec![
                e.id.clone(),
                e.name.clone().unwrap_or_default(),
                e.shown_status(),
                trials,
                dir,
            ]
        })
        .collect();
    if rows.is_empty() {
        stdoutln!("no experiments yet; start one with `knob create --config FILE`")?;
    } else {
        stdoutln!(
            "{}",
            render(&["id", "name", "status", "trials", "directory"], &rows)
        )?;
        let gone = |e: &&RegistryEntry| e.directory_gone();
        if entries.iter().filter(gone).any(|e| !e.dir.is_dir()) {
            stdoutln!(
                "(gone): moved or deleted outside knob; `knob experiment delete ID --yes` forgets one"
            )?;
        }
        if entries.iter().filter(gone).any(|e| e.dir.is_dir()) {
            stdoutln!(
                "(store missing): experiment.db was removed from the folder; put it back from a backup, or `knob experiment delete ID --yes` forgets one"
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn show(entry: &RegistryEntry) -> anyhow::Result<ExitCode> {
    let reader = open(entry)?;
    let state = reader.replay()?;
    stdoutln!("id:        {}", entry.id)?;
    if entry.crashed() {
        stdoutln!(
            "status:    {CRASHED}: its process {} is gone; `knob resume {}` continues it (last recorded {})",
            entry.pid.unwrap_or_default(),
            entry.id,
            state.status.as_str()
        )?;
    } else if let Some(end) = entry.end_missing_from_store(state.status) {
        stdoutln!(
            "status:    {end} (its store could not record it and still says {})",
            state.status.as_str()
        )?;
    } else {
        stdoutln!("status:    {}", state.status.as_str())?;
    }
    if let Some(message) = &state.status_message {
        stdoutln!("message:   {message}")?;
    }
    stdoutln!("directory: {}", entry.dir.display())?;
    let counts = reader.trial_counts()?;
    let counts: Vec<String> = counts
        .iter()
        .map(|(s, n)| format!("{} {n}", s.as_str()))
        .collect();
    stdoutln!(
        "trials:    {}",
        if counts.is_empty() {
            "none".into()
        } else {
            counts.join(", ")
        }
    )?;
    // Why the trials that wait have not started (a host not reached yet, no free GPU), as
    // `knob trial ls` shows them per trial; a crashed run's reasons are stale, so not shown.
    if !entry.crashed() {
        let waiting = reader.trials(&TrialQuery {
            statuses: vec![TrialStatus::Waiting],
            limit: Some(SHOWN_WAITING_TRIALS),
            ..TrialQuery::default()
        })?;
        for line in waiting_lines(
            waiting
                .iter()
                .map(|t| (t.trial_id.as_str(), t.waiting_reason.as_deref())),
        ) {
            stdoutln!("waiting:   {line}")?;
        }
    }
    stdoutln!("config:    {}", serde_json::to_string(&state.config)?)?;
    Ok(ExitCode::SUCCESS)
}

/// How many waiting trials `knob experiment show` reads to say why they wait: more than a run
/// holds at once in practice (they wait for a slot of `trialConcurrency`).
const SHOWN_WAITING_TRIALS: u64 = 1000;

/// `knob experiment show`'s lines for the waiting trials: one per reason, in the order the
/// reasons are first met, naming up to five trials each.
fn waiting_lines<'a>(trials: impl Iterator<Item = (&'a str, Option<&'a str>)>) -> Vec<String> {
    const NAMED: usize = 5;
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for (id, reason) in trials {
        let reason = reason.unwrap_or("not placed yet");
        match by_reason.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, ids)) => ids.push(id),
            None => by_reason.push((reason, vec![id])),
        }
    }
    by_reason
        .into_iter()
        .map(|(reason, ids)| {
            let mut named = ids[..ids.len().min(NAMED)].join(", ");
            if ids.len() > NAMED {
                named.push_str(&format!(" and {} more", ids.len() - NAMED));
            }
            let count = crate::table::counted(ids.len(), "trial");
            format!("{count} ({named}): {reason}")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::waiting_lines;

    #[test]
    fn waiting_trials_are_grouped_by_reason_naming_five_of_each() {
        let trials = [
            ("a", Some("no free GPU")),
            ("b", None),
            ("c", Some("no free GPU")),
            ("d", Some("no free GPU")),
            ("e", Some("no free GPU")),
            ("f", Some("no free GPU")),
            ("g", Some("no free GPU")),
        ];
        assert_eq!(
            waiting_lines(trials.into_iter()),
            [
                "6 trials (a, c, d, e, f and 1 more): no free GPU",
                "1 trial (b): not placed yet",
            ]
        );
        assert!(waiting_lines(std::iter::empty()).is_empty());
    }
}
