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

/// A trial that takes one simulated GPU and holds it until `release` appears in the code
/// folder. Each GPU it is given is claimed with an exclusive file (`set -C`), so two trials on
/// one GPU at once leave an `overlap` file, whatever the ledger says.
const GPU_TRIAL: &str = "set -C\n\
    gpu=$CUDA_VISIBLE_DEVICES\n\
    if ! echo \"$NNI_EXP_ID/$NNI_TRIAL_JOB_ID\" > busy-gpu-$gpu 2>/dev/null; then\n\
      echo \"$NNI_EXP_ID/$NNI_TRIAL_JOB_ID on GPU $gpu with $(cat busy-gpu-$gpu)\" >> overlap\n\
    fi\n\
    echo \"$NNI_EXP_ID $NNI_TRIAL_JOB_ID $gpu\" >> started\n\
    for i in $(seq 1200); do [ -e release ] && break; sleep 0.05; done\n\
    rm -f busy-gpu-$gpu\n\
    echo KNOB_FINAL 1\n";

fn two_gpu_config(sandbox: &Sandbox) -> std::path::PathBuf {
    let yaml = format!(
        "trialCommand: bash trial.sh\ntrialConcurrency: 2\nmaxTrialNumber: 2\ntrialGpuNumber: 1\n\
         maxTrialNumberPerGpu: 1\n{SPACE}"
    );
    sandbox.config(&yaml, &[("trial.sh", GPU_TRIAL)])
}

fn start_experiment(sandbox: &Sandbox, config: &std::path::Path, id: &str) -> std::process::Child {
    sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "2x16GiB")
        .arg("create")
        .arg("--config")
        .arg(config)
        .args(["--id", id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The `started` lines (`experiment trial gpu`) the trials wrote.
fn started(code_dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(code_dir.join("started"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Replays the ledger's journal (grants, releases, reclaims in the order they were made under
/// its lock) and returns the most trials any GPU held at once, and how many grants there were.
fn most_trials_on_one_gpu(home: &std::path::Path) -> (usize, usize) {
    let journal = std::fs::read_to_string(home.join("gpu-ledger.journal")).unwrap_or_default();
    let mut held: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
    let (mut most, mut grants) = (0, 0);
    for line in journal.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).unwrap();
        let who = format!("{}/{}", entry["experiment"], entry["trial"]);
        for gpu in entry["gpus"].as_array().unwrap() {
            let on = held.entry(gpu.as_u64().unwrap()).or_default();
            match entry["op"].as_str().unwrap() {
                "grant" => on.push(who.clone()),
                _ => on.retain(|holder| *holder != who),
            }
            most = most.max(on.len());
        }
        grants += usize::from(entry["op"] == "grant");
    }
    (most, grants)
}

fn finish(child: std::process::Child) -> String {
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn two_experiments_never_share_a_gpu_and_the_waiting_one_names_the_holder() {
    let sandbox = Sandbox::new();
    let config = two_gpu_config(&sandbox);
    let code_dir = config.parent().unwrap().to_path_buf();
    let first = start_experiment(&sandbox, &config, "first");
    wait_for(
        Duration::from_secs(60),
        "both trials of `first` running",
        || (started(&code_dir).len() == 2).then_some(()),
    );
    let second = start_experiment(&sandbox, &config, "second");
    // Both GPUs are first's: second's trials wait, naming it.
    let row = wait_for(
        Duration::from_secs(60),
        "a trial of `second` waiting",
        || {
            let (_, stdout, _) = run(sandbox.knob().args(["trial", "ls", "second"]));
            stdout
                .lines()
                .find(|line| line.contains("WAITING") && line.contains("of experiment first"))
                .map(str::to_owned)
        },
    );
    assert!(row.contains("GPU"), "{row}");
    let (code, gpu_table, stderr) = run(sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "2x16GiB")
        .arg("gpu"));
    assert_eq!(code, 0, "{stderr}");
    assert!(gpu_table.contains("held by"), "{gpu_table}");
    assert_eq!(
        gpu_table.matches("first trial").count(),
        2,
        "`knob gpu` names first's trial on each GPU:\n{gpu_table}"
    );
    assert_eq!(started(&code_dir).len(), 2, "second started on a held GPU");
    std::fs::write(code_dir.join("release"), "").unwrap();
    assert!(finish(first).contains("2 trials (2 succeeded, 0 failed)"));
    assert!(finish(second).contains("2 trials (2 succeeded, 0 failed)"));
    assert!(
        !code_dir.join("overlap").exists(),
        "two trials ran on one GPU: {}",
        std::fs::read_to_string(code_dir.join("overlap")).unwrap_or_default()
    );
    let (most, grants) = most_trials_on_one_gpu(&sandbox.path().join("home"));
    assert_eq!(grants, 4, "every trial took a lease");
    assert_eq!(most, 1, "the ledger's history has a GPU held twice");
    // The waiting reason is in the log (the export's warnings) too.
    let export = sandbox.export("second");
    let named = export["warnings"].as_array().unwrap().iter().any(|w| {
        w["message"]
            .as_str()
            .unwrap()
            .contains("of experiment first")
    });
    assert!(named, "{:#}", export["warnings"]);
}

/// A killed experiment's trials, in process groups of their own, live on: the other
/// experiment does not put its trials on their GPUs (no GPU is ever busy twice), and takes them
/// within a probe interval of their end.
#[test]
fn when_an_experiment_is_killed_the_other_takes_its_gpus_once_its_trials_end() {
    let sandbox = Sandbox::new();
    let config = two_gpu_config(&sandbox);
    let code_dir = config.parent().unwrap().to_path_buf();
    let mut first = start_experiment(&sandbox, &config, "first");
    wait_for(
        Duration::from_secs(60),
        "both trials of `first` running",
        || (started(&code_dir).len() == 2).then_some(()),
    );
    let second = start_experiment(&sandbox, &config, "second");
    wait_for(
        Duration::from_secs(60),
        "a trial of `second` waiting",
        || {
            let (_, stdout, _) = run(sandbox.knob().args(["trial", "ls", "second"]));
            stdout.contains("of experiment first").then_some(())
        },
    );
    // SIGKILL: first's leases stay in the ledger with a dead holder, and its trials run on.
    first.kill().unwrap();
    first.wait().unwrap();
    // `knob gpu` reclaims what dead holders hold: the leases of trials still running stay.
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "2x16GiB")
        .arg("gpu"));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.matches("first trial ").count(), 2, "{stdout}");
    // first's trials end; the manager asks for environments every 5 s while a trial waits
    // (REPROBE_INTERVAL): within one such interval (plus start-up slack on a loaded machine)
    // second runs both.
    std::fs::write(code_dir.join("release"), "").unwrap();
    wait_for(Duration::from_secs(15), "second's trials running", || {
        let second_started = started(&code_dir)
            .iter()
            .filter(|line| line.starts_with("second "))
            .count();
        (second_started == 2).then_some(())
    });
    assert!(finish(second).contains("2 trials (2 succeeded, 0 failed)"));
    assert_eq!(
        std::fs::read_to_string(code_dir.join("overlap")).unwrap_or_default(),
        "",
        "a GPU ran two trials at once"
    );
    let journal =
        std::fs::read_to_string(sandbox.path().join("home").join("gpu-ledger.journal")).unwrap();
    assert_eq!(
        journal.matches("\"op\":\"reclaim\"").count(),
        2,
        "both of first's leases reclaimed:\n{journal}"
    );
}

