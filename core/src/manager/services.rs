//! The experiment's training services (one per configured platform: local, remote, or both in
//! NNI's hybrid mode) and the environments each one owns.
//!
//! Environments come from the services: the one `local` environment is probed by the core itself
//! (see `placement.rs`); a remote service reports one environment per host, with the host's
//! inventory as gpu-sched JSON (limits already applied), which is registered with the scheduler
//! as is. A placement's environment decides which service starts the trial.

use std::path::{Path, PathBuf};

use knob_plugin_api::host::{PluginRegistry, TrainingServiceHandle};
use knob_plugin_api::service::{Environment, ServiceEvent};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{Manager, ManagerError};
use crate::config::{ExperimentConfig, RemoteConfig, Secret, TrainingServiceConfig};

/// How many times one trial is run again because the host running it was lost. Host losses are
/// not the trial's fault, so they do not use up `maxTrialRetries`; the bound keeps a trial that
/// itself takes hosts down (exhausting memory, say) from cycling through every host forever.
pub(super) const MAX_HOST_LOSS_REQUEUES: u32 = 3;

/// One running training service.
pub(super) struct ServiceSlot {
    /// The platform, which is also the plugin's name: `local`, `remote`.
    pub platform: &'static str,
    pub handle: TrainingServiceHandle,
}

/// What the manager knows about one environment.
#[derive(Debug, Clone)]
pub(super) struct EnvironmentRecord {
    /// Index into `Manager::services`.
    pub service: usize,
    pub host: String,
    pub ready: bool,
}

/// An event with the index of the service that reported it.
pub(super) type TaggedEvent = (usize, Result<ServiceEvent, String>);

/// The training-service plugins a config needs, in config order.
pub(super) fn service_names(config: &ExperimentConfig) -> Vec<&'static str> {
    config
        .training_service
        .iter()
        .map(TrainingServiceConfig::platform)
        .collect()
}

/// The class args a service is constructed with. `config_file` is the file the experiment was
/// read from, if any.
pub(super) fn class_args(
    experiment_id: &str,
    service: &TrainingServiceConfig,
    config_file: Option<&Path>,
) -> Result<Value, ManagerError> {
    match service {
        // Local trials always run on the one local environment, so reuseMode changes nothing,
        // and the GPU limits are the core's (it probes this machine itself).
        TrainingServiceConfig::Local(_) => Ok(Value::Object(Default::default())),
        TrainingServiceConfig::Remote(remote) => {
            remote_class_args(experiment_id, remote, config_file)
        }
    }
}

