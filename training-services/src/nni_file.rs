//! The NNI 2.x file channel, and the metric format both NNI channels share.
//!
//! NNI 2.x trials (`nni/runtime/platform/local.py`, and `local_legacy.py` in 3.0 when no
//! `NNI_TRIAL_COMMAND_CHANNEL` is set) read their parameters from `$NNI_SYS_DIR/parameter.cfg`,
//! one JSON line `{"parameter_id":..,"parameter_source":"algorithm","parameters":{..},
//! "parameter_index":0}`, and append each metric to `$NNI_SYS_DIR/.nni/metrics` as `ME`,
//! the byte length of what follows as 6 decimal digits, the metric JSON, and `\n` (the length
//! counts the `\n`). The metric JSON is `{"parameter_id":..,"trial_job_id":..,"type":
//! "PERIODICAL"|"FINAL","sequence":..,"value":"<json text>"}`; the value is itself JSON text,
//! written by Python, so it may hold NaN or Infinity.

use knob_plugin_api::service::MetricKind;
use serde_json::Value;

use knob_plugin_api::metric::parse_json_lenient;

use crate::metrics::{excerpt, TrialNotRunning, TrialRecorder};

pub const PARAMETER_FILE_NAME: &str = "parameter.cfg";
pub const METRICS_DIR_NAME: &str = ".nni";
pub const METRICS_FILE_NAME: &str = "metrics";

/// NNI's parameter record: what `parameter.cfg` holds and what the v3 channel hands out as
/// `"parameter"`. `nni.get_next_parameter()` returns its `"parameters"`, and the trial sends
/// `"parameter_id"` back with each metric. The id is the tuner's label when it gave one (NNI's
/// Hyperband and BOHB use strings like `"0-4_0_3"`), else the number. A label that is a whole
/// number written plainly (NNI's dispatcher labels a tuner's int id `"0"`) is written as that
/// number: NNI gives its tuners' trials an int, and trial code compares or indexes with it.
pub fn parameter_record(parameter_id: u64, label: Option<&str>, parameters: &Value) -> String {
    let parameter_id = match label {
        Some(label) => match label.parse::<u64>() {
            Ok(number) if number.to_string() == label => Value::from(number),
            _ => Value::from(label),
        },
        None => Value::from(parameter_id),
    };
    let record = serde_json::json!({
        "parameter_id": parameter_id,
        "parameter_source": "algorithm",
        "parameters": parameters,
        "parameter_index": 0,
    })
    .to_string();
    escape_python_line_breaks(&record)
}

/// `text` (JSON) with the characters Python's `str.splitlines` breaks at but JSON leaves raw
/// (U+0085, U+2028, U+2029) written as escapes: nni reads the record with json_tricks, which
/// strips comments line by line, so a parameter value holding one of them came apart into JSON
/// with a raw newline in a string ("Invalid control character"). The value read is the same.
fn escape_python_line_breaks(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\u{85}' | '\u{2028}' | '\u{2029}' => {
                escaped.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => escaped.push(c),
        }
    }
    escaped
}

const HEADER_BYTES: usize = 8;

/// Splits the bytes of `.nni/metrics`, as they arrive, into records.
#[derive(Debug, Default)]
pub struct NniRecordDecoder {
    pending: Vec<u8>,
    /// Bytes consumed so far, for messages that point into the file.
    consumed: u64,
    /// After a corrupt header, bytes are dropped up to the next `\n`.
    resyncing: bool,
}

/// What the decoder finds.
#[derive(Debug, PartialEq, Eq)]
pub enum NniRecord<'a> {
    /// The JSON of one record (its trailing `\n` removed).
    Metric(&'a [u8]),
    /// Bytes that are not a record; the message says where and what.
    Corrupt(String),
}

impl NniRecordDecoder {
    pub fn new() -> NniRecordDecoder {
        NniRecordDecoder::default()
    }

