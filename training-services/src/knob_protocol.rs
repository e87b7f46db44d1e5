//! knob's own trial protocol, for any language and no library.
//!
//! - Parameters: the JSON object in env var `KNOB_PARAMETERS` (left out when it is over
//!   [`MAX_ENV_PARAMETERS_BYTES`]) and always in the file `$KNOB_PARAMETERS_FILE`
//!   (`<trial_dir>/parameters.json`).
//! - Metrics: a line `KNOB_INTERMEDIATE <json>` or `KNOB_FINAL <json>` on stdout, or the same
//!   line appended to `$KNOB_METRICS_FILE` (`<trial_dir>/metrics.knob`). `<json>` is a number
//!   (NaN, Infinity and -Infinity allowed, and a whole `nan`, `inf` or `-inf` as Python prints
//!   one) or an object: with a numeric `"default"`, or for a multi-objective experiment the
//!   metrics its `objectives` list (an object without `"default"` is passed on: the core
//!   judges it). An intermediate result of other JSON (a string, `null`) is kept as sent,
//!   without a value, as NNI's channels keep it; an unusable final ends the trial's result.
//! - Also set: `KNOB_TRIAL_ID`, `KNOB_TRIAL_DIR`.

use knob_plugin_api::service::MetricKind;
use serde_json::Value;

use knob_plugin_api::metric::{parse_json_lenient, INF, NAN, NEG_INF};

use crate::metrics::{excerpt, TrialRecorder};

pub const PARAMETERS_ENV: &str = "KNOB_PARAMETERS";
pub const PARAMETERS_FILE_ENV: &str = "KNOB_PARAMETERS_FILE";
pub const METRICS_FILE_ENV: &str = "KNOB_METRICS_FILE";
pub const TRIAL_ID_ENV: &str = "KNOB_TRIAL_ID";
pub const TRIAL_DIR_ENV: &str = "KNOB_TRIAL_DIR";

pub const PARAMETERS_FILE_NAME: &str = "parameters.json";
pub const METRICS_FILE_NAME: &str = "metrics.knob";

pub const INTERMEDIATE_TOKEN: &str = "KNOB_INTERMEDIATE";
pub const FINAL_TOKEN: &str = "KNOB_FINAL";

/// What stdout lines must start with to be looked at.
pub const LINE_PREFIX: &[u8] = b"KNOB_";

/// Linux refuses a single environment string over 128 KiB (`MAX_ARG_STRLEN`) and the trial
/// would not start; larger parameters are only in the file.
pub const MAX_ENV_PARAMETERS_BYTES: usize = 100 * 1024;

/// The warning a service gives, once (`told` remembers it), at the first trial whose parameters
/// are over [`MAX_ENV_PARAMETERS_BYTES`]: such a trial gets no `KNOB_PARAMETERS`, and one that
/// reads only that variable (a shell script's `$KNOB_PARAMETERS`) found it empty without a word
/// of why. `None` for any other trial, and for later large ones.
pub fn parameters_only_in_file(
    told: &mut bool,
    request: &knob_plugin_api::service::TrialRequest,
) -> Option<knob_plugin_api::service::ServiceEvent> {
    if *told {
        return None;
    }
    let bytes = request.parameters.to_string().len();
    if bytes <= MAX_ENV_PARAMETERS_BYTES {
        return None;
    }
    *told = true;
    Some(knob_plugin_api::service::ServiceEvent::Warning {
        trial_id: None,
        message: format!(
            "trial {}: its parameters are {bytes} bytes of JSON, over the {} KiB that environment variable {PARAMETERS_ENV} takes (Linux refuses a variable over 128 KiB, and the trial would not start), so it and later trials with parameters as large get them only in the file ${PARAMETERS_FILE_ENV}: trials should read that file (knob_trial and `import nni` do)",
            request.trial_id,
            MAX_ENV_PARAMETERS_BYTES / 1024
        ),
    })
}

/// One protocol line, read.
#[derive(Debug, PartialEq, Eq)]
pub enum KnobLine<'a> {
    Metric {
        kind: MetricKind,
        value: &'a str,
    },
    /// Not a metric line (other output that happens to start with `KNOB_`).
    Other,
    /// A metric line whose value is unusable; the message says why.
    Bad(String),
}

