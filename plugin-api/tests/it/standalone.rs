//! knob-plugin-api is published and used alone: a copy of it outside the knob workspace packages
//! and builds, with and without the host side, and a plugin's build does not pull in the loader.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs cargo in `dir`; its stdout and stderr.
fn cargo(dir: &Path, args: &[&str]) -> (String, String) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fixture-target-standalone");
    let output = Command::new(cargo)
        .args(args)
        // Offline: the dependencies are those of the workspace's lock file, already fetched.
        .arg("--offline")
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo {} in a standalone copy of knob-plugin-api failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn the_crate_packages_and_builds_outside_the_workspace_and_plugins_skip_the_loader() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // Outside the workspace's folder (the system's temporary folder), so that no workspace
    // manifest above it can lend it anything.
    let tmp = tempfile::Builder::new()
        .prefix("knob-plugin-api-standalone")
        .tempdir()
        .unwrap();
    let copy = tmp.path().join("knob-plugin-api");
    copy_tree(&crate_dir.join("src"), &copy.join("src"));
    for file in ["Cargo.toml", "README.md"] {
        std::fs::copy(crate_dir.join(file), copy.join(file)).unwrap();
    }
    std::fs::copy(crate_dir.join("../Cargo.lock"), copy.join("Cargo.lock")).unwrap();

    // `cargo package` reads the manifest as crates.io will (every field resolved, the README
    // there); --no-verify: the builds below are the verification.
    cargo(&copy, &["package", "--no-verify", "--quiet"]);
    cargo(&copy, &["check", "--quiet", "--lib"]);
    // A plugin's build shows knob-plugin-api's warnings (a path dependency, as the guide has
    // it): what only the host uses must not be dead code there (H3 F8).
    let (_, stderr) = cargo(
        &copy,
        &["check", "--quiet", "--lib", "--no-default-features"],
    );
    assert!(!stderr.contains("warning"), "{stderr}");

    // What a plugin (default-features = false) links: abi_stable (which itself depends on
    // libloading 0.7 for its own loader) and the SDK's dependencies, never the host's
    // loader dependencies.
    let (tree, _) = cargo(
        &copy,
        &[
            "tree",
            "--no-default-features",
            "-e",
            "normal",
            "--prefix",
            "none",
        ],
    );
    for host_only in ["object v", "tokio v", "libloading v0.8"] {
        assert!(
            !tree.contains(host_only),
            "a plugin's build pulls in {host_only}:\n{tree}"
        );
    }
    let (tree, _) = cargo(&copy, &["tree", "-e", "normal", "--prefix", "none"]);
    assert!(tree.contains("libloading v0.8"), "{tree}");
}
