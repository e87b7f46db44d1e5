//! knob's own trial protocol line parser, `knob_training_services::knob_protocol::parse_line`
//! (`KNOB_INTERMEDIATE <json>` / `KNOB_FINAL <json>` on stdout or in `metrics.knob`).
//!
//! Any bytes give a metric, "other output" or a reason, never a panic or a hang. A value the
//! service accepts is one the core can turn into the number tuners see, or an object without
//! `"default"`, which the core judges by the experiment's `objectives`.
#![no_main]

use knob_plugin_api::metric::{default_value, parse_lenient};
use knob_training_services::knob_protocol::{parse_line, KnobLine};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    // Lines are split on `\n` before they get here; a corpus file may hold several.
    for line in data.split(|&b| b == b'\n').chain(std::iter::once(data)) {
        match parse_line(line) {
            KnobLine::Metric { value, .. } => {
                let without_default = matches!(
                    parse_lenient(value),
                    Ok(Value::Object(map)) if !map.contains_key("default")
                );
                if let Err(why) = default_value(value) {
                    assert!(
                        without_default,
                        "accepted {value:?}, which the core refuses: {why}"
                    );
                }
            }
            KnobLine::Other => {}
            KnobLine::Bad(why) => assert!(!why.is_empty()),
        }
    }
});
