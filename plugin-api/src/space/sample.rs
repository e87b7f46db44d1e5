//! Sampling, as NNI's random tuner does it (`suggest_parameter` then `deformat_parameters`).

use rand::Rng;
use serde_json::{Map, Value};

use super::ParamType;

/// NNI's rule for turning a raw float into a q-type value: `round(x / q) * q` (round half to
/// even, like Python's `round`), then clipped to `clip` when given (the uniform family's
/// `[low, high]`). Rounding first and clipping second is why `quniform [1, 10, 3]` can give 1 and
/// 10 though neither is a multiple of 3.
///
/// With `q = None` only the clip applies. A NaN `x` with a clip gives `low`; a rounding that would
/// overflow (a tiny q and a huge x) keeps `x`.
pub fn quantize(x: f64, q: Option<f64>, clip: Option<(f64, f64)>) -> f64 {
    let mut x = x;
    if let Some(q) = q {
        // `+ 0.0` turns -0.0 into 0.0: Python's round() returns an int, which has no sign.
        let rounded = (x / q).round_ties_even() * q + 0.0;
        if rounded.is_finite() {
            x = rounded;
        }
    }
    if let Some((low, high)) = clip {
        x = x.max(low).min(high);
    }
    x
}

/// A standard normal draw (Box–Muller, one output per call so the stream position depends only
/// on the number of calls). `rand` 0.8 without `rand_distr` has no normal distribution, and tuners
/// (TPE, evolution) need one. Never beyond about ±8.6, so never infinite.
pub fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    // 1 - [0, 1) is (0, 1]: ln never sees 0.
    let u1 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A uniform index in `0..n`, drawn as u64 so the stream is the same on 32- and 64-bit targets
/// (rand's `usize` sampling is not portable).
pub(super) fn index<R: Rng + ?Sized>(rng: &mut R, n: usize) -> usize {
    rng.gen_range(0..n as u64) as usize
}

pub(super) fn sample_type<R: Rng + ?Sized>(ty: &ParamType, rng: &mut R) -> Value {
    match ty {
        ParamType::Choice { values } => values[index(rng, values.len())].clone(),
        ParamType::NestedChoice { options } => {
            let option = &options[index(rng, options.len())];
            let mut map = Map::new();
            map.insert("_name".to_owned(), Value::String(option.name.clone()));
            for p in option.space.parameters() {
                map.insert(p.name.clone(), p.sample(rng));
            }
            Value::Object(map)
        }
        ParamType::RandInt { low, high } => Value::from(rng.gen_range(*low..*high)),
        numeric => Value::from(sample_number(numeric, rng)),
    }
}

/// A draw of a numeric type, already rounded and clipped. Finite by the parse-time checks.
fn sample_number<R: Rng + ?Sized>(ty: &ParamType, rng: &mut R) -> f64 {
    let clip = ty.bounds();
    let raw = match *ty {
        ParamType::Uniform { low, high } | ParamType::QUniform { low, high, .. } => {
            low + rng.gen::<f64>() * (high - low)
        }
        ParamType::LogUniform { low, high } | ParamType::QLogUniform { low, high, .. } => {
            let (a, b) = (low.ln(), high.ln());
            (a + rng.gen::<f64>() * (b - a)).exp()
        }
        ParamType::Normal { mu, sigma } | ParamType::QNormal { mu, sigma, .. } => {
            mu + sigma * standard_normal(rng)
        }
        ParamType::LogNormal { mu, sigma } | ParamType::QLogNormal { mu, sigma, .. } => {
            (mu + sigma * standard_normal(rng)).exp()
        }
        // Not numeric: sample_type handles these before calling here.
        ParamType::Choice { .. } | ParamType::NestedChoice { .. } | ParamType::RandInt { .. } => {
            return 0.0
        }
    };
    // The clip also keeps an `exp(ln high)` one ulp above `high` inside the range.
    quantize(raw, ty.q(), clip)
}
