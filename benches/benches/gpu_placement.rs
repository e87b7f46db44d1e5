//! Placement cost: one decision against 1 to 1000 environments of 8 GPUs, and draining waiting
//! queues of 10 to 10 000 trials. Target: one decision over 1000 x 8 GPUs under 20 µs.
//!
//! Run: `cargo bench -p knob-benches --bench gpu_placement` (about a minute).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use knob_benches::gpu_sched::{half_busy_scheduler, idle_scheduler, mixed_queue};
use knob_gpu_sched::{Placement, Policy, TrialId, TrialRequest};

const ENVIRONMENT_COUNTS: [usize; 4] = [1, 10, 100, 1000];
const GPUS_PER_ENVIRONMENT: usize = 8;

/// Place one 1-GPU trial and release it again, so every iteration sees the same inventory.
fn one_decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("place_one");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1200));
    let request = TrialRequest::new("bench");
    let trial = TrialId::from("bench");
    for policy in Policy::ALL {
        for envs in ENVIRONMENT_COUNTS {
            let mut scheduler = half_busy_scheduler(envs, GPUS_PER_ENVIRONMENT, policy);
            let id = BenchmarkId::new(policy.name(), format!("{envs}x{GPUS_PER_ENVIRONMENT}"));
            group.bench_function(id, |b| {
                b.iter(|| {
                    let placement = scheduler.place(&request);
                    debug_assert!(placement.is_succeed());
                    scheduler.release(&trial);
                    placement
                })
            });
        }
    }
    group.finish();
}

/// A request that cannot be placed now: the full scan, the hold and the one-line reason.
fn one_refusal(c: &mut Criterion) {
    let mut group = c.benchmark_group("wait_one");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1200));
    let request = TrialRequest::new("whole-machine").gpu_number(GPUS_PER_ENVIRONMENT as u32);
    for envs in ENVIRONMENT_COUNTS {
        let mut scheduler = half_busy_scheduler(envs, GPUS_PER_ENVIRONMENT, Policy::Pack);
        group.bench_function(format!("{envs}x{GPUS_PER_ENVIRONMENT}"), |b| {
            b.iter(|| {
                let placement = scheduler.place(&request);
                debug_assert!(matches!(placement, Placement::TmpNoAvailableGpu { .. }));
                placement
            })
        });
    }
    group.finish();
}

/// One pass over a waiting queue on 1000 idle environments of 8 GPUs: 10 and 1000 trials all
/// fit, 10 000 (about 13 300 GPUs asked) overflow, so the tail waits with reasons.
///
/// Only `place_queue` is timed. Between passes the placed trials are released again (untimed)
/// rather than the scheduler cloned, because a clone costs more than a short pass and criterion
/// would spend minutes on untimed setup. The state returns to the same loads; round-robin's
/// cursor and recently-idle's release ticks move on, as they do in a running experiment.
fn drain_queue(c: &mut Criterion) {
    let mut group = c.benchmark_group("drain");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for policy in [Policy::RecentlyIdle, Policy::Pack] {
        let scheduler = idle_scheduler(1000, GPUS_PER_ENVIRONMENT, policy);
        for len in [10, 1_000, 10_000] {
            let queue = mixed_queue(len);
            group.bench_function(BenchmarkId::new(policy.name(), len), |b| {
                b.iter_custom(|iterations| {
                    let mut scheduler = scheduler.clone();
                    let mut timed = Duration::ZERO;
                    for _ in 0..iterations {
                        let started = Instant::now();
                        let placements = black_box(scheduler.place_queue(&queue));
                        timed += started.elapsed();
                        for (request, placement) in queue.iter().zip(&placements) {
                            if placement.is_succeed() {
                                scheduler.release(&request.trial);
                            }
                        }
                    }
                    timed
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, one_decision, one_refusal, drain_queue);
criterion_main!(benches);