pub fn parse_line(line: &[u8]) -> KnobLine<'_> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Ok(text) = std::str::from_utf8(line) else {
        return if line.starts_with(INTERMEDIATE_TOKEN.as_bytes())
            || line.starts_with(FINAL_TOKEN.as_bytes())
        {
            KnobLine::Bad("it is not UTF-8".into())
        } else {
            KnobLine::Other
        };
    };
    let text = text.trim();
    let (token, rest) = text
        .split_once(|c: char| c.is_ascii_whitespace())
        .unwrap_or((text, ""));
    let kind = match token {
        INTERMEDIATE_TOKEN => MetricKind::Intermediate,
        FINAL_TOKEN => MetricKind::Final,
        _ => return KnobLine::Other,
    };
    let value = rest.trim();
    match check_value(value) {
        Ok(()) => KnobLine::Metric { kind, value },
        Err(why) => KnobLine::Bad(why),
    }
}

/// A knob metric is a number or a JSON object. An object's `"default"`, where it has one, is a
/// number (what tuners compare); one without is passed on for the core to judge, as NNI's
/// channels pass any value: only the experiment knows what it needs (a multi-objective one reads
/// the metrics its `objectives` list, and no `"default"`). Every service that runs trials reads
/// their lines through this check (the agent of remote hosts and Slurm allocations included).
pub fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("it has no value (expected a number or a JSON object)".into());
    }
    // NaN and the infinities are numbers here: a diverged trial's result is still its result.
    let is_number =
        |v: &Value| v.is_number() || v.as_str().is_some_and(|s| [NAN, INF, NEG_INF].contains(&s));
    match parse_json_lenient(value) {
        Ok(v) if is_number(&v) => Ok(()),
        Ok(Value::Object(map)) if map.get("default").is_none_or(is_number) => Ok(()),
        Ok(Value::Object(_)) => Err(format!(
            "value {} has a \"default\" that is not a number",
            excerpt(value.as_bytes())
        )),
        Ok(_) => Err(format!(
            "value {} is not a number or a JSON object",
            excerpt(value.as_bytes())
        )),
        Err(e) => Err(format!(
            "value {} is not JSON ({e})",
            excerpt(value.as_bytes())
        )),
    }
}

/// Where a protocol line came from, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineSource {
    Stdout,
    MetricsFile,
    /// The trial's stdout as real nni's trial library rewrites it (see [`printed_under_nni`]).
    NniTrialLog,
}

impl LineSource {
    fn describe(self) -> &'static str {
        match self {
            LineSource::Stdout => "stdout",
            LineSource::MetricsFile => METRICS_FILE_NAME,
            LineSource::NniTrialLog => NNI_TRIAL_LOG_FILE_NAME,
        }
    }
}

/// Records one line from stdout or the metrics file, or warns about it. On stdout, lines that
/// are not metric lines are ordinary output; in the metrics file every line should be one.
pub fn handle_line(recorder: &TrialRecorder, source: LineSource, line: &[u8]) {
    match parse_line(line) {
        KnobLine::Metric { kind, value } => {
            // `record` only fails once the trial has ended, and lines are read before that.
            let _ = recorder.record(kind, value.to_string());
        }
        KnobLine::Other if source != LineSource::MetricsFile => {}
        KnobLine::Other => {
            if !line.iter().all(u8::is_ascii_whitespace) {
                recorder.warn(format_args!(
                    "line {} in {} ignored: expected `{INTERMEDIATE_TOKEN} <json>` or `{FINAL_TOKEN} <json>`",
                    excerpt(line),
                    source.describe()
                ));
            }
        }
        KnobLine::Bad(why) => {
            let warning = format_args!(
                "metric line {} on {} ignored: {why}",
                excerpt(line),
                source.describe()
            );
            match unusable_value(line) {
                Some((MetricKind::Final, value)) => {
                    recorder.record_unreadable(MetricKind::Final, &value, warning)
                }
                // JSON that is no number or object (a string, `null`, a list: what `import nni`
                // sends through knob's stand-in for nni) is kept as sent, as NNI's channels keep
                // it; the core records it without a value and says so.
                Some((MetricKind::Intermediate, value)) if parse_json_lenient(&value).is_ok() => {
                    let _ = recorder.record(MetricKind::Intermediate, value);
                }
                _ => recorder.warn(warning),
            }
        }
    }
}

