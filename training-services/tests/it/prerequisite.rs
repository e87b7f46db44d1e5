//! What a test needs from this machine beyond Rust (an sshd binary, a Python with nni, Chromium,
//! a Slurm cluster), and how a test says it did not run without it.
//!
//! Each prerequisite is named by an environment variable. Unset, the test returns after writing
//! `SKIPPED <test>: needs <VAR> (<how to get it>)` on stderr itself, so that `cargo test` shows
//! the line: libtest captures `eprintln!` of a passing test, not writes to the stderr handle.
//! With `KNOB_TEST_REQUIRE_ALL=1` (CI sets it) the test fails instead, naming the variable, so
//! that a prerequisite CI lost cannot turn tests into silent passes.
//!
//! Self-contained (std only): `cli`'s tests include it with
//! `#[path = "../../../training-services/tests/it/prerequisite.rs"] mod prerequisite;`, as they
//! include `sshd.rs`, which uses it. The README's table of test variables lists [`ALL`]; a test
//! in `cli` checks that it does.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

/// `1`: a missing prerequisite fails the test instead of skipping it.
pub const REQUIRE_ALL: &str = "KNOB_TEST_REQUIRE_ALL";

/// A prerequisite named by an environment variable.
pub struct Prerequisite {
    pub variable: &'static str,
    /// What it is and how to get it, for the skip line and the README.
    pub how: &'static str,
}

pub const SSHD: Prerequisite = Prerequisite {
    variable: "KNOB_TEST_SSHD",
    how: "the sshd binary, e.g. /usr/sbin/sshd of Debian's openssh-server",
};
pub const NNI3_PYTHON: Prerequisite = Prerequisite {
    variable: "KNOB_TEST_NNI3_PYTHON",
    how: "a python with nni 3.0; .ci/nni-venvs.sh makes one and prints the export",
};
pub const NNI2_PYTHON: Prerequisite = Prerequisite {
    variable: "KNOB_TEST_NNI2_PYTHON",
    how: "a python with nni 2.10.1; .ci/nni-venvs.sh makes one and prints the export",
};
pub const NNI_PYTHON: Prerequisite = Prerequisite {
    variable: "KNOB_TEST_NNI_PYTHON",
    how: "a python with nni (2.x or 3.0), e.g. the KNOB_TEST_NNI3_PYTHON of .ci/nni-venvs.sh",
};
pub const CHROMIUM: Prerequisite = Prerequisite {
    variable: "KNOB_TEST_CHROMIUM",
    how: "the chromium binary, e.g. /usr/bin/chromium of Debian's chromium",
};
pub const CHROMEDRIVER: Prerequisite = Prerequisite {
    variable: "KNOB_TEST_CHROMEDRIVER",
    how: "the chromedriver binary, e.g. /usr/bin/chromedriver of Debian's chromium-driver",
};
pub const SLURM: Prerequisite = Prerequisite {
    variable: "KNOB_TEST_SLURM",
    how: "a Slurm cluster up on this machine; .ci/slurm.sh (as root) starts one and prints the export",
};

pub const OPTUNA_PYTHON: Prerequisite = Prerequisite {
    variable: "KNOB_TEST_OPTUNA_PYTHON",
    how: "a python with optuna 5.0 and scikit-learn; .ci/optuna-fanova.sh makes one and prints the export",
};

pub const SMTPD_PYTHON: Prerequisite = Prerequisite {
    variable: "KNOB_TEST_SMTPD_PYTHON",
    how: "a python with aiosmtpd 1.4; .ci/smtpd-venv.sh makes one and prints the export",
};

/// Every prerequisite variable, as the README lists them.
pub const ALL: [&Prerequisite; 9] = [
    &SSHD,
    &NNI3_PYTHON,
    &NNI2_PYTHON,
    &NNI_PYTHON,
    &CHROMIUM,
    &CHROMEDRIVER,
    &SLURM,
    &OPTUNA_PYTHON,
    &SMTPD_PYTHON,
];

impl Prerequisite {
    /// The file the variable names, or `None` when it is unset or empty, after [`missing`]
    /// said so. Set to anything that is not a file, the test fails: whoever set it meant the
    /// test to run.
    pub fn path(&self) -> Option<PathBuf> {
        let variable = self.variable;
        match std::env::var_os(variable) {
            Some(value) if !value.is_empty() => {
                let path = PathBuf::from(value);
                assert!(
                    Path::new(&path).is_file(),
                    "{}: {variable}={} is not a file; it must name {}",
                    test_name(),
                    path.display(),
                    self.how
                );
                Some(path)
            }
            _ => {
                missing(&format!("needs {variable} ({})", self.how));
                None
            }
        }
    }

