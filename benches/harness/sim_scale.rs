//! The manager at cluster scale, in the simulator (`knob_core::sim`): 1 000, 10 000 and 100 000
//! trials over 1 000 environments of 8 GPUs (every GPU busy), the real manager, store and
//! gpu-sched on tokio's paused clock. Each size runs in a child process of its own, so that its
//! peak memory is its own.
//!
//! Per size it prints: CPU per trial until the run ended, before the checks: the manager's own
//! work (the polls of its future less the simulated service's side of each call: placing a
//! run's happenings in the world and building environment reports, which a real plugin does on
//! a thread of its own; the JSON of each call both ways stays in), of which its start (before
//! its loop began: registering the 1 000 environments, paid once an experiment) and its loop,
//! the polls of its future (with that side), the manager's thread (adding the simulated
//! world's deliveries and the driver's turns, which run on it too), and the whole process
//! (adding the store's writer and SQLite); the thread's with the checks (which read the whole
//! log back and replay it; what the bench reported before 2026-11-26), the store events of
//! each kind, peak resident memory (when the run ended, and with the checks), store
//! bytes and events per trial, the store's replay time, the longest batch of service events the
//! manager took at once (the event queue), loop turns, and one placement decision over the same
//! 1 000 × 8 inventory at full occupancy. Each size runs in each of [`ROUNDS`] rounds
//! (`KNOB_SIM_SCALE_ROUNDS`), every size once a round; then the medians of the rounds side by
//! side, and how far apart the dearest and the cheapest size are (the target: within 1.5×).
//!
//! `cargo bench -p knob-benches --bench sim_scale [-- SIZES...]` (default 1000 10000 100000;
//! release build; ≈ 5 minutes on the 2-CPU VM, the 100 000 runs most of it).

use std::process::Command;
use std::time::{Duration, Instant};

use knob_core::sim::{self, Scenario};

const ENVIRONMENTS: u32 = 1000;
const GPUS: u32 = 8;
/// How many times each size runs by default (`KNOB_SIM_SCALE_ROUNDS`): at load 0.5–3 one run
/// of the 10 000-trial size varied by a third within minutes on the 2-vCPU VM, enough alone to
/// move the sizes' ratio across the target; three rounds show the spread, and their medians
/// are steadier than any one run.
const ROUNDS: usize = 3;
/// Targets from issue 16.
const FLAT_WITHIN: f64 = 1.5;
const MEMORY_LIMIT_MIB: f64 = 1024.0;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if let Ok(size) = std::env::var("KNOB_SIM_SCALE_ONE") {
        let size = size.parse().expect("KNOB_SIM_SCALE_ONE is a trial count");
        one(size);
        return;
    }
    let sizes: Vec<u64> = if args.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        args.iter()
            .map(|a| a.parse().expect("sizes are trial counts"))
            .collect()
    };
    let rounds: usize = std::env::var("KNOB_SIM_SCALE_ROUNDS").map_or(ROUNDS, |rounds| {
        rounds
            .parse()
            .ok()
            .filter(|&r| r > 0)
            .expect("KNOB_SIM_SCALE_ROUNDS is a count of at least 1")
    });
    let me = std::env::current_exe().expect("the bench's own path");
    // Every size once a round, so that each size meets the same moments of a loaded machine.
    let mut runs: Vec<Vec<Vec<f64>>> = vec![Vec::new(); sizes.len()];
    for round in 1..=rounds {
        for (index, &size) in sizes.iter().enumerate() {
            println!("round {round} of {rounds}, {size} trials:");
            let output = Command::new(&me)
                .env("KNOB_SIM_SCALE_ONE", size.to_string())
                .output()
                .expect("the bench runs itself");
            let text = String::from_utf8_lossy(&output.stdout);
            eprint!("{}", String::from_utf8_lossy(&output.stderr));
            print!("{text}");
            if !output.status.success() {
                panic!("the run of {size} trials failed");
            }
            let row: Vec<f64> = text
                .lines()
                .find_map(|line| line.strip_prefix("ROW "))
                .expect("a result line")
                .split_whitespace()
                .map(|v| v.parse().expect("numbers"))
                .collect();
            runs[index].push(row);
        }
    }
    println!();
    for (size, runs) in sizes.iter().zip(&runs) {
        let each: Vec<String> = runs
            .iter()
            .map(|row| format!("{:.1} (meter {:.1})", row[12], row[14]))
            .collect();
        println!(
            "{size} trials: manager's own CPU in its loop µs a trial, each round (with the meter's own cost taken off it): {}",
            each.join(", ")
        );
    }
    let rows: Vec<(u64, Vec<f64>)> = sizes
        .iter()
        .zip(&runs)
        .map(|(&size, runs)| (size, median_row(runs)))
        .collect();
    println!();
    println!("Medians of the {rounds} rounds, each column on its own:");
    println!("| trials | manager's own CPU in its loop µs/trial | × first | its start ms | manager's own CPU µs/trial | × first | manager future's polls µs/trial | × first | loop thread CPU µs/trial | × first | process CPU µs/trial | thread µs/trial with checks | peak RSS MiB (run / with checks) | store bytes/trial | store events/trial | replay s | max event batch | placement µs/decision |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let first = |column: usize| rows.first().map_or(1.0, |(_, row)| row[column]);
    let mut peak: f64 = 0.0;
    for (size, row) in &rows {
        peak = peak.max(row[8]);
        println!(
            "| {size} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} / {:.0} | {:.0} | {:.1} | {:.2} | {:.0} | {:.1} |",
            row[12],
            row[12] / first(12),
            row[13],
            row[11],
            row[11] / first(11),
            row[10],
            row[10] / first(10),
            row[0],
            row[0] / first(0),
            row[1],
            row[9],
            row[8],
            row[2],
            row[3],
            row[4],
            row[5],
            row[6],
            row[7]
        );
    }
    println!();
    // Flat means every size against every other: the dearest trial against the cheapest.
    let spread = |column: usize| {
        let values = rows.iter().map(|(_, row)| row[column]);
        let (low, high) = values.fold((f64::INFINITY, 0.0_f64), |(low, high), v| {
            (low.min(v), high.max(v))
        });
        high / low
    };
    for (what, column) in [
        (
            "manager's own CPU in its loop (less its start over the environments, paid once)",
            12,
        ),
        (
            "manager's own CPU (its future's polls less the simulated service's side)",
            11,
        ),
        ("manager future's polls CPU", 10),
        (
            "loop thread CPU (with the simulated world and the driver)",
            0,
        ),
    ] {
        let spread = spread(column);
        println!(
            "{what} per trial: dearest size {spread:.2}x the cheapest (target: within {FLAT_WITHIN}x): {}",
            if spread <= FLAT_WITHIN { "met" } else { "MISSED" }
        );
    }
    println!(
        "the same for the manager's own CPU in its loop with the meter's own cost left in it (as before 2026-11-28): {:.2}x",
        {
            let with_meter: Vec<f64> = rows.iter().map(|(_, row)| row[12] + row[14]).collect();
            let high = with_meter.iter().copied().fold(0.0_f64, f64::max);
            let low = with_meter.iter().copied().fold(f64::INFINITY, f64::min);
            high / low
        }
    );
    println!(
        "peak memory of the runs: {peak:.0} MiB (target: under {MEMORY_LIMIT_MIB} MiB at 100 000): {}",
        if peak < MEMORY_LIMIT_MIB {
            "met"
        } else {
            "MISSED"
        }
    );
}

