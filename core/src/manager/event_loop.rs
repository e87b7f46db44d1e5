//! The event loop that ties the manager's parts together: it waits on the services' events,
//! commands and its next deadline, records every change in the store, then writes it into the
//! trial book, the tuner driver, the environments and the timers, and acts on it (submits,
//! places, kills, tells the tuner and the assessor). It owns what does I/O: the store, the
//! services' handles, the assessor, the command and progress channels.

use std::path::PathBuf;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use knob_plugin_api::host::{EnvironmentReport, HostError};
use knob_plugin_api::population::Emitted;
use knob_plugin_api::service::NOT_STARTED;
use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{AssessorContext, ComponentKind, OptimizeMode};
use serde_json::Value;

use super::assessor_driver::{self, AssessorDriver};
use super::book::TrialBook;
use super::environments::Environments;
use super::placement::Placer;
use super::services::{self, LateReports, ServiceSlot, TaggedEvent};
use super::timers::Timers;
use super::tuner_driver::{Check, Handout, TunerDriver};
use super::{
    algorithm_component, resume, trial, Command, Components, Experiment, LoopState, ManagerError,
    Outcome, Progress,
};
use crate::config::ExperimentConfig;
use crate::store::{Direction, ExperimentStatus, StoreEvent, StoreHandle, TrialStatus};

pub(super) struct Manager {
    pub(super) id: String,
    pub(super) dir: PathBuf,
    pub(super) config: ExperimentConfig,
    pub(super) store: StoreHandle,
    /// Asks the tuner for parameters and tells it what happened.
    pub(super) tuner: TunerDriver,
    /// Asks the assessor for verdicts and tells it results and ends, never waiting long.
    pub(super) assessor: Option<AssessorDriver>,
    /// One per configured platform, in config order; trials name theirs by index.
    pub(super) services: Vec<ServiceSlot>,
    /// Every environment a service reported, and where trials go.
    pub(super) environments: Environments,
    /// Console lines so far (see [`Progress::notices`]).
    pub(super) notices: std::sync::Arc<Vec<super::Notice>>,
    /// Whether the console has said once that a trial's second final result was ignored (a
    /// script that reports its final every epoch would otherwise fill it, one line per epoch).
    pub(super) told_second_final: bool,
    pub(super) service_events: mpsc::UnboundedReceiver<TaggedEvent>,
    /// Trials the service could not start: (trial id, why).
    pub(super) start_failures: mpsc::UnboundedReceiver<(String, String)>,
    pub(super) start_failures_tx: mpsc::UnboundedSender<(String, String)>,
    /// Re-probe answers the loop did not wait for (`refresh_environments`).
    pub(super) late_reports: mpsc::UnboundedReceiver<LateReports>,
    pub(super) late_reports_tx: mpsc::UnboundedSender<LateReports>,
    /// Answers of the services asked to bring a successor's parent checkpoint here before it
    /// starts (`population::bring_parent_snapshot`), which the loop does not wait for.
    pub(super) fetched: mpsc::UnboundedReceiver<super::population::Fetched>,
    pub(super) fetched_tx: mpsc::UnboundedSender<super::population::Fetched>,
    /// Which component woke the loop (a tuner's late suggestions, an assessor's late kill:
    /// `Tuner::set_waker`, `Assessor::set_waker`).
    pub(super) woken: mpsc::UnboundedReceiver<Woken>,
    pub(super) commands: mpsc::UnboundedReceiver<Command>,
    pub(super) progress: watch::Sender<Progress>,
    /// Every trial, its attempts and status.
    pub(super) book: TrialBook,
    /// False once every command sender is gone.
    pub(super) commands_open: bool,
    pub(super) timers: Timers,
    pub(super) stop_requested: bool,
    /// When the experiment began to stop (`stop_all`): trials left only on environments that
    /// cannot be reached, or whose service has not answered a call about them, are given up
    /// [`UNREACHABLE_AT_STOP`] or [`UNANSWERED_AT_STOP`] after it.
    stopping_since: Option<Instant>,
    /// Trials whose service has not answered their start or kill yet.
    pub(super) unanswered: services::Unanswered,
    /// Whether the console was told which unanswered trials a stop waits for.
    stop_wait_told: bool,
    /// Why the loop gave up on a tuner that owed parameters while nothing ran: the experiment's
    /// end message, so that its summary (and `knob experiment show`) says why it ended early.
    gave_up_on_tuner: Option<String>,
    /// `submit_new` stopped at [`MAX_NEW_TRIALS_A_TURN`] with more trials to create: the loop
    /// comes back for them once what has already arrived (a stop, service events) is handled.
    more_to_submit: bool,
    /// Population members whose checkpoint folder was deleted
    /// (`population::collect_checkpoints`).
    pub(super) collected: std::collections::HashSet<String>,
    /// Whether the log said that a service takes no copy of a parent's checkpoint as its
    /// successor is created (`population::snapshot_parent_elsewhere`), said once.
    pub(super) snapshots_unsupported_told: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Told when the loop starts and stops waiting (the simulator); `turns` counts the waits.
    pub(super) observer: Option<watch::Sender<LoopState>>,
    pub(super) turns: u64,
    /// Acknowledgements of appended events that the loop went on without waiting for (a
    /// trial's start and end, an intermediate result nothing acts on; see
    /// [`Manager::settle`]), oldest first: the writer commits in order.
    pub(super) unsettled: std::collections::VecDeque<Unsettled>,
    /// What woke the loop, by cause (told to the observer).
    pub(super) wakes: super::Wakes,
    /// Trials waited for resources since the services were last told that none does
    /// (`Manager::tell_nothing_waits`).
    pub(super) trials_waited: bool,
}

