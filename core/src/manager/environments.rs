//! Environments and placement: every environment the training services reported (which service
//! owns it, whether it takes trials, why not), and the scheduler that decides where waiting
//! trials go ([`Placer`]).
//!
//! It does no I/O: what it has to say (a host not ready, back, lost) comes back as [`Said`]
//! lines, which the loop records and shows; the services' handles stay with the loop.

use std::collections::HashMap;

use knob_gpu_sched::{EnvironmentStatus, Placement, Reasons};
use knob_plugin_api::service::Environment;

use super::placement::{OwnRequest, Placer};
use super::EnvironmentView;

/// What the manager knows about one environment.
#[derive(Debug, Clone)]
struct EnvironmentRecord {
    /// Index of the service that reported it.
    service: usize,
    host: String,
    ready: bool,
    /// Why it is not ready, when its service said.
    why: Option<String>,
    /// It was ready at some time (a queued allocation is not, until its job runs).
    seen_ready: bool,
    /// Reported by its status alone with `"retrying": true`: a host its service has never
    /// reached and still tries (its sshd not up yet). Not in the scheduler (its resources are
    /// not known), but trials wait for it with its reason ([`Environments::unreached`])
    /// instead of the experiment ending for want of an environment, until its service gives up
    /// on it (its status alone, without `retrying`) or reaches it.
    retrying: bool,
    /// Declared lost ([`Environments::lose`]) and not ready since: its loss was said, so
    /// its service's new reasons while it stays down are kept but not said again.
    lost: bool,
    /// Its service's last report: read again when the service reports it unchanged
    /// ([`Environments::report_same`]) while it is not `settled`.
    last: Environment,
    /// The scheduler holds the environment as `last` left it (taken as reported, saying
    /// nothing, and not lost or forgotten since): the same report again changes nothing and
    /// says nothing, so it is not read again (a re-probe, every few seconds while trials wait,
    /// reports every environment of every service).
    settled: bool,
}

/// A line about environments for the loop to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Said {
    /// Recorded and shown on the console as a warning (`Progress::notices`).
    Notice(String),
    /// Recorded and shown on the console as news, not as a warning: an environment ready.
    News(String),
    /// Recorded only.
    Warning(String),
}

/// Why an environment its service reports `Draining` takes no trial: it is retired (a cluster
/// allocation that ended, or whose time is nearly up), and trials do not wait for it.
const RETIRED: &str = "retired: it takes no new trials";

/// An inventory of which only the status can be read: what a service reports for an
/// environment whose resources it does not know (a host it never reached), with the reason,
/// and whether it still tries to reach it.
#[derive(serde::Deserialize)]
struct StatusOnly {
    status: EnvironmentStatus,
    #[serde(default)]
    retrying: bool,
}

/// How many of the services' own problems are kept for the error when no environment is left.
const KEPT_PROBLEMS: usize = 16;

pub(super) struct Environments {
    /// Each service's platform, by index.
    platforms: Vec<String>,
    /// By id, hashed: a re-probe looks up every environment of every service, and a B-tree's
    /// string comparisons over 1 000 ids were most of a re-probe (`sim_scale`). What lists
    /// them sorts by id.
    records: HashMap<String, EnvironmentRecord>,
    /// What services said about their environments (warnings without a trial, failed
    /// `environments()` calls), the latest [`KEPT_PROBLEMS`]: the reason given when no
    /// environment is left.
    problems: Vec<String>,
    placer: Placer,
    /// By service: whether one of its environments has a limit judged on the host's use as it
    /// is now (see [`Environments::host_use_limited`]).
    host_use_limited: Vec<bool>,
}

impl Environments {
    /// No environment yet, for services of these platforms (by index), placing with `placer`.
    pub fn new(platforms: Vec<String>, placer: Placer) -> Environments {
        Environments {
            platforms,
            records: HashMap::new(),
            problems: Vec::new(),
            placer,
            host_use_limited: Vec::new(),
        }
    }

    /// Whether an environment of service `service` has a limit judged on the host's use as it
    /// is now (CPU use, memory available: `EnvironmentLimits::judged_on_host_use`), which only a
    /// recent probe can tell (`Manager::probe_for_host_use_limits`).
    pub fn host_use_limited(&self, service: usize) -> bool {
        self.host_use_limited.get(service).copied().unwrap_or(false)
    }

    /// The platform of the service at `index`.
    pub fn platform(&self, service: usize) -> &str {
        self.platforms.get(service).map_or("", String::as_str)
    }

