//! The dashboard in a real headless Chromium driven over WebDriver (Debian's `chromium-driver`),
//! against a real experiment whose trials finish when the test says so. One page load: the
//! table follows the experiment through the live stream, the charts render, kill and add-trial
//! work from the page. Screenshots go to `target/browser-screenshots/`.
//!
//! Gated by `KNOB_TEST_CHROMIUM` and `KNOB_TEST_CHROMEDRIVER` (the two binaries; `.ci/run`
//! installs Debian's `chromium` and `chromium-driver` and sets both; see `prerequisite.rs`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::api::start;
use crate::create::Sandbox;
use crate::prerequisite;

/// Each trial waits (at most 60 s) for a file named after its sequence number in the gate
/// folder, then reports one intermediate and one final result.
const CONFIG: &str = r#"trialCommand: 'i=0; while [ ! -e "GATE/$NNI_TRIAL_SEQ_ID" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; echo KNOB_INTERMEDIATE $((NNI_TRIAL_SEQ_ID * 3)); echo KNOB_FINAL $((NNI_TRIAL_SEQ_ID * 37 % 100))'
trialConcurrency: 2
maxTrialNumber: 20
searchSpace:
  lr: {_type: loguniform, _value: [0.0001, 0.1]}
  optimizer: {_type: choice, _value: [adam, sgd]}
tuner:
  name: Random
  classArgs: {seed: 5}
trainingService:
  platform: local"#;

/// How long any one thing the page should do may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts chromedriver and waits (bounded) until it accepts connections.
fn start_driver(chromedriver: &Path) -> Driver {
    let port = free_port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
    let driver = Driver { child, port };
    let deadline = Instant::now() + PATIENCE;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "chromedriver did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    driver
}