#[test]
fn a_trial_over_its_memory_request_is_killed_and_runs_again_with_more() {
    let sandbox = Sandbox::new();
    // 150 MiB touched, against a 64 MiB request: killed, then asked again with twice what it
    // used (or asked), at most three times.
    let script = "import time\n\
                  block = b'x' * (150 * 1024 * 1024)\n\
                  time.sleep(1.5)\n\
                  print('KNOB_FINAL 1', flush=True)\n";
    let yaml = format!(
        "trialCommand: python3 alloc.py\ntrialConcurrency: 1\nmaxTrialNumber: 1\n\
         trialMemorySize: 64MiB\nmaxOomRetries: 3\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[("alloc.py", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "oom");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("(1 succeeded, 0 failed)"), "{stdout}");
    let export = sandbox.export("oom");
    let trial = &export["trials"][0];
    assert_eq!(trial["status"], "SUCCEEDED", "{trial:#}");
    let attempts = trial["attempt_history"].as_array().unwrap();
    assert!(attempts.len() >= 2, "{trial:#}");
    let first_requeue = attempts[0]["requeued"].as_str().unwrap();
    assert!(
        first_requeue.contains("more than its 64 MiB request (trialMemorySize)")
            && first_requeue.contains("the next attempt asks for"),
        "{first_requeue}"
    );
    let raised = trial["memory_request_mib"].as_u64().unwrap();
    assert!(raised >= 150, "raised to {raised} MiB: {trial:#}");
    // Each attempt's measured peak, and the request the next one asked for.
    let peak = attempts[0]["peak_memory_mib"].as_u64().unwrap();
    assert!(peak > 64, "attempt 1's peak {peak} MiB: {trial:#}");
    assert_eq!(
        attempts[0]["memory_request_mib"],
        2 * peak.max(64),
        "twice the larger of its request and its peak: {trial:#}"
    );
    let last = attempts.last().unwrap();
    assert!(
        last["peak_memory_mib"].as_u64().unwrap() >= 150,
        "the succeeding attempt's peak: {trial:#}"
    );
    let (_, ls, _) = run(sandbox.knob().args(["trial", "ls", "oom"]));
    let learned_from = attempts[attempts.len() - 2]["peak_memory_mib"]
        .as_u64()
        .unwrap();
    assert!(
        ls.contains(&format!(
            "memory request {raised} MiB after out of memory at a {learned_from} MiB peak"
        )),
        "{ls}"
    );
}

/// A simulated-GPU experiment's trial: each attempt counts itself, says on the simulated GPU
/// it uses `$GPU_MIB` MiB (the simulation's stand-in for NVML, `KNOB_SIMULATED_GPU_MEMORY_FILE`)
/// and notes its attempt in `attempts`.
const GPU_MEMORY_TRIAL: &str =
    "n=$(cat count-$NNI_TRIAL_JOB_ID 2>/dev/null || echo 0); n=$((n + 1))\n\
    echo $n > count-$NNI_TRIAL_JOB_ID\n\
    echo $GPU_MIB > \"$KNOB_SIMULATED_GPU_MEMORY_FILE\"\n\
    echo \"attempt $n\" >> attempts\n";

#[test]
fn a_trial_over_its_gpu_memory_request_runs_again_with_more_and_keeps_it_across_a_resume() {
    let sandbox = Sandbox::new();
    // 3000 MiB used against a 1 GiB trialGpuMemory: killed; asked again with twice the peak
    // (6000 MiB). Attempt 2 waits until the manager is SIGKILLed; the resume's attempt 3 uses
    // 3000 MiB again and, with only one OOM retry allowed, succeeds only if the raised request
    // came back from the store.
    let script = format!(
        "GPU_MIB=3000\n{GPU_MEMORY_TRIAL}\
         if [ $n -eq 1 ]; then for i in $(seq 600); do sleep 0.05; done; echo KNOB_FINAL 0; exit 0; fi\n\
         if [ $n -eq 2 ]; then for i in $(seq 1200); do sleep 0.05; done; fi\n\
         sleep 0.6\necho KNOB_FINAL 1\n"
    );
    let yaml = format!(
        "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1\ntrialGpuNumber: 1\n\
         trialGpuMemory: 1GiB\nmaxOomRetries: 1\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[("trial.sh", &script)]);
    let code_dir = config.parent().unwrap().to_path_buf();
    let mut first = sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "1x16GiB")
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "gpuoom"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(60), "attempt 2 running", || {
        let attempts = std::fs::read_to_string(code_dir.join("attempts")).unwrap_or_default();
        attempts.contains("attempt 2").then_some(())
    });
    let (_, ls, _) = run(sandbox.knob().args(["trial", "ls", "gpuoom"]));
    assert!(
        ls.contains("GPU memory request 6000 MiB after out of GPU memory"),
        "{ls}"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "1x16GiB")
        .args(["resume", "gpuoom"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let export = sandbox.export("gpuoom");
    let trial = &export["trials"][0];
    assert_eq!(trial["status"], "SUCCEEDED", "{trial:#}");
    assert_eq!(trial["gpu_memory_request_mib"], 6000, "{trial:#}");
    assert_eq!(
        trial["memory_request_mib"],
        serde_json::Value::Null,
        "{trial:#}"
    );
    let first_requeue = trial["attempt_history"][0]["requeued"].as_str().unwrap();
    assert!(
        first_requeue.contains(
            "knob: the trial used 3000 MiB of GPU memory, more than its 1024 MiB request (trialGpuMemory); killed as out of GPU memory"
        ) && first_requeue.contains(
            "out of GPU memory: the next attempt asks for 6000 MiB of GPU memory (asked 1024 MiB, GPU memory peak 3000 MiB)"
        ),
        "{first_requeue}"
    );
    let attempts = std::fs::read_to_string(code_dir.join("attempts")).unwrap();
    assert_eq!(attempts, "attempt 1\nattempt 2\nattempt 3\n");
}

#[test]
fn a_cuda_out_of_memory_error_raises_the_gpu_memory_request_from_the_sampled_peak() {
    let sandbox = Sandbox::new();
    // No trialGpuMemory: attempt 1 is seen using 1500 MiB, then fails as PyTorch does; attempt 2
    // asks for twice its peak.
    let script = format!(
        "GPU_MIB=1500\n{GPU_MEMORY_TRIAL}\
         if [ $n -eq 1 ]; then sleep 2.5\n\
         echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 16.00 GiB' >&2; exit 1; fi\n\
         echo KNOB_FINAL 1\n"
    );
    let yaml = format!(
        "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1\ntrialGpuNumber: 1\n\
         maxOomRetries: 1\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[("trial.sh", &script)]);
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "1x16GiB")
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "cudaoom"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let trial = &sandbox.export("cudaoom")["trials"][0];
    assert_eq!(trial["status"], "SUCCEEDED", "{trial:#}");
    assert_eq!(trial["gpu_memory_request_mib"], 3000, "{trial:#}");
    let requeue = trial["attempt_history"][0]["requeued"].as_str().unwrap();
    assert!(
        requeue.contains("torch.OutOfMemoryError: CUDA out of memory")
            && requeue.contains(
                "out of GPU memory: the next attempt asks for 3000 MiB of GPU memory (no trialGpuMemory, GPU memory peak 1500 MiB)"
            ),
        "{requeue}"
    );
    assert_eq!(
        trial["attempt_history"][0]["peak_gpu_memory_mib"], 1500,
        "{trial:#}"
    );
    let (_, ls, _) = run(sandbox.knob().args(["trial", "ls", "cudaoom"]));
    assert!(
        ls.contains("GPU memory request 3000 MiB after out of GPU memory at a 1500 MiB peak"),
        "{ls}"
    );
}

/// A trial that records `experiment trial gpus` in `started`, then holds its GPU until
/// `go-<experiment>` appears in the code folder (at most 60 s).
const HOLD_UNTIL_GO: &str =
    "echo \"$NNI_EXP_ID $NNI_TRIAL_JOB_ID $CUDA_VISIBLE_DEVICES\" >> started\n\
    for i in $(seq 1200); do [ -e go-$NNI_EXP_ID ] && break; sleep 0.05; done\n\
    echo KNOB_FINAL 1\n";

/// Writes `<name>.yml` beside the trial script (one code folder for every experiment).
fn named_config(sandbox: &Sandbox, name: &str, yaml: &str) -> std::path::PathBuf {
    let written = sandbox.config(yaml, &[("trial.sh", HOLD_UNTIL_GO)]);
    let path = written.with_file_name(format!("{name}.yml"));
    std::fs::rename(&written, &path).unwrap();
    path
}

fn start_on(
    sandbox: &Sandbox,
    gpus: &str,
    config: &std::path::Path,
    id: &str,
) -> std::process::Child {
    sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", gpus)
        .arg("create")
        .arg("--config")
        .arg(config)
        .args(["--id", id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The GPUs of `experiment`'s standing request in the ledger, once it has one.
fn standing_gpus(home: &std::path::Path, experiment: &str) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(home.join("gpu-ledger.json")).ok()?;
    let ledger: serde_json::Value = serde_json::from_str(&text).ok()?;
    ledger["requests"].as_array()?.iter().find_map(|request| {
        let lease = &request["lease"];
        (lease["trial"] == "(waiting trials)" && lease["holder"]["experiment"] == experiment).then(
            || {
                lease["gpus"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|gpu| gpu.as_u64().unwrap())
                    .collect()
            },
        )
    })
}

#[test]
fn a_waiting_experiment_never_holds_back_a_gpu_outside_its_gpu_indices() {
    let sandbox = Sandbox::new();
    let gpu_config = |name: &str, trials: u32, gpu: u32| {
        let yaml = format!(
            "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: {trials}\n\
             trialGpuNumber: 1\n{SPACE}\n  gpuIndices: \"{gpu}\""
        );
        named_config(&sandbox, name, &yaml)
    };
    let (holder, wide, narrow) = (
        gpu_config("holder", 1, 1),
        gpu_config("wide", 2, 0),
        gpu_config("narrow", 1, 1),
    );
    let code_dir = holder.parent().unwrap().to_path_buf();
    let home = sandbox.path().join("home");
    let has_started = |experiment: &str, count: usize| {
        let prefix = format!("{experiment} ");
        started(&code_dir)
            .iter()
            .filter(|line| line.starts_with(&prefix))
            .count()
            >= count
    };
    // `holder` takes GPU 1 and `wide` GPU 0, each with a trial that holds it.
    let holder = start_on(&sandbox, "2x16GiB", &holder, "holder");
    wait_for(Duration::from_secs(60), "holder's trial running", || {
        has_started("holder", 1).then_some(())
    });
    let wide = start_on(&sandbox, "2x16GiB", &wide, "wide");
    wait_for(
        Duration::from_secs(60),
        "wide's first trial running",
        || has_started("wide", 1).then_some(()),
    );
    // `narrow` may use GPU 1 only: it stands in line for that one, never for wide's GPU 0.
    let narrow = start_on(&sandbox, "2x16GiB", &narrow, "narrow");
    let gpus = wait_for(Duration::from_secs(60), "narrow standing in line", || {
        standing_gpus(&home, "narrow")
    });
    assert_eq!(gpus, [1], "narrow stood in line for a GPU it may not use");
    // wide's next trial takes GPU 0 again, while narrow still waits for GPU 1.
    std::fs::write(code_dir.join("go-wide"), "").unwrap();
    wait_for(
        Duration::from_secs(60),
        "wide's second trial running",
        || has_started("wide", 2).then_some(()),
    );
    assert!(finish(wide).contains("2 trials (2 succeeded, 0 failed)"));
    assert!(!has_started("narrow", 1), "narrow ran on a held GPU");
    std::fs::write(code_dir.join("go-holder"), "").unwrap();
    std::fs::write(code_dir.join("go-narrow"), "").unwrap();
    assert!(finish(holder).contains("1 trial (1 succeeded, 0 failed)"));
    assert!(finish(narrow).contains("1 trial (1 succeeded, 0 failed)"));
    let on_gpu_1 = started(&code_dir)
        .iter()
        .any(|line| line.starts_with("narrow ") && line.ends_with(" 1"));
    assert!(on_gpu_1, "{:?}", started(&code_dir));
}

#[test]
fn two_experiments_started_together_never_promise_a_gpu_more_memory_than_it_has() {
    let sandbox = Sandbox::new();
    // Two trials may share the 80 GiB GPU by count, but 50 GiB each do not fit together. Both
    // experiments start at once, so both may place against the same probe: the ledger's grant,
    // under its lock, must then keep the second out (caught only when the race happens; the
    // ledger's own test, `a_gpu_is_never_granted_more_memory_than_it_has…`, always is).
    let config = named_config(
        &sandbox,
        "half",
        &format!(
            "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1\n\
             trialGpuNumber: 1\ntrialGpuMemory: 50GiB\nmaxTrialNumberPerGpu: 2\n{SPACE}"
        ),
    );
    let code_dir = config.parent().unwrap().to_path_buf();
    let first = start_on(&sandbox, "1x80GiB", &config, "ra");
    let second = start_on(&sandbox, "1x80GiB", &config, "rb");
    wait_for(Duration::from_secs(60), "one trial running", || {
        (!started(&code_dir).is_empty()).then_some(())
    });
    let waiting = wait_for(Duration::from_secs(60), "the other trial waiting", || {
        ["ra", "rb"].into_iter().find(|id| {
            let (_, stdout, _) = run(sandbox.knob().args(["trial", "ls", id]));
            stdout.contains("WAITING")
        })
    });
    assert_eq!(started(&code_dir).len(), 1, "both trials on one 80 GiB GPU");
    let running = if waiting == "ra" { "rb" } else { "ra" };
    std::fs::write(code_dir.join(format!("go-{running}")), "").unwrap();
    std::fs::write(code_dir.join(format!("go-{waiting}")), "").unwrap();
    assert!(finish(first).contains("1 trial (1 succeeded, 0 failed)"));
    assert!(finish(second).contains("1 trial (1 succeeded, 0 failed)"));
    let (most, grants) = most_trials_on_one_gpu(&sandbox.path().join("home"));
    assert_eq!(
        (most, grants),
        (1, 2),
        "the ledger granted 100 GiB on GPU 0 at once"
    );
}

#[test]
fn a_trial_refused_the_gpu_it_was_placed_on_takes_another_free_one() {
    let sandbox = Sandbox::new();
    // `busy` runs two trials one after the other on a 2-GPU machine; `zero` may use GPU 0 only.
    let busy = named_config(
        &sandbox,
        "busy",
        &format!(
            "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 2\n\
             trialGpuNumber: 1\n{SPACE}"
        ),
    );
    let zero = named_config(
        &sandbox,
        "zero",
        &format!(
            "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1\n\
             trialGpuNumber: 1\n{SPACE}\n  gpuIndices: \"0\""
        ),
    );
    let code_dir = busy.parent().unwrap().to_path_buf();
    let home = sandbox.path().join("home");
    let lines_of = |experiment: &str| -> Vec<String> {
        let prefix = format!("{experiment} ");
        started(&code_dir)
            .into_iter()
            .filter(|line| line.starts_with(&prefix))
            .collect()
    };
    let busy = start_on(&sandbox, "2x16GiB", &busy, "busy");
    let first = wait_for(
        Duration::from_secs(60),
        "busy's first trial running",
        || lines_of("busy").into_iter().next(),
    );
    assert!(
        first.ends_with(" 0"),
        "busy's first trial is not on GPU 0: {first}"
    );
    // `zero` waits for busy's GPU 0 and stands in line for it.
    let zero = start_on(&sandbox, "2x16GiB", &zero, "zero");
    wait_for(Duration::from_secs(60), "zero standing in line", || {
        standing_gpus(&home, "zero").filter(|gpus| gpus == &[0])
    });
    // busy's first trial ends. Its scheduler, which saw both GPUs free when it last probed
    // (nothing of busy's waited since), places the second trial on GPU 0 again, which the
    // ledger has promised to zero: refused, it must take the idle GPU 1, not wait for zero's
    // trial, which holds GPU 0 until `go-zero`.
    std::fs::write(code_dir.join("go-busy"), "").unwrap();
    let second = wait_for(
        Duration::from_secs(60),
        "busy's second trial running while zero holds GPU 0",
        || lines_of("busy").get(1).cloned(),
    );
    assert!(second.ends_with(" 1"), "{:?}", started(&code_dir));
    assert!(finish(busy).contains("2 trials (2 succeeded, 0 failed)"));
    std::fs::write(code_dir.join("go-zero"), "").unwrap();
    assert!(finish(zero).contains("1 trial (1 succeeded, 0 failed)"));
    let (most, _) = most_trials_on_one_gpu(&home);
    assert_eq!(most, 1, "the ledger's history has a GPU held twice");
}

#[test]
fn a_lowered_trial_concurrency_holds_for_trials_that_wait_for_a_gpu() {
    let sandbox = Sandbox::new();
    // `other` holds the one GPU; `low`'s two trials wait for it (two fit on it once free).
    let other = named_config(
        &sandbox,
        "other",
        &format!(
            "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1\n\
             trialGpuNumber: 1\n{SPACE}"
        ),
    );
    let low = named_config(
        &sandbox,
        "low",
        &format!(
            "trialCommand: bash trial.sh\ntrialConcurrency: 2\nmaxTrialNumber: 2\n\
             trialGpuNumber: 1\nmaxTrialNumberPerGpu: 2\n{SPACE}"
        ),
    );
    let code_dir = other.parent().unwrap().to_path_buf();
    let low_started = || {
        started(&code_dir)
            .iter()
            .filter(|line| line.starts_with("low "))
            .count()
    };
    let other = start_on(&sandbox, "1x16GiB", &other, "other");
    wait_for(Duration::from_secs(60), "other's trial running", || {
        (!started(&code_dir).is_empty()).then_some(())
    });
    let low = start_on(&sandbox, "1x16GiB", &low, "low");
    let trial_ls = || run(sandbox.knob().args(["trial", "ls", "low"])).1;
    wait_for(Duration::from_secs(60), "low's two trials waiting", || {
        (trial_ls().matches("WAITING").count() == 2).then_some(())
    });
    let (code, _, stderr) = run(sandbox.knob().args(["update", "concurrency", "low", "1"]));
    assert_eq!(code, 0, "{stderr}");
    wait_for(
        Duration::from_secs(60),
        "a trial of low waiting for trialConcurrency",
        || trial_ls().contains("trialConcurrency is 1").then_some(()),
    );
    // The GPU frees: one trial of low starts, the other waits for it to end.
    std::fs::write(code_dir.join("go-other"), "").unwrap();
    assert!(finish(other).contains("1 trial (1 succeeded, 0 failed)"));
    let ls = wait_for(Duration::from_secs(60), "a trial of low running", || {
        let ls = trial_ls();
        ls.contains("RUNNING").then_some(ls)
    });
    assert_eq!(low_started(), 1, "{ls}");
    assert_eq!(ls.matches("RUNNING").count(), 1, "{ls}");
    std::fs::write(code_dir.join("go-low"), "").unwrap();
    assert!(finish(low).contains("2 trials (2 succeeded, 0 failed)"));
    assert_eq!(low_started(), 2);
}

#[test]
fn knob_gpu_lists_a_waiting_request_apart_from_the_holders() {
    let sandbox = Sandbox::new();
    let config = named_config(
        &sandbox,
        "one",
        &format!(
            "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 1\n\
             trialGpuNumber: 1\n{SPACE}"
        ),
    );
    let code_dir = config.parent().unwrap().to_path_buf();
    let home = sandbox.path().join("home");
    let holder = start_on(&sandbox, "1x16GiB", &config, "jsa");
    wait_for(Duration::from_secs(60), "jsa's trial running", || {
        (!started(&code_dir).is_empty()).then_some(())
    });
    let waiter = start_on(&sandbox, "1x16GiB", &config, "jsb");
    wait_for(Duration::from_secs(60), "jsb standing in line", || {
        standing_gpus(&home, "jsb").filter(|gpus| gpus == &[0])
    });
    let gpu = |args: &[&str]| {
        let (code, stdout, stderr) = run(sandbox
            .knob()
            .env("KNOB_SIMULATE_GPUS", "1x16GiB")
            .arg("gpu")
            .args(args));
        assert_eq!(code, 0, "{stderr}");
        stdout
    };
    let json: serde_json::Value = serde_json::from_str(&gpu(&["--json"])).unwrap();
    let held = &json["environments"][0]["gpus"][0]["held_elsewhere"];
    assert_eq!(held.as_array().unwrap().len(), 1, "{json:#}");
    assert_eq!(held[0]["experiment"], "jsa", "{json:#}");
    let waiting = json["waiting"].as_array().unwrap();
    assert_eq!(waiting.len(), 1, "{json:#}");
    assert_eq!(
        (
            &waiting[0]["experiment"],
            &waiting[0]["trial"],
            &waiting[0]["gpus"]
        ),
        (
            &serde_json::json!("jsb"),
            &serde_json::Value::Null,
            &serde_json::json!([0])
        ),
        "{json:#}"
    );
    let text = gpu(&[]);
    assert!(!text.contains("asked earlier"), "{text}");
    assert!(!text.contains("jsb trial"), "{text}");
    assert!(
        text.contains("waiting, first come first served: jsb's waiting trials (pid "),
        "{text}"
    );
    std::fs::write(code_dir.join("go-jsa"), "").unwrap();
    std::fs::write(code_dir.join("go-jsb"), "").unwrap();
    assert!(finish(holder).contains("1 trial (1 succeeded, 0 failed)"));
    assert!(finish(waiter).contains("1 trial (1 succeeded, 0 failed)"));
}

/// A reserve as large as the machine (or its GPU) admits no trial, whatever the trial asks:
/// `knob create` refuses it in one line naming the reserve to lower, as it refuses a
/// `trialMemorySize` above what the reserve leaves, instead of running an experiment whose
/// trials wait forever (H2 F2/F3, H3 F7).
#[test]
fn a_reserve_larger_than_the_machine_fails_at_create_naming_the_reserve() {
    let sandbox = Sandbox::new();
    let cases = [
        (
            "host",
            "memoryReserve: 100TiB\n",
            "(memoryReserve): lower memoryReserve below ",
        ),
        (
            "gpu",
            "trialGpuNumber: 1\ngpuMemoryReserve: 81GiB\n",
            "gpuMemoryReserve 81 GiB leave up to 0 B): lower gpuMemoryReserve below 80 GiB",
        ),
    ];
    for (id, limit, expected) in cases {
        let yaml = format!("trialCommand: echo KNOB_FINAL 1\ntrialConcurrency: 1\n{limit}{SPACE}");
        let config = sandbox.config(&yaml, &[]);
        let mut command = sandbox.create_command(&config, id);
        command.env("KNOB_SIMULATE_GPUS", "1x80GiB");
        let (code, stdout, stderr) = run(&mut command);
        assert_eq!(code, 1, "{id}: {stdout}\n{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{id}: {stderr}");
        assert!(
            stderr.contains("cannot place trials") && stderr.contains(expected),
            "{id}: {stderr}"
        );
        assert!(!sandbox.path().join("experiments").join(id).exists());
    }
}

/// Busy loops on every CPU, ended when dropped, and by themselves after 5 minutes in any case
/// (one process each, so that the kill reaches the loop: a loop under `timeout` outlived it).
struct BusyCpus(Vec<std::process::Child>);

impl BusyCpus {
    fn start() -> BusyCpus {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        BusyCpus(
            (0..cpus)
                .map(|_| {
                    std::process::Command::new("python3")
                        .args([
                            "-c",
                            "import time\nend = time.time() + 300\nwhile time.time() < end: pass",
                        ])
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
}

impl Drop for BusyCpus {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `maxCpuUtilization` holds trials while the host is busier (H2 F4, H3 F6): it used to be
/// judged on a probe with no CPU figure (the first sample has none), as if the host were idle,
/// so every trial started on a machine at 100%.
#[test]
fn max_cpu_utilization_holds_trials_on_a_busy_host_and_says_so() {
    let sandbox = Sandbox::new();
    let yaml = format!(
        "trialCommand: touch started-$NNI_TRIAL_JOB_ID\ntrialConcurrency: 1\nmaxTrialNumber: 2\n\
         maxCpuUtilization: 1\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[]);
    let code_dir = config.parent().unwrap().to_path_buf();
    let _busy = BusyCpus::start();
    let mut child = sandbox
        .create_command(&config, "cpu")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let row = wait_for(Duration::from_secs(60), "a trial waiting", || {
        let (code, stdout, _) = run(sandbox.knob().args(["trial", "ls", "cpu"]));
        (code == 0)
            .then(|| {
                stdout
                    .lines()
                    .find(|line| line.contains("WAITING") && line.contains("maxCpuUtilization"))
                    .map(str::to_owned)
            })
            .flatten()
    });
    let started = || {
        std::fs::read_dir(&code_dir)
            .unwrap()
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("started-"))
            .count()
    };
    assert!(
        row.contains("waiting to start: local: CPU at ") && row.contains("(maxCpuUtilization 1%)"),
        "{row}"
    );
    assert_eq!(started(), 0, "a trial started on a busy host: {row}");
    let (code, _, stderr) = run(sandbox.knob().args(["stop", "cpu"]));
    assert_eq!(code, 0, "{stderr}");
    wait_for(Duration::from_secs(60), "the experiment to end", || {
        child.try_wait().unwrap()
    });
    assert_eq!(started(), 0, "a trial started on a busy host");
}

#[test]
fn an_experiment_waiting_for_cpu_cores_is_served_before_the_holder_takes_them_again() {
    let sandbox = Sandbox::new();
    // Every core knob sees here, so that one trial of either experiment fills the machine.
    let (code, inventory, stderr) = run(sandbox.knob().args(["gpu", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    let inventory: serde_json::Value = serde_json::from_str(&inventory).unwrap();
    let cores = inventory["environments"][0]["host_resources"]["cpu_count"]
        .as_u64()
        .unwrap();
    let script = "echo \"$NNI_EXP_ID\" >> started\n\
                  for i in $(seq 1200); do [ -e release ] && break; sleep 0.05; done\n\
                  echo KNOB_FINAL 1\n";
    let yaml = format!(
        "trialCommand: bash trial.sh\ntrialConcurrency: 1\nmaxTrialNumber: 3\n\
         trialCpuNumber: {cores}\n{SPACE}"
    );
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let code_dir = config.parent().unwrap().to_path_buf();
    let first = start_experiment(&sandbox, &config, "first");
    wait_for(Duration::from_secs(60), "first's trial running", || {
        (started(&code_dir).len() == 1).then_some(())
    });
    let second = start_experiment(&sandbox, &config, "second");
    // second's trial waits in its scheduler and second stands in line for the cores.
    let waiting = wait_for(Duration::from_secs(60), "second in line for cores", || {
        let (_, stdout, _) = run(sandbox.knob().arg("gpu"));
        stdout
            .lines()
            .find(|line| line.contains("second's waiting trials") && line.contains("CPU core"))
            .map(str::to_owned)
    });
    assert!(
        waiting.starts_with("waiting, first come first served:"),
        "{waiting}"
    );
    // first's trial ends; its next trial must not take the cores ahead of second's.
    std::fs::write(code_dir.join("release"), "").unwrap();
    assert!(finish(first).contains("3 trials (3 succeeded, 0 failed)"));
    assert!(finish(second).contains("3 trials (3 succeeded, 0 failed)"));
    let order = started(&code_dir);
    assert_eq!(order.len(), 6, "{order:?}");
    assert_eq!(order[0], "first", "{order:?}");
    assert_eq!(
        order[1], "second",
        "second asked before first's next trial: {order:?}"
    );
}

/// A lease ledger knob cannot read (not one it wrote) hides only who holds the GPUs: `knob gpu`
/// still shows the machine, with one warning naming the file.
#[test]
fn knob_gpu_shows_the_machine_beside_a_ledger_it_cannot_read() {
    let sandbox = Sandbox::new();
    let home = sandbox.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("gpu-ledger.json"), "garbage{").unwrap();
    let (code, stdout, stderr) = run(sandbox
        .knob()
        .env("KNOB_SIMULATE_GPUS", "2x16GiB")
        .arg("gpu"));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("Simulated GPU (16 GiB)").count(),
        2,
        "{stdout}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr
            .starts_with("warning: cannot show which experiments hold the GPUs: GPU lease ledger ")
            && stderr.contains("gpu-ledger.json is not a ledger knob wrote"),
        "{stderr}"
    );
}