impl Manager {
    pub(super) async fn start(
        experiment: Experiment,
        store: StoreHandle,
        components: &dyn Components,
        commands: mpsc::UnboundedReceiver<Command>,
        progress: watch::Sender<Progress>,
    ) -> Result<Manager, ManagerError> {
        let Experiment {
            id,
            dir,
            config,
            history,
            config_file,
        } = experiment;
        let run = crate::nni_dispatch::Run {
            dir: &dir,
            resume: history.is_some(),
            tuner_gpu_indices: config.tuner_gpu_indices.as_deref(),
        };
        let (tuner_name, tuner_args) = algorithm_component(
            ComponentKind::Tuner,
            &config.tuner,
            &config,
            components,
            Some(run),
        )?;
        let (woken_tx, woken) = mpsc::unbounded_channel();
        let tuner =
            components.tuner_waking(&tuner_name, &tuner_args, waker(&woken_tx, Woken::Tuner))?;
        if crate::objectives::is_multi_objective(&config.objectives) && !tuner.takes_objectives() {
            return Err(ManagerError::Unsupported(
                crate::objectives::single_objective_refusal(
                    config.tuner.display_name(),
                    &config.objectives,
                ),
            ));
        }
        let assessor = match &config.assessor {
            Some(assessor) => {
                let (name, args) = algorithm_component(
                    ComponentKind::Assessor,
                    assessor,
                    &config,
                    components,
                    Some(run),
                )?;
                let context = AssessorContext::new(match config.direction() {
                    Direction::Maximize => OptimizeMode::Maximize,
                    Direction::Minimize => OptimizeMode::Minimize,
                });
                Some(AssessorDriver::new(components.assessor_waking(
                    &name,
                    &args,
                    &context,
                    waker(&woken_tx, Woken::Assessor),
                )?))
            }
            None => None,
        };
        let space = SearchSpace::from_value(&config.search_space)
            .map_err(|e| ManagerError::Unsupported(format!("searchSpace: {e}")))?;
        let tuner = TunerDriver::new(tuner, space, config.tuner_error_policy);
        let placer = Placer::new(&config);
        let (start_failures_tx, start_failures) = mpsc::unbounded_channel();
        let (late_reports_tx, late_reports) = mpsc::unbounded_channel();
        let (fetched_tx, fetched) = mpsc::unbounded_channel();
        let (events_tx, service_events) = mpsc::unbounded_channel();
        let context = services::service_context(
            &id,
            &dir,
            &config,
            config_file.as_deref(),
            history.is_none(),
        );
        // Before a trial of the earlier run is started again, nothing of it may still run: each
        // service ends what is left of those trials wherever it runs them.
        let leftovers = match &history {
            Some(history) => services::clean_up_leftovers(
                &context,
                &config,
                components,
                &resume::unfinished_trials(history),
            ),
            None => Vec::new(),
        };
        let services = services::start_services(&context, &config, components, &events_tx).await?;
        let platforms = services.iter().map(|slot| slot.platform.clone()).collect();
        let environments = Environments::new(platforms, placer);
        drop(events_tx);

        let timers = Timers::new(Instant::now(), config.max_experiment_duration);
        let mut manager = Manager {
            id,
            dir,
            store,
            tuner,
            assessor,
            services,
            environments,
            notices: Default::default(),
            told_second_final: false,
            service_events,
            start_failures,
            start_failures_tx,
            late_reports,
            late_reports_tx,
            fetched,
            fetched_tx,
            woken,
            commands,
            progress,
            book: TrialBook::new(config.direction() == Direction::Maximize),
            commands_open: true,
            timers,
            stop_requested: false,
            stopping_since: None,
            unanswered: Default::default(),
            stop_wait_told: false,
            gave_up_on_tuner: None,
            more_to_submit: false,
            collected: Default::default(),
            snapshots_unsupported_told: Default::default(),
            observer: None,
            turns: 0,
            unsettled: Default::default(),
            wakes: Default::default(),
            trials_waited: false,
            config,
        };
        if let Err(e) = manager.register_environments().await {
            // Nothing ran: the experiment's error says what matters.
            let _ = manager.shut_down_services().await;
            return Err(match &history {
                Some(history) => manager.cancel_not_restored(history, e).await,
                None => e,
            });
        }
        if let Err(refusal) = manager
            .tuner
            .set_space(&manager.config.search_space)
            .await?
        {
            // A store may hold a space its tuner refuses: an earlier knob recorded an update
            // before the tuner was asked. Resumed, it would fail so every time.
            let updated = history.as_ref().is_some_and(|history| {
                history
                    .config_updates
                    .iter()
                    .any(|update| update.field == "searchSpace")
            });
            let message = match updated {
                true => format!(
                    "{refusal}; this search space came from an update the tuner refused; resume with a space it takes: `knob resume {} --search-space FILE`",
                    manager.id
                ),
                false => refusal,
            };
            return Err(ManagerError::Plugin(HostError::Call { message }));
        }
        // On the console too: what a resume ended or cancelled of the earlier run (a cluster's
        // jobs) is the user's to know, and no other line says it.
        for report in leftovers {
            manager.notice(report).await?;
        }
        if let Some(history) = history {
            manager.restore(&history).await?;
        }
        manager.timers.begin(Instant::now());
        manager
            .store
            .append(StoreEvent::ExperimentStatusChanged {
                status: ExperimentStatus::Running,
                message: None,
                spent_before_ms: manager
                    .timers
                    .spent_before()
                    .map(|spent| u64::try_from(spent.as_millis()).unwrap_or(u64::MAX)),
            })
            .await?;
        manager.publish(Some(ExperimentStatus::Running));
        Ok(manager)
    }

    /// Whether no new trial may start.
    pub(super) fn closed(&self) -> bool {
        self.stop_requested
            || self.timers.deadline_passed()
            || self.book.budget_spent(self.config.max_trial_number)
            || self.tuner.exhausted()
    }

