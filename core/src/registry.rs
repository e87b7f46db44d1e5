//! The registry of experiments: id -> directory, status, process, so that every command finds
//! an experiment by id wherever its working directory is.
//!
//! It is a small SQLite file in knob's home (`$KNOB_HOME`, else `$XDG_DATA_HOME/knob`, else
//! `~/.local/share/knob`), shared by every knob process of the user; SQLite's locking makes
//! concurrent `knob create` runs safe. The experiment's own store stays the truth about the
//! experiment: the registry only says where to find it and what it was last known to be doing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use knob_gpu_sched::ledger::process_start_time;
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
    /// When that process started ([`process_start`]): a pid the system has since handed to
    /// another process (the runner crashed, the machine rebooted) is not taken for the
    /// runner's. `None` in an entry an older knob wrote.
    #[serde(skip)]
    pub pid_start: Option<String>,
    /// The HTTP API port, when the experiment serves one.
    pub port: Option<u16>,
    /// The address that API is bound to (`--bind`). `None` in an entry an older knob wrote,
    /// which bound 127.0.0.1 alone.
    #[serde(skip)]
    pub api_host: Option<IpAddr>,
    pub created_ms: i64,
}

/// How an experiment is shown whose process is gone without recording how it ended (killed,
/// crashed, the machine rebooted): its store still says RUNNING. `knob experiment list/show`,
/// `knob stop`, `knob top` and the API of `knob view` all say this.
pub const CRASHED: &str = "crashed (resume it)";

/// The status word for [`CRASHED`] where a program reads it: the API (`GET /experiment`,
/// `GET /experiments`, `GET /export` under `knob view`) and `knob experiment export` (so the
/// Python launcher's `knob.load()`, which a script polls until the run is over).
pub const CRASHED_STATUS: &str = "CRASHED";

/// The status and message of an experiment whose store recorded `status` and `message`, as the
/// API and `knob experiment export` give them: [`CRASHED_STATUS`] and a message that says to
/// resume it when the store says it is active and its process is gone (`crashed`: its entry's
/// [`RegistryEntry::crashed`]), the recorded ones otherwise. The one place that decides, so
/// that the API and the export cannot differ: the export had said RUNNING for ever.
pub fn served_status(
    id: &str,
    crashed: bool,
    status: crate::store::ExperimentStatus,
    message: Option<&str>,
) -> (&'static str, Option<String>) {
    if crashed && status.is_active() {
        let message =
            format!("{CRASHED}: the process running it is gone; `knob resume {id}` continues it");
        (CRASHED_STATUS, Some(message))
    } else {
        (status.as_str(), message.map(str::to_string))
    }
}

impl RegistryEntry {
    /// Where a client on this machine reaches the experiment's API: the address it is bound
    /// to, or loopback where it listens on every address (`--bind 0.0.0.0` or `::`).
    pub fn api_address(&self) -> Option<SocketAddr> {
        let host = match self.api_host {
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
            Some(IpAddr::V4(ip)) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            Some(IpAddr::V6(ip)) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            Some(ip) => ip,
        };
        Some(SocketAddr::new(host, self.port?))
    }

    /// The pid of the process running this experiment, while it runs: the recorded process is
    /// alive, and is the one recorded (it started when that one did), not another that got its
    /// pid since. Asked again, it looks again.
    pub fn running_pid(&self) -> Option<u32> {
        let pid = self.pid?;
        let start = process_start(pid)?;
        match &self.pid_start {
            Some(recorded) => (start == *recorded).then_some(pid),
            None => Some(pid),
        }
    }

