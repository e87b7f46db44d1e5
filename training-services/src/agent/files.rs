//! Copying a code directory: for an experiment's environment (`reuseMode: true`), whose trials
//! share one copy, and for a trial that must not share it (`reuseMode: false`).

use std::path::Path;

use crate::agent_protocol::CODE_COMPLETE_MARKER;
use crate::code_archive::{install_complete, CodeArchiveError, Unpacked};

/// Deeper trees than this are refused rather than followed (a code archive never has them).
const MAX_DEPTH: usize = 64;

/// Copies the complete code directory `from` (the host's cache of an upload, which no trial
/// runs in) into `to`, atomically like an unpack: `to` either does not exist or is complete. A
/// complete `to` is left as it is: the trials of its experiment may have changed it, and they
/// keep what they changed.
pub fn copy_code(from: &Path, to: &Path) -> Result<Unpacked, CodeArchiveError> {
    if !from.join(CODE_COMPLETE_MARKER).exists() {
        return Err(CodeArchiveError::Incomplete {
            dir: from.to_path_buf(),
        });
    }
    install_complete(to, |staging| {
        let mut counts = Counts::default();
        copy_level(from, staging, 0, &mut counts).map_err(|message| CodeArchiveError::Copy {
            from: from.to_path_buf(),
            message,
        })?;
        Ok(Unpacked::Written {
            files: counts.files,
            bytes: counts.bytes,
        })
    })
}

/// Copies the tree at `from` into `to` (created): files with their permissions, symbolic links
/// as links, directories; the code-complete marker is left out. One-line error naming the path.
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    copy_level(from, to, 0, &mut Counts::default())
}

/// Files (and links) copied, and their bytes.
#[derive(Default)]
struct Counts {
    files: usize,
    bytes: u64,
}

fn copy_level(from: &Path, to: &Path, depth: usize, counts: &mut Counts) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "{} is nested more than {MAX_DEPTH} directories deep",
            from.display()
        ));
    }
    let fail = |path: &Path, e: std::io::Error| format!("{}: {e}", path.display());
    std::fs::create_dir_all(to).map_err(|e| fail(to, e))?;
    let entries = std::fs::read_dir(from).map_err(|e| fail(from, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| fail(from, e))?;
        let name = entry.file_name();
        if depth == 0 && name == CODE_COMPLETE_MARKER {
            continue;
        }
        let source = entry.path();
        let target = to.join(&name);
        let kind = entry.file_type().map_err(|e| fail(&source, e))?;
        if kind.is_dir() {
            copy_level(&source, &target, depth + 1, counts)?;
            continue;
        }
        let bytes = if kind.is_symlink() {
            let link = std::fs::read_link(&source).map_err(|e| fail(&source, e))?;
            std::os::unix::fs::symlink(&link, &target).map_err(|e| fail(&target, e))?;
            0
        } else {
            // std::fs::copy keeps the permission bits.
            std::fs::copy(&source, &target).map_err(|e| fail(&target, e))?
        };
        counts.files += 1;
        counts.bytes += bytes;
    }
    Ok(())
}