    pub(super) async fn run_loop(&mut self) -> Result<(), ManagerError> {
        // A resumed experiment whose time budget is spent is due at once: heard before the
        // first `fill`, which would otherwise start new trials only to cancel them.
        self.on_deadline().await?;
        let mut turn = Turn::Changed;
        loop {
            // A turn that only recorded intermediate results changed nothing `fill` looks at
            // (no trial ended or started, the tuner heard nothing), so it is not run: at
            // 100 000 trials most turns are such a result, each arriving on its own.
            if turn == Turn::Changed {
                self.take_queued_commands().await?;
                self.fill().await?;
            }
            turn = Turn::Changed;
            // With nothing running, a deferring tuner will never be given the result it waits
            // for, unless it answers on its own (it woke us before and may again) or is still
            // thinking about ids it was asked for.
            let idle_deferred = self.book.active_count() == 0 && self.tuner.in_flight() > 0;
            if self.book.active_count() == 0
                && (self.closed()
                    || (idle_deferred && !self.tuner.wakes() && !self.tuner.awaits_answers()))
            {
                if !self.closed() {
                    self.tuner_gave_no_parameters().await?;
                }
                return self.last_answers().await;
            }
            if self.given_up_at_stop(Instant::now()) {
                // `finish` records them and says where they may still run.
                return self.last_answers().await;
            }
            self.timers
                .tuner_owes_alone(idle_deferred.then(Instant::now));
            let give_up_on_tuner = self.timers.tuner_give_up_at();
            let assessor_late_at = self.assessor.as_ref().and_then(AssessorDriver::late_at);
            let assessor_answers = self
                .assessor
                .as_ref()
                .is_some_and(AssessorDriver::awaits_answers);
            // Not waited for: the loop would park for the writer's commit on every turn (at
            // 100 000 trials nearly every event is a turn of its own, `sim_scale`). What has
            // committed is taken off here; the rest commits while the loop waits.
            self.settle_committed()?;
            let next_deadline = self.next_deadline();
            self.observe(true, next_deadline);
            let wake = tokio::select! {
                event = self.service_events.recv() => match event {
                    Some(first) => {
                        // Take whatever else has arrived too: its metrics then share one commit.
                        let mut batch = vec![first];
                        while batch.len() < MAX_EVENT_BATCH {
                            match self.service_events.try_recv() {
                                Ok(event) => batch.push(event),
                                Err(_) => break,
                            }
                        }
                        Wake::ServiceEvents(batch)
                    }
                    None => Wake::ServicesGone,
                },
                command = self.commands.recv(), if self.commands_open => Wake::Command(command),
                Some((trial_id, message)) = self.start_failures.recv() => Wake::StartFailed(trial_id, message),
                Some((index, answer)) = self.late_reports.recv() => Wake::Reprobed(index, answer),
                Some(fetched) = self.fetched.recv() => Wake::Fetched(fetched),
                _ = sleep_until(next_deadline) => Wake::Deadline,
                Some(woken) = self.woken.recv() => Wake::Woken(woken),
                answered = self.tuner.answered(), if self.tuner.awaits_answers() => Wake::TunerAnswered(answered),
                answers = assessor_answered(&mut self.assessor), if assessor_answers => Wake::AssessorAnswered(answers),
                _ = sleep_until(assessor_late_at), if assessor_late_at.is_some() => Wake::AssessorLate,
                // A tuner that woke us before may never answer again: the wait is bounded.
                _ = sleep_until(give_up_on_tuner), if give_up_on_tuner.is_some() => Wake::GaveUpOnTuner,
                // Ready on its second poll: whatever had already arrived is taken first.
                () = tokio::task::yield_now(), if self.more_to_submit => Wake::MoreToSubmit,
            };
            self.count(&wake);
            self.observe(false, next_deadline);
            match wake {
                Wake::ServiceEvents(batch) => turn = self.on_service_events(batch).await?,
                Wake::ServicesGone => {
                    return Err(ManagerError::Service {
                        service: self
                            .services
                            .iter()
                            .map(|slot| slot.platform.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        message: "stopped reporting events".into(),
                    })
                }
                Wake::Command(Some(command)) => self.on_command(command).await?,
                // Nobody can send commands any more; keep running without listening.
                Wake::Command(None) => self.commands_open = false,
                Wake::StartFailed(trial_id, message) => {
                    self.on_start_failed(trial_id, message).await?
                }
                // `fill`, first thing in the next turn, places the waiting trials again.
                Wake::Reprobed(index, answer) => self.on_reprobe_answer(index, answer).await?,
                Wake::Fetched(fetched) => self.on_parent_snapshot_fetched(fetched).await?,
                Wake::Deadline => self.on_deadline().await?,
                Wake::Woken(Woken::Tuner) => self.tuner.take_woken()?,
                // `fill`, first thing in the next turn, creates the trials it answered.
                Wake::TunerAnswered(answered) => answered?,
                Wake::Woken(Woken::Assessor) => self.reassess().await?,
                Wake::AssessorAnswered(answers) => self.on_assessor_answers(answers).await?,
                Wake::AssessorLate => {
                    if let Some(warning) = self
                        .assessor
                        .as_mut()
                        .and_then(AssessorDriver::late_warning)
                    {
                        self.notice(warning).await?;
                    }
                }
                Wake::GaveUpOnTuner => {
                    let message = format!(
                        "{} owes parameters for {} trial(s) and nothing runs; it gave none in {} s, so the experiment ends",
                        self.tuner.label(),
                        self.tuner.in_flight(),
                        super::timers::TUNER_PATIENCE.as_secs()
                    );
                    // On the console as well: only stored, a hung tuner looked like an
                    // experiment that had simply finished.
                    self.notice(message.clone()).await?;
                    self.gave_up_on_tuner = Some(message);
                    return Ok(());
                }
                // `fill`, first thing in the next turn, creates them.
                Wake::MoreToSubmit => {}
            }
        }
    }

    /// The run ends, budget and time left, because the tuner deferred ids, nothing runs, and it
    /// keeps no waker: no result will come to make it pay them. Said as a tuner given up on
    /// after its patience is (a `warning:` and the end message): a tuner that deferred every id
    /// ended "DONE: 0 trials", exit 0, without a word why.
    async fn tuner_gave_no_parameters(&mut self) -> Result<(), ManagerError> {
        let message = format!(
            "{} deferred parameters for {} trial(s) and gave none, with nothing running, so the experiment ends after {} trial(s): no result will come to make it give them, and it keeps no waker (Tuner::set_waker) to give them on its own",
            self.tuner.label(),
            self.tuner.in_flight(),
            self.book.len()
        );
        self.notice(message.clone()).await?;
        self.gave_up_on_tuner = Some(message);
        Ok(())
    }

    async fn on_command(&mut self, command: Command) -> Result<(), ManagerError> {
        match command {
            Command::Stop => {
                self.stop_all(
                    crate::store::STOPPED_WITH_EXPERIMENT,
                    TrialStatus::UserCanceled,
                )
                .await
            }
            Command::Update(update, reply) => {
                let outcome = self.apply(update).await?;
                let _ = reply.send(outcome);
                Ok(())
            }
            Command::Environments(reply) => {
                let _ = reply.send(self.environments.views());
                Ok(())
            }
        }
    }

    /// Acts on the commands already queued, before `fill` starts trials: a stop that came while
    /// the loop was busy (a resume reading the store and reaching its hosts, a long turn) was
    /// heard only after `fill` had started the trials it then killed at once, attempts that ran
    /// nothing, and a cluster job submitted after the console said the experiment stops.
    async fn take_queued_commands(&mut self) -> Result<(), ManagerError> {
        while self.commands_open {
            match self.commands.try_recv() {
                Ok(command) => self.on_command(command).await?,
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => self.commands_open = false,
            }
        }
        Ok(())
    }

    /// Counts what woke the loop (see [`super::Wakes`]).
    fn count(&mut self, wake: &Wake) {
        let wakes = &mut self.wakes;
        match wake {
            Wake::ServiceEvents(_) | Wake::ServicesGone | Wake::Reprobed(..) | Wake::Fetched(_) => {
                wakes.service_events += 1
            }
            Wake::Command(_) => wakes.commands += 1,
            Wake::StartFailed(..) => wakes.start_failures += 1,
            Wake::Deadline => wakes.deadlines += 1,
            Wake::Woken(_)
            | Wake::TunerAnswered(_)
            | Wake::AssessorAnswered(_)
            | Wake::AssessorLate
            | Wake::GaveUpOnTuner
            | Wake::MoreToSubmit => wakes.components += 1,
        }
    }

    /// Tells an observer (see [`LoopState`]) whether the loop now waits.
    pub(super) fn observe(&mut self, waiting: bool, next_deadline: Option<Instant>) {
        if let Some(observer) = &self.observer {
            if waiting {
                self.turns += 1;
            }
            observer.send_replace(LoopState {
                started: true,
                turn: self.turns,
                waiting,
                next_deadline,
                wakes: self.wakes,
            });
        }
    }

    /// Submits trials until `trialConcurrency` are running or no more may start, then places
    /// the waiting ones, oldest first. Placement comes once, after the new trials are in: while
    /// trials wait for a GPU every round works out each one's placement and why it waits against
    /// every environment, and placing before and after each submission made a turn cost two or
    /// more such rounds (`sim_scale`: 1 000 environments while a host is down). A round that
    /// ended trials (they can never fit) goes again, so that they are replaced as before; each
    /// such round ends at least one trial, which counts against `maxTrialNumber`.
    pub(super) async fn fill(&mut self) -> Result<(), ManagerError> {
        loop {
            self.submit_new().await?;
            let active = self.book.active_count();
            self.place_waiting().await?;
            if self.book.active_count() >= active || self.closed() || self.more_to_submit {
                break;
            }
        }
        self.publish(Some(if self.tuner.exhausted() {
            ExperimentStatus::NoMoreTrial
        } else {
            ExperimentStatus::Running
        }));
        Ok(())
    }

    /// Creates trials of the tuner's suggestions and asks it for more until
    /// `trialConcurrency` trials are active (counting the ids it owes), the ids it owes take
    /// what is left of `maxTrialNumber`, or no more may start; they wait for `fill` to place
    /// them.
    async fn submit_new(&mut self) -> Result<(), ManagerError> {
        self.submit_suggested().await?;
        let concurrency = u64::from(self.config.trial_concurrency);
        self.more_to_submit = false;
        let mut asked = 0;
        // Ids the tuner still owes count against the budget as well as the concurrency: a tuner
        // that answers late (a GP thinking for minutes) would otherwise be asked for parameter
        // sets no trial could ever run.
        while !self.closed()
            && self.book.active_count() + self.tuner.in_flight() < concurrency
            && self.tuner.in_flight() < self.book.budget_left(self.config.max_trial_number)
        {
            if asked == MAX_NEW_TRIALS_A_TURN {
                self.more_to_submit = true;
                break;
            }
            asked += 1;
            match self.tuner.generate().await? {
                Handout::Parameters {
                    parameter_id,
                    parameters,
                    label,
                    lineage,
                } => {
                    if self.accept_output(parameter_id, &parameters).await? {
                        let lineage = lineage.map(|l| self.member_lineage(l));
                        let wanted = match &lineage {
                            Some(lineage) => {
                                self.successor_still_wanted(parameter_id, lineage).await?
                            }
                            None => true,
                        };
                        if wanted {
                            self.submit(parameter_id, parameters, label, lineage)
                                .await?;
                        }
                    }
                }
                // What came in meanwhile (a Hyperband promotion a result earned, paid before
                // this id's parameters, which then wait behind it) is created in that order.
                Handout::Deferred => self.submit_suggested().await?,
                Handout::NoMore => self.record_no_more().await?,
            }
        }
        if self.tuner.take_late_no_more() {
            self.record_no_more().await?;
        }
        Ok(())
    }

    /// Creates trials of what the tuner emitted unprompted or answered late, in the order it
    /// did, and stops the population members it asked to stop.
    async fn submit_suggested(&mut self) -> Result<(), ManagerError> {
        loop {
            // Only the tuner's trials wait for room: one the user adds through the API runs at
            // once, and takes room like any.
            let room = self.book.active_count() < u64::from(self.config.trial_concurrency);
            let Some(emitted) = self.tuner.take_suggestion(room)? else {
                break;
            };
            let (parameter_id, parameters, label, lineage) = match emitted {
                Emitted::Stop(stop) => {
                    self.stop_member(stop).await?;
                    continue;
                }
                Emitted::Member {
                    parameter_id,
                    parameters,
                    label,
                    lineage,
                } => (parameter_id, parameters, Some(label), Some(lineage)),
                Emitted::Parameters(s) => (s.parameter_id, s.parameters, s.label, None),
                // Never queued: the driver settles it as it comes (`TunerDriver::absorb`).
                Emitted::NoMore { .. } => continue,
            };
            if self.book.has_parameter(parameter_id) {
                continue;
            }
            // No trial will run it: the tuner hears so (see `TunerDriver::cancel_unrun`).
            if self.closed() {
                self.tuner.tell_dropped(parameter_id);
                continue;
            }
            if !self.accept_output(parameter_id, &parameters).await? {
                continue;
            }
            let lineage = lineage.map(|l| self.member_lineage(l));
            if let Some(lineage) = &lineage {
                if !self.successor_still_wanted(parameter_id, lineage).await? {
                    continue;
                }
            }
            self.submit(parameter_id, parameters, label, lineage)
                .await?;
        }
        Ok(())
    }

    async fn record_no_more(&mut self) -> Result<(), ManagerError> {
        self.store
            .append(StoreEvent::ExperimentStatusChanged {
                status: ExperimentStatus::NoMoreTrial,
                message: Some("the tuner has no more parameters to try".into()),
                spent_before_ms: None,
            })
            .await?;
        Ok(())
    }

    /// The loop's end: unless the user stopped the experiment or its time ran out (which must
    /// not wait for a tuner still thinking), the answers still to come are waited for, so that
    /// a tuner that failed on the last results ends the experiment as it would have before.
    /// Parameters answered that no trial ran are told ended.
    async fn last_answers(&mut self) -> Result<(), ManagerError> {
        if !self.stop_requested && !self.timers.deadline_passed() {
            self.tuner.settle().await?;
        }
        let book = &self.book;
        self.tuner.cancel_unrun(|id| book.has_parameter(id));
        Ok(())
    }

    /// Whether a parameter set the tuner handed out may become a trial: one the search space
    /// does not hold ends the experiment (`tunerErrorPolicy: error`), or is dropped, counted and
    /// logged, and the tuner told it ended SYS_CANCELED (`skip`), so that it stops waiting for it,
    /// or runs as it is (`allow`).
    pub(super) async fn accept_output(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
    ) -> Result<bool, ManagerError> {
        match self.tuner.check(parameter_id, parameters) {
            Check::Accepted | Check::Allowed(None) => Ok(true),
            Check::Allowed(Some(warning)) => {
                self.warn(None, warning).await?;
                Ok(true)
            }
            Check::Fatal(message) => Err(ManagerError::TunerOutput(message)),
            Check::Dropped(warning) => {
                self.warn(None, warning).await?;
                self.tuner.tell_dropped(parameter_id);
                self.publish(None);
                Ok(false)
            }
        }
    }

    /// Creates a trial (recorded WAITING); `fill`, at the latest first thing in the next turn,
    /// places it. Returns its id.
    pub(super) async fn submit(
        &mut self,
        parameter_id: u64,
        parameters: Value,
        parameter_label: Option<String>,
        lineage: Option<crate::store::Lineage>,
    ) -> Result<String, ManagerError> {
        let (sequence, trial_id) = self.book.next_trial();
        let created = self.store.append(StoreEvent::TrialCreated {
            trial_id: trial_id.clone(),
            sequence,
            parameter_id,
            parameter_label: parameter_label.clone(),
            parameters: parameters.clone(),
            lineage: lineage.clone().map(Box::new),
        });
        // Committed in order: the starts and ends appended before are committed too (or failed,
        // which stops the experiment before this trial is handed to a service). Appended before
        // they are waited for, so that one commit usually answers all of them.
        self.settle().await?;
        created.await?;
        let snapshot_holder = match lineage.as_ref().and_then(|l| l.parent.as_deref()) {
            Some(parent) => self.snapshot_parent_checkpoint(&trial_id, parent).await?,
            None => None,
        };
        let mut trial =
            trial::Trial::new(trial_id.clone(), sequence, parameter_id, parameters.clone());
        trial.snapshot_holder = snapshot_holder;
        trial.parameter_label = parameter_label;
        trial.lineage = lineage;
        self.book.insert(trial);
        Ok(trial_id)
    }

    pub(super) async fn end_trial(
        &mut self,
        trial_id: &str,
        status: TrialStatus,
        reason: Option<String>,
        exit_code: Option<i32>,
        signal: Option<i32>,
        stderr_tail: String,
    ) -> Result<(), ManagerError> {
        self.end_trial_at(
            trial_id,
            status,
            reason,
            exit_code,
            signal,
            stderr_tail,
            None,
        )
        .await
    }

    /// [`end_trial`](Self::end_trial) of a trial whose service says when it ended
    /// (`ServiceEvent::TrialEnded::ended_ms`, Unix ms), which is recorded as its end.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn end_trial_at(
        &mut self,
        trial_id: &str,
        status: TrialStatus,
        reason: Option<String>,
        exit_code: Option<i32>,
        signal: Option<i32>,
        stderr_tail: String,
        ended_ms: Option<i64>,
    ) -> Result<(), ManagerError> {
        // Not waited for here: what follows (the tuner told, the next trial asked for) runs
        // while it commits. Nothing outside this process learns of the end before it is
        // durable: the next trial's creation, committed after it, waits for it (`submit`), and
        // so does the experiment's end (`settle`). A tuner told of an end that a kill of knob
        // then loses is rebuilt from the store on resume, and the trial runs again.
        let ack = self.store.append(StoreEvent::TrialEnded {
            trial_id: trial_id.to_string(),
            attempt: self.book[trial_id].attempt,
            status,
            exit_code,
            signal,
            message: reason.clone(),
            stderr_tail: (!stderr_tail.is_empty()).then_some(stderr_tail),
            peak_memory_mib: self.book[trial_id].peak_memory_mib,
            peak_gpu_memory_mib: self.book[trial_id].peak_gpu_memory_mib,
            ended_ms,
        });
        self.unsettled.push_back(Unsettled::event(ack));
        self.environments.release(trial_id);
        self.book.set_status(trial_id, status);
        let trial = self.book.get_mut(trial_id).expect("ending a known trial");
        trial.reason = reason;
        let parameter_id = trial.parameter_id;
        // Told, not waited for: `fill` takes its answer in (see `TunerDriver`).
        self.tuner.trial_ended(parameter_id, status);
        // Told, not waited for: a failure comes back as a warning (`on_assessor_answers`).
        if let Some(assessor) = &mut self.assessor {
            assessor.trial_end(trial_id.to_string(), status.as_str());
        }
        if self.book[trial_id].lineage.is_some() {
            // Folders are deleted below on the strength of this end: it must be durable first
            // (a member run again after a kill of knob starts from its own checkpoint).
            self.settle().await?;
            self.drop_snapshot(trial_id, status);
            self.collect_checkpoints().await;
        }
        self.publish(None);
        Ok(())
    }