    /// Sends `signal` to the process running this experiment, if one does (as
    /// [`RegistryEntry::running_pid`] says), and returns its pid; `Ok(None)` when none runs.
    ///
    /// The process is pinned by a pidfd before it is checked, and signalled through that pidfd:
    /// between a check and a plain `kill(pid)` the runner could exit and another process take
    /// its pid, which would get the signal instead. A pidfd stays with the process it was
    /// opened on, so once the check passes only that process can receive the signal (or none,
    /// if it has exited since).
    pub fn signal_runner(&self, signal: i32) -> std::io::Result<Option<u32>> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let Some(pid) = self.pid else { return Ok(None) };
        let pid_t = libc::pid_t::try_from(pid)
            .map_err(|_| std::io::Error::other(format!("pid {pid} out of range")))?;
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid_t, 0) };
        if fd < 0 {
            let error = std::io::Error::last_os_error();
            return match error.raw_os_error() {
                Some(libc::ESRCH) => Ok(None),
                // A kernel before 5.3 has no pidfds: check, then signal by pid.
                Some(libc::ENOSYS) if self.running_pid() != Some(pid) => Ok(None),
                // SAFETY: kill(2) with the pid just checked to be the runner's.
                Some(libc::ENOSYS) => match unsafe { libc::kill(pid_t, signal) } {
                    0 => Ok(Some(pid)),
                    _ => Err(std::io::Error::last_os_error()),
                },
                _ => Err(error),
            };
        }
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nothing else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        if self.running_pid() != Some(pid) {
            return Ok(None);
        }
        // SAFETY: pidfd_send_signal(2) with a live pidfd, a signal number, no siginfo, no flags.
        let sent = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if sent != 0 {
            let error = std::io::Error::last_os_error();
            return match error.raw_os_error() {
                // It exited after the check: nothing runs it any more.
                Some(libc::ESRCH) => Ok(None),
                _ => Err(error),
            };
        }
        Ok(Some(pid))
    }

    /// Whether the recorded status says how the run ended. A runner records its end before it
    /// exits, keeping its pid while the end's notifications go out, so a live runner with an
    /// ended status is closing; one with INITIALIZED or RUNNING and no API recorded yet is
    /// still starting (a resume records its process before it prepares the run and serves its
    /// API).
    pub fn run_over(&self) -> bool {
        crate::store::ExperimentStatus::parse(&self.status)
            .is_some_and(crate::store::ExperimentStatus::has_ended)
    }

    /// Whether the process that ran this experiment is gone without recording how it ended.
    /// The runner clears `pid` when it records the end, so a recorded process that no longer
    /// runs means it never got there.
    pub fn crashed(&self) -> bool {
        self.pid.is_some() && self.running_pid().is_none()
    }

    /// Whether the experiment's store is no longer where it was registered: its directory was
    /// moved or deleted outside knob, so only `knob experiment delete` has anything left to do.
    pub fn directory_gone(&self) -> bool {
        !self.dir.join(crate::store::DB_FILE_NAME).exists()
    }

    /// Whether this is what a `knob create` killed before its store recorded the experiment left
    /// behind: the entry is still as the create's claim wrote it (INITIALIZED), that process is
    /// gone, and no store holds the experiment (the folder not made yet, or its store still
    /// without its first record). It never started, so nothing of the user's is in it, and no
    /// `knob resume` could ever run it: [`Registry::get`] and [`Registry::list`] take it back.
    pub fn never_started(&self) -> bool {
        use crate::store::{ExperimentStatus, StoreError, StoreReader, DB_FILE_NAME};
        if self.status != ExperimentStatus::Initialized.as_str() || !self.crashed() {
            return false;
        }
        match self.dir.join(DB_FILE_NAME).try_exists() {
            Ok(false) => true,
            Ok(true) => matches!(
                StoreReader::open(&self.dir).and_then(|reader| reader.experiment()),
                Ok(None) | Err(StoreError::NoExperiment { .. })
            ),
            // Its folder cannot be looked into: it may hold the experiment.
            Err(_) => false,
        }
    }

    /// The status as users see it: the recorded one, or [`CRASHED`].
    pub fn shown_status(&self) -> String {
        if self.crashed() {
            CRASHED.to_string()
        } else {
            self.status.clone()
        }
    }

    /// An end its runner recorded here that the store, which says `stored`, does not have: it
    /// could not be written (a full disk, which is then the error the experiment ended with).
    pub fn end_missing_from_store(&self, stored: crate::store::ExperimentStatus) -> Option<&str> {
        let ended_here = crate::store::ExperimentStatus::parse(&self.status)
            .is_some_and(|status| self.pid.is_none() && status.has_ended());
        (ended_here && !stored.has_ended()).then_some(self.status.as_str())
    }
}

