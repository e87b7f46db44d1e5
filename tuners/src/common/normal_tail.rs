//! The normal distribution where [`normal_cdf`] is not enough: logarithms deep in the lower tail
//! (where expected improvement lives once a model is confident, and underflows as a plain
//! number), and a distribution function precise enough to map normal-family parameters onto
//! `[0, 1]` and back.
//!
//! The tail uses the same Chebyshev fit of erfc as [`normal_cdf`] (Numerical Recipes' `erfcc`,
//! relative error below 1.2e-7), taken before its final `exp`.

use std::f64::consts::{FRAC_1_SQRT_2, LN_2, PI};

use super::numeric::normal_cdf;
use super::quantile::standard_normal_quantile;

/// `ln erfc(x)` for `x >= 0`.
#[allow(clippy::excessive_precision)]
fn log_erfc_nonnegative(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.5 * x);
    let poly = -1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    t.ln() - x * x + poly
}

/// `Φ(z)` to about 1e-15: [`normal_cdf`] polished by two Newton steps on the AS241 quantile, so
/// that mapping a normal-family value onto `[0, 1]` and back returns it to rounding.
pub(crate) fn normal_cdf_precise(z: f64) -> f64 {
    let mut p = normal_cdf(z);
    for _ in 0..2 {
        if !(p > 0.0 && p < 1.0) {
            break;
        }
        let at = standard_normal_quantile(p);
        p = (p + (z - at) * normal_pdf(at)).clamp(0.0, 1.0);
    }
    p
}

/// `ln Φ(z)`, finite for every finite `z` (about `-z²/2` far in the lower tail).
pub(crate) fn log_normal_cdf(z: f64) -> f64 {
    if z < 0.0 {
        log_erfc_nonnegative(-z * FRAC_1_SQRT_2) - LN_2
    } else {
        normal_cdf(z).ln()
    }
}

/// `φ(z)`, the standard normal density.
pub(crate) fn normal_pdf(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * PI).sqrt()
}

/// `ln(φ(z) + z Φ(z))`: the log of expected improvement per unit of standard deviation at
/// standardized improvement `z`. Finite for every finite `z`: below -5 the asymptotic series
/// `φ(z)/z² (1 - 3/z² + 15/z⁴ - 105/z⁶)` replaces the difference of two nearly equal numbers.
pub(crate) fn log_expected_improvement_factor(z: f64) -> f64 {
    if z > -5.0 {
        (normal_pdf(z) + z * normal_cdf(z))
            .max(f64::MIN_POSITIVE)
            .ln()
    } else {
        let inv2 = 1.0 / (z * z);
        let series = 1.0 - 3.0 * inv2 + 15.0 * inv2 * inv2 - 105.0 * inv2 * inv2 * inv2;
        -0.5 * z * z - 0.5 * (2.0 * PI).ln() + inv2.ln() + series.ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_reference_values() {
        // scipy.stats.norm.cdf / logcdf.
        let cases = [
            (0.0, 0.5),
            (1.0, 0.841_344_746_068_542_9),
            (-1.959_963_984_540_054, 0.025),
            (-5.0, 2.866_515_718_791_939e-7),
            (3.0, 0.998_650_101_968_369_9),
        ];
        for (z, want) in cases {
            let got = normal_cdf_precise(z);
            assert!(
                ((got - want) / want).abs() < 1e-13,
                "Φ({z}) = {got}, want {want}"
            );
            let log = log_normal_cdf(z);
            assert!((log - want.ln()).abs() < 2e-7, "ln Φ({z}) = {log}");
        }
        for z in [-8.0, -3.3, -0.7, 0.0, 0.4, 2.5, 6.0] {
            let back = standard_normal_quantile(normal_cdf_precise(z));
            // Near 1 a probability has only ulps of 1.1e-16: z moves by that over φ(z).
            let tolerance =
                1e-13 + 4.0 * f64::EPSILON / normal_pdf(z) * f64::from(u8::from(z > 0.0));
            assert!((back - z).abs() < tolerance, "{z} -> {back}");
        }
        let log = log_normal_cdf(-40.0);
        assert!((log - -804.608_442_013_754_6).abs() < 1e-5, "{log}");
        assert!((log_normal_cdf(2.0) - 0.977_249_868_051_820_8f64.ln()).abs() < 1e-7);
    }

    #[test]
    fn expected_improvement_factor_is_continuous_and_monotone() {
        let below = log_expected_improvement_factor(-5.0 - 1e-9);
        let above = log_expected_improvement_factor(-5.0 + 1e-9);
        assert!((below - above).abs() < 5e-3, "{below} vs {above}");
        let mut last = f64::NEG_INFINITY;
        for i in 0..400 {
            let z = -60.0 + 0.2 * f64::from(i);
            let value = log_expected_improvement_factor(z);
            assert!(value.is_finite() && value > last - 1e-9, "at {z}: {value}");
            last = value;
        }
        // At z = 0 it is φ(0).
        assert!((log_expected_improvement_factor(0.0) - normal_pdf(0.0).ln()).abs() < 1e-7);
    }
}
