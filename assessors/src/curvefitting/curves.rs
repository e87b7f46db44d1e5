//! NNI's 12 learning-curve families (`curvefunctions.py`, after Domhan et al. 2015), with the
//! starting parameters NNI fits them from. `x` is the epoch, counted from 1.

/// One parametric curve family.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CurveFamily {
    pub(crate) name: &'static str,
    pub(crate) initial: &'static [f64],
    pub(crate) value: fn(x: f64, p: &[f64]) -> f64,
}

/// In NNI's order (`curve_combination_models`).
pub(crate) const FAMILIES: [CurveFamily; 12] = [
    CurveFamily {
        name: "vap",
        initial: &[-0.622028, -0.470050, 0.042322],
        value: |x, p| (p[0] + p[1] / x + p[2] * x.ln()).exp(),
    },
    CurveFamily {
        name: "pow3",
        initial: &[0.84, 0.52, 0.01],
        value: |x, p| p[0] - p[1] * x.powf(-p[2]),
    },
    CurveFamily {
        name: "linear",
        initial: &[1.0, 0.0],
        value: |x, p| p[0] * x + p[1],
    },
    CurveFamily {
        name: "logx_linear",
        initial: &[0.378106, 0.046506],
        value: |x, p| p[0] * x.ln() + p[1],
    },
    CurveFamily {
        name: "dr_hill_zero_background",
        initial: &[0.772320, 0.586449, 2.460843],
        value: |x, p| (p[0] * x.powf(p[1])) / (p[2].powf(p[1]) + x.powf(p[1])),
    },
    CurveFamily {
        name: "log_power",
        initial: &[0.77, 2.98, -0.51],
        value: |x, p| p[0] / (1.0 + (x / p[1].exp()).powf(p[2])),
    },
    CurveFamily {
        name: "pow4",
        initial: &[0.1, 200.0, 0.0, 0.8],
        value: |x, p| p[3] - (p[1] * x + p[2]).powf(-p[0]),
    },
    CurveFamily {
        name: "mmf",
        initial: &[0.7, 0.1, 0.01, 5.0],
        value: |x, p| p[0] - (p[0] - p[1]) / (1.0 + (p[2] * x).powf(p[3])),
    },
    CurveFamily {
        name: "exp4",
        initial: &[0.7, 0.8, -0.8, 0.3],
        value: |x, p| p[0] - (-p[1] * x.powf(p[3]) + p[2]).exp(),
    },
    CurveFamily {
        name: "ilog2",
        initial: &[0.78, 0.43],
        value: |x, p| p[0] - p[1] / x.ln(),
    },
    CurveFamily {
        name: "weibull",
        initial: &[0.7, 0.1, 0.01, 1.0],
        value: |x, p| p[0] - (p[0] - p[1]) * (-(p[2] * x).powf(p[3])).exp(),
    },
    CurveFamily {
        name: "janoschek",
        initial: &[0.73, 0.07, 0.355, 0.46],
        value: |x, p| p[0] - (p[0] - p[1]) * (-p[2] * x.powf(p[3])).exp(),
    },
];
