//! Creating an experiment: config -> id -> directory -> store -> registry entry.

use std::path::{Path, PathBuf};

use rand::Rng;

use crate::config::{self, ConfigErrors, ExperimentConfig};
use crate::manager::Experiment;
use crate::registry::{Registry, RegistryEntry, RegistryError};
use crate::store::{ExperimentStatus, Store, StoreError, StoreEvent};

/// Why an experiment could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// Every problem in the config, one per line.
    #[error("{}", .0.lines().join("\n"))]
    Config(ConfigErrors),
    #[error("experiment id {0:?} is not valid: use 1 to 64 letters, digits, '-' or '_'")]
    BadId(String),
    #[error("experiment {id} already exists (in {dir}); continue it with `knob resume {id}` or choose another --id")]
    IdTaken { id: String, dir: String },
    #[error("cannot create the experiment directory {dir}: {message}")]
    Directory { dir: String, message: String },
    #[error("{0}")]
    Registry(#[from] RegistryError),
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// A new experiment id: 8 lowercase letters and digits, as NNI makes them.
pub fn new_experiment_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..8)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn now_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

/// Reads and validates a config; returns it with its warnings (one line each).
pub fn load_config(config_path: &Path) -> Result<(ExperimentConfig, Vec<String>), CreateError> {
    let loaded = config::load_file(config_path).map_err(CreateError::Config)?;
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
    let id = match requested_id {
        Some(id) if !valid_id(id) => return Err(CreateError::BadId(id.to_string())),
        Some(id) => id.to_string(),
        None => new_experiment_id(),
    };
    let dir: PathBuf = config.experiment_working_directory.join(&id);
    let entry = RegistryEntry {
        id: id.clone(),
        name: config.experiment_name.clone(),
        dir: dir.clone(),
        status: ExperimentStatus::Initialized.as_str().into(),
        pid: Some(std::process::id()),
        port: None,
        created_ms: now_ms(),
    };
    // The registry decides who owns an id; a leftover directory of the same name (from a
    // deleted registry, say) is not reused either, so nothing is ever overwritten.
    let taken = |dir: &Path| CreateError::IdTaken {
        id: id.clone(),
        dir: dir.display().to_string(),
    };
    if let Ok(existing) = registry.get(&id) {
        return Err(taken(&existing.dir));
    }
    if dir.join(crate::store::DB_FILE_NAME).exists() {
        return Err(taken(&dir));
    }
    std::fs::create_dir_all(&dir).map_err(|e| CreateError::Directory {
        dir: dir.display().to_string(),
        message: e.to_string(),
    })?;
    if !registry.insert(&entry)? {
        return Err(taken(&dir));
    }
    let store = Store::open(&dir)?;
    // Secrets serialize as "***": the stored config never holds a password in clear.
    let config_json = serde_json::to_value(&config).unwrap_or_default();
    store
        .append(StoreEvent::ExperimentCreated {
            experiment_id: id.clone(),
            config: config_json,
            start_time_ms: entry.created_ms,
        })
        .wait()?;
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