    /// Waits until the events the loop went on without waiting for (`unsettled`) are committed;
    /// the first that failed fails the experiment, as it would have where it was appended.
    pub(super) async fn settle(&mut self) -> Result<(), ManagerError> {
        while let Some(mut unsettled) = self.unsettled.pop_front() {
            let outcome = (&mut unsettled.ack).await;
            self.settled(unsettled, outcome)?;
        }
        Ok(())
    }

    /// Takes off `unsettled` what has committed by now, without waiting; a failure among them
    /// fails the experiment. The loop calls it before each wait: a failure of an event still
    /// uncommitted then is reported at a later turn (or by the next event waited for, which
    /// commits after it), not while the loop waits.
    pub(super) fn settle_committed(&mut self) -> Result<(), ManagerError> {
        while let Some(unsettled) = self.unsettled.front_mut() {
            let Some(outcome) = unsettled.ack.try_outcome() else {
                break;
            };
            let unsettled = self.unsettled.pop_front().expect("the front is there");
            self.settled(unsettled, outcome)?;
        }
        Ok(())
    }

    fn settled(
        &mut self,
        unsettled: Unsettled,
        outcome: Result<crate::store::EventSeq, crate::store::StoreError>,
    ) -> Result<(), ManagerError> {
        match (outcome, unsettled.metric_of) {
            (Ok(_), _) => Ok(()),
            // As `on_metrics` does with a metric it waits for.
            (
                Err(crate::store::StoreError::Rejected {
                    reason: crate::store::Rejection::DuplicateMetric { .. },
                    ..
                }),
                Some(trial_id),
            ) => {
                self.store.append_unacked(StoreEvent::Warning {
                    trial_id: Some(trial_id),
                    message: "duplicate metric ignored".into(),
                });
                Ok(())
            }
            (Err(e), _) => Err(e.into()),
        }
    }

