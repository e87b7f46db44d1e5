//! What a trial's Python gets from knob without installing anything: `import knob_trial` (knob's
//! trial API) and, unless the config says `nniShim: false`, the `nni` shim, which runs an
//! unchanged `import nni` script on knob's own protocol where no real nni is installed (or always,
//! with `nniShim: true`). Both are written, on whatever host runs the trial, into a folder that
//! goes first on its PYTHONPATH, so they always match the knob that runs it.
//!
//! That folder is shared by the trials of one experiment on one host: `.knob-python/<variant>`
//! beside the experiment's `trials/` folder, its name ending in a hash of what it holds. It is
//! written once (a temporary folder renamed into place, so no trial ever sees half of it) by the
//! first trial that needs it; a knob of another version, or `nniShim: false`, names another one,
//! so a resumed experiment never runs a trial on an older knob's files.
//!
//! The sources live once, in `python/` at the workspace root (the wheel ships `knob_trial` from
//! there too): `python/knob_trial/__init__.py` and `python/shim/nni.py`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The folder, beside an experiment's `trials/` folder (or in a trial's own folder where it has
/// none), holding the folders that go first on its trials' PYTHONPATH.
pub const FOLDER_NAME: &str = ".knob-python";

/// The folder of a trial's folders that [`shared_folder`] puts its own beside.
const TRIALS_FOLDER: &str = "trials";

/// Set by the core from the config's `nniShim`: `1` forces the shim even where nni is installed,
/// `0` leaves it out; unset, the shim steps aside for a real nni.
pub const NNI_SHIM_ENV: &str = "KNOB_NNI_SHIM";

/// The folder `knob_trial.checkpoint_dir()` returns.
pub const CHECKPOINT_DIR_ENV: &str = "KNOB_CHECKPOINT_DIR";

/// Set by the core for a population member that starts from another member's checkpoint: that
/// member's trial id. The runner turns it into [`RESTORE_FROM_ENV`] on the host that runs the
/// trial, where the trial folders are.
pub const RESTORE_TRIAL_ENV: &str = "KNOB_RESTORE_TRIAL";

/// The checkpoint folder a population member starts from: the parent's `KNOB_CHECKPOINT_DIR`.
pub const RESTORE_FROM_ENV: &str = "KNOB_RESTORE_FROM";

const KNOB_TRIAL_SOURCE: &str = include_str!("../../python/knob_trial/__init__.py");
const NNI_SHIM_SOURCE: &str = include_str!("../../python/shim/nni.py");

/// The folder for the trial in `trial_dir` to put first on its PYTHONPATH, written unless it
/// exists already. `shim` says whether `nni.py` goes in.
///
/// A trial folder `<base>/trials/<id>` (or an attempt's `<base>/trials/<id>/attempt-N`) shares
/// `<base>/.knob-python/<variant>` with every other trial of `<base>` (the experiment's folder,
/// or its environment's on a remote host); a trial folder laid out otherwise gets its own,
/// `<trial_dir>/.knob-python/<variant>`. Creating it costs 2 directories and 1–2 files, once
/// instead of once a trial; a trial start then only looks it up.
/// An error names the folder it could not write.
pub fn shared_folder(trial_dir: &Path, shim: bool) -> Result<PathBuf, (PathBuf, std::io::Error)> {
    let folder = folders_root(trial_dir).join(variant_name(shim));
    if folder.is_dir() {
        return Ok(folder);
    }
    match write_folder(&folder, shim) {
        Ok(()) => Ok(folder),
        Err(e) => Err((folder, e)),
    }
}

/// Where the trial in `trial_dir` finds the [`FOLDER_NAME`] folder: beside its `trials/`.
fn folders_root(trial_dir: &Path) -> PathBuf {
    let first_attempt = checkpoint_dir(trial_dir)
        .parent()
        .map_or_else(|| trial_dir.to_path_buf(), Path::to_path_buf);
    match first_attempt.parent() {
        Some(trials) if trials.file_name() == Some(std::ffi::OsStr::new(TRIALS_FOLDER)) => {
            trials.parent().unwrap_or(trials).join(FOLDER_NAME)
        }
        _ => trial_dir.join(FOLDER_NAME),
    }
}

/// `knob-nni-<hash>` or `knob-<hash>` (no shim): the hash, of the files' contents, changes with
/// them, so trials started by another knob version never import this one's files, nor the
/// reverse.
fn variant_name(shim: bool) -> &'static str {
    static NAMES: std::sync::OnceLock<[String; 2]> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        [
            folder_name("knob", folder_files(false)),
            folder_name("knob-nni", folder_files(true)),
        ]
    });
    &names[usize::from(shim)]
}

