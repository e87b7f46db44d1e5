//! The cost of the plugin ABI: one `generate_parameters` call of the built-in `Random` tuner
//!
//! - `abi_call/rlib`: called directly through `knob-tuners` as a Rust library (the baseline);
//! - `abi_call/abi`: through the ABI on the calling thread (`PluginRegistry::tuner_object`),
//!   parameters crossing as JSON text and parsed back on the host side;
//! - `abi_call/threaded`: through the handle the core uses (`PluginRegistry::tuner`), the call
//!   sent to the tuner's own thread and the answer awaited with `wait()`;
//! - `abi_call/json_round_trip`: the part of the ABI cost that is by design, the parameters
//!   written as JSON text and parsed back, timed alone.
//!
//! Then the three are timed again side by side, in alternating rounds, and the ratio and the
//! added time per call are printed against the target: the ABI adds < 2 µs a call (issue 2).
//!
//! Run: `cargo build --release -p knob-tuners && cargo bench -p knob-benches --bench abi_call`
//! (about 20 s). The bench loads `libknob_tuners.so` from the target directory it runs from.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use knob_benches::harness::plugin_path;
use knob_plugin_api::host::{PluginRegistry, TunerHandle, TunerObject};
use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{Generated, Tuner};
use knob_tuners::RandomTuner;
use serde_json::{json, Value};

/// The target of issue 2: what the ABI may add to one call.
const TARGET_ADDED: Duration = Duration::from_micros(2);

/// `Random` remembers every point it handed out (to never repeat one), so each call costs a
/// little more than the last; a fresh tuner every this many calls keeps the cost per call the
/// same however many iterations criterion asks for, and the same for the three forms.
const FRESH_EVERY: u64 = 1024;

/// Calls per round and rounds in the side-by-side summary.
const SUMMARY_CALLS: u64 = 20_000;
const SUMMARY_ROUNDS: usize = 7;

/// Five continuous parameters: `Random` never repeats a point, so it never falls back to its
/// grid walk or runs out, and every call costs the same.
fn search_space() -> Value {
    json!({
        "learning_rate": {"_type": "loguniform", "_value": [1e-6, 1.0]},
        "momentum": {"_type": "uniform", "_value": [0.0, 1.0]},
        "dropout": {"_type": "uniform", "_value": [0.0, 0.9]},
        "weight_decay": {"_type": "loguniform", "_value": [1e-9, 1e-2]},
        "warmup_steps": {"_type": "uniform", "_value": [0.0, 100000.0]},
    })
}

fn class_args() -> Value {
    json!({"seed": 20240601})
}

/// Builds each of the three forms, ready to generate (search space set).
struct Forms {
    registry: PluginRegistry,
    space: SearchSpace,
}

impl Forms {
    fn new() -> Forms {
        let path = plugin_path();
        let registry = PluginRegistry::load_from(std::slice::from_ref(&path));
        if let Some(problem) = registry.problems().first() {
            panic!("loading {}: {problem}", path.display());
        }
        let space = SearchSpace::from_value(&search_space()).expect("valid search space");
        Forms { registry, space }
    }

    fn rlib(&self) -> RandomTuner {
        let mut tuner = RandomTuner::new(&class_args()).expect("Random from the rlib");
        tuner.update_search_space(&self.space).expect("space");
        tuner
    }

    fn abi(&self) -> TunerObject {
        let mut tuner = self
            .registry
            .tuner_object("Random", &class_args())
            .expect("Random through the ABI");
        tuner.update_search_space(&search_space()).expect("space");
        tuner
    }

    fn threaded(&self) -> TunerHandle {
        let tuner = self
            .registry
            .tuner("Random", &class_args())
            .expect("Random on its thread");
        tuner
            .update_search_space(search_space())
            .wait()
            .expect("space");
        tuner
    }
}

/// Times `calls` calls of `call`, on a fresh tuner from `make` every [`FRESH_EVERY`] calls (the
/// clock stopped while it is built).
fn timed<T>(calls: u64, make: impl Fn() -> T, call: impl Fn(&mut T, u64) -> Generated) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < calls {
        let chunk = (calls - done).min(FRESH_EVERY);
        let mut tuner = make();
        let start = Instant::now();
        for id in done..done + chunk {
            let generated = call(&mut tuner, id);
            debug_assert!(matches!(generated, Generated::Parameters(_)));
            black_box(generated);
        }
        total += start.elapsed();
        done += chunk;
    }
    total
}

