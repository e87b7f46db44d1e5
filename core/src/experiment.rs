//! Creating an experiment: config -> id -> directory -> store -> registry entry.

use std::path::{Path, PathBuf};

use rand::Rng;

use crate::config::{self, ConfigErrors, ExperimentConfig};
use crate::manager::Experiment;
use crate::registry::{Registry, RegistryEntry, RegistryError};
use crate::store::{ExperimentStatus, Store, StoreError, StoreEvent, WriterLock};

/// Why an experiment could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// Every problem in the config, one per line.
    #[error("{}", .0.lines().join("\n"))]
    Config(ConfigErrors),
    #[error("experiment id {0:?} is not valid: use 1 to 64 letters, digits, '-' or '_', not starting with '-'")]
    BadId(String),
    #[error("experiment {id} already exists (in {dir}); continue it with `knob resume {id}` or choose another --id")]
    IdTaken { id: String, dir: String },
    #[error("{dir} holds an experiment that this knob's registry does not list (a copied folder, or one made with another KNOB_HOME), so `knob resume` cannot find it; `knob experiment register {dir}` adds it, or move the folder away or choose another --id to start anew")]
    Unregistered { dir: String },
    #[error("the experiment folder {dir} already exists and holds files knob did not make; move them away, or choose another --id or experimentWorkingDirectory")]
    FolderNotEmpty { dir: String },
    #[error("cannot create the experiment directory {dir}: {message}")]
    Directory { dir: String, message: String },
    #[error("the config cannot be recorded in the experiment's store ({message}); this is a bug in knob's config checks, please report it with the config")]
    Unstorable { message: String },
    #[error("{path}: cannot create the experiment store: the disk is full ({message}); free space on its filesystem or choose another experimentWorkingDirectory")]
    DiskFull { path: String, message: String },
    // Transparent: `{0}` with `#[from]` would also make the store's error this one's source,
    // and the binary's `{:#}` would print the line twice.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The file that marks a folder as made by knob for an experiment. `knob experiment delete`
/// removes a folder only when nothing but knob's own entries ([`OWNED_ENTRIES`]) is left in it,
/// and `create` never adopts a folder that holds anything else.
pub const MARKER_FILE_NAME: &str = ".knob-experiment";

/// The file in an experiment's folder that names the config file it was created from.
pub const CONFIG_SOURCE_FILE: &str = "config-source";

/// What knob makes at the top of an experiment's folder, and so all that `delete` removes:
/// anything else was put there by someone else and is left (and listed). Trials write only
/// inside `trials/<trial id>/`, and into `.knob-python/`, which their training service shares
/// between them.
pub const OWNED_ENTRIES: &[&str] = &[
    MARKER_FILE_NAME,
    crate::store::DB_FILE_NAME,
    crate::store::ALIVE_FILE_NAME,
    "experiment.db-wal",
    "experiment.db-shm",
    "experiment.db-journal",
    crate::store::LOCK_FILE_NAME,
    // The writer lock's rollback journal, left by a writer killed while it held the lock.
    LOCK_JOURNAL_FILE_NAME,
    CONFIG_SOURCE_FILE,
    TRIALS_DIR,
    // The Python folder (`knob_trial`, the `nni` shim) that the built-in training services write
    // once for all the experiment's trials on this machine (training-services' `trial_python`).
    ".knob-python",
    // NNI's dispatcher (`nni_dispatch`): its logs and its algorithm's checkpoints, as NNI lays
    // them out.
    "log",
    "checkpoint",
    // What a training service keeps of its own in the folder (a cluster's job scripts and
    // logs), each service under `services/<its name>/`: one entry for all of them, so that the
    // core names no platform and a new service needs no change here.
    SERVICES_DIR,
];

/// The folder of [`OWNED_ENTRIES`] that training services keep their own files in.
pub const SERVICES_DIR: &str = "services";

const LOCK_JOURNAL_FILE_NAME: &str = "experiment.db.writer-lock-journal";

/// Why an experiment's folder was not removed.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    /// A knob process holds the experiment's store: it runs, or it is starting (a `knob resume`
    /// takes the store before the registry says it runs).
    #[error("{dir}: a knob process holds the experiment's store (it runs or is starting); stop it with `knob stop` first")]
    Running { dir: String },
    #[error("cannot delete {dir}: {message}")]
    Failed { dir: String, message: String },
}

/// An experiment's folder held for removal by its store's writer lock ([`WriterLock`]), taken
/// as a manager takes it: no run of the experiment is under way while it is held, and none
/// starts (`Store::open` and `Store::open_existing` take the lock first).
pub struct FolderHold {
    dir: PathBuf,
    /// `None` for a folder that did not exist: there is nothing to hold.
    _lock: Option<WriterLock>,
}

