//! Dashboard load check: an experiment store with 10 000 trials and 200 000 intermediate results
//! (built through the store's own API), served by the real `knob view --port`, measured as a
//! user meets it: the API's first trial page, the requests the dashboard's first paint needs,
//! and the first paint itself in headless Chromium over WebDriver, with the bytes transferred.
//! The first paint is the first frame that holds the overview and the trial table's first rows
//! (the page's `__knobFirstPaint`; the harness prints how many rows that frame held); the
//! charts drawn after it are timed too (`__knobChartsDrawn`; a build that drew them in the
//! first paint's frame counts that frame).
//! Baseline, in the same run: what the dashboard used to download before its first paint (every
//! trial and every metric of the experiment).
//!
//! Run: `cargo build --release -p knob-cli && cargo bench -p knob-benches --bench dashboard_load`
//! Environment: `KNOB_BIN` (default `target/release/knob`), `KNOB_BENCH_CHROMIUM` and
//! `KNOB_BENCH_CHROMEDRIVER` (default `/usr/bin/chromium`, `/usr/bin/chromedriver`; without them
//! the browser part is skipped with a note), `KNOB_BENCH_LOADS` (page loads per binary, default
//! 3). `KNOB_BENCH_BEFORE_BIN` names a second knob binary (an older build): it serves the same
//! store too, and the page loads alternate between the two, so that both meet the same load on
//! the machine; the medians and their ratio are printed. Targets: the first trial page under
//! 100 ms, the first paint under 1 s.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use knob_core::registry::{Registry, RegistryEntry};
use knob_core::store::{MetricKind, Store, StoreEvent, TrialStatus};
use serde_json::{json, Value};

const TRIALS: u64 = 10_000;
const INTERMEDIATE_PER_TRIAL: u64 = 20;
const REPETITIONS: usize = 5;
const PAGE_LOADS: usize = 3;
/// The first paint's target (issue 16: under 1 s at 10 000 trials).
const FIRST_PAINT_TARGET_MS: f64 = 1000.0;
const PATIENCE: Duration = Duration::from_secs(120);