fn time_rlib(forms: &Forms, calls: u64) -> Duration {
    timed(
        calls,
        || forms.rlib(),
        |tuner, id| tuner.generate_parameters(id).expect("rlib call"),
    )
}

fn time_abi(forms: &Forms, calls: u64) -> Duration {
    timed(
        calls,
        || forms.abi(),
        |tuner, id| tuner.generate_parameters(id).expect("ABI call"),
    )
}

fn time_threaded(forms: &Forms, calls: u64) -> Duration {
    timed(
        calls,
        || forms.threaded(),
        |tuner, id| tuner.generate_parameters(id).wait().expect("threaded call"),
    )
}

/// What the ABI adds by design: the parameters written as JSON text in the plugin and parsed
/// back in the host. Timed alone, to tell it apart from the cost of crossing itself.
fn time_json_round_trip(forms: &Forms, calls: u64) -> Duration {
    let mut tuner = forms.rlib();
    let Ok(Generated::Parameters(parameters)) = tuner.generate_parameters(0) else {
        panic!("Random gave no parameters");
    };
    let start = Instant::now();
    for _ in 0..calls {
        let text = black_box(&parameters).to_string();
        let back: Value = serde_json::from_str(&text).expect("JSON reads back");
        black_box(back);
    }
    start.elapsed()
}

type Timer = fn(&Forms, u64) -> Duration;

const FORMS: [(&str, Timer); 4] = [
    ("rlib", time_rlib),
    ("abi", time_abi),
    ("threaded", time_threaded),
    ("json_round_trip", time_json_round_trip),
];

fn criterion_benches(c: &mut Criterion, forms: &Forms) {
    let mut group = c.benchmark_group("abi_call");
    group
        .sample_size(50)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for (name, timer) in FORMS {
        group.bench_function(name, |b| b.iter_custom(|iters| timer(forms, iters)));
    }
    group.finish();
}

/// Time per call of each form over alternating rounds, so drift hits all three alike: the
/// median and the best round (the machine is shared; interference only ever adds time).
fn side_by_side(forms: &Forms) -> [(Duration, Duration); 4] {
    let mut rounds: [Vec<Duration>; 4] = Default::default();
    for _ in 0..SUMMARY_ROUNDS {
        for (i, (_, timer)) in FORMS.iter().enumerate() {
            rounds[i].push(timer(forms, SUMMARY_CALLS) / SUMMARY_CALLS as u32);
        }
    }
    rounds.map(|mut per_call| {
        per_call.sort();
        (per_call[per_call.len() / 2], per_call[0])
    })
}

fn ns(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9
}

fn report(per_call: [(Duration, Duration); 4]) {
    let target = ns(TARGET_ADDED);
    println!();
    println!(
        "abi_call: {SUMMARY_ROUNDS} alternating rounds of {SUMMARY_CALLS} calls each; median (best round)"
    );
    let [rlib, abi, threaded, json] = per_call.map(|(median, best)| (ns(median), ns(best)));
    println!("  rlib      {:>6.0} ns/call ({:.0})", rlib.0, rlib.1);
    for (name, (median, best), what) in [
        ("abi", abi, "the ABI crossing"),
        (
            "threaded",
            threaded,
            "the ABI crossing and the hop to the tuner's thread and back",
        ),
    ] {
        let added = (median - rlib.0, best - rlib.1);
        let verdict = if added.0 < target { "within" } else { "OVER" };
        println!(
            "  {name:<9} {median:>6.0} ns/call ({best:.0}) = {:.2}x ({:.2}x) rlib, {:+.0} ns ({:+.0}) a call: {what}; {verdict} the target",
            median / rlib.0,
            best / rlib.1,
            added.0,
            added.1,
        );
    }
    println!(
        "  of which the JSON round trip of the parameters alone (to_string + from_str): {:.0} ns ({:.0})",
        json.0, json.1
    );
    println!("  target: the ABI adds < 2 µs a call (issue 2)");
}

fn main() {
    let forms = Forms::new();
    let mut criterion = Criterion::default().configure_from_args();
    criterion_benches(&mut criterion, &forms);
    criterion.final_summary();
    // `cargo test --benches` runs each bench once to check it works; the summary is for
    // `cargo bench` only.
    if std::env::args().any(|a| a == "--bench") {
        report(side_by_side(&forms));
    }
}