/// The kind and value text of a metric line that [`parse_line`] found unusable. Bytes that are
/// not UTF-8 become U+FFFD: such a final is unreadable like any other and must be reported as
/// one, not dropped as if the trial had sent nothing.
fn unusable_value(line: &[u8]) -> Option<(MetricKind, String)> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    let (token, rest) = text
        .split_once(|c: char| c.is_ascii_whitespace())
        .unwrap_or((text, ""));
    let kind = match token {
        FINAL_TOKEN => MetricKind::Final,
        INTERMEDIATE_TOKEN => MetricKind::Intermediate,
        _ => return None,
    };
    Some((kind, rest.trim().to_string()))
}

/// Where `import nni` (nni 2.x and 3.0, with `NNI_PLATFORM=local`) sends the trial's stdout:
/// `$NNI_OUTPUT_DIR/trial.log`, each printed line as `[<time>] PRINT <line>`, beside nni's own
/// log lines.
pub const NNI_TRIAL_LOG_FILE_NAME: &str = "trial.log";

/// What the trial printed, from a line of nni's `trial.log`: the text after `[<time>] PRINT `;
/// a line without that head as it is (a line the trial printed after a `\r` starts a line of
/// its own here, as on stdout).
pub fn printed_under_nni(line: &[u8]) -> &[u8] {
    let Some(rest) = line.strip_prefix(b"[") else {
        return line;
    };
    memchr::memchr(b']', rest)
        .and_then(|close| rest[close + 1..].strip_prefix(b" PRINT "))
        .unwrap_or(line)
}

/// The first line of `stderr` (the end of a trial's stderr) that holds a metric line, such as
/// `INFO:root:KNOB_FINAL 0.5` from Python's `logging` or one of `print(..., file=sys.stderr)`:
/// knob reads metric lines only on stdout and in `$KNOB_METRICS_FILE`, so such a result is lost,
/// and its trial must be told why ([`warn_metric_on_stderr`]).
pub fn metric_line_on_stderr(stderr: &str) -> Option<&str> {
    // A line of bash's `set -x` trace (`+ echo 'KNOB_FINAL 1'`) is the command that printed
    // the metric to stdout, not a metric written to stderr.
    let lines = || {
        stderr
            .lines()
            .map(str::trim)
            .filter(|line| !line.starts_with('+'))
    };
    let holds = |line: &str, token: &str| {
        line.match_indices(token).any(|(at, _)| {
            let before = line[..at].chars().next_back();
            let after = line[at + token.len()..].chars().next();
            !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                && after.is_some_and(|c| c.is_ascii_whitespace())
        })
    };
    // The final is what the trial lost; an intermediate result shows the same slip.
    lines()
        .find(|line| holds(line, FINAL_TOKEN))
        .or_else(|| lines().find(|line| holds(line, INTERMEDIATE_TOKEN)))
}

/// Warns, at a trial's end without a final result, of a metric line found in its stderr's tail
/// (`stderr`): the trial ended as if it had reported nothing, without a word of why.
pub fn warn_metric_on_stderr(recorder: &TrialRecorder, stderr: &str) {
    if recorder.has_final() {
        return;
    }
    if let Some(line) = metric_line_on_stderr(stderr) {
        recorder.warn(format_args!(
            "no final result recorded, but its stderr has \"{}\": knob reads metric lines only on stdout or in ${METRICS_FILE_ENV} (Python's logging and print(..., file=sys.stderr) write to stderr); print them to stdout, or report with knob_trial or nni",
            excerpt(line.as_bytes())
        ));
    }
}

