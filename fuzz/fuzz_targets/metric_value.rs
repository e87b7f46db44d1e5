//! The metric value decoder shared by the core and the training services,
//! `knob_plugin_api::metric::{parse_lenient, default_value}` (JSON with NaN / Infinity, NNI's
//! double-encoded form, an object's `"default"`).
//!
//! Any text gives a value or an error, never a panic or a hang; `default_value` agrees with
//! `parse_lenient`.
#![no_main]

use knob_plugin_api::metric::{default_value, parse_json_lenient, parse_lenient};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_json_lenient(text);
    let parsed = parse_lenient(text);
    let number = default_value(text);
    if parsed.is_err() {
        assert!(
            number.is_err(),
            "{text:?}: no value but a number {number:?}"
        );
    }
    if let Err(why) = &number {
        assert!(!why.is_empty());
    }
});
