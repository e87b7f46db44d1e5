//! The trial code directory as an archive: made on the manager's machine, unpacked on a remote
//! host by `knob-agent receive-code`.
//!
//! - Format: a gzip-compressed tar. Entries are sorted by path, with zeroed mtimes, uids and
//!   gids and normalised modes (0644, or 0755 when any execute bit is set), so the same tree
//!   always gives the same bytes; the archive's name is the hex sha256 of those bytes.
//! - `.nniignore` and `.knobignore` files (gitignore syntax, in any directory of the tree) leave
//!   files out, as NNI's `.nniignore` does. `.gitignore` is not applied: NNI does not apply it.
//! - The caller's `exclude` paths (the experiment's config file, SSH key files: what may hold a
//!   secret) are left out too when they resolve inside the tree, matched by canonical path so
//!   that `./config.yml`, a symlinked spelling or an absolute path all name the same file; a
//!   folder leaves out everything under it. Being left out, they are not in the bytes, so the
//!   hash differs from the unexcluded tree's and is the same for the same tree and exclusions.
//! - Limits ([`ArchiveLimits`]): NNI's, at most 2000 files and 300 MiB before compression; an
//!   error names the directory, the limit, and says to add a `.nniignore`.
//! - Symbolic links are kept as links when they point inside the tree; a link that leads
//!   outside it is an error (the host would not have what it points to, and unpacking refuses
//!   it).
//!
//! Unpacking ([`unpack`]) refuses absolute paths, `..`, links that escape and entries that are
//! not files, directories or links; it writes into a temporary directory beside the
//! destination, writes [`CODE_COMPLETE_MARKER`] last, then renames. Two unpacks of the same
//! archive at once both succeed: the second rename finds the first one's complete directory.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use sha2::{Digest, Sha256};

use crate::agent_protocol::CODE_COMPLETE_MARKER;

/// Ignore files read in every directory of the code tree, gitignore syntax.
pub const IGNORE_FILE_NAMES: [&str; 2] = [".nniignore", ".knobignore"];

/// How much code may be archived or unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveLimits {
    /// Files (regular files and links); directories are bounded by the same number.
    pub max_files: usize,
    /// Total size of the files, before compression.
    pub max_bytes: u64,
}

impl Default for ArchiveLimits {
    /// NNI's limits for remote and cluster training services.
    fn default() -> Self {
        ArchiveLimits {
            max_files: 2000,
            max_bytes: 300 * 1024 * 1024,
        }
    }
}

/// An archive ready to upload.
#[derive(Clone, PartialEq, Eq)]
pub struct CodeArchive {
    /// The gzip tar.
    pub bytes: Vec<u8>,
    /// Hex sha256 of `bytes`; the code directory's name on a host.
    pub hash: String,
    /// Regular files and links in it.
    pub file_count: usize,
    /// Their total size before compression.
    pub total_bytes: u64,
    /// The `exclude` paths that lie inside the code directory, relative to it and sorted: not
    /// in the archive.
    pub left_out: Vec<PathBuf>,
}

impl std::fmt::Debug for CodeArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeArchive")
            .field("bytes", &format_args!("{} bytes", self.bytes.len()))
            .field("hash", &self.hash)
            .field("file_count", &self.file_count)
            .field("total_bytes", &self.total_bytes)
            .field("left_out", &self.left_out)
            .finish()
    }
}