/// `<prefix>-<hash>`: the first 16 hex digits of the sha256 of the files' names and contents.
fn folder_name<'a>(prefix: &str, files: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut hash = Sha256::new();
    for (file, contents) in files {
        // Length-prefixed, so that no two different sets of files hash alike.
        for part in [file.as_bytes(), contents.as_bytes()] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
    }
    let hex: String = hash.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{prefix}-{hex}")
}

/// The files of the folder: `knob_trial.py`, and `nni.py` with the shim.
fn folder_files(shim: bool) -> impl Iterator<Item = (&'static str, &'static str)> {
    [
        Some(("knob_trial.py", KNOB_TRIAL_SOURCE)),
        shim.then_some(("nni.py", NNI_SHIM_SOURCE)),
    ]
    .into_iter()
    .flatten()
}

/// Writes the files into a temporary folder beside `folder` and renames it to `folder`, so that
/// `folder` either does not exist or holds every file: a trial that sees it imports from a
/// whole folder, even while another writer (another thread, another knob on the same
/// experiment folder) or a killed one is half way. Where another writer got there first, its
/// folder, with the same contents, is kept.
fn write_folder(folder: &Path, shim: bool) -> std::io::Result<()> {
    let parent = folder.parent().expect("the folder has a parent");
    std::fs::create_dir_all(parent)?;
    // A name no other writer uses: not this process's other threads (the count), nor a process
    // of the same id on another host of a shared filesystem (the clock).
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let partial = parent.join(format!(
        ".partial-{}-{nanos}-{}",
        std::process::id(),
        WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let written = std::fs::create_dir(&partial).and_then(|()| {
        folder_files(shim)
            .try_for_each(|(file, contents)| std::fs::write(partial.join(file), contents))
    });
    let renamed = written.and_then(|()| std::fs::rename(&partial, folder));
    remove_stale_partials(parent, &partial);
    match renamed {
        Ok(()) => Ok(()),
        // Renaming onto a folder that holds files fails: another writer's, complete.
        Err(_) if folder.is_dir() => {
            let _ = std::fs::remove_dir_all(&partial);
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            Err(e)
        }
    }
}

/// A writer takes milliseconds; a `.partial-*` folder older than this is one whose writer was
/// killed half way (its folder was never renamed), not one still being written.
const STALE_PARTIAL: std::time::Duration = std::time::Duration::from_secs(600);

/// Deletes the `.partial-*` folders in `parent` (but `own`) that writers killed half way left:
/// those last changed more than [`STALE_PARTIAL`] ago. By age, not by the writer's pid, which
/// says nothing on a filesystem shared by several hosts.
fn remove_stale_partials(parent: &Path, own: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let stale = entry.file_name().to_string_lossy().starts_with(".partial-")
            && path != own
            && entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|modified| modified.elapsed().is_ok_and(|age| age > STALE_PARTIAL));
        if stale {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Whether the request's environment leaves the shim out (`KNOB_NNI_SHIM=0`).
pub fn shim_wanted(request_env: &std::collections::BTreeMap<String, String>) -> bool {
    request_env.get(NNI_SHIM_ENV).map(String::as_str) != Some("0")
}

/// `folder` in front of the PYTHONPATH the trial would otherwise get: the request's, else this
/// process's.
pub fn python_path(folder: &Path, inherited: Option<OsString>) -> OsString {
    let mut paths = vec![folder.to_path_buf()];
    if let Some(inherited) = inherited.filter(|p| !p.is_empty()) {
        paths.extend(std::env::split_paths(&inherited));
    }
    // A folder holding ':' cannot be on a PYTHONPATH; fall back to the folder alone.
    std::env::join_paths(&paths).unwrap_or_else(|_| folder.as_os_str().to_owned())
}

/// The trial's checkpoint folder: `checkpoint/` in the folder of its first attempt, so that
/// every attempt (a retry, a run again after resume) finds what an earlier one saved. Attempts
/// after the first run in `attempt-N/` inside it (core's `placement.rs`).
pub fn checkpoint_dir(trial_dir: &Path) -> PathBuf {
    let first_attempt = match trial_dir.file_name().and_then(|n| n.to_str()) {
        Some(name) if name.starts_with("attempt-") => trial_dir.parent().unwrap_or(trial_dir),
        _ => trial_dir,
    };
    first_attempt.join(CHECKPOINT_FOLDER)
}

/// The name of a trial's checkpoint folder in its own folder.
pub const CHECKPOINT_FOLDER: &str = "checkpoint";

/// The checkpoint folder of trial `donor` of the same experiment, seen from `trial_dir` (any
/// attempt's folder): trial folders are siblings (`<experiment>/trials/<id>`, or the
/// environment's folder on a remote host). `None` for a `donor` that is no plain trial id.
/// Where the trial's own `restore/` folder exists (the frozen copy of the donor's folder that the
/// core makes as it creates the trial, when the donor's folder is on its machine), that folder.
pub fn restore_dir(trial_dir: &Path, donor: &str) -> Option<PathBuf> {
    let plain = !donor.is_empty()
        && donor
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !plain {
        return None;
    }
    let own = checkpoint_dir(trial_dir).parent()?.to_path_buf();
    let snapshot = own.join(RESTORE_SNAPSHOT_FOLDER);
    if snapshot.is_dir() {
        return Some(snapshot);
    }
    let trials = own.parent()?.to_path_buf();
    Some(checkpoint_dir(&trials.join(donor)))
}

/// The folder, in a trial's own folder, holding the copy of its donor's checkpoint folder.
pub const RESTORE_SNAPSHOT_FOLDER: &str = "restore";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_left_half_written_by_a_killed_writer_is_deleted_by_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join(FOLDER_NAME);
        std::fs::create_dir_all(&root).unwrap();
        let make = |name: &str, age: std::time::Duration| {
            let partial = root.join(name);
            std::fs::create_dir(&partial).unwrap();
            std::fs::write(partial.join("knob_trial.py"), "half").unwrap();
            let when = std::time::SystemTime::now() - age;
            std::fs::File::open(&partial)
                .unwrap()
                .set_modified(when)
                .unwrap();
            partial
        };
        let killed = make(".partial-1-2-0", STALE_PARTIAL * 2);
        let writing = make(".partial-3-4-0", std::time::Duration::from_secs(1));
        let folder = shared_folder(&dir.path().join("trials/t1"), true).unwrap();
        assert!(folder.join("nni.py").is_file());
        assert!(!killed.exists(), "a killed writer's folder was kept");
        assert!(writing.exists(), "a folder still being written was deleted");
    }

    #[test]
    fn every_attempt_shares_the_first_attempts_checkpoint_folder() {
        assert_eq!(
            checkpoint_dir(Path::new("/e/trials/abc")),
            Path::new("/e/trials/abc/checkpoint")
        );
        assert_eq!(
            checkpoint_dir(Path::new("/e/trials/abc/attempt-3")),
            Path::new("/e/trials/abc/checkpoint")
        );
    }

    #[test]
    fn a_member_restores_from_its_siblings_checkpoint_folder() {
        assert_eq!(
            restore_dir(Path::new("/e/trials/abc"), "xyz"),
            Some(PathBuf::from("/e/trials/xyz/checkpoint"))
        );
        assert_eq!(
            restore_dir(Path::new("/e/trials/abc/attempt-2"), "xyz"),
            Some(PathBuf::from("/e/trials/xyz/checkpoint"))
        );
        assert_eq!(restore_dir(Path::new("/e/trials/abc"), "../x"), None);
        assert_eq!(restore_dir(Path::new("/e/trials/abc"), ""), None);
    }

    #[test]
    fn a_member_restores_from_its_own_copy_of_the_donors_folder_where_there_is_one() {
        let dir = tempfile::tempdir().unwrap();
        let trial = dir.path().join("trials/abc");
        let sibling = dir.path().join("trials/xyz/checkpoint");
        assert_eq!(restore_dir(&trial, "xyz"), Some(sibling));
        std::fs::create_dir_all(trial.join("restore")).unwrap();
        assert_eq!(restore_dir(&trial, "xyz"), Some(trial.join("restore")));
        assert_eq!(
            restore_dir(&trial.join("attempt-2"), "xyz"),
            Some(trial.join("restore"))
        );
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_trials_of_an_experiment_share_one_python_folder_beside_their_trials_folder() {
        let dir = tempfile::tempdir().unwrap();
        let trials = dir.path().join("trials");
        let first = shared_folder(&trials.join("a"), true).unwrap();
        assert_eq!(first.parent().unwrap(), dir.path().join(FOLDER_NAME));
        assert_eq!(names(&first), ["knob_trial.py", "nni.py"]);
        assert_eq!(
            std::fs::read_to_string(first.join("knob_trial.py")).unwrap(),
            KNOB_TRIAL_SOURCE
        );
        assert_eq!(
            std::fs::read_to_string(first.join("nni.py")).unwrap(),
            NNI_SHIM_SOURCE
        );
        // Another trial, and a later attempt, get the same folder; nothing is written in theirs.
        assert_eq!(shared_folder(&trials.join("b"), true).unwrap(), first);
        assert_eq!(
            shared_folder(&trials.join("a/attempt-2"), true).unwrap(),
            first
        );
        assert!(!trials.exists());
        // Without the shim: another folder, without nni.py.
        let plain = shared_folder(&trials.join("c"), false).unwrap();
        assert_ne!(plain, first);
        assert_eq!(names(&plain), ["knob_trial.py"]);
        // Nothing half-written is left beside them.
        assert_eq!(
            names(&dir.path().join(FOLDER_NAME)),
            [variant_name(false), variant_name(true)]
        );
    }

    #[test]
    fn an_existing_python_folder_is_used_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let folder = shared_folder(&dir.path().join("trials/a"), true).unwrap();
        // A trial's Python caches its compiled modules there; a later start leaves them.
        std::fs::create_dir(folder.join("__pycache__")).unwrap();
        assert_eq!(
            shared_folder(&dir.path().join("trials/b"), true).unwrap(),
            folder
        );
        assert_eq!(names(&folder), ["__pycache__", "knob_trial.py", "nni.py"]);
    }

    #[test]
    fn a_trial_folder_outside_a_trials_folder_gets_its_own_python_folder() {
        let dir = tempfile::tempdir().unwrap();
        let trial = dir.path().join("somewhere/t1");
        let folder = shared_folder(&trial, true).unwrap();
        assert_eq!(folder, trial.join(FOLDER_NAME).join(variant_name(true)));
        assert_eq!(names(&folder), ["knob_trial.py", "nni.py"]);
    }

    #[test]
    fn writers_at_once_all_get_the_whole_folder_and_leave_nothing_half_written() {
        let dir = tempfile::tempdir().unwrap();
        let trials = dir.path().join("trials");
        let folders: Vec<PathBuf> = std::thread::scope(|scope| {
            let writers: Vec<_> = (0..8)
                .map(|i| {
                    let trial = trials.join(format!("t{i}"));
                    scope.spawn(move || {
                        let folder = shared_folder(&trial, true).unwrap();
                        // What this writer was given is whole as it returns.
                        assert_eq!(names(&folder), ["knob_trial.py", "nni.py"]);
                        folder
                    })
                })
                .collect();
            writers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        assert!(folders.iter().all(|f| *f == folders[0]), "{folders:?}");
        assert_eq!(names(&dir.path().join(FOLDER_NAME)), [variant_name(true)]);
    }

    #[test]
    fn an_unwritable_python_folder_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the folder of folders should be.
        std::fs::write(dir.path().join(FOLDER_NAME), "").unwrap();
        let (folder, _) = shared_folder(&dir.path().join("trials/a"), true).unwrap_err();
        assert_eq!(
            folder,
            dir.path().join(FOLDER_NAME).join(variant_name(true))
        );
    }

    #[test]
    fn each_variant_and_version_of_the_files_has_its_own_folder_name() {
        assert!(variant_name(true).starts_with("knob-nni-"));
        assert!(variant_name(false).starts_with("knob-"));
        assert_ne!(variant_name(true), variant_name(false));
        assert_eq!(variant_name(true).len(), "knob-nni-".len() + 16);
        assert_eq!(
            variant_name(true),
            folder_name("knob-nni", folder_files(true))
        );
        // Another knob's files (one byte more in the shim) name another folder.
        let changed = format!("{NNI_SHIM_SOURCE}\n");
        let other = [
            ("knob_trial.py", KNOB_TRIAL_SOURCE),
            ("nni.py", changed.as_str()),
        ];
        assert_ne!(
            folder_name("knob-nni", other.into_iter()),
            variant_name(true)
        );
    }

    #[test]
    fn the_folder_goes_in_front_of_the_inherited_python_path() {
        let folder = Path::new("/t/.knob-python");
        assert_eq!(python_path(folder, None), "/t/.knob-python");
        assert_eq!(python_path(folder, Some("".into())), "/t/.knob-python");
        assert_eq!(
            python_path(folder, Some("/a:/b".into())),
            "/t/.knob-python:/a:/b"
        );
    }
}
