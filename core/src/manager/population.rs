//! Population-based training on the manager's side (issue 15): members a tuner hands out
//! (`Generated::Member`) are recorded with their lineage, started from their parent's checkpoint,
//! stopped when the tuner asks, and their checkpoint folders are deleted once no living member
//! can need them.
//!
//! The checkpoint protocol (what a trial sees; see `training-services`' `trial_python`):
//! `KNOB_CHECKPOINT_DIR` is the trial's own folder (`<trial folder>/checkpoint`, shared by its
//! attempts); a member started from another one's checkpoint also gets `KNOB_RESTORE_FROM`, that
//! member's folder. The manager sends the parent's trial id as `KNOB_RESTORE_TRIAL`, and the
//! service's runner turns it into the path on the host that runs the trial.
//!
//! The parent keeps running and keeps overwriting its folder, so when its folder is on this
//! machine the manager copies it, as the successor is created, to the successor's `restore/`
//! folder (`<trial folder>/restore`), which the runner then names in `KNOB_RESTORE_FROM`: the
//! successor starts from the parent's state at the exploitation (or a step or two later: the
//! time the bottom member takes to stop), not from wherever the parent has got to when the
//! successor starts, which had been its final state when the members ran fast. Every attempt
//! of the successor starts from that copy (a retry too); it is deleted once the successor ended
//! for good (`drop_snapshot`), here and by every service. When the parent's folder is not on this machine, the
//! service that ran the parent is asked to take the copy where the folder is
//! (`TrainingService::snapshot_checkpoint`, a `ServiceRequest` of plugin ABI 1.5), and its
//! runner names that copy wherever the successor starts; a successor placed under another
//! service than its parent's waits while that service brings the copy here
//! (`bring_parent_snapshot`, `TrainingService::fetch_snapshot`).

use knob_plugin_api::population::{Lineage as TunerLineage, Stop};

use super::{Manager, ManagerError};
use crate::store::{Lineage, TrialStatus};

/// The parent's trial id, for the runner (`training-services`' `trial_python::RESTORE_TRIAL_ENV`).
pub(super) const RESTORE_TRIAL_ENV: &str = "KNOB_RESTORE_TRIAL";

/// The folder a trial's checkpoints go to, as the runner makes it for a trial of this machine.
fn checkpoint_dir(experiment_dir: &std::path::Path, trial_id: &str) -> std::path::PathBuf {
    experiment_dir
        .join("trials")
        .join(trial_id)
        .join("checkpoint")
}

/// The frozen copy of the parent's checkpoint folder a successor starts from; the runner's
/// `trial_python::restore_dir` prefers it to the parent's folder. Written as `restore.partial`,
/// then renamed.
fn snapshot_dir(experiment_dir: &std::path::Path, trial_id: &str) -> std::path::PathBuf {
    experiment_dir.join("trials").join(trial_id).join("restore")
}

/// Copies the folder `from` to `to` (files and folders; a link is copied as what it points to).
fn copy_tree(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if std::fs::metadata(entry.path())?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Which of `members` (id, status, lineage) have a checkpoint no living member can need: those
/// that ended EARLY_STOPPED or FAILED and that no member not ended starts from.
fn unneeded_checkpoints<'a>(
    members: impl Iterator<Item = (&'a str, TrialStatus, &'a Lineage)> + Clone,
) -> Vec<String> {
    let needed: std::collections::HashSet<&str> = members
        .clone()
        .filter(|(_, status, _)| !status.is_final())
        .filter_map(|(_, _, lineage)| lineage.parent.as_deref())
        .collect();
    members
        .filter(|(_, status, _)| matches!(status, TrialStatus::EarlyStopped | TrialStatus::Failed))
        .filter(|(id, _, _)| !needed.contains(id))
        .map(|(id, _, _)| id.to_string())
        .collect()
}

/// Whether a member the tuner replaced has ended on its own before the tuner's stop reached it
/// (a stop that reaches a running member ends it EARLY_STOPPED, whatever it then exits with).
fn ended_before_its_stop(status: TrialStatus) -> bool {
    status.is_final() && status != TrialStatus::EarlyStopped
}