    /// Registers what a service says about one of its environments: the owner, whether it
    /// takes trials, and its inventory in the scheduler.
    pub fn report(&mut self, service: usize, environment: Environment) -> Vec<Said> {
        let mut said = Vec::new();
        let platform = self.platform(service).to_string();
        if let Some(record) = self.records.get(&environment.id) {
            if record.service != service {
                let owner = self.platform(record.service);
                return vec![Said::Warning(format!(
                    "training service {platform} reported environment {}, which belongs to training service {owner}; ignored",
                    environment.id
                ))];
            }
        }
        if self.records.get(&environment.id).is_some_and(|record| {
            record.service == service && record.settled && record.last == environment
        }) {
            return said;
        }
        let id = environment.id.clone();
        let was_ready = self.records.get(&id).map(|record| record.ready);
        let mut ready = environment.ready;
        let unusable = |reason: String| {
            Said::Notice(format!(
                "environment {id} ({}): its inventory is not usable ({reason}); no trial runs there",
                environment.host
            ))
        };
        // Why a not-ready environment is so, when its service said (its inventory's status):
        // a cluster job pending in its queue, a host that dropped.
        let mut why = None;
        let mut retrying = false;
        if ready {
            // Read in place rather than from a deep copy of the JSON: a service of 1 000
            // environments reports them all at the start.
            match <knob_gpu_sched::Environment as serde::Deserialize>::deserialize(
                &environment.inventory,
            ) {
                Ok(mut inventory) => {
                    inventory.id = id.as_str().into();
                    inventory.status = EnvironmentStatus::Ready;
                    // Said once, when it first comes up: a GPU gone later is not a config
                    // mistake (trials placed there still run on the GPUs it has).
                    if let (None, Err(e)) = (was_ready, inventory.check_limits_match_gpus()) {
                        said.push(Said::Notice(e.to_string()));
                    }
                    if inventory.limits.judged_on_host_use() {
                        if self.host_use_limited.len() <= service {
                            self.host_use_limited.resize(service + 1, false);
                        }
                        self.host_use_limited[service] = true;
                    }
                    if let Err(reason) = self.placer.upsert(inventory) {
                        ready = false;
                        said.push(unusable(reason));
                    }
                }
                Err(e) => {
                    ready = false;
                    said.push(Said::Notice(format!(
                        "environment {id} ({}): its inventory cannot be read ({e}); no trial runs there",
                        environment.host
                    )));
                }
            }
        } else {
            let inventory = <knob_gpu_sched::Environment as serde::Deserialize>::deserialize(
                &environment.inventory,
            )
            .ok();
            // A status alone (a host never reached, whose resources nobody knows) says why; it
            // is not registered, so trials do not wait for it.
            let status = match &inventory {
                Some(inventory) => Some(inventory.status.clone()),
                None => <StatusOnly as serde::Deserialize>::deserialize(&environment.inventory)
                    .ok()
                    .map(|only| {
                        retrying = only.retrying;
                        only.status
                    }),
            };
            why = match &status {
                Some(EnvironmentStatus::Unavailable(reason)) => Some(reason.clone()),
                Some(EnvironmentStatus::Starting) => Some("starting".to_string()),
                Some(EnvironmentStatus::Draining) => Some(RETIRED.to_string()),
                _ => None,
            };
            match (inventory, status) {
                // Reported first as on its way (a queued allocation, with what it asked for as
                // its inventory): it counts as an environment that will take trials, so trials
                // wait for it with its reason instead of the experiment failing for want of
                // one. A lost environment (known before, gone from the scheduler) is not taken
                // back until it is ready again.
                (
                    Some(mut inventory),
                    Some(EnvironmentStatus::Starting | EnvironmentStatus::Unavailable(_)),
                ) if was_ready.is_none() && !self.placer.knows(&id) => {
                    inventory.id = id.as_str().into();
                    if let Err(reason) = self.placer.upsert(inventory) {
                        said.push(unusable(reason));
                    }
                }
                // Its status alone for one known before: its service no longer knows its
                // resources, having given up on it (an SSH host not back after about an
                // hour); trials do not wait for it, as for a host never reached.
                (None, Some(EnvironmentStatus::Unavailable(_))) if self.placer.knows(&id) => {
                    self.placer.remove(&id)
                }
                (_, Some(EnvironmentStatus::Starting)) => self.placer.set_starting(&id),
                (_, Some(EnvironmentStatus::Draining)) => self.placer.set_draining(&id),
                _ => self.placer.set_unavailable(
                    &id,
                    &why.clone()
                        .unwrap_or_else(|| format!("host {} is not reachable", environment.host)),
                ),
            }
        }
        let shown_why = why.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
        let was_why = self.records.get(&id).and_then(|record| record.why.clone());
        let seen_ready = self
            .records
            .get(&id)
            .is_some_and(|record| record.seen_ready);
        let lost = !ready && self.records.get(&id).is_some_and(|record| record.lost);
        let host = &environment.host;
        let retired = why.as_deref() == Some(RETIRED);
        match (was_ready, ready) {
            // Retiring is an allocation's normal end (its time is nearly up, or over); a
            // failure that ended it is its service's own warning.
            (_, false) if retired && was_why != why => {
                said.push(Said::News(format!("environment {id} ({host}) is {RETIRED}")));
            }
            (_, false) if retired => {}
            (Some(true), false) => said.push(Said::Notice(format!(
                "environment {id} ({host}) is not ready{shown_why}; no new trial starts there until it is back"
            ))),
            (None, false) => said.push(Said::Notice(format!(
                "environment {id} ({host}) is not ready{shown_why}; no trial starts there until it is"
            ))),
            (Some(false), true) => {
                let again = if seen_ready { " again" } else { "" };
                said.push(Said::News(format!(
                    "environment {id} ({host}) is ready{again}"
                )))
            }
            // Still not ready, for another reason (a queued job's reason changed, say).
            (Some(false), false) if why.is_some() && why != was_why && !lost => said.push(Said::Notice(
                format!("environment {id} ({host}) is not ready{shown_why}"),
            )),
            _ => {}
        }
        // Taken as reported, saying nothing of it: the same report again would do the same.
        let settled = ready == environment.ready && said.is_empty();
        self.records.insert(
            id,
            EnvironmentRecord {
                service,
                host: environment.host.clone(),
                ready,
                why,
                seen_ready: seen_ready || ready,
                retrying: retrying && !ready,
                lost,
                last: environment,
                settled,
            },
        );
        said
    }