/// One size, in this process.
fn one(trials: u64) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let scenario = Scenario::large(1, trials, ENVIRONMENTS, GPUS);
    let (thread_before, process_before) = (thread_cpu(), process_cpu());
    let wall = Instant::now();
    let report = sim::run(&scenario, dir.path());
    let wall = wall.elapsed();
    let (thread_cpu, process_cpu) = (thread_cpu() - thread_before, process_cpu() - process_before);
    if !report.violations.is_empty() {
        eprintln!("violations:\n  {}", report.violations.join("\n  "));
        std::process::exit(1);
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / report.trials.max(1) as f64;
    // The run alone, before the checks (falls back to the whole when the clock cannot be read).
    let run_thread = report
        .run_thread_cpu
        .map_or(thread_cpu, |cpu| cpu.saturating_sub(thread_before));
    let manager = report.manager_cpu.unwrap_or(run_thread);
    let manager_own = manager.saturating_sub(report.service_cpu.unwrap_or_default());
    let manager_start = report.manager_start_cpu.unwrap_or_default();
    let manager_loop = manager_own.saturating_sub(manager_start);
    let run_process = report
        .run_process_cpu
        .map_or(process_cpu, |cpu| cpu.saturating_sub(process_before));
    let run_peak_mib = report
        .run_peak_rss
        .map_or(f64::NAN, |bytes| bytes as f64 / f64::from(1 << 20));
    let placement = placement_decision();
    println!(
        "{trials} trials: {} attempts, {:.1} simulated days in {:.1} s; manager thread {:.1} s CPU ({:.1} s with the checks), process {:.1} s ({:.1} s); peak {} MiB ({} MiB when the run ended, before the checks); store {} MiB, {} events; replay {:.2} s; {} loop turns; event batches up to {}; peak {} running",
        report.attempts,
        report.simulated.as_secs_f64() / 86_400.0,
        wall.as_secs_f64(),
        run_thread.as_secs_f64(),
        thread_cpu.as_secs_f64(),
        run_process.as_secs_f64(),
        process_cpu.as_secs_f64(),
        peak_rss_mib() as u64,
        run_peak_mib as u64,
        report.store_bytes / (1 << 20),
        report.store_events,
        report.replay_time.as_secs_f64(),
        report.loop_turns,
        report.max_event_batch,
        report.peak_running,
    );
    let kinds: Vec<String> = report
        .events_by_kind
        .iter()
        .map(|(kind, n)| format!("{kind} {:.2}", *n as f64 / report.trials.max(1) as f64))
        .collect();
    println!(
        "{trials} trials: store events a trial by kind: {}",
        kinds.join(", ")
    );
    let wakes = &report.wakes;
    let a_trial = |n: u64| n as f64 / report.trials.max(1) as f64;
    println!(
        "{trials} trials: loop turns a trial {:.2}, woken by service events {:.2}, deadlines {:.3} (re-probes {:.3}, maxTrialDuration {:.3}), commands {:.3}, refused starts {:.3}, tuner or assessor {:.3}; thread µs a turn {:.1}, manager µs a turn {:.1} (its own {:.1}, in its loop {:.1}); its start {:.0} ms",
        a_trial(report.loop_turns),
        a_trial(wakes.service_events),
        a_trial(wakes.deadlines),
        a_trial(wakes.reprobes),
        a_trial(wakes.overdue),
        a_trial(wakes.commands),
        a_trial(wakes.start_failures),
        a_trial(wakes.components),
        run_thread.as_secs_f64() * 1e6 / report.loop_turns.max(1) as f64,
        manager.as_secs_f64() * 1e6 / report.loop_turns.max(1) as f64,
        manager_own.as_secs_f64() * 1e6 / report.loop_turns.max(1) as f64,
        manager_loop.as_secs_f64() * 1e6 / report.loop_turns.max(1) as f64,
        manager_start.as_secs_f64() * 1e3,
    );
    println!(
        "{trials} trials: the meter: a pair of CPU clock reads {:.0} ns, {:.2} metered polls ({:.2} polls of the task the manager was not woken for, not passed on) and {:.2} service answers a trial, {:.1} µs a trial taken off the manager's CPU",
        report.meter_cost.unwrap_or_default().as_secs_f64() * 1e9,
        a_trial(report.metered_polls),
        a_trial(report.idle_polls),
        a_trial(report.service_answers),
        per(report.meter_overhead),
    );
    println!(
        "ROW {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}",
        per(run_thread),
        per(run_process),
        peak_rss_mib(),
        report.store_bytes as f64 / report.trials.max(1) as f64,
        report.store_events as f64 / report.trials.max(1) as f64,
        report.replay_time.as_secs_f64(),
        report.max_event_batch,
        placement.as_secs_f64() * 1e6,
        run_peak_mib,
        per(thread_cpu),
        per(manager),
        per(manager_own),
        per(manager_loop),
        manager_start.as_secs_f64() * 1e3,
        per(report.meter_overhead),
    );
}

