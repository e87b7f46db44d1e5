//! What a trial's Python gets from knob without installing anything: `import knob_trial` (knob's
//! trial API) and, unless the config says `nniShim: false`, the `nni` shim, which runs an
//! unchanged `import nni` script on knob's own protocol where no real nni is installed (or always,
//! with `nniShim: true`). Both are written into the trial's folder and put first on its
//! PYTHONPATH, on whatever host runs the trial, so they always match the knob that runs it.
//!
//! The sources live once, in `python/` at the workspace root (the wheel ships `knob_trial` from
//! there too): `python/knob_trial/__init__.py` and `python/shim/nni.py`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The folder in the trial's directory that goes first on its PYTHONPATH.
pub const FOLDER_NAME: &str = ".knob-python";

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

/// Writes the folder into `trial_dir` and returns it. `shim` says whether `nni.py` goes in.
pub fn write_folder(trial_dir: &Path, shim: bool) -> std::io::Result<PathBuf> {
    let folder = trial_dir.join(FOLDER_NAME);
    std::fs::create_dir_all(&folder)?;
    std::fs::write(folder.join("knob_trial.py"), KNOB_TRIAL_SOURCE)?;
    if shim {
        std::fs::write(folder.join("nni.py"), NNI_SHIM_SOURCE)?;
    }
    Ok(folder)
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
