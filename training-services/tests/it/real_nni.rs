//! A real `import nni` script against the service, over both NNI channels. Runs only when
//! `KNOB_TEST_NNI_PYTHON` names a Python that has `nni` installed (CI sets it up); see
//! `prerequisite.rs`.

use knob_plugin_api::metric::parse_lenient;
use knob_plugin_api::service::MetricKind;
use serde_json::{json, Value};

use crate::support::*;

#[test]
fn unmodified_nni_script_works_over_the_v3_and_the_file_channel() {
    let Some(python) = crate::prerequisite::NNI_PYTHON.path() else {
        return;
    };
    let python = python.display().to_string();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/nni_trial.py");
    let version = std::process::Command::new(&python)
        .args(["-c", "import nni; print(nni.__version__)"])
        .output()
        .expect("KNOB_TEST_NNI_PYTHON runs");
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let mut h = Harness::new();
    // nni 3.0 takes the v3 channel when NNI_TRIAL_COMMAND_CHANNEL is set; without it (and in
    // nni 2.x) it takes the file channel.
    let channels = [
        ("viaHttp", format!("'{python}' '{}'", script.display())),
        (
            "viaFile",
            format!(
                "env -u NNI_TRIAL_COMMAND_CHANNEL '{python}' '{}'",
                script.display()
            ),
        ),
    ];
    for (index, (trial_id, command)) in channels.iter().enumerate() {
        let x = 1.25 + index as f64;
        let mut request = h.request(trial_id, command);
        request.parameters = json!({"x": x, "name": trial_id});
        let events = h.run(request);
        let (code, _, _, stderr) = ending(&events);
        assert_eq!(code, Some(0), "{trial_id} failed: {stderr}");
        let dir = h.trial_dir(trial_id);
        let received: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("received.json")).unwrap())
                .unwrap();
        assert_eq!(received, json!({"x": x, "name": trial_id}));

        let found = metrics(&events);
        let kinds_and_sequences: Vec<(MetricKind, u64)> =
            found.iter().map(|m| (m.0, m.1)).collect();
        assert_eq!(
            kinds_and_sequences,
            [
                (MetricKind::Intermediate, 0),
                (MetricKind::Intermediate, 1),
                (MetricKind::Intermediate, 2),
                (MetricKind::Intermediate, 3),
                (MetricKind::Final, 0),
            ],
            "{trial_id}: {events:#?}"
        );
        let numbers: Vec<f64> = found[..3]
            .iter()
            .map(|m| parse_lenient(&m.2).unwrap().as_f64().unwrap())
            .collect();
        assert_eq!(numbers, [0.0, x, 2.0 * x]);
        assert_eq!(found[3].2, "NaN");
        let last = parse_lenient(&found[4].2).unwrap();
        assert_eq!(last, json!({"default": x, "steps": 3}));
        assert_eq!(warnings(&events), Vec::<String>::new(), "{trial_id}");
        // nni 3 must really have used the HTTP channel when it was offered (nni 2 never does).
        // Not created by knob for a trial that ends within `tail::WATCH_AFTER`.
        let file_metrics = std::fs::metadata(dir.join(".nni/metrics")).map_or(0, |m| m.len());
        if *trial_id == "viaHttp" && version.starts_with('3') {
            assert_eq!(file_metrics, 0, "nni {version} wrote .nni/metrics");
        } else {
            assert!(file_metrics > 0, "nni {version} wrote no .nni/metrics");
        }
        let log = std::fs::read_to_string(dir.join("trial.log")).unwrap_or_default();
        assert!(log.contains("finished"), "{trial_id}: trial.log: {log}");
    }
}

/// A trial that imports real nni (for `nni.get_trial_id()`, or through a library) but reports
/// with knob's `KNOB_` lines: nni sends its stdout to trial.log, which knob did not read, so
/// every result was lost without a word. They are read from there now, with a warning.
#[test]
fn knob_lines_printed_under_real_nni_are_read_from_trial_log() {
    let Some(python) = crate::prerequisite::NNI_PYTHON.path() else {
        return;
    };
    let script = "import nni, json, os\n\
                  print('trial', nni.get_trial_id(), flush=True)\n\
                  x = json.loads(os.environ['KNOB_PARAMETERS'])['x']\n\
                  print('KNOB_INTERMEDIATE 0.5', flush=True)\n\
                  print('KNOB_INTERMEDIATE', x, flush=True)\n\
                  print(f'KNOB_FINAL {x}', flush=True)\n";
    let mut h = Harness::new();
    let file = h.code_dir().join("under_nni.py");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, script).unwrap();
    let mut request = h.request(
        "underNni",
        &format!("'{}' '{}'", python.display(), file.display()),
    );
    request.parameters = json!({"x": 0.25});
    let events = h.run(request);
    let (code, _, _, stderr) = ending(&events);
    assert_eq!(code, Some(0), "{stderr}");
    let log = std::fs::read_to_string(h.trial_dir("underNni").join("trial.log")).unwrap();
    assert!(log.contains("PRINT KNOB_FINAL 0.25"), "trial.log: {log}");
    let found: Vec<(MetricKind, String)> = metrics(&events)
        .into_iter()
        .map(|m| (m.0, m.2.clone()))
        .collect();
    assert_eq!(
        found,
        [
            (MetricKind::Intermediate, "0.5".to_string()),
            (MetricKind::Intermediate, "0.25".to_string()),
            (MetricKind::Final, "0.25".to_string()),
        ],
        "{events:#?}"
    );
    let warnings = warnings(&events);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("read from trial.log"), "{warnings:?}");
}
