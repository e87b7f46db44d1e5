//! The experiment's training services (one per `trainingService` entry: each is the plugin its
//! `platform` names) and the environments each one owns.
//!
//! The core does not know what a platform is. Each service is built from its checked config
//! (secrets in clear, in memory only) and the experiment's context, and reports its
//! environments, each with its inventory as gpu-sched JSON (limits already applied), which is
//! registered with the scheduler as is. A placement's environment decides which service starts
//! the trial.

use std::path::Path;

use knob_plugin_api::host::{EnvironmentReport, HostError, Reply, TrainingServiceHandle};
use knob_plugin_api::service::{Environment, ServiceContext, ServiceEvent};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::environments::Said;
use super::{Components, Manager, ManagerError};
use crate::config::{ExperimentConfig, Secret, TrainingServiceConfig};

/// How many times one trial is run again because the host running it was lost. Host losses are
/// not the trial's fault, so they do not use up `maxTrialRetries`; the bound keeps a trial that
/// itself takes hosts down (exhausting memory, say) from cycling through every host forever.
pub(super) const MAX_HOST_LOSS_REQUEUES: u32 = 3;

/// One running training service.
pub(super) struct ServiceSlot {
    /// The platform, which is also the plugin's name.
    pub platform: String,
    pub handle: TrainingServiceHandle,
    /// When a re-probe asked of it, not answered yet, was asked (`refresh_environments`): no
    /// second one is asked, since each answer says what changed since the one before.
    pub reprobe_asked: Option<Instant>,
    /// When it last answered for its environments (at its start, then each re-probe).
    pub probed_at: Option<Instant>,
    /// How long after it answered a kill the manager waits for the trial's end before it
    /// records the end itself (see [`end_patience`]).
    pub end_patience: std::time::Duration,
}

/// An event with the index of the service that reported it.
pub(super) type TaggedEvent = (usize, Result<ServiceEvent, String>);

/// Trials with a call to their service not yet answered (a start, a kill), each with how many.
/// A service answers its calls in order, so one stuck in a call (a `start_trial` that never
/// returns) holds every later one: a stop must not wait for ever for kills queued behind it
/// (see `Manager::given_up_at_stop`).
#[derive(Clone, Default)]
pub(super) struct Unanswered(
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>,
);

impl Unanswered {
    /// A call about `trial_id` asked: it counts as unanswered until the guard is dropped (by
    /// whatever receives the answer).
    pub fn asked(&self, trial_id: &str) -> AskedGuard {
        *self.lock().entry(trial_id.to_string()).or_default() += 1;
        AskedGuard {
            calls: self.clone(),
            trial_id: trial_id.to_string(),
        }
    }

