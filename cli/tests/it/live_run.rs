//! A live run and what happens around it: `knob experiment delete` while a run starts, a signal
//! the moment a run becomes visible.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::create::{Sandbox, SPACE};
use crate::resume::wait_bounded;
use crate::run;

/// `knob resume` takes its store's writer lock before the registry says it runs; `knob
/// experiment delete`, which looked only at the registry, deleted an experiment whose resume was
/// between the two (its manager ran on without a store or a registry entry). Here the lock is
/// held as a starting run holds it, with nothing in the registry: delete refuses, and changes
/// nothing.
#[test]
fn delete_refuses_an_experiment_whose_store_a_run_holds() {
    let sandbox = Sandbox::new();
    let yaml =
        format!("trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\nmaxTrialNumber: 1\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    let (code, _, stderr) = sandbox.create(&config, "held");
    assert_eq!(code, 0, "{stderr}");
    let dir = sandbox.path().join("experiments/held");

    let lock = rusqlite::Connection::open(dir.join("experiment.db.writer-lock")).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "delete", "held", "--yes"]));
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert_eq!(
        stderr,
        "error: experiment held is running (a knob process holds its store: it runs or is starting); stop it first with `knob stop held`\n"
    );
    assert!(dir.join("experiment.db").is_file());
    assert_eq!(sandbox.export("held")["experiment"]["status"], "DONE");
    let (_, list, _) = run(sandbox.knob().args(["experiment", "list"]));
    assert!(list.lines().any(|l| l.starts_with("held ")), "{list}");

    // Once the run lets go, the delete goes through.
    drop(lock);
    let (code, stdout, stderr) =
        run(sandbox
            .knob()
            .args(["experiment", "delete", "held", "--yes"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("experiment held deleted ("), "{stdout}");
    assert!(!dir.exists());
}

/// The registry's `pid` and `status` of experiment `id`; `None` while it has no entry.
fn registry_row(registry: &rusqlite::Connection, id: &str) -> Option<(Option<u32>, String)> {
    use rusqlite::OptionalExtension;
    registry
        .query_row(
            "SELECT pid, status FROM experiments WHERE id = ?1",
            [id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .unwrap()
}

/// Starts `command` with its stderr in `log`.
fn spawn_logged(mut command: Command, log: &Path) -> Child {
    command
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// SIGINT to `child` as soon as the registry names it as the runner of `id` (`status`, when
/// given, too), polling every millisecond for at most 60 s; then its exit code (bounded).
fn interrupt_once_visible(
    registry: &rusqlite::Connection,
    mut child: Child,
    id: &str,
    status: Option<&str>,
) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row = registry_row(registry, id);
        let visible = row.as_ref().is_some_and(|(pid, shown)| {
            *pid == Some(child.id()) && status.is_none_or(|status| shown == status)
        });
        if visible {
            break;
        }
        if let Some(exit) = child.try_wait().unwrap() {
            panic!("{id}: knob ended ({exit}) before it was visible in the registry");
        }
        assert!(
            Instant::now() < deadline,
            "{id} not in the registry: {row:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: signalling our own child, not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    wait_bounded(&mut child, Duration::from_secs(60))
}

/// The signals were caught only once the manager ran: a SIGINT, SIGTERM or SIGHUP in between
/// (the registry said RUNNING, with the pid, already) took the default action, and the
/// experiment was left crashed with no line said. Caught before the run is visible, a signal
/// that comes that early stops the run as one later does, for `create` and for `resume`.
#[test]
fn ctrl_c_the_moment_a_run_is_visible_stops_it_cleanly() {
    let sandbox = Sandbox::new();
    let yaml = format!("trialCommand: sleep 30\ntrialConcurrency: 1\nmaxTrialNumber: 5\n{SPACE}");
    let config = sandbox.config(&yaml, &[]);
    // The registry exists before the runs, so that polling it never races its creation.
    assert_eq!(
        run(sandbox.knob().args(["experiment", "list"])).0,
        0,
        "knob experiment list"
    );
    let registry = rusqlite::Connection::open_with_flags(
        sandbox.path().join("home/registry.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let log = sandbox.path().join("stderr.log");
    let check = |what: &str, id: &str, code: Option<i32>| {
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(code, Some(0), "{what}: {stderr}");
        assert!(
            stderr.contains("stopping (Ctrl-C or knob stop)"),
            "{what}: {stderr}"
        );
        assert_eq!(
            registry_row(&registry, id),
            Some((None, "STOPPED".to_string())),
            "{what}: {stderr}"
        );
        assert_eq!(
            sandbox.export(id)["experiment"]["status"],
            "STOPPED",
            "{what}: {stderr}"
        );
    };
    for round in 0..4 {
        let id = format!("early{round}");
        let child = spawn_logged(sandbox.create_command(&config, &id), &log);
        let code = interrupt_once_visible(&registry, child, &id, None);
        check(&format!("create {id}"), &id, code);
    }
    for round in 0..4 {
        let mut command = sandbox.knob();
        command.args(["resume", "early0"]);
        let child = spawn_logged(command, &log);
        let code = interrupt_once_visible(&registry, child, "early0", Some("RUNNING"));
        check(&format!("resume {round}"), "early0", code);
    }
}