/// The remote service's class args. Passwords and passphrases are revealed here, into this
/// in-memory JSON only: it goes to the plugin and nowhere else (never to the store or a log).
///
/// `excludeFiles` names the files that may hold a secret in clear: `config_file` (the
/// experiment's config, which NNI users keep in the trial code directory) and every machine's
/// `sshKeyFile`. The service leaves those that lie in the trial code directory out of the code
/// it uploads to the hosts; trials never need them.
pub fn remote_class_args(
    experiment_id: &str,
    remote: &RemoteConfig,
    config_file: Option<&Path>,
) -> Result<Value, ManagerError> {
    let mut machines = Vec::with_capacity(remote.machine_list.len());
    for (index, machine) in remote.machine_list.iter().enumerate() {
        let name = format!(
            "machineList[{index}] ({}@{}:{})",
            machine.user, machine.host, machine.port
        );
        let reveal = |secret: &Option<Secret>, what: &str, variable: &str| {
            match secret {
            Some(secret) if secret.is_redacted() => Err(ManagerError::MissingSecret(format!(
                "{name}: its SSH {what} is not known (knob never stores it); keep the original config file beside the experiment, or set {variable}"
            ))),
            Some(secret) => Ok(Value::from(secret.expose())),
            None => Ok(Value::Null),
        }
        };
        let mut entry = json!({
            "host": machine.host,
            "port": machine.port,
            "user": machine.user,
            "useActiveGpu": machine.use_active_gpu,
            "maxTrialNumberPerGpu": machine.max_trial_number_per_gpu,
            "gpuIndices": machine.gpu_indices,
            "pythonPath": machine.python_path,
            "acceptNewHostKey": machine.accept_new_host_key,
            "sshKeyFile": machine.ssh_key_file,
        });
        let fields = entry.as_object_mut().expect("a JSON object");
        let password = reveal(&machine.password, "password", PASSWORD_VARIABLE)?;
        if !password.is_null() {
            fields.insert("password".into(), password);
        }
        let passphrase = reveal(
            &machine.ssh_passphrase,
            "key passphrase",
            PASSPHRASE_VARIABLE,
        )?;
        if !passphrase.is_null() {
            fields.insert("sshPassphrase".into(), passphrase);
        }
        machines.push(entry);
    }
    let mut args = json!({
        "experimentId": experiment_id,
        "reuseMode": remote.reuse_mode,
        "hostLossTimeoutSecs": remote.host_loss_timeout.as_secs(),
        "machineList": machines,
    });
    let fields = args.as_object_mut().expect("a JSON object");
    if let Some(file) = &remote.known_hosts_file {
        fields.insert("knownHostsFile".into(), json!(file));
    }
    if let Some(root) = &remote.agent_root {
        fields.insert("agentRoot".into(), json!(root));
    }
    let mut exclude: Vec<PathBuf> = config_file
        .into_iter()
        .map(Path::to_path_buf)
        .chain(
            remote
                .machine_list
                .iter()
                .filter_map(|machine| machine.ssh_key_file.clone()),
        )
        // The service wants absolute paths; the config's are already, a relative command-line
        // path is made absolute here (it is this process's working directory that it means).
        .filter_map(|path| std::path::absolute(path).ok())
        .collect();
    exclude.sort();
    exclude.dedup();
    // JSON holds only UTF-8 paths. Those from the config's text always are; a config file whose
    // own path is not UTF-8 cannot be named, and is then left out only by an ignore file.
    let exclude: Vec<&str> = exclude.iter().filter_map(|path| path.to_str()).collect();
    fields.insert("excludeFiles".into(), json!(exclude));
    Ok(args)
}

/// The environment variable `knob resume` reads an SSH password from when the original config
/// file is gone.
pub const PASSWORD_VARIABLE: &str = "KNOB_SSH_PASSWORD";
/// Same, for an SSH key's passphrase.
pub const PASSPHRASE_VARIABLE: &str = "KNOB_SSH_PASSPHRASE";

/// Constructs every service of the config; each one's events arrive on `events` tagged with its
/// index.
pub(super) async fn start_services(
    experiment_id: &str,
    config: &ExperimentConfig,
    config_file: Option<&Path>,
    registry: &PluginRegistry,
    events: &mpsc::UnboundedSender<TaggedEvent>,
) -> Result<Vec<ServiceSlot>, ManagerError> {
    let mut slots = Vec::new();
    for (index, service) in config.training_service.iter().enumerate() {
        let platform = service.platform();
        let args = class_args(experiment_id, service, config_file)?;
        let events = events.clone();
        let handle = registry
            .training_service(platform, &args, move |event| {
                let _ = events.send((index, event));
            })
            .map_err(|e| ManagerError::Service {
                service: platform.to_string(),
                message: e.to_string(),
            });
        match handle {
            Ok(handle) => slots.push(ServiceSlot { platform, handle }),
            Err(e) => {
                shut_down(&slots).await;
                return Err(e);
            }
        }
    }
    Ok(slots)
}

/// Asks every service to shut down (all at once: each may wait for its trials) and waits for
/// them. A service that fails to shut down has nothing left to do for the experiment either.
pub(super) async fn shut_down(slots: &[ServiceSlot]) {
    let replies: Vec<_> = slots.iter().map(|slot| slot.handle.shutdown()).collect();
    for reply in replies {
        let _ = reply.get().await;
    }
}

