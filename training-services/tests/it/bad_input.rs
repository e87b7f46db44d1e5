//! Trials that print garbage, NaN or huge lines: tolerated, warned about, nothing else lost.

use knob_plugin_api::service::MetricKind;

use crate::support::*;

#[test]
fn garbage_nan_and_10_mb_lines_are_warned_about_and_nothing_else_is_lost() {
    let mut h = Harness::new();
    let command = r#"
        echo "ordinary output is not a metric"
        echo "KNOB_FINAL banana"
        echo "KNOB_INTERMEDIATE 1"
        printf 'KNOB_INTERMEDIATE '; head -c 10485760 /dev/zero | tr '\0' '7'; echo
        echo "KNOB_INTERMEDIATE NaN"
        head -c 10485760 /dev/zero | tr '\0' 'x'; echo
        echo 'KNOB_INTERMEDIATE {"loss": 2}'
        echo 'KNOB_INTERMEDIATE {"default": "low"}'
        echo "KNOB_INTERMEDIATE 2"
        echo "garbage in the metrics file" >> "$KNOB_METRICS_FILE"
        { printf 'KNOB_FINAL '; head -c 10485760 /dev/zero | tr '\0' '8'; echo; } >> "$KNOB_METRICS_FILE"
        echo "KNOB_FINAL 0.5" >> "$KNOB_METRICS_FILE"
        echo "still running" >&2
    "#;
    let events = h.run(h.request("noisy", command));
    // Every byte of stdout reaches its file, over many reads of the pump's buffer.
    let printed: usize = [
        "ordinary output is not a metric\n",
        "KNOB_FINAL banana\n",
        "KNOB_INTERMEDIATE 1\n",
        "KNOB_INTERMEDIATE \n",
        "KNOB_INTERMEDIATE NaN\n",
        "\n",
        "KNOB_INTERMEDIATE {\"loss\": 2}\n",
        "KNOB_INTERMEDIATE {\"default\": \"low\"}\n",
        "KNOB_INTERMEDIATE 2\n",
    ]
    .iter()
    .map(|line| line.len())
    .sum::<usize>()
        + 2 * 10_485_760;
    let stdout = std::fs::metadata(h.trial_dir("noisy").join("stdout")).unwrap();
    assert_eq!(stdout.len(), printed as u64);
    // stdout and the metrics file are read side by side, so compare each source in order.
    let of_kind = |kind| {
        metrics(&events)
            .into_iter()
            .filter(|m| m.0 == kind)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        of_kind(MetricKind::Intermediate),
        [
            (MetricKind::Intermediate, 0, "1".into()),
            (MetricKind::Intermediate, 1, "NaN".into()),
            // An object without "default" is passed on: the core judges it (a multi-objective
            // trial's metrics have none).
            (MetricKind::Intermediate, 2, r#"{"loss": 2}"#.into()),
            // Other JSON is kept as sent, as NNI's channels keep it: the core records it
            // without a value and says why.
            (MetricKind::Intermediate, 3, r#"{"default": "low"}"#.into()),
            (MetricKind::Intermediate, 4, "2".into()),
        ]
    );
    // The unreadable final is passed on as sent (the core records it and tells the user); which
    // of the two comes first depends on which source is read first.
    let mut finals: Vec<String> = of_kind(MetricKind::Final)
        .into_iter()
        .map(|m| m.2)
        .collect();
    finals.sort();
    assert_eq!(finals, ["0.5", "banana"]);
    let all_warnings = warnings(&events);
    let from = |source: &str| {
        all_warnings
            .iter()
            .filter(|w| w.contains(source))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        from("stdout"),
        [
            "trial noisy: a stdout line over 1024 KiB was skipped (metrics must be short; log bulky data to a file)",
        ]
    );
    assert_eq!(
        from("metrics.knob"),
        [
            "trial noisy: line garbage in the metrics file in metrics.knob ignored: expected `KNOB_INTERMEDIATE <json>` or `KNOB_FINAL <json>`",
            "trial noisy: a metrics.knob line over 1024 KiB was skipped (metrics must be short; log bulky data to a file)",
        ]
    );
    assert_eq!(all_warnings.len(), 3);
    let (code, _, _, tail) = ending(&events);
    assert_eq!((code, tail.as_str()), (Some(0), "still running"));
    // The log keeps everything the trial printed, the huge lines included.
    let stdout_size = std::fs::metadata(h.trial_dir("noisy").join("stdout"))
        .unwrap()
        .len();
    assert!(stdout_size > 20 << 20, "{stdout_size}");
}

#[test]
fn a_flood_of_bad_lines_is_reported_in_bounded_form() {
    let mut h = Harness::new();
    let command = r#"for i in $(seq 1 500); do echo "KNOB_FINAL oops$i"; done; echo KNOB_FINAL 3"#;
    let events = h.run(h.request("flood", command));
    // The first bad final is passed on as the trial's final; the others are warnings.
    assert_eq!(
        metrics(&events),
        [
            (MetricKind::Final, 0, "oops1".into()),
            (MetricKind::Final, 1, "3".into())
        ]
    );
    let warned = warnings(&events);
    assert_eq!(warned.len(), 101);
    assert_eq!(warned[100], "trial flood: 399 more warnings were not shown");
}

/// A trial folder on a full disk (its `parameter.cfg` a link to `/dev/full`, which answers every
/// write with ENOSPC as a full filesystem does): the start says the disk is full and that the
/// trial was not started, on which the core tries it again after a pause rather than failing it
/// (a full disk on a remote host failed every trial left in the experiment within a second);
/// with room again the same start runs.
#[test]
fn a_start_on_a_full_disk_says_so_and_that_the_trial_was_not_started() {
    let mut h = Harness::new();
    let dir = h.trial_dir("full");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink("/dev/full", dir.join("parameter.cfg")).unwrap();
    let error = h
        .service
        .start(&h.request("full", "echo KNOB_FINAL 1"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("No space left on device")
            && error.contains("the disk under the trial's folder is full")
            && error.ends_with("the trial was not started"),
        "{error}"
    );
    std::fs::remove_file(dir.join("parameter.cfg")).unwrap();
    let events = h.run(h.request("full", "echo KNOB_FINAL 1"));
    assert_eq!(ending(&of_trial(&events, "full")).0, Some(0), "{events:?}");
}