fn main() {
    // `cargo bench` passes `--bench`; any other argument is a criterion-style filter we ignore.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let knob = std::env::var_os("KNOB_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target/release/knob"));
    if !knob.is_file() {
        eprintln!(
            "error: {} is missing: build it first with `cargo build --release -p knob-cli` \
             (or point KNOB_BIN at a knob binary)",
            knob.display()
        );
        std::process::exit(2);
    }
    // KNOB_BENCH_STORE keeps the store (and its KNOB_HOME) in a folder of one's choosing and
    // reuses it on the next run, to serve it by hand (`KNOB_HOME=DIR/home knob view load`) while
    // profiling the page.
    let scratch = tempfile::tempdir().unwrap();
    let kept = std::env::var_os("KNOB_BENCH_STORE").map(PathBuf::from);
    let root = kept.as_deref().unwrap_or(scratch.path());
    let home = root.join("home");
    let dir = root.join("experiments/load");
    let database = dir.join(knob_core::store::DB_FILE_NAME);

    let started = Instant::now();
    if kept.is_some() && database.is_file() {
        println!("store: reusing {}", dir.display());
    } else {
        build_store(&dir);
        println!(
            "store: {TRIALS} trials, {} intermediate results, built in {:.1} s ({} MB)",
            TRIALS * INTERMEDIATE_PER_TRIAL,
            started.elapsed().as_secs_f64(),
            std::fs::metadata(&database).map_or(0, |m| m.len()) / 1_000_000
        );
    }
    Registry::open(&home.join("registry.db"))
        .unwrap()
        .insert(&RegistryEntry {
            id: "load".to_string(),
            name: None,
            dir: dir.clone(),
            status: "DONE".to_string(),
            pid: None,
            pid_start: None,
            port: None,
            api_host: None,
            created_ms: 0,
        })
        .unwrap();
    let view = View::start(&knob, &home);
    let base = view.base.clone();
    println!(
        "served by: {} view load --port 0 at {base}/",
        knob.display()
    );
    let before = std::env::var_os("KNOB_BENCH_BEFORE_BIN").map(PathBuf::from);
    let before_view = before.as_ref().map(|bin| {
        let view = View::start(bin, &home);
        println!(
            "and by (before): {} view load --port 0 at {}/",
            bin.display(),
            view.base
        );
        view
    });
    println!("load average at the start: {}\n", load_average());

    println!("API (uncompressed, median of {REPETITIONS}):");
    let first_page = measure(&base, "/api/v1/trials?limit=100");
    report("first trial page, 100 trials", &first_page, Some(0.1));
    let experiment = measure(&base, "/api/v1/experiment");
    report("experiment summary", &experiment, None);
    let first_columns = measure(&base, "/api/v1/trial-columns?offset=0&limit=50");
    report(
        "the table's first 50 rows as columns (/trial-columns)",
        &first_columns,
        None,
    );
    let all_trials = measure(&base, "/api/v1/trials?offset=0&limit=10000");
    report("every trial as objects (/trials)", &all_trials, None);
    let columns = measure(&base, "/api/v1/trial-columns?offset=0&limit=10000");
    report(
        "every trial as columns (/trial-columns, the dashboard's)",
        &columns,
        None,
    );
    let latest: Vec<String> = (TRIALS - 50..TRIALS).map(trial_id).collect();
    let curves = measure(
        &base,
        &format!(
            "/api/v1/metrics?trial_ids={}&kind=intermediate&since=0&limit=10000",
            latest.join(",")
        ),
    );
    report(
        "intermediate results of the 50 latest trials",
        &curves,
        None,
    );
    // The first paint (the overview and the table's first rows) needs the summary and the
    // list's first page; the charts drawn after it need the whole list and the latest curves.
    let first_paint_api = Timing {
        seconds: experiment.seconds + first_columns.seconds,
        bytes: experiment.bytes + first_columns.bytes,
    };
    report("first paint's requests, together", &first_paint_api, None);
    let charts_api = Timing {
        seconds: experiment.seconds + columns.seconds + curves.seconds,
        bytes: experiment.bytes + columns.bytes + curves.bytes,
    };
    report("the charts' requests, together", &charts_api, None);
    let old = old_snapshot(&base);
    report(
        "baseline: every trial and every metric (the old first paint)",
        &old,
        None,
    );
    println!(
        "  first paint's requests / baseline: {:.3}× the time, {:.3}× the bytes",
        first_paint_api.seconds / old.seconds,
        first_paint_api.bytes as f64 / old.bytes as f64
    );
    println!(
        "  the charts' requests / baseline: {:.3}× the time, {:.3}× the bytes\n",
        charts_api.seconds / old.seconds,
        charts_api.bytes as f64 / old.bytes as f64
    );

    let chromium = std::env::var("KNOB_BENCH_CHROMIUM").unwrap_or("/usr/bin/chromium".into());
    let chromedriver =
        std::env::var("KNOB_BENCH_CHROMEDRIVER").unwrap_or("/usr/bin/chromedriver".into());
    if !Path::new(&chromium).is_file() || !Path::new(&chromedriver).is_file() {
        println!(
            "browser: skipped ({chromium} or {chromedriver} is missing; apt-get install chromium \
             chromium-driver, or set KNOB_BENCH_CHROMIUM / KNOB_BENCH_CHROMEDRIVER)"
        );
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut servers = vec![("after", base.clone())];
    if let Some(view) = &before_view {
        servers.insert(0, ("before", view.base.clone()));
    }
    let loads = std::env::var("KNOB_BENCH_LOADS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(PAGE_LOADS)
        .clamp(1, 50);
    runtime.block_on(browser(&servers, loads, &chromium, &chromedriver));
    println!("load average at the end: {}", load_average());
}

/// `/proc/loadavg`'s three averages, or why not.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |e| format!("unknown ({e})"),
        |text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        },
    )
}

fn trial_id(sequence: u64) -> String {
    format!("t{sequence:05}")
}

