//! The `local` training service: this machine is one environment, and trials run on it as
//! process groups (see `runner`).
//!
//! Class args (the config's `trainingService` object; keys are matched ignoring case and
//! underscores, as NNI does; fields that belong to the core, such as `platform`,
//! `useActiveGpu`, `gpuIndices` or `maxTrialNumberPerGpu`, are accepted and ignored here):
//!
//! - `gracePeriodSecs` (number, default 5, at most 3600): how long a killed trial's process
//!   group has between SIGTERM and SIGKILL.

use std::sync::Arc;
use std::time::Duration;

use knob_plugin_api::service::{Environment, ServiceEvent, TrialRequest};
use knob_plugin_api::{EventSink, PluginError, TrainingService};
use serde_json::Value;

use crate::metrics::Emit;
use crate::runner::TrialError;
use crate::trial_pool::{PoolError, TrialPool};

/// The id of the one environment.
pub const ENVIRONMENT_ID: &str = "local";
/// `NNI_PLATFORM` of local trials (it makes `nni` 2.x use the file channel).
pub const PLATFORM: &str = crate::trial_pool::PLATFORM;

const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(5);
const MAX_GRACE_PERIOD_SECS: f64 = 3600.0;

/// What can go wrong in the local service, one line each.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("classArgs of training service local: {0}")]
    ClassArgs(String),
    #[error("training service local cannot start: {what}: {source}")]
    Startup {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("training service local has no environment {0:?}; its only environment is \"local\"")]
    UnknownEnvironment(String),
    #[error("trial {0} is already running on training service local; trial ids must be unique")]
    DuplicateTrial(String),
    #[error("training service local is shut down; no trial can start")]
    ShutDown,
    #[error(transparent)]
    Trial(#[from] TrialError),
}

impl From<LocalError> for PluginError {
    fn from(e: LocalError) -> PluginError {
        PluginError::new(e.to_string())
    }
}

/// The local service's settings, from its class args.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalArgs {
    pub grace_period: Duration,
}

impl Default for LocalArgs {
    fn default() -> Self {
        LocalArgs {
            grace_period: DEFAULT_GRACE_PERIOD,
        }
    }
}

impl LocalArgs {
    pub fn parse(class_args: &Value) -> Result<LocalArgs, LocalError> {
        let mut args = LocalArgs::default();
        let fields = match class_args {
            Value::Null => return Ok(args),
            Value::Object(fields) => fields,
            other => {
                return Err(LocalError::ClassArgs(format!(
                    "expected an object, got {other}"
                )))
            }
        };
        for (key, value) in fields {
            let normalized: String = key
                .chars()
                .filter(|c| *c != '_')
                .map(|c| c.to_ascii_lowercase())
                .collect();
            if normalized == "graceperiodsecs" {
                args.grace_period = value
                    .as_f64()
                    .filter(|secs| (0.0..=MAX_GRACE_PERIOD_SECS).contains(secs))
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| {
                        LocalError::ClassArgs(format!(
                            "{key} must be a number of seconds from 0 to {MAX_GRACE_PERIOD_SECS}, got {value}"
                        ))
                    })?;
            }
        }
        Ok(args)
    }
}

/// Runs trials on this machine through a [`TrialPool`]. All work happens on the pool's tokio
/// runtime; the trait methods only hand work to it, and return at once (except `shutdown`,
/// which waits for the trials).
pub struct LocalService {
    pool: TrialPool,
    hostname: String,
    emit: Emit,
}

impl LocalService {
    /// Builds the service with events going to `emit` (what `TrainingService::new` does with
    /// the host's event sink; tests pass their own).
    pub fn with_emitter(class_args: &Value, emit: Emit) -> Result<LocalService, LocalError> {
        let args = LocalArgs::parse(class_args)?;
        let pool = TrialPool::new("training service local", args.grace_period, emit.clone())
            .map_err(|e| match e {
                PoolError::Startup { what, source } => LocalError::Startup { what, source },
                other => LocalError::Startup {
                    what: "cannot start",
                    source: std::io::Error::other(other.to_string()),
                },
            })?;
        let hostname = nix::unistd::gethostname()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".to_string());
        Ok(LocalService {
            pool,
            hostname,
            emit,
        })
    }