/// knob's per-user home directory: the one the GPU ledger lives in, which `knob-agent` finds
/// without knob-core (`$KNOB_HOME`, else `$XDG_DATA_HOME/knob`, else `~/.local/share/knob`, `~`
/// being `$HOME` or the password database's).
pub fn knob_home() -> PathBuf {
    knob_gpu_sched::ledger::default_dir()
}

pub struct Registry {
    connection: Connection,
    path: PathBuf,
}

/// How long a registry command waits for another knob's write before it gives up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// What a registry that failed needs, as it opened or at any later call: moving it away is
/// advice only for a file that is not a database or one damaged (a truncated file reads as
/// "malformed", sometimes only at the first query); on a full disk it would lose the list of
/// experiments for nothing. The experiments' folders are not lost with the registry:
/// `knob experiment register` lists each again.
fn failure(error: &rusqlite::Error, path: &Path) -> String {
    if let Some(full) = crate::store::error::full_disk(error, path) {
        return full_disk_advice(&full);
    }
    const START_AGAIN: &str = "move it away to start a new one, then `knob experiment register DIR` lists each experiment's folder in it again";
    match error.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => {
            format!("{error} (is it a knob registry? {START_AGAIN})")
        }
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => {
            format!("{error} (the registry is damaged: {START_AGAIN})")
        }
        _ => error.to_string(),
    }
}

