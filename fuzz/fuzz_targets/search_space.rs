//! The search-space parser, `knob_plugin_api::space::SearchSpace::parse`, and what tuners do
//! with a space that parses.
//!
//! Any text gives a space or an error, never a panic or a hang. For a space that parses, the
//! documented promises hold: a sample (seeded) is a valid parameters object of the space; it
//! encodes to a vector whose active dimensions are finite and decodes back to a valid object;
//! a prior vector decodes to a valid object; and any number, infinities included, in an
//! active non-categorical dimension decodes (clamped) to a valid object.
#![no_main]

use knob_plugin_api::space::{seeded_rng, DimKind, Encoding, SearchSpace};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// Numbers a model-based tuner might propose for a dimension, from the sensible to the absurd.
const EXTREMES: [f64; 8] = [
    0.0,
    1.0,
    -1.0,
    0.5,
    1e300,
    -1e300,
    f64::INFINITY,
    f64::NEG_INFINITY,
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let space = match SearchSpace::parse(text) {
        Ok(space) => space,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    let _ = space.to_string();
    for p in space.all_parameters() {
        let ty = p.param_type();
        let _ = (ty.to_string(), ty.size(), ty.q(), ty.bounds(), ty.is_log());
        for x in EXTREMES {
            let _ = ty.round_and_clip(x);
        }
    }
    let encoding = space.encoding();
    assert_eq!(encoding.len(), space.all_parameters().len());
    for seed in 0..2 {
        let mut rng = seeded_rng(seed);
        let sample = space.sample(&mut rng);
        valid(&space, &sample, "a sample");
        let vector = encoding
            .encode(&sample)
            .unwrap_or_else(|e| panic!("a sample does not encode ({e}): {sample}"));
        let active = encoding.active(&vector);
        for ((x, on), dim) in vector.iter().zip(&active).zip(encoding.dims()) {
            assert_eq!(
                x.is_finite(),
                *on,
                "{}: encoded {x}, active {on}, for sample {sample}",
                dim.path()
            );
        }
        let decoded = decode(&encoding, &vector, "the encoding of a sample");
        valid(&space, &decoded, "a decoded sample");

        let prior = encoding.sample_vector(&mut rng);
        let decoded = decode(&encoding, &prior, "a prior vector");
        valid(&space, &decoded, "a decoded prior vector");

        for extreme in EXTREMES {
            // Categorical dimensions choose which dimensions are active: keep those.
            let pushed: Vec<f64> = prior
                .iter()
                .zip(encoding.dims())
                .map(|(&x, dim)| match dim.kind() {
                    DimKind::Categorical { .. } => x,
                    _ if x.is_nan() => x,
                    _ => extreme,
                })
                .collect();
            let decoded = decode(&encoding, &pushed, "a vector of extremes");
            valid(&space, &decoded, "a decoded vector of extremes");
        }
    }
});

fn decode(encoding: &Encoding, vector: &[f64], what: &str) -> Value {
    encoding
        .decode(vector)
        .unwrap_or_else(|e| panic!("{what} does not decode ({e}): {vector:?}"))
}

fn valid(space: &SearchSpace, params: &Value, what: &str) {
    if let Err(e) = space.validate_parameters(params) {
        panic!("{what} is not valid ({e}): {params}");
    }
}
