//! Store throughput: metrics written per second with every crash-safety guarantee on (WAL,
//! `synchronous=NORMAL`, each metric acknowledged only once committed). Target (issue 9):
//! ≥ 20 000 metrics/s.
//!
//! - `pipelined/4 senders x 2500`: 4 threads each append 2 500 metrics and then wait for all
//!   their acks, as a manager forwarding metrics from many trials does. This is the number to
//!   hold against the target.
//! - `lockstep/N senders x 40`: N threads each wait for one ack before sending the next metric,
//!   so a commit holds at most N metrics: bound by fsync latency (N trials each waiting on
//!   their metric PUT).
//! - `lockstep/1 senders` is the baseline: one transaction, one fsync per metric, what a store
//!   without group commit costs. The ratio to it is printed.
//!
//! Run: `cargo bench -p knob-benches --bench store_metrics` (well under a minute).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use knob_core::store::{MetricKind, Store, StoreEvent, StoreHandle};
use serde_json::json;

/// One bench's total metrics and time, for the metrics/s line.
static TOTALS: Mutex<Vec<(String, u64, Duration)>> = Mutex::new(Vec::new());

struct Experiment {
    _dir: tempfile::TempDir,
    store: Store,
    trials: u64,
}

impl Experiment {
    fn new() -> Experiment {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path()).expect("open store");
        let created = StoreEvent::ExperimentCreated {
            experiment_id: "bench".to_string(),
            config: json!({"trialConcurrency": 4}),
            start_time_ms: 0,
        };
        store.append(created).wait().expect("create experiment");
        Experiment {
            _dir: dir,
            store,
            trials: 0,
        }
    }

    /// A new running trial, so each iteration's metrics are fresh (not duplicates).
    fn running_trial(&mut self) -> String {
        let trial_id = format!("trial{}", self.trials);
        let created = StoreEvent::TrialCreated {
            trial_id: trial_id.clone(),
            sequence: self.trials,
            parameter_id: self.trials,
            parameter_label: None,
            parameters: json!({"lr": 0.1}),
            lineage: None,
        };
        let started = StoreEvent::TrialStarted {
            trial_id: trial_id.clone(),
            attempt: 1,
            environment_id: "local".to_string(),
            gpu_indices: vec![],
            pid: None,
        };
        self.trials += 1;
        self.store.append(created).wait().expect("create trial");
        self.store.append(started).wait().expect("start trial");
        trial_id
    }
}

fn metric(trial_id: &str, trial_sequence: u64) -> StoreEvent {
    let value = 1.0 / (trial_sequence + 1) as f64;
    StoreEvent::Metric {
        trial_id: trial_id.to_string(),
        attempt: 1,
        kind: MetricKind::Intermediate,
        trial_sequence,
        raw: format!("{{\"default\": {value}, \"step\": {trial_sequence}}}"),
        value: Some(value),
    }
}

/// `senders` threads send `per_sender` metrics each; `lockstep` waits for each ack before the
/// next send, otherwise all acks are awaited at the end. Returns when every ack has arrived.
fn send(store: &StoreHandle, trial_id: &str, senders: u64, per_sender: u64, lockstep: bool) {
    std::thread::scope(|scope| {
        for sender in 0..senders {
            scope.spawn(move || {
                let sequences = (0..per_sender).map(|i| sender * per_sender + i);
                if lockstep {
                    for sequence in sequences {
                        store
                            .append(metric(trial_id, sequence))
                            .wait()
                            .expect("ack");
                    }
                } else {
                    let acks: Vec<_> = sequences
                        .map(|sequence| store.append(metric(trial_id, sequence)))
                        .collect();
                    for ack in acks {
                        ack.wait().expect("ack");
                    }
                }
            });
        }
    });
}

fn bench_scenario(c: &mut Criterion, mode: &str, senders: u64, per_sender: u64) {
    let lockstep = mode == "lockstep";
    let metrics = senders * per_sender;
    let mut group = c.benchmark_group(format!("store_metrics/{mode}"));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(metrics));
    let mut experiment = Experiment::new();
    let label = format!("{senders} senders x {per_sender}");
    group.bench_function(BenchmarkId::from_parameter(&label), |b| {
        b.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                let trial_id = experiment.running_trial();
                let handle = experiment.store.handle();
                let start = Instant::now();
                send(&handle, &trial_id, senders, per_sender, lockstep);
                total += start.elapsed();
            }
            TOTALS.lock().expect("totals").push((
                format!("{mode}/{label}"),
                metrics * iterations,
                total,
            ));
            total
        })
    });
    group.finish();
}

fn store_metrics(c: &mut Criterion) {
    bench_scenario(c, "pipelined", 4, 2_500);
    bench_scenario(c, "lockstep", 64, 40);
    bench_scenario(c, "lockstep", 4, 40);
    bench_scenario(c, "lockstep", 1, 40);

    // Criterion's warm-up calls land here too; the rates below cover every call.
    let totals = TOTALS.lock().expect("totals");
    let mut sums: Vec<(String, u64, Duration)> = Vec::new();
    for (name, metrics, time) in totals.iter() {
        match sums.iter_mut().find(|(n, _, _)| n == name) {
            Some(sum) => {
                sum.1 += metrics;
                sum.2 += *time;
            }
            None => sums.push((name.clone(), *metrics, *time)),
        }
    }
    let rates: Vec<(String, f64)> = sums
        .into_iter()
        .map(|(name, metrics, time)| (name, metrics as f64 / time.as_secs_f64()))
        .collect();
    let baseline = rates
        .iter()
        .find(|(name, _)| name.starts_with("lockstep/1 "))
        .map(|(_, rate)| *rate);
    println!("\nstore_metrics, acks on, WAL + synchronous=NORMAL:");
    for (name, rate) in &rates {
        let ratio = baseline.map_or(String::new(), |b| {
            format!("  ({:.1}x one-commit-per-metric)", rate / b)
        });
        println!("  {name:<28} {rate:>10.0} metrics/s{ratio}");
    }
}

criterion_group!(benches, store_metrics);
criterion_main!(benches);