impl Manager {
    /// At start: every service's environments, and whatever the services reported while they
    /// connected (a warning naming an unreachable host, say). Fails when no environment can take
    /// trials, or when no environment could ever take a trial of this config.
    pub(super) async fn register_environments(&mut self) -> Result<(), ManagerError> {
        for index in 0..self.services.len() {
            let platform = self.services[index].platform;
            match self.services[index].handle.environments().get().await {
                Ok(environments) => {
                    for environment in environments {
                        self.on_environment(index, environment).await?;
                    }
                }
                // In hybrid mode the other services may still run the experiment; whether any
                // environment is left is decided below, with this reason in the error.
                Err(e) => {
                    let message = e.to_string();
                    // A service's own errors usually name it already.
                    let message = if message.contains(&format!("training service {platform}")) {
                        message
                    } else {
                        format!("training service {platform} has no environment: {message}")
                    };
                    self.service_problem(message).await?
                }
            }
        }
        let mut pending = Vec::new();
        while let Ok(event) = self.service_events.try_recv() {
            pending.push(event);
        }
        self.on_service_events(pending).await?;
        if !self.environments.values().any(|record| record.ready) {
            return Err(ManagerError::NoEnvironment(self.no_environment_reason()));
        }
        self.placer.check().map_err(ManagerError::Placement)
    }

    /// Registers what a service says about one of its environments: the owner, whether it takes
    /// trials, and (for remote environments) its inventory in the scheduler.
    pub(super) async fn on_environment(
        &mut self,
        service: usize,
        environment: Environment,
    ) -> Result<(), ManagerError> {
        let platform = self.services[service].platform;
        if let Some(record) = self.environments.get(&environment.id) {
            if record.service != service {
                let owner = self.services[record.service].platform;
                return self
                    .warn(
                        None,
                        format!(
                            "training service {platform} reported environment {}, which belongs to training service {owner}; ignored",
                            environment.id
                        ),
                    )
                    .await;
            }
        }
        let id = environment.id.clone();
        let was_ready = self.environments.get(&id).map(|record| record.ready);
        let mut ready = environment.ready;
        if platform == "local" {
            // The core probes this machine itself; the service's word only says whether it runs.
            if !ready {
                self.placer
                    .set_unavailable(&id, "its training service says it is not ready");
            }
        } else if ready {
            match serde_json::from_value::<knob_gpu_sched::Environment>(environment.inventory) {
                Ok(mut inventory) => {
                    inventory.id = id.as_str().into();
                    inventory.status = knob_gpu_sched::EnvironmentStatus::Ready;
                    if let Err(reason) = self.placer.upsert(inventory) {
                        ready = false;
                        self.notice(format!(
                            "environment {id} ({}): its inventory is not usable ({reason}); no trial runs there",
                            environment.host
                        ))
                        .await?;
                    }
                }
                Err(e) => {
                    ready = false;
                    self.notice(format!(
                        "environment {id} ({}): its inventory cannot be read ({e}); no trial runs there",
                        environment.host
                    ))
                    .await?;
                }
            }
        } else {
            self.placer
                .set_unavailable(&id, &format!("host {} is not reachable", environment.host));
        }
        match (was_ready, ready) {
            (Some(true), false) => {
                self.notice(format!(
                    "environment {id} ({}) is not ready; no new trial starts there until it is back",
                    environment.host
                ))
                .await?
            }
            (None, false) => {
                self.notice(format!(
                    "environment {id} ({}) is not ready; no trial starts there until it is",
                    environment.host
                ))
                .await?
            }
            (Some(false), true) => {
                self.notice(format!(
                    "environment {id} ({}) is ready again",
                    environment.host
                ))
                .await?
            }
            _ => {}
        }
        self.environments.insert(
            id,
            EnvironmentRecord {
                service,
                host: environment.host,
                ready,
            },
        );
        Ok(())
    }