    /// A service reports environment `id` exactly as it did last
    /// (`EnvironmentReport::Same`): as [`Environments::report`] of that report again, without
    /// the service sending, nor the loop reading, the report again. Nothing to do while the
    /// environment is settled (most of a re-probe's environments); its last report is read
    /// again otherwise (lost, forgotten, or what it said last time may change).
    pub fn report_same(&mut self, service: usize, id: &str) -> Vec<Said> {
        match self.records.get(id) {
            Some(record) if record.service == service && record.settled => Vec::new(),
            Some(record) if record.service == service => {
                let last = record.last.clone();
                self.report(service, last)
            }
            // Another service's environment: refused again, as its full report was.
            Some(record) => {
                let (platform, owner) = (self.platform(service), self.platform(record.service));
                vec![Said::Warning(format!(
                    "training service {platform} reported environment {id}, which belongs to training service {owner}; ignored"
                ))]
            }
            // A service reports an environment in full before it can report it unchanged; one
            // never seen has no report to read.
            None => Vec::new(),
        }
    }

    /// Why an environment is known not to take trials now (its service reported it not
    /// ready: a host that cannot be reached), `None` while it is ready or unknown.
    pub fn not_ready(&self, environment_id: &str) -> Option<String> {
        let record = self.records.get(environment_id)?;
        (!record.ready).then(|| {
            record
                .why
                .clone()
                .unwrap_or_else(|| "not ready".to_string())
        })
    }

    /// Every environment registered, for `Command::Environments`.
    pub fn views(&self) -> Vec<EnvironmentView> {
        let mut views: Vec<EnvironmentView> = self
            .records
            .iter()
            .map(|(id, record)| EnvironmentView {
                id: id.clone(),
                platform: self.platform(record.service).to_string(),
                host: record.host.clone(),
                ready: record.ready,
                why: record.why.clone(),
            })
            .collect();
        views.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        views
    }

    /// A host is gone (its service said so with a trial's `environment_lost`): its trials
    /// run elsewhere. The notice, unless it was gone already.
    ///
    /// One its service reports ready is kept: what was lost is the trial, not the host (a
    /// host whose agent was killed and started again). Forgetting it left an experiment
    /// on that one host with "no environment can run trials" while the host took trials.
    ///
    /// One its service last reported `Unavailable` with its inventory is still being tried
    /// (an SSH host reconnecting, for about an hour): it stays, not ready, so trials that fit
    /// nowhere else wait for it and the experiment goes on. Forgetting it ended an experiment
    /// on one lab server in ERROR seconds after `hostLossTimeout`, while the server rebooted.
    /// Otherwise (retired, or its status alone: its service gave up on it) the scheduler
    /// forgets it; if it comes back, its service reports it again and it is registered anew.
    pub fn lose(&mut self, environment_id: &str, reason: &str) -> Option<String> {
        let record = self.records.get_mut(environment_id)?;
        // Said once: it may stay known, waited for, after its loss.
        if record.ready || record.lost || !self.placer.knows(environment_id) {
            return None;
        }
        record.ready = false;
        record.settled = false;
        record.lost = true;
        let retried = <knob_gpu_sched::Environment as serde::Deserialize>::deserialize(
            &record.last.inventory,
        )
        .is_ok_and(|inventory| matches!(inventory.status, EnvironmentStatus::Unavailable(_)));
        if retried {
            let why = record.why.clone().unwrap_or_else(|| reason.to_string());
            self.placer.set_unavailable(environment_id, &why);
        } else {
            self.placer.remove(environment_id);
        }
        Some(format!("environment {environment_id} lost: {reason}"))
    }

    /// A service's own word about its environments, kept (the latest few) for the error if no
    /// environment is left.
    pub fn problem(&mut self, message: String) {
        if self.problems.len() == KEPT_PROBLEMS {
            self.problems.remove(0);
        }
        self.problems.push(message);
    }

    /// Whether trials can run or wait for an environment: one is ready, one the scheduler
    /// knows may take them (an allocation on its way), or a host its service still tries to
    /// reach for the first time.
    pub fn any(&self) -> bool {
        self.records
            .values()
            .any(|record| record.ready || record.retrying)
            || self.placer.has_environment()
    }

