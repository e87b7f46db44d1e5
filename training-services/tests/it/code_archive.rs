//! Code archives: round trip, ignore files, determinism, limits, and what unpack refuses.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use knob_training_services::agent_protocol::CODE_COMPLETE_MARKER;
use knob_training_services::code_archive::{
    create, unpack, ArchiveLimits, CodeArchiveError, Unpacked,
};

fn write(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, contents).unwrap();
}

/// Every file under `dir` (links as `-> target`), sorted, as `path: contents` lines.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let relative = path.strip_prefix(root).unwrap().display().to_string();
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.push(format!("{relative} -> {}", target.display()));
            } else if kind.is_dir() {
                out.push(format!("{relative}/"));
                walk(root, &path, out);
            } else {
                out.push(format!(
                    "{relative}: {}",
                    std::fs::read_to_string(&path).unwrap()
                ));
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn sample_tree(dir: &Path) {
    write(&dir.join("train.py"), "print('hi')");
    write(&dir.join("lib/model.py"), "MODEL = 1");
    write(&dir.join("lib/deep/x.txt"), "x");
    write(&dir.join("run.sh"), "#!/bin/sh\necho run");
    std::fs::set_permissions(dir.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("lib/model.py", dir.join("model_link.py")).unwrap();
}

#[test]
fn round_trip_keeps_files_modes_and_links() {
    let source = tempfile::tempdir().unwrap();
    sample_tree(source.path());
    let archive = create(source.path(), &ArchiveLimits::default(), &[]).unwrap();
    assert_eq!(archive.file_count, 5);
    assert_eq!(archive.total_bytes, (11 + 9 + 1 + 18) as u64);
    assert_eq!(archive.hash.len(), 64);

    let hosts = tempfile::tempdir().unwrap();
    let dest = hosts.path().join("code").join(&archive.hash);
    let result = unpack(archive.bytes.as_slice(), &dest, &ArchiveLimits::default()).unwrap();
    assert_eq!(
        result,
        Unpacked::Written {
            files: 5,
            bytes: 39
        }
    );
    assert!(dest.join(CODE_COMPLETE_MARKER).exists());
    let mut expected = listing(source.path());
    expected.push(format!("{CODE_COMPLETE_MARKER}: "));
    expected.sort();
    assert_eq!(listing(&dest), expected);
    let mode = std::fs::metadata(dest.join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    let mode = std::fs::metadata(dest.join("train.py"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
    assert_eq!(
        std::fs::read_to_string(dest.join("model_link.py")).unwrap(),
        "MODEL = 1"
    );

    // Unpacking again is a no-op; nothing half-written is left beside the destination.
    assert_eq!(
        unpack(archive.bytes.as_slice(), &dest, &ArchiveLimits::default()).unwrap(),
        Unpacked::AlreadyThere
    );
    let siblings: Vec<_> = std::fs::read_dir(hosts.path().join("code"))
        .unwrap()
        .collect();
    assert_eq!(siblings.len(), 1);
}

#[test]
fn same_tree_same_bytes_and_any_change_changes_the_hash() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    sample_tree(a.path());
    // Created in another order, with other mtimes.
    write(&b.path().join("lib/deep/x.txt"), "x");
    std::os::unix::fs::symlink("lib/model.py", b.path().join("model_link.py")).unwrap();
    write(&b.path().join("run.sh"), "#!/bin/sh\necho run");
    std::fs::set_permissions(
        b.path().join("run.sh"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    write(&b.path().join("lib/model.py"), "MODEL = 1");
    write(&b.path().join("train.py"), "print('hi')");
    let limits = ArchiveLimits::default();
    let first = create(a.path(), &limits, &[]).unwrap();
    assert_eq!(first, create(b.path(), &limits, &[]).unwrap());
    assert_eq!(first, create(a.path(), &limits, &[]).unwrap());

    write(&b.path().join("train.py"), "print('ho')");
    assert_ne!(first.hash, create(b.path(), &limits, &[]).unwrap().hash);
}

#[test]
fn nniignore_and_knobignore_leave_files_out_but_gitignore_does_not() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("train.py"), "code");
    write(&dir.path().join("data/big.bin"), "data");
    write(&dir.path().join("logs/a.log"), "log");
    write(&dir.path().join("sub/ckpt.pt"), "ckpt");
    write(&dir.path().join("sub/keep.pt"), "keep");
    write(&dir.path().join("kept_by_git.txt"), "git");
    write(&dir.path().join(".nniignore"), "data/\n*.log\n");
    write(&dir.path().join("sub/.knobignore"), "*.pt\n!keep.pt\n");
    write(&dir.path().join(".gitignore"), "kept_by_git.txt\n");
    let archive = create(dir.path(), &ArchiveLimits::default(), &[]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("c");
    unpack(archive.bytes.as_slice(), &dest, &ArchiveLimits::default()).unwrap();
    let files: Vec<String> = listing(&dest)
        .into_iter()
        .filter(|l| !l.ends_with('/') && !l.starts_with(CODE_COMPLETE_MARKER))
        .collect();
    assert_eq!(
        files,
        [
            ".gitignore: kept_by_git.txt\n",
            ".nniignore: data/\n*.log\n",
            "kept_by_git.txt: git",
            "sub/.knobignore: *.pt\n!keep.pt\n",
            "sub/keep.pt: keep",
            "train.py: code",
        ]
    );
}

/// The files (not folders or the marker) an archive unpacks to, as `listing` lines.
fn unpacked_files(archive: &knob_training_services::code_archive::CodeArchive) -> Vec<String> {
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("c");
    unpack(archive.bytes.as_slice(), &dest, &ArchiveLimits::default()).unwrap();
    listing(&dest)
        .into_iter()
        .filter(|l| !l.ends_with('/') && !l.starts_with(CODE_COMPLETE_MARKER))
        .collect()
}

#[test]
fn excluded_paths_inside_the_tree_are_left_out_by_canonical_path_and_change_the_hash() {
    let dir = tempfile::tempdir().unwrap();
    let code = dir.path().join("code");
    write(&code.join("train.py"), "code");
    write(&code.join("config.yml"), "password: hunter2");
    write(&code.join("keys/id_ed25519"), "private key");
    write(&code.join("keys/README"), "keys");
    write(&code.join("sub/config.yml"), "another config, kept");
    write(&dir.path().join("elsewhere.yml"), "outside the tree");
    // Another spelling of the code directory: the exclusions still match.
    let spelled = dir.path().join("code-link");
    std::os::unix::fs::symlink(&code, &spelled).unwrap();
    let limits = ArchiveLimits::default();
    let whole = create(&code, &limits, &[]).unwrap();
    assert_eq!(whole.file_count, 5);
    assert!(whole.left_out.is_empty());

    let exclude = [
        // Not canonical: `..` and the symlinked folder.
        spelled.join("sub/../config.yml"),
        code.join("keys/id_ed25519"),
        // Outside the tree, missing, and the tree itself: nothing is left out for them.
        dir.path().join("elsewhere.yml"),
        code.join("missing.yml"),
        code.clone(),
    ];
    let archive = create(&code, &limits, &exclude).unwrap();
    assert_eq!(
        archive.left_out,
        [
            std::path::PathBuf::from("config.yml"),
            std::path::PathBuf::from("keys/id_ed25519")
        ]
    );
    assert_eq!(archive.file_count, 3);
    assert_eq!(
        unpacked_files(&archive),
        [
            "keys/README: keys",
            "sub/config.yml: another config, kept",
            "train.py: code",
        ]
    );
    assert!(!archive.bytes.is_empty() && archive.hash != whole.hash);
    // Deterministic: the same exclusions, however spelled, give the same bytes.
    let again = create(
        &spelled,
        &limits,
        &[code.join("keys/id_ed25519"), code.join("config.yml")],
    )
    .unwrap();
    assert_eq!(again.bytes, archive.bytes);
    assert_eq!(again.hash, archive.hash);

    // A folder leaves out everything under it, also from the limits.
    let few = ArchiveLimits {
        max_files: 3,
        max_bytes: 1 << 20,
    };
    create(&code, &few, &[]).unwrap_err();
    let archive = create(&code, &few, &[code.join("keys"), code.join("sub")]).unwrap();
    assert_eq!(
        unpacked_files(&archive),
        ["config.yml: password: hunter2", "train.py: code"]
    );
}

#[test]
fn limits_name_the_directory_and_say_to_add_a_nniignore() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..5 {
        write(&dir.path().join(format!("f{i}")), "12345");
    }
    let few = ArchiveLimits {
        max_files: 4,
        max_bytes: 1 << 20,
    };
    let error = create(dir.path(), &few, &[]).unwrap_err().to_string();
    assert!(
        error.starts_with(&format!(
            "trial code directory {} holds more than 4 files",
            dir.path().display()
        )) && error.contains("add a .nniignore"),
        "{error}"
    );

    let small = ArchiveLimits {
        max_files: 100,
        max_bytes: 2 * 1024 * 1024,
    };
    write(&dir.path().join("big.bin"), &"x".repeat(3 * 1024 * 1024));
    let error = create(dir.path(), &small, &[]).unwrap_err().to_string();
    assert!(
        error.contains("holds more than 2 MiB of files") && error.contains("add a .nniignore"),
        "{error}"
    );
    write(&dir.path().join(".nniignore"), "big.bin\n");
    create(dir.path(), &small, &[]).unwrap();

    // The same limits hold when unpacking an archive made with larger ones.
    let archive = create(dir.path(), &ArchiveLimits::default(), &[]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let error = unpack(archive.bytes.as_slice(), &out.path().join("c"), &few).unwrap_err();
    assert!(
        matches!(error, CodeArchiveError::TooManyEntries { limit: 4 }),
        "{error}"
    );
    let tiny = ArchiveLimits {
        max_files: 100,
        max_bytes: 10,
    };
    let error = unpack(archive.bytes.as_slice(), &out.path().join("c"), &tiny).unwrap_err();
    assert_eq!(
        error.to_string(),
        "code archive holds more than 10 bytes; refused"
    );
    // Nothing is left behind by a refused unpack.
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

#[test]
fn links_out_of_the_tree_and_special_files_are_refused_by_create() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("a.py"), "");
    std::os::unix::fs::symlink("/etc", dir.path().join("data")).unwrap();
    let error = create(dir.path(), &ArchiveLimits::default(), &[])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("/data is a symbolic link to /etc outside the trial code directory"),
        "{error}"
    );
    write(&dir.path().join(".nniignore"), "data\n");
    create(dir.path(), &ArchiveLimits::default(), &[]).unwrap();

    let made = std::process::Command::new("mkfifo")
        .arg(dir.path().join("pipe"))
        .status()
        .unwrap();
    assert!(made.success());
    let error = create(dir.path(), &ArchiveLimits::default(), &[])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("/pipe is a named pipe, which cannot be archived"),
        "{error}"
    );

    let missing = dir.path().join("missing");
    let error = create(&missing, &ArchiveLimits::default(), &[])
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(&format!("trial code directory {}:", missing.display())),
        "{error}"
    );
}

/// A gzip tar holding one entry whose name is written raw (tar's builder refuses `..`).
fn raw_archive(name: &str, kind: tar::EntryType, link: Option<&str>, data: &[u8]) -> Vec<u8> {
    raw_entries(&[(name, kind, link, data)])
}

type RawEntry<'a> = (&'a str, tar::EntryType, Option<&'a str>, &'a [u8]);