fn full_disk_advice(message: &str) -> String {
    format!("the disk is full ({message}); free space on its filesystem, or set KNOB_HOME to a folder on another one")
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
            .busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| fail(e.to_string()))?;
        let set_up = || -> rusqlite::Result<()> {
            connection.execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE IF NOT EXISTS experiments (
                     id TEXT PRIMARY KEY,
                     name TEXT,
                     dir TEXT NOT NULL,
                     status TEXT NOT NULL,
                     pid INTEGER,
                     port INTEGER,
                     created_ms INTEGER NOT NULL,
                     pid_start TEXT,
                     api_host TEXT
                 );",
            )?;
            add_column(&connection, "pid_start")?;
            add_column(&connection, "api_host")
        };
        // Switching a new file to WAL answers "database is locked" at once, without waiting in
        // the busy handler, while another knob does the same: two first commands on a fresh
        // KNOB_HOME. Trying again until the busy timeout lets the other finish first.
        let deadline = Instant::now() + BUSY_TIMEOUT;
        loop {
            match set_up() {
                Ok(()) => break,
                Err(e) if is_busy(&e) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) if is_busy(&e) => return Err(fail(e.to_string())),
                Err(e) => return Err(fail(failure(&e, path))),
            }
        }
        Ok(Registry {
            connection,
            path: path.to_path_buf(),
        })
    }

    fn fail(&self, e: rusqlite::Error) -> RegistryError {
        RegistryError::Sqlite {
            path: self.path.display().to_string(),
            message: failure(&e, &self.path),
        }
    }

    /// Adds an experiment; false if the id is taken. The start of the process `entry.pid` is
    /// read here (`entry.pid_start` is what a read found).
    pub fn insert(&self, entry: &RegistryEntry) -> Result<bool, RegistryError> {
        let inserted = self
            .connection
            .execute(
                "INSERT OR IGNORE INTO experiments (id, name, dir, status, pid, port, created_ms, pid_start)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    entry.id,
                    entry.name,
                    entry.dir.to_string_lossy(),
                    entry.status,
                    entry.pid,
                    entry.port,
                    entry.created_ms,
                    entry.pid.and_then(process_start)
                ],
            )
            .map_err(|e| self.fail(e))?;
        Ok(inserted == 1)
    }

    /// Records the status (and which process runs it, with its start) of a known experiment.
    pub fn set_status(
        &self,
        id: &str,
        status: &str,
        pid: Option<u32>,
    ) -> Result<(), RegistryError> {
        self.connection
            .execute(
                "UPDATE experiments SET status = ?2, pid = ?3, pid_start = ?4 WHERE id = ?1",
                params![id, status, pid, pid.and_then(process_start)],
            )
            .map_err(|e| self.fail(e))?;
        Ok(())
    }

    /// Puts back the status and process `entry` recorded: for a run that recorded itself
    /// RUNNING ([`Registry::set_status`]) and then did not start. The process's start time is
    /// put back as it was, not read again: the pid of a crashed runner may be another
    /// process's by now.
    pub fn restore_status(&self, entry: &RegistryEntry) -> Result<(), RegistryError> {
        self.connection
            .execute(
                "UPDATE experiments SET status = ?2, pid = ?3, pid_start = ?4 WHERE id = ?1",
                params![entry.id, entry.status, entry.pid, entry.pid_start],
            )
            .map_err(|e| self.fail(e))?;
        Ok(())
    }

    /// Records the address of the experiment's HTTP API (`None` once it no longer serves one).
    pub fn set_api(&self, id: &str, api: Option<SocketAddr>) -> Result<(), RegistryError> {
        self.connection
            .execute(
                "UPDATE experiments SET port = ?2, api_host = ?3 WHERE id = ?1",
                params![id, api.map(|a| a.port()), api.map(|a| a.ip().to_string())],
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

    /// The experiment `id`. One whose create was killed before it recorded the experiment
    /// ([`RegistryEntry::never_started`]) is taken back ([`Registry::take_back`]) and unknown.
    pub fn get(&self, id: &str) -> Result<RegistryEntry, RegistryError> {
        let entry = self.get_as_recorded(id)?;
        if !entry.never_started() {
            return Ok(self.ended_as_stored(entry));
        }
        self.take_back(&entry)?;
        // Gone, unless a knob process held its folder (or another took it back and a new
        // create claimed the id since): what is there now.
        self.get_as_recorded(id)
    }

    fn get_as_recorded(&self, id: &str) -> Result<RegistryEntry, RegistryError> {
        self.connection
            .query_row(
                "SELECT id, name, dir, status, pid, port, created_ms, pid_start, api_host FROM experiments WHERE id = ?1",
                [id],
                row_to_entry,
            )
            .optional()
            .map_err(|e| self.fail(e))?
            .ok_or_else(|| RegistryError::Unknown { id: id.to_string(), path: self.path.display().to_string() })
    }

    /// Every experiment, oldest first, but those taken back as [`Registry::get`] does.
    pub fn list(&self) -> Result<Vec<RegistryEntry>, RegistryError> {
        let mut kept = Vec::new();
        for entry in self.list_as_recorded()? {
            if !entry.never_started() {
                kept.push(self.ended_as_stored(entry));
                continue;
            }
            self.take_back(&entry)?;
            if let Ok(now) = self.get_as_recorded(&entry.id) {
                kept.push(now);
            }
        }
        Ok(kept)
    }

    /// `entry`, but with the status its store recorded when its process is gone and the store
    /// says the run ended: the run got to its end and only its last update here failed (a full
    /// disk under `KNOB_HOME`), so it did not crash, and no command should say so. Written back
    /// when it can be, and only over the row as read (a resume may have claimed it since).
    fn ended_as_stored(&self, mut entry: RegistryEntry) -> RegistryEntry {
        use crate::store::{ExperimentStatus, StoreReader};
        if entry.pid.is_none() || !entry.crashed() {
            return entry;
        }
        let Some(ended) = StoreReader::open(&entry.dir)
            .and_then(|reader| reader.experiment())
            .ok()
            .flatten()
            .map(|experiment| experiment.status)
            .filter(|status| ExperimentStatus::has_ended(*status))
        else {
            return entry;
        };
        let _ = self.connection.execute(
            "UPDATE experiments SET status = ?2, pid = NULL, pid_start = NULL
             WHERE id = ?1 AND created_ms = ?3 AND pid IS ?4",
            params![entry.id, ended.as_str(), entry.created_ms, entry.pid],
        );
        entry.status = ended.as_str().to_string();
        entry.pid = None;
        entry.pid_start = None;
        entry
    }

    /// Removes what the create of an experiment that [`RegistryEntry::never_started`] made of
    /// its folder (its marker, its empty store; files put there since stay), then forgets it, as
    /// `knob experiment delete` would: every command that met it said "crashed (resume it)", and
    /// no resume could run it. Does nothing while a knob process holds the folder, or once the
    /// entry is not the one read (another knob took it back, and the id may be claimed anew).
    fn take_back(&self, entry: &RegistryEntry) -> Result<(), RegistryError> {
        // Held throughout: a run, or a new create of the id, takes this lock before it writes
        // the store, so none is under way in the folder while it is removed.
        let Ok(hold) = crate::experiment::FolderHold::take(&entry.dir) else {
            return Ok(());
        };
        if self.get_as_recorded(&entry.id).ok().as_ref() != Some(entry) || hold.remove().is_err() {
            return Ok(());
        }
        self.connection
            .execute(
                "DELETE FROM experiments WHERE id = ?1 AND created_ms = ?2 AND status = ?3 AND pid IS ?4",
                params![entry.id, entry.created_ms, entry.status, entry.pid],
            )
            .map_err(|e| self.fail(e))?;
        Ok(())
    }

    fn list_as_recorded(&self) -> Result<Vec<RegistryEntry>, RegistryError> {
        let mut statement = self
            .connection
            .prepare("SELECT id, name, dir, status, pid, port, created_ms, pid_start, api_host FROM experiments ORDER BY created_ms, id")
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
        pid_start: row.get(7)?,
        api_host: row
            .get::<_, Option<String>>(8)?
            .and_then(|host| host.parse().ok()),
    })
}

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// A registry an older knob made lacks the columns added since (`pid_start`, `api_host`): each
/// is added, empty for the entries there (checked by pid alone; their API on 127.0.0.1). Two
/// knobs opening it at once may both try; the loser finds the column there.
fn add_column(connection: &Connection, column: &str) -> rusqlite::Result<()> {
    let has_column = |connection: &Connection| -> rusqlite::Result<bool> {
        let mut statement =
            connection.prepare("SELECT name FROM pragma_table_info('experiments')")?;
        let names = statement.query_map([], |row| row.get::<_, String>(0))?;
        for name in names {
            if name? == column {
                return Ok(true);
            }
        }
        Ok(false)
    };
    if has_column(connection)? {
        return Ok(());
    }
    match connection.execute(
        &format!("ALTER TABLE experiments ADD COLUMN {column} TEXT"),
        [],
    ) {
        Err(_) if has_column(connection)? => Ok(()),
        other => other.map(drop),
    }
}