    /// Why trials wait for hosts their services have never reached and still try (see
    /// [`EnvironmentRecord::retrying`]), `None` when there is none: "waiting for ssh:a
    /// (a:22), not reached yet: <why>", each such environment by id.
    pub fn unreached(&self) -> Option<String> {
        let mut unreached: Vec<(&String, &EnvironmentRecord)> = self
            .records
            .iter()
            .filter(|(_, record)| record.retrying)
            .collect();
        if unreached.is_empty() {
            return None;
        }
        unreached.sort_unstable_by_key(|&(id, _)| id);
        let named: Vec<String> = unreached
            .into_iter()
            .map(|(id, record)| {
                let why = record.why.as_deref().unwrap_or("not reachable");
                format!("{id} ({}), not reached yet: {why}", record.host)
            })
            .collect();
        Some(format!("waiting for {}", named.join("; ")))
    }

    /// Whether the scheduler has an environment that takes trials now or may again.
    pub fn can_place(&self) -> bool {
        self.placer.has_environment()
    }

    /// `Err(reason)` when no registered environment could ever take a trial of this config.
    pub fn check(&self) -> Result<(), String> {
        self.placer.check()
    }

    /// Why no environment can take trials, for the experiment's error.
    pub fn no_environment_reason(&self) -> String {
        let mut records: Vec<(&String, &EnvironmentRecord)> = self.records.iter().collect();
        records.sort_unstable_by_key(|&(id, _)| id);
        // Each with why it is not ready, when its service said (a host's connection error),
        // but for "retired", which says nothing the service's own lines do not: separated by
        // "; " then, as a reason may hold commas.
        let why = |record: &EnvironmentRecord| record.why.clone().filter(|why| why != RETIRED);
        let said_why = records.iter().any(|(_, record)| why(record).is_some());
        let names: Vec<String> = records
            .into_iter()
            .map(|(id, record)| match why(record) {
                Some(why) => format!("{id} ({}): {why}", record.host),
                None => format!("{id} ({})", record.host),
            })
            .collect();
        let mut reason = if names.is_empty() {
            "no training service reported an environment".to_string()
        } else {
            let separator = if said_why { "; " } else { ", " };
            format!("no environment can run trials: {}", names.join(separator))
        };
        // What the services said about it, the latest few (a flapping host repeats itself).
        let skip = self.problems.len().saturating_sub(3);
        let problems: Vec<&str> = self.problems[skip..].iter().map(String::as_str).collect();
        if !problems.is_empty() {
            reason.push_str(&format!(" — {}", problems.join("; ")));
        }
        reason
    }

    /// The host of an environment, as its service named it.
    pub fn host_of(&self, environment_id: &str) -> Option<String> {
        self.records
            .get(environment_id)
            .map(|record| record.host.clone())
    }

    /// The service that owns an environment.
    pub fn owner_of(&self, environment_id: &str) -> Option<usize> {
        self.records
            .get(environment_id)
            .map(|record| record.service)
    }

    /// Places waiting trials, oldest first (see [`Placer::place`]).
    #[cfg(test)]
    pub fn place(&mut self, waiting: &[OwnRequest]) -> Vec<Placement> {
        self.placer.place(waiting)
    }

    /// See [`Placer::place_with`].
    pub fn place_with(&mut self, waiting: &[OwnRequest], reasons: Reasons) -> Vec<Placement> {
        self.placer.place_with(waiting, reasons)
    }

    /// See [`Placer::largest_gpu_capacity_mib`].
    pub fn largest_gpu_capacity_mib(&self) -> Option<u64> {
        self.placer.largest_gpu_capacity_mib()
    }

    /// See [`Placer::largest_host_memory_room_mib`].
    pub(super) fn largest_host_memory_room_mib(&self) -> Option<super::trial::HostMemoryRoom> {
        self.placer.largest_host_memory_room_mib()
    }

    /// See [`Placer::sized_by_memory_request`].
    pub fn sized_by_memory_request(&self, mib: u64) -> bool {
        self.placer.sized_by_memory_request(mib)
    }

    /// The environment the scheduler holds resources on for a trial, if any.
    pub fn assigned_environment(&self, trial_id: &str) -> Option<&str> {
        self.placer.assigned_environment(trial_id)
    }

    /// Frees what a trial held; call once its process group is gone.
    pub fn release(&mut self, trial_id: &str) {
        self.placer.release(trial_id);
    }

