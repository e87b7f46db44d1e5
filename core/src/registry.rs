//! The registry of experiments: id -> directory, status, process, so that every command finds
//! an experiment by id wherever its working directory is.
//!
//! It is a small SQLite file in knob's home (`$KNOB_HOME`, else `$XDG_DATA_HOME/knob`, else
//! `~/.local/share/knob`), shared by every knob process of the user; SQLite's locking makes
//! concurrent `knob create` runs safe. The experiment's own store stays the truth about the
//! experiment: the registry only says where to find it and what it was last known to be doing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

/// Why the registry could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("experiment registry {path}: {message}")]
    Sqlite { path: String, message: String },
    #[error(
        "no experiment {id} in the registry {path}; `knob experiment list` shows the known ones"
    )]
    Unknown { id: String, path: String },
}

/// One experiment as the registry knows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RegistryEntry {
    pub id: String,
    pub name: Option<String>,
    pub dir: PathBuf,
    /// The last status recorded by the process running it (the store has the truth).
    pub status: String,
    /// The process running it, while it runs.
    pub pid: Option<u32>,
    /// The HTTP API port, when the experiment serves one.
    pub port: Option<u16>,
    pub created_ms: i64,
}

/// How an experiment is shown whose process is gone without recording how it ended (killed,
/// crashed, the machine rebooted): its store still says RUNNING. `knob experiment list/show`,
/// `knob stop`, `knob top` and the API of `knob view` all say this.
pub const CRASHED: &str = "crashed (resume it)";

impl RegistryEntry {
    /// Whether the process that ran this experiment is gone without recording how it ended.
    /// The runner clears `pid` when it records the end, so a recorded pid that is not alive
    /// means it never got there.
    pub fn crashed(&self) -> bool {
        self.pid.is_some_and(|pid| !process_alive(pid))
    }

    /// The status as users see it: the recorded one, or [`CRASHED`].
    pub fn shown_status(&self) -> String {
        if self.crashed() {
            CRASHED.to_string()
        } else {
            self.status.clone()
        }
    }
}

/// knob's per-user home directory.
pub fn knob_home() -> PathBuf {
    if let Some(home) = std::env::var_os("KNOB_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home);
    }
    let data_home = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    data_home.join("knob")
}

pub struct Registry {
    connection: Connection,
    path: PathBuf,
}

impl Registry {
    /// Opens (creating if needed) the registry in [`knob_home`].
    pub fn open_default() -> Result<Registry, RegistryError> {
        Registry::open(&knob_home().join("registry.db"))
    }

    pub fn open(path: &Path) -> Result<Registry, RegistryError> {
        let fail = |message: String| RegistryError::Sqlite {
            path: path.display().to_string(),
            message,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| fail(format!("cannot create its directory: {e}")))?;
        }
        let connection = Connection::open(path).map_err(|e| fail(e.to_string()))?;
        connection
            .busy_timeout(Duration::from_secs(10))
            .map_err(|e| fail(e.to_string()))?;
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE IF NOT EXISTS experiments (
                     id TEXT PRIMARY KEY,
                     name TEXT,
                     dir TEXT NOT NULL,
                     status TEXT NOT NULL,
                     pid INTEGER,
                     port INTEGER,
                     created_ms INTEGER NOT NULL
                 );",
            )
            .map_err(|e| {
                fail(format!(
                    "{e} (is it a knob registry? move it away to start a new one)"
                ))
            })?;
        Ok(Registry {
            connection,
            path: path.to_path_buf(),
        })
    }

    fn fail(&self, e: rusqlite::Error) -> RegistryError {
        RegistryError::Sqlite {
            path: self.path.display().to_string(),
            message: e.to_string(),
        }
    }

    /// Adds an experiment; false if the id is taken.
    pub fn insert(&self, entry: &RegistryEntry) -> Result<bool, RegistryError> {
        let inserted = self
            .connection
            .execute(
                "INSERT OR IGNORE INTO experiments (id, name, dir, status, pid, port, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    entry.id,
                    entry.name,
                    entry.dir.to_string_lossy(),
                    entry.status,
                    entry.pid,
                    entry.port,
                    entry.created_ms
                ],
            )
            .map_err(|e| self.fail(e))?;
        Ok(inserted == 1)
    }

    /// Records the status (and whether a process runs it) of a known experiment.
    pub fn set_status(
        &self,
        id: &str,
        status: &str,
        pid: Option<u32>,
    ) -> Result<(), RegistryError> {
        self.connection
            .execute(
                "UPDATE experiments SET status = ?2, pid = ?3 WHERE id = ?1",
                params![id, status, pid],
            )
            .map_err(|e| self.fail(e))?;
        Ok(())
    }

    /// Records the port of the experiment's HTTP API (`None` once it no longer serves one).
    pub fn set_port(&self, id: &str, port: Option<u16>) -> Result<(), RegistryError> {
        self.connection
            .execute(
                "UPDATE experiments SET port = ?2 WHERE id = ?1",
                params![id, port],
            )
            .map_err(|e| self.fail(e))?;
        Ok(())
    }

    /// Forgets an experiment (`knob experiment delete`); its directory is the caller's business.
    pub fn remove(&self, id: &str) -> Result<(), RegistryError> {
        self.connection
            .execute("DELETE FROM experiments WHERE id = ?1", [id])
            .map_err(|e| self.fail(e))?;
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<RegistryEntry, RegistryError> {
        self.connection
            .query_row(
                "SELECT id, name, dir, status, pid, port, created_ms FROM experiments WHERE id = ?1",
                [id],
                row_to_entry,
            )
            .optional()
            .map_err(|e| self.fail(e))?
            .ok_or_else(|| RegistryError::Unknown { id: id.to_string(), path: self.path.display().to_string() })
    }

    /// Every experiment, oldest first.
    pub fn list(&self) -> Result<Vec<RegistryEntry>, RegistryError> {
        let mut statement = self
            .connection
            .prepare("SELECT id, name, dir, status, pid, port, created_ms FROM experiments ORDER BY created_ms, id")
            .map_err(|e| self.fail(e))?;
        let rows = statement
            .query_map([], row_to_entry)
            .map_err(|e| self.fail(e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.fail(e))
    }
}

fn row_to_entry(row: &rusqlite::Row<'_>) -> rusqlite::Result<RegistryEntry> {
    Ok(RegistryEntry {
        id: row.get(0)?,
        name: row.get(1)?,
        dir: PathBuf::from(row.get::<_, String>(2)?),
        status: row.get(3)?,
        pid: row.get(4)?,
        port: row.get(5)?,
        created_ms: row.get(6)?,
    })
}

/// Whether a process with this pid is alive (so a RUNNING entry whose process died can be
/// shown for what it is). A zombie (exited, not yet reaped by its parent) is not alive.
pub fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may itself hold spaces.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}
