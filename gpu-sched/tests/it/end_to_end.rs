//! A trial loop the way the core runs one: a simulated 4-GPU machine, 12 real trial processes
//! needing 1 or 2 GPUs, at most 6 submitted at once. Each trial records what it saw; the checks
//! read only those records.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use knob_gpu_sched::{Placement, Policy, Scheduler, SchedulerConfig, TrialId, TrialRequest};

use crate::support::{scheduler_with, simulated};

const TRIALS: usize = 12;
const CONCURRENCY: usize = 6;

/// Records start time, the devices it sees and end time, each from the trial's own clock reads.
const TRIAL_SCRIPT: &str = r#"
record="$RECORD_DIR/$TRIAL.record"
printf 'start %s\n' "$(date +%s%N)" > "$record.tmp"
printf 'visible %s\n' "${CUDA_VISIBLE_DEVICES-unset}" >> "$record.tmp"
printf 'order %s\n' "${CUDA_DEVICE_ORDER-unset}" >> "$record.tmp"
sleep "$TRIAL_SECONDS"
printf 'end %s\n' "$(date +%s%N)" >> "$record.tmp"
mv "$record.tmp" "$record"
"#;

struct Record {
    start: u128,
    end: u128,
    visible: String,
    order: String,
}

fn read_record(path: &Path) -> Record {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{} has no {name}: {text}", path.display()))
            .to_owned()
    };
    Record {
        start: field("start").parse().unwrap(),
        end: field("end").parse().unwrap(),
        visible: field("visible"),
        order: field("order"),
    }
}

fn start(trial: &TrialId, scheduler: &Scheduler, records: &Path, seconds: &str) -> Child {
    let assignment = scheduler
        .assignment(trial)
        .expect("placed trial has an assignment");
    let mut command = Command::new("sh");
    command
        .args(["-c", TRIAL_SCRIPT])
        .env("TRIAL", trial.as_str())
        .env("RECORD_DIR", records)
        .env("TRIAL_SECONDS", seconds)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("CUDA_DEVICE_ORDER")
        .envs(assignment.cuda_environment())
        .process_group(0);
    command.spawn().expect("sh runs")
}

#[test]
fn twelve_trials_on_four_simulated_gpus_never_share_a_gpu() {
    let records = std::env::temp_dir().join(format!("knob-gpu-sched-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&records).unwrap();
    let config = SchedulerConfig {
        trial_gpu_number: Some(1),
        policy: Policy::RecentlyIdle,
        ..SchedulerConfig::default()
    };
    let mut scheduler = scheduler_with(config, simulated("4x80GiB"));
    let mut pending: Vec<TrialRequest> = (0..TRIALS)
        .map(|n| {
            let request = TrialRequest::new(format!("trial{n:02}"));
            if n % 3 == 0 {
                request.gpu_number(2)
            } else {
                request
            }
        })
        .collect();
    pending.reverse();
    let mut waiting: Vec<TrialRequest> = Vec::new();
    let mut running: Vec<(TrialId, Child)> = Vec::new();
    let mut assigned: BTreeMap<TrialId, String> = BTreeMap::new();
    let mut finished = 0;
    let deadline = Instant::now() + Duration::from_secs(60);

    while finished < TRIALS {
        assert!(Instant::now() < deadline, "trials did not finish in time");
        // Submit up to the concurrency limit (running plus waiting), like trialConcurrency.
        while running.len() + waiting.len() < CONCURRENCY {
            match pending.pop() {
                Some(request) => waiting.push(request),
                None => break,
            }
        }
        let placements = scheduler.place_queue(&waiting);
        let mut still_waiting = Vec::new();
        for (request, placement) in waiting.drain(..).zip(placements) {
            match placement {
                Placement::Succeed { .. } => {
                    let assignment = scheduler.assignment(&request.trial).unwrap();
                    assigned.insert(
                        request.trial.clone(),
                        assignment.cuda_visible_devices().unwrap(),
                    );
                    let child = start(&request.trial, &scheduler, &records, "0.15");
                    running.push((request.trial, child));
                }
                Placement::TmpNoAvailableGpu { .. } => still_waiting.push(request),
                Placement::RequireExceedTotal { reason } => panic!("{}: {reason}", request.trial),
            }
        }
        waiting = still_waiting;
        // Release GPUs the moment a trial's process is gone, then decide again at once.
        loop {
            let mut ended = None;
            for (position, (_, child)) in running.iter_mut().enumerate() {
                if let Some(status) = child.try_wait().unwrap() {
                    assert!(status.success(), "trial exited with {status}");
                    ended = Some(position);
                    break;
                }
            }
            match ended {
                Some(position) => {
                    let (trial, _) = running.remove(position);
                    scheduler.release(&trial).expect("running trial held GPUs");
                    finished += 1;
                    break;
                }
                None if running.is_empty() => break,
                None => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
    assert!(
        scheduler.assignments().next().is_none(),
        "every GPU released"
    );

    let records_by_trial: BTreeMap<TrialId, Record> = assigned
        .keys()
        .map(|trial| {
            (
                trial.clone(),
                read_record(&records.join(format!("{trial}.record"))),
            )
        })
        .collect();
    std::fs::remove_dir_all(&records).unwrap();
    assert_eq!(
        records_by_trial.len(),
        TRIALS,
        "every trial ran and recorded"
    );

    for (trial, record) in &records_by_trial {
        assert_eq!(
            record.visible, assigned[trial],
            "{trial} saw other devices than assigned"
        );
        assert_eq!(record.order, "PCI_BUS_ID");
        let wanted = if trial.as_str()[5..].parse::<usize>().unwrap() % 3 == 0 {
            2
        } else {
            1
        };
        assert_eq!(
            record.visible.split(',').count(),
            wanted,
            "{trial}: {}",
            record.visible
        );
    }
    // No GPU ever over-assigned: trials that saw a common device never ran at the same time.
    let trials: Vec<(&TrialId, &Record)> = records_by_trial.iter().collect();
    let mut overlapping_pairs = 0;
    for (i, (first, a)) in trials.iter().enumerate() {
        for (second, b) in &trials[i + 1..] {
            let concurrent = a.start < b.end && b.start < a.end;
            if concurrent {
                overlapping_pairs += 1;
            }
            let shared: Vec<&str> = a
                .visible
                .split(',')
                .filter(|device| b.visible.split(',').any(|other| other == *device))
                .collect();
            assert!(
                !concurrent || shared.is_empty(),
                "{first} and {second} both ran on GPU {shared:?} at the same time"
            );
        }
    }
    // The check above means something only if trials did run side by side.
    assert!(overlapping_pairs > 0, "trials never ran concurrently");
}
