//! knob-core's integration tests: one binary, one module per area.

mod api_stream;
mod busy_service;
mod config;
mod config_v1;
mod experiment;
mod importance;
mod notifications;
#[path = "../../../training-services/tests/it/prerequisite.rs"]
mod prerequisite;
mod sim;
mod store;

/// The built-in training services' config checks, linked in (the core reaches them through the
/// plugin ABI; these tests check what the core does with their answers).
pub struct BuiltInServices;

impl knob_core::config::ServiceChecker for BuiltInServices {
    fn platforms(&self) -> Vec<String> {
        knob_training_services::BUILT_IN
            .iter()
            .map(|name| name.to_string())
            .collect()
    }

    fn check(
        &self,
        platform: &str,
        config: &serde_json::Value,
        context: &knob_plugin_api::service::ServiceContext,
    ) -> Result<knob_plugin_api::service::ConfigCheck, String> {
        use knob_plugin_api::service::ConfigCheck;
        match knob_training_services::check_built_in(platform, config, context) {
            Some(Ok(checked)) => Ok(ConfigCheck::Checked(checked)),
            Some(Err(problems)) => Ok(ConfigCheck::Problems(problems)),
            None => Err(format!("{platform} is not built in")),
        }
    }
}

impl knob_core::config::ServiceSource for BuiltInServices {
    fn checker(
        &self,
        _plugin_paths: &[std::path::PathBuf],
    ) -> &dyn knob_core::config::ServiceChecker {
        self
    }
}