    pub fn feed(&mut self, chunk: &[u8], on_record: &mut impl FnMut(NniRecord<'_>)) {
        self.pending.extend_from_slice(chunk);
        let mut start = 0;
        loop {
            let rest = &self.pending[start..];
            if self.resyncing {
                match memchr::memchr(b'\n', rest) {
                    Some(newline) => {
                        start += newline + 1;
                        self.resyncing = false;
                        continue;
                    }
                    None => {
                        start = self.pending.len();
                        break;
                    }
                }
            }
            if rest.len() < HEADER_BYTES {
                // A short tail may still be a header in the making, unless it already is not.
                if !rest.is_empty() && !could_start_header(rest) {
                    on_record(NniRecord::Corrupt(self.corrupt_header(start)));
                    self.resyncing = true;
                    continue;
                }
                break;
            }
            let Some(length) = header_length(&rest[..HEADER_BYTES]) else {
                on_record(NniRecord::Corrupt(self.corrupt_header(start)));
                self.resyncing = true;
                continue;
            };
            if rest.len() < HEADER_BYTES + length {
                break;
            }
            let body = &rest[HEADER_BYTES..HEADER_BYTES + length];
            let body = body.strip_suffix(b"\n").unwrap_or(body);
            on_record(NniRecord::Metric(body));
            start += HEADER_BYTES + length;
        }
        self.pending.drain(..start);
        self.consumed += start as u64;
    }

    /// The file will not grow any more: bytes left over are an incomplete record.
    pub fn finish(&mut self, on_record: &mut impl FnMut(NniRecord<'_>)) {
        if !self.pending.is_empty() && !self.resyncing {
            on_record(NniRecord::Corrupt(format!(
                "incomplete record at byte {} ({} bytes: {})",
                self.consumed,
                self.pending.len(),
                excerpt(&self.pending)
            )));
        }
        self.consumed += self.pending.len() as u64;
        self.pending.clear();
        self.resyncing = false;
    }

    fn corrupt_header(&self, start: usize) -> String {
        // What is skipped: up to the next line.
        let rest = &self.pending[start..];
        let skipped = rest.split(|&b| b == b'\n').next().unwrap_or(rest);
        format!(
            "not a record (`ME` + 6 digits + JSON) at byte {}: {}",
            self.consumed + start as u64,
            excerpt(&skipped[..skipped.len().min(40)])
        )
    }
}

fn could_start_header(partial: &[u8]) -> bool {
    partial.iter().enumerate().all(|(i, &b)| match i {
        0 => b == b'M',
        1 => b == b'E',
        _ => b.is_ascii_digit(),
    })
}

fn header_length(header: &[u8]) -> Option<usize> {
    let digits = header.strip_prefix(b"ME")?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// One NNI metric record, read.
#[derive(Debug, PartialEq, Eq)]
pub enum NniMetric {
    /// A metric to record: its kind and its value's JSON text.
    Value(MetricKind, String),
    /// A metric whose value is not JSON (`nni.report_final_result(10**400)` sends 401 digits,
    /// more than a float holds): its kind, the value as sent, and why it cannot be read. It is
    /// recorded as a bad `KNOB_` line is ([`TrialRecorder::record_unreadable`]).
    Unreadable(MetricKind, String, String),
    /// Not a metric (`REQUEST_PARAMETER`, which needs no answer because `parameter.cfg` is
    /// always written before the trial starts).
    NotAMetric,
}

impl NniMetric {
    /// Records it for the trial; `channel` names where it came from in a warning. Both NNI
    /// channels record through this. Err when the trial has ended.
    pub fn record(self, recorder: &TrialRecorder, channel: &str) -> Result<(), TrialNotRunning> {
        match self {
            NniMetric::Value(kind, value) => recorder.record(kind, value),
            NniMetric::Unreadable(kind, value, why) => {
                recorder.record_unreadable(kind, &value, format_args!("{channel}: {why}"));
                Ok(())
            }
            NniMetric::NotAMetric => Ok(()),
        }
    }
}

/// Reads one NNI metric (as `nni.trial` builds it) sent on `trial_id`'s channel. Err for a
/// record that is not one: it is warned about, as nothing in it can be trusted.
pub fn decode_nni_metric(metric: &[u8], trial_id: &str) -> Result<NniMetric, String> {
    let text = std::str::from_utf8(metric)
        .map_err(|_| format!("metric {} is not UTF-8", excerpt(metric)))?;
    let record = parse_json_lenient(text)
        .map_err(|e| format!("metric {} is not JSON ({e})", excerpt(metric)))?;
    let Value::Object(record) = record else {
        return Err(format!("metric {} is not a JSON object", excerpt(metric)));
    };
    match record.get("trial_job_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(sender)) if sender == trial_id => {}
        Some(sender) => {
            // A metric is only ever recorded for the trial whose channel it came on.
            return Err(format!(
                "metric names trial {sender} but came on trial {trial_id}'s channel; not recorded"
            ));
        }
    }
    let kind = match record.get("type").and_then(Value::as_str) {
        Some("PERIODICAL" | "INTERMEDIATE") => MetricKind::Intermediate,
        Some("FINAL") => MetricKind::Final,
        Some("REQUEST_PARAMETER") => return Ok(NniMetric::NotAMetric),
        Some(other) => {
            return Err(format!(
                "metric type {other:?} is unknown (expected PERIODICAL or FINAL)"
            ))
        }
        None => return Err(format!("metric {} has no \"type\"", excerpt(metric))),
    };
    match record.get("value") {
        Some(Value::String(value)) => match parse_json_lenient(value) {
            Ok(_) => Ok(NniMetric::Value(kind, value.clone())),
            Err(e) => {
                let why = format!(
                    "metric value {} is not JSON ({e})",
                    excerpt(value.as_bytes())
                );
                Ok(NniMetric::Unreadable(kind, value.clone(), why))
            }
        },
        // Not what nni writes, but a JSON value sent directly is just as clear.
        Some(value) if !value.is_null() => Ok(NniMetric::Value(kind, value.to_string())),
        _ => Err(format!("metric {} has no \"value\"", excerpt(metric))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(json: &str) -> Vec<u8> {
        let data = format!("{json}\n");
        format!("ME{:06}{data}", data.len()).into_bytes()
    }

    fn decode(chunks: &[&[u8]]) -> Vec<String> {
        let mut decoder = NniRecordDecoder::new();
        let mut out = Vec::new();
        let mut on_record = |r: NniRecord<'_>| {
            out.push(match r {
                NniRecord::Metric(m) => String::from_utf8_lossy(m).into_owned(),
                NniRecord::Corrupt(why) => format!("corrupt: {why}"),
            })
        };
        for chunk in chunks {
            decoder.feed(chunk, &mut on_record);
        }
        decoder.finish(&mut on_record);
        out
    }

    #[test]
    fn records_split_anywhere() {
        let mut bytes = record(r#"{"a":1}"#);
        bytes.extend(record(r#"{"b":"é"}"#));
        for split in 0..bytes.len() {
            let (a, b) = bytes.split_at(split);
            assert_eq!(
                decode(&[a, b]),
                [r#"{"a":1}"#, r#"{"b":"é"}"#],
                "split {split}"
            );
        }
    }

    #[test]
    fn garbage_is_reported_and_skipped_to_the_next_line() {
        let mut bytes = b"garbage here\n".to_vec();
        bytes.extend(record("{}"));
        bytes.extend(b"ME00");
        assert_eq!(
            decode(&[&bytes]),
            [
                "corrupt: not a record (`ME` + 6 digits + JSON) at byte 0: garbage here",
                "{}",
                "corrupt: incomplete record at byte 24 (4 bytes: ME00)"
            ]
        );
    }

    #[test]
    fn nni_metrics_are_decoded_and_bound_to_their_trial() {
        let metric = br#"{"parameter_id": 3, "trial_job_id": "Ab1", "type": "PERIODICAL", "sequence": 0, "value": "NaN"}"#;
        assert_eq!(
            decode_nni_metric(metric, "Ab1"),
            Ok(NniMetric::Value(
                MetricKind::Intermediate,
                "NaN".to_string()
            ))
        );
        assert_eq!(
            decode_nni_metric(metric, "Zz9"),
            Err("metric names trial \"Ab1\" but came on trial Zz9's channel; not recorded".into())
        );
        // NNI's Hyperband and BOHB give trials string parameter ids; they come back as sent.
        let labeled = br#"{"parameter_id": "0-4_0_3", "trial_job_id": "Ab1", "type": "FINAL", "sequence": 0, "value": "0.5"}"#;
        assert_eq!(
            decode_nni_metric(labeled, "Ab1"),
            Ok(NniMetric::Value(MetricKind::Final, "0.5".to_string()))
        );
        let request = br#"{"trial_job_id": "Ab1", "type": "REQUEST_PARAMETER", "sequence": 0}"#;
        assert_eq!(decode_nni_metric(request, "Ab1"), Ok(NniMetric::NotAMetric));
        // A value that is not JSON is still the trial's metric, kept as sent with why.
        let bad = br#"{"type": "FINAL", "value": "{oops"}"#;
        let Ok(NniMetric::Unreadable(MetricKind::Final, value, why)) =
            decode_nni_metric(bad, "Ab1")
        else {
            panic!("{:?}", decode_nni_metric(bad, "Ab1"));
        };
        assert_eq!(value, "{oops");
        assert!(why.contains("not JSON"), "{why}");
        let broken = br#"{"type": "FINAL", "value": "1"#;
        assert!(decode_nni_metric(broken, "Ab1")
            .unwrap_err()
            .contains("not JSON"));
    }

    #[test]
    fn line_breaks_python_splits_at_are_escaped_and_read_back_the_same() {
        let parameters = serde_json::json!({"u": "a\u{2028}b\u{2029}c\u{85}d"});
        let record = parameter_record(1, None, &parameters);
        assert!(record.contains(r"a\u2028b\u2029c\u0085d"), "{record}");
        assert!(
            !record.contains(['\u{2028}', '\u{2029}', '\u{85}']),
            "{record}"
        );
        let read: serde_json::Value = serde_json::from_str(&record).unwrap();
        assert_eq!(read["parameters"], parameters);
    }

    #[test]
    fn parameter_record_is_nni_s_format() {
        let parameters = serde_json::json!({"lr": 0.1, "act": "relu"});
        assert_eq!(
            parameter_record(7, None, &parameters),
            r#"{"parameter_id":7,"parameter_source":"algorithm","parameters":{"lr":0.1,"act":"relu"},"parameter_index":0}"#
        );
        assert_eq!(
            parameter_record(7, Some("0-2_1_5"), &parameters),
            r#"{"parameter_id":"0-2_1_5","parameter_source":"algorithm","parameters":{"lr":0.1,"act":"relu"},"parameter_index":0}"#
        );
        // NNI's dispatcher's int id, carried as the label "0": an int again, as NNI gives it.
        assert_eq!(
            parameter_record(7, Some("0"), &parameters),
            r#"{"parameter_id":0,"parameter_source":"algorithm","parameters":{"lr":0.1,"act":"relu"},"parameter_index":0}"#
        );
        // Not written plainly: kept as the text it is.
        assert_eq!(
            parameter_record(7, Some("007"), &serde_json::json!({})),
            r#"{"parameter_id":"007","parameter_source":"algorithm","parameters":{},"parameter_index":0}"#
        );
    }
}