/// A gzip tar of entries written raw, in order.
fn raw_entries(entries: &[RawEntry<'_>]) -> Vec<u8> {
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut builder = tar::Builder::new(encoder);
    for (name, kind, link, data) in entries {
        let mut header = tar::Header::new_gnu();
        let bytes = name.as_bytes();
        header.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
        if let Some(link) = link {
            header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_entry_type(*kind);
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        header.set_cksum();
        builder.append(&header, *data).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

#[test]
fn unpack_never_writes_through_a_link_it_made() {
    use tar::EntryType::{Regular, Symlink};
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("code").join("h");
    let limits = ArchiveLimits::default();
    // `a -> .` makes `a/b` the same as `b`, so `a/b/l -> ../..` (inside, read as a path) would
    // point out of the tree, and `a/b/l/evil` would land outside it.
    let escape = raw_entries(&[
        ("a", Symlink, Some("."), b""),
        ("a/b/l", Symlink, Some("../.."), b""),
        ("a/b/l/evil", Regular, None, b"x"),
    ]);
    let error = unpack(escape.as_slice(), &dest, &limits).unwrap_err();
    assert_eq!(
        error.to_string(),
        "code archive entry \"a/b/l\" goes through or replaces the link \"a\" it made earlier; refused"
    );
    let replace = raw_entries(&[
        ("target.txt", Regular, None, b"keep"),
        ("l", Symlink, Some("target.txt"), b""),
        ("l", Regular, None, b"overwrite"),
    ]);
    let error = unpack(replace.as_slice(), &dest, &limits).unwrap_err();
    assert!(
        error.to_string().contains("replaces the link \"l\""),
        "{error}"
    );
    assert!(!out.path().join("evil").exists() && !out.path().join("code/evil").exists());
    assert_eq!(
        std::fs::read_dir(out.path().join("code")).unwrap().count(),
        0
    );
}

#[test]
fn unpack_refuses_paths_and_links_that_leave_the_directory() {
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("code").join("h");
    let limits = ArchiveLimits::default();
    let cases = [
        (
            raw_archive("../evil", tar::EntryType::Regular, None, b"x"),
            "code archive entry \"../evil\" is absolute or leaves the code directory; refused",
        ),
        (
            raw_archive("/tmp/evil", tar::EntryType::Regular, None, b"x"),
            "code archive entry \"/tmp/evil\" is absolute or leaves the code directory; refused",
        ),
        (
            raw_archive("a/../../evil", tar::EntryType::Regular, None, b"x"),
            "code archive entry \"a/../../evil\" is absolute or leaves the code directory; refused",
        ),
        (
            raw_archive("l", tar::EntryType::Symlink, Some("/etc"), b""),
            "code archive entry \"l\" is a link to \"/etc\", which leaves the code directory; refused",
        ),
        (
            raw_archive("d/l", tar::EntryType::Symlink, Some("../../x"), b""),
            "code archive entry \"d/l\" is a link to \"../../x\", which leaves the code directory; refused",
        ),
        (
            raw_archive("h", tar::EntryType::Link, Some("/etc/passwd"), b""),
            "code archive entry \"h\" is a Link; only files, directories and symbolic links are unpacked",
        ),
    ];
    for (bytes, expected) in cases {
        let error = unpack(bytes.as_slice(), &dest, &limits).unwrap_err();
        assert_eq!(error.to_string(), expected);
        assert!(!dest.exists());
        assert!(!out.path().join("evil").exists());
        assert_eq!(
            std::fs::read_dir(out.path().join("code")).unwrap().count(),
            0
        );
    }
    let error = unpack(&b"not a gzip"[..], &dest, &limits).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("code archive is not a valid gzip tar"),
        "{error}"
    );
}

#[test]
fn concurrent_unpacks_of_the_same_archive_both_succeed() {
    let source = tempfile::tempdir().unwrap();
    for i in 0..200 {
        write(
            &source.path().join(format!("d{}/f{i}", i % 7)),
            &"y".repeat(i * 10),
        );
    }
    let archive = create(source.path(), &ArchiveLimits::default(), &[]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("code").join(&archive.hash);
    let results: Vec<Unpacked> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| unpack(archive.bytes.as_slice(), &dest, &ArchiveLimits::default()))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    assert!(results.contains(&Unpacked::Written {
        files: 200,
        bytes: archive.total_bytes
    }));
    let mut expected = listing(source.path());
    expected.push(format!("{CODE_COMPLETE_MARKER}: "));
    expected.sort();
    assert_eq!(listing(&dest), expected);
    assert_eq!(
        std::fs::read_dir(out.path().join("code")).unwrap().count(),
        1
    );
}

/// An experiment's copy of the host's cache: the same tree (links kept as links, modes kept),
/// made once; a copy its trials changed is left as they left it, and an incomplete cache is
/// never copied.
#[test]
fn an_experiments_copy_of_the_cache_is_made_once_and_never_from_an_incomplete_cache() {
    use knob_training_services::agent::copy_code;
    let source = tempfile::tempdir().unwrap();
    write(&source.path().join("settings.txt"), "lr=0.1\n");
    write(&source.path().join("lib/run.sh"), "echo hi\n");
    std::fs::set_permissions(
        source.path().join("lib/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("lib/run.sh", source.path().join("run")).unwrap();
    let archive = create(source.path(), &ArchiveLimits::default(), &[]).unwrap();
    let host = tempfile::tempdir().unwrap();
    let cache = host.path().join("code").join(&archive.hash);
    unpack(archive.bytes.as_slice(), &cache, &ArchiveLimits::default()).unwrap();
    let copy = host
        .path()
        .join("experiments/e1/env/code")
        .join(&archive.hash);

    assert_eq!(
        copy_code(&cache, &copy).unwrap(),
        Unpacked::Written {
            files: 3,
            bytes: archive.total_bytes
        }
    );
    assert_eq!(listing(&copy), listing(&cache));
    let mode = std::fs::metadata(copy.join("lib/run.sh"))
        .unwrap()
        .permissions();
    assert_eq!(mode.mode() & 0o777, 0o755);

    // A trial of the experiment changed its copy: copying again (a resume) keeps the change.
    write(&copy.join("settings.txt"), "edited\n");
    assert_eq!(copy_code(&cache, &copy).unwrap(), Unpacked::AlreadyThere);
    assert_eq!(
        std::fs::read_to_string(copy.join("settings.txt")).unwrap(),
        "edited\n"
    );
    // Nothing staged is left beside it.
    assert_eq!(
        std::fs::read_dir(copy.parent().unwrap()).unwrap().count(),
        1
    );

    // A cache whose unpack never finished is not copied.
    let partial = host.path().join("code/partial");
    write(&partial.join("settings.txt"), "half");
    let elsewhere = host.path().join("experiments/e2/env/code/partial");
    let error = copy_code(&partial, &elsewhere).unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "{} is not a complete code directory (no {CODE_COMPLETE_MARKER}); upload the code first",
            partial.display()
        )
    );
    assert!(!elsewhere.exists());
}

/// A link that escapes through another link: `up5 -> ../../../../..` is the tree's root, so
/// `esc -> sub/a/b/c/d/up5/../../../../../etc/hostname` is /etc/hostname, which counting `..`
/// against the path's depth took for inside. Refused when archiving, and when unpacking in
/// either order (the link it goes through made before it or after it).
#[test]
fn a_link_that_escapes_through_another_link_is_refused_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sub/a/b/c/d")).unwrap();
    std::os::unix::fs::symlink("../../../../..", dir.path().join("sub/a/b/c/d/up5")).unwrap();
    create(dir.path(), &ArchiveLimits::default(), &[]).unwrap();
    let esc_target = "sub/a/b/c/d/up5/../../../../../etc/hostname";
    std::os::unix::fs::symlink(esc_target, dir.path().join("esc")).unwrap();
    let error = create(dir.path(), &ArchiveLimits::default(), &[])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&format!(
            "/esc is a symbolic link to {esc_target} outside the trial code directory"
        )),
        "{error}"
    );

    use tar::EntryType::{Directory, Symlink};
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("code").join("h");
    let up = ("x/up", Symlink, Some(".."), &b""[..]);
    let esc = ("esc", Symlink, Some("x/up/../etc"), &b""[..]);
    for entries in [[up, esc], [esc, up]] {
        let bytes = raw_entries(&[("x", Directory, None, b""), entries[0], entries[1]]);
        let error = unpack(bytes.as_slice(), &dest, &ArchiveLimits::default()).unwrap_err();
        assert_eq!(
            error.to_string(),
            "code archive entry \"esc\" is a link to \"x/up/../etc\", which leaves the code directory; refused"
        );
        assert!(!dest.exists());
    }
}
