//! Seeds: the `seed` classArg, a logged seed when none is given, and one random stream per
//! suggestion.
//!
//! Model-based tuners draw each suggestion from its own stream, `step_rng(seed, step)`, where
//! `step` counts the points handed out or imported before it. So a tuner that resumes with its
//! history imported draws its next suggestion from the same stream as an uninterrupted run
//! would, and, given the same history, suggests the same point.

use std::hash::BuildHasher;

use knob_plugin_api::space::{seeded_rng, SeededRng};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// For `#[serde(default, deserialize_with = "seed")]`: a whole number in u64's range, with a
/// message that says so (serde's own is "expected u64").
pub(crate) fn seed<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "seed must be a whole number from 0 to {}, got {value}",
                u64::MAX
            ))
        }),
    }
}

/// The given seed, or a fresh one with the line that logs it ([`SeedNotice`]).
pub(crate) fn seed_or_entropy(tuner: &str, seed: Option<u64>) -> (u64, SeedNotice) {
    match seed {
        Some(seed) => (seed, SeedNotice(None)),
        None => {
            let seed = entropy_seed();
            let line = format!(
                "{tuner}: using seed {seed}; set classArgs seed: {seed} to replay this run"
            );
            (seed, SeedNotice(Some(line)))
        }
    }
}

/// The log line of a drawn seed, said the first time the tuner is asked for parameters
/// ([`SeedNotice::log_once`]), not when it is built: `knob create` builds a tuner to check the
/// config and then the run's, each drawing a seed of its own, and the first one's line named a
/// seed that replayed nothing. Only a tuner that runs is asked for parameters.
#[derive(Debug, Default)]
pub(crate) struct SeedNotice(Option<String>);

impl SeedNotice {
    pub(crate) fn log_once(&mut self) {
        if let Some(line) = self.0.take() {
            knob_plugin_api::log::info(&line);
        }
    }
}

/// A seed below 2^31 (as NNI draws them: short to copy into a config) from the OS entropy that
/// seeds std's `RandomState`, mixed with the time so two tuners in one thread differ.
fn entropy_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::collections::hash_map::RandomState::new().hash_one(nanos) % (1 << 31)
}

/// The random stream of suggestion number `step` of a tuner seeded with `seed`.
pub(crate) fn step_rng(seed: u64, step: u64) -> SeededRng {
    // SplitMix64's finalizer: neighbouring (seed, step) pairs give unrelated streams.
    let mut z = seed ^ step.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    seeded_rng(z ^ (z >> 31))
}