/// One 1-GPU placement over 1 000 × 8 GPUs with one GPU left free (the manager's case at full
/// occupancy): the median of 201.
fn placement_decision() -> Duration {
    use knob_gpu_sched::{Policy, TrialRequest};
    let mut scheduler = knob_benches::gpu_sched::idle_scheduler(
        ENVIRONMENTS as usize,
        GPUS as usize,
        Policy::default(),
    );
    let total = ENVIRONMENTS * GPUS;
    for n in 0..total - 1 {
        assert!(scheduler
            .place(&TrialRequest::new(format!("busy{n}")))
            .is_succeed());
    }
    let mut times: Vec<Duration> = (0..201)
        .map(|n| {
            let request = TrialRequest::new(format!("probe{n}"));
            let started = Instant::now();
            let placed = scheduler.place(&request);
            let took = started.elapsed();
            assert!(placed.is_succeed());
            scheduler.release(&request.trial);
            took
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn thread_cpu() -> Duration {
    cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn process_cpu() -> Duration {
    cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn cpu_clock(clock: libc::clockid_t) -> Duration {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(clock, &mut time) };
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

/// The process's peak resident set (`VmHWM`), in MiB.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<f64>()
                        .ok()
                })
        })
        .map(|kib| kib / 1024.0)
        .unwrap_or(f64::NAN)
}

/// The median of each column over runs of one size.
fn median_row(runs: &[Vec<f64>]) -> Vec<f64> {
    let columns = runs.iter().map(Vec::len).min().unwrap_or(0);
    (0..columns)
        .map(|column| {
            let mut values: Vec<f64> = runs.iter().map(|row| row[column]).collect();
            values.sort_by(f64::total_cmp);
            let middle = values.len() / 2;
            if values.len() % 2 == 1 {
                values[middle]
            } else {
                (values[middle - 1] + values[middle]) / 2.0
            }
        })
        .collect()
}