    pub fn contains(&self, trial_id: &str) -> bool {
        self.lock().contains_key(trial_id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, u32>> {
        // A count is never left half-changed: a panic elsewhere does not poison its meaning.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One unanswered call of [`Unanswered`]; dropped once it is answered.
pub(super) struct AskedGuard {
    calls: Unanswered,
    trial_id: String,
}

impl Drop for AskedGuard {
    fn drop(&mut self) {
        let mut calls = self.calls.lock();
        if let Some(count) = calls.get_mut(&self.trial_id) {
            *count -= 1;
            if *count == 0 {
                calls.remove(&self.trial_id);
            }
        }
    }
}

/// A re-probe's answer that came after the loop went on, with the service's index.
pub(super) type LateReports = (usize, Result<Vec<EnvironmentReport>, HostError>);

/// The training-service plugins a config needs, in config order.
pub(super) fn service_names(config: &ExperimentConfig) -> Vec<String> {
    config
        .training_service
        .iter()
        .map(|service| service.platform().to_owned())
        .collect()
}

/// What a service is told about the experiment; `new_experiment` for a run of `knob create`
/// (`ServiceContext::new_experiment`).
pub fn service_context(
    experiment_id: &str,
    experiment_dir: &Path,
    config: &ExperimentConfig,
    config_file: Option<&Path>,
    new_experiment: bool,
) -> ServiceContext {
    ServiceContext {
        experiment_id: experiment_id.to_owned(),
        experiment_dir: Some(experiment_dir.to_path_buf()),
        working_directory: experiment_dir.parent().map(Path::to_path_buf),
        config_dir: config_file
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_else(|| config.trial_code_directory.clone()),
        config_file: config_file.map(Path::to_path_buf),
        // The stored config is canonical: the shortcuts are already applied.
        shortcuts: Default::default(),
        trial: crate::config::trial_settings(config),
        stored: false,
        // A failed start reaches the loop the same way, whether answered or reported later.
        late_start_failures: true,
        // A trial handed back unstarted waits for a placement again (`on_place_again`).
        places_again: true,
        new_experiment,
    }
}

/// The first secret of `config`'s training services that knob does not know (a resumed
/// experiment whose config file and variable are gone), as the one line that names it; checked
/// by `knob resume` before it changes anything, and again when the services start.
pub fn check_secrets(config: &ExperimentConfig) -> Result<(), ManagerError> {
    match config
        .training_service
        .iter()
        .enumerate()
        .find_map(|(index, service)| missing_secret(index, service))
    {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// The one line for a secret knob does not know (it never stores them).
fn missing_secret(index: usize, service: &TrainingServiceConfig) -> Option<ManagerError> {
    let secret = service.missing_secrets().into_iter().next()?;
    let path = format!("trainingService[{index}].{}", secret.path);
    let variable = match &secret.env_var {
        Some(variable) => format!(", or set {variable}"),
        None => String::new(),
    };
    Some(ManagerError::MissingSecret(format!(
        "{path}: this secret is not known (knob never stores it); keep the original config file beside the experiment{variable}"
    )))
}

/// Constructs every service of the config; each one's events arrive on `events` tagged with its
/// index.
pub(super) async fn start_services(
    context: &ServiceContext,
    config: &ExperimentConfig,
    components: &dyn Components,
    events: &mpsc::UnboundedSender<TaggedEvent>,
) -> Result<Vec<ServiceSlot>, ManagerError> {
    check_secrets(config)?;
    let mut slots = Vec::new();
    for (index, service) in config.training_service.iter().enumerate() {
        let platform = service.platform().to_owned();
        let events = events.clone();
        let handle = components
            .training_service(
                &platform,
                &service.config_with_secrets(),
                context,
                Box::new(move |event| {
                    let _ = events.send((index, event));
                }),
            )
            .map_err(|e| match e {
                // These name the service already ("training service <platform>: constructor
                // failed: …"): not named twice.
                HostError::Constructor { .. }
                | HostError::Unknown { .. }
                | HostError::Duplicate { .. } => ManagerError::Plugin(e),
                other => ManagerError::Service {
                    service: platform.clone(),
                    message: other.to_string(),
                },
            });
        match handle {
            Ok(handle) => slots.push(ServiceSlot {
                platform,
                handle,
                reprobe_asked: None,
                probed_at: None,
                end_patience: end_patience(service),
            }),
            Err(e) => {
                let _ = shut_down(&slots, |_| {}, std::future::pending()).await;
                return Err(e);
            }
        }
    }
    Ok(slots)
}

/// On resume, before any trial starts: each service ends what the earlier run left of these
/// trials wherever it runs them. Returns the services' one-line reports; a service that cannot
/// clean up is reported too (the trials still run again).
pub fn clean_up_leftovers(
    context: &ServiceContext,
    config: &ExperimentConfig,
    components: &dyn Components,
    trial_ids: &[String],
) -> Vec<String> {
    if trial_ids.is_empty() {
        return Vec::new();
    }
    let mut reports = Vec::new();
    for service in &config.training_service {
        match components.clean_up_leftovers(
            service.platform(),
            &service.config_with_secrets(),
            context,
            trial_ids,
        ) {
            Ok(lines) => reports.extend(lines),
            Err(e) => reports.push(format!(
                "training service {} could not clean up after the earlier run: {e}",
                service.platform()
            )),
        }
    }
    reports
}

/// Asks every service to shut down (all at once: each may wait for its trials) and waits for
/// them. A service that fails to shut down has nothing left to do for the experiment either,
/// but what it says is returned, one line each, for the experiment's log: what it could not
/// release (a cluster job left queued, say) is the user's to release.
///
/// Bounded: a service whose `shutdown` never returns (waiting on a cluster or an SSH host that
/// stopped answering) held the experiment's end forever, unrecorded (RUNNING, then "crashed"
/// after a second signal). One unanswered for [`SERVICE_LATE_AFTER`] is named by `late` (the
/// console); at [`SHUTDOWN_PATIENCE`], or when `stop` is ready after that (a Ctrl-C or SIGTERM
/// while the end waits), knob goes on without it, saying so.
pub(super) async fn shut_down(
    slots: &[ServiceSlot],
    mut late: impl FnMut(String),
    stop: impl std::future::Future<Output = ()>,
) -> Vec<String> {
    let mut replies: Vec<_> = slots
        .iter()
        .map(|slot| Some(slot.handle.shutdown()))
        .collect();
    let mut problems = Vec::new();
    // Real time: a test's paused clock passes the patience at once while a service thread
    // works.
    let began = std::time::Instant::now();
    let mut named_late = false;
    tokio::pin!(stop);
    let mut stopped = false;
    loop {
        for reply in replies.iter_mut() {
            match reply.take().map(Reply::try_get) {
                Some(Ok(Ok(()))) | None => {}
                Some(Ok(Err(e))) => problems.push(e.to_string()),
                Some(Err(pending)) => *reply = Some(pending),
            }
        }
        let waiting: Vec<&str> = slots
            .iter()
            .zip(&replies)
            .filter(|(_, reply)| reply.is_some())
            .map(|(slot, _)| slot.platform.as_str())
            .collect();
        if waiting.is_empty() {
            return problems;
        }
        let waited = began.elapsed();
        if stopped || waited >= SHUTDOWN_PATIENCE {
            let why = match stopped {
                true => "a stop was asked while waiting".to_string(),
                false => format!("waited {} s", SHUTDOWN_PATIENCE.as_secs()),
            };
            for platform in waiting {
                problems.push(format!(
                    "training service {platform} did not shut down ({why}); the experiment ended without it: what it holds (trials, processes on its hosts, cluster jobs) may still run"
                ));
            }
            return problems;
        }
        if !named_late && waited >= SERVICE_LATE_AFTER {
            named_late = true;
            late(format!(
                "training service(s) {} have not shut down in {} s; the experiment ends without them after {} s (a Ctrl-C or SIGTERM ends it now)",
                waiting.join(", "),
                SERVICE_LATE_AFTER.as_secs(),
                SHUTDOWN_PATIENCE.as_secs()
            ));
        }
        // A stop ends the wait only once the service is named late: one asked before (a
        // second `knob stop`, a Ctrl-C as the experiment ended) would cut short a shutdown
        // that was about to release its trials and cluster jobs.
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
            _ = &mut stop, if named_late && !stopped => stopped = true,
        }
    }
}

/// Ready once a stop is asked (`Command::Stop`: the first Ctrl-C or SIGTERM) while the loop
/// waits on a training service outside its turn; other commands are dropped (their asker hears
/// that the experiment ends). Never ready once every sender is gone.
pub(super) async fn stop_asked(commands: &mut mpsc::UnboundedReceiver<super::Command>) {
    while let Some(command) = commands.recv().await {
        if matches!(command, super::Command::Stop) {
            return;
        }
    }
    std::future::pending().await
}

/// A call to a training service that the loop waits on (its shutdown, its environments at
/// start), unanswered this long, is named on the console.
pub(super) const SERVICE_LATE_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the end of an experiment waits for its training services to shut down (each may
/// kill its trials first, with their grace period): part of the plugin API, so that a service
/// can fit its own shutdown within it.
pub(super) use knob_plugin_api::service::SHUTDOWN_PATIENCE;

/// How long, beyond a service's own grace period, the manager waits for the end of a trial
/// whose kill the service answered before it records the end itself: as long as a shutdown,
/// which kills trials the same way, is given. A service that never reports the end (its report
/// lost, a third-party service that sends none) otherwise held the trial RUNNING for ever, its
/// GPUs with it, and a stop, `maxTrialDuration` and `maxExperimentDuration` never ended.
pub(super) const END_AFTER_KILL_PATIENCE: std::time::Duration = SHUTDOWN_PATIENCE;

/// [`END_AFTER_KILL_PATIENCE`] plus the grace period a killed trial is given where the
/// service's config states one (`gracePeriodSecs`, in any spelling NNI's key matching takes):
/// a trial that ignores SIGTERM is reported ended only after it, and must not be taken for
/// one whose end was lost.
fn end_patience(service: &TrainingServiceConfig) -> std::time::Duration {
    let grace = service
        .config
        .iter()
        .find(|(key, _)| knob_plugin_api::config::normalize_key(key) == "graceperiodsecs")
        .and_then(|(_, value)| value.as_f64())
        .filter(|secs| secs.is_finite() && *secs > 0.0)
        .and_then(|secs| std::time::Duration::try_from_secs_f64(secs).ok())
        .unwrap_or_default();
    grace.saturating_add(END_AFTER_KILL_PATIENCE)
}

impl Manager {
    /// Shuts the services down (`shut_down`), a late one named on the console, a stop asked
    /// meanwhile (`Command::Stop`) ending the wait; returns what they said, one line each.
    pub(super) async fn shut_down_services(&mut self) -> Vec<String> {
        let Manager {
            services,
            commands,
            notices,
            progress,
            ..
        } = self;
        let mut said = Vec::new();
        let late = |text: String| {
            said.push(text.clone());
            std::sync::Arc::make_mut(notices).push(super::Notice {
                warning: true,
                text,
            });
            let notices = notices.clone();
            progress.send_modify(|progress| progress.notices = notices);
        };
        let problems = shut_down(services, late, stop_asked(commands)).await;
        // The late line, already shown, is recorded with the others.
        said.into_iter().chain(problems).collect()
    }

    /// Waits for a service's answer that the experiment cannot go on without (its environments
    /// at start). A service stuck in the call (waiting on a host that stopped answering) held
    /// knob without a word, deaf to Ctrl-C and SIGTERM: one unanswered for
    /// [`SERVICE_LATE_AFTER`] is named on the console, and a stop asked from then on ends the
    /// wait (`None`). No patience of its own: a service may take long to reach its hosts, and the
    /// user, told, decides.
    async fn wait_for_service<T>(
        &mut self,
        index: usize,
        call: &str,
        mut reply: Reply<T>,
    ) -> Result<Option<Result<T, HostError>>, ManagerError> {
        // Commands are left queued until the service is named late: a Ctrl-C or an update that
        // comes while a service answers in its usual time is the loop's, once it runs (a stop
        // then ends the experiment STOPPED, as one a moment later does).
        tokio::select! {
            answer = reply.answer() => return Ok(Some(answer)),
            () = tokio::time::sleep(SERVICE_LATE_AFTER) => {}
        }
        let message = format!(
            "training service {} has not answered {call} in {} s; knob waits for it (a Ctrl-C or SIGTERM stops the experiment)",
            self.services[index].platform,
            SERVICE_LATE_AFTER.as_secs()
        );
        self.notice(message).await?;
        tokio::select! {
            answer = reply.answer() => Ok(Some(answer)),
            () = stop_asked(&mut self.commands) => Ok(None),
        }
    }

    /// At start: every service's environments, and whatever the services reported while they
    /// connected (a warning naming an unreachable host, say). Fails when no environment can take
    /// trials, or when no environment could ever take a trial of this config.
    pub(super) async fn register_environments(&mut self) -> Result<(), ManagerError> {
        for index in 0..self.services.len() {
            let platform = self.services[index].platform.clone();
            let reply = self.services[index].handle.environment_reports();
            let Some(answer) = self.wait_for_service(index, "environments", reply).await? else {
                return Err(ManagerError::Service {
                    service: platform,
                    message: "a stop was asked while knob waited for its environments".into(),
                });
            };
            match answer {
                Ok(reports) => self.on_environment_reports(index, reports).await?,
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
        // An environment on its way (a queued cluster job) will take trials: they wait for it.
        if !self.environments.any() {
            return Err(ManagerError::NoEnvironment(
                self.environments.no_environment_reason(),
            ));
        }
        // A host not reached yet may hold what the environments known so far cannot: its
        // trials wait for it (`place_waiting`) and fail, with this reason, only if it does not.
        match self.environments.check() {
            Err(_) if self.environments.unreached().is_some() => Ok(()),
            checked => checked.map_err(ManagerError::Placement),
        }
    }

    /// Asks every service again for its environments and their inventories (GPU memory and
    /// processes, CPU, memory as they are now), for trials that wait for resources. Each
    /// service answers in full only the reports that changed since its last answer
    /// (`EnvironmentReport`; the service's side compares them), so that a re-probe of
    /// unchanged environments costs the loop a look-up each.
    ///
    /// Not waited for: a service answers its calls in order, and one busy with a long start (a
    /// host's code upload over SSH, an agent that stopped answering: up to minutes) would hold
    /// the whole loop, every other service's trials included. An answer there at once is taken
    /// in now (always, for a service run inline: the simulator); a later one arrives as a
    /// wake of the loop (`late_reports`, `on_reprobe_answer`).
    pub(super) async fn refresh_environments(&mut self) -> Result<(), ManagerError> {
        for index in 0..self.services.len() {
            self.reprobe(index).await?;
        }
        Ok(())
    }

    /// Asks service `index` again for its environments, unless a re-probe of it is on its way
    /// already (see [`Manager::refresh_environments`]).
    pub(super) async fn reprobe(&mut self, index: usize) -> Result<(), ManagerError> {
        let slot = &mut self.services[index];
        if slot.reprobe_asked.is_some() {
            return Ok(());
        }
        match slot.handle.environment_reports().try_get() {
            Ok(answer) => self.on_reprobe_answer(index, answer).await?,
            Err(reply) => {
                slot.reprobe_asked = Some(Instant::now());
                let late = self.late_reports_tx.clone();
                tokio::spawn(async move {
                    // The loop is gone once the experiment ended: nothing to tell.
                    let _ = late.send((index, reply.get().await));
                });
            }
        }
        Ok(())
    }

    /// Takes in service `index`'s answer to a re-probe.
    pub(super) async fn on_reprobe_answer(
        &mut self,
        index: usize,
        answer: Result<Vec<EnvironmentReport>, HostError>,
    ) -> Result<(), ManagerError> {
        // Answered, even with an error: a service whose every answer fails is not asked again
        // at once (`probe_for_host_use_limits`), nor warned about on every turn of the loop.
        self.services[index].reprobe_asked = None;
        self.services[index].probed_at = Some(Instant::now());
        match answer {
            Ok(reports) => self.on_environment_reports(index, reports).await,
            Err(e) => {
                let platform = self.services[index].platform.clone();
                self.warn(
                    None,
                    format!("training service {platform} could not report its environments: {e}"),
                )
                .await
            }
        }
    }

    /// Takes a service call's failure as a warning (of `trial_id`, if any) whenever its answer
    /// comes, without waiting for it (see [`Manager::warn_when_answered`]).
    pub(super) fn warn_if_it_fails<R: Send + 'static>(
        &self,
        reply: Reply<R>,
        trial_id: Option<String>,
        what: impl FnOnce(HostError) -> String + Send + 'static,
    ) {
        self.warn_when_answered(reply, trial_id, |answer| answer.err().map(what));
    }

    /// Records the warning (of `trial_id`, if any) that `warning` makes of a service call's
    /// answer, if it makes one, whenever the answer comes, without waiting for it: a kill, a
    /// deletion or a copy asked of a service busy with a long start must not hold the loop (see
    /// `refresh_environments`). Nothing else waits on such an answer: a service runs its calls
    /// in order, so what is asked of it later still comes after.
    pub(super) fn warn_when_answered<R: Send + 'static>(
        &self,
        reply: Reply<R>,
        trial_id: Option<String>,
        warning: impl FnOnce(Result<R, HostError>) -> Option<String> + Send + 'static,
    ) {
        let store = self.store.clone();
        let warn = move |answer: Result<R, HostError>| {
            if let Some(message) = warning(answer) {
                store.append_unacked(crate::store::StoreEvent::Warning { trial_id, message });
            }
        };
        match reply.try_get() {
            Ok(answer) => warn(answer),
            Err(reply) => {
                tokio::spawn(async move { warn(reply.get().await) });
            }
        }
    }

    /// Registers a service's answer about its environments, in its order (see
    /// [`Manager::on_environment`]).
    async fn on_environment_reports(
        &mut self,
        service: usize,
        reports: Vec<EnvironmentReport>,
    ) -> Result<(), ManagerError> {
        self.services[service].probed_at = Some(Instant::now());
        for report in reports {
            let said = match report {
                EnvironmentReport::Full(environment) => {
                    self.environments.report(service, environment)
                }
                EnvironmentReport::Same(id) => self.environments.report_same(service, &id),
            };
            self.say(said).await?;
        }
        Ok(())
    }

    /// Registers what a service says about one of its environments, and records and shows
    /// what changed.
    pub(super) async fn on_environment(
        &mut self,
        service: usize,
        environment: Environment,
    ) -> Result<(), ManagerError> {
        let said = self.environments.report(service, environment);
        self.say(said).await
    }

    /// Records and shows what [`super::environments::Environments`] said.
    async fn say(&mut self, said: Vec<Said>) -> Result<(), ManagerError> {
        for said in said {
            match said {
                Said::Notice(message) => self.notice(message).await?,
                Said::News(message) => self.news(message).await?,
                Said::Warning(message) => self.warn(None, message).await?,
            }
        }
        Ok(())
    }

    /// A host is gone for good (see [`super::environments::Environments::lose`]).
    pub(super) async fn lose_environment(
        &mut self,
        environment_id: &str,
        reason: &str,
    ) -> Result<(), ManagerError> {
        match self.environments.lose(environment_id, reason) {
            Some(message) => self.notice(message).await,
            None => Ok(()),
        }
    }

    /// A service's own word about its environments: a notice, and kept (the latest few) for the
    /// error if no environment is left.
    pub(super) async fn service_problem(&mut self, message: String) -> Result<(), ManagerError> {
        self.environments.problem(message.clone());
        self.notice(message).await
    }

    /// A warning about environments: recorded like every warning, and shown on the console.
    pub(super) async fn notice(&mut self, message: String) -> Result<(), ManagerError> {
        self.console(true, message).await
    }

    /// News (an environment ready, or ready again; a tuner that thinks long): recorded with the
    /// warnings, whose story it ends or which it may begin, and shown on the console as what it
    /// is.
    pub(super) async fn news(&mut self, message: String) -> Result<(), ManagerError> {
        self.console(false, message).await
    }

    async fn console(&mut self, warning: bool, text: String) -> Result<(), ManagerError> {
        std::sync::Arc::make_mut(&mut self.notices).push(super::Notice {
            warning,
            text: text.clone(),
        });
        self.warn(None, text).await?;
        self.publish(None);
        Ok(())
    }
}

/// Fills the secrets that a stored config lost (they are stored as `***`): from the config the
/// experiment was created from (`original`, read again and checked), where its entry of the same
/// platform has the same mapping around the secret (the same machine, say), else from the
/// environment variable the service named for the field. Any secret still missing is left
/// redacted; the manager's start then says which and what to do.
pub fn restore_secrets(
    config: &mut ExperimentConfig,
    original: Option<&ExperimentConfig>,
    variable: &dyn Fn(&str) -> Option<String>,
) {
    for service in &mut config.training_service {
        let missing: Vec<_> = service.missing_secrets().into_iter().cloned().collect();
        if missing.is_empty() {
            continue;
        }
        let stored = serde_json::Value::Object(service.config.clone());
        let same_platform = original.and_then(|original| {
            original
                .training_service
                .iter()
                .find(|other| other.platform() == service.platform())
        });
        for secret in missing {
            let from_file = same_platform.and_then(|other| {
                let theirs = serde_json::Value::Object(other.config.clone());
                // The mapping that holds the secret must be the same one (secrets redacted in
                // both, so they compare as equal).
                let parent = secret.path.parent();
                (parent.find(&theirs)? == parent.find(&stored)?)
                    .then(|| other.secret(&secret.path).cloned())
                    .flatten()
            });
            let found = from_file.or_else(|| {
                secret
                    .env_var
                    .as_deref()
                    .and_then(variable)
                    .map(Secret::new)
            });
            if let Some(found) = found {
                service.fill_secret(&secret.path, found);
            }
        }
    }
}