    /// A host is gone for good (its service said so with a trial's `environment_lost`): the
    /// scheduler forgets it, so waiting trials go elsewhere. If it comes back, its service
    /// reports it again and it is registered anew.
    pub(super) async fn lose_environment(
        &mut self,
        environment_id: &str,
        reason: &str,
    ) -> Result<(), ManagerError> {
        let Some(record) = self.environments.get_mut(environment_id) else {
            return Ok(());
        };
        if !record.ready && !self.placer.knows(environment_id) {
            return Ok(());
        }
        record.ready = false;
        self.placer.remove(environment_id);
        self.notice(format!("environment {environment_id} lost: {reason}"))
            .await
    }

    /// A service's own word about its environments: a notice, and kept (the latest few) for the
    /// error if no environment is left.
    pub(super) async fn service_problem(&mut self, message: String) -> Result<(), ManagerError> {
        const KEPT: usize = 16;
        if self.service_problems.len() == KEPT {
            self.service_problems.remove(0);
        }
        self.service_problems.push(message.clone());
        self.notice(message).await
    }

    /// A warning about environments: recorded like every warning, and shown on the console.
    pub(super) async fn notice(&mut self, message: String) -> Result<(), ManagerError> {
        std::sync::Arc::make_mut(&mut self.notices).push(message.clone());
        self.warn(None, message).await?;
        self.publish(None);
        Ok(())
    }

    /// Why no environment can take trials, for the experiment's error.
    pub(super) fn no_environment_reason(&self) -> String {
        let names: Vec<String> = self
            .environments
            .iter()
            .map(|(id, record)| format!("{id} ({})", record.host))
            .collect();
        let mut reason = if names.is_empty() {
            "no training service reported an environment".to_string()
        } else {
            format!("no environment can run trials: {}", names.join(", "))
        };
        // What the services said about it, the latest few (a flapping host repeats itself).
        let skip = self.service_problems.len().saturating_sub(3);
        let problems: Vec<&str> = self.service_problems[skip..]
            .iter()
            .map(String::as_str)
            .collect();
        if !problems.is_empty() {
            reason.push_str(&format!(" — {}", problems.join("; ")));
        }
        reason
    }

    /// The service that owns an environment.
    pub(super) fn owner_of(&self, environment_id: &str) -> Option<usize> {
        self.environments
            .get(environment_id)
            .map(|record| record.service)
    }
}

/// Fills the secrets that a stored config lost (they are stored as `***`) from the config file
/// the experiment was created from, if it still names the same machines, or else from
/// [`PASSWORD_VARIABLE`] / [`PASSPHRASE_VARIABLE`]. Machines without secrets need nothing. Any
/// secret still missing is left redacted; the manager's start then says which and what to do.
pub fn restore_secrets(
    config: &mut ExperimentConfig,
    original: Option<&ExperimentConfig>,
    password_variable: Option<&str>,
    passphrase_variable: Option<&str>,
) {
    let original_machines: Vec<&crate::config::MachineConfig> = original
        .into_iter()
        .flat_map(|config| &config.training_service)
        .filter_map(|service| match service {
            TrainingServiceConfig::Remote(remote) => Some(&remote.machine_list),
            TrainingServiceConfig::Local(_) => None,
        })
        .flatten()
        .collect();
    for service in &mut config.training_service {
        let TrainingServiceConfig::Remote(remote) = service else {
            continue;
        };
        for machine in &mut remote.machine_list {
            let same = original_machines.iter().find(|other| {
                other.host == machine.host
                    && other.port == machine.port
                    && other.user == machine.user
            });
            let refill = |secret: &mut Option<Secret>,
                          from_file: Option<&Option<Secret>>,
                          variable: Option<&str>| {
                if !secret.as_ref().is_some_and(Secret::is_redacted) {
                    return;
                }
                let found = from_file
                    .and_then(Option::as_ref)
                    .filter(|s| !s.is_redacted())
                    .cloned()
                    .or_else(|| variable.map(Secret::new));
                if let Some(found) = found {
                    *secret = Some(found);
                }
            };
            refill(
                &mut machine.password,
                same.map(|m| &m.password),
                password_variable,
            );
            refill(
                &mut machine.ssh_passphrase,
                same.map(|m| &m.ssh_passphrase),
                passphrase_variable,
            );
        }
    }
}
