//! The machine's limits, met for real: a full disk (a 2 MiB tmpfs, mounted in a mount namespace of
//! an unprivileged user namespace with `unshare`, so no root is needed) and the open-file limit
//! (`RLIMIT_NOFILE`, set for the `knob` process the test starts).

use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::create::Sandbox;
use crate::{prerequisite, run};

/// Each trial writes 800 KiB to its stdout: a few fill the 2 MiB disk.
const NOISY_TRIAL: &str = r#"import sys, knob_trial
x = knob_trial.get_parameters()["x"]
for i in range(40):
    sys.stdout.write("x" * 20000 + "\n")
    sys.stdout.flush()
    knob_trial.report_intermediate(i)
knob_trial.report_final(x)
"#;

/// Run in the namespace, with `$KNOB`, `$CONFIG` and `$EXPERIMENTS` set; each step says how it
/// ended on a line of its own.
const SCRIPT: &str = r#"
mount -t tmpfs -o size=2M tmpfs "$EXPERIMENTS" || { echo "no tmpfs"; exit 90; }
# 20 KiB left: room for the folder and its marker, not for the store's files.
dd if=/dev/zero of="$EXPERIMENTS/fill" bs=1k count=2028 2>/dev/null
"$KNOB" create --config "$CONFIG" --id nospace
echo "create on a full disk: $?"
echo "left there: $(ls -A "$EXPERIMENTS" | tr '\n' ' ')"
rm "$EXPERIMENTS/fill"
"$KNOB" create --config "$CONFIG" --id fills
echo "create that fills the disk: $?"
"$KNOB" resume fills 2>&1 | sed 's/^/resume on a full disk said: /'
mount -o remount,size=64M "$EXPERIMENTS"
"$KNOB" resume fills
echo "resume with room: $?"
"$KNOB" experiment list
"#;

#[test]
fn a_full_disk_says_so_leaves_nothing_half_made_and_resume_goes_on_with_room() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: python3 noisy.py\ntrialConcurrency: 2\nmaxTrialNumber: 12\n{}",
            crate::create::SPACE
        ),
        &[("noisy.py", NOISY_TRIAL)],
    );
    let experiments = sandbox.path().join("experiments");
    std::fs::create_dir_all(&experiments).unwrap();
    let probe = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "true"])
        .output();
    if !matches!(&probe, Ok(output) if output.status.success()) {
        prerequisite::missing(&format!(
            "needs `unshare --user --map-root-user --mount` (util-linux, unprivileged user namespaces): {probe:?}"
        ));
        return;
    }
    let mut command = Command::new("unshare");
    command
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", SCRIPT])
        .env("KNOB", env!("CARGO_BIN_EXE_knob"))
        .env("CONFIG", &config)
        .env("EXPERIMENTS", &experiments)
        .env("KNOB_HOME", sandbox.path().join("home"))
        .env_remove("KNOB_PLUGIN_PATH")
        .env("XDG_DATA_HOME", "/nonexistent-knob-test");
    let (code, stdout, stderr) = run(&mut command);
    let all = format!("{stdout}\n{stderr}");
    assert_eq!(code, 0, "{all}");

    // No room for the store: refused in one line, with nothing left behind.
    assert!(all.contains("create on a full disk: 1"), "{all}");
    assert!(
        stderr.lines().any(|l| l.starts_with("error: ")
            && l.contains(
                "nospace/experiment.db: cannot create the experiment store: the disk is full"
            )
            && l.contains("free space on its filesystem")
            // Once: the error's source is not printed after it again.
            && l.matches("the disk is full").count() == 1),
        "{all}"
    );
    assert!(all.contains("left there: fill \n"), "{all}");
    assert!(!stdout.contains("nospace "), "registered: {all}");

    // Trials fill the disk: the experiment stops with the line that says what to do.
    assert!(all.contains("create that fills the disk: 1"), "{all}");
    let full_line = stderr
        .lines()
        .find(|l| l.contains("fills/experiment.db: the disk is full"))
        .unwrap_or_else(|| panic!("{all}"));
    assert!(full_line.starts_with("error: experiment fills: "), "{all}");
    assert!(full_line.contains("knob resume"), "{all}");

    // A resume before there is room says so as the create did (it said "cannot open the
    // experiment store: database or disk is full", naming the store's lock file).
    let said: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("resume on a full disk said: error: "))
        .collect();
    assert!(
        said.len() == 1
            && said[0].contains("fills/experiment.db: the disk is full")
            && said[0].contains("free space on its filesystem"),
        "{all}"
    );

    // With room, resume runs the rest, and every trial ends once, succeeded.
    assert!(all.contains("resume with room: 0"), "{all}");
    assert!(
        stdout.contains("experiment fills DONE: 12 trials (12 succeeded, 0 failed)"),
        "{all}"
    );
}

/// `command` runs with an open-file limit of `soft` (and `hard`, when given).
fn with_open_file_limit(command: &mut Command, soft: u64, hard: Option<u64>) {
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = soft;
            if let Some(hard) = hard {
                limit.rlim_max = hard;
            }
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A soft limit of 256 open files used to fail the starts of all but about 74 of 100 trials
/// at once with EMFILE, for good: knob raises it as far as the hard limit lets it. Where the
/// hard limit itself is too low, a start that finds no descriptor waits and is tried again
/// (the warning names the limit), and every trial still runs.
#[test]
fn a_low_open_file_limit_is_raised_and_one_that_cannot_be_delays_starts_without_failing_them() {
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &format!(
            "trialCommand: sleep 2\ntrialConcurrency: 100\nmaxTrialNumber: 100\n{}",
            crate::create::SPACE
        ),
        &[],
    );
    let hard = {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a plain query into a local.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        limit.rlim_max
    };
    if hard < 1024 {
        prerequisite::not_applicable(&format!(
            "the hard limit of open files here is {hard}, too low to raise a soft limit of 256 for 100 trials"
        ));
        return;
    }
    let create = |id: &str, hard: Option<u64>| {
        let mut command = sandbox.create_command(&config, id);
        with_open_file_limit(&mut command, 256, hard);
        run(&mut command)
    };

    let (code, stdout, stderr) = create("raised", None);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment raised DONE: 100 trials (100 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );

    let (code, stdout, stderr) = create("capped", Some(256));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("experiment capped DONE: 100 trials (100 succeeded, 0 failed)"),
        "{stdout}\n{stderr}"
    );
    let warnings = sandbox.export("capped")["warnings"].to_string();
    assert!(
        warnings.contains("Too many open files (os error 24) (this process may open 256 files, `ulimit -n`; raise the limit where knob starts, or lower trialConcurrency); the trial was not started; trying again in 1 s"),
        "no start waited for a descriptor under a hard limit of 256: {warnings}"
    );
    // Not only in the store: the console says why starts wait.
    assert!(
        stderr
            .lines()
            .any(|line| line.starts_with("warning: trial ")
                && line.contains("Too many open files")
                && line.ends_with("trying again in 1 s")),
        "{stderr}"
    );
}