    /// Where the NNI v3 channel listens (127.0.0.1 and an ephemeral port).
    pub fn channel_address(&self) -> std::net::SocketAddr {
        self.pool.channel_address()
    }

    pub fn environment(&self) -> Environment {
        Environment {
            id: ENVIRONMENT_ID.to_string(),
            host: self.hostname.clone(),
            ready: !self.pool.is_shut_down(),
            inventory: Value::Null,
        }
    }

    /// Starts a trial. On `Err` nothing was started and no event follows for it.
    pub fn start(&mut self, request: &TrialRequest) -> Result<(), LocalError> {
        if self.pool.is_shut_down() {
            return Err(LocalError::ShutDown);
        }
        if request.environment_id != ENVIRONMENT_ID {
            return Err(LocalError::UnknownEnvironment(
                request.environment_id.clone(),
            ));
        }
        self.pool.start(request).map_err(|e| match e {
            PoolError::DuplicateTrial(id) => LocalError::DuplicateTrial(id),
            PoolError::ShutDown => LocalError::ShutDown,
            PoolError::Trial(e) => LocalError::Trial(e),
            PoolError::Startup { what, source } => LocalError::Startup { what, source },
        })
    }

    /// Stops a running trial; a trial that is not running (already ended) is left alone.
    pub fn kill(&mut self, trial_id: &str, reason: &str) {
        if !self.pool.kill(trial_id, reason) {
            knob_plugin_api::log::debug(&format!(
                "training service local: kill of trial {trial_id} ignored, it is not running"
            ));
        }
    }

    /// Kills every running trial and waits until each has ended (its `TrialEnded` emitted),
    /// at most the grace period and a few seconds more; then closes the HTTP channel.
    pub fn stop(&mut self) {
        if self.pool.is_shut_down() {
            return;
        }
        let left = self.pool.stop("the training service is shutting down");
        if !left.is_empty() {
            (self.emit)(ServiceEvent::Warning {
                trial_id: None,
                message: format!(
                    "training service local stopped before these trials were seen to end: {left:?}"
                ),
            });
        }
    }
}

impl TrainingService for LocalService {
    fn new(class_args: &Value, events: EventSink) -> Result<Self, PluginError> {
        let emit: Emit = Arc::new(move |event: ServiceEvent| events.emit(&event));
        Ok(LocalService::with_emitter(class_args, emit)?)
    }

    fn environments(&mut self) -> Result<Vec<Environment>, PluginError> {
        Ok(vec![self.environment()])
    }

    fn start_trial(&mut self, request: TrialRequest) -> Result<(), PluginError> {
        Ok(self.start(&request)?)
    }

    fn kill_trial(&mut self, trial_id: &str, reason: &str) -> Result<(), PluginError> {
        self.kill(trial_id, reason);
        Ok(())
    }

    fn shutdown(&mut self) -> Result<(), PluginError> {
        self.stop();
        Ok(())
    }
}

impl Drop for LocalService {
    fn drop(&mut self) {
        // Trials never outlive the service that started them (the pool's drop shuts its
        // runtime down after this).
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_args() {
        assert_eq!(
            LocalArgs::parse(&Value::Null).unwrap(),
            LocalArgs::default()
        );
        let args = serde_json::json!({"platform": "local", "grace_period_secs": 0.5});
        assert_eq!(
            LocalArgs::parse(&args).unwrap().grace_period,
            Duration::from_millis(500)
        );
        let err = LocalArgs::parse(&serde_json::json!({"gracePeriodSecs": "5"})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "classArgs of training service local: gracePeriodSecs must be a number of seconds from 0 to 3600, got \"5\""
        );
        let err = LocalArgs::parse(&serde_json::json!([1])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "classArgs of training service local: expected an object, got [1]"
        );
    }
}
