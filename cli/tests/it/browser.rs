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

use fantoccini::actions::InputSource;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::api::start;
use crate::create::Sandbox;
use crate::prerequisite;

/// Each trial reports one intermediate result, waits (at most 60 s) for a file named after its
/// sequence number in the gate folder, then reports its final result.
const CONFIG: &str = r#"experimentName: browser demo
trialCommand: 'echo KNOB_INTERMEDIATE $((NNI_TRIAL_SEQ_ID * 3 + 1)); i=0; while [ ! -e "GATE/$NNI_TRIAL_SEQ_ID" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; echo KNOB_FINAL $((NNI_TRIAL_SEQ_ID * 37 % 100))'
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
    // The console, for `console_errors`.
    capabilities.insert("goog:loggingPrefs".to_string(), json!({"browser": "ALL"}));
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

/// Runs `script` in the page until it returns something other than `null` or `false`. A script
/// that throws counts as not yet (the page loads ECharts after its first paint, so `echarts` is
/// undefined for a while); its last error is named if the wait runs out.
async fn wait_in_page(page: &Client, what: &str, script: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    let mut error: Option<String>;
    loop {
        match page.execute(script, vec![]).await {
            Ok(value) if !value.is_null() && value != json!(false) => return value,
            Ok(_) => error = None,
            Err(e) => error = Some(e.to_string()),
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}{}",
            error
                .map(|e| format!(" (the script's last error: {e})"))
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The console's SEVERE entries since the last call (errors, failed loads), through
/// chromedriver's own log command (WebDriver has none).
async fn console_errors(driver: &Driver, page: &Client) -> Vec<Value> {
    let session = page.session_id().await.unwrap().unwrap();
    let url = format!("http://127.0.0.1:{}/session/{session}/se/log", driver.port);
    let answer: Value = tokio::task::spawn_blocking(move || {
        let mut response = ureq::post(&url)
            .header("Content-Type", "application/json")
            .send(json!({"type": "browser"}).to_string())
            .unwrap();
        serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap()
    })
    .await
    .unwrap();
    answer["value"]
        .as_array()
        .unwrap_or_else(|| panic!("no browser log: {answer}"))
        .iter()
        .filter(|entry| entry["level"] == "SEVERE")
        .cloned()
        .collect()
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

/// Replaces the text of the field `id` as a user typing would (an `input` event).
async fn set_field(page: &Client, id: &str, text: &str) {
    page.execute(
        "const field = document.getElementById(arguments[0]); field.value = arguments[1];
         field.dispatchEvent(new Event('input')); return true;",
        vec![json!(id), json!(text)],
    )
    .await
    .unwrap();
}

/// Clicks the element `css` finds; found again if the page redrew it in between (a stale
/// element), a few times at most.
async fn click(page: &Client, css: &str) {
    for attempt in 1..=5 {
        let clicked = page.find(Locator::Css(css)).await.unwrap().click().await;
        match clicked {
            Ok(_) => return,
            Err(fantoccini::error::CmdError::Standard(e))
                if e.error == fantoccini::error::ErrorStatus::StaleElementReference
                    && attempt < 5 =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("clicking {css}: {e}"),
        }
    }
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

/// The (chromium, chromedriver) binaries, or `None` after `prerequisite` said why the test
/// skips (a skip fails under `KNOB_TEST_REQUIRE_ALL=1`).
fn browser_or_skip() -> Option<(PathBuf, PathBuf)> {
    match (
        prerequisite::CHROMIUM.path(),
        prerequisite::CHROMEDRIVER.path(),
    ) {
        (Some(chromium), Some(chromedriver)) => Some((chromium, chromedriver)),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_follows_the_experiment_live_and_kills_and_adds_trials() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let sandbox = Sandbox::new();
    let gate = sandbox.path().join("gate");
    std::fs::create_dir_all(&gate).unwrap();
    let config = sandbox.config(&CONFIG.replace("GATE", &gate.display().to_string()), &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let mut experiment = start(command, &["--id", "shown", "--port", "0"]);
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
            "return [document.getElementById('experiment-name').textContent, \
                     document.getElementById('experiment-id').textContent, document.title]",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        title,
        json!(["browser demo", "(shown)", "knob · browser demo"])
    );
    // The page follows the stream once its snapshot is in, which comes after the table's first
    // rows are painted.
    let live = wait_in_page(
        &page,
        "the live badge",
        "const l = document.getElementById('live'); return l.className === 'live connecting' ? null : [l.hidden, l.textContent, l.className]",
    )
    .await;
    assert_eq!(live, json!([false, "● live", "live connected"]));
    // Running trials are drawn apart: their partial durations in a series of their own, and
    // "so far" in the table.
    let running = wait_in_page(
        &page,
        "the running trials' partial durations",
        r##"const option = echarts.getInstanceByDom(document.getElementById("chart-duration")).getOption();
           const running = option.series.find((s) => s.name === "running (so far)");
           return running.data.length === 2 ? {finished: option.series.find((s) => s.name === "finished").data.length,
                   cells: [...document.querySelectorAll("#trials td.running-duration")].map((c) => c.textContent.endsWith(" so far"))} : null;"##,
    )
    .await;
    assert_eq!(running, json!({"finished": 0, "cells": [true, true]}));
    // ... and their curves dashed, each with its one report so far.
    let curves = wait_in_page(
        &page,
        "the running trials' curves",
        r##"const option = echarts.getInstanceByDom(document.getElementById("chart-intermediate")).getOption();
           return option.series.length === 2 && option.series.every((s) => s.data.length === 1)
               ? option.series.map((s) => s.lineStyle.type) : null;"##,
    )
    .await;
    assert_eq!(curves, json!(["dashed", "dashed"]));
    // The platform with its environments, live: the local machine, ready, running both.
    let environments = wait_in_page(
        &page,
        "the live environments",
        r##"const row = document.querySelector("#experiment-environments tbody tr[data-environment]");
           return row && row.cells[4].textContent.includes("running") ? [...row.cells].map((c) => c.textContent).concat([document.getElementById("environments-note").textContent]) : null;"##,
    )
    .await;
    let environments: Vec<String> = serde_json::from_value(environments).unwrap();
    assert_eq!(
        (
            environments[0].as_str(),
            environments[1].as_str(),
            environments[3].as_str(),
            environments[4].as_str(),
            environments[5].as_str()
        ),
        ("local", "local", "ready", "2 (2 running)", "(live)"),
        "{environments:?}"
    );
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

    // Run controls: trial concurrency 2 -> 3 from the page; the API then says 3 and a third
    // trial runs. A search space that is not JSON, and one the experiment refuses, are
    // answered beside the editor.
    set_field(&page, "set-concurrency", "3").await;
    click(&page, "[data-field='trialConcurrency']").await;
    wait_in_page(
        &page,
        "the page to confirm the concurrency",
        r##"return document.querySelector("[data-error='trialConcurrency']").textContent === "applied""##,
    )
    .await;
    assert_eq!(
        api(&base, "GET", "/experiment", None)["config"]["trialConcurrency"],
        json!(3)
    );
    wait_in_page(
        &page,
        "three running trials",
        "return document.querySelectorAll('#trials tbody tr .badge.RUNNING').length === 3",
    )
    .await;
    // Max trials and max duration the same way; a duration that does not parse is refused
    // beside its field.
    set_field(&page, "set-max-trials", "30").await;
    click(&page, "[data-field='maxTrialNumber']").await;
    wait_in_page(
        &page,
        "the page to confirm max trials",
        r##"return document.querySelector("[data-error='maxTrialNumber']").textContent === "applied""##,
    )
    .await;
    set_field(&page, "set-max-duration", "2h").await;
    click(&page, "[data-field='maxExperimentDuration']").await;
    wait_in_page(
        &page,
        "the page to confirm max duration",
        r##"return document.querySelector("[data-error='maxExperimentDuration']").textContent === "applied""##,
    )
    .await;
    let config = api(&base, "GET", "/experiment", None)["config"].clone();
    assert_eq!(
        (&config["maxTrialNumber"], &config["maxExperimentDuration"]),
        (&json!(30), &json!(7200))
    );
    set_field(&page, "set-max-duration", "soon").await;
    click(&page, "[data-field='maxExperimentDuration']").await;
    let refused = wait_in_page(
        &page,
        "the max duration's refusal",
        r##"const text = document.querySelector("[data-error='maxExperimentDuration']").textContent;
           return text && text !== "applied" ? text : null;"##,
    )
    .await;
    assert!(
        refused.as_str().unwrap().contains("maxExperimentDuration"),
        "{refused}"
    );
    set_field(
        &page,
        "set-search-space",
        "{\"lr\": {\"_type\": \"uniform\",",
    )
    .await;
    click(&page, "#apply-search-space").await;
    let not_json = wait_in_page(
        &page,
        "the search space's JSON error",
        r##"return document.querySelector("[data-error='searchSpace']").textContent || null"##,
    )
    .await;
    assert!(
        not_json.as_str().unwrap().starts_with("line 1, column "),
        "{not_json}"
    );
    set_field(
        &page,
        "set-search-space",
        r#"{"lr": {"_type": "uniform", "_value": [1, 0]}}"#,
    )
    .await;
    click(&page, "#apply-search-space").await;
    let refused = wait_in_page(
        &page,
        "the search space's refusal",
        r##"const text = document.querySelector("[data-error='searchSpace']").textContent;
           return text && !text.startsWith("line 1") ? text : null;"##,
    )
    .await;
    assert!(refused.as_str().unwrap().contains("lr"), "{refused}");
    screenshot(&page, "4-controls").await;

    let same_load = page
        .execute("return window.__sameLoad === true", vec![])
        .await
        .unwrap();
    assert_eq!(same_load, json!(true), "the page reloaded");
    screenshot(&page, "5-added").await;

    // The process serving the page dies while the experiment runs: within a few seconds the
    // page says the server is gone, shows RUNNING as the last known state, says how to look
    // again, and disables what would change the experiment.
    experiment.kill();
    let killed = Instant::now();
    let gone = wait_in_page(
        &page,
        "the server-gone state",
        r##"const gone = document.getElementById("gone");
           if (gone.hidden) return null;
           return {text: gone.textContent, status: document.getElementById("status").textContent,
                   live: document.getElementById("live").hidden,
                   stop: document.getElementById("stop").disabled,
                   concurrency: document.getElementById("set-concurrency").disabled,
                   kills: [...document.querySelectorAll("button.kill")].map((b) => b.disabled)};"##,
    )
    .await;
    let took = killed.elapsed();
    // The page notices within its reconnect attempts (a few seconds); the bound is loose
    // because a loaded CI machine stretches them, and only tells "noticed" from "never".
    assert!(took < Duration::from_secs(20), "took {took:?}: {gone}");
    let text = gone["text"].as_str().unwrap();
    assert!(text.contains("server of this page is gone"), "{text}");
    assert!(
        text.contains("Last known state of experiment shown: RUNNING"),
        "{text}"
    );
    assert!(text.contains("knob view shown"), "{text}");
    assert_eq!(gone["status"], json!("RUNNING (last known)"), "{gone}");
    assert_eq!(gone["live"], json!(true), "{gone}");
    assert_eq!(gone["stop"], json!(true), "{gone}");
    assert_eq!(gone["concurrency"], json!(true), "{gone}");
    let kills = gone["kills"].as_array().unwrap();
    assert!(
        !kills.is_empty() && kills.iter().all(|k| k == true),
        "{gone}"
    );
    screenshot(&page, "6-server-gone").await;
    // The trials the dead process left wait for their gates: release them so they end.
    for sequence in 0..40 {
        release(&gate, sequence);
    }
    page.close().await.unwrap();
}

/// 60 quick trials, each reporting 5 intermediate results (x, 2x, … 5x) and a final one,
/// x + y/10: x dominates the final, y matters a little, z not at all.
const SIXTY: &str = r#"experimentName: sixty curves
trialCommand: python3 trial.py
trialConcurrency: 6
maxTrialNumber: 60
searchSpace:
  x: {_type: uniform, _value: [0.001, 1]}
  y: {_type: uniform, _value: [0, 1]}
  z: {_type: choice, _value: [red, green, blue]}
tuner:
  name: Random
  classArgs: {seed: 8}
trainingService:
  platform: local"#;

const SIXTY_TRIAL: &str = r#"import json, os
p = json.loads(os.environ["KNOB_PARAMETERS"])
for i in range(1, 6):
    print(f"KNOB_INTERMEDIATE {p['x'] * i}", flush=True)
print(f"KNOB_FINAL {p['x'] + p['y'] / 10}", flush=True)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_experiment_under_view_shows_every_curve_no_live_badge_and_the_server_gone() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let sandbox = Sandbox::new();
    let config = sandbox.config(SIXTY, &[("trial.py", SIXTY_TRIAL)]);
    let (code, stdout, stderr) = sandbox.create(&config, "sixty");
    assert_eq!(code, 0, "{stdout}{stderr}");
    let mut command = sandbox.knob();
    command.args(["view", "sixty", "--port", "0"]);
    let mut view = start(command, &[]);
    let base = view.base.trim_end_matches("/api/v1").to_string();

    let driver = start_driver(&chromedriver);
    let profile = tempfile::tempdir().unwrap();
    let page = open_browser(&driver, &chromium, profile.path()).await;
    page.goto(&format!("{base}/")).await.unwrap();
    let shown = wait_in_page(
        &page,
        "the intermediate chart",
        r##"const chart = echarts.getInstanceByDom(document.getElementById("chart-intermediate"));
           if (!chart || chart.getOption().series.length === 0) return null;
           const select = document.getElementById("curve-count");
           const option = chart.getOption();
           return {curves: option.series.length,
                   points: option.series.map((s) => s.data.length),
                   first_x: option.series[0].data[0][0], x_min: option.xAxis[0].min,
                   chosen: select.options[select.selectedIndex].text,
                   offered: [...select.options].map((o) => o.text),
                   label: document.getElementById("curve-shown").textContent,
                   status: document.getElementById("status").textContent,
                   live_hidden: document.getElementById("live").hidden,
                   live_text: document.getElementById("live").textContent,
                   read_only: !document.getElementById("read-only").hidden,
                   name: document.getElementById("experiment-name").textContent};"##,
    )
    .await;
    assert_eq!(shown["curves"], json!(60), "{shown}");
    assert!(
        shown["points"].as_array().unwrap().iter().all(|p| p == 5),
        "{shown}"
    );
    assert_eq!(shown["first_x"], json!(1), "reports start at 1: {shown}");
    assert_eq!(shown["x_min"], json!(1), "{shown}");
    assert_eq!(shown["chosen"], json!("all (60)"), "{shown}");
    assert_eq!(shown["offered"], json!(["10", "50", "all (60)"]), "{shown}");
    assert_eq!(shown["label"], json!("60 of 60 trials"), "{shown}");
    assert_eq!(shown["status"], json!("DONE"), "{shown}");
    assert_eq!(shown["live_hidden"], json!(true), "{shown}");
    assert_eq!(shown["read_only"], json!(true), "{shown}");
    assert_eq!(shown["name"], json!("sixty curves"), "{shown}");
    screenshot(&page, "view-1-done").await;

    // Importance (fANOVA on the server): x first, z last, as the objective says; the chart
    // draws the most important at the top.
    let importance = api(&base, "GET", "/importance", None);
    let order: Vec<&str> = importance["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["x", "y", "z"], "{importance}");
    assert_eq!(importance["trials"], json!(60), "{importance}");
    // The first paint held the overview and the table's first page (50 of the 60 trials) and no
    // chart: the page asked for ECharts only after it, and the table now holds every trial.
    let first = page
        .execute(
            r##"const paint = performance.getEntriesByName("knob-first-paint")[0].startTime;
               const library = performance.getEntriesByType("resource").filter((r) => r.name.endsWith("/echarts.min.js"));
               return {held: window.__knobFirstPaintHeld, library_after: library.length === 1 && library[0].startTime >= paint,
                       rows: document.querySelectorAll("#trials tbody tr").length,
                       count: document.getElementById("trial-count").textContent};"##,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        first,
        json!({"held": {"rows": 50, "counts": "SUCCEEDED 60", "charts": 0}, "library_after": true,
               "rows": 60, "count": "60 of 60"})
    );
    // The page asked for importance only after its first paint, and draws the slice plot when
    // its card is on screen.
    let asked = page
        .execute(
            r##"const paint = performance.getEntriesByName("knob-first-paint")[0].startTime;
               const asks = performance.getEntriesByType("resource").filter((r) => r.name.includes("/api/v1/importance"));
               return asks.length ? asks.every((r) => r.startTime >= paint) : "not asked";"##,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        asked,
        json!(true),
        "importance asked before the first paint"
    );
    page.execute(
        "document.getElementById('chart-slice').scrollIntoView(); return true;",
        vec![],
    )
    .await
    .unwrap();
    let drawn = wait_in_page(
        &page,
        "the importance chart",
        r##"const chart = echarts.getInstanceByDom(document.getElementById("chart-importance"));
           const sliceChart = echarts.getInstanceByDom(document.getElementById("chart-slice"));
           if (!chart || !chart.getOption().yAxis || !sliceChart) return null;
           const slice = sliceChart.getOption();
           return {names: chart.getOption().yAxis[0].data, slice: slice.xAxis[0].name,
                   points: slice.series[0].data.length};"##,
    )
    .await;
    assert_eq!(
        drawn,
        json!({"names": ["z", "y", "x"], "slice": "x", "points": 60})
    );
    // ECharts renders a tooltip as HTML: a parameter's name (the config's text) is escaped in it.
    let tooltip = page
        .execute(
            r##"const option = echarts.getInstanceByDom(document.getElementById("chart-importance")).getOption();
               return option.tooltip[0].formatter({name: "<img src=x onerror=alert(1)>", value: 0.5});"##,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        tooltip,
        json!("&#60;img src=x onerror=alert(1)&#62;: 50.0%")
    );
    screenshot(&page, "view-1-importance").await;

    // The experiment panel: the platform with its environments, as the trials recorded them
    // (the experiment is not running).
    let environments = wait_in_page(
        &page,
        "the environments in the panel",
        r##"const rows = [...document.querySelectorAll("#experiment-environments tbody tr")];
           return rows.length && rows[0].cells.length === 5 ? {rows: rows.map((r) => [...r.cells].map((c) => c.textContent)),
                   note: document.getElementById("environments-note").textContent,
                   info: [...document.querySelectorAll("#experiment-info tr")].map((r) => r.cells[0].textContent)} : null;"##,
    )
    .await;
    assert_eq!(
        environments["rows"],
        json!([["local", "–", "–", "–", "60"]]),
        "{environments}"
    );
    assert!(
        environments["note"]
            .as_str()
            .unwrap()
            .contains("not running"),
        "{environments}"
    );
    for field in ["name", "tuner", "platform", "started", "ended"] {
        assert!(
            environments["info"]
                .as_array()
                .unwrap()
                .contains(&json!(field)),
            "{field}: {environments}"
        );
    }

    // The parallel-coordinates colour scale spans the finals (its minimum is the lowest final,
    // not 0), and the trial axes take whole numbers only.
    let (low, high) = {
        let trials = api(&base, "GET", "/trials?limit=100", None);
        let finals: Vec<f64> = trials["trials"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["final_value"].as_f64().unwrap())
            .collect();
        (
            finals.iter().cloned().fold(f64::INFINITY, f64::min),
            finals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        )
    };
    let scales = page
        .execute(
            r##"const parallel = echarts.getInstanceByDom(document.getElementById("chart-parallel")).getOption();
               const final = echarts.getInstanceByDom(document.getElementById("chart-final")).getOption();
               const duration = echarts.getInstanceByDom(document.getElementById("chart-duration")).getOption();
               return {min: parallel.visualMap[0].min, max: parallel.visualMap[0].max,
                       final_ticks: final.xAxis[0].minInterval, duration_ticks: duration.xAxis[0].minInterval,
                       best_over_line: final.series.find((s) => s.name === "best").z > final.series.find((s) => s.name === "best so far").z};"##,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        scales,
        json!({"min": low, "max": high, "final_ticks": 1, "duration_ticks": 1, "best_over_line": true})
    );

    // Dark mode from the toggle: the page's colours and the charts (made again in ECharts'
    // dark theme, every curve still there) follow.
    click(&page, "#theme").await;
    let dark = wait_in_page(
        &page,
        "dark mode",
        r##"const chart = echarts.getInstanceByDom(document.getElementById("chart-intermediate"));
           if (document.documentElement.dataset.theme !== "dark" || !chart) return null;
           return [getComputedStyle(document.body).backgroundColor, chart.getOption().series.length,
                   localStorage.getItem("knob-theme")];"##,
    )
    .await;
    assert_eq!(dark, json!(["rgb(17, 20, 24)", 60, "dark"]));
    screenshot(&page, "view-1-dark").await;
    click(&page, "#theme").await;
    wait_in_page(
        &page,
        "light mode again",
        r##"return document.documentElement.dataset.theme === "light" && getComputedStyle(document.body).backgroundColor === "rgb(247, 248, 250)""##,
    )
    .await;

    // Read-only and DONE: the run controls are disabled and say why.
    let controls = page
        .execute(
            r##"return [document.getElementById("set-concurrency").disabled,
                        document.getElementById("apply-search-space").disabled,
                        document.getElementById("controls-reason").textContent];"##,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        controls,
        json!([
            true,
            true,
            "(disabled: the experiment is DONE, not running)"
        ])
    );
    // The downloads are what `knob experiment export` writes.
    for format in ["csv", "json"] {
        let downloaded = page
            .execute_async(
                "exportText(arguments[0]).then(arguments[1], (e) => arguments[1]('ERROR ' + e));",
                vec![json!(format)],
            )
            .await
            .unwrap();
        let (code, exported, stderr) =
            crate::run(
                sandbox
                    .knob()
                    .args(["experiment", "export", "sixty", "--format", format]),
            );
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(downloaded.as_str().unwrap(), exported, "{format}");
    }
    // One column per parameter, sorted as numbers.
    click(&page, "#trials th[data-key='param:x']").await;
    let column = page
        .execute(
            r##"const index = [...document.querySelectorAll("#trials thead th")].findIndex((th) => th.dataset.key === "param:x");
               return [...document.querySelectorAll("#trials tbody tr")].map((r) => Number(r.cells[index].textContent));"##,
            vec![],
        )
        .await
        .unwrap();
    let column: Vec<f64> = serde_json::from_value(column).unwrap();
    assert_eq!(column.len(), 60);
    assert!(
        column.windows(2).all(|w| w[0] <= w[1]),
        "not sorted by x: {column:?}"
    );

    // Best 10 by final: the 10 highest finals (the tuner maximizes), with their 5 reports.
    page.execute(
        r##"const mode = document.getElementById("curve-mode"); mode.value = "best";
           mode.dispatchEvent(new Event("change"));
           const count = document.getElementById("curve-count"); count.value = "10";
           count.dispatchEvent(new Event("change")); return true;"##,
        vec![],
    )
    .await
    .unwrap();
    let best = wait_in_page(
        &page,
        "the 10 best curves",
        r##"const option = echarts.getInstanceByDom(document.getElementById("chart-intermediate")).getOption();
           return option.series.length === 10 ? option.series.map((s) => s.name) : null;"##,
    )
    .await;
    let trials = api(&base, "GET", "/trials?limit=100", None);
    let mut finals: Vec<(f64, String)> = trials["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["final_value"].as_f64().unwrap(),
                t["trial_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(finals.len(), 60);
    finals.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut want: Vec<String> = finals[..10].iter().map(|(_, id)| id.clone()).collect();
    let mut got: Vec<String> = serde_json::from_value(best).unwrap();
    want.sort();
    got.sort();
    assert_eq!(got, want);

    // The threshold filter: every trial (all 60 allowed) whose final is at least the 20th best
    // final; and a log value axis.
    let threshold = finals[19].0;
    page.execute(
        r##"const count = document.getElementById("curve-count"); count.value = "0";
           const better = document.getElementById("curve-better"); better.value = String(arguments[0]);
           document.getElementById("curve-log").checked = true;
           better.dispatchEvent(new Event("change")); return true;"##,
        vec![json!(threshold)],
    )
    .await
    .unwrap();
    let filtered = wait_in_page(
        &page,
        "the curves above the threshold",
        r##"const option = echarts.getInstanceByDom(document.getElementById("chart-intermediate")).getOption();
           return option.yAxis[0].type === "log" ? {names: option.series.map((s) => s.name),
                   label: document.getElementById("curve-shown").textContent,
                   hover: option.series.every((s) => s.emphasis.focus === "series")} : null;"##,
    )
    .await;
    let mut got: Vec<String> = serde_json::from_value(filtered["names"].clone()).unwrap();
    let mut want: Vec<String> = finals[..20].iter().map(|(_, id)| id.clone()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "{filtered}");
    assert!(
        filtered["label"]
            .as_str()
            .unwrap()
            .starts_with("20 of 60 trials (best by final), final ≥ "),
        "{filtered}"
    );
    assert_eq!(filtered["hover"], json!(true), "{filtered}");
    screenshot(&page, "view-1-threshold").await;
    page.execute(
        r##"const better = document.getElementById("curve-better"); better.value = "";
           document.getElementById("curve-log").checked = false;
           better.dispatchEvent(new Event("change")); return true;"##,
        vec![],
    )
    .await
    .unwrap();
    wait_in_page(
        &page,
        "every curve again",
        r##"return echarts.getInstanceByDom(document.getElementById("chart-intermediate")).getOption().series.length === 60"##,
    )
    .await;

    // Clicking a point of the final-metric chart opens that trial (a real mouse click on the
    // canvas, where ECharts draws the point).
    let clicked = &finals[5].1;
    let at = page
        .execute(
            r##"const chart = echarts.getInstanceByDom(document.getElementById("chart-final"));
               const series = chart.getOption().series.findIndex((s) => s.name === "final");
               // Points are plain [trial #, final] arrays; the page's itemIds names each one's trial.
               const point = chart.getOption().series[series].data[itemIds["chart-final"][series].indexOf(arguments[0])];
               const [x, y] = chart.convertToPixel({seriesIndex: series}, point);
               document.getElementById("chart-final").scrollIntoView();
               const after = document.getElementById("chart-final").getBoundingClientRect();
               return [x - after.width / 2, y - after.height / 2];"##,
            vec![json!(clicked)],
        )
        .await
        .unwrap();
    let (dx, dy) = (at[0].as_f64().unwrap(), at[1].as_f64().unwrap());
    let canvas = page
        .find(Locator::Css("#chart-final canvas"))
        .await
        .unwrap();
    page.perform_actions(
        fantoccini::actions::MouseActions::new("mouse".to_string())
            .then(fantoccini::actions::PointerAction::MoveToElement {
                element: canvas,
                duration: None,
                x: dx,
                y: dy,
            })
            .then(fantoccini::actions::PointerAction::Down {
                button: fantoccini::actions::MOUSE_BUTTON_LEFT,
            })
            .then(fantoccini::actions::PointerAction::Up {
                button: fantoccini::actions::MOUSE_BUTTON_LEFT,
            }),
    )
    .await
    .unwrap();
    let opened = wait_in_page(
        &page,
        "the clicked trial's dialog",
        r##"return document.getElementById("detail").open && document.getElementById("detail-id").textContent || null;"##,
    )
    .await;
    assert_eq!(opened, json!(clicked));
    page.execute(
        "document.getElementById('detail').close(); return true;",
        vec![],
    )
    .await
    .unwrap();

    // A trial's dialog: the final as a number, which log is open, and a finished trial's
    // missing trial.log said as such.
    let first = &finals[0].1;
    page.find(Locator::Css(&format!(
        "#trials tbody tr[data-trial='{first}']"
    )))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    // The dialog still holds the trial opened before until this one's answers are in.
    let detail = wait_in_page(
        &page,
        "the trial dialog",
        &format!(
            r##"const rows = [...document.querySelectorAll("#detail-info tr")].map((r) => [r.cells[0].textContent, r.cells[1].textContent]);
           const name = document.getElementById("detail-log-name").textContent;
           return rows.length && name.endsWith(" {first}") ? {{rows, name}} : null;"##
        ),
    )
    .await;
    let axes = page
        .execute(
            r##"const option = echarts.getInstanceByDom(document.getElementById("chart-detail")).getOption();
               return [option.xAxis[0].name, option.yAxis[0].name];"##,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(axes, json!(["report", "intermediate result"]));
    let rows: Vec<(String, String)> = serde_json::from_value(detail["rows"].clone()).unwrap();
    let final_row = rows.iter().find(|(name, _)| name == "final").unwrap();
    assert!(
        final_row.1.parse::<f64>().is_ok(),
        "the final is not shown as a number: {rows:?}"
    );
    assert_eq!(detail["name"], json!(format!("stdout of trial {first}")));
    page.find(Locator::Css("[data-log='trial.log']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let log = wait_in_page(
        &page,
        "the trial.log answer",
        r##"const text = document.getElementById("detail-log").textContent;
           return document.getElementById("detail-log-name").textContent.startsWith("trial.log") && text.startsWith("(") ? text : null;"##,
    )
    .await;
    assert!(
        log.as_str().unwrap().contains("wrote no trial.log")
            && !log.as_str().unwrap().contains("yet"),
        "{log}"
    );
    screenshot(&page, "view-2-trial").await;
    page.execute(
        "document.getElementById('detail').close(); return true;",
        vec![],
    )
    .await
    .unwrap();

    // Compare the two best trials: ticked in the table, shown side by side with the rows that
    // differ marked and their curves overlaid; the comparison has its own URL.
    let second = &finals[1].1;
    for id in [first, second] {
        page.find(Locator::Css(&format!(
            "#trials tbody tr[data-trial='{id}'] td.select input"
        )))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    }
    page.find(Locator::Id("compare-open"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let compared = wait_in_page(
        &page,
        "the comparison",
        r##"const table = document.getElementById("compare-table");
           const chart = echarts.getInstanceByDom(document.getElementById("chart-compare"));
           if (!table.tHead || !chart) return null;
           return {trials: [...table.tHead.rows[0].cells].slice(1).map((c) => c.textContent),
                   rows: [...table.tBodies[0].rows].map((r) => [r.dataset.row, r.className === "diff", [...r.cells].slice(1).map((c) => c.textContent)]),
                   curves: chart.getOption().series.map((s) => [s.name, s.data.length]),
                   hash: location.hash};"##,
    )
    .await;
    assert_eq!(compared["trials"], json!([first, second]), "{compared}");
    let rows: Vec<(String, bool, Vec<String>)> =
        serde_json::from_value(compared["rows"].clone()).unwrap();
    let row = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().clone();
    assert_eq!(
        row("status"),
        (
            "status".to_string(),
            false,
            vec!["SUCCEEDED".to_string(), "SUCCEEDED".to_string()]
        )
    );
    assert!(row("x").1 && row("final").1, "{compared}");
    assert_eq!(
        compared["curves"],
        json!([[first, 5], [second, 5]]),
        "{compared}"
    );
    assert_eq!(
        compared["hash"],
        json!(format!("#compare={first},{second}")),
        "{compared}"
    );
    screenshot(&page, "view-3-compare").await;

    // A trial's URL opens it in a fresh page.
    page.goto(&format!("{base}/#trial={second}")).await.unwrap();
    page.refresh().await.unwrap();
    let opened = wait_in_page(
        &page,
        "the trial of the URL",
        r##"return document.getElementById("detail").open && document.getElementById("detail-id").textContent || null;"##,
    )
    .await;
    assert_eq!(opened, json!(second));
    page.execute(
        "document.getElementById('detail').close(); return true;",
        vec![],
    )
    .await
    .unwrap();

    // `knob view` exits: the page says so within a few seconds, with the last known state.
    view.kill();
    let killed = Instant::now();
    let gone = wait_in_page(
        &page,
        "the server-gone state",
        r##"const gone = document.getElementById("gone");
           return gone.hidden ? null : gone.textContent;"##,
    )
    .await;
    let took = killed.elapsed();
    // Loose for the same reason as the experiment page's server-gone check.
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let gone = gone.as_str().unwrap();
    assert!(
        gone.contains("Last known state of experiment sixty: DONE"),
        "{gone}"
    );
    assert!(gone.contains("knob view sixty"), "{gone}");
    screenshot(&page, "view-4-server-gone").await;
    page.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn knob_view_without_an_id_lists_every_experiment_and_opens_each() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let sandbox = Sandbox::new();
    for (id, name, trials) in [("first", "the first", 3), ("second", "the second", 4)] {
        let yaml = SIXTY
            .replace("sixty curves", name)
            .replace("maxTrialNumber: 60", &format!("maxTrialNumber: {trials}"));
        let config = sandbox.config(&yaml, &[("trial.py", SIXTY_TRIAL)]);
        let (code, stdout, stderr) = sandbox.create(&config, id);
        assert_eq!(code, 0, "{stdout}{stderr}");
    }
    let mut command = sandbox.knob();
    command.args(["view", "--port", "0"]);
    let view = start(command, &[]);
    let base = view.base.clone();

    let driver = start_driver(&chromedriver);
    let profile = tempfile::tempdir().unwrap();
    let page = open_browser(&driver, &chromium, profile.path()).await;
    page.goto(&format!("{base}/")).await.unwrap();
    let rows = wait_in_page(
        &page,
        "the experiment list",
        r##"const rows = [...document.querySelectorAll("#experiments tbody tr")];
           return rows.length === 2 ? rows.map((r) => [...r.cells].slice(0, 5).map((c) => c.textContent)) : null;"##,
    )
    .await;
    let rows: Vec<Vec<String>> = serde_json::from_value(rows).unwrap();
    // Newest first.
    assert_eq!(rows[0][..3], ["the second", "second", "DONE"], "{rows:?}");
    assert_eq!(rows[1][..3], ["the first", "first", "DONE"], "{rows:?}");
    assert!(rows[0][3].ends_with("maximize)"), "{rows:?}");
    assert!(rows[0][4].starts_with("4 (SUCCEEDED 4)"), "{rows:?}");
    assert!(rows[1][4].starts_with("3 (SUCCEEDED 3)"), "{rows:?}");
    screenshot(&page, "list-1-experiments").await;

    click(&page, "#experiments tr[data-experiment='first'] a").await;
    let opened = wait_in_page(
        &page,
        "the first experiment's dashboard",
        r##"const rows = document.querySelectorAll("#trials tbody tr");
           return rows.length === 3 ? [location.pathname, document.getElementById("experiment-name").textContent,
                   document.getElementById("status").textContent, document.getElementById("read-only").hidden] : null;"##,
    )
    .await;
    assert_eq!(opened, json!(["/e/first/", "the first", "DONE", false]));
    screenshot(&page, "list-2-opened").await;
    let missing = api(&format!("{base}/e/nope"), "GET", "/experiment", None);
    assert!(
        missing["error"].as_str().unwrap().contains("nope"),
        "{missing}"
    );
    // Neither page logged an error (each had, for its missing favicon).
    assert_eq!(console_errors(&driver, &page).await, Vec::<Value>::new());
    page.close().await.unwrap();
}

/// An experiment deleted (`knob experiment delete`) while its dashboard is open, under
/// `knob view ID` and under the list's `/e/ID/`: each page says it was deleted, with its last
/// known state, and not that its server is gone; it showed the deleted experiment on as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_dashboard_says_when_its_experiment_is_deleted() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let sandbox = Sandbox::new();
    let yaml = SIXTY.replace("maxTrialNumber: 60", "maxTrialNumber: 3");
    let config = sandbox.config(&yaml, &[("trial.py", SIXTY_TRIAL)]);
    let (code, stdout, stderr) = sandbox.create(&config, "doomed");
    assert_eq!(code, 0, "{stdout}{stderr}");
    let mut command = sandbox.knob();
    command.args(["view", "doomed", "--port", "0"]);
    let view = start(command, &[]);
    let mut command = sandbox.knob();
    command.args(["view", "--port", "0"]);
    let list = start(command, &[]);

    let driver = start_driver(&chromedriver);
    let mut pages = Vec::new();
    let mut profiles = Vec::new();
    for url in [
        format!("{}/", view.base),
        format!("{}/e/doomed/", list.base),
    ] {
        let profile = tempfile::tempdir().unwrap();
        let page = open_browser(&driver, &chromium, profile.path()).await;
        page.goto(&url).await.unwrap();
        // Loaded, and following the stream.
        wait_in_page(
            &page,
            "the page following its experiment",
            r##"return document.querySelectorAll("#trials tbody tr").length === 3 &&
                      document.getElementById("live").className === "live connected";"##,
        )
        .await;
        pages.push(page);
        profiles.push(profile);
    }

    let (code, stdout, stderr) =
        crate::run(
            sandbox
                .knob()
                .args(["experiment", "delete", "doomed", "--yes"]),
        );
    assert_eq!(code, 0, "{stdout}{stderr}");
    for (page, name) in pages.iter().zip(["deleted-1-view", "deleted-2-list"]) {
        let shown = wait_in_page(
            page,
            "the experiment-deleted notice",
            r##"const gone = document.getElementById("gone");
               return gone.hidden ? null : {text: gone.textContent,
                   status: document.getElementById("status").textContent,
                   error: document.getElementById("error").hidden ? null : document.getElementById("error").textContent};"##,
        )
        .await;
        let text = shown["text"].as_str().unwrap();
        assert!(
            text.starts_with("experiment doomed was deleted while this server showed it")
                && text.ends_with("Last known state of experiment doomed: DONE."),
            "{shown}"
        );
        assert!(!text.contains("server of this page is gone"), "{shown}");
        assert_eq!(shown["status"], json!("DONE (last known)"), "{shown}");
        assert_eq!(shown["error"], json!(null), "{shown}");
        screenshot(page, name).await;
    }
    for page in pages {
        page.close().await.unwrap();
    }
}

/// A finished multi-objective experiment (issue 15): error down against cost down, traded off
/// by x, and a constraint that y > 0.8 violates; reference values given in the config.
const PARETO: &str = r#"experimentName: two objectives
trialCommand: python3 trial.py
trialConcurrency: 4
maxTrialNumber: 30
searchSpace:
  x: {_type: uniform, _value: [0, 1]}
  y: {_type: uniform, _value: [0, 1]}
objectives:
  - {metric: error, mode: minimize, reference: 1.5}
  - {metric: cost, mode: minimize, reference: 2.5}
  - {metric: over, constraint: "<= 0"}
tuner:
  name: Random
  classArgs: {seed: 3}
trainingService:
  platform: local"#;

const PARETO_TRIAL: &str = r#"import json, os
p = json.loads(os.environ["KNOB_PARAMETERS"])
x, y = p["x"], p["y"]
print("KNOB_FINAL", json.dumps({"error": x, "cost": 1 - x ** 0.5 + y, "over": y - 0.8}))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pareto_chart_highlights_the_front_and_the_hypervolume_grows() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let sandbox = Sandbox::new();
    let config = sandbox.config(PARETO, &[("trial.py", PARETO_TRIAL)]);
    let (code, stdout, stderr) = sandbox.create(&config, "pareto");
    assert_eq!(code, 0, "{stdout}{stderr}");
    let mut command = sandbox.knob();
    command.args(["view", "pareto", "--port", "0"]);
    let view = start(command, &[]);
    let base = view.base.trim_end_matches("/api/v1").to_string();

    // What the page must show, from the API.
    let pareto = api(&base, "GET", "/pareto", None);
    let entries = pareto["trials"].as_array().unwrap();
    let point = |t: &Value| json!([t["values"][0], t["values"][1]]);
    let sorted = |mut points: Vec<Value>| {
        points.sort_by_key(|p| p.to_string());
        points
    };
    let front = sorted(
        entries
            .iter()
            .filter(|t| t["pareto"] == true)
            .map(point)
            .collect(),
    );
    let infeasible = entries.iter().filter(|t| t["feasible"] == false).count();
    assert!(
        front.len() >= 2 && infeasible >= 1,
        "the experiment should have a front and an infeasible trial: {pareto}"
    );

    let driver = start_driver(&chromedriver);
    let profile = tempfile::tempdir().unwrap();
    let page = open_browser(&driver, &chromium, profile.path()).await;
    page.goto(&format!("{base}/")).await.unwrap();
    page.execute(
        "document.getElementById('pareto-card').scrollIntoView(); return true;",
        vec![],
    )
    .await
    .unwrap();
    // The front's points are drawn in the highlight colour: the canvas pixel at each one's
    // centre is amber (#f59e0b), not just an option set.
    let shown = wait_in_page(
        &page,
        "the Pareto chart",
        r##"const card = document.getElementById("pareto-card");
           const chart = echarts.getInstanceByDom(document.getElementById("chart-pareto"));
           const hv = echarts.getInstanceByDom(document.getElementById("chart-hypervolume"));
           if (card.hidden || !chart || !hv) return null;
           const option = chart.getOption();
           const byName = Object.fromEntries(option.series.map((s) => [s.name, s]));
           const canvas = document.querySelector("#chart-pareto canvas");
           const ratio = canvas.width / canvas.clientWidth;
           const pixels = byName["Pareto front"].data.map((p) => {
             const [x, y] = chart.convertToPixel({seriesName: "Pareto front"}, p);
             return [...canvas.getContext("2d").getImageData(Math.round(x * ratio), Math.round(y * ratio), 1, 1).data].slice(0, 3);
           });
           return {front: byName["Pareto front"].data, symbol: byName["Pareto front"].symbol,
                   trials: byName["trials"].data.length, infeasible: byName["infeasible"].data.length,
                   line: byName["front line"].data.length, pixels,
                   x: option.xAxis[0].name, y: option.yAxis[0].name,
                   note: document.getElementById("pareto-note").textContent,
                   hv: hv.getOption().series[0].data,
                   reference: document.getElementById("hypervolume-reference").textContent};"##,
    )
    .await;
    let drawn: Vec<Value> = serde_json::from_value(shown["front"].clone()).unwrap();
    assert_eq!(sorted(drawn), front, "{shown}");
    assert_eq!(shown["symbol"], json!("diamond"), "{shown}");
    assert_eq!(shown["infeasible"], json!(infeasible), "{shown}");
    assert_eq!(
        shown["trials"].as_u64().unwrap() as usize + front.len() + infeasible,
        entries.len(),
        "{shown}"
    );
    assert_eq!(shown["line"], json!(front.len()), "the staircase: {shown}");
    for pixel in shown["pixels"].as_array().unwrap() {
        let rgb: Vec<i64> = serde_json::from_value(pixel.clone()).unwrap();
        let amber = [245, 158, 11];
        assert!(
            rgb.iter().zip(amber).all(|(c, a)| (c - a).abs() <= 40),
            "a front point is not drawn amber: {pixel} in {shown}"
        );
    }
    assert_eq!(shown["x"], json!("error (min)"), "{shown}");
    assert_eq!(shown["y"], json!("cost (min)"), "{shown}");
    assert!(
        shown["note"].as_str().unwrap().starts_with(&format!(
            "({} of {} on the front",
            front.len(),
            entries.len()
        )),
        "{shown}"
    );
    // Hypervolume after each succeeded trial, never falling, ending at the API's last value,
    // against the reference point the config gives.
    let hv: Vec<(f64, f64)> = serde_json::from_value(shown["hv"].clone()).unwrap();
    assert_eq!(hv.len(), entries.len(), "{shown}");
    assert!(hv.windows(2).all(|w| w[1].1 >= w[0].1), "{shown}");
    let last = pareto["hypervolume"].as_array().unwrap().last().unwrap()["hypervolume"]
        .as_f64()
        .unwrap();
    assert!(
        last > 0.0 && (hv.last().unwrap().1 - last).abs() < 1e-12,
        "{shown}"
    );
    assert_eq!(
        shown["reference"],
        json!("reference point: error = 1.5, cost = 2.5 (from the config's objectives)")
    );
    screenshot(&page, "pareto-1-front").await;

    // Choosing the constraint for the y axis redraws the scatter without the staircase.
    page.execute(
        "const s = document.getElementById('pareto-y'); s.value = '2'; s.dispatchEvent(new Event('change')); return true;",
        vec![],
    )
    .await
    .unwrap();
    let switched = wait_in_page(
        &page,
        "the scatter against the constraint",
        r##"const option = echarts.getInstanceByDom(document.getElementById("chart-pareto")).getOption();
           return option.yAxis[0].name.startsWith("over") ? {y: option.yAxis[0].name,
             line: option.series.find((s) => s.name === "front line").data.length,
             front: option.series.find((s) => s.name === "Pareto front").data.length} : null;"##,
    )
    .await;
    assert_eq!(
        switched,
        json!({"y": "over (constraint <= 0)", "line": 0, "front": front.len()})
    );
    screenshot(&page, "pareto-2-constraint").await;
    page.close().await.unwrap();
}

/// A population (PBT) member's trial view: the links to the member it was cloned from (with the
/// step) and to the one it replaced, and its schedule table (each ancestor from the step it took
/// over, with its parameters), all as the API gives them, from a real run of `examples/pbt`;
/// the parent's link opens the parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pbt_members_view_shows_its_lineage_and_the_schedule_of_its_parameters() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let sandbox = Sandbox::new();
    let root = crate::repo_root().join("examples/pbt");
    let trial = std::fs::read_to_string(root.join("trial.py")).unwrap();
    let yaml = std::fs::read_to_string(root.join("config.yml"))
        .unwrap()
        .replace("maxExperimentDuration: 10m", "maxExperimentDuration: 3m");
    let config = sandbox.config(&yaml, &[("trial.py", &trial)]);
    let (code, stdout, stderr) = crate::run(
        sandbox
            .knob()
            .env("PBT_STEP_SECONDS", "0.05")
            .args(["create", "--id", "pbtv", "--config"])
            .arg(&config),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let mut command = sandbox.knob();
    command.args(["view", "pbtv", "--port", "0"]);
    let view = start(command, &[]);
    let base = view.base.trim_end_matches("/api/v1").to_string();

    // The member to look at: the successor with the longest schedule (a clone of a clone, if
    // there is one), as the API gives it.
    let trials = api(&base, "GET", "/trials", None);
    let rows = trials
        .as_array()
        .or_else(|| trials["trials"].as_array())
        .unwrap_or_else(|| panic!("{trials}"));
    let member = rows
        .iter()
        .map(|t| {
            let id = t["trial_id"].as_str().or(t["id"].as_str()).unwrap();
            api(&base, "GET", &format!("/trials/{id}"), None)
        })
        .filter(|t| t["lineage"]["parent"].is_string())
        .max_by_key(|t| t["schedule"].as_array().map_or(0, Vec::len))
        .unwrap_or_else(|| panic!("no member was replaced: {trials}"));
    let id = member["trial_id"].as_str().unwrap().to_string();
    let parent = member["lineage"]["parent"].as_str().unwrap().to_string();
    let replaces = member["lineage"]["replaces"].as_str().unwrap().to_string();
    let parent_step = member["lineage"]["parent_step"].as_u64().unwrap();
    let schedule = member["schedule"].as_array().unwrap().clone();
    assert!(schedule.len() >= 2, "{member:#}");
    assert_eq!(
        schedule.last().unwrap()["trial_id"],
        json!(id),
        "{member:#}"
    );

    let driver = start_driver(&chromedriver);
    let profile = tempfile::tempdir().unwrap();
    let page = open_browser(&driver, &chromium, profile.path()).await;
    page.goto(&format!("{base}/#trial={id}")).await.unwrap();
    let shown = wait_in_page(
        &page,
        "the member's lineage and schedule",
        &format!(
            r##"const name = document.getElementById("detail-log-name").textContent;
           const table = document.querySelector("#detail-info table.schedule");
           if (!name.endsWith(" {id}") || !table) return null;
           const rows = [...document.querySelectorAll("#detail-info > tbody > tr, #detail-info > tr")]
             .filter((r) => r.cells.length >= 2 && !r.closest("table.schedule"))
             .map((r) => [r.cells[0].textContent, r.cells[1].textContent]);
           const lines = [...table.rows].map((r) => [...r.cells].map((c) => c.textContent));
           const links = [...document.querySelectorAll("#detail-info a.lineage-link")].map((a) => a.textContent);
           return {{rows, lines, links}};"##
        ),
    )
    .await;
    let rows: Vec<(String, String)> = serde_json::from_value(shown["rows"].clone()).unwrap();
    let row = |name: &str| {
        rows.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} row: {shown}"))
    };
    assert_eq!(
        row("cloned from"),
        format!("{parent} at step {parent_step}")
    );
    assert_eq!(row("replaces"), replaces);
    assert_eq!(shown["links"], json!([parent, replaces]), "{shown}");
    // The schedule: a header, then one line per stage, oldest first, with its parameters.
    let lines: Vec<Vec<String>> = serde_json::from_value(shown["lines"].clone()).unwrap();
    let names: Vec<String> = lines[0][2..].to_vec();
    assert_eq!(lines[0][..2], ["from step", "trial"], "{shown}");
    let mut expected_names: Vec<String> = schedule.last().unwrap()["parameters"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    expected_names.sort();
    let mut sorted_names = names.clone();
    sorted_names.sort();
    assert_eq!(sorted_names, expected_names, "{shown}");
    assert_eq!(lines.len(), schedule.len() + 1, "{shown}");
    for (line, stage) in lines[1..].iter().zip(&schedule) {
        assert_eq!(line[0], stage["from_step"].to_string(), "{shown}");
        assert_eq!(line[1], stage["trial_id"].as_str().unwrap(), "{shown}");
        for (cell, name) in line[2..].iter().zip(&names) {
            let want = stage["parameters"][name].as_f64().unwrap();
            let got: f64 = cell
                .parse()
                .unwrap_or_else(|_| panic!("{name} of {line:?} is no number: {shown}"));
            assert!(
                (got - want).abs() <= 1e-5 * want.abs().max(1e-12),
                "{name} of {}: shown {got}, API {want}",
                stage["trial_id"]
            );
        }
    }
    // The last stage started at the step the member was cloned at, from its parent's line.
    assert_eq!(lines.last().unwrap()[0], parent_step.to_string());
    assert_eq!(lines[lines.len() - 2][1], parent, "{shown}");
    screenshot(&page, "pbt-1-lineage").await;

    // The parent's link opens the parent.
    click(&page, "#detail-info a.lineage-link").await;
    wait_in_page(
        &page,
        "the parent's view",
        &format!(
            r##"return document.getElementById("detail-log-name").textContent.endsWith(" {parent}");"##
        ),
    )
    .await;
    screenshot(&page, "pbt-2-parent").await;
    page.close().await.unwrap();
}

/// Trials that end quickly, four at a time, up to the end of the run, once the file `go` is in
/// the code folder (at most 30 s): the test makes it when the page is live, as a run of 3 s had
/// ended before a loaded machine's browser opened the page (connection refused).
const QUICK: &str = r#"experimentName: quick end
searchSpace:
  x: {_type: uniform, _value: [0, 1]}
trialCommand: 'for i in $(seq 600); do [ -e go ] && break; sleep 0.05; done; sleep 0.3; echo "KNOB_FINAL $NNI_TRIAL_SEQ_ID"'
trialConcurrency: 4
maxTrialNumber: 40
tuner: {name: Random, classArgs: {seed: 3}}
trainingService: {platform: local}"#;

/// A page open on `knob create` from the start ends on the experiment's end as the store has
/// it: DONE, every trial SUCCEEDED. Its process had exited right after recording the end, and
/// the page, refreshing at most once a second, kept the last second before it: "RUNNING (last
/// known)" with four trials running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_followed_knob_create_ends_on_the_experiments_end() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let sandbox = Sandbox::new();
    let config = sandbox.config(QUICK, &[]);
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let mut experiment = start(command, &["--id", "quick", "--port", "0"]);
    let base = experiment.base.trim_end_matches("/api/v1").to_string();

    let driver = start_driver(&chromedriver);
    let profile = tempfile::tempdir().unwrap();
    let page = open_browser(&driver, &chromium, profile.path()).await;
    page.goto(&format!("{base}/")).await.unwrap();
    wait_in_page(
        &page,
        "the live badge",
        "return document.getElementById('live').textContent === '● live'",
    )
    .await;
    std::fs::write(sandbox.path().join("code").join("go"), "").unwrap();
    let started = Instant::now();
    let exit = tokio::task::spawn_blocking(move || experiment.wait_exit(Duration::from_secs(120)))
        .await
        .unwrap()
        .expect("knob create did not end within 120 s");
    assert!(exit.success(), "{exit:?}");
    let ended = wait_in_page(
        &page,
        "the page to say its server is gone",
        r##"if (document.getElementById("gone").hidden) return null;
           return {status: document.getElementById("status").textContent,
                   counts: document.getElementById("counts").textContent,
                   rows: [...document.querySelectorAll("#trials tbody tr .badge")].map((b) => b.textContent)};"##,
    )
    .await;
    screenshot(&page, "end-1-done").await;
    assert_eq!(ended["status"], json!("DONE (last known)"), "{ended}");
    assert_eq!(ended["counts"], json!("SUCCEEDED 40"), "{ended}");
    let rows = ended["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 40, "{ended}");
    assert!(rows.iter().all(|r| r == "SUCCEEDED"), "{ended}");
    println!(
        "the run ended {:?} after the page went live",
        started.elapsed()
    );
    page.close().await.unwrap();
}

/// A token with a `%` that begins no escape, given in the URL as the README says
/// (`#token=T`): the dashboard and the list read with it. `decodeURIComponent` threw on it,
/// and neither page showed anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_with_a_bare_percent_opens_the_dashboard_and_the_list() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let sandbox = Sandbox::new();
    let config = sandbox.config(
        &CLASHING.replace("maxTrialNumber: 4", "maxTrialNumber: 2"),
        &[],
    );
    let (code, stdout, stderr) = sandbox.create(&config, "percent");
    assert_eq!(code, 0, "{stdout}{stderr}");
    let token = "50%off";
    let mut command = sandbox.knob();
    command.args(["view", "percent", "--port", "0", "--token", token]);
    let view = start(command, &[]);
    let mut command = sandbox.knob();
    command.args(["view", "--port", "0", "--token", token]);
    let list = start(command, &[]);

    let driver = start_driver(&chromedriver);
    let profile = tempfile::tempdir().unwrap();
    let page = open_browser(&driver, &chromium, profile.path()).await;
    page.goto(&format!("{}/#token={token}", view.base))
        .await
        .unwrap();
    let rows = wait_in_page(
        &page,
        "the trials, read with the token",
        r##"const rows = document.querySelectorAll("#trials tbody tr");
           return rows.length === 2 ? rows.length : null;"##,
    )
    .await;
    assert_eq!(rows, json!(2));
    page.goto(&format!("{}/#token={token}", list.base))
        .await
        .unwrap();
    let listed = wait_in_page(
        &page,
        "the experiment list, read with the token",
        r##"const rows = document.querySelectorAll("#experiments tbody tr");
           return rows.length === 1 ? rows[0].dataset.experiment : null;"##,
    )
    .await;
    assert_eq!(listed, json!("percent"));
    page.close().await.unwrap();
}

/// Parameters whose names would clash once flattened, and one named `__proto__`.
const CLASHING: &str = r#"experimentName: clashing names
searchSpace:
  opt:
    _type: choice
    _value:
      - {_name: sgd, lr: {_type: uniform, _value: [0, 1]}}
  opt.lr: {_type: uniform, _value: [5, 6]}
  "opt/lr": {_type: uniform, _value: [7, 8]}
  __proto__: {_type: choice, _value: [[1, 2], [3, 4]]}
trialCommand: 'echo "KNOB_FINAL $NNI_TRIAL_SEQ_ID"'
trialConcurrency: 2
maxTrialNumber: 4
tuner: {name: Random, classArgs: {seed: 4}}
trainingService: {platform: local}"#;

/// Every parameter has its own column, named as the CSV export names it, in the table, the
/// trial's view and the comparison: the nested `opt/lr` beside the top-level `opt.lr` (which
/// had taken its column) and `opt/lr` (`opt~1lr`), and `__proto__` (which had set the
/// prototype of the page's parameter objects instead, and through ECharts' text cache given
/// every object of the page `prev`/`next`). A healthy page logs no console error (a missing
/// favicon had, on every load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clashing_and_proto_parameter_names_each_show_on_the_page() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let sandbox = Sandbox::new();
    let config = sandbox.config(CLASHING, &[]);
    let (code, stdout, stderr) = sandbox.create(&config, "clash");
    assert_eq!(code, 0, "{stdout}{stderr}");
    let mut command = sandbox.knob();
    command.args(["view", "clash", "--port", "0"]);
    let view = start(command, &[]);
    let base = view.base.trim_end_matches("/api/v1").to_string();
    let trial = api(&base, "GET", "/trials?limit=1", None)["trials"][0].clone();
    let id = trial["trial_id"].as_str().unwrap().to_string();
    let parameters = &trial["parameters"];

    let driver = start_driver(&chromedriver);
    let profile = tempfile::tempdir().unwrap();
    let page = open_browser(&driver, &chromium, profile.path()).await;
    page.goto(&format!("{base}/")).await.unwrap();
    let table = wait_in_page(
        &page,
        "the table and the charts",
        &r##"if (!window.__knobChartsDrawn || document.querySelectorAll("#trials tbody tr").length !== 4) return null;
           const names = [...document.querySelectorAll("#trials thead th.param")].map((th) => th.textContent);
           const row = document.querySelector(`#trials tbody tr[data-trial="__ID__"]`);
           const cells = [...row.querySelectorAll("td.param")].map((td) => td.textContent);
           return names.map((name, i) => [name, cells[i]]);"##
            .replace("__ID__", &id),
    )
    .await;
    // As pairs: an object's `__proto__` key would not come through WebDriver.
    let table: serde_json::Map<String, Value> = table
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| (pair[0].as_str().unwrap().to_string(), pair[1].clone()))
        .collect();
    let table = Value::Object(table);
    let shown = |value: &Value| match value {
        Value::Number(n) => {
            let n = n.as_f64().unwrap();
            format!("{}", (n * 1e5).round() / 1e5)
        }
        other => other
            .as_str()
            .map(str::to_string)
            .unwrap_or(other.to_string()),
    };
    let mut names: Vec<&str> = table
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["__proto__", "opt.lr", "opt/_name", "opt/lr", "opt~1lr"],
        "{table}"
    );
    assert_eq!(
        table["__proto__"],
        json!(if parameters["__proto__"] == json!([1, 2]) {
            "1,2"
        } else {
            "3,4"
        })
    );
    assert!(
        shown(&parameters["opt"]["lr"]).starts_with(&table["opt/lr"].as_str().unwrap()[..4]),
        "{table} {parameters}"
    );
    assert!(
        table["opt.lr"].as_str().unwrap().starts_with('5'),
        "{table}"
    );
    assert!(
        table["opt~1lr"].as_str().unwrap().starts_with('7'),
        "{table}"
    );

    // The trial's view and the comparison (both read the trial whole, nested) name them alike.
    page.goto(&format!("{base}/#trial={id}")).await.unwrap();
    let detail = wait_in_page(
        &page,
        "the trial's view",
        r##"const rows = [...document.querySelectorAll("#detail-info tr")].map((r) => r.cells.length ? r.querySelector("th").textContent : "");
           return document.getElementById("detail").open && rows.includes("final") ? rows.filter((n) => n.includes("opt") || n.includes("proto")) : null;"##,
    )
    .await;
    let mut detail: Vec<String> = serde_json::from_value(detail).unwrap();
    detail.sort();
    assert_eq!(
        detail,
        ["__proto__", "opt.lr", "opt/_name", "opt/lr", "opt~1lr"]
    );
    // Nothing leaked into Object.prototype.
    let clean = page
        .execute(
            "const inherited = []; for (const k in {}) inherited.push(k); return [inherited, Object.getOwnPropertyNames(Object.prototype).filter((k) => k === 'next' || k === 'prev')];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(clean, json!([[], []]));
    assert_eq!(console_errors(&driver, &page).await, Vec::<Value>::new());
    page.close().await.unwrap();
}

/// A kill clicked on the page for a trial whose host cannot be reached says, on the page, that
/// it is recorded and not carried out yet (the API's 202), until the trial is shown ended once
/// the host answers again. The page took the 202 as done and said nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_the_host_cannot_carry_out_yet_is_said_on_the_page_until_it_is() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let Some(sshd) = crate::remote::sshd::sshd_binary() else {
        return;
    };
    use crate::remote::{
        environment_id, key_host, running_on, stored_events, unreachable_host_config, wait_for,
        wait_until,
    };
    let mut host = key_host(&sshd, &[]);
    let sandbox = Sandbox::new();
    let config = unreachable_host_config(&sandbox, &host, "sleep 300", "");
    let mut command = sandbox.knob();
    command.arg("create").arg("--config").arg(&config);
    let mut experiment = start(command, &["--id", "pagekill", "--port", "0"]);
    let base = experiment.base.trim_end_matches("/api/v1").to_string();
    let env = environment_id(&host);
    wait_for(&sandbox, "pagekill", "both trials running", |e| {
        running_on(e, &env) == 2
    });

    let driver = start_driver(&chromedriver);
    let profile = tempfile::tempdir().unwrap();
    let page = open_browser(&driver, &chromium, profile.path()).await;
    page.goto(&format!("{base}/")).await.unwrap();
    wait_in_page(
        &page,
        "two running trials in the table",
        "return document.querySelectorAll('#trials tbody tr .badge.RUNNING').length === 2",
    )
    .await;
    host.cut_link();
    wait_until("the host reported unreachable", || {
        stored_events(&sandbox, "pagekill", "warning", "is not ready") > 0
    });
    let (victim, _) = table(&page).await.into_iter().next().expect("a trial row");
    click(
        &page,
        &format!("#trials tbody tr[data-trial='{victim}'] button.kill"),
    )
    .await;
    let notice = wait_in_page(
        &page,
        "the pending kill said on the page",
        "const n = document.getElementById('notice'); return n.hidden ? null : n.textContent",
    )
    .await;
    assert_eq!(
        notice,
        json!(format!(
            "trial {victim}: kill recorded, not yet carried out: 127.0.0.1:{} cannot be reached; knob kills the trial when it answers",
            host.port()
        ))
    );
    screenshot(&page, "kill-pending").await;
    host.restart().expect("sshd starts again");
    wait_in_page(
        &page,
        "the killed trial shown USER_CANCELED and the notice gone",
        &format!(
            "return document.querySelector(\"#trials tbody tr[data-trial='{victim}'] .badge\").textContent === 'USER_CANCELED' \
             && document.getElementById('notice').hidden"
        ),
    )
    .await;
    assert!(console_errors(&driver, &page).await.is_empty());
    page.close().await.unwrap();
    let (status, body) = crate::api::send(&experiment.base, "POST", "/experiment/stop", "");
    assert_eq!(status, 202, "{body}");
    assert!(experiment.wait_exit(Duration::from_secs(120)).is_some());
}