/// What can go wrong making or unpacking an archive; one line each.
#[derive(Debug, thiserror::Error)]
pub enum CodeArchiveError {
    #[error("trial code directory {}: {source}", dir.display())]
    Directory { dir: PathBuf, source: io::Error },
    #[error("trial code directory {}: cannot list it: {message}", dir.display())]
    Walk { dir: PathBuf, message: String },
    #[error("trial code directory {} holds more than {limit} files (after .nniignore and .knobignore); add a .nniignore that leaves out what trials do not need (data sets, checkpoints, logs, virtual environments)", dir.display())]
    TooManyFiles { dir: PathBuf, limit: usize },
    #[error("trial code directory {} holds more than {} of files (after .nniignore and .knobignore; {} so far); add a .nniignore that leaves out what trials do not need (data sets, checkpoints, logs, virtual environments)", dir.display(), size_text(*limit), size_text(*seen))]
    TooLarge { dir: PathBuf, limit: u64, seen: u64 },
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{} is a symbolic link to {} outside the trial code directory; copy what it points to into the directory, or add it to .nniignore", path.display(), target.display())]
    LinkOutside { path: PathBuf, target: PathBuf },
    #[error("{} is a {kind}, which cannot be archived; add it to .nniignore", path.display())]
    UnsupportedFile { path: PathBuf, kind: &'static str },
    #[error("code archive is not a valid gzip tar: {0}")]
    Corrupt(io::Error),
    #[error("code archive entry {path:?} is absolute or leaves the code directory; refused")]
    UnsafePath { path: String },
    #[error("code archive entry {path:?} is a link to {target:?}, which leaves the code directory; refused")]
    UnsafeLink { path: String, target: String },
    #[error("code archive entry {path:?} goes through or replaces the link {link:?} it made earlier; refused")]
    UnderLink { path: String, link: String },
    #[error("code archive entry {path:?} is a {kind}; only files, directories and symbolic links are unpacked")]
    UnsupportedEntry { path: String, kind: String },
    #[error("code archive holds more than {limit} files or directories; refused")]
    TooManyEntries { limit: usize },
    #[error("code archive holds more than {}; refused", size_text(*limit))]
    Oversize { limit: u64 },
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("{} is not a complete code directory (no {CODE_COMPLETE_MARKER}); upload the code first", dir.display())]
    Incomplete { dir: PathBuf },
    #[error("cannot copy the code directory {}: {message}", from.display())]
    Copy { from: PathBuf, message: String },
}

/// "300 MiB" for whole mebibytes, "12.3 MiB" above one, bytes below.
fn size_text(bytes: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{bytes} bytes")
    }
}

/// One thing to put in the archive, by its path relative to the code directory.
struct Item {
    relative: PathBuf,
    kind: ItemKind,
}

enum ItemKind {
    Directory,
    File { size: u64, executable: bool },
    Link { target: PathBuf },
}

/// Whether [`create`] would archive `dir`: the same walk and limits, without reading or
/// compressing any file (a few milliseconds for 2 000 files, where an archive of 300 MiB takes
/// seconds), so that a service can refuse a code directory before its experiment starts.
pub fn check(
    dir: &Path,
    limits: &ArchiveLimits,
    exclude: &[PathBuf],
) -> Result<(), CodeArchiveError> {
    listed(dir, limits, exclude).map(|_| ())
}

/// What [`create`] archives from `dir`, and the `exclude` paths inside it.
fn listed(
    dir: &Path,
    limits: &ArchiveLimits,
    exclude: &[PathBuf],
) -> Result<(Vec<Item>, Vec<PathBuf>), CodeArchiveError> {
    let metadata = std::fs::metadata(dir).map_err(|source| CodeArchiveError::Directory {
        dir: dir.to_path_buf(),
        source,
    })?;
    if !metadata.is_dir() {
        return Err(CodeArchiveError::Directory {
            dir: dir.to_path_buf(),
            source: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
        });
    }
    let left_out = inside(dir, exclude);
    let items = list(dir, limits, &left_out)?;
    Ok((items, left_out))
}

/// Archives `dir` within `limits`, honouring `.nniignore` and `.knobignore`, and leaving out
/// every `exclude` path that resolves inside `dir` (paths elsewhere, or missing, change nothing).
pub fn create(
    dir: &Path,
    limits: &ArchiveLimits,
    exclude: &[PathBuf],
) -> Result<CodeArchive, CodeArchiveError> {
    let (items, left_out) = listed(dir, limits, exclude)?;
    let file_count = items
        .iter()
        .filter(|item| !matches!(item.kind, ItemKind::Directory))
        .count();
    let total_bytes = items
        .iter()
        .map(|item| match item.kind {
            ItemKind::File { size, .. } => size,
            _ => 0,
        })
        .sum();

    let encoder = GzEncoder::new(Vec::new(), Compression::default());
    let mut builder = tar::Builder::new(encoder);
    builder.mode(tar::HeaderMode::Deterministic);
    for item in &items {
        append(&mut builder, dir, item)?;
    }
    let bytes = builder
        .into_inner()
        .and_then(|encoder| encoder.finish())
        .map_err(|source| CodeArchiveError::Write {
            path: PathBuf::from("<code archive in memory>"),
            source,
        })?;
    let hash = hex_sha256(&bytes);
    Ok(CodeArchive {
        bytes,
        hash,
        file_count,
        total_bytes,
        left_out,
    })
}