    /// Asks the service to kill a trial; its end arrives later as an event and is recorded
    /// with `status` and `reason` (made one bounded line of visible text: an assessor or a
    /// tuner may give it).
    pub(super) async fn kill(
        &mut self,
        trial_id: &str,
        status: TrialStatus,
        reason: String,
    ) -> Result<(), ManagerError> {
        let reason = super::trial::stop_reason(&reason);
        let Some(trial) = self.book.get_mut(trial_id) else {
            return Ok(());
        };
        if trial.status.is_final() || trial.kill.is_some() {
            return Ok(());
        }
        let Some(service) = trial.service.filter(|_| trial.launched) else {
            // Never handed to a service: nothing runs, so it ends here, and one that ran before
            // ends when its last attempt did (ended now, a trial a resumed run never started
            // had its end moved to each later stop).
            let ended_ms = trial.last_attempt_end_ms;
            return self
                .end_trial_at(
                    trial_id,
                    status,
                    Some(reason),
                    None,
                    None,
                    String::new(),
                    ended_ms,
                )
                .await;
        };
        trial.kill = Some((status, reason.clone()));
        trial.kill_decided_ms = Some(crate::store::now_ms());
        let answered = std::sync::Arc::new(std::sync::OnceLock::new());
        trial.kill_answered = Some(answered.clone());
        // Recorded before the kill is asked for (in log order, so before anything the decision
        // led to, such as a population member's successor): a resume after a crash in between
        // ends the trial as decided instead of running it again.
        self.store.append_unacked(StoreEvent::TrialStopping {
            trial_id: trial_id.to_string(),
            status,
            message: reason.clone(),
        });
        let reply = self.services[service]
            .handle
            .kill_trial(trial_id.to_string(), reason);
        let asked = self.unanswered.asked(trial_id);
        self.warn_when_answered(reply, Some(trial_id.to_string()), move |answer| {
            let _ = answered.set(Instant::now());
            // Dropped with this closure once the answer comes, an error or not.
            let _answered = asked;
            answer.err().map(|e| format!("could not kill: {e}"))
        });
        // Looked at again then: the service's patience counts from its answer.
        let patience = self.services[service].end_patience;
        self.book.expect_end(trial_id, Instant::now() + patience);
        Ok(())
    }

