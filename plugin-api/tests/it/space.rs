//! The NNI search-space model: parsing and validation messages, sampling distributions, the
//! numeric encoding, and parameters validation.

use std::collections::BTreeMap;

use expect_test::{expect, Expect};
use knob_plugin_api::space::{quantize, seeded_rng, Encoding, ParamType, SearchSpace};
use rand::Rng;
use serde_json::{json, Value};

/// Parses `input`; prints the model (one line per parameter) and three samples drawn with a fixed
/// seed, or the error.
fn check(input: &str, expect: Expect) {
    let actual = match SearchSpace::parse(input) {
        Ok(space) => {
            let mut rng = seeded_rng(7);
            let samples: Vec<String> = (0..3).map(|_| space.sample(&mut rng).to_string()).collect();
            format!("{space}{}\n", samples.join("\n"))
        }
        Err(e) => format!("error: {e}\n"),
    };
    expect.assert_eq(&actual);
}

// ---- every _type ----

#[test]
fn choice_of_any_json() {
    check(
        r#"{"act": {"_type": "choice", "_value": ["relu", 0.5, 3, true, null, [1, 2], {"a": 1}]}}"#,
        expect![[r#"
            act: choice ["relu", 0.5, 3, true, null, [1,2], {"a":1}]
            {"act":"relu"}
            {"act":0.5}
            {"act":{"a":1}}
        "#]],
    );
}

#[test]
fn randint_gives_integers_in_half_open_range() {
    check(
        r#"{"layers": {"_type": "randint", "_value": [2, 5]}}"#,
        expect![[r#"
            layers: randint [2, 5)
            {"layers":2}
            {"layers":2}
            {"layers":4}
        "#]],
    );
}

#[test]
fn uniform_and_quniform() {
    check(
        r#"{"dropout": {"_type": "uniform", "_value": [0.1, 0.5]},
            "units": {"_type": "quniform", "_value": [1, 10, 3]}}"#,
        expect![[r#"
            dropout: uniform [0.1, 0.5]
            units: quniform [1, 10] q=3
            {"dropout":0.10020278439081368,"units":3.0}
            {"dropout":0.4606364007337703,"units":9.0}
            {"dropout":0.2966773055611198,"units":6.0}
        "#]],
    );
}

#[test]
fn loguniform_and_qloguniform() {
    check(
        r#"{"lr": {"_type": "loguniform", "_value": [1e-5, 0.1]},
            "batch": {"_type": "qloguniform", "_value": [16, 1024, 16]}}"#,
        expect![[r#"
            lr: loguniform [0.00001, 0.1]
            batch: qloguniform [16, 1024] q=16
            {"lr":0.00001004680201242981,"batch":48.0}
            {"lr":0.040398385335202576,"batch":512.0}
            {"lr":0.0009263456268515901,"batch":192.0}
        "#]],
    );
}

#[test]
fn normal_family_is_unclipped() {
    check(
        r#"{"n": {"_type": "normal", "_value": [0, 1]},
            "qn": {"_type": "qnormal", "_value": [10, 5, 2]},
            "ln": {"_type": "lognormal", "_value": [0, 1]},
            "qln": {"_type": "qlognormal", "_value": [0, 1, 0.5]}}"#,
        expect![[r#"
            n: normal mu=0 sigma=1
            qn: qnormal mu=10 sigma=5 q=2
            ln: lognormal mu=0 sigma=1
            qln: qlognormal mu=0 sigma=1 q=0.5
            {"n":0.0037272898804840836,"qn":16.0,"ln":0.3772461597286305,"qln":1.0}
            {"n":-1.2612125705815194,"qn":10.0,"ln":0.4414499382142614,"qln":1.0}
            {"n":0.7354242689862046,"qn":10.0,"ln":0.31549481290718745,"qln":0.5}
        "#]],
    );
}

#[test]
fn nested_choice() {
    check(
        r#"{"layer": {"_type": "choice", "_value": [
              {"_name": "conv", "kernel": {"_type": "choice", "_value": [3, 5]},
                                "stride": {"_type": "randint", "_value": [1, 3]}},
              {"_name": "pool", "size": {"_type": "quniform", "_value": [2, 4, 1]}},
              {"_name": "identity"}]},
            "lr": {"_type": "loguniform", "_value": [0.001, 0.1]}}"#,
        expect![[r#"
            layer: choice {conv, pool, identity}
            layer/conv/kernel: choice [3, 5]
            layer/conv/stride: randint [1, 3)
            layer/pool/size: quniform [2, 4] q=1
            lr: loguniform [0.001, 0.1]
            {"layer":{"_name":"conv","kernel":3,"stride":2},"lr":0.0015105337362556384}
            {"layer":{"_name":"pool","size":2.0},"lr":0.034918841530822024}
            {"layer":{"_name":"pool","size":3.0},"lr":0.0010373148563851938}
        "#]],
    );
}

#[test]
fn key_order_is_json_order() {
    check(
        r#"{"zeta": {"_type": "choice", "_value": [1]}, "alpha": {"_type": "choice", "_value": [2]},
            "mid": {"_type": "choice", "_value": [3]}}"#,
        expect![[r#"
            zeta: choice [1]
            alpha: choice [2]
            mid: choice [3]
            {"zeta":1,"alpha":2,"mid":3}
            {"zeta":1,"alpha":2,"mid":3}
            {"zeta":1,"alpha":2,"mid":3}
        "#]],
    );
}

#[test]
fn empty_space_and_integral_float_bounds() {
    check(
        "{}",
        expect![[r#"
        {}
        {}
        {}
    "#]],
    );
    check(
        r#"{"n": {"_type": "randint", "_value": [1.0, 3.0]}}"#,
        expect![[r#"
            n: randint [1, 3)
            {"n":1}
            {"n":1}
            {"n":2}
        "#]],
    );
}

// ---- every validation error, one check each ----

#[test]
fn errors_in_the_space_structure() {
    check(
        r#"{"lr": "#,
        expect![[r#"
            error: search space is not valid JSON: EOF while parsing a value at line 1 column 7
        "#]],
    );
    check(
        r#"[1, 2]"#,
        expect![[r#"
            error: search space must be a JSON object like {"name": {"_type": ..., "_value": [...]}}, got [1,2]
        "#]],
    );
    check(
        r#"{"lr": [0.1, 0.2]}"#,
        expect![[r#"
            error: search space parameter "lr": expected an object {"_type": ..., "_value": [...]}, got [0.1,0.2]
        "#]],
    );
    check(
        r#"{"lr": {"_value": [0, 1]}}"#,
        expect![[r#"
            error: search space parameter "lr": missing "_type"; expected one of choice, randint, uniform, quniform, loguniform, qloguniform, normal, qnormal, lognormal, qlognormal
        "#]],
    );
    check(
        r#"{"lr": {"_type": "lognuniform", "_value": [0, 1]}}"#,
        expect![[r#"
            error: search space parameter "lr": unknown _type "lognuniform"; expected one of choice, randint, uniform, quniform, loguniform, qloguniform, normal, qnormal, lognormal, qlognormal
        "#]],
    );
    check(
        r#"{"lr": {"_type": 3, "_value": [0, 1]}}"#,
        expect![[r#"
            error: search space parameter "lr": "_type" must be a string, one of choice, randint, uniform, quniform, loguniform, qloguniform, normal, qnormal, lognormal, qlognormal; got 3
        "#]],
    );
    check(
        r#"{"lr": {"_type": "quniform"}}"#,
        expect![[r#"
            error: search space parameter "lr": missing "_value"; quniform needs "_value": [low, high, q]
        "#]],
    );
    check(
        r#"{"lr": {"_type": "uniform", "_value": {"low": 0, "high": 1}}}"#,
        expect![[r#"
            error: search space parameter "lr": "_value" must be a list [low, high] for uniform, got {"low":0,"high":1}
        "#]],
    );
}

#[test]
fn errors_stay_on_one_line() {
    check(
        r#"{"a\"\nb": {"_type": "choice", "_value": [{"_name": "x\ny"}, {"_name": "x\ny"}]}}"#,
        expect![[r#"
            error: search space parameter "a\"\nb": nested choice has two options named "x\ny" (options 0 and 1); option names must be unique
        "#]],
    );
}

#[test]
fn errors_in_the_arguments() {
    // Wrong arity.
    check(
        r#"{"lr": {"_type": "quniform", "_value": [0, 1]}}"#,
        expect![[r#"
            error: search space parameter "lr": quniform needs 3 values [low, high, q], got 2: [0, 1]
        "#]],
    );
    check(
        r#"{"lr": {"_type": "normal", "_value": [0, 1, 2]}}"#,
        expect![[r#"
            error: search space parameter "lr": normal needs 2 values [mu, sigma], got 3: [0, 1, 2]
        "#]],
    );
    // Wrong kinds of numbers.
    check(
        r#"{"lr": {"_type": "uniform", "_value": [0, "1"]}}"#,
        expect![[r#"
            error: search space parameter "lr": uniform needs numbers [low, high], got [0, "1"]
        "#]],
    );
    check(
        r#"{"n": {"_type": "randint", "_value": [0, 1.5]}}"#,
        expect![[r#"
            error: search space parameter "n": randint needs integers [low, high] within 64 bits, got [0, 1.5]
        "#]],
    );
    check(
        r#"{"n": {"_type": "randint", "_value": [0, 1e19]}}"#,
        expect![[r#"
            error: search space parameter "n": randint needs integers [low, high] within 64 bits, got [0, 1e+19]
        "#]],
    );
    // low >= high.
    check(
        r#"{"lr": {"_type": "uniform", "_value": [1, 1]}}"#,
        expect![[r#"
            error: search space parameter "lr": uniform needs low < high, got [1, 1]
        "#]],
    );
    check(
        r#"{"n": {"_type": "randint", "_value": [5, 2]}}"#,
        expect![[r#"
            error: search space parameter "n": randint needs low < high (it draws from [low, high)), got [5, 2]
        "#]],
    );
    // Log types with low <= 0.
    check(
        r#"{"lr": {"_type": "qloguniform", "_value": [0, 10, 1]}}"#,
        expect![[r#"
            error: search space parameter "lr": qloguniform needs 0 < low < high, got [0, 10, 1]
        "#]],
    );
    // q <= 0, sigma <= 0, an empty choice.
    check(
        r#"{"units": {"_type": "quniform", "_value": [0, 10, 0]}}"#,
        expect![[r#"
            error: search space parameter "units": quniform needs q > 0, got [0, 10, 0]
        "#]],
    );
    check(
        r#"{"w": {"_type": "lognormal", "_value": [0, -1]}}"#,
        expect![[r#"
            error: search space parameter "w": lognormal needs sigma > 0, got [0, -1]
        "#]],
    );
    check(
        r#"{"act": {"_type": "choice", "_value": []}}"#,
        expect![[r#"
            error: search space parameter "act": choice needs at least one value, got []
        "#]],
    );
}

#[test]
fn errors_in_nested_choices() {
    // The message names the full path of a parameter inside a nested choice.
    check(
        r#"{"optimizer": {"_type": "choice", "_value": [{"_name": "adam",
              "lr": {"_type": "loguniform", "_value": [-1, 0.1]}}]}}"#,
        expect![[r#"
            error: search space parameter "optimizer/adam/lr": loguniform needs 0 < low < high, got [-1, 0.1]
        "#]],
    );
    check(
        r#"{"layer": {"_type": "choice", "_value": [{"_name": "conv"}, {"size": 3}]}}"#,
        expect![[r#"
            error: search space parameter "layer": nested choice option 1 has no "_name" (got {"size":3}); when one choice value is an object with "_name", every value must be
        "#]],
    );
    check(
        r#"{"layer": {"_type": "choice", "_value": [{"_name": 1}]}}"#,
        expect![[r#"
            error: search space parameter "layer": nested choice option 0 has "_name" 1; it must be a string
        "#]],
    );
    check(
        r#"{"layer": {"_type": "choice", "_value": [{"_name": "conv"}, {"_name": "pool"}, {"_name": "conv"}]}}"#,
        expect![[r#"
            error: search space parameter "layer": nested choice has two options named "conv" (options 0 and 2); option names must be unique
        "#]],
    );
    check(
        r#"{"layer": {"_type": "choice", "_value": [{"_name": "conv", "kernel": 3}]}}"#,
        expect![[r#"
            error: search space parameter "layer/conv/kernel": expected an object {"_type": ..., "_value": [...]}, got 3
        "#]],
    );
}

/// Spaces whose samples or encodings could overflow to infinity are refused.
#[test]
fn errors_for_ranges_that_overflow() {
    check(
        r#"{"x": {"_type": "uniform", "_value": [-1e308, 1e308]}}"#,
        expect![[r#"
            error: search space parameter "x": uniform needs high - low to be finite, got [-1e+308, 1e+308]
        "#]],
    );
    check(
        r#"{"x": {"_type": "normal", "_value": [0, 1e308]}}"#,
        expect![[r#"
            error: search space parameter "x": normal needs mu ± 10*sigma to be finite, got [0, 1e+308]
        "#]],
    );
    check(
        r#"{"x": {"_type": "lognormal", "_value": [700, 1]}}"#,
        expect![[r#"
            error: search space parameter "x": lognormal needs exp(mu ± 10*sigma) to be positive and finite (mu - 10*sigma >= -744, mu + 10*sigma <= 709), got [700, 1]
        "#]],
    );
    check(
        r#"{"x": {"_type": "quniform", "_value": [0, 1e300, 1e-300]}}"#,
        expect![[r#"
            error: search space parameter "x": quniform needs q large enough that value / q stays finite, got [0, 1e+300, 1e-300]
        "#]],
    );
    check(
        r#"{"x": {"_type": "uniform", "_value": [0, 1e400]}}"#,
        expect![[r#"
            error: search space is not valid JSON: number out of range at line 1 column 46
        "#]],
    );
}

#[test]
fn error_nesting_too_deep() {
    let mut space = json!({"leaf": {"_type": "uniform", "_value": [0, 1]}});
    for level in 0..40 {
        // The option object is the sub-space plus its `_name`.
        let mut option = space;
        option["_name"] = json!(format!("o{level}"));
        space = json!({"c": {"_type": "choice", "_value": [option]}});
    }
    let err = SearchSpace::from_value(&space).unwrap_err().to_string();
    assert!(err.contains("more than 32 levels deep"), "{err}");
}

/// No input panics: mutated copies of valid spaces either parse or give an error, and whatever
/// parses samples values that belong to it and survive the encoding.
#[test]
fn mutated_inputs_never_panic() {
    let seeds = [
        r#"{"a": {"_type": "quniform", "_value": [1, 10, 3]}, "b": {"_type": "choice", "_value": [{"_name": "x", "c": {"_type": "randint", "_value": [-9, 9]}}, {"_name": "y"}]}}"#,
        r#"{"n": {"_type": "qlognormal", "_value": [1e2, 3, 1e-3]}, "m": {"_type": "normal", "_value": [-1e5, 1e-9]}}"#,
    ];
    let alphabet = b"{}[]\":,0123456789.-e_abcdefghijklmnopqrstuvwxyz ";
    let mut rng = seeded_rng(99);
    let mut parsed = 0;
    for i in 0..4000 {
        let mut bytes = seeds[i % seeds.len()].as_bytes().to_vec();
        let digits: Vec<usize> = (0..bytes.len())
            .filter(|&i| bytes[i].is_ascii_digit())
            .collect();
        for _ in 0..rng.gen_range(1..4) {
            // Mostly change digits, so that many mutants still parse and reach the samplers.
            if rng.gen_bool(0.7) {
                bytes[digits[rng.gen_range(0..digits.len())]] = b"0123456789"[rng.gen_range(0..10)];
            } else {
                let at = rng.gen_range(0..bytes.len());
                bytes[at] = alphabet[rng.gen_range(0..alphabet.len())];
            }
        }
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        if let Ok(space) = SearchSpace::parse(&text) {
            parsed += 1;
            let params = space.sample(&mut rng);
            space.validate_parameters(&params).unwrap();
            let encoding = space.encoding();
            let decoded = encoding.decode(&encoding.encode(&params).unwrap()).unwrap();
            space.validate_parameters(&decoded).unwrap();
        }
    }
    assert!(
        parsed > 1000,
        "only {parsed} mutants parsed: the fuzzing is too weak"
    );
}

// ---- sampling follows each distribution ----

const DRAWS: usize = 50_000;

/// Kolmogorov's asymptotic critical value at significance 0.001 is 1.949 / sqrt(n), 0.0087 for
/// n = 50 000: a correct sampler exceeds it for one seed in a thousand, and the seed is fixed, so
/// the outcome is stable. A sigma 5% off or a mean 0.05 sigma off moves a normal CDF by about
/// 0.012 and is caught: `ks_detects_a_wrong_distribution` checks that.
fn ks_bound() -> f64 {
    1.95 / (DRAWS as f64).sqrt()
}

fn draws(space: &str, name: &str, seed: u64) -> Vec<f64> {
    let space = SearchSpace::parse(space).unwrap();
    let param = space.get(name).unwrap();
    let mut rng = seeded_rng(seed);
    (0..DRAWS)
        .map(|_| param.sample(&mut rng).as_f64().unwrap())
        .collect()
}

/// The largest distance between the empirical CDF of `xs` and `cdf`.
fn ks_statistic(mut xs: Vec<f64>, cdf: impl Fn(f64) -> f64) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len() as f64;
    xs.iter()
        .enumerate()
        .map(|(i, &x)| {
            let f = cdf(x);
            (f - i as f64 / n).max((i + 1) as f64 / n - f)
        })
        .fold(0.0, f64::max)
}

/// erf(x) for |x| < 3 by the everywhere-positive series
/// `2/sqrt(pi) e^{-x^2} sum 2^n x^{2n+1} / (1*3*...*(2n+1))` (no cancellation), erfc beyond by
/// its continued fraction; both to ~1e-16 (see `erf_matches_reference_values`).
fn erfc(x: f64) -> f64 {
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    if x < 3.0 {
        let (mut term, mut sum, mut n) = (x, x, 0.0);
        while term > 1e-17 * sum {
            n += 1.0;
            term *= 2.0 * x * x / (2.0 * n + 1.0);
            sum += term;
        }
        return 1.0 - 2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp() * sum;
    }
    let mut tail = x;
    for n in (1..=200).rev() {
        tail = x + (n as f64 / 2.0) / tail;
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / tail
}

fn normal_cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

#[test]
fn erf_matches_reference_values() {
    // Python's math.erf / math.erfc.
    for (x, erf) in [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
    ] {
        assert!((1.0 - erfc(x) - erf).abs() < 1e-15, "erf({x})");
    }
    for (x, erfc_ref) in [
        (3.0, 2.209_049_699_858_543_8e-5),
        (4.0, 1.541_725_790_028_002e-8),
        (5.0, 1.537_459_794_428_035_1e-12),
        (8.0, 1.122_429_717_298_292_8e-29),
    ] {
        assert!(((erfc(x) - erfc_ref) / erfc_ref).abs() < 1e-13, "erfc({x})");
    }
}

fn assert_ks(space: &str, name: &str, cdf: impl Fn(f64) -> f64) {
    assert_ks_of(name, draws(space, name, 1), cdf);
}

fn assert_ks_of(name: &str, xs: Vec<f64>, cdf: impl Fn(f64) -> f64) {
    let d = ks_statistic(xs, cdf);
    assert!(d < ks_bound(), "{name}: KS statistic {d} >= {}", ks_bound());
}

#[test]
fn continuous_types_follow_their_cdf() {
    let space = r#"{"u": {"_type": "uniform", "_value": [-2, 3]},
                    "lu": {"_type": "loguniform", "_value": [1e-4, 1]},
                    "n": {"_type": "normal", "_value": [1, 2]},
                    "ln": {"_type": "lognormal", "_value": [0.5, 0.75]}}"#;
    assert_ks(space, "u", |x| (x + 2.0) / 5.0);
    assert_ks(space, "lu", |x| (x.ln() - 1e-4f64.ln()) / -(1e-4f64.ln()));
    assert_ks(space, "n", |x| normal_cdf((x - 1.0) / 2.0));
    assert_ks(space, "ln", |x| normal_cdf((x.ln() - 0.5) / 0.75));
}

#[test]
fn ks_detects_a_wrong_distribution() {
    // 5% too wide a sigma, or a mean off by 0.05 sigma, must be caught at this sample size.
    let space = r#"{"n": {"_type": "normal", "_value": [1, 2]}}"#;
    let xs = draws(space, "n", 1);
    let wide = ks_statistic(xs.clone(), |x| normal_cdf((x - 1.0) / 2.1));
    let shifted = ks_statistic(xs, |x| normal_cdf((x - 1.1) / 2.0));
    assert!(
        wide > ks_bound() && shifted > ks_bound(),
        "{wide} {shifted}"
    );
}

/// Probability of each value, keyed by the value's bits.
type Pmf = BTreeMap<u64, f64>;

/// Pearson's chi-square of `counts` (value -> count) against `pmf` (value -> probability), bins
/// with an expected count under 5 merged. Panics on a value the pmf says is impossible.
fn chi_square(counts: &BTreeMap<u64, usize>, pmf: &Pmf) -> (f64, usize) {
    for value in counts.keys() {
        assert!(
            pmf.get(value).is_some_and(|&p| p > 0.0),
            "impossible value {}",
            f64::from_bits(*value)
        );
    }
    let n = DRAWS as f64;
    let (mut stat, mut bins, mut rest_o, mut rest_e) = (0.0, 0, 0.0, 0.0);
    for (value, p) in pmf {
        let o = counts.get(value).copied().unwrap_or(0) as f64;
        if p * n < 5.0 {
            (rest_o, rest_e) = (rest_o + o, rest_e + p * n);
        } else {
            stat += (o - p * n).powi(2) / (p * n);
            bins += 1;
        }
    }
    if rest_e > 0.0 {
        stat += (rest_o - rest_e).powi(2) / rest_e;
        bins += 1;
    }
    (stat, bins - 1)
}

/// The chi-square critical value at significance 0.001 (z = 3.090), by Wilson–Hilferty, which is
/// within 1% of the exact quantile for df >= 3.
fn chi_square_bound(df: usize) -> f64 {
    let df = df as f64;
    let h = 2.0 / (9.0 * df);
    df * (1.0 - h + 3.090 * h.sqrt()).powi(3)
}

fn assert_fits(name: &str, values: &[f64], pmf: &Pmf) {
    let total: f64 = pmf.values().sum();
    assert!((total - 1.0).abs() < 1e-9, "{name}: pmf sums to {total}");
    let mut counts = BTreeMap::new();
    for v in values {
        *counts.entry(v.to_bits()).or_insert(0) += 1;
    }
    let (stat, df) = chi_square(&counts, pmf);
    assert!(df >= 3, "{name}: only {df} degrees of freedom");
    let bound = chi_square_bound(df);
    assert!(
        stat < bound,
        "{name}: chi-square {stat} >= {bound} (df {df})"
    );
}

/// The exact pmf of `clip(round(x / q) * q)` where `mass(a, b)` is the probability of x in
/// `[a, b]`; `clip` for the uniform family.
fn q_pmf(
    q: f64,
    ks: std::ops::RangeInclusive<i64>,
    clip: Option<(f64, f64)>,
    mass: impl Fn(f64, f64) -> f64,
) -> Pmf {
    let mut pmf = BTreeMap::new();
    for k in ks {
        let mut value = k as f64 * q;
        if let Some((low, high)) = clip {
            value = value.max(low).min(high);
        }
        let p = mass((k as f64 - 0.5) * q, (k as f64 + 0.5) * q);
        *pmf.entry((value + 0.0).to_bits()).or_insert(0.0) += p;
    }
    pmf
}

/// Draws `name`; checks every value is a multiple of `q` (or a clip bound) inside the clip, and
/// that the values follow `pmf`.
fn assert_q_type(space: &str, name: &str, q: f64, clip: Option<(f64, f64)>, pmf: &Pmf) {
    let values = draws(space, name, 2);
    for &v in &values {
        let on_grid = ((v / q).round() * q - v).abs() <= 1e-12 * v.abs().max(1.0);
        let at_clip = clip.is_some_and(|(low, high)| v == low || v == high);
        assert!(on_grid || at_clip, "{name}: {v} is not a multiple of {q}");
        if let Some((low, high)) = clip {
            assert!(
                (low..=high).contains(&v),
                "{name}: {v} outside [{low}, {high}]"
            );
        }
    }
    assert_fits(name, &values, pmf);
}

#[test]
fn q_types_follow_their_pmf_and_land_on_multiples_of_q() {
    let space = r#"{"qu": {"_type": "quniform", "_value": [1, 20, 3]},
                    "qlu": {"_type": "qloguniform", "_value": [1, 100, 8]},
                    "qn": {"_type": "qnormal", "_value": [3, 2.5, 1.5]},
                    "qln": {"_type": "qlognormal", "_value": [1, 0.5, 0.5]}}"#;
    // Length of [a, b] inside [low, high].
    let within = |low: f64, high: f64, a: f64, b: f64| (b.min(high) - a.max(low)).max(0.0);

    let clip = Some((1.0, 20.0));
    let pmf = q_pmf(3.0, 0..=7, clip, |a, b| within(1.0, 20.0, a, b) / 19.0);
    assert_q_type(space, "qu", 3.0, clip, &pmf);

    let clip = Some((1.0, 100.0));
    let pmf = q_pmf(8.0, 0..=13, clip, |a, b| {
        within(0.0, 100f64.ln(), a.max(1e-300).ln(), b.ln()) / 100f64.ln()
    });
    assert_q_type(space, "qlu", 8.0, clip, &pmf);

    let pmf = q_pmf(1.5, -20..=25, None, |a, b| {
        normal_cdf((b - 3.0) / 2.5) - normal_cdf((a - 3.0) / 2.5)
    });
    assert_q_type(space, "qn", 1.5, None, &pmf);

    let pmf = q_pmf(0.5, 0..=400, None, |a, b| {
        normal_cdf((b.ln() - 1.0) / 0.5) - normal_cdf((a.max(0.0).ln() - 1.0) / 0.5)
    });
    assert_q_type(space, "qln", 0.5, None, &pmf);
}

#[test]
fn choice_and_randint_are_uniform() {
    let space = r#"{"c": {"_type": "choice", "_value": ["a", "b", "c", "d", "e", "f"]},
                    "r": {"_type": "randint", "_value": [-3, 7]}}"#;
    let space = SearchSpace::parse(space).unwrap();
    let mut rng = seeded_rng(3);
    let (mut choices, mut ints) = (Vec::new(), Vec::new());
    for _ in 0..DRAWS {
        let params = space.sample(&mut rng);
        let c = params["c"].as_str().unwrap().as_bytes()[0] - b'a';
        choices.push(f64::from(c));
        assert!(
            params["r"].is_i64(),
            "randint must give a JSON integer: {params}"
        );
        ints.push(params["r"].as_i64().unwrap() as f64);
    }
    let uniform = |values: std::ops::Range<i64>| {
        let p = 1.0 / (values.end - values.start) as f64;
        values.map(|v| ((v as f64).to_bits(), p)).collect()
    };
    assert_fits("choice", &choices, &uniform(0..6));
    assert_fits("randint", &ints, &uniform(-3..7));
    // The same draws against a randint [-3, 8) must fail: the test has power.
    let mut counts = BTreeMap::new();
    for v in &ints {
        *counts.entry(v.to_bits()).or_insert(0) += 1;
    }
    let (stat, df) = chi_square(&counts, &uniform(-3..8));
    assert!(stat > chi_square_bound(df), "{stat}");
}

#[test]
fn nested_choice_picks_options_uniformly_with_their_sub_parameters() {
    let space = SearchSpace::parse(
        r#"{"layer": {"_type": "choice", "_value": [
              {"_name": "a", "x": {"_type": "uniform", "_value": [0, 1]}},
              {"_name": "b"}, {"_name": "c", "y": {"_type": "randint", "_value": [0, 2]}},
              {"_name": "d"}]}}"#,
    )
    .unwrap();
    let mut rng = seeded_rng(4);
    let mut picks = Vec::new();
    for _ in 0..DRAWS {
        let layer = space.sample(&mut rng)["layer"].clone();
        let keys: Vec<&str> = layer
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let name = layer["_name"].as_str().unwrap();
        match name {
            "a" => assert_eq!(keys, ["_name", "x"]),
            "c" => assert_eq!(keys, ["_name", "y"]),
            _ => assert_eq!(keys, ["_name"]),
        }
        picks.push(f64::from(name.as_bytes()[0] - b'a'));
    }
    let pmf = (0..4).map(|v| (f64::from(v).to_bits(), 0.25)).collect();
    assert_fits("nested", &picks, &pmf);
}

#[test]
fn quantize_rounds_half_to_even_then_clips() {
    assert_eq!(quantize(2.5, Some(1.0), None), 2.0);
    assert_eq!(quantize(3.5, Some(1.0), None), 4.0);
    assert_eq!(quantize(1.4, Some(3.0), Some((1.0, 10.0))), 1.0);
    assert_eq!(quantize(9.9, Some(3.0), Some((1.0, 10.0))), 9.0);
    assert_eq!(quantize(11.0, Some(3.0), Some((1.0, 10.0))), 10.0);
    assert_eq!(quantize(-0.2, Some(1.0), None).to_bits(), 0.0f64.to_bits());
    let qu = SearchSpace::parse(r#"{"x": {"_type": "quniform", "_value": [1, 10, 3]}}"#).unwrap();
    assert_eq!(qu.parameters()[0].param_type().round_and_clip(10.4), 9.0);
    assert_eq!(qu.parameters()[0].param_type().round_and_clip(11.0), 10.0);
    let ri = ParamType::RandInt { low: 2, high: 5 };
    assert_eq!(ri.round_and_clip(7.2), 4.0);
}

#[test]
fn seeded_rng_is_deterministic() {
    let space = SearchSpace::parse(r#"{"x": {"_type": "normal", "_value": [0, 1]}}"#).unwrap();
    let run = |seed| {
        let mut rng = seeded_rng(seed);
        (0..50).map(|_| space.sample(&mut rng)).collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

// ---- encoding ----

const ALL_TYPES: &str = r#"{
    "c": {"_type": "choice", "_value": ["x", 2, {"k": 1}]},
    "r": {"_type": "randint", "_value": [-5, 5]},
    "u": {"_type": "uniform", "_value": [-1, 1]},
    "qu": {"_type": "quniform", "_value": [0, 10, 0.1]},
    "lu": {"_type": "loguniform", "_value": [1e-6, 1]},
    "qlu": {"_type": "qloguniform", "_value": [1, 1000, 7]},
    "n": {"_type": "normal", "_value": [5, 0.1]},
    "qn": {"_type": "qnormal", "_value": [0, 10, 3]},
    "ln": {"_type": "lognormal", "_value": [-2, 1]},
    "qln": {"_type": "qlognormal", "_value": [1, 1, 0.25]},
    "opt": {"_type": "choice", "_value": [
        {"_name": "adam", "lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]},
                          "inner": {"_type": "choice", "_value": [{"_name": "p", "v": {"_type": "uniform", "_value": [0, 1]}}, {"_name": "q"}]}},
        {"_name": "sgd", "lr": {"_type": "uniform", "_value": [0, 1]}}]}
}"#;

#[test]
fn encoding_dimensions() {
    let encoding = SearchSpace::parse(ALL_TYPES).unwrap().encoding();
    let dims: Vec<String> = encoding
        .dims()
        .iter()
        .map(|d| {
            format!(
                "{}: {:?} {:?} {:?}",
                d.path(),
                d.kind(),
                d.kind().range(),
                d.condition()
            )
        })
        .collect();
    expect![[r#"
        c: Categorical { size: 3 } (0.0, 2.0) None
        r: Integer { size: 10 } (0.0, 9.0) None
        u: Unit (0.0, 1.0) None
        qu: Unit (0.0, 1.0) None
        lu: Unit (0.0, 1.0) None
        qlu: Unit (0.0, 1.0) None
        n: Gaussian (-10.0, 10.0) None
        qn: Gaussian (-10.0, 10.0) None
        ln: Gaussian (-10.0, 10.0) None
        qln: Gaussian (-10.0, 10.0) None
        opt: Categorical { size: 2 } (0.0, 1.0) None
        opt/adam/lr: Unit (0.0, 1.0) Some(Condition { dim: 10, option: 0 })
        opt/adam/inner: Categorical { size: 2 } (0.0, 1.0) Some(Condition { dim: 10, option: 0 })
        opt/adam/inner/p/v: Unit (0.0, 1.0) Some(Condition { dim: 12, option: 0 })
        opt/sgd/lr: Unit (0.0, 1.0) Some(Condition { dim: 10, option: 1 })"#]]
    .assert_eq(&dims.join("\n"));
}

fn close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn encode_then_decode_gives_back_the_parameters() {
    let space = SearchSpace::parse(ALL_TYPES).unwrap();
    let encoding = space.encoding();
    let mut rng = seeded_rng(11);
    for _ in 0..3000 {
        let params = space.sample(&mut rng);
        let vector = encoding.encode(&params).unwrap();
        let active = encoding.active(&vector);
        for (i, x) in vector.iter().enumerate() {
            let (lo, hi) = encoding.dims()[i].kind().range();
            assert_eq!(x.is_nan(), !active[i], "dimension {i} of {vector:?}");
            assert!(x.is_nan() || (lo..=hi).contains(x), "dimension {i} = {x}");
        }
        let decoded = encoding.decode(&vector).unwrap();
        assert!(close(&decoded, &params), "{params}\n{decoded}");
        // Exact for everything but the continuous non-q types (exp/ln round-trips by an ulp).
        for key in ["c", "r", "qu", "qlu", "qn", "qln"] {
            assert_eq!(decoded[key], params[key], "{key}");
        }
    }
}

/// A tuner that draws from the encoded prior and decodes gets the space's own distribution.
#[test]
fn decoded_prior_samples_follow_the_space() {
    let space = SearchSpace::parse(ALL_TYPES).unwrap();
    let encoding = space.encoding();
    let mut rng = seeded_rng(14);
    let (mut lu, mut ln) = (Vec::new(), Vec::new());
    for _ in 0..DRAWS {
        let vector = encoding.sample_vector(&mut rng);
        let active = encoding.active(&vector);
        assert!(vector.iter().zip(&active).all(|(x, &on)| x.is_nan() != on));
        let params = encoding.decode(&vector).unwrap();
        space.validate_parameters(&params).unwrap();
        lu.push(params["lu"].as_f64().unwrap());
        ln.push(params["ln"].as_f64().unwrap());
    }
    assert_ks_of("lu", lu, |x| (x.ln() - 1e-6f64.ln()) / -(1e-6f64.ln()));
    assert_ks_of("ln", ln, |x| normal_cdf(x.ln() + 2.0));
}

#[test]
fn decode_then_encode_gives_back_the_vector() {
    let space = SearchSpace::parse(
        r#"{"u": {"_type": "uniform", "_value": [-3, 8]}, "lu": {"_type": "loguniform", "_value": [0.01, 50]},
            "n": {"_type": "normal", "_value": [-4, 3]}, "ln": {"_type": "lognormal", "_value": [0, 2]}}"#,
    )
    .unwrap();
    let encoding = space.encoding();
    let mut rng = seeded_rng(12);
    for _ in 0..2000 {
        let v: Vec<f64> = (0..4)
            .map(|i| {
                let u: f64 = rng.gen();
                if i < 2 {
                    u
                } else {
                    8.0 * u - 4.0
                }
            })
            .collect();
        let back = encoding.encode(&encoding.decode(&v).unwrap()).unwrap();
        for (a, b) in v.iter().zip(&back) {
            assert!((a - b).abs() < 1e-9, "{v:?} -> {back:?}");
        }
    }
}

#[test]
fn decode_clamps_and_rejects_nan_in_active_dimensions() {
    let encoding = SearchSpace::parse(ALL_TYPES).unwrap().encoding();
    let mut v = vec![
        7.0,
        -100.0,
        3.0,
        -1.0,
        2.0,
        0.9999,
        1e9,
        f64::INFINITY,
        -50.0,
        -11.0,
    ];
    // opt = sgd: adam's dimensions are inactive and may hold anything.
    v.extend([1.2, f64::NAN, f64::NAN, f64::NAN, 55.0]);
    let decoded = encoding.decode(&v).unwrap();
    expect![[r#"{"c":{"k":1},"r":-5,"u":1.0,"qu":0.0,"lu":1.0,"qlu":1000.0,"n":6.0,"qn":99.0,"ln":6.14421235332821e-6,"qln":0.0,"opt":{"_name":"sgd","lr":1.0}}"#]]
    .assert_eq(&decoded.to_string());
    encoding.space().validate_parameters(&decoded).unwrap();

    v[14] = f64::NAN;
    expect![[r#"encoded vector: dimension 14 ("opt/sgd/lr") is NaN but active; only parameters of unchosen nested options may be NaN"#]]
    .assert_eq(&encoding.decode(&v).unwrap_err().to_string());
    expect!["encoded vector: has 3 numbers, the search space has 15 dimensions"]
        .assert_eq(&encoding.decode(&v[..3]).unwrap_err().to_string());
}

#[test]
fn empty_space_encodes_to_nothing() {
    let encoding = Encoding::new(&SearchSpace::parse("{}").unwrap());
    assert!(encoding.is_empty());
    assert_eq!(encoding.decode(&[]).unwrap(), json!({}));
}

// ---- validate_parameters ----

fn check_params(params: Value, expect: Expect) {
    let space = SearchSpace::parse(ALL_TYPES).unwrap();
    let actual = match space.validate_parameters(&params) {
        Ok(()) => "ok\n".to_owned(),
        Err(e) => format!("error: {e}\n"),
    };
    expect.assert_eq(&actual);
}

fn valid() -> Value {
    json!({"c": 2, "r": 4, "u": 0.5, "qu": 0.3, "lu": 0.001, "qlu": 1000, "n": 5.1, "qn": -3,
           "ln": 0.2, "qln": 0.0, "opt": {"_name": "adam", "lr": 0.01, "inner": {"_name": "q"}}})
}

fn with(path: &[&str], value: Value) -> Value {
    let mut params = valid();
    let mut slot = &mut params;
    for key in path {
        slot = &mut slot[*key];
    }
    *slot = value;
    params
}

#[test]
fn validate_parameters_accepts_members() {
    let space = SearchSpace::parse(ALL_TYPES).unwrap();
    space.validate_parameters(&valid()).unwrap();
    // 2.0 is the choice's 2 (valid() has qlu = 1000, a clip bound that is no multiple of 7).
    space
        .validate_parameters(&with(&["c"], json!(2.0)))
        .unwrap();
    let mut rng = seeded_rng(13);
    for _ in 0..2000 {
        space.validate_parameters(&space.sample(&mut rng)).unwrap();
    }
}

/// A name from outside is cut in a message as a value is (a tuner handed out a 20 MiB key, and
/// the one error line, printed and stored, was 20 MiB): its first 120 characters, then `...`.
#[test]
fn a_huge_name_is_cut_in_messages_as_values_are() {
    let huge = "K".repeat(1 << 20);
    let cut = format!("{}...", "K".repeat(120));
    let error = |params: Value| {
        SearchSpace::parse(ALL_TYPES)
            .unwrap()
            .validate_parameters(&params)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        error(with(&[huge.as_str()], json!(1))),
        format!("trial parameter \"{cut}\": not in the search space; expected only [c, r, u, qu, lu, qlu, n, qn, ln, qln, opt]")
    );
    assert_eq!(
        error(with(&["opt", huge.as_str()], json!(1))),
        format!("trial parameter \"opt/adam/{}...\": not in the search space; expected only [lr, inner]", "K".repeat(111))
    );
    // The search space's own names, and a multibyte name cut on a character's boundary.
    let wide = "é".repeat(200);
    let space = format!(r#"{{"{wide}": {{"_type": "uniform", "_value": [1]}}}}"#);
    assert_eq!(
        SearchSpace::parse(&space).unwrap_err().to_string(),
        format!(
            "search space parameter \"{}...\": uniform needs 2 values [low, high], got 1: [1]",
            "é".repeat(120)
        )
    );
    let space = format!(r#"{{"{wide}": {{"_type": "uniform", "_value": [0, 1]}}}}"#);
    let error = SearchSpace::parse(&space)
        .unwrap()
        .validate_parameters(&json!({"x": 1}))
        .unwrap_err()
        .to_string();
    assert!(error.len() < 1000, "{error}");
}

#[test]
fn validate_parameters_rejects_strangers() {
    check_params(
        json!([1]),
        expect![[r#"
            error: trial parameters: must be a JSON object of parameter values, got [1]
        "#]],
    );
    let mut missing = valid();
    missing.as_object_mut().unwrap().shift_remove("qu");
    check_params(
        missing,
        expect![[r#"
            error: trial parameter "qu": missing; the search space has it as quniform [0, 10] q=0.1
        "#]],
    );
    check_params(
        with(&["extra"], json!(1)),
        expect![[r#"
            error: trial parameter "extra": not in the search space; expected only [c, r, u, qu, lu, qlu, n, qn, ln, qln, opt]
        "#]],
    );
    check_params(
        with(&["c"], json!("y")),
        expect![[r#"
            error: trial parameter "c": "y" is not one of the choice's values ["x", 2, {"k":1}]
        "#]],
    );
    check_params(
        with(&["r"], json!(5)),
        expect![[r#"
            error: trial parameter "r": expected an integer in [-5, 5) (randint), got 5
        "#]],
    );
    check_params(
        with(&["r"], json!(1.5)),
        expect![[r#"
            error: trial parameter "r": expected an integer in [-5, 5) (randint), got 1.5
        "#]],
    );
    check_params(
        with(&["u"], json!("0.5")),
        expect![[r#"
            error: trial parameter "u": expected a number (uniform [-1, 1]), got "0.5"
        "#]],
    );
    check_params(
        with(&["lu"], json!(2)),
        expect![[r#"
            error: trial parameter "lu": 2 is outside loguniform [1e-6, 1]
        "#]],
    );
    check_params(
        with(&["qu"], json!(0.35)),
        expect![[r#"
            error: trial parameter "qu": 0.35 is not a multiple of q (quniform [0, 10] q=0.1)
        "#]],
    );
    check_params(
        with(&["ln"], json!(0)),
        expect![[r#"
            error: trial parameter "ln": 0 is not > 0 (lognormal mu=-2 sigma=1)
        "#]],
    );
    check_params(
        with(&["opt"], json!({"_name": "rmsprop"})),
        expect![[r#"
            error: trial parameter "opt": expected an object {"_name": one of [adam, sgd], ...}, got {"_name":"rmsprop"}
        "#]],
    );
    check_params(
        with(&["opt", "lr"], json!(0.5)),
        expect![[r#"
            error: trial parameter "opt/adam/lr": 0.5 is outside loguniform [0.0001, 0.1]
        "#]],
    );
    check_params(
        with(&["opt", "inner", "v"], json!(0.5)),
        expect![[r#"
            error: trial parameter "opt/adam/inner/q/v": not in the search space; nothing is expected here
        "#]],
    );
}