/// The `paths` that resolve to something inside `dir` (not `dir` itself), relative to it, sorted
/// and without repeats.
fn inside(dir: &Path, paths: &[PathBuf]) -> Vec<PathBuf> {
    if paths.is_empty() {
        return Vec::new();
    }
    let Ok(root) = std::fs::canonicalize(dir) else {
        return Vec::new();
    };
    let mut relative: Vec<PathBuf> = paths
        .iter()
        .filter_map(|path| std::fs::canonicalize(path).ok())
        .filter_map(|path| {
            path.strip_prefix(&root)
                .ok()
                .filter(|rest| !rest.as_os_str().is_empty())
                .map(Path::to_path_buf)
        })
        .collect();
    relative.sort();
    relative.dedup();
    relative
}

/// Hex sha256 of `bytes`, as code archives and agent binaries are named.
pub fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every item under `dir` that the ignore files and `left_out` (relative paths) leave in, sorted
/// by path, within the limits.
fn list(
    dir: &Path,
    limits: &ArchiveLimits,
    left_out: &[PathBuf],
) -> Result<Vec<Item>, CodeArchiveError> {
    let mut walk = ignore::WalkBuilder::new(dir);
    // Only knob's and NNI's ignore files: no .gitignore, .ignore, hidden-file or parent rules.
    walk.standard_filters(false).follow_links(false);
    for name in IGNORE_FILE_NAMES {
        walk.add_custom_ignore_filename(name);
    }
    if !left_out.is_empty() {
        // Paths as the walk spells them (`dir` joined with the relative path); a folder left out
        // is not entered, so nothing under it counts against the limits either.
        let skipped: std::collections::HashSet<PathBuf> =
            left_out.iter().map(|relative| dir.join(relative)).collect();
        walk.filter_entry(move |entry| !skipped.contains(entry.path()));
    }
    let mut items = Vec::new();
    let mut files = 0usize;
    let mut directories = 0usize;
    let mut total: u64 = 0;
    for entry in walk.build() {
        let entry = entry.map_err(|e| CodeArchiveError::Walk {
            dir: dir.to_path_buf(),
            message: e.to_string(),
        })?;
        let path = entry.path();
        let relative = match path.strip_prefix(dir) {
            Ok(relative) if !relative.as_os_str().is_empty() => relative.to_path_buf(),
            _ => continue,
        };
        let metadata =
            std::fs::symlink_metadata(path).map_err(|source| CodeArchiveError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        let file_type = metadata.file_type();
        let kind = if file_type.is_dir() {
            directories += 1;
            if directories > limits.max_files {
                return Err(CodeArchiveError::TooManyFiles {
                    dir: dir.to_path_buf(),
                    limit: limits.max_files,
                });
            }
            ItemKind::Directory
        } else if file_type.is_file() {
            total += metadata.len();
            if total > limits.max_bytes {
                return Err(CodeArchiveError::TooLarge {
                    dir: dir.to_path_buf(),
                    limit: limits.max_bytes,
                    seen: total,
                });
            }
            ItemKind::File {
                size: metadata.len(),
                executable: metadata.permissions().mode() & 0o111 != 0,
            }
        } else if file_type.is_symlink() {
            let target = std::fs::read_link(path).map_err(|source| CodeArchiveError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            if !link_stays_inside(dir, &relative, &target) {
                return Err(CodeArchiveError::LinkOutside {
                    path: path.to_path_buf(),
                    target,
                });
            }
            ItemKind::Link { target }
        } else {
            return Err(CodeArchiveError::UnsupportedFile {
                path: path.to_path_buf(),
                kind: special_file_kind(&file_type),
            });
        };
        if !matches!(kind, ItemKind::Directory) {
            files += 1;
            if files > limits.max_files {
                return Err(CodeArchiveError::TooManyFiles {
                    dir: dir.to_path_buf(),
                    limit: limits.max_files,
                });
            }
        }
        items.push(Item { relative, kind });
    }
    items.sort_by(|a, b| a.relative.cmp(&b.relative));
    Ok(items)
}

fn special_file_kind(file_type: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        "named pipe"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

/// Whether a link at `link` (relative to `root`) pointing to `target` resolves to somewhere
/// inside `root`, as the kernel would resolve it: a component of the target that is itself a
/// link under `root` is replaced by where that leads, so a `..` after it climbs from there (a
/// link `esc -> up/../etc` with `up -> .` leaves the tree, which counting `..` against the
/// path's depth took for inside). A loop is inside: the kernel refuses to resolve it.
fn link_stays_inside(root: &Path, link: &Path, target: &Path) -> bool {
    let mut at = Vec::new();
    for component in link.parent().unwrap_or(Path::new("")).components() {
        match component {
            Component::Normal(name) => at.push(name.to_owned()),
            Component::CurDir => {}
            _ => return false,
        }
    }
    let mut hops = 0;
    !matches!(
        resolve_inside(root, &mut at, target, &mut hops),
        Resolved::Outside
    )
}

/// The links one resolution follows before it counts as a loop (Linux's own bound).
const MAX_LINK_HOPS: u32 = 40;

enum Resolved {
    Inside,
    Outside,
    Loops,
}

/// Walks `target` from `at` (components relative to `root`, none of them a link), following
/// the links under `root` it meets.
fn resolve_inside(
    root: &Path,
    at: &mut Vec<std::ffi::OsString>,
    target: &Path,
    hops: &mut u32,
) -> Resolved {
    for component in target.components() {
        match component {
            Component::Normal(name) => {
                at.push(name.to_owned());
                let here: PathBuf = root.join(at.iter().collect::<PathBuf>());
                let is_link = std::fs::symlink_metadata(&here)
                    .is_ok_and(|metadata| metadata.file_type().is_symlink());
                if !is_link {
                    // A folder, a file, or nothing yet: taken as a folder, as the path says.
                    continue;
                }
                *hops += 1;
                if *hops > MAX_LINK_HOPS {
                    return Resolved::Loops;
                }
                let Ok(next) = std::fs::read_link(&here) else {
                    return Resolved::Outside;
                };
                at.pop();
                match resolve_inside(root, at, &next, hops) {
                    Resolved::Inside => {}
                    other => return other,
                }
            }
            Component::CurDir => {}
            Component::ParentDir => {
                if at.pop().is_none() {
                    return Resolved::Outside;
                }
            }
            Component::RootDir | Component::Prefix(_) => return Resolved::Outside,
        }
    }
    Resolved::Inside
}

fn append(
    builder: &mut tar::Builder<GzEncoder<Vec<u8>>>,
    dir: &Path,
    item: &Item,
) -> Result<(), CodeArchiveError> {
    let path = dir.join(&item.relative);
    let write_error = |source| CodeArchiveError::Write {
        path: PathBuf::from("<code archive in memory>"),
        source,
    };
    let mut header = tar::Header::new_gnu();
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    match &item.kind {
        ItemKind::Directory => {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            builder
                .append_data(&mut header, &item.relative, io::empty())
                .map_err(write_error)
        }
        ItemKind::File { executable, .. } => {
            // Read whole, so that a file changing while it is read cannot make the header's
            // size disagree with the data.
            let contents =
                std::fs::read(&path).map_err(|source| CodeArchiveError::Read { path, source })?;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(if *executable { 0o755 } else { 0o644 });
            header.set_size(contents.len() as u64);
            builder
                .append_data(&mut header, &item.relative, contents.as_slice())
                .map_err(write_error)
        }
        ItemKind::Link { target } => {
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_mode(0o777);
            header.set_size(0);
            builder
                .append_link(&mut header, &item.relative, target)
                .map_err(write_error)
        }
    }
}

/// What [`unpack`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpacked {
    /// The destination was written (the archive unpacked, or a complete copy made).
    Written { files: usize, bytes: u64 },
    /// The destination was already complete (an earlier or concurrent unpack); nothing changed.
    AlreadyThere,
}

/// Unpacks a code archive read from `reader` into `dest`, atomically: `dest` either does not
/// exist or is complete (holds [`CODE_COMPLETE_MARKER`]).
pub fn unpack(
    reader: impl Read,
    dest: &Path,
    limits: &ArchiveLimits,
) -> Result<Unpacked, CodeArchiveError> {
    install_complete(dest, |staging| unpack_entries(reader, staging, limits))
}

/// Fills `dest` with `fill`, atomically: `fill` writes into a temporary directory beside it,
/// which gets [`CODE_COMPLETE_MARKER`] last and is then renamed into place. A `dest` that is
/// already complete (an earlier or concurrent install won) is left as it is.
pub(crate) fn install_complete(
    dest: &Path,
    fill: impl FnOnce(&Path) -> Result<Unpacked, CodeArchiveError>,
) -> Result<Unpacked, CodeArchiveError> {
    if dest.join(CODE_COMPLETE_MARKER).exists() {
        return Ok(Unpacked::AlreadyThere);
    }
    let write_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CodeArchiveError::Write { path, source }
    };
    let parent = match dest.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(write_error(&parent))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "code".to_string());
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{name}.partial-"))
        .tempdir_in(&parent)
        .map_err(write_error(&parent))?;
    let counts = fill(staging.path())?;
    let marker = staging.path().join(CODE_COMPLETE_MARKER);
    std::fs::write(&marker, b"").map_err(write_error(&marker))?;
    // World-readable like an ordinary checkout; tempdir creates 0700.
    let _ = std::fs::set_permissions(staging.path(), std::fs::Permissions::from_mode(0o755));
    let staged = staging.keep();
    match std::fs::rename(&staged, dest) {
        Ok(()) => Ok(counts),
        Err(error) => {
            let _ = std::fs::remove_dir_all(&staged);
            if dest.join(CODE_COMPLETE_MARKER).exists() {
                Ok(Unpacked::AlreadyThere)
            } else {
                Err(CodeArchiveError::Write {
                    path: dest.to_path_buf(),
                    source: error,
                })
            }
        }
    }
}

