//! The plugin loader's pre-check, `knob_plugin_api::host::precheck::check_bytes`: it reads a
//! file from the plugin path before `dlopen` and must refuse one that would make the dynamic
//! loader touch memory past the file's end (a truncated library died of SIGBUS).
//!
//! Any bytes give a summary or a one-line reason, never a panic, a signal or a hang; a file it
//! accepts has a loadable segment.
#![no_main]

use knob_plugin_api::host::precheck::check_bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match check_bytes(data) {
        Ok(summary) => assert!(summary.load_segments > 0, "{summary:?}"),
        Err(why) => assert!(!why.is_empty() && !why.contains('\n'), "{why:?}"),
    }
});
