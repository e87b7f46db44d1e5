//! knob's stable plugin ABI and the plugin author SDK.
pub mod space;