/// Every event goes through `Store::append_unacked` and one final flush: the writer's group
/// commit makes this a few seconds.
fn build_store(dir: &Path) {
    let store = Store::open(dir).unwrap();
    store.append_unacked(StoreEvent::ExperimentCreated {
        experiment_id: "load".to_string(),
        config: json!({
            "trialConcurrency": 8,
            "maxTrialNumber": TRIALS,
            "trialCommand": "python3 train.py",
            "searchSpace": {
                "lr": {"_type": "loguniform", "_value": [1e-5, 0.1]},
                "batch": {"_type": "choice", "_value": [16, 32, 64, 128]},
                "dropout": {"_type": "uniform", "_value": [0.0, 0.5]},
                "optimizer": {"_type": "choice", "_value": ["adam", "sgd", "rmsprop"]},
            },
            "tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximize"}},
            "trainingService": {"platform": "local"},
        }),
        start_time_ms: 1_700_000_000_000,
    });
    for sequence in 0..TRIALS {
        let id = trial_id(sequence);
        let x = (sequence as f64 * 0.618_033_988_75).fract();
        let batch = [16, 32, 64, 128][(sequence % 4) as usize];
        let optimizer = ["adam", "sgd", "rmsprop"][(sequence % 3) as usize];
        store.append_unacked(StoreEvent::TrialCreated {
            trial_id: id.clone(),
            sequence,
            parameter_id: sequence,
            parameter_label: None,
            parameters: json!({
                "lr": 1e-5 * (1e4f64).powf(x),
                "batch": batch,
                "dropout": 0.5 * (1.0 - x),
                "optimizer": optimizer,
            }),
            lineage: None,
        });
        store.append_unacked(StoreEvent::TrialStarted {
            trial_id: id.clone(),
            attempt: 1,
            environment_id: "local".to_string(),
            gpu_indices: vec![],
            pid: Some(10_000 + sequence as u32),
        });
        let mut value = 0.0;
        for step in 0..INTERMEDIATE_PER_TRIAL {
            value = (1.0 - (-(step as f64 + 1.0) / 6.0).exp()) * (0.6 + 0.35 * x);
            store.append_unacked(StoreEvent::Metric {
                trial_id: id.clone(),
                attempt: 1,
                kind: MetricKind::Intermediate,
                trial_sequence: step,
                raw: value.to_string(),
                value: Some(value),
            });
        }
        store.append_unacked(StoreEvent::Metric {
            trial_id: id.clone(),
            attempt: 1,
            kind: MetricKind::Final,
            trial_sequence: INTERMEDIATE_PER_TRIAL,
            raw: value.to_string(),
            value: Some(value),
        });
        store.append_unacked(StoreEvent::TrialEnded {
            trial_id: id,
            attempt: 1,
            status: TrialStatus::Succeeded,
            exit_code: Some(0),
            signal: None,
            message: None,
            stderr_tail: None,
            peak_memory_mib: None,
            peak_gpu_memory_mib: None,
            ended_ms: None,
        });
    }
    store.close().unwrap();
}

struct View {
    child: Child,
    base: String,
}

impl View {
    fn start(knob: &Path, home: &Path) -> View {
        let mut child = Command::new(knob)
            .args(["view", "load", "--port", "0"])
            .env("KNOB_HOME", home)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (found, url) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if let Some(at) = line.find("http://") {
                    let url = line[at..].split_whitespace().next().unwrap_or_default();
                    let _ = found.send(url.trim_end_matches('/').to_string());
                }
            }
        });
        let base = url
            .recv_timeout(Duration::from_secs(30))
            .expect("knob view printed no URL within 30 s");
        View { child, base }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone, Copy)]
struct Timing {
    seconds: f64,
    bytes: usize,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(PATIENCE))
        .build()
        .into()
}

/// One GET: (seconds, body bytes).
fn fetch(agent: &ureq::Agent, url: &str) -> (f64, Vec<u8>) {
    let started = Instant::now();
    let body = agent
        .get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .body_mut()
        .with_config()
        .limit(1 << 30)
        .read_to_vec()
        .unwrap();
    (started.elapsed().as_secs_f64(), body)
}

/// The median of `REPETITIONS` GETs of `path`.
fn measure(base: &str, path: &str) -> Timing {
    let agent = agent();
    let url = format!("{base}{path}");
    let mut runs: Vec<(f64, usize)> = (0..REPETITIONS)
        .map(|_| {
            let (seconds, body) = fetch(&agent, &url);
            (seconds, body.len())
        })
        .collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (seconds, bytes) = runs[REPETITIONS / 2];
    Timing { seconds, bytes }
}

