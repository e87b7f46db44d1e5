//! The test problems of the multi-objective harness (`multi_objective.rs`), shared with knob's
//! screening driver (`tuners/examples/mo_driver.rs`) so that both score the same functions:
//! ZDT1–3 (Zitzler, Deb and Thiele 2000) and DTLZ2 with 3 objectives, on [0, 1]^n.

fn zdt_g(x: &[f64]) -> f64 {
    1.0 + 9.0 * x[1..].iter().sum::<f64>() / (x.len() - 1) as f64
}

pub fn zdt1(x: &[f64]) -> Vec<f64> {
    let g = zdt_g(x);
    vec![x[0], g * (1.0 - (x[0] / g).sqrt())]
}

pub fn zdt2(x: &[f64]) -> Vec<f64> {
    let g = zdt_g(x);
    vec![x[0], g * (1.0 - (x[0] / g).powi(2))]
}

pub fn zdt3(x: &[f64]) -> Vec<f64> {
    let g = zdt_g(x);
    let r = x[0] / g;
    vec![
        x[0],
        g * (1.0 - r.sqrt() - r * (10.0 * std::f64::consts::PI * x[0]).sin()),
    ]
}

pub fn dtlz2(x: &[f64]) -> Vec<f64> {
    use std::f64::consts::FRAC_PI_2;
    let g: f64 = x[2..].iter().map(|v| (v - 0.5).powi(2)).sum();
    let (a, b) = (x[0] * FRAC_PI_2, x[1] * FRAC_PI_2);
    vec![
        (1.0 + g) * a.cos() * b.cos(),
        (1.0 + g) * a.cos() * b.sin(),
        (1.0 + g) * a.sin(),
    ]
}