    /// The end of trials the manager asked to kill is due (see [`TrialBook::expect_end`]): each
    /// whose service answered the kill longer than its patience ago
    /// (`services::END_AFTER_KILL_PATIENCE` and its grace period) and still reports no end is
    /// ended here as the kill decided, its message saying so and its resources released, with
    /// a console warning by service. One whose kill is unanswered (a service stuck in a call:
    /// `given_up_at_stop`) or whose environment cannot be reached (its end waits for the host or
    /// `hostLossTimeout`) is looked at again later.
    async fn on_end_unreported(
        &mut self,
        trial_ids: Vec<String>,
        now: Instant,
    ) -> Result<(), ManagerError> {
        let mut by_service: std::collections::BTreeMap<usize, Vec<String>> = Default::default();
        for trial_id in trial_ids {
            let trial = &self.book[trial_id.as_str()];
            let (Some(service), Some((status, reason))) = (trial.service, trial.kill.clone())
            else {
                continue;
            };
            let patience = self.services[service].end_patience;
            let answered = trial
                .kill_answered
                .as_ref()
                .and_then(|answered| answered.get().copied())
                .filter(|_| self.unreachable(&trial_id).is_none());
            let due = answered.map_or(now + patience, |answered| answered + patience);
            if due > now {
                self.book.expect_end(&trial_id, due);
                continue;
            }
            let platform = &self.services[service].platform;
            let never = format!(
                "training service {platform} never reported its end, {} s after it answered the kill; knob recorded it ended (it may still run there)",
                patience.as_secs()
            );
            // A trial stopped with the experiment keeps the end message `knob resume` knows
            // it by, so that it runs again; the warning says the rest.
            let message = match crate::store::stopped_with_experiment(status, Some(&reason)) {
                true => reason,
                false => format!("{reason}; {never}"),
            };
            self.warn(Some(trial_id.clone()), never).await?;
            self.end_trial(&trial_id, status, Some(message), None, None, String::new())
                .await?;
            by_service.entry(service).or_default().push(trial_id);
        }
        for (service, mut trials) in by_service {
            trials.sort();
            let slot = &self.services[service];
            let message = format!(
                "training service {} never reported the end of trial(s) {} it was asked to kill, {} s after it answered; knob recorded them ended and released their resources (they may still run there)",
                slot.platform,
                trials.join(", "),
                slot.end_patience.as_secs()
            );
            self.notice(message).await?;
        }
        Ok(())
    }

    pub(super) async fn stop_all(
        &mut self,
        reason: &str,
        status: TrialStatus,
    ) -> Result<(), ManagerError> {
        self.stop_requested = true;
        self.stopping_since.get_or_insert_with(Instant::now);
        for trial_id in self.book.active_ids() {
            self.kill(&trial_id, status, reason.to_string()).await?;
        }
        Ok(())
    }

    pub(super) fn next_deadline(&mut self) -> Option<Instant> {
        let now = Instant::now();
        // While a stop waits for trials, its next moment of patience: the notice of the
        // unanswered ones, then giving up the unreachable, then the unanswered.
        let stop_patience = self
            .stopping_since
            .filter(|_| self.book.active_count() > 0)
            .and_then(|since| {
                [
                    services::SERVICE_LATE_AFTER,
                    UNREACHABLE_AT_STOP,
                    UNANSWERED_AT_STOP,
                ]
                .into_iter()
                .map(|patience| since + patience)
                .find(|at| *at > now)
            });
        self.timers
            .next(now, self.book.next_trial_timer(now), stop_patience)
    }

    /// Whether the experiment stops (`stop_all`) and every trial not yet ended is one the stop
    /// no longer waits for:
    /// - it runs on an environment its service reports it cannot reach, and
    ///   [`UNREACHABLE_AT_STOP`] has passed: its kill waits for the host, and its end, at the
    ///   latest, for the service to declare it lost (`hostLossTimeout`, minutes);
    /// - or its service has not answered its start or its kill, and [`UNANSWERED_AT_STOP`] has
    ///   passed: a service stuck in a call (a `start_trial` that never returns) holds the
    ///   kills queued behind it for ever.
    fn given_up_at_stop(&self, now: Instant) -> bool {
        let Some(since) = self.stopping_since else {
            return false;
        };
        let active = self.book.active_ids();
        !active.is_empty()
            && active.iter().all(|id| {
                (now >= since + UNREACHABLE_AT_STOP && self.unreachable(id).is_some())
                    || (now >= since + UNANSWERED_AT_STOP && self.unanswered.contains(id))
            })
    }

    /// The trials not yet ended whose service has not answered a start or a kill about them,
    /// by service (platform), sorted; not those on an environment that cannot be reached,
    /// which are said to be so.
    fn unanswered_by_service(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut by_service: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for trial_id in self.book.active_ids() {
            if self.unreachable(&trial_id).is_some() {
                continue;
            }
            let service = self.book.get(&trial_id).and_then(|trial| trial.service);
            if let Some(service) = service.filter(|_| self.unanswered.contains(&trial_id)) {
                let platform = self.services[service].platform.clone();
                by_service.entry(platform).or_default().push(trial_id);
            }
        }
        for trials in by_service.values_mut() {
            trials.sort();
        }
        by_service
    }

    /// The environment of a trial handed to a service, and why it cannot be reached, when its
    /// service reports it so.
    pub(super) fn unreachable(&self, trial_id: &str) -> Option<(String, String)> {
        let trial = self.book.get(trial_id)?;
        let environment = trial.environment.as_deref().filter(|_| trial.launched)?;
        let why = self.environments.not_ready(environment)?;
        Some((environment.to_string(), why))
    }

    pub(super) async fn on_deadline(&mut self) -> Result<(), ManagerError> {
        let now = Instant::now();
        let stop_waits_long = self
            .stopping_since
            .is_some_and(|since| now >= since + services::SERVICE_LATE_AFTER);
        if stop_waits_long && !self.stop_wait_told {
            self.stop_wait_told = true;
            for (platform, trials) in self.unanswered_by_service() {
                self.notice(format!(
                    "the stop waits for trial(s) {}: training service {platform} has not answered their start or kill in {} s; the experiment ends without them after {} s",
                    trials.join(", "),
                    services::SERVICE_LATE_AFTER.as_secs(),
                    UNANSWERED_AT_STOP.as_secs()
                ))
                .await?;
            }
        }
        if let Some(waited) = self.timers.take_tuner_notice(now) {
            let message = format!(
                "{} owes parameters for {} trial(s) and nothing runs: none came in {} s (a tuner starting up or fitting its model may take this long); the experiment ends if none come in {} s",
                self.tuner.label(),
                self.tuner.in_flight(),
                waited.as_secs(),
                super::timers::TUNER_PATIENCE.as_secs()
            );
            self.news(message).await?;
        }
        if self.timers.take_reprobe(now) {
            self.wakes.reprobes += 1;
            self.refresh_environments().await?;
            // `fill`, first thing in the next turn, places the waiting trials again.
        }
        if self.timers.take_experiment_deadline(now) {
            self.stop_all("maxExperimentDuration reached", TrialStatus::SysCanceled)
                .await?;
        }
        let due = self.book.due(now);
        if !due.overdue.is_empty() {
            self.wakes.overdue += 1;
        }
        for trial_id in due.overdue {
            self.kill(
                &trial_id,
                TrialStatus::SysCanceled,
                "maxTrialDuration reached".into(),
            )
            .await?;
        }
        if !due.end_unreported.is_empty() {
            self.on_end_unreported(due.end_unreported, now).await?;
        }
        Ok(())
    }

