//! Two third-party components, written from `docs/writing-a-plugin.md`:
//!
//! - "Halton": a low-discrepancy sequence over the search space. Point `i` takes, in dimension
//!   `d`, the radical inverse of `i + 1 + skip` in the `d`-th prime base, so the points cover the
//!   space evenly from the first few on. The SDK's encoding maps the unit cube to parameters.
//! - "FinalMedian": stops a trial whose latest intermediate result, after `min_steps` reports, is
//!   worse than the median of the final results of the trials finished so far (once there are
//!   `min_trials` of them). "Worse" follows the experiment's optimize_mode, which the host hands
//!   to the assessor; the finals come through `trial_final`.

use knob_plugin_api::space::{DimKind, Encoding, SearchSpace};
use knob_plugin_api::{
    parse_class_args, Assessor, AssessorContext, Generated, ImportedTrial, OptimizeMode,
    PluginError, Tuner, Verdict,
};
use serde_json::Value;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HaltonArgs {
    /// How many points of the sequence to skip (another seed, the same even spread).
    #[serde(default)]
    skip: u64,
    /// Ignored: Halton does not learn from results. Accepted so that a config written for
    /// another tuner can switch to this one.
    #[serde(default)]
    #[allow(dead_code)]
    optimize_mode: Option<String>,
}

struct Halton {
    skip: u64,
    encoding: Option<Encoding>,
    /// How many points were handed out: parameter ids need not be consecutive (the docs say so),
    /// so the sequence counts its own points.
    handed_out: u64,
}

/// The radical inverse of `index` in `base`: its digits mirrored behind the point.
fn radical_inverse(mut index: u64, base: u64) -> f64 {
    let (mut value, mut scale) = (0.0, 1.0 / base as f64);
    while index > 0 {
        value += (index % base) as f64 * scale;
        index /= base;
        scale /= base as f64;
    }
    value
}

/// The first `n` primes, one base per dimension.
fn primes(n: usize) -> Vec<u64> {
    let mut primes: Vec<u64> = Vec::with_capacity(n);
    let mut candidate = 2;
    while primes.len() < n {
        if primes.iter().all(|p| candidate % p != 0) {
            primes.push(candidate);
        }
        candidate += 1;
    }
    primes
}

impl Tuner for Halton {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args: HaltonArgs = parse_class_args("Halton", class_args)?;
        Ok(Halton { skip: args.skip, encoding: None, handed_out: 0 })
    }

    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        self.encoding = Some(space.encoding());
        Ok(())
    }

    fn generate_parameters(&mut self, _parameter_id: u64) -> Result<Generated, PluginError> {
        let encoding = self.encoding.as_ref().ok_or_else(|| PluginError::new("Halton: no search space yet"))?;
        let index = self.handed_out + 1 + self.skip;
        self.handed_out += 1;
        let bases = primes(encoding.len());
        let point: Vec<f64> = encoding
            .dims()
            .iter()
            .zip(bases)
            .map(|(dim, base)| {
                let u = radical_inverse(index, base);
                match dim.kind() {
                    // Equal shares of [0, 1) per index.
                    DimKind::Categorical { size } | DimKind::Integer { size } => (u * size as f64).floor(),
                    DimKind::Unit => u,
                    // Normal-family parameters: evenly over mu - 3 sigma .. mu + 3 sigma.
                    DimKind::Gaussian => -3.0 + 6.0 * u,
                }
            })
            .collect();
        Ok(Generated::Parameters(encoding.decode(&point)?))
    }

    fn receive_trial_result(&mut self, _id: u64, _parameters: &Value, _value: f64) -> Result<(), PluginError> {
        Ok(())
    }

    /// On `knob resume`: every trial of the earlier run took a point of the sequence (the guide:
    /// count it as handed out, with or without a result), so the sequence goes on after them
    /// instead of handing out its first points again.
    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        self.handed_out += trials.len() as u64;
        Ok(())
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FinalMedianArgs {
    #[serde(default = "three")]
    min_steps: usize,
    #[serde(default = "three")]
    min_trials: usize,
}
fn three() -> usize {
    3
}

struct FinalMedian {
    args: FinalMedianArgs,
    mode: OptimizeMode,
    finals: Vec<f64>,
}

impl FinalMedian {
    fn median(&self) -> Option<f64> {
        if self.finals.len() < self.args.min_trials.max(1) {
            return None;
        }
        let mut sorted = self.finals.clone();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        Some(if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 })
    }
}

impl Assessor for FinalMedian {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args: FinalMedianArgs = parse_class_args("FinalMedian", class_args)?;
        // Until the host says otherwise (a host older than assessor contexts never does).
        Ok(FinalMedian { args, mode: OptimizeMode::Maximize, finals: Vec::new() })
    }

    fn set_context(&mut self, context: &AssessorContext) -> Result<(), PluginError> {
        self.mode = context.optimize_mode;
        Ok(())
    }

    fn assess_trial(&mut self, _trial_id: &str, history: &[f64]) -> Result<Verdict, PluginError> {
        let (Some(&latest), Some(median)) = (history.last(), self.median()) else {
            return Ok(Verdict::good());
        };
        if history.len() < self.args.min_steps {
            return Ok(Verdict::good());
        }
        let worse = match self.mode {
            OptimizeMode::Maximize => latest < median,
            OptimizeMode::Minimize => latest > median,
        };
        Ok(if worse {
            Verdict::stop(format!(
                "step {}: {latest} is worse than the median final {median} ({} trials, {})",
                history.len(),
                self.finals.len(),
                self.mode.as_str()
            ))
        } else {
            Verdict::good()
        })
    }

    fn trial_final(&mut self, _trial_id: &str, value: f64) -> Result<(), PluginError> {
        // NaN is "no usable result" (the docs): it is not a final to compare with.
        if value.is_finite() {
            self.finals.push(value);
        }
        Ok(())
    }
}

knob_plugin_api::export_plugin! {
    tuner "Halton": Halton = "Halton low-discrepancy sequence over the search space (third-party example)";
    assessor "FinalMedian": FinalMedian = "stops a trial worse than the median final so far (third-party example)";
}
