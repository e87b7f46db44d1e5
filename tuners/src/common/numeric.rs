//! Numbers model-based tuners share: the normal CDF, log-sum-exp, and snapping an encoded value
//! to one its parameter can take.

use knob_plugin_api::space::{quantize, DimKind, ParamType, MAX_Z};

/// `ln(sqrt(2π))`.
pub(crate) const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

/// The standard normal CDF, with a relative error below 1.2e-7 in both tails (Numerical
/// Recipes' Chebyshev fit of erfc), enough for truncating Parzen kernels.
pub(crate) fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// `ln(Σ exp(x))`, stable for large and `-inf` terms; `-inf` for no term.
pub(crate) fn log_sum_exp(values: &[f64]) -> f64 {
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    // A term 40 below the largest adds less than 5e-18 of it: skipping its `exp` changes nothing
    // in f64 and saves most of the work (and exp's slow path near underflow) in a wide mixture.
    let sum: f64 = values
        .iter()
        .filter(|&&v| v - max > -40.0)
        .map(|v| (v - max).exp())
        .sum();
    max + sum.ln()
}

/// The mass of `normal(mu, sigma)` inside `[lo, hi]`: 1 without computing a CDF when both ends
/// are more than 9 sigmas away (the mass outside is then below 1e-18).
pub(crate) fn normal_mass(mu: f64, sigma: f64, lo: f64, hi: f64) -> f64 {
    let (a, b) = ((lo - mu) / sigma, (hi - mu) / sigma);
    if a < -9.0 && b > 9.0 {
        return 1.0;
    }
    normal_cdf(b) - normal_cdf(a)
}

/// The distance in encoded units between neighbouring values of a discrete numeric dimension:
/// 1 for an integer, `q / (high - low)` for a linear q-uniform; `None` where values are not
/// evenly spaced in the encoding (log and normal q-types) or continuous.
pub(crate) fn encoded_step(ty: &ParamType, kind: DimKind) -> Option<f64> {
    match (kind, ty) {
        (DimKind::Integer { .. }, _) => Some(1.0),
        (_, ParamType::QUniform { low, high, q }) => Some((q / (high - low)).min(1.0)),
        _ => None,
    }
}

/// The encoded value nearest `x` that a trial can receive: an index rounded and clamped, a real
/// clamped to its range, a q-type rounded to its grid (NNI's rounding) and encoded back.
pub(crate) fn snap(ty: &ParamType, kind: DimKind, x: f64) -> f64 {
    let (lo, hi) = kind.range();
    match kind {
        DimKind::Categorical { .. } | DimKind::Integer { .. } => x.round_ties_even().clamp(lo, hi),
        DimKind::Unit => {
            let t = x.clamp(0.0, 1.0);
            let Some(q) = ty.q() else { return t };
            let Some((low, high)) = ty.bounds() else {
                return t;
            };
            if ty.is_log() {
                let (a, b) = (low.ln(), high.ln());
                let v = quantize((a + t * (b - a)).exp(), Some(q), Some((low, high)));
                ((v.ln() - a) / (b - a)).clamp(0.0, 1.0)
            } else {
                let v = quantize(low + t * (high - low), Some(q), Some((low, high)));
                ((v - low) / (high - low)).clamp(0.0, 1.0)
            }
        }
        DimKind::Gaussian => {
            let z = x.clamp(-MAX_Z, MAX_Z);
            let (mu, sigma, q) = match *ty {
                ParamType::QNormal { mu, sigma, q } | ParamType::QLogNormal { mu, sigma, q } => {
                    (mu, sigma, q)
                }
                _ => return z,
            };
            let raw = mu + sigma * z;
            let v = quantize(if ty.is_log() { raw.exp() } else { raw }, Some(q), None);
            let back = if ty.is_log() { v.ln() } else { v };
            ((back - mu) / sigma).clamp(-MAX_Z, MAX_Z)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_cdf_matches_tables() {
        for (x, want) in [
            (0.0, 0.5),
            (1.0, 0.841_344_746_068_543),
            (-1.959_963_984_540_054, 0.025),
            (-5.0, 2.866_515_718_791_939e-7),
            (3.0, 0.998_650_101_968_369_9),
        ] {
            let got = normal_cdf(x);
            assert!(
                (got - want).abs() <= 2e-7 * want,
                "cdf({x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn log_sum_exp_is_stable() {
        assert_eq!(log_sum_exp(&[]), f64::NEG_INFINITY);
        assert!((log_sum_exp(&[1000.0, 1000.0]) - (1000.0 + 2f64.ln())).abs() < 1e-9);
        assert_eq!(log_sum_exp(&[f64::NEG_INFINITY, 0.0]), 0.0);
    }

    #[test]
    fn snap_rounds_q_types_to_their_grid() {
        let ty = ParamType::QUniform {
            low: 0.0,
            high: 10.0,
            q: 2.5,
        };
        assert_eq!(snap(&ty, DimKind::Unit, 0.3), 0.25);
        assert_eq!(snap(&ty, DimKind::Unit, 1.7), 1.0);
        let int = DimKind::Integer { size: 4 };
        let ty = ParamType::RandInt { low: 3, high: 7 };
        assert_eq!(snap(&ty, int, 2.6), 3.0);
        assert_eq!(snap(&ty, int, -4.0), 0.0);
    }
}
