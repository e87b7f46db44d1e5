//! A machine shared with others: the limits of the config hold trials back, and a waiting trial
//! says which limit holds it in `knob trial ls` (the same row the API serves).

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::create::{Sandbox, SPACE};
use crate::run;

/// Polls `check` until it gives `Some`, at most `limit`.
fn wait_for<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_trial_held_by_gpu_memory_reserve_says_so_in_trial_ls_then_runs() {
    let sandbox = Sandbox::new();
    // One 16 GiB GPU that may take 3 trials, keeping 8 GiB free: one 6 GiB trial fits, a second
    // would leave 4 GiB.
    let script = "touch started-$NNI_TRIAL_JOB_ID\n\
                  for i in $(seq 600); do [ -e release ] && break; sleep 0.1; done\n\
                  echo KNOB_FINAL 1\n";
    let yaml = format!(
        "trialCommand: bash trial.sh\ntrialConcurrency: 2\nmaxTrialNumber: 2\ntrialGpuNumber: 1\n\
         trialGpuMemory: 6GiB\nmaxTrialNumberPerGpu: 3\ngpuMemoryReserve: 8GiB\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let code_dir = config.parent().unwrap().to_path_buf();
    let child = sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "1x16GiB")
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "reserve"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let row = wait_for(Duration::from_secs(60), "a trial waiting", || {
        let (code, stdout, _) = run(sandbox.knob().args(["trial", "ls", "reserve"]));
        (code == 0)
            .then(|| {
                stdout
                    .lines()
                    .find(|line| line.contains("WAITING") && line.contains("gpuMemoryReserve"))
                    .map(str::to_owned)
            })
            .flatten()
    });
    assert!(
        row.contains("GPU 0 has 10 GiB free (gpuMemoryReserve 8 GiB kept free)"),
        "{row}"
    );
    let started = || {
        std::fs::read_dir(&code_dir)
            .unwrap()
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("started-"))
            .count()
    };
    // The placed trial's script may not have touched its file yet when the WAITING row shows
    // (a loaded machine starts bash late): wait for it, then watch that the second one stays out
    // for as long as it is reported waiting.
    wait_for(Duration::from_secs(60), "the placed trial to start", || {
        (started() >= 1).then_some(())
    });
    let watch_until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < watch_until {
        assert_eq!(started(), 1, "only one trial may run under the reserve");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, stdout, _) = run(sandbox.knob().args(["trial", "ls", "reserve"]));
    assert!(
        stdout.contains("WAITING") && stdout.contains("gpuMemoryReserve"),
        "the second trial still waits for the reserve: {stdout}"
    );
    assert_eq!(started(), 1, "only one trial may run under the reserve");
    std::fs::write(code_dir.join("release"), "").unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("2 trials (2 succeeded, 0 failed)"),
        "{stdout}"
    );
    // Once it ran, the reason is gone.
    let (_, stdout, _) = run(sandbox.knob().args(["trial", "ls", "reserve"]));
    assert!(!stdout.contains("gpuMemoryReserve"), "{stdout}");
}