    /// The scheduler forgets an environment no service owns.
    pub fn forget(&mut self, environment_id: &str) {
        if let Some(record) = self.records.get_mut(environment_id) {
            record.settled = false;
        }
        self.placer.remove(environment_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knob_gpu_sched::{ByteSize, Gpu, HostResources, SchedulerConfig};
    use serde_json::{json, Value};

    fn inventory(id: &str, gpus: u32, status: Option<EnvironmentStatus>) -> Value {
        let gpus = (0..gpus)
            .map(|index| Gpu::idle(index, "Test GPU", ByteSize::gib(16)))
            .collect();
        let host = HostResources {
            cpu_count: 8,
            cpu_utilization_percent: Some(0.0),
            memory_total: ByteSize::gib(32),
            memory_available: ByteSize::gib(32),
        };
        let mut environment = knob_gpu_sched::Environment::new(id, "box", gpus, host);
        if let Some(status) = status {
            environment.status = status;
        }
        serde_json::to_value(environment).unwrap()
    }

    fn reported(id: &str, ready: bool, inventory: Value) -> Environment {
        Environment {
            id: id.into(),
            host: "box".into(),
            ready,
            inventory,
        }
    }

    fn environments(trial_gpu_number: u32) -> Environments {
        let placer = Placer::with_settings(SchedulerConfig {
            trial_gpu_number: Some(trial_gpu_number),
            ..Default::default()
        });
        Environments::new(vec!["ssh-boxes".into(), "batch-queue".into()], placer)
    }

    fn notices(said: Vec<Said>) -> Vec<String> {
        said.into_iter()
            .map(|s| match s {
                Said::Notice(m) => format!("notice: {m}"),
                Said::News(m) => format!("news: {m}"),
                Said::Warning(m) => format!("warning: {m}"),
            })
            .collect()
    }

    #[test]
    fn a_host_that_drops_and_comes_back_is_announced_each_time() {
        let mut envs = environments(1);
        assert!(!envs.any());
        assert_eq!(
            envs.report(0, reported("a", true, inventory("a", 2, None))),
            vec![]
        );
        assert!(envs.any() && envs.check().is_ok());
        let placed = envs.place(&[OwnRequest {
            trial_id: "t1".into(),
            memory_mib: None,
            gpu_memory_mib: None,
        }]);
        assert!(matches!(placed[0], Placement::Succeed { .. }));
        let down = inventory(
            "a",
            2,
            Some(EnvironmentStatus::Unavailable("ssh: timed out".into())),
        );
        assert_eq!(
            notices(envs.report(0, reported("a", false, down.clone()))),
            ["notice: environment a (box) is not ready: ssh: timed out; no new trial starts there until it is back"]
        );
        // The same state again says nothing.
        assert_eq!(envs.report(0, reported("a", false, down)), vec![]);
        assert_eq!(
            notices(envs.report(0, reported("a", true, inventory("a", 2, None)))),
            ["news: environment a (box) is ready again"]
        );
        let views = envs.views();
        assert_eq!(views.len(), 1);
        assert_eq!(
            (views[0].platform.as_str(), views[0].ready),
            ("ssh-boxes", true)
        );
    }

    /// A host whose `gpuIndices` names a GPU it lacks is said once, when it first comes up (it
    /// connects after the start, so create cannot refuse it); a later probe says nothing more.
    #[test]
    fn gpu_indices_a_host_lacks_are_said_once_when_it_first_comes_up() {
        let mut envs = environments(1);
        let with_limits = |gpus: u32| {
            let mut value = inventory("a", gpus, None);
            value["limits"]["gpuIndices"] = json!([0, 5]);
            value
        };
        assert_eq!(
            notices(envs.report(0, reported("a", true, with_limits(2)))),
            ["notice: environment a: gpuIndices names GPU 5, but the GPUs found are 0, 1: list only GPUs it has"]
        );
        assert!(envs.check().is_ok(), "GPU 0 still takes trials");
        assert_eq!(envs.report(0, reported("a", true, with_limits(3))), vec![]);
    }

    #[test]
    fn a_round_that_placed_nothing_is_worked_out_again_only_after_a_change() {
        let mut envs = environments(1);
        envs.report(0, reported("a", true, inventory("a", 1, None)));
        let request = |id: &str| OwnRequest {
            trial_id: id.into(),
            memory_mib: None,
            gpu_memory_mib: None,
        };
        assert!(matches!(
            envs.place(&[request("t1")])[0],
            Placement::Succeed { .. }
        ));
        // The only GPU is taken: t2 waits, as often as it is asked (the answer is kept).
        for _ in 0..3 {
            assert!(matches!(
                envs.place(&[request("t2")])[0],
                Placement::TmpNoAvailableGpu { .. }
            ));
        }
        // Another trial waiting too is a new question.
        let both = envs.place(&[request("t2"), request("t3")]);
        assert!(both
            .iter()
            .all(|p| matches!(p, Placement::TmpNoAvailableGpu { .. })));
        // A release is a change: t2 gets the GPU.
        envs.release("t1");
        assert!(matches!(
            envs.place(&[request("t2"), request("t3")])[0],
            Placement::Succeed { .. }
        ));
        // So is an environment reported again (a new GPU).
        assert!(matches!(
            envs.place(&[request("t3")])[0],
            Placement::TmpNoAvailableGpu { .. }
        ));
        envs.report(0, reported("a", true, inventory("a", 2, None)));
        assert!(matches!(
            envs.place(&[request("t3")])[0],
            Placement::Succeed { .. }
        ));
    }

    #[test]
    fn the_same_report_again_changes_nothing_but_a_lost_host_is_taken_back() {
        let mut envs = environments(1);
        let request = |id: &str| OwnRequest {
            trial_id: id.into(),
            memory_mib: None,
            gpu_memory_mib: None,
        };
        envs.report(0, reported("a", true, inventory("a", 1, None)));
        assert!(matches!(
            envs.place(&[request("t1")])[0],
            Placement::Succeed { .. }
        ));
        let waits = envs.place(&[request("t2")]);
        // A re-probe reports it again as it was: nothing is said, and the kept answer stands
        // (the same placements, not worked out again: the scheduler saw no change).
        let changes = envs.placer.changes();
        assert_eq!(
            notices(envs.report(0, reported("a", true, inventory("a", 1, None)))),
            Vec::<String>::new()
        );
        assert_eq!(envs.placer.changes(), changes);
        assert_eq!(envs.place(&[request("t2")]), waits);
        // Reported ready, it stays when a trial's end says its host was lost: the trial was
        // lost, not the host (its agent started again).
        assert_eq!(envs.lose("a", "agent restarted"), None);
        assert!(envs.can_place());
        // Not ready, then lost, then the same report as before: it is registered anew and takes
        // trials again.
        let gone = inventory("a", 1, Some(EnvironmentStatus::Unavailable("gone".into())));
        envs.report(0, reported("a", false, gone));
        assert!(envs.lose("a", "host rebooted").is_some());
        // Its status alone: its service gave up on it.
        let given_up = json!({"status": EnvironmentStatus::Unavailable("gone".into())});
        envs.report(0, reported("a", false, given_up));
        assert!(!envs.can_place());
        assert_eq!(
            notices(envs.report(0, reported("a", true, inventory("a", 1, None)))),
            ["news: environment a (box) is ready again"]
        );
        assert!(matches!(
            envs.place(&[request("t2")])[0],
            Placement::Succeed { .. }
        ));
        // A report that said something is read again the next time: still not ready, for the
        // same reason, says nothing more.
        let down = || {
            reported(
                "a",
                false,
                inventory("a", 1, Some(EnvironmentStatus::Unavailable("gone".into()))),
            )
        };
        assert_eq!(notices(envs.report(0, down())).len(), 1);
        assert_eq!(notices(envs.report(0, down())), Vec::<String>::new());
        assert_eq!(notices(envs.report(0, down())), Vec::<String>::new());
    }

    #[test]
    fn an_environment_reported_unchanged_is_read_again_only_when_not_settled() {
        let mut envs = environments(1);
        let request = |id: &str| OwnRequest {
            trial_id: id.into(),
            memory_mib: None,
            gpu_memory_mib: None,
        };
        let up = || reported("a", true, inventory("a", 1, None));
        let down = || {
            reported(
                "a",
                false,
                inventory("a", 1, Some(EnvironmentStatus::Unavailable("gone".into()))),
            )
        };
        envs.report(0, up());
        assert!(matches!(
            envs.place(&[request("t1")])[0],
            Placement::Succeed { .. }
        ));
        // Unchanged while settled: nothing said, nothing for the scheduler.
        let changes = envs.placer.changes();
        assert_eq!(notices(envs.report_same(0, "a")), Vec::<String>::new());
        assert_eq!(envs.placer.changes(), changes);
        // A changed report is read.
        assert_eq!(
            notices(envs.report(0, down())),
            ["notice: environment a (box) is not ready: gone; no new trial starts there until it is back"]
        );
        // The same again (its last report said something): read again, nothing more to say,
        // still not ready.
        assert_eq!(notices(envs.report_same(0, "a")), Vec::<String>::new());
        assert!(!envs.views()[0].ready);
        assert_eq!(
            notices(envs.report(0, up())),
            ["news: environment a (box) is ready again"]
        );
        // Not ready, then lost, then reported unchanged: its last report is read again (it is
        // not settled), and it stays out; reported ready, it is taken back.
        let given_up = || {
            reported(
                "a",
                false,
                json!({"status": EnvironmentStatus::Unavailable("gone".into())}),
            )
        };
        assert_eq!(notices(envs.report(0, down())).len(), 1);
        assert!(envs.lose("a", "host rebooted").is_some());
        assert_eq!(notices(envs.report(0, given_up())), Vec::<String>::new());
        assert!(!envs.can_place());
        assert_eq!(notices(envs.report_same(0, "a")), Vec::<String>::new());
        assert!(!envs.can_place());
        assert_eq!(
            notices(envs.report(0, up())),
            ["news: environment a (box) is ready again"]
        );
        assert!(envs.can_place());
        assert!(matches!(
            envs.place(&[request("t2")])[0],
            Placement::Succeed { .. }
        ));
        // Another service's environment is refused as its full report was; one never reported
        // has nothing to read.
        assert_eq!(
            notices(envs.report_same(1, "a")),
            ["warning: training service batch-queue reported environment a, which belongs to training service ssh-boxes; ignored"]
        );
        assert_eq!(envs.report_same(0, "never"), vec![]);
    }

    #[test]
    fn another_services_environment_is_not_taken_over() {
        let mut envs = environments(1);
        envs.report(0, reported("a", true, inventory("a", 1, None)));
        assert_eq!(
            notices(envs.report(1, reported("a", true, inventory("a", 1, None)))),
            ["warning: training service batch-queue reported environment a, which belongs to training service ssh-boxes; ignored"]
        );
        assert_eq!(envs.owner_of("a"), Some(0));
        assert_eq!(envs.owner_of("b"), None);
    }

    #[test]
    fn an_allocation_on_its_way_is_waited_for_and_a_bad_inventory_refused() {
        let mut envs = environments(1);
        let queued = inventory(
            "job",
            1,
            Some(EnvironmentStatus::Unavailable("Priority".into())),
        );
        assert_eq!(
            notices(envs.report(1, reported("job", false, queued))),
            ["notice: environment job (box) is not ready: Priority; no trial starts there until it is"]
        );
        // Not ready, but trials wait for it rather than the experiment failing.
        assert!(envs.any() && envs.can_place());
        assert_eq!(
            notices(envs.report(1, reported("job", true, inventory("job", 1, None)))),
            ["news: environment job (box) is ready"]
        );
        assert_eq!(
            notices(envs.report(0, reported("odd", true, Value::from(3)))),
            ["notice: environment odd (box): its inventory cannot be read (invalid type: integer `3`, expected struct Environment); no trial runs there", "notice: environment odd (box) is not ready; no trial starts there until it is"]
        );
    }

    /// A host its service never reached has no inventory, only a status saying why: the notice
    /// and the error say it, and trials do not wait for it; once reached, it takes trials.
    #[test]
    fn a_host_never_reached_is_named_with_why_and_not_waited_for() {
        let mut envs = environments(1);
        let why = "root@box:22: cannot connect: connection refused";
        let unreached = json!({"status": EnvironmentStatus::Unavailable(why.into())});
        assert_eq!(
            notices(envs.report(0, reported("ssh", false, unreached.clone()))),
            [format!(
                "notice: environment ssh (box) is not ready: {why}; no trial starts there until it is"
            )]
        );
        assert_eq!(envs.report(0, reported("ssh", false, unreached)), vec![]);
        assert!(!envs.any() && !envs.can_place());
        assert_eq!(
            envs.no_environment_reason(),
            format!("no environment can run trials: ssh (box): {why}")
        );
        assert_eq!(envs.views()[0].why.as_deref(), Some(why));
        assert_eq!(
            notices(envs.report(0, reported("ssh", true, inventory("ssh", 1, None)))),
            ["news: environment ssh (box) is ready"]
        );
        assert!(envs.can_place());
    }

    /// A host never reached that its service still tries (`"retrying": true` beside its
    /// status: an sshd not up yet) is waited for, with its reason, though nothing about it is
    /// in the scheduler: the experiment ended in ERROR at once while the service still tried.
    /// Once its service gives up (the status alone again), it is not, and the error says why.
    #[test]
    fn a_host_never_reached_but_still_tried_is_waited_for_until_its_service_gives_up() {
        let mut envs = environments(1);
        let why = "root@box:22: cannot connect: connection refused; knob keeps trying it";
        let retrying =
            json!({"status": EnvironmentStatus::Unavailable(why.into()), "retrying": true});
        assert_eq!(
            notices(envs.report(0, reported("ssh", false, retrying.clone()))),
            [format!(
                "notice: environment ssh (box) is not ready: {why}; no trial starts there until it is"
            )]
        );
        assert_eq!(envs.report(0, reported("ssh", false, retrying)), vec![]);
        assert!(envs.any() && !envs.can_place());
        assert_eq!(
            envs.unreached().as_deref(),
            Some(format!("waiting for ssh (box), not reached yet: {why}").as_str())
        );
        let gave_up = "root@box:22: cannot connect: connection refused; knob no longer tries this host in this run";
        let given_up = json!({"status": EnvironmentStatus::Unavailable(gave_up.into())});
        assert_eq!(
            notices(envs.report(0, reported("ssh", false, given_up))),
            [format!(
                "notice: environment ssh (box) is not ready: {gave_up}"
            )]
        );
        assert!(!envs.any() && envs.unreached().is_none());
        assert_eq!(
            envs.no_environment_reason(),
            format!("no environment can run trials: ssh (box): {gave_up}")
        );
        // Reached after all (a report with its inventory), it takes trials and is not
        // "not reached" any more.
        envs.report(0, reported("ssh", true, inventory("ssh", 1, None)));
        assert!(envs.can_place() && envs.unreached().is_none());
    }

    #[test]
    fn a_retired_allocation_is_not_waited_for_and_its_replacement_is() {
        let mut envs = environments(1);
        let retired = |id: &str| inventory(id, 1, Some(EnvironmentStatus::Draining));
        envs.report(1, reported("env1", true, inventory("env1", 1, None)));
        assert_eq!(
            notices(envs.report(1, reported("env1", false, retired("env1")))),
            ["news: environment env1 (box) is retired: it takes no new trials"]
        );
        // Said once, and trials do not wait for it.
        assert_eq!(
            envs.report(1, reported("env1", false, retired("env1"))),
            vec![]
        );
        assert!(!envs.can_place());
        // The allocation that replaces it is waited for; once it ended without ever being
        // ready (its job failed), nothing is.
        let queued = inventory(
            "env2",
            1,
            Some(EnvironmentStatus::Unavailable("Priority".into())),
        );
        envs.report(1, reported("env2", false, queued));
        assert!(envs.can_place());
        assert_eq!(
            notices(envs.report(1, reported("env2", false, retired("env2")))),
            ["news: environment env2 (box) is retired: it takes no new trials"]
        );
        assert!(!envs.can_place());
        assert_eq!(
            envs.no_environment_reason(),
            "no environment can run trials: env1 (box), env2 (box)"
        );
    }

    /// A lost host its service still tries (reported `Unavailable` with its inventory) is
    /// waited for: the experiment on one lab server ended in ERROR seconds after
    /// `hostLossTimeout` while the server rebooted. Reported by its status alone (its service
    /// gave up on it), it is forgotten.
    #[test]
    fn a_lost_host_still_tried_is_waited_for_and_one_given_up_forgotten() {
        let mut envs = environments(1);
        let request = OwnRequest {
            trial_id: "t1".into(),
            memory_mib: None,
            gpu_memory_mib: None,
        };
        envs.report(0, reported("a", true, inventory("a", 1, None)));
        let trying = inventory(
            "a",
            1,
            Some(EnvironmentStatus::Unavailable("reconnecting".into())),
        );
        envs.report(0, reported("a", false, trying.clone()));
        assert!(envs.lose("a", "host rebooted").is_some());
        assert!(envs.any() && envs.can_place());
        assert!(matches!(
            envs.place(std::slice::from_ref(&request))[0],
            Placement::TmpNoAvailableGpu { .. }
        ));
        assert_eq!(envs.report(0, reported("a", false, trying)), vec![]);
        assert!(envs.can_place());
        assert_eq!(
            notices(envs.report(0, reported("a", true, inventory("a", 1, None)))),
            ["news: environment a (box) is ready again"]
        );
        assert!(matches!(
            envs.place(std::slice::from_ref(&request))[0],
            Placement::Succeed { .. }
        ));
        // Given up: its status alone, and nothing waits for it.
        let given_up = json!({"status": EnvironmentStatus::Unavailable("lost: host rebooted; knob no longer tries it".into())});
        envs.report(0, reported("a", false, given_up));
        assert!(!envs.any() && !envs.can_place());
    }

    #[test]
    fn a_lost_host_is_forgotten_once_and_the_error_says_why() {
        let mut envs = environments(1);
        assert_eq!(
            envs.no_environment_reason(),
            "no training service reported an environment"
        );
        envs.report(0, reported("a", true, inventory("a", 1, None)));
        let gone = inventory("a", 1, Some(EnvironmentStatus::Unavailable("gone".into())));
        envs.report(0, reported("a", false, gone));
        assert_eq!(
            envs.lose("a", "host rebooted").as_deref(),
            Some("environment a lost: host rebooted")
        );
        assert_eq!(envs.lose("a", "host rebooted"), None);
        assert_eq!(envs.lose("never", "x"), None);
        // Its status alone: its service no longer tries it.
        let given_up = json!({"status": EnvironmentStatus::Unavailable("gone".into())});
        assert_eq!(envs.report(0, reported("a", false, given_up)), vec![]);
        assert!(!envs.any() && !envs.can_place());
        // Its service's new reason while it stays down is kept, not said again: the loss was.
        let still_gone = |why: &str| {
            let status = EnvironmentStatus::Unavailable(why.into());
            reported("a", false, inventory("a", 1, Some(status)))
        };
        assert_eq!(envs.report(0, still_gone("lost: host rebooted")), vec![]);
        assert_eq!(envs.views()[0].why.as_deref(), Some("lost: host rebooted"));
        for n in 0..20 {
            envs.problem(format!("problem {n}"));
        }
        assert_eq!(
            envs.no_environment_reason(),
            "no environment can run trials: a (box): lost: host rebooted — problem 17; problem 18; problem 19"
        );
        // Back, then down again: said again.
        assert_eq!(
            notices(envs.report(0, reported("a", true, inventory("a", 1, None)))),
            ["news: environment a (box) is ready again"]
        );
        envs.report(0, still_gone("gone"));
        assert_eq!(
            notices(envs.report(0, still_gone("gone again"))),
            ["notice: environment a (box) is not ready: gone again"]
        );
    }

    #[test]
    fn a_trial_that_fits_nowhere_is_refused_by_check() {
        let mut envs = environments(4);
        envs.report(0, reported("a", true, inventory("a", 2, None)));
        assert!(envs.check().is_err());
    }
}