/// When process `pid` started, as a token that no other process of this machine shares, across
/// reboots too: the boot's id and the start time in clock ticks since boot
/// ([`process_start_time`]). `None` when the process is gone or a zombie.
pub fn process_start(pid: u32) -> Option<String> {
    let start = process_start_time(pid)?;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    Some(format!("{}/{start}", boot.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry_of(pid: u32, pid_start: Option<String>) -> RegistryEntry {
        RegistryEntry {
            id: "e".into(),
            name: None,
            dir: PathBuf::from("/x"),
            status: "RUNNING".into(),
            pid: Some(pid),
            pid_start,
            port: None,
            api_host: None,
            created_ms: 0,
        }
    }

    /// `knob experiment show` and `knob resume` say ERROR, as `list` does, for an experiment
    /// whose store could not record its end (a full disk), not the store's stale RUNNING.
    #[test]
    fn an_end_only_the_registry_has_is_told_from_a_store_that_has_it() {
        use crate::store::ExperimentStatus;
        let ended = |status: &str| RegistryEntry {
            status: status.into(),
            pid: None,
            ..entry_of(1, None)
        };
        let running = ExperimentStatus::Running;
        assert_eq!(
            ended("ERROR").end_missing_from_store(running),
            Some("ERROR")
        );
        assert_eq!(
            ended("DONE").end_missing_from_store(ExperimentStatus::NoMoreTrial),
            Some("DONE")
        );
        // The store has an end: it is the truth.
        assert_eq!(
            ended("ERROR").end_missing_from_store(ExperimentStatus::Error),
            None
        );
        assert_eq!(
            ended("STOPPED").end_missing_from_store(ExperimentStatus::Done),
            None
        );
        // Still running (or crashed: `crashed` says so), or never ended.
        assert_eq!(entry_of(1, None).end_missing_from_store(running), None);
        assert_eq!(ended("RUNNING").end_missing_from_store(running), None);
    }

    /// A run whose store recorded its end but whose last update here failed (a full disk
    /// under `KNOB_HOME`) left its pid behind: it did not crash, and is not called crashed.
    #[test]
    fn a_gone_runner_whose_store_recorded_the_end_is_shown_as_the_store_says() {
        use crate::store::{ExperimentStatus, Store, StoreEvent};
        let home = tempfile::tempdir().unwrap();
        let stored = |id: &str, status: ExperimentStatus| {
            let dir = home.path().join(id);
            let store = Store::open(&dir).unwrap();
            let record = |event| {
                store.append(event).wait().unwrap();
            };
            record(StoreEvent::ExperimentCreated {
                experiment_id: id.into(),
                config: serde_json::json!({}),
                start_time_ms: 0,
            });
            record(StoreEvent::ExperimentStatusChanged {
                status,
                message: None,
                spent_before_ms: None,
            });
            dir
        };
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let registry = Registry::open(&home.path().join("registry.db")).unwrap();
        for (id, status) in [
            ("ended", ExperimentStatus::Done),
            ("crashed", ExperimentStatus::Running),
        ] {
            let entry = RegistryEntry {
                id: id.into(),
                dir: stored(id, status),
                ..entry_of(gone.id(), None)
            };
            assert!(registry.insert(&entry).unwrap());
        }
        let listed = registry.list().unwrap();
        let listed = listed.iter().find(|entry| entry.id == "ended").unwrap();
        for entry in [listed, &registry.get("ended").unwrap()] {
            assert_eq!((entry.status.as_str(), entry.pid), ("DONE", None));
            assert!(!entry.crashed());
        }
        // Written back: the next reader need not look at the store.
        let recorded = registry.get_as_recorded("ended").unwrap();
        assert_eq!((recorded.status.as_str(), recorded.pid), ("DONE", None));
        // A store still saying RUNNING: that run did crash.
        let crashed = registry.get("crashed").unwrap();
        assert_eq!(crashed.status, "RUNNING");
        assert!(crashed.crashed());
    }

    #[test]
    fn the_runner_is_signalled_only_when_it_is_the_recorded_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = process_start(pid).unwrap();

        // Another process's start time recorded for this pid: it is not the experiment's.
        let other = entry_of(pid, Some(format!("{start}-other")));
        assert_eq!(other.signal_runner(libc::SIGTERM).unwrap(), None);
        assert!(
            child.try_wait().unwrap().is_none(),
            "a process not the runner was signalled"
        );

        let runner = entry_of(pid, Some(start));
        assert_eq!(runner.signal_runner(libc::SIGTERM).unwrap(), Some(pid));
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));

        // Gone (reaped): nothing runs it, and that is no error.
        assert_eq!(runner.signal_runner(libc::SIGTERM).unwrap(), None);
    }

    #[test]
    fn an_older_registry_gets_the_start_column_and_its_entries_are_checked_by_pid_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registry.db");
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE experiments (id TEXT PRIMARY KEY, name TEXT, dir TEXT NOT NULL,
                 status TEXT NOT NULL, pid INTEGER, port INTEGER, created_ms INTEGER NOT NULL);",
        )
        .unwrap();
        old.execute(
            "INSERT INTO experiments VALUES ('old', NULL, '/x', 'RUNNING', ?1, NULL, 0)",
            [std::process::id()],
        )
        .unwrap();
        drop(old);
        // Opened twice: the second open finds the column there.
        let registry = Registry::open(&path).unwrap();
        let registry_again = Registry::open(&path).unwrap();
        let entry = registry_again.get("old").unwrap();
        assert_eq!(entry.pid_start, None);
        assert_eq!(entry.running_pid(), Some(std::process::id()));

        registry
            .set_status("old", "RUNNING", Some(std::process::id()))
            .unwrap();
        let entry = registry.get("old").unwrap();
        assert_eq!(entry.pid_start, process_start(std::process::id()));
        assert!(entry.pid_start.is_some());
        assert_eq!(entry.running_pid(), Some(std::process::id()));
        assert!(!entry.crashed());
    }

    #[test]
    fn a_living_pid_that_started_at_another_time_is_not_the_runner() {
        let entry = RegistryEntry {
            id: "e".into(),
            name: None,
            dir: PathBuf::from("/x"),
            status: "RUNNING".into(),
            pid: Some(std::process::id()),
            pid_start: Some("another boot/1".into()),
            port: None,
            api_host: None,
            created_ms: 0,
        };
        assert_eq!(entry.running_pid(), None);
        assert!(entry.crashed());
    }

    #[test]
    fn knobs_opening_a_fresh_registry_at_once_all_get_it() {
        // Before the retry, one of six failed with "database is locked" in the first round.
        for round in 0..20 {
            let home = tempfile::tempdir().unwrap();
            let path = home.path().join("registry.db");
            let barrier = std::sync::Barrier::new(6);
            std::thread::scope(|scope| {
                let opens: Vec<_> = (0..6)
                    .map(|_| {
                        scope.spawn(|| {
                            barrier.wait();
                            Registry::open(&path).map(drop)
                        })
                    })
                    .collect();
                for open in opens {
                    if let Err(e) = open.join().unwrap() {
                        panic!("round {round}: {e}");
                    }
                }
            });
        }
    }

    #[test]
    fn a_file_that_is_not_a_registry_is_refused_with_what_to_do() {
        let home = tempfile::tempdir().unwrap();
        let path = home.path().join("registry.db");
        std::fs::write(
            &path,
            "not a database, but a page of text that is long enough",
        )
        .unwrap();
        let line = Registry::open(&path).err().unwrap().to_string();
        assert!(line.contains(&path.display().to_string()), "{line}");
        assert!(line.contains("move it away"), "{line}");
    }

    /// A registry cut short (a full disk in the past, a copy that stopped half way) is
    /// "malformed", whether its open or its first read notices: either says what to do.
    #[test]
    fn a_damaged_registry_is_refused_with_what_to_do() {
        let home = tempfile::tempdir().unwrap();
        let path = home.path().join("registry.db");
        {
            let registry = Registry::open(&path).unwrap();
            for n in 0..200 {
                let entry = RegistryEntry {
                    id: format!("experiment{n}"),
                    name: Some(format!("a name long enough to fill pages {n}")),
                    dir: home.path().join(format!("experiments/experiment{n}")),
                    status: "DONE".to_string(),
                    pid: None,
                    port: None,
                    api_host: None,
                    created_ms: n,
                    pid_start: None,
                };
                assert!(registry.insert(&entry).unwrap());
            }
        }
        // Closed: the write-ahead log is in the file, which is now cut short.
        assert!(std::fs::metadata(&path).unwrap().len() > 5000);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(5000)
            .unwrap();
        let line = match Registry::open(&path) {
            Err(e) => e.to_string(),
            Ok(registry) => registry.list().err().unwrap().to_string(),
        };
        assert_eq!(
            line,
            format!(
                "experiment registry {}: database disk image is malformed (the registry is damaged: move it away to start a new one, then `knob experiment register DIR` lists each experiment's folder in it again)",
                path.display()
            )
        );
    }
}