async fn open_browser(driver: &Driver, chromium: &Path, profile: &Path) -> Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_string(),
        json!({
            "binary": chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1400,1800",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("cannot open a WebDriver session in chromium")
}

/// Runs `script` in the page until it returns something other than `null` or `false`.
async fn wait_in_page(page: &Client, what: &str, script: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let value = page.execute(script, vec![]).await.unwrap();
        if !value.is_null() && value != json!(false) {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn screenshot(page: &Client, name: &str) -> PathBuf {
    let dir = crate::repo_root().join("target/browser-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.png"));
    std::fs::write(&path, page.screenshot().await.unwrap()).unwrap();
    println!("screenshot: {}", path.display());
    path
}

const TABLE_STATE: &str = r##"
    const rows = [...document.querySelectorAll("#trials tbody tr")];
    return rows.map((r) => [r.dataset.trial, r.querySelector(".badge").textContent]);"##;

/// (trial id, status) of every row of the page's trial table.
async fn table(page: &Client) -> Vec<(String, String)> {
    let rows = page.execute(TABLE_STATE, vec![]).await.unwrap();
    serde_json::from_value(rows).unwrap()
}

fn release(gate: &Path, sequence: u64) {
    std::fs::write(gate.join(sequence.to_string()), "").unwrap();
}

fn api(base: &str, method: &str, path: &str, body: Option<Value>) -> Value {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(PATIENCE))
        .build()
        .into();
    let url = format!("{base}/api/v1{path}");
    let mut response = match body {
        Some(body) => agent.run(
            ureq::http::Request::builder()
                .method(method)
                .uri(url)
                .header("Content-Type", "application/json")
                .body(body.to_string())
                .unwrap(),
        ),
        None => agent.get(url).call(),
    }
    .unwrap();
    serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_follows_the_experiment_live_and_kills_and_adds_trials() {
    let (Some(chromium), Some(chromedriver)) = (
        prerequisite::CHROMIUM.path(),
        prerequisite::CHROMEDRIVER.path(),
    ) else {
        return;
    };
    let sandbox = Sandbox::new();
    let gate = sandbox.path().join("gate");
    std::fs::create_dir_all(&gate).unwrap();
    let config = sandbox.config(&CONFIG.replace("GATE", &gate.display().to_string()), &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let experiment = start(command, &["--id", "shown", "--port", "0"]);
    let base = experiment.base.trim_end_matches("/api/v1").to_string();

    let driver = start_driver(&chromedriver);
    let profile = tempfile::tempdir().unwrap();
    let page = open_browser(&driver, &chromium, profile.path()).await;
    page.goto(&format!("{base}/")).await.unwrap();
    // Gone if the page reloads: everything below happens in this one page load.
    page.execute("window.__sameLoad = true; return true;", vec![])
        .await
        .unwrap();
    wait_in_page(
        &page,
        "two running trials in the table",
        "return document.querySelectorAll('#trials tbody tr .badge.RUNNING').length === 2",
    )
    .await;
    let title = page
        .execute(
            "return document.getElementById('experiment-id').textContent",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(title, json!("shown"));
    screenshot(&page, "1-running").await;

    // Trials finish one by one; each end starts the next trial, and the table grows.
    let mut rows_seen = vec![table(&page).await.len()];
    for sequence in 0..3 {
        release(&gate, sequence);
        let want = sequence as usize + 1;
        wait_in_page(
            &page,
            &format!("{want} succeeded trials in the table"),
            &format!("return document.querySelectorAll('#trials tbody tr .badge.SUCCEEDED').length >= {want}"),
        )
        .await;
        wait_in_page(
            &page,
            "the next trial in the table",
            &format!(
                "return document.querySelectorAll('#trials tbody tr').length >= {}",
                want + 2
            ),
        )
        .await;
        rows_seen.push(table(&page).await.len());
    }
    assert!(
        rows_seen.windows(2).all(|w| w[0] < w[1]),
        "the table did not grow with each finished trial: {rows_seen:?}"
    );

    // The parallel-coordinates chart: an ECharts parallel series with one line per finished
    // trial (lr, optimizer, metric), drawn on a canvas.
    let parallel = wait_in_page(
        &page,
        "the parallel-coordinates chart",
        r##"const chart = echarts.getInstanceByDom(document.getElementById("chart-parallel"));
           if (!chart) return null;
           const series = chart.getOption().series[0];
           const canvas = document.querySelector("#chart-parallel canvas");
           if (!series || series.data.length < 3 || !canvas) return null;
           return {type: series.type, lines: series.data.length, width: series.data[0].length,
                   axes: chart.getOption().parallelAxis.map((a) => a.name)};"##,
    )
    .await;
    assert_eq!(parallel["type"], json!("parallel"), "{parallel}");
    assert_eq!(parallel["width"], json!(3), "{parallel}");
    assert_eq!(
        parallel["axes"],
        json!(["lr", "optimizer", "metric"]),
        "{parallel}"
    );
    screenshot(&page, "2-finished").await;

    // Kill a running trial from the page.
    let running = table(&page)
        .await
        .into_iter()
        .find(|(_, status)| status == "RUNNING")
        .map(|(id, _)| id)
        .expect("no running trial to kill");
    page.find(Locator::Css(&format!(
        "#trials tbody tr[data-trial='{running}'] button.kill"
    )))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    wait_in_page(
        &page,
        "the killed trial shown USER_CANCELED",
        &format!("return document.querySelector(\"#trials tbody tr[data-trial='{running}'] .badge\").textContent === 'USER_CANCELED'"),
    )
    .await;
    assert_eq!(
        api(&base, "GET", &format!("/trials/{running}"), None)["status"],
        json!("USER_CANCELED")
    );
    screenshot(&page, "3-killed").await;

    // Add a trial from the page; it runs with exactly these parameters.
    page.find(Locator::Id("add-trial-open"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    page.find(Locator::Id("add-trial-parameters"))
        .await
        .unwrap()
        .send_keys(r##"{"lr": 0.005, "optimizer": "sgd"}"##)
        .await
        .unwrap();
    page.find(Locator::Css("#add-trial button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let added = wait_in_page(
        &page,
        "the page to confirm the added trial",
        r##"const text = document.getElementById("add-trial-result").textContent;
           return text.startsWith("added ") ? text.slice(6) : (text ? "ERROR " + text : null);"##,
    )
    .await;
    let added = added.as_str().unwrap().to_string();
    assert!(!added.starts_with("ERROR"), "{added}");
    let trial = api(&base, "GET", &format!("/trials/{added}"), None);
    assert_eq!(
        trial["parameters"],
        json!({"lr": 0.005, "optimizer": "sgd"}),
        "{trial}"
    );
    wait_in_page(
        &page,
        "the added trial in the table",
        &format!("return !!document.querySelector(\"#trials tbody tr[data-trial='{added}']\")"),
    )
    .await;

    let same_load = page
        .execute("return window.__sameLoad === true", vec![])
        .await
        .unwrap();
    assert_eq!(same_load, json!(true), "the page reloaded");
    screenshot(&page, "4-added").await;
    // Let every trial finish so the experiment ends cleanly when it is dropped.
    for sequence in 0..40 {
        release(&gate, sequence);
    }
    let _ = api(&base, "POST", "/experiment/stop", Some(json!({})));
    page.close().await.unwrap();
}