fn unpack_entries(
    reader: impl Read,
    root: &Path,
    limits: &ArchiveLimits,
) -> Result<Unpacked, CodeArchiveError> {
    let mut archive = tar::Archive::new(GzDecoder::new(reader));
    let mut files = 0usize;
    let mut directories = 0usize;
    let mut bytes: u64 = 0;
    let mut links = Vec::new();
    for entry in archive.entries().map_err(CodeArchiveError::Corrupt)? {
        let mut entry = entry.map_err(CodeArchiveError::Corrupt)?;
        let raw_path = entry
            .path()
            .map_err(CodeArchiveError::Corrupt)?
            .into_owned();
        let shown = raw_path.to_string_lossy().into_owned();
        let relative = safe_relative(&raw_path).ok_or_else(|| CodeArchiveError::UnsafePath {
            path: shown.clone(),
        })?;
        if relative.as_os_str().is_empty() {
            continue;
        }
        // Nothing is written through a link the archive made (a link to `.` would shift every
        // later path, and a link below it that looks inside could then point outside), and
        // nothing replaces a link.
        if let Some(link) = first_link_on_path(root, &relative) {
            return Err(CodeArchiveError::UnderLink {
                path: shown,
                link: link.to_string_lossy().into_owned(),
            });
        }
        let path = root.join(&relative);
        let entry_type = entry.header().entry_type();
        let mode = entry.header().mode().unwrap_or(0o644);
        if entry_type.is_dir() {
            directories += 1;
            if directories > limits.max_files {
                return Err(CodeArchiveError::TooManyEntries {
                    limit: limits.max_files,
                });
            }
            std::fs::create_dir_all(&path).map_err(write_error_at(&path))?;
            continue;
        }
        files += 1;
        if files > limits.max_files {
            return Err(CodeArchiveError::TooManyEntries {
                limit: limits.max_files,
            });
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(write_error_at(parent))?;
        }
        if entry_type.is_file() {
            let left = limits.max_bytes - bytes;
            let mut file = File::create(&path).map_err(write_error_at(&path))?;
            // One byte past what is left tells an oversize file from one that fits exactly.
            let written = io::copy(&mut (&mut entry).take(left + 1), &mut file)
                .map_err(CodeArchiveError::Corrupt)?;
            if written > left {
                return Err(CodeArchiveError::Oversize {
                    limit: limits.max_bytes,
                });
            }
            bytes += written;
            file.flush().map_err(write_error_at(&path))?;
            let mode = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(write_error_at(&path))?;
        } else if entry_type.is_symlink() {
            let target = entry
                .link_name()
                .map_err(CodeArchiveError::Corrupt)?
                .map(|t| t.into_owned())
                .unwrap_or_default();
            if target.as_os_str().is_empty() || !link_stays_inside(root, &relative, &target) {
                return Err(CodeArchiveError::UnsafeLink {
                    path: shown,
                    target: target.to_string_lossy().into_owned(),
                });
            }
            std::os::unix::fs::symlink(&target, &path).map_err(write_error_at(&path))?;
            links.push((relative, shown, target));
        } else {
            return Err(CodeArchiveError::UnsupportedEntry {
                path: shown,
                kind: format!("{entry_type:?}"),
            });
        }
    }
    // Again once every link is there: a link made later can change where an earlier one
    // leads (`a -> x/../b` was inside until `x -> .` came).
    for (relative, shown, target) in links {
        if !link_stays_inside(root, &relative, &target) {
            return Err(CodeArchiveError::UnsafeLink {
                path: shown,
                target: target.to_string_lossy().into_owned(),
            });
        }
    }
    Ok(Unpacked::Written { files, bytes })
}