/// A line over the bound was skipped.
pub fn warn_too_long(recorder: &TrialRecorder, source: LineSource, max_bytes: usize) {
    recorder.warn(format_args!(
        "a {} line over {} KiB was skipped (metrics must be short; log bulky data to a file)",
        source.describe(),
        max_bytes / 1024
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_line_in_stderr_is_found_wherever_a_logger_put_it() {
        assert_eq!(
            metric_line_on_stderr("Traceback\nINFO:root:KNOB_FINAL 0.5\nKNOB_FINAL 0.6\n"),
            Some("INFO:root:KNOB_FINAL 0.5")
        );
        assert_eq!(
            metric_line_on_stderr("INFO:root:KNOB_INTERMEDIATE 0.1\nWARNING:x:KNOB_FINAL 0.5"),
            Some("WARNING:x:KNOB_FINAL 0.5")
        );
        assert_eq!(
            metric_line_on_stderr("  KNOB_INTERMEDIATE\t1\r\n"),
            Some("KNOB_INTERMEDIATE\t1")
        );
        // A longer word, the token alone or a `set -x` trace is no metric line.
        for text in [
            "MY_KNOB_FINAL 1",
            "KNOB_FINALS 1",
            "KNOB_FINAL",
            "unset KNOB_FINAL_X",
            "",
            "+ echo 'KNOB_INTERMEDIATE 1'",
            "++ printf 'KNOB_FINAL %s\\n' 0.5",
        ] {
            assert_eq!(metric_line_on_stderr(text), None, "{text:?}");
        }
    }

    #[test]
    fn a_line_nni_printed_into_trial_log_is_what_the_trial_printed() {
        let printed =
            |line: &str| String::from_utf8_lossy(printed_under_nni(line.as_bytes())).into_owned();
        assert_eq!(
            printed("[2026-11-30 09:07:26] PRINT KNOB_FINAL 0.4"),
            "KNOB_FINAL 0.4"
        );
        // nni's own log lines, and a line printed after a `\r` (a line of its own).
        assert_eq!(
            printed("[2026-11-30 09:07:26] INFO (nni) x"),
            "[2026-11-30 09:07:26] INFO (nni) x"
        );
        assert_eq!(printed("KNOB_FINAL 1"), "KNOB_FINAL 1");
        assert_eq!(
            printed("[unclosed PRINT KNOB_FINAL 1"),
            "[unclosed PRINT KNOB_FINAL 1"
        );
    }

    fn read(line: &str) -> String {
        match parse_line(line.as_bytes()) {
            KnobLine::Metric { kind, value } => format!("{kind:?} {value}"),
            KnobLine::Other => "other".into(),
            KnobLine::Bad(why) => format!("bad: {why}"),
        }
    }

    #[test]
    fn metric_lines() {
        assert_eq!(read("KNOB_FINAL 0.5"), "Final 0.5");
        assert_eq!(read("KNOB_INTERMEDIATE\t-3e2\r"), "Intermediate -3e2");
        assert_eq!(read("KNOB_FINAL NaN"), "Final NaN");
        assert_eq!(read("KNOB_FINAL -Infinity"), "Final -Infinity");
        // As Python's print() writes a diverged float.
        assert_eq!(read("KNOB_INTERMEDIATE nan"), "Intermediate nan");
        assert_eq!(read("KNOB_FINAL -inf\r"), "Final -inf");
        assert_eq!(
            read(r#"KNOB_FINAL {"default": 0.9, "loss": NaN}"#),
            r#"Final {"default": 0.9, "loss": NaN}"#
        );
        // A multi-objective trial's metrics, without "default": the core judges them.
        assert_eq!(
            read(r#"KNOB_INTERMEDIATE {"accuracy":0.5,"latency_ms":3.0}"#),
            r#"Intermediate {"accuracy":0.5,"latency_ms":3.0}"#
        );
        assert_eq!(read("KNOB_FINAL {}"), "Final {}");
        assert_eq!(read("KNOB_FINALE 1"), "other");
        assert_eq!(read("KNOB_DEBUG hello"), "other");
    }

    #[test]
    fn bad_metric_lines_say_why() {
        assert_eq!(
            read("KNOB_FINAL"),
            "bad: it has no value (expected a number or a JSON object)"
        );
        assert_eq!(
            read("KNOB_FINAL banana"),
            "bad: value banana is not JSON (expected value at line 1 column 1)"
        );
        assert_eq!(
            read(r#"KNOB_FINAL {"default": "high", "acc": 1}"#),
            r#"bad: value {\"default\": \"high\", \"acc\": 1} has a "default" that is not a number"#
        );
        assert_eq!(
            read(r#"KNOB_FINAL "0.5""#),
            r#"bad: value \"0.5\" is not a number or a JSON object"#
        );
        assert_eq!(
            read("KNOB_INTERMEDIATE [1, 2]"),
            r#"bad: value [1, 2] is not a number or a JSON object"#
        );
    }

    #[test]
    fn an_unusable_value_is_read_as_sent() {
        use MetricKind::{Final, Intermediate};
        let value = |line: &[u8]| unusable_value(line);
        assert_eq!(value(b"KNOB_FINAL hello\r"), Some((Final, "hello".into())));
        assert_eq!(value(b"KNOB_FINAL"), Some((Final, "".into())));
        assert_eq!(
            value(b"KNOB_INTERMEDIATE hello"),
            Some((Intermediate, "hello".into()))
        );
        assert_eq!(
            value(b"KNOB_FINAL 0.5\xff"),
            Some((Final, "0.5\u{FFFD}".into()))
        );
        assert_eq!(value(b"KNOB_OTHER 1"), None);
    }
}
