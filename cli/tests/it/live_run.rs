//! A live run and what happens around it: `knob experiment delete` while a run starts.

use crate::create::{Sandbox, SPACE};
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
