//! `knob top ID`: a live terminal view of an experiment (counts, budget, best and running
//! trials), refreshed until it ends, `q` is pressed, or `--iterations` frames were shown.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use knob_core::api::experiment_snapshot;
use knob_core::registry::{Registry, CRASHED};
use serde_json::{json, Value};

use crate::client::ApiClient;
use crate::table::render;

#[derive(clap::Args)]
pub struct TopArgs {
    id: String,
    /// Seconds between refreshes (0.1 to 3600).
    #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
    interval: f64,
    /// Stop after this many refreshes (at least 1: the first frame is the first refresh).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    iterations: Option<u64>,
}

pub fn top(args: TopArgs) -> anyhow::Result<ExitCode> {
    let registry = Registry::open_default()?;
    let interval = Duration::from_secs_f64(args.interval);
    let terminal = RawTerminal::enter();
    let mut frames = 0u64;
    loop {
        let entry = registry.get(&args.id)?;
        let (snapshot, running) = match ApiClient::for_running(&entry) {
            Some(client) => (
                client.get("/experiment")?,
                client.get("/trials?status=RUNNING,WAITING&limit=20")?,
            ),
            None => {
                let mut snapshot = from_store(&entry)?;
                if entry.crashed() {
                    snapshot["status"] = json!(CRASHED);
                }
                (snapshot, json!({ "trials": [] }))
            }
        };
        let live = ApiClient::for_running(&entry).is_some();
        let frame = render_frame(&args.id, &snapshot, &running, live);
        let mut out = crate::stdout();
        if terminal.is_some() {
            // Home and clear, then the frame with \r\n (raw mode does not translate \n).
            write!(out, "\x1b[H\x1b[2J{}", frame.replace('\n', "\r\n"))?;
        } else {
            writeln!(out, "{frame}")?;
        }
        out.flush()?;
        frames += 1;
        if !live || args.iterations.is_some_and(|n| frames >= n) {
            break;
        }
        if wait_for_quit(terminal.is_some(), interval) {
            break;
        }
    }
    drop(terminal);
    Ok(ExitCode::SUCCESS)
}

/// What `GET /api/v1/experiment` gives, from the store of an experiment not running.
fn from_store(entry: &knob_core::registry::RegistryEntry) -> anyhow::Result<Value> {
    let reader = crate::experiment::open(entry)?;
    // A crashed run's clock stopped when it was last known alive.
    experiment_snapshot(&reader, entry.running_pid().is_some())?.ok_or_else(|| {
        anyhow::anyhow!("the store in {} has no experiment yet", entry.dir.display())
    })
}

fn render_frame(id: &str, snapshot: &Value, running: &Value, live: bool) -> String {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    let config = &snapshot["config"];
    let mut frame = format!(
        "knob top — experiment {id} · {}{} · running time {}s · optimize {}\n",
        text(&snapshot["status"]),
        if live { "" } else { " (not running)" },
        // What maxExperimentDuration, on the next line, counts: not the time since creation,
        // which grows while the experiment is stopped.
        snapshot["running_ms"].as_i64().unwrap_or(0) / 1000,
        text(&snapshot["optimize_mode"]),
    );
    frame.push_str(&format!(
        "trials {} of maxTrialNumber {} · concurrency {} · maxExperimentDuration {}\n",
        text(&snapshot["trial_total"]),
        text(&config["maxTrialNumber"]),
        text(&config["trialConcurrency"]),
        // Seconds in the stored config, as the running time above.
        match &config["maxExperimentDuration"] {
            Value::Number(seconds) => format!("{seconds}s"),
            other => text(other),
        },
    ));
    if let Some(counts) = snapshot["trial_counts"].as_object() {
        let counts: Vec<String> = counts.iter().map(|(s, n)| format!("{s} {n}")).collect();
        frame.push_str(&format!("{}\n", counts.join(" · ")));
    }
    let row = |t: &Value| {
        vec![
            text(&t["trial_id"]),
            text(&t["status"]),
            text(&t["final_value"]),
            t["duration_ms"]
                .as_i64()
                .map_or("-".into(), |ms| format!("{:.1}s", ms as f64 / 1000.0)),
            text(&t["parameters"]),
        ]
    };
    let headers = ["trial", "status", "final", "duration", "parameters"];
    let best: Vec<Vec<String>> = snapshot["best_trials"]
        .as_array()
        .map(|b| b.iter().take(5).map(row).collect())
        .unwrap_or_default();
    frame.push_str(&format!("\nbest\n{}\n", render(&headers, &best)));
    let running: Vec<Vec<String>> = running["trials"]
        .as_array()
        .map(|r| r.iter().map(row).collect())
        .unwrap_or_default();
    if !running.is_empty() {
        frame.push_str(&format!("\nrunning\n{}\n", render(&headers, &running)));
    }
    if live {
        frame.push_str("\nq to quit\n");
    }
    frame
}

/// `--interval`: refused outside 0.1–3600 s rather than clamped, so a typo (`0`, `nan`, `-1`)
/// is told, not silently turned into a refresh rate nobody asked for.
fn parse_interval(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(seconds) if (0.1..=3600.0).contains(&seconds) => Ok(seconds),
        _ => Err(format!(
            "expected seconds between 0.1 and 3600 (for instance 2 or 0.5), not {text:?}"
        )),
    }
}

/// Waits up to `interval` for a `q` on a raw terminal; without one, just waits.
fn wait_for_quit(raw: bool, interval: Duration) -> bool {
    if !raw {
        std::thread::sleep(interval);
        return false;
    }
    let mut poll = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = i32::try_from(interval.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for the duration of the call.
    let ready = unsafe { libc::poll(&mut poll, 1, timeout) };
    if ready <= 0 {
        return false;
    }
    let mut byte = 0u8;
    // SAFETY: reading one byte into a local.
    let read = unsafe { libc::read(libc::STDIN_FILENO, (&mut byte as *mut u8).cast(), 1) };
    read == 1 && matches!(byte, b'q' | b'Q' | 3 | 27)
}

/// The terminal in non-canonical, no-echo mode while `top` runs; restored on drop.
struct RawTerminal {
    saved: libc::termios,
}

impl RawTerminal {
    fn enter() -> Option<RawTerminal> {
        // SAFETY: isatty and tcgetattr/tcsetattr on stdin with a properly sized termios.
        unsafe {
            if libc::isatty(libc::STDIN_FILENO) != 1 || libc::isatty(libc::STDOUT_FILENO) != 1 {
                return None;
            }
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(libc::STDIN_FILENO, &mut saved) != 0 {
                return None;
            }
            let mut raw = saved;
            raw.c_lflag &= !(libc::ICANON | libc::ECHO);
            raw.c_oflag &= !libc::OPOST;
            if libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) != 0 {
                return None;
            }
            Some(RawTerminal { saved })
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restoring the attributes read in `enter`.
        unsafe {
            libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &self.saved);
        }
    }
}
