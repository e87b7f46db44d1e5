//! Copying a code directory for a trial that must not share it (`reuseMode: false`).

use std::path::Path;

use crate::agent_protocol::CODE_COMPLETE_MARKER;

/// Deeper trees than this are refused rather than followed (a code archive never has them).
const MAX_DEPTH: usize = 64;

/// Copies the tree at `from` into `to` (created): files with their permissions, symbolic links
/// as links, directories; the code-complete marker is left out. One-line error naming the path.
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    copy_level(from, to, 0)
}

fn copy_level(from: &Path, to: &Path, depth: usize) -> Result<(), String> {
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
            copy_level(&source, &target, depth + 1)?;
        } else if kind.is_symlink() {
            let link = std::fs::read_link(&source).map_err(|e| fail(&source, e))?;
            std::os::unix::fs::symlink(&link, &target).map_err(|e| fail(&target, e))?;
        } else {
            // std::fs::copy keeps the permission bits.
            std::fs::copy(&source, &target).map_err(|e| fail(&target, e))?;
        }
    }
    Ok(())
}