impl FolderHold {
    /// Fails with [`RemoveError::Running`] while a run holds the store. Waits for no holder.
    pub fn take(dir: &Path) -> Result<FolderHold, RemoveError> {
        let lock = if dir.is_dir() {
            let lock = WriterLock::take(dir).map_err(|e| match e {
                StoreError::Locked { .. } => RemoveError::Running {
                    dir: dir.display().to_string(),
                },
                e => RemoveError::Failed {
                    dir: dir.display().to_string(),
                    message: format!("cannot take its store's writer lock: {e}"),
                },
            })?;
            Some(lock)
        } else {
            None
        };
        Ok(FolderHold {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    /// Removes what knob made in the folder ([`OWNED_ENTRIES`]), and the folder if that
    /// emptied it; then lets go of the lock. Returns what was left: entries knob did not make,
    /// which are never touched. A missing folder is not an error (there is nothing to remove).
    /// In `trials/`, only the folders of the store's trials are knob's ([`remove_trials`]).
    ///
    /// The lock's own file goes last, after the store: a `knob resume` that opens the lock file
    /// once it is unlinked (a new file, so not held by this) finds the store gone already.
    pub fn remove(self) -> Result<Vec<PathBuf>, RemoveError> {
        let failed = |e: std::io::Error| RemoveError::Failed {
            dir: self.dir.display().to_string(),
            message: e.to_string(),
        };
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(failed(e)),
        };
        let lock_files = [crate::store::LOCK_FILE_NAME, LOCK_JOURNAL_FILE_NAME];
        // Read before the store goes.
        let trial_ids = stored_trial_ids(&self.dir);
        let mut left = Vec::new();
        for entry in entries {
            let entry = entry.map_err(failed)?;
            let path = entry.path();
            let name = entry.file_name();
            if !OWNED_ENTRIES.iter().any(|owned| name == *owned) {
                left.push(path);
                continue;
            }
            if lock_files.iter().any(|lock| name == *lock) {
                continue;
            }
            // symlink_metadata: a link in knob's place is removed as a link, never followed.
            let is_dir = std::fs::symlink_metadata(&path).map_err(failed)?.is_dir();
            if is_dir && name == TRIALS_DIR {
                remove_trials(&path, trial_ids.as_ref(), &mut left).map_err(failed)?;
                continue;
            }
            let removed = if is_dir {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.map_err(failed)?;
        }
        for lock in lock_files {
            match std::fs::remove_file(self.dir.join(lock)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(failed(e)),
                _ => {}
            }
        }
        if left.is_empty() {
            std::fs::remove_dir(&self.dir).map_err(failed)?;
        }
        left.sort();
        Ok(left)
    }
}

/// The folder of [`OWNED_ENTRIES`] that holds one folder per trial, named by its id.
const TRIALS_DIR: &str = "trials";

/// The ids of the trials an experiment's store records; `None` when it cannot be read.
fn stored_trial_ids(dir: &Path) -> Option<std::collections::HashSet<String>> {
    let reader = crate::store::StoreReader::open(dir).ok()?;
    let rows = reader.trials(&crate::store::TrialQuery::default()).ok()?;
    Some(rows.into_iter().map(|row| row.trial_id).collect())
}

/// Removes from `trials/` the folder of each trial in `trial_ids`, and `trials/` itself once
/// empty. Anything else in it was put there by someone else (notes, a model copied beside the
/// trials' own): it is left and pushed to `left`; the whole folder had been removed with it.
/// Without the ids (a store that cannot be read), nothing in it is told to be knob's, and it is
/// left whole.
fn remove_trials(
    trials: &Path,
    trial_ids: Option<&std::collections::HashSet<String>>,
    left: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    let Some(trial_ids) = trial_ids else {
        left.push(trials.to_path_buf());
        return Ok(());
    };
    let mut kept = false;
    for entry in std::fs::read_dir(trials)? {
        let entry = entry?;
        let path = entry.path();
        let is_trial = entry
            .file_name()
            .to_str()
            .is_some_and(|name| trial_ids.contains(name));
        if !is_trial {
            left.push(path);
            kept = true;
        } else if std::fs::symlink_metadata(&path)?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    if !kept {
        std::fs::remove_dir(trials)?;
    }
    Ok(())
}

/// A new experiment id: 8 lowercase letters and digits, as NNI makes them.
pub fn new_experiment_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..8)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

/// The rule for an id given with `--id` ([`CreateError::BadId`] otherwise): it names the
/// experiment's folder and its log (`$KNOB_HOME/logs/ID.log`), so it is checked before either
/// is made. Not starting with `-`: every command that takes the id would read it as an option
/// (`knob trial ls -x1`: "unexpected argument '-x'").
pub fn check_id(id: &str) -> Result<(), CreateError> {
    let valid = (1..=64).contains(&id.len())
        && !id.starts_with('-')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if valid {
        Ok(())
    } else {
        Err(CreateError::BadId(id.to_string()))
    }
}

fn now_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

/// Reads and validates a config (its training services checked by their plugins, from
/// `services`); returns it with its warnings (one line each).
pub fn load_config(
    config_path: &Path,
    services: &dyn config::ServiceSource,
) -> Result<(ExperimentConfig, Vec<String>), CreateError> {
    let loaded = config::load_file(config_path, services).map_err(CreateError::Config)?;
    let warnings = loaded.warnings.iter().map(ToString::to_string).collect();
    Ok((loaded.config, warnings))
}

/// Allocates the experiment's id and directory, records its creation in a new store and
/// registers it.
pub fn create(
    config: ExperimentConfig,
    requested_id: Option<&str>,
    registry: &Registry,
) -> Result<(Experiment, Store), CreateError> {
    // Secrets serialize as "***": the stored config never holds a password in clear. Never
    // stored as null, which `knob resume` could not read back; made before anything is claimed.
    // The config's checks refuse what cannot be written (a path that is not UTF-8).
    let config_json = serde_json::to_value(&config).map_err(|e| CreateError::Unstorable {
        message: e.to_string(),
    })?;
    let id = match requested_id {
        Some(id) => {
            check_id(id)?;
            id.to_string()
        }
        None => new_experiment_id(),
    };
    let dir: PathBuf = config.experiment_working_directory.join(&id);
    let entry = RegistryEntry {
        id: id.clone(),
        name: config.experiment_name.clone(),
        dir: dir.clone(),
        status: ExperimentStatus::Initialized.as_str().into(),
        pid: Some(std::process::id()),
        pid_start: None,
        port: None,
        api_host: None,
        created_ms: now_ms(),
    };
    // The registry decides who owns an id. It is claimed before the folder is made, so of two
    // creates of one id the loser has made nothing; a leftover folder of the same name (a copy,
    // or one of a deleted registry) is never reused unless it is empty.
    let taken = |dir: &Path| CreateError::IdTaken {
        id: id.clone(),
        dir: dir.display().to_string(),
    };
    if let Ok(existing) = registry.get(&id) {
        return Err(taken(&existing.dir));
    }
    check_folder(&dir)?;
    if !registry.insert(&entry)? {
        let winner = registry
            .get(&id)
            .map(|e| e.dir)
            .unwrap_or_else(|_| dir.clone());
        return Err(taken(&winner));
    }
    if let Err(e) = make_folder(&dir) {
        // Nothing else refers to the entry yet: undo the claim so the id stays free.
        let _ = registry.remove(&id);
        return Err(e);
    }
    let created = Store::open(&dir).and_then(|store| {
        store
            .append(StoreEvent::ExperimentCreated {
                experiment_id: id.clone(),
                config: config_json,
                start_time_ms: entry.created_ms,
            })
            .wait()?;
        Ok(store)
    });
    let store = match created {
        Ok(store) => store,
        Err(e) => {
            // No event was written (a full disk, a filesystem SQLite cannot lock): there is no
            // experiment to resume, so take back the folder and the id rather than leave an
            // entry `knob experiment list` would call crashed. The store is closed by now, and
            // the folder is not held: no run of an id this create claimed can start (the
            // registry names this process as its runner), and the lock may be what failed.
            let unheld = FolderHold {
                dir: dir.clone(),
                _lock: None,
            };
            let _ = unheld.remove();
            let _ = registry.remove(&id);
            return Err(match e {
                // Not the store's own advice: there is nothing to resume.
                StoreError::DiskFull { path, message } => CreateError::DiskFull { path, message },
                e => e.into(),
            });
        }
    };
    Ok((
        Experiment {
            id,
            dir,
            config,
            history: None,
            config_file: None,
        },
        store,
    ))
}

/// Refuses a folder that holds anything besides knob's marker.
fn check_folder(dir: &Path) -> Result<(), CreateError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        // Missing (the usual case), or unreadable: make_folder reports the latter.
        return Ok(());
    };
    let mut foreign = false;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name == crate::store::DB_FILE_NAME {
            return Err(CreateError::Unregistered {
                dir: dir.display().to_string(),
            });
        }
        foreign |= name != MARKER_FILE_NAME;
    }
    if foreign {
        return Err(CreateError::FolderNotEmpty {
            dir: dir.display().to_string(),
        });
    }
    Ok(())
}