impl Manager {
    /// The tuner names members by parameter id; the store and the trials by trial id.
    pub(super) fn member_lineage(&self, lineage: TunerLineage) -> Lineage {
        let trial_of = |id: Option<u64>| {
            id.and_then(|id| self.book.trial_of_parameter(id).map(str::to_string))
        };
        Lineage {
            parent: trial_of(lineage.parent),
            replaces: trial_of(lineage.replaces),
            parent_step: lineage.parent_step,
        }
    }

    /// Whether a successor the tuner handed out for `parameter_id` is still wanted. Not when the
    /// member it replaces has already ended other than by the tuner's stop: its end (it finished,
    /// or failed) reached the manager before the stop did, so the stop found nothing to stop and
    /// the successor would be a member more than the population holds. The tuner, which had not
    /// yet heard of that end, is told the successor ended SYS_CANCELED (as for any handout not
    /// run), and the replaced member's log says why no successor followed it.
    pub(super) async fn successor_still_wanted(
        &mut self,
        parameter_id: u64,
        lineage: &Lineage,
    ) -> Result<bool, ManagerError> {
        let Some((replaced, status)) = lineage
            .replaces
            .as_deref()
            .and_then(|id| self.book.get(id))
            .filter(|t| ended_before_its_stop(t.status))
            .map(|t| (t.id.clone(), t.status))
        else {
            return Ok(true);
        };
        self.tuner.tell_dropped(parameter_id);
        self.warn(
            Some(replaced),
            format!(
                "{} replaced this member by a successor (parameter id {parameter_id}), but it had ended {} before the stop reached it; the successor is not created",
                self.tuner.label(),
                status.as_str()
            ),
        )
        .await?;
        Ok(false)
    }

    /// The tuner asked to stop a member: it ends EARLY_STOPPED with the tuner's reason. A
    /// request for a trial that is no member, or has ended, is ignored with a warning.
    pub(super) async fn stop_member(&mut self, stop: Stop) -> Result<(), ManagerError> {
        let Some(trial_id) = self
            .book
            .trial_of_parameter(stop.parameter_id)
            .map(str::to_string)
        else {
            return self
                .warn(
                    None,
                    format!(
                        "{} asked to stop parameter id {}, which no trial has; ignored",
                        self.tuner.label(),
                        stop.parameter_id
                    ),
                )
                .await;
        };
        let trial = &self.book[&trial_id];
        if trial.lineage.is_none() {
            let label = self.tuner.label().to_owned();
            return self
                .warn(
                    Some(trial_id),
                    format!("{label} asked to stop a trial that is no population member; ignored"),
                )
                .await;
        }
        if trial.status.is_final() {
            return Ok(());
        }
        // A member is stopped to be replaced. With `maxTrialNumber` spent and no id owed, no
        // successor can ever come: stopping it would shrink the population and throw its
        // training away (its final result too), under an end message saying it was replaced.
        if self.book.budget_left(self.config.max_trial_number) == 0 && self.tuner.in_flight() == 0 {
            let label = self.tuner.label().to_owned();
            return self
                .warn(
                    Some(trial_id),
                    format!("{label} asked to replace this member, but maxTrialNumber leaves no trial for its successor; it runs on"),
                )
                .await;
        }
        self.kill(&trial_id, TrialStatus::EarlyStopped, stop.reason)
            .await
    }