    pub(super) async fn warn(
        &mut self,
        trial_id: Option<String>,
        message: String,
    ) -> Result<(), ManagerError> {
        // Nothing waits on a warning, so it rides along with the next commit; `finish` flushes.
        self.store
            .append_unacked(StoreEvent::Warning { trial_id, message });
        Ok(())
    }

    pub(super) fn publish(&self, status: Option<ExperimentStatus>) {
        let count = |status| self.book.count(status);
        let progress = Progress {
            status: status.or(self.progress.borrow().status),
            submitted: self.book.len(),
            best: self.book.best(),
            elapsed: self.timers.elapsed(),
            max_trial_number: self.config.max_trial_number,
            max_duration: self.config.max_experiment_duration,
            dropped_suggestions: self.tuner.dropped(),
            // Handed to a service: not those waiting for a placement or a start's retry.
            running: self.book.placed_count(),
            succeeded: count(TrialStatus::Succeeded),
            failed: count(TrialStatus::Failed),
            other_ended: count(TrialStatus::UserCanceled)
                + count(TrialStatus::SysCanceled)
                + count(TrialStatus::EarlyStopped),
            notices: self.notices.clone(),
        };
        self.progress.send_replace(progress);
    }

    /// Records how the experiment ended and shuts the service down.
    pub(super) async fn finish(
        mut self,
        result: Result<(), ManagerError>,
    ) -> Result<Outcome, ManagerError> {
        let (status, message) = match &result {
            Ok(()) if self.stop_requested && !self.timers.deadline_passed() => {
                (ExperimentStatus::Stopped, None)
            }
            Ok(()) if self.gave_up_on_tuner.is_some() => {
                (ExperimentStatus::Done, self.gave_up_on_tuner.take())
            }
            // The tuner ran out before the trial budget did (a finite search space used up):
            // said, or a run of 2 trials with maxTrialNumber 6 ended without a word why.
            Ok(())
                if self.tuner.exhausted()
                    && !self.book.budget_spent(self.config.max_trial_number) =>
            {
                let budget = self
                    .config
                    .max_trial_number
                    .map(|max| format!(" of maxTrialNumber {max}"))
                    .unwrap_or_default();
                let message = format!(
                    "the tuner has no more parameters to try, after {} trial(s){budget}: every point of a finite search space was tried, or the tuner says it is done",
                    self.book.len()
                );
                (ExperimentStatus::Done, Some(message))
            }
            Ok(()) => (ExperimentStatus::Done, None),
            Err(e) => (ExperimentStatus::Error, Some(e.to_string())),
        };
        if result.is_err() {
            // Best effort: the experiment failed; do not leave its trials running. They run
            // again on resume, as after a crash.
            let _ = self
                .stop_all(
                    crate::store::CANCELED_WITH_FAILED_EXPERIMENT,
                    TrialStatus::SysCanceled,
                )
                .await;
        }
        // Trials that may run on where their environment cannot be reached, said by
        // environment, before the services shut down (the notice is shown as the run ends).
        let mut unreached: std::collections::BTreeMap<(String, String), Vec<String>> =
            Default::default();
        for trial_id in self.book.active_ids() {
            if let Some(place) = self.unreachable(&trial_id) {
                unreached.entry(place).or_default().push(trial_id);
            }
        }
        for ((environment, why), mut trials) in unreached {
            trials.sort();
            let id = &self.id;
            self.notice(format!(
                "trial(s) {} could not be killed: environment {environment} cannot be reached ({why}); they may still run there. `knob resume {id}` ends them once it can be reached",
                trials.join(", ")
            ))
            .await?;
        }
        // Only those the stop gave up: the kills a failed experiment's end has just asked are
        // unanswered too, and may well be answered during the shutdown.
        let gave_up_unanswered = self
            .stopping_since
            .is_some_and(|since| Instant::now() >= since + UNANSWERED_AT_STOP);
        let unanswered = match gave_up_unanswered {
            true => self.unanswered_by_service(),
            false => Default::default(),
        };
        for (platform, trials) in unanswered {
            let id = &self.id;
            self.notice(format!(
                "trial(s) {} could not be killed: training service {platform} has not answered their start or kill; its shutdown is asked next, but they may still run. `knob resume {id}` ends what is left of them",
                trials.join(", ")
            ))
            .await?;
        }
        for problem in self.shut_down_services().await {
            self.warn(None, problem).await?;
        }
        self.settle().await?;
        // Trials the service ended during shutdown without telling us are recorded as such.
        for trial_id in self.book.active_ids() {
            let (status, reason) = self.book[&trial_id]
                .kill
                .clone()
                .unwrap_or((TrialStatus::SysCanceled, "the experiment ended".into()));
            self.store
                .append(StoreEvent::TrialEnded {
                    trial_id: trial_id.clone(),
                    attempt: self.book[&trial_id].attempt,
                    status,
                    exit_code: None,
                    signal: None,
                    message: Some(reason.clone()),
                    stderr_tail: None,
                    peak_memory_mib: self.book[&trial_id].peak_memory_mib,
                    peak_gpu_memory_mib: self.book[&trial_id].peak_gpu_memory_mib,
                    ended_ms: None,
                })
                .await?;
            self.book.set_status(&trial_id, status);
            self.book.get_mut(&trial_id).expect("known trial").reason = Some(reason);
        }
        self.store
            .append(StoreEvent::ExperimentStatusChanged {
                status,
                message: message.clone(),
                spent_before_ms: None,
            })
            .await?;
        self.store.flush().await?;
        self.publish(Some(status));
        let trials = self.book.summaries();
        // The tuner and the assessor stop before the experiment is over: told calls still
        // queued on their threads run first (a trial's end, which NNI's dispatcher sends its
        // algorithm only at its stop), then the plugin's own stop. A `knob create` that exited
        // before had its dispatcher killed part-way under load, and a user's tuner never heard
        // of the last trial's end. Bounded: a tuner stuck in a call does not hold the end.
        let components = async {
            self.tuner.close().await;
            if let Some(assessor) = self.assessor {
                assessor.close().await;
            }
        };
        let _ = tokio::time::timeout(COMPONENTS_STOP_PATIENCE, components).await;
        Ok(Outcome {
            status,
            message,
            trials,
        })
    }