/// What the dashboard used to fetch before its first paint: every trial, then every metric in
/// pages of 10 000. Timed once (it is the slow side).
fn old_snapshot(base: &str) -> Timing {
    let agent = agent();
    let started = Instant::now();
    let mut bytes = fetch(
        &agent,
        &format!("{base}/api/v1/trials?offset=0&limit=10000"),
    )
    .1
    .len();
    let mut since = 0;
    for _ in 0..1_000 {
        let (_, body) = fetch(
            &agent,
            &format!("{base}/api/v1/metrics?since={since}&limit=10000"),
        );
        bytes += body.len();
        let page: Value = serde_json::from_slice(&body).unwrap();
        if page["metrics"].as_array().is_none_or(|m| m.is_empty()) {
            break;
        }
        since = page["last_seq"].as_u64().unwrap();
    }
    Timing {
        seconds: started.elapsed().as_secs_f64(),
        bytes,
    }
}

fn report(what: &str, timing: &Timing, target_seconds: Option<f64>) {
    let verdict = match target_seconds {
        Some(target) if timing.seconds <= target => {
            format!("  (target < {} ms: met)", target * 1e3)
        }
        Some(target) => format!("  (target < {} ms: MISSED)", target * 1e3),
        None => String::new(),
    };
    println!(
        "  {what:<62} {:>9.1} ms {:>12} bytes{verdict}",
        timing.seconds * 1e3,
        timing.bytes
    );
}

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const PAINT: &str = r##"
    if (window.__knobFirstPaint === undefined) return null;
    const resources = performance.getEntriesByType("resource");
    const navigation = performance.getEntriesByType("navigation")[0];
    const sum = (key) => resources.reduce((n, r) => n + r[key], navigation[key]);
    const mark = (name) => { const m = performance.getEntriesByName(name)[0]; return m ? m.startTime : null; };
    // What the first paint's frame held (builds before 2026-11-26 drew everything in it and
    // do not say: their rows are counted now, and their charts were drawn in that frame).
    const held = window.__knobFirstPaintHeld || null;
    return {
        first_paint_ms: window.__knobFirstPaint,
        charts_drawn_ms: window.__knobChartsDrawn === undefined ? window.__knobFirstPaint : window.__knobChartsDrawn,
        held_rows: held ? held.rows : document.querySelectorAll("#trials tbody tr").length,
        held_counts: held ? held.counts : null,
        snapshot_ms: mark("knob-snapshot-loaded"),
        // When app.js began to run (null before 2026-11-26) and the parser was done.
        script_ms: mark("knob-script"),
        interactive_ms: navigation.domInteractive,
        transferred: sum("transferSize"),
        decoded: sum("decodedBodySize"),
        requests: resources.length + 1,
        rows: document.querySelectorAll("#trials tbody tr").length,
        parallel_lines: (() => {
            const chart = window.echarts && echarts.getInstanceByDom(document.getElementById("chart-parallel"));
            const series = chart && chart.getOption().series;
            return series && series[0] ? series[0].data.length : null;
        })(),
        parts: performance.getEntriesByType("measure").filter((m) => m.name.startsWith("knob-"))
            .map((m) => m.name.slice(5) + " " + m.duration.toFixed(0)).join(", "),
        // Each request: when it was asked (ms after navigation), the server's wait (request
        // sent to first byte), when its body was in, and what was transferred.
        requests_detail: resources.filter((r) => r.startTime <= window.__knobFirstPaint).map((r) => {
            const name = new URL(r.name).pathname.replace(/^.*\/(api\/v1|assets)\//, "").split("?")[0];
            return `${name} at ${r.startTime.toFixed(0)}, wait ${(r.responseStart - r.requestStart).toFixed(0)}, in at ${r.responseEnd.toFixed(0)}, ${r.transferSize} B`;
        }).join("; "),
    };"##;

async fn browser(servers: &[(&str, String)], loads: usize, chromium: &str, chromedriver: &str) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _driver = Driver(
        Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + PATIENCE;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    // KNOB_BENCH_COLD=1: every load in a browser of its own with an empty profile, as a first
    // visit (no HTTP cache, no compiled scripts kept); otherwise one browser for every load, so
    // that a server's first load is a first visit and the next ones are visits again.
    let cold = std::env::var("KNOB_BENCH_COLD").is_ok_and(|v| v == "1");
    let open = move || async move {
        let profile = tempfile::tempdir().unwrap();
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_string(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--window-size=1400,1800",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let page: Client =
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(capabilities)
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
                .expect("cannot open a WebDriver session");
        (page, profile)
    };
    let mut browser = if cold { None } else { Some(open().await) };
    println!(
        "dashboard in headless Chromium ({loads} fresh loads of each, alternating, gzip as the browser asks; {}):",
        if cold {
            "each load in a new browser with an empty profile (KNOB_BENCH_COLD=1)"
        } else {
            "one browser, so each server's load 1 is a first visit and the later ones visits again"
        }
    );
    let mut firsts: Vec<Vec<f64>> = vec![Vec::new(); servers.len()];
    let mut drawn: Vec<Vec<f64>> = vec![Vec::new(); servers.len()];
    for load in 0..loads {
        for (server, (name, base)) in servers.iter().enumerate() {
            if cold {
                if let Some((page, _profile)) = browser.take() {
                    let _ = page.close().await;
                }
                browser = Some(open().await);
            }
            let (page, _) = browser.as_ref().expect("a browser is open");
            let paint = load_once(page, base).await;
            println!(
                "  {name} load {}: first paint {:>5.0} ms ({} table rows in it; counts {}), charts drawn at {:>5.0} ms (whole list and curves in at {:>5.0} ms), {:>8} bytes transferred ({} decoded) in {} requests; {} table rows, {} parallel lines at the end",
                load + 1,
                paint["first_paint_ms"].as_f64().unwrap_or(f64::NAN),
                paint["held_rows"],
                paint["held_counts"],
                paint["charts_drawn_ms"].as_f64().unwrap_or(f64::NAN),
                paint["snapshot_ms"].as_f64().unwrap_or(f64::NAN),
                paint["transferred"],
                paint["decoded"],
                paint["requests"],
                paint["rows"],
                paint["parallel_lines"]
            );
            println!(
                "    app.js ran at {} ms, the document was parsed at {:.0} ms",
                paint["script_ms"]
                    .as_f64()
                    .map_or("?".to_string(), |ms| format!("{ms:.0}")),
                paint["interactive_ms"].as_f64().unwrap_or(f64::NAN)
            );
            if let Some(requests) = paint["requests_detail"].as_str() {
                println!("    its requests before the first paint: {requests}");
            }
            if paint["parts"].as_str().is_some_and(|p| !p.is_empty()) {
                println!(
                    "    its first render, ms: {}",
                    paint["parts"].as_str().unwrap_or_default()
                );
            }
            firsts[server].push(paint["first_paint_ms"].as_f64().unwrap_or(f64::NAN));
            drawn[server].push(paint["charts_drawn_ms"].as_f64().unwrap_or(f64::NAN));
        }
    }
    let median = |times: &mut Vec<f64>| {
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    let medians: Vec<f64> = firsts.iter_mut().map(median).collect();
    let drawn_medians: Vec<f64> = drawn.iter_mut().map(median).collect();
    for (((name, _), median), drawn) in servers.iter().zip(&medians).zip(&drawn_medians) {
        println!(
            "  {name}: median first paint {median:.0} ms (target < {FIRST_PAINT_TARGET_MS:.0} ms: {}), charts drawn {drawn:.0} ms",
            if *median < FIRST_PAINT_TARGET_MS { "met" } else { "MISSED" }
        );
    }
    if medians.len() == 2 {
        println!(
            "  after / before: {:.2}× the first paint, {:.2}× the charts drawn",
            medians[1] / medians[0],
            drawn_medians[1] / drawn_medians[0]
        );
    }
    if let Some((page, _profile)) = browser {
        let _ = page.close().await;
    }
}

/// One fresh load of the dashboard at `base`: its first paint's figures, once the page has also
/// answered what comes after the first paint (importance), so that the next load, of either
/// server, does not share the machine with this one's leftovers.
async fn load_once(page: &Client, base: &str) -> Value {
    // A blank page between loads, so each load starts from nothing in memory.
    page.goto("about:blank").await.unwrap();
    page.goto(&format!("{base}/")).await.unwrap();
    let deadline = Instant::now() + PATIENCE;
    while page
        .execute("return window.__knobFirstPaint !== undefined", vec![])
        .await
        .unwrap()
        != json!(true)
    {
        assert!(
            Instant::now() < deadline,
            "no first paint within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while page
        .execute(
            // Builds from before the importance chart (67ba24f) have no note to wait for.
            "const note = document.getElementById('importance-note'); return !note || note.textContent !== ''",
            vec![],
        )
        .await
        .unwrap()
        != json!(true)
    {
        assert!(
            Instant::now() < deadline,
            "no importance answer within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Read once everything has come (the charts are drawn before importance is asked for).
    page.execute(PAINT, vec![]).await.unwrap()
}
