//! knob's own trial protocol line parser, `knob_training_services::knob_protocol::parse_line`
//! (`KNOB_INTERMEDIATE <json>` / `KNOB_FINAL <json>` on stdout or in `metrics.knob`).
//!
//! Any bytes give a metric, "other output" or a reason, never a panic or a hang. A value the
//! service accepts is one the core can turn into the number tuners see.
#![no_main]

use knob_plugin_api::metric::default_value;
use knob_training_services::knob_protocol::{parse_line, KnobLine};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Lines are split on `\n` before they get here; a corpus file may hold several.
    for line in data.split(|&b| b == b'\n').chain(std::iter::once(data)) {
        match parse_line(line) {
            KnobLine::Metric { value, .. } => {
                if let Err(why) = default_value(value) {
                    panic!("accepted {value:?}, which the core refuses: {why}");
                }
            }
            KnobLine::Other => {}
            KnobLine::Bad(why) => assert!(!why.is_empty()),
        }
    }
});
