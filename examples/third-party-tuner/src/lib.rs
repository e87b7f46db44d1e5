//! "Sweep": walks every parameter of a search space from its low end to its high end in
//! `steps` even steps, all parameters together (normal-family parameters from mu - 2 sigma to
//! mu + 2 sigma). A complete third-party tuner in ~50 lines.

use knob_plugin_api::space::{DimKind, Encoding, SearchSpace};
use knob_plugin_api::{parse_class_args, Generated, ImportedTrial, PluginError, Tuner};
use serde_json::Value;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    steps: u64,
}

struct Sweep {
    steps: u64,
    encoding: Option<Encoding>,
    next: u64,
}

impl Tuner for Sweep {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let Args { steps } = parse_class_args("Sweep", class_args)?;
        if steps < 2 {
            return Err(PluginError::new("classArgs of Sweep: steps must be at least 2"));
        }
        Ok(Sweep { steps, encoding: None, next: 0 })
    }

    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        self.encoding = Some(space.encoding());
        Ok(())
    }

    fn generate_parameters(&mut self, _parameter_id: u64) -> Result<Generated, PluginError> {
        let encoding = self.encoding.as_ref().ok_or_else(|| PluginError::new("Sweep: no search space yet"))?;
        if self.next == self.steps {
            return Ok(Generated::NoMore);
        }
        let t = self.next as f64 / (self.steps - 1) as f64;
        self.next += 1;
        let point: Vec<f64> = encoding
            .dims()
            .iter()
            .map(|d| match d.kind() {
                DimKind::Gaussian => -2.0 + 4.0 * t, // mu - 2 sigma .. mu + 2 sigma
                kind => kind.range().0 + t * (kind.range().1 - kind.range().0),
            })
            .collect();
        Ok(Generated::Parameters(encoding.decode(&point)?))
    }

    fn receive_trial_result(&mut self, _id: u64, _parameters: &Value, _value: f64) -> Result<(), PluginError> {
        Ok(())
    }

    /// On `knob resume`: the earlier run's trials took the sweep's first points, so go on after
    /// them (and say `NoMore` once all `steps` were handed out, in either run).
    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        self.next = (self.next + trials.len() as u64).min(self.steps);
        Ok(())
    }
}

knob_plugin_api::export_plugin! {
    tuner "Sweep": Sweep = "walks all parameters from low to high together (third-party example)";
}
