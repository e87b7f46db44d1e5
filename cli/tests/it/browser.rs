//! The dashboard in a real headless Chromium, against a running experiment. Gated by
//! `KNOB_TEST_CHROMIUM` (the browser's path; `.ci/run` installs Debian's `chromium` and sets it).

use std::process::Command;
use std::time::Duration;

use crate::api::start;
use crate::create::Sandbox;

const CONFIG: &str = r#"trialCommand: 'for i in 1 2 3; do echo KNOB_INTERMEDIATE $i; sleep 0.1; done; echo KNOB_FINAL $(echo "$KNOB_PARAMETERS" | tr -dc 0-9 | cut -c1-3)'
trialConcurrency: 2
maxTrialNumber: 400
searchSpace:
  x: {_type: randint, _value: [0, 1000]}
tuner:
  name: Random
  classArgs: {seed: 5}
trainingService:
  platform: local"#;

/// Loads `url` in headless Chromium, lets its scripts run for `budget` of virtual time, and
/// returns the DOM as the page left it.
fn rendered_dom(chromium: &str, url: &str, budget: Duration) -> String {
    let profile = tempfile::tempdir().unwrap();
    let output = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn table_rows(dom: &str) -> usize {
    let Some(start) = dom.find("id=\"trials\"") else {
        return 0;
    };
    let table = &dom[start
        ..dom[start..]
            .find("</table>")
            .map_or(dom.len(), |end| start + end)];
    table.matches("<tr").count().saturating_sub(1)
}

#[test]
fn the_dashboard_renders_the_trials_and_charts_and_follows_the_experiment() {
    let Ok(chromium) = std::env::var("KNOB_TEST_CHROMIUM") else {
        eprintln!("skipped: set KNOB_TEST_CHROMIUM=/usr/bin/chromium to run the browser test");
        return;
    };
    let sandbox = Sandbox::new();
    let config = sandbox.config(CONFIG, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let experiment = start(command, &["--id", "shown", "--port", "0"]);
    let page = format!("{}/", experiment.base.trim_end_matches("/api/v1"));
    std::thread::sleep(Duration::from_secs(2));

    let first = rendered_dom(&chromium, &page, Duration::from_secs(5));
    assert!(
        first.contains("id=\"experiment-id\">shown<"),
        "no experiment id in the page:\n{first}"
    );
    let first_rows = table_rows(&first);
    assert!(first_rows > 0, "the trial table is empty:\n{first}");
    // ECharts draws into a canvas inside each chart's container.
    let chart = &first[first
        .find("id=\"chart-final\"")
        .expect("no final-metric chart")..];
    assert!(
        chart[..chart.find("</div></div>").unwrap_or(chart.len())].contains("<canvas"),
        "the chart did not render"
    );

    std::thread::sleep(Duration::from_secs(3));
    let later = rendered_dom(&chromium, &page, Duration::from_secs(5));
    assert!(
        table_rows(&later) > first_rows,
        "the table did not follow the experiment: {first_rows} then {}",
        table_rows(&later)
    );
}