/// The first prefix of `relative` (itself included) that is a symbolic link under `root`.
fn first_link_on_path(root: &Path, relative: &Path) -> Option<PathBuf> {
    let mut prefix = PathBuf::new();
    for component in relative.components() {
        prefix.push(component);
        match std::fs::symlink_metadata(root.join(&prefix)) {
            Ok(metadata) if metadata.file_type().is_symlink() => return Some(prefix),
            Ok(_) => {}
            // Nothing there yet, so nothing deeper either.
            Err(_) => return None,
        }
    }
    None
}

fn write_error_at(path: &Path) -> impl FnOnce(io::Error) -> CodeArchiveError {
    let path = path.to_path_buf();
    move |source| CodeArchiveError::Write { path, source }
}

/// The entry's path with `.` removed, or `None` if it is absolute or climbs out with `..`.
fn safe_relative(path: &Path) -> Option<PathBuf> {
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_inside_and_outside() {
        let root = tempfile::tempdir().unwrap();
        let inside = |link: &str, target: &str| {
            link_stays_inside(root.path(), Path::new(link), Path::new(target))
        };
        assert!(inside("a", "b"));
        assert!(inside("d/a", "../b"));
        assert!(!inside("a", "../b"));
        assert!(!inside("d/a", "../../b"));
        assert!(!inside("a", "/etc/passwd"));
        assert!(inside("a", "./x/../y"));

        // A `..` after a link climbs from where the link leads, not from the link's folder.
        std::fs::create_dir_all(root.path().join("sub/a/b/c/d")).unwrap();
        std::os::unix::fs::symlink("../../../../..", root.path().join("sub/a/b/c/d/up5")).unwrap();
        assert!(inside("sub/a/b/c/d/up5", "../../../../.."));
        assert!(!inside(
            "esc",
            "sub/a/b/c/d/up5/../../../../../etc/hostname"
        ));
        assert!(inside("ok", "sub/a/b/c/d/up5/sub/a"));
        std::os::unix::fs::symlink("loop", root.path().join("loop")).unwrap();
        assert!(inside("a", "loop/.."), "a loop resolves nowhere");
    }

    #[test]
    fn unsafe_paths() {
        assert_eq!(
            safe_relative(Path::new("./a/b")),
            Some(PathBuf::from("a/b"))
        );
        assert_eq!(safe_relative(Path::new("a/../../b")), None);
        assert_eq!(safe_relative(Path::new("/etc/passwd")), None);
    }
}