    /// A start that failed, answered by `start_trial` or reported later
    /// (`ServiceEvent::StartFailed`): tried again after a pause when nothing ran, else the
    /// trial ends FAILED.
    pub(super) async fn on_start_failed(
        &mut self,
        trial_id: String,
        message: String,
    ) -> Result<(), ManagerError> {
        // Only a refusal that says nothing ran is tried again: a start that failed
        // half-way (a connection lost while the request was on its way) may have
        // started the trial, and a second start would run it twice.
        let closed = self.closed_for_retries() || !message.contains(NOT_STARTED);
        // A kill decided while the start was under way (the user's, a tuner's stop of a
        // population member, the experiment's stop) ends the trial as decided: a retry would
        // clear the decision and run a trial that was meant to end (its `TrialStopping` is in
        // the store already), and a FAILED would say less than what was asked.
        let decided = self
            .book
            .get(&trial_id)
            .filter(|t| !t.status.is_final())
            .and_then(|t| t.kill.clone());
        if let Some((status, reason)) = decided {
            // Nothing ran (a start the host did not send, its kill having come first): the
            // end as decided says all there is.
            if !message.contains(NOT_STARTED) {
                self.warn(Some(trial_id.clone()), message).await?;
            }
            return self
                .end_trial(&trial_id, status, Some(reason), None, None, String::new())
                .await;
        }
        let retry = self
            .book
            .get_mut(&trial_id)
            .filter(|t| !t.status.is_final())
            .map(|t| {
                t.start_failures += 1;
                t.start_failures <= START_RETRIES && !closed
            });
        if retry == Some(true) {
            // Nothing ran, so nothing is stored but the warning: the trial is
            // still WAITING there, and waits for a placement again here.
            let failures = self.book[trial_id.as_str()].start_failures;
            let backoff = START_RETRY_BACKOFF * (1 << (failures - 1).min(5));
            let message = format!("{message}; trying again in {} s", backoff.as_secs());
            // On the console too: trials whose starts keep being refused (no descriptor left,
            // say) otherwise made no progress without a word of why.
            self.console_warning(&trial_id, &message);
            self.warn(Some(trial_id.clone()), message).await?;
            self.environments.release(&trial_id);
            self.book
                .new_attempt(&trial_id, Some(Instant::now() + backoff));
            self.publish(None);
        } else if retry == Some(false) {
            self.end_trial(
                &trial_id,
                TrialStatus::Failed,
                Some(message),
                None,
                None,
                String::new(),
            )
            .await?;
        }
        Ok(())
    }
}

/// How long the end of an experiment waits for its tuner and assessor to stop (NNI's
/// dispatcher is given 5 s to exit after its terminate command).
const COMPONENTS_STOP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// An appended event the loop went on without waiting for (see `Manager::settle`).
pub(super) struct Unsettled {
    ack: crate::store::Ack<crate::store::EventSeq>,
    /// The trial of an intermediate result: a duplicate of one stored before is rejected and
    /// ignored with a warning, as `on_metrics` does; any other failure fails the experiment.
    metric_of: Option<String>,
}

impl Unsettled {
    pub(super) fn event(ack: crate::store::Ack<crate::store::EventSeq>) -> Unsettled {
        Unsettled {
            ack,
            metric_of: None,
        }
    }

    pub(super) fn metric(
        ack: crate::store::Ack<crate::store::EventSeq>,
        trial_id: String,
    ) -> Unsettled {
        Unsettled {
            ack,
            metric_of: Some(trial_id),
        }
    }
}

/// What a turn's events did: [`Turn::Quiet`] when they were only recorded (intermediate
/// results nothing here acts on), so that the next turn need not look for trials to create
/// or place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    Quiet,
    Changed,
}

/// What woke the loop.
enum Wake {
    ServiceEvents(Vec<TaggedEvent>),
    ServicesGone,
    Command(Option<Command>),
    StartFailed(String, String),
    Reprobed(usize, Result<Vec<EnvironmentReport>, HostError>),
    Fetched(super::population::Fetched),
    Deadline,
    Woken(Woken),
    /// Answers of the tuner's that were not waited for came (see `TunerDriver::answered`).
    TunerAnswered(Result<(), HostError>),
    /// Answers of the assessor's that were not waited for came (see
    /// `AssessorDriver::answered`).
    AssessorAnswered(Vec<assessor_driver::Answer>),
    /// A call to the assessor is unanswered for long: the console names it.
    AssessorLate,
    GaveUpOnTuner,
    /// Back for the trials `submit_new` left for another turn.
    MoreToSubmit,
}

/// Which component woke the loop outside a call.
#[derive(Debug, Clone, Copy)]
pub(super) enum Woken {
    /// The tuner has parameters ready for ids it deferred: take them.
    Tuner,
    /// The assessor decided about a trial: ask it again about the running ones.
    Assessor,
}

/// How many times a trial whose start its service refused is tried again before it ends FAILED
/// with the refusal (see `Trial::start_failures`). The n-th retry waits
/// `START_RETRY_BACKOFF` × 2^(n-1): 1 s, 2 s, … 32 s, 63 s in all, which outlasts a dropped
/// connection's default reconnect window (`hostLossTimeout`, 60 s).
const START_RETRIES: u32 = 6;
const START_RETRY_BACKOFF: std::time::Duration = std::time::Duration::from_secs(1);
/// The callback a component wakes the loop with.
fn waker(
    woken: &mpsc::UnboundedSender<Woken>,
    which: Woken,
) -> knob_plugin_api::host::WakeCallback {
    let woken = woken.clone();
    Box::new(move || {
        let _ = woken.send(which);
    })
}

/// At most this many service events are taken from the channel at once.
const MAX_EVENT_BATCH: usize = 4096;

/// The most trials one turn asks the tuner for. A `trialConcurrency` far above what the services
/// run (`knob update concurrency ID 100000000`) made one turn create trials for as long as the
/// budget lasted, and a stop, or any event, waited behind it.
const MAX_NEW_TRIALS_A_TURN: u32 = 1024;

/// How long a stop waits for an environment that cannot be reached to come back (a dropped
/// connection is usually restored within seconds) before it ends without the trials there.
const UNREACHABLE_AT_STOP: std::time::Duration = std::time::Duration::from_secs(15);

/// How long a stop waits for trials whose service has not answered their start or kill before
/// it ends without them. The service's shutdown, queued behind the same call, is waited for
/// after that (`SHUTDOWN_PATIENCE`, 60 s): a start that only takes long (a host's code upload
/// over SSH) still ends its trial there, and the whole stays within `knob stop`'s 2 minutes.
const UNANSWERED_AT_STOP: std::time::Duration = std::time::Duration::from_secs(30);

/// The assessor's next answers (see `AssessorDriver::answered`); never, without an assessor.
async fn assessor_answered(assessor: &mut Option<AssessorDriver>) -> Vec<assessor_driver::Answer> {
    match assessor {
        Some(assessor) => assessor.answered().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
