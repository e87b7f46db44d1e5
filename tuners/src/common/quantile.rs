//! The standard normal quantile function, for dividing normal-family ranges by probability.
//!
//! NNI's grid search places normal parameters at `mu + sigma * sqrt(2) * erfinv(2p - 1)` (scipy);
//! that is the standard normal quantile, computed here with Wichura's algorithm AS241
//! (`PPND16`), accurate to about 1e-16, as Python's `statistics.NormalDist.inv_cdf` does.

/// The `p`-quantile of the standard normal distribution: `-inf` at 0, `+inf` at 1, NaN outside
/// `[0, 1]`.
// The coefficients are written as AS241 publishes them, so they can be checked against it.
#[allow(clippy::excessive_precision)]
pub(crate) fn standard_normal_quantile(p: f64) -> f64 {
    if !(0.0..=1.0).contains(&p) {
        return f64::NAN;
    }
    if p == 0.0 {
        return f64::NEG_INFINITY;
    }
    if p == 1.0 {
        return f64::INFINITY;
    }
    let q = p - 0.5;
    if q.abs() <= 0.425 {
        let r = 0.180625 - q * q;
        let num = poly(
            r,
            &[
                3.387_132_872_796_366_608e0,
                1.331_416_678_917_843_774_5e2,
                1.971_590_950_306_551_442_7e3,
                1.373_169_376_550_946_112_5e4,
                4.592_195_393_154_987_145_7e4,
                6.726_577_092_700_870_085_3e4,
                3.343_057_558_358_812_810_5e4,
                2.509_080_928_730_122_672_7e3,
            ],
        );
        let den = poly(
            r,
            &[
                1.0,
                4.231_333_070_160_091_125_2e1,
                6.871_870_074_920_579_083e2,
                5.394_196_021_424_751_107_7e3,
                2.121_379_430_158_659_586_7e4,
                3.930_789_580_009_271_061e4,
                2.872_908_573_572_194_267_4e4,
                5.226_495_278_852_854_561e3,
            ],
        );
        return q * num / den;
    }
    let tail = if q < 0.0 { p } else { 1.0 - p };
    let r = (-tail.ln()).sqrt();
    let x = if r <= 5.0 {
        let r = r - 1.6;
        poly(
            r,
            &[
                1.423_437_110_749_683_577_34e0,
                4.630_337_846_156_545_295_9e0,
                5.769_497_221_460_691_405_5e0,
                3.647_848_324_763_204_605_04e0,
                1.270_458_252_452_368_382_58e0,
                2.417_807_251_774_506_117_7e-1,
                2.272_384_498_926_918_458_33e-2,
                7.745_450_142_783_414_076_4e-4,
            ],
        ) / poly(
            r,
            &[
                1.0,
                2.053_191_626_637_758_821_87e0,
                1.676_384_830_183_803_849_4e0,
                6.897_673_349_851_000_045_5e-1,
                1.481_039_764_274_800_745_9e-1,
                1.519_866_656_361_645_719_66e-2,
                5.475_938_084_995_344_946e-4,
                1.050_750_071_644_416_843_24e-9,
            ],
        )
    } else {
        let r = r - 5.0;
        poly(
            r,
            &[
                6.657_904_643_501_103_777_2e0,
                5.463_784_911_164_114_369_9e0,
                1.784_826_539_917_291_335_8e0,
                2.965_605_718_285_048_912_3e-1,
                2.653_218_952_657_612_309_3e-2,
                1.242_660_947_388_078_438_6e-3,
                2.711_555_568_743_487_578_15e-5,
                2.010_334_399_292_288_132_65e-7,
            ],
        ) / poly(
            r,
            &[
                1.0,
                5.998_322_065_558_879_376_9e-1,
                1.369_298_809_227_358_053_1e-1,
                1.487_536_129_085_061_485_25e-2,
                7.868_691_311_456_132_591e-4,
                1.846_318_317_510_054_681_8e-5,
                1.421_511_758_316_445_888_7e-7,
                2.044_263_103_389_939_785_64e-15,
            ],
        )
    };
    if q < 0.0 {
        -x
    } else {
        x
    }
}

/// `c[0] + c[1] x + c[2] x^2 + ...` by Horner's rule.
fn poly(x: f64, coefficients: &[f64]) -> f64 {
    coefficients.iter().rev().fold(0.0, |acc, c| acc * x + c)
}

#[cfg(test)]
mod tests {
    use super::standard_normal_quantile as quantile;

    #[test]
    fn matches_known_quantiles() {
        // Reference values: Python's statistics.NormalDist().inv_cdf (AS241) and tables.
        let cases = [
            (0.5, 0.0),
            (0.75, 0.674_489_750_196_081_7),
            (0.975, 1.959_963_984_540_053_6),
            (0.999, 3.090_232_306_167_813),
            (0.125, -1.150_349_380_376_007_9),
            (1e-10, -6.361_340_902_404_056),
            (1e-300, -37.047_096_299_361_2),
        ];
        for (p, want) in cases {
            let got = quantile(p);
            assert!(
                (got - want).abs() <= 1e-14 * want.abs().max(1.0),
                "quantile({p}) = {got}, want {want}"
            );
        }
        assert_eq!(quantile(0.0), f64::NEG_INFINITY);
        assert_eq!(quantile(1.0), f64::INFINITY);
        assert!(quantile(1.5).is_nan());
        // Symmetric, so a grid's quartiles are mirror images.
        for p in [0.25, 0.125, 0.375, 0.01] {
            assert_eq!(quantile(p), -quantile(1.0 - p));
        }
    }
}