    /// A successor `trial_id` is being created from `parent`: copies the parent's checkpoint
    /// folder, if it is on this machine, to the successor's `restore/` folder; else asks the
    /// service that ran the parent to copy it where it is (`snapshot_parent_elsewhere`). A
    /// failed copy is a warning, and the successor then starts from the parent's folder as it
    /// is when it starts. Returns the service asked to copy it, if one was.
    pub(super) async fn snapshot_parent_checkpoint(
        &mut self,
        trial_id: &str,
        parent: &str,
    ) -> Result<Option<usize>, ManagerError> {
        let from = checkpoint_dir(&self.dir, parent);
        let to = snapshot_dir(&self.dir, trial_id);
        if !from.is_dir() {
            return Ok(self.snapshot_parent_elsewhere(trial_id, parent));
        }
        let copied = tokio::task::spawn_blocking({
            let (from, to) = (from.clone(), to.clone());
            move || {
                // Copied under another name, then renamed: a manager killed mid-copy leaves no
                // partial `restore/` for the runner to name (the successor then starts from the
                // parent's folder).
                let partial = to.with_extension("partial");
                let _ = std::fs::remove_dir_all(&partial);
                copy_tree(&from, &partial)
                    .and_then(|()| std::fs::rename(&partial, &to))
                    .inspect_err(|_| {
                        let _ = std::fs::remove_dir_all(&partial);
                    })
            }
        })
        .await;
        let error = match copied {
            Ok(Ok(())) => return Ok(None),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        self.warn(
            Some(trial_id.to_string()),
            format!(
                "cannot copy the checkpoint folder {} it starts from to {}: {error}; it starts from the folder as it is then",
                from.display(),
                to.display()
            ),
        )
        .await?;
        Ok(None)
    }

    /// The parent's checkpoint folder is not on this machine (its trials write to a file system
    /// of their own): the service that ran the parent is asked to copy it now, where it is, for
    /// the successor (`TrainingService::snapshot_checkpoint`, plugin ABI 1.5). Asked now, not
    /// when the successor starts: a successor that waits for a place would otherwise start from
    /// whatever the parent has trained to by then (Ray Tune's "restores the wrong weights",
    /// ray#28509). A service that takes no copy (built before, or not supported) leaves the
    /// successor to start from the parent's folder as it is then, which the experiment's log
    /// says once. Returns the service asked.
    fn snapshot_parent_elsewhere(&self, trial_id: &str, parent: &str) -> Option<usize> {
        let index = self.book.get(parent).and_then(|t| t.service)?;
        let slot = self.services.get(index)?;
        let reply = slot
            .handle
            .snapshot_checkpoint(trial_id.to_string(), parent.to_string());
        let told = self.snapshots_unsupported_told.clone();
        let (name, parent) = (slot.platform.clone(), parent.to_string());
        // Not waited for (`warn_when_answered`): the successor's start, asked of this service
        // or (`bring_parent_snapshot`) a fetch of the copy asked of it, comes after it anyway.
        self.warn_when_answered(reply, Some(trial_id.to_string()), move |answer| match answer {
            Ok(true) => None,
            Ok(false) => (!told.swap(true, std::sync::atomic::Ordering::Relaxed)).then(|| format!(
                "training service {name} takes no copy of a parent's checkpoint as its successor is created; successors start from their parent's checkpoint as it is when they start"
            )),
            Err(e) => Some(format!(
                "cannot copy the checkpoint of {parent} it starts from: {e}; it starts from that checkpoint as it is then"
            )),
        });
        Some(index)
    }

    /// Successor `trial_id` is about to start under service `service`. Where its parent ran
    /// under another service and the parent's folder is not on this machine (that service's
    /// trials write to a file system of their own, and it took the copy as the successor was
    /// created), that service brings the copy to the successor's `restore/` here first
    /// (`TrainingService::fetch_snapshot`): the successor's own service then finds it, as it
    /// finds a copy the manager made. The start must not overtake it, but the loop does not
    /// wait for it either (a checkpoint of gigabytes takes minutes over SSH, and every other
    /// trial's events, the user's commands and the deadlines would wait): the trial keeps its
    /// placement and is handed to its service when the answer comes
    /// ([`Manager::on_parent_snapshot_fetched`]); returns true then. A service that answers
    /// with an error (it could not tell: a host not connected) is asked again later, the
    /// successor waiting as a start not made, up to [`FETCH_RETRIES`] times; a service that does
    /// not have it, or still fails then, is told in one line, and the successor starts without
    /// its parent's checkpoint.
    ///
    /// The service asked is the one that took the copy (`Trial::snapshot_holder`), not the
    /// one the parent runs under now: a parent whose host was lost since runs elsewhere, and
    /// the copy stayed where it was taken. A successor created before a resume does not know
    /// it: every other service is asked, one after the other (two asked at once could both
    /// write the copy) and silently (the successor's own service may have it).
    pub(super) async fn bring_parent_snapshot(
        &mut self,
        trial_id: &str,
        service: usize,
        environment: &str,
        gpu_indices: &Option<Vec<u32>>,
    ) -> Result<bool, ManagerError> {
        let trial = &self.book[trial_id];
        let Some(parent) = trial.lineage.as_ref().and_then(|l| l.parent.clone()) else {
            return Ok(false);
        };
        let known = trial.snapshot_holder;
        let mut holders: Vec<usize> = match known {
            Some(holder) if holder == service => return Ok(false),
            Some(holder) => vec![holder],
            None => (0..self.services.len()).filter(|i| *i != service).collect(),
        };
        // A parent's folder here was copied here; an earlier attempt's copy is here already.
        if holders.is_empty()
            || checkpoint_dir(&self.dir, &parent).is_dir()
            || snapshot_dir(&self.dir, trial_id).is_dir()
        {
            return Ok(false);
        }
        let asked = holders.remove(0);
        self.book.known(trial_id).fetching = true;
        self.ask_for_parent_snapshot(FetchAsked {
            trial_id: trial_id.to_string(),
            parent,
            asked,
            left: holders,
            failures: Vec::new(),
            known: known.is_some(),
            service,
            environment: environment.to_string(),
            gpu_indices: gpu_indices.clone(),
        });
        Ok(true)
    }

    /// Asks service `ask.asked` to bring the parent's checkpoint here; its answer comes to the
    /// loop as [`Fetched`].
    fn ask_for_parent_snapshot(&self, ask: FetchAsked) {
        let reply = self.services[ask.asked].handle.fetch_snapshot(
            ask.trial_id.clone(),
            ask.parent.clone(),
            snapshot_dir(&self.dir, &ask.trial_id),
        );
        let fetched = self.fetched_tx.clone();
        tokio::spawn(async move {
            let brought = reply.get().await;
            let _ = fetched.send(Fetched { ask, brought });
        });
    }

    /// The answer of a service asked to bring a successor's parent checkpoint here
    /// ([`Manager::bring_parent_snapshot`]). A trial that ended meanwhile (killed, the
    /// experiment stopped) is left as it is; one whose placement went meanwhile (its host was
    /// lost) is placed again; a service that did not bring it, where others are left to ask,
    /// is followed by the next; any other trial is handed to its service.
    pub(super) async fn on_parent_snapshot_fetched(
        &mut self,
        fetched: Fetched,
    ) -> Result<(), ManagerError> {
        let Fetched { mut ask, brought } = fetched;
        let trial_id = ask.trial_id.clone();
        let Some(trial) = self.book.get_mut(&trial_id) else {
            return Ok(());
        };
        if !trial.fetching || trial.status != TrialStatus::Waiting {
            return Ok(());
        }
        let still_placed = self.environments.owner_of(&ask.environment) == Some(ask.service)
            && self.environments.assigned_environment(&trial_id) == Some(ask.environment.as_str());
        if !still_placed {
            self.book.known(&trial_id).fetching = false;
            self.environments.release(&trial_id);
            self.book.unlaunch(&trial_id);
            return Ok(());
        }
        let brought_here = matches!(brought, Ok(true));
        if let Err(e) = &brought {
            let asked = &self.services[ask.asked].platform;
            ask.failures.push(format!("training service {asked}: {e}"));
        }
        if !brought_here && !ask.left.is_empty() {
            ask.asked = ask.left.remove(0);
            self.ask_for_parent_snapshot(ask);
            return Ok(());
        }
        self.book.known(&trial_id).fetching = false;
        if !brought_here && !ask.failures.is_empty() {
            // A service that could not tell (its host not connected yet, as at a resume, or
            // lost a moment) may hold the copy: started now, the successor trained from
            // scratch under a lineage naming its parent, its restore folder missing and
            // nothing said. It waits and is asked again, as a start that was not made.
            let trial = self.book.known(&trial_id);
            trial.fetch_failures += 1;
            let failures = trial.fetch_failures;
            let parent = &ask.parent;
            let why = ask.failures.join("; ");
            if failures <= FETCH_RETRIES && !self.closed_for_retries() {
                let backoff = FETCH_RETRY_BACKOFF * (1 << (failures - 1).min(5));
                self.warn(
                    Some(trial_id.clone()),
                    format!(
                        "the checkpoint of its parent {parent} could not be brought here yet ({why}); asking again in {} s",
                        backoff.as_secs()
                    ),
                )
                .await?;
                self.environments.release(&trial_id);
                self.book
                    .new_attempt(&trial_id, Some(tokio::time::Instant::now() + backoff));
                self.publish(None);
                return Ok(());
            }
            self.warn(
                Some(trial_id.clone()),
                format!(
                    "the checkpoint of its parent {parent} could not be brought here in {failures} tries ({why}); it starts without it, from scratch"
                ),
            )
            .await?;
        } else if !brought_here && ask.known {
            let asked = self.services[ask.asked].platform.clone();
            let asked = match brought {
                Err(e) => format!("{asked} ({e})"),
                Ok(_) => asked,
            };
            let ours = self.services[ask.service].platform.clone();
            let parent = &ask.parent;
            self.warn(
                Some(trial_id.clone()),
                format!(
                    "runs under training service {ours}, but the checkpoint of its parent {parent} is not on this machine and training service {asked} did not bring it here; it starts without it"
                ),
            )
            .await?;
        }
        self.hand_to_service(&trial_id, &ask.environment, ask.gpu_indices, ask.service)
            .await
    }

    /// A successor ended for good (SUCCEEDED, EARLY_STOPPED, or FAILED with no retry left):
    /// the copy of its parent's checkpoint it started from goes, here and wherever a service
    /// took or moved one (`TrainingService::delete_snapshot`). Until then every attempt starts
    /// from that same copy: a retry must not start from the parent's folder as it is by then
    /// (ray#28509). Kept for a member that was cancelled: it runs again after a resume.
    pub(super) fn drop_snapshot(&self, trial_id: &str, status: TrialStatus) {
        let is_successor = self.book[trial_id]
            .lineage
            .as_ref()
            .is_some_and(|l| l.parent.is_some());
        if !is_successor
            || !matches!(
                status,
                TrialStatus::Succeeded | TrialStatus::EarlyStopped | TrialStatus::Failed
            )
        {
            return;
        }
        let dir = snapshot_dir(&self.dir, trial_id);
        let _ = std::fs::remove_dir_all(dir.with_extension("partial"));
        let _ = std::fs::remove_dir_all(dir);
        for index in 0..self.services.len() {
            let reply = self.services[index]
                .handle
                .delete_snapshot(trial_id.to_string());
            // A copy that cannot be deleted costs disk, never the experiment.
            self.warn_if_it_fails(reply, Some(trial_id.to_string()), |e| {
                format!("cannot delete the copy of its parent's checkpoint: {e}")
            });
        }
    }

    /// Deletes the checkpoint folders that no living member can need any more: those of members
    /// that ended EARLY_STOPPED (replaced) or FAILED, once no member that has not ended starts
    /// from them. Kept: a living member's own (it may be cloned, and its next attempt resumes
    /// from it), the parent's of every member not ended, and those of members that SUCCEEDED or
    /// were cancelled (the population's results, and members a stop of the experiment will run
    /// again). The folder on this machine (`<experiment>/trials/<id>/checkpoint`: services whose
    /// trials write to this machine's file system, directly or shared) is deleted here; every
    /// service is then asked to delete the trial's folder wherever it keeps its own
    /// (`TrainingService::delete_checkpoint`, plugin ABI 1.5; a service built before is not
    /// asked, and a host with its own file system then keeps its copy).
    pub(super) async fn collect_checkpoints(&mut self) {
        let members = self
            .book
            .all()
            .filter(|t| !self.collected.contains(&t.id))
            .filter_map(|t| Some((t.id.as_str(), t.status, t.lineage.as_ref()?)));
        let garbage = unneeded_checkpoints(members);
        for trial_id in garbage {
            let dir = checkpoint_dir(&self.dir, &trial_id);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    // A folder that cannot be deleted costs disk, never the experiment.
                    let _ = self
                        .warn(
                            Some(trial_id.clone()),
                            format!("cannot delete checkpoint folder {}: {e}", dir.display()),
                        )
                        .await;
                }
            }
            for index in 0..self.services.len() {
                let reply = self.services[index]
                    .handle
                    .delete_checkpoint(trial_id.clone());
                self.warn_if_it_fails(reply, Some(trial_id.clone()), |e| {
                    format!("cannot delete its checkpoint folder: {e}")
                });
            }
            self.collected.insert(trial_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_successor_is_dropped_only_when_its_member_ended_before_the_stop() {
        let dropped: Vec<TrialStatus> = TrialStatus::ALL
            .into_iter()
            .filter(|s| ended_before_its_stop(*s))
            .collect();
        assert_eq!(
            dropped,
            [
                TrialStatus::Succeeded,
                TrialStatus::Failed,
                TrialStatus::UserCanceled,
                TrialStatus::SysCanceled
            ]
        );
    }

    #[test]
    fn a_checkpoint_is_kept_while_a_member_not_ended_starts_from_it() {
        let from = |parent: &str| Lineage {
            parent: Some(parent.into()),
            ..Lineage::default()
        };
        let first = Lineage::default();
        let (a, b) = (from("stopped-parent"), from("done"));
        let members = [
            // Replaced, but a waiting member starts from it: kept.
            ("stopped-parent", TrialStatus::EarlyStopped, &first),
            ("waiting", TrialStatus::Waiting, &a),
            // Replaced and needed by nobody: deleted; so is a failed one.
            ("replaced", TrialStatus::EarlyStopped, &first),
            ("failed", TrialStatus::Failed, &first),
            // Finished (a result), cancelled (runs again after a stop), running: kept.
            ("done", TrialStatus::Succeeded, &first),
            ("cancelled", TrialStatus::UserCanceled, &first),
            ("running", TrialStatus::Running, &b),
        ];
        assert_eq!(
            unneeded_checkpoints(members.iter().copied()),
            ["replaced", "failed"]
        );
        // Once the member that starts from it has ended, the parent's goes too.
        let mut later = members;
        later[1].1 = TrialStatus::EarlyStopped;
        assert_eq!(
            unneeded_checkpoints(later.iter().copied()),
            ["stopped-parent", "waiting", "replaced", "failed"]
        );
    }
}

/// How many times a successor's start waits for its parent's checkpoint that a service could
/// not bring (an error, not a "none here") before it starts without it; the waits double from
/// [`FETCH_RETRY_BACKOFF`], about a minute in all: a host reconnecting at a resume takes
/// seconds.
const FETCH_RETRIES: u32 = 6;
const FETCH_RETRY_BACKOFF: std::time::Duration = std::time::Duration::from_secs(1);

/// A successor's parent checkpoint asked of a service, with where the successor was placed
/// meanwhile (see [`Manager::bring_parent_snapshot`]).
#[derive(Debug)]
struct FetchAsked {
    trial_id: String,
    parent: String,
    /// The service asked now.
    asked: usize,
    /// The services to ask next if it does not bring it (the parent's holder not known).
    left: Vec<usize>,
    /// The errors of the services asked so far that could not tell whether they hold the
    /// copy (`training service NAME: ERROR`), as opposed to answering that they do not.
    failures: Vec<String>,
    /// Whether `asked` took the copy (a service that does not bring it is then told of).
    known: bool,
    /// The successor's service and placement.
    service: usize,
    environment: String,
    gpu_indices: Option<Vec<u32>>,
}

/// A service's answer to a [`FetchAsked`]: `Ok(true)` when the copy is here.
#[derive(Debug)]
pub(super) struct Fetched {
    ask: FetchAsked,
    brought: Result<bool, knob_plugin_api::host::HostError>,
}