/// Makes the experiment's folder (or takes an empty one) and marks it as knob's.
fn make_folder(dir: &Path) -> Result<(), CreateError> {
    let failed = |e: std::io::Error| CreateError::Directory {
        dir: dir.display().to_string(),
        message: e.to_string(),
    };
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(failed)?;
    }
    let made_here = match std::fs::create_dir(dir) {
        Ok(()) => true,
        // Checked again: something may have been put there since check_folder.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            check_folder(dir)?;
            false
        }
        Err(e) => return Err(failed(e)),
    };
    let marker = dir.join(MARKER_FILE_NAME);
    let written = std::fs::write(
        &marker,
        "This folder was made by knob for an experiment. `knob experiment delete` removes only \
         what knob made here and leaves anything else.\n",
    );
    if let Err(e) = written {
        // A full disk makes the folder and then fails the marker: leave nothing behind.
        let _ = std::fs::remove_file(&marker);
        if made_here {
            let _ = std::fs::remove_dir(dir);
        }
        return Err(failed(e));
    }
    Ok(())
}

/// Removes what knob made in an experiment's folder, holding it meanwhile ([`FolderHold`]).
/// Returns what was left: entries knob did not make, which are never touched. A missing folder
/// is not an error (there is nothing to remove).
pub fn remove_experiment_folder(dir: &Path) -> Result<Vec<PathBuf>, RemoveError> {
    FolderHold::take(dir)?.remove()
}
