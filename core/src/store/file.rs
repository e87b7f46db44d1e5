//! Noticing that an experiment's store file left its path while a process uses it: its writer
//! (which must not commit into a deleted file unnoticed) and a read-only server (`knob view`,
//! which must not answer from connections still open on a deleted or moved file).

use std::fs::File;
use std::path::{Path, PathBuf};

/// Where a store file went ([`StoreFile::gone`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreGone {
    /// Its last link is gone: the experiment's folder was removed (`knob experiment delete`,
    /// `rm -rf`); what was recorded in it is gone with it.
    Deleted,
    /// It is no longer at its path, though not deleted: the folder was moved (renamed), or
    /// another file was put at the path.
    Moved,
}

/// A descriptor of the store file for `fstat` only. `O_PATH`, because closing an ordinary
/// descriptor of the file would drop the POSIX locks that SQLite holds on it for this whole
/// process, its readers' included.
pub(crate) struct StoreFile {
    path: PathBuf,
    file: File,
}

impl StoreFile {
    /// The file now at `path`; an error when there is none (or it cannot be opened).
    pub(crate) fn open(path: &Path) -> std::io::Result<StoreFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(path)?;
        Ok(StoreFile {
            path: path.to_path_buf(),
            file,
        })
    }

    /// `None` while the file opened is still the one at its path (or it cannot be told).
    pub(crate) fn gone(&self) -> Option<StoreGone> {
        use std::os::unix::fs::MetadataExt;
        let opened = self.file.metadata().ok()?;
        if opened.nlink() == 0 {
            return Some(StoreGone::Deleted);
        }
        let moved = match std::fs::metadata(&self.path) {
            Ok(now) => (now.dev(), now.ino()) != (opened.dev(), opened.ino()),
            Err(error) => error.kind() == std::io::ErrorKind::NotFound,
        };
        moved.then_some(StoreGone::Moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_a_moved_and_a_replaced_file_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("experiment.db");
        std::fs::write(&path, "x").unwrap();
        let file = StoreFile::open(&path).unwrap();
        assert_eq!(file.gone(), None);
        let moved_to = dir.path().join("elsewhere.db");
        std::fs::rename(&path, &moved_to).unwrap();
        assert_eq!(file.gone(), Some(StoreGone::Moved));
        std::fs::write(&path, "another").unwrap();
        assert_eq!(file.gone(), Some(StoreGone::Moved));
        std::fs::remove_file(&moved_to).unwrap();
        assert_eq!(file.gone(), Some(StoreGone::Deleted));
        assert!(StoreFile::open(&dir.path().join("none.db")).is_err());
    }
}