    /// Whether the variable is `1`; unset, empty or `0`, `false` after [`missing`] said so.
    /// Any other value fails the test.
    pub fn enabled(&self) -> bool {
        let variable = self.variable;
        match std::env::var(variable).as_deref() {
            Ok("1") => true,
            Ok("" | "0") | Err(std::env::VarError::NotPresent) => {
                missing(&format!("needs {variable}=1 ({})", self.how));
                false
            }
            Ok(other) => panic!(
                "{}: {variable}={other:?}; set it to 1 ({}) or unset it",
                test_name(),
                self.how
            ),
            Err(std::env::VarError::NotUnicode(value)) => {
                panic!(
                    "{}: {variable}={value:?}; set it to 1 or unset it",
                    test_name()
                )
            }
        }
    }
}

/// The running test cannot run here because of `why` (a missing prerequisite): fails it under
/// `KNOB_TEST_REQUIRE_ALL=1`, else says so where `cargo test` shows it. The caller returns.
pub fn missing(why: &str) {
    let test = test_name();
    if std::env::var(REQUIRE_ALL).as_deref() == Ok("1") {
        panic!("{test}: {why}; {REQUIRE_ALL}=1 requires every prerequisite");
    }
    say(&format!("SKIPPED {test}: {why}"));
}

/// The running test does not apply to this machine (it checks what happens without something
/// this machine has): says so where `cargo test` shows it, also under `KNOB_TEST_REQUIRE_ALL`,
/// since no prerequisite is missing. The caller returns.
pub fn not_applicable(why: &str) {
    say(&format!("SKIPPED {}: {why}", test_name()));
}

/// One line straight to the stderr handle, which libtest does not capture (`eprintln!` in a
/// test goes to libtest's capture buffer, shown only when the test fails).
fn say(line: &str) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// The test's name: libtest names the thread it runs a test on after the test.
fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("this test")
        .to_string()
}

/// Set in the child process of [`a_missing_prerequisite_is_shown_and_fails_under_require_all`].
const CHILD: &str = "KNOB_TEST_PREREQUISITE_CHILD";
/// A prerequisite no machine has.
const NOWHERE: Prerequisite = Prerequisite {
    variable: "KNOB_TEST_PREREQUISITE_NOWHERE",
    how: "a file no test machine provides",
};

/// Not a test on its own: the child of
/// [`a_missing_prerequisite_is_shown_and_fails_under_require_all`], which needs [`NOWHERE`].
#[test]
fn missing_prerequisite_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let Some(path) = NOWHERE.path() else {
        return;
    };
    panic!("ran with {}", path.display());
}

/// This test binary, run for [`missing_prerequisite_child`] alone as `cargo test` runs it
/// (output captured), with `env` set: whether it passed, and its stdout and stderr.
fn run_child(env: &[(&str, &str)]) -> (bool, String) {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "prerequisite::missing_prerequisite_child"])
        .env(CHILD, "1")
        .env_remove(REQUIRE_ALL)
        .env_remove(NOWHERE.variable);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("1 passed") || text.contains("1 failed"),
        "{text}"
    );
    (output.status.success(), text)
}

#[test]
fn a_missing_prerequisite_is_shown_and_fails_under_require_all() {
    let (passed, text) = run_child(&[]);
    assert!(passed, "{text}");
    assert!(
        text.contains(
            "SKIPPED prerequisite::missing_prerequisite_child: needs \
             KNOB_TEST_PREREQUISITE_NOWHERE (a file no test machine provides)"
        ),
        "{text}"
    );

    let (passed, text) = run_child(&[(REQUIRE_ALL, "1")]);
    assert!(!passed, "{text}");
    assert!(
        text.contains("needs KNOB_TEST_PREREQUISITE_NOWHERE")
            && text.contains("KNOB_TEST_REQUIRE_ALL=1 requires every prerequisite"),
        "{text}"
    );
    assert!(!text.contains("SKIPPED"), "{text}");

    // Set, but to no file: a mistake, not a skip.
    let (passed, text) = run_child(&[(NOWHERE.variable, "/nonexistent/knob-test")]);
    assert!(!passed, "{text}");
    assert!(
        text.contains("KNOB_TEST_PREREQUISITE_NOWHERE=/nonexistent/knob-test is not a file"),
        "{text}"
    );
}

#[test]
fn the_readme_lists_every_prerequisite_variable() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    // A row of its table of test variables for each, and the switch.
    let rows = ALL.iter().map(|p| format!("\n| `{}` |", p.variable));
    for wanted in rows.chain([format!("`{REQUIRE_ALL}=1`")]) {
        assert!(
            readme.contains(&wanted),
            "{} has no {wanted:?}",
            path.display()
        );
    }
}
