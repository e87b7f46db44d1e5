//! PBT driven as the manager drives it: members report steps, stopped ones end EARLY_STOPPED,
//! and their ids are asked for again.

use std::collections::BTreeMap;

use knob_plugin_api::population::{read_suggestion, Emitted, Intermediate, Lineage};
use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{Generated, ImportedTrial, Tuner};
use knob_tuners::PbtTuner;
use serde_json::{json, Value};

struct Running {
    parameters: Value,
    lineage: Lineage,
    steps: u64,
    saves_checkpoints: bool,
}

struct Drive {
    tuner: PbtTuner,
    next_id: u64,
    running: BTreeMap<u64, Running>,
    ended: Vec<(u64, Lineage)>,
    stops: Vec<(u64, String)>,
    /// Every member handed out, in order: id, label, parameters, lineage.
    created: Vec<(u64, String, Value, Lineage)>,
    /// Intermediate results per member, in all its attempts.
    reports: BTreeMap<u64, u64>,
    /// `reports` when each of `stops` came.
    reports_at_stops: Vec<BTreeMap<u64, u64>>,
}

fn space() -> SearchSpace {
    SearchSpace::parse(
        r#"{"lr": {"_type": "loguniform", "_value": [0.001, 1]},
            "width": {"_type": "choice", "_value": [16, 32, 64, 128]},
            "layers": {"_type": "randint", "_value": [1, 6]}}"#,
    )
    .unwrap()
}

impl Drive {
    fn new(args: Value) -> Drive {
        let mut tuner = PbtTuner::new(&args).unwrap();
        tuner.update_search_space(&space()).unwrap();
        Drive {
            tuner,
            next_id: 0,
            running: BTreeMap::new(),
            ended: Vec::new(),
            stops: Vec::new(),
            created: Vec::new(),
            reports: BTreeMap::new(),
            reports_at_stops: Vec::new(),
        }
    }

    /// The manager crashed and `knob resume` builds a new tuner with `args` from what the
    /// host imports; the running members run again from their checkpoints, a new attempt
    /// whose results the host numbers from 0.
    fn crash_and_resume(self, args: Value) -> Drive {
        let imported: Vec<ImportedTrial> = self
            .created
            .iter()
            .map(|(id, label, parameters, lineage)| {
                let status = match self.running.contains_key(id) {
                    true => "RUNNING",
                    false => "EARLY_STOPPED",
                };
                ImportedTrial {
                    parameter_id: Some(*id),
                    label: Some(label.clone()),
                    lineage: Some(lineage.clone()),
                    intermediate_results: self.reports.get(id).copied().unwrap_or(0),
                    ..ImportedTrial::without_result(parameters.clone(), status)
                }
            })
            .collect();
        let mut resumed = Drive::new(args);
        resumed.tuner.import_data(&imported).unwrap();
        resumed.next_id = self.next_id;
        resumed.running = self
            .running
            .into_iter()
            .map(|(id, member)| (id, Running { steps: 0, ..member }))
            .collect();
        resumed.ended = self.ended;
        resumed.stops = self.stops;
        resumed.created = self.created;
        resumed.reports = self.reports;
        resumed.reports_at_stops = self.reports_at_stops;
        resumed
    }

    fn ask(&mut self) -> Option<u64> {
        let id = self.next_id;
        self.next_id += 1;
        match self.tuner.generate_parameters(id).unwrap() {
            Generated::Member {
                parameters,
                label,
                lineage,
            } => {
                assert!(label.starts_with('m') && label.ends_with(&format!("-{id}")));
                space().validate_parameters(&parameters).unwrap();
                self.created
                    .push((id, label, parameters.clone(), lineage.clone()));
                self.running.insert(
                    id,
                    Running {
                        parameters,
                        lineage,
                        steps: 0,
                        saves_checkpoints: true,
                    },
                );
                Some(id)
            }
            Generated::Deferred => None,
            other => panic!("expected a member, got {other:?}"),
        }
    }

    /// One step of every running member; `score` gives each member's result.
    fn step(&mut self, score: impl Fn(&Value, u64) -> f64) {
        let ids: Vec<u64> = self.running.keys().copied().collect();
        for id in ids {
            let Some(member) = self.running.get_mut(&id) else {
                continue;
            };
            let value = score(&member.parameters, member.steps);
            let intermediate = Intermediate {
                step: member.steps,
                checkpoint: member.saves_checkpoints,
            };
            member.steps += 1;
            *self.reports.entry(id).or_default() += 1;
            self.tuner
                .receive_intermediate_result(id, intermediate, value)
                .unwrap();
            self.take();
        }
    }

    /// Acts on what the tuner emitted, as the manager does: stops end the member (and its id
    /// is asked for again), members start.
    fn take(&mut self) {
        for emitted in self.tuner.take_suggestions().unwrap() {
            match read_suggestion(emitted) {
                Emitted::Stop(stop) => {
                    let stopped = self.running.remove(&stop.parameter_id).expect("running");
                    self.ended.push((stop.parameter_id, stopped.lineage));
                    self.stops.push((stop.parameter_id, stop.reason));
                    self.reports_at_stops.push(self.reports.clone());
                    self.tuner
                        .trial_end(stop.parameter_id, "EARLY_STOPPED")
                        .unwrap();
                    self.take();
                    // The successor comes now, or came already for an id deferred earlier.
                    self.ask();
                }
                Emitted::Member {
                    parameter_id,
                    parameters,
                    label,
                    lineage,
                } => {
                    space().validate_parameters(&parameters).unwrap();
                    self.created
                        .push((parameter_id, label, parameters.clone(), lineage.clone()));
                    self.running.insert(
                        parameter_id,
                        Running {
                            parameters,
                            lineage,
                            steps: 0,
                            saves_checkpoints: true,
                        },
                    );
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

#[test]
fn bottom_members_are_replaced_by_clones_of_top_members_at_their_interval() {
    let mut drive =
        Drive::new(json!({"population_size": 8, "perturbation_interval": 4, "seed": 3}));
    for _ in 0..8 {
        assert!(drive.ask().is_some());
    }
    assert_eq!(drive.ask(), None, "the population is complete: deferred");
    let score = |p: &Value, _step: u64| -(p["lr"].as_f64().unwrap().ln() - 0.1f64.ln()).abs();
    for _ in 0..3 {
        drive.step(score);
    }
    assert!(
        drive.stops.is_empty(),
        "nobody is judged before its interval"
    );
    for _ in 0..37 {
        drive.step(score);
    }
    assert_eq!(drive.running.len(), 8, "the population keeps its size");
    assert!(!drive.stops.is_empty());
    for (id, reason) in &drive.stops {
        assert!(
            reason.starts_with("PBT: bottom 25% at step "),
            "{id}: {reason}"
        );
    }
    // Every successor names its parent and the member it replaced, and the parent had saved.
    let successors: Vec<&Lineage> = drive
        .running
        .values()
        .map(|r| &r.lineage)
        .chain(drive.ended.iter().map(|(_, l)| l))
        .filter(|l| l.parent.is_some())
        .collect();
    assert_eq!(successors.len(), drive.stops.len());
    let replaced: Vec<u64> = drive.stops.iter().map(|(id, _)| *id).collect();
    for lineage in successors {
        assert!(replaced.contains(&lineage.replaces.unwrap()));
        assert_ne!(lineage.parent, lineage.replaces);
        assert!(lineage.parent_step.unwrap() >= 4);
    }
}

#[test]
fn a_member_without_a_checkpoint_is_never_cloned() {
    let mut drive =
        Drive::new(json!({"population_size": 4, "perturbation_interval": 2, "seed": 1}));
    for _ in 0..4 {
        drive.ask();
    }
    for member in drive.running.values_mut() {
        member.saves_checkpoints = false;
    }
    let score = |p: &Value, _| p["lr"].as_f64().unwrap();
    for _ in 0..20 {
        drive.step(score);
    }
    assert!(drive.stops.is_empty(), "{:?}", drive.stops);
}

/// Once every member has ended, PBT owes nothing for the ids it deferred and says so (NoMore
/// for each, and for any id asked for later), so the experiment ends as one whose tuner ran out:
/// it ended with a warning that the tuner deferred parameters and gave none (hunt H3 F2).
#[test]
fn a_population_whose_members_all_ended_answers_its_deferred_ids_no_more() {
    for synch in [false, true] {
        let mut drive = Drive::new(
            json!({"population_size": 2, "perturbation_interval": 4, "synch": synch, "seed": 2}),
        );
        let (first, second) = (drive.ask().unwrap(), drive.ask().unwrap());
        assert_eq!(drive.ask(), None, "the population is complete: deferred");
        drive.step(|p: &Value, _| p["lr"].as_f64().unwrap());

        drive.tuner.trial_end(first, "SUCCEEDED").unwrap();
        assert_eq!(
            drive.tuner.take_suggestions().unwrap(),
            vec![],
            "{second} still runs"
        );
        assert_eq!(
            drive.ask(),
            None,
            "{second} may still be replaced: deferred"
        );
        drive.tuner.trial_end(second, "SUCCEEDED").unwrap();
        let owed: Vec<Emitted> = drive
            .tuner
            .take_suggestions()
            .unwrap()
            .into_iter()
            .map(read_suggestion)
            .collect();
        assert_eq!(
            owed,
            vec![
                Emitted::NoMore { parameter_id: 2 },
                Emitted::NoMore { parameter_id: 3 }
            ],
            "synch: {synch}"
        );
        assert_eq!(
            drive.tuner.generate_parameters(drive.next_id).unwrap(),
            Generated::NoMore
        );
    }
}

/// With `max_steps`, a member at its last step is not judged (a stop would come before its final
/// result and lose it), and is no donor (its successor would run no step and report the
/// parent's result as its own); without it, both happened (hunt H3 F5).
#[test]
fn a_member_at_max_steps_is_neither_replaced_nor_cloned() {
    let report = |tuner: &mut PbtTuner, id: u64, step: u64, value: f64| {
        let intermediate = Intermediate {
            step,
            checkpoint: true,
        };
        tuner
            .receive_intermediate_result(id, intermediate, value)
            .unwrap();
        tuner.take_suggestions().unwrap()
    };
    let args = |max_steps: Value| {
        json!({"population_size": 2, "perturbation_interval": 2, "quantile_fraction": 0.5,
               "max_steps": max_steps, "seed": 4})
    };
    // Judged at its last step: stopped without max_steps, left to finish with it.
    for (max_steps, stopped) in [(Value::Null, true), (json!(2), false)] {
        let mut drive = Drive::new(args(max_steps.clone()));
        let (good, bad) = (drive.ask().unwrap(), drive.ask().unwrap());
        for step in 0..2 {
            report(&mut drive.tuner, good, step, 1.0);
        }
        report(&mut drive.tuner, bad, 0, 0.0);
        let emitted = report(&mut drive.tuner, bad, 1, 0.0);
        let stops = emitted
            .into_iter()
            .filter(|e| matches!(read_suggestion(e.clone()), Emitted::Stop(_)))
            .count();
        assert_eq!(stops, usize::from(stopped), "max_steps {max_steps}");
    }
    // A bottom member judged before its end, whose only top member reached max_steps: not
    // replaced by a successor with no step left.
    let mut drive = Drive::new(args(json!(4)));
    let (done, bad) = (drive.ask().unwrap(), drive.ask().unwrap());
    for step in 0..4 {
        report(&mut drive.tuner, done, step, 1.0);
    }
    report(&mut drive.tuner, bad, 0, 0.0);
    assert_eq!(report(&mut drive.tuner, bad, 1, 0.0), vec![]);
}

#[test]
fn synchronous_mode_judges_only_when_every_member_reached_the_interval() {
    let mut drive = Drive::new(
        json!({"population_size": 4, "perturbation_interval": 3, "synch": true, "seed": 5}),
    );
    for _ in 0..4 {
        drive.ask();
    }
    let score = |p: &Value, _| p["lr"].as_f64().unwrap();
    // Members 0..3 report three steps each, one after the other: the last one completes the
    // barrier, and only then is the bottom member (of 4, one) replaced.
    drive.step(score);
    drive.step(score);
    assert!(drive.stops.is_empty());
    drive.step(score);
    assert_eq!(drive.stops.len(), 1, "{:?}", drive.stops);
}

/// A member of a resumed population, as the host imports it.
fn imported_member(id: u64, slot: u64, status: &str) -> ImportedTrial {
    ImportedTrial {
        parameter_id: Some(id),
        label: Some(format!("m{slot}-{id}")),
        status: Some(status.into()),
        ..ImportedTrial::new(
            json!({"lr": 0.01 * (id + 1) as f64, "width": 32, "layers": 2}),
            f64::NAN,
        )
    }
}

/// Member `id` reports its first step with a checkpoint and this score: a donor from now on.
fn report_checkpoint(tuner: &mut PbtTuner, id: u64, score: f64) {
    let first_step = Intermediate {
        step: 0,
        checkpoint: true,
    };
    tuner
        .receive_intermediate_result(id, first_step, score)
        .unwrap();
}

/// A population of 3 resumed after a crash, from these members in the order they were created.
fn resumed(members: &[ImportedTrial]) -> PbtTuner {
    let mut tuner =
        PbtTuner::new(&json!({"population_size": 3, "perturbation_interval": 1, "seed": 2}))
            .unwrap();
    tuner.update_search_space(&space()).unwrap();
    tuner.import_data(members).unwrap();
    tuner
}

/// Slot 1's member was stopped, and the manager died before its successor was created;
/// members 0 and 2 run again.
fn resumed_with_slot_1_empty() -> PbtTuner {
    resumed(&[
        imported_member(0, 0, "RUNNING"),
        imported_member(1, 1, "EARLY_STOPPED"),
        imported_member(2, 2, "RUNNING"),
    ])
}

/// A slot's last member is the one created last, which may have a lower id than the member it
/// replaced (a successor handed to an id deferred earlier): the slot is whole, not vacant.
#[test]
fn a_resumed_slot_whose_successor_has_a_lower_id_than_its_predecessor_is_not_filled_again() {
    // Slot 2's member 5 was replaced by id 4, deferred before.
    let mut tuner = resumed(&[
        imported_member(0, 0, "RUNNING"),
        imported_member(1, 1, "RUNNING"),
        imported_member(2, 2, "EARLY_STOPPED"),
        imported_member(5, 2, "EARLY_STOPPED"),
        imported_member(4, 2, "RUNNING"),
    ]);
    // A donor is known, so a vacant slot would be filled by the next id.
    report_checkpoint(&mut tuner, 1, 0.9);
    assert_eq!(tuner.generate_parameters(6).unwrap(), Generated::Deferred);
}

#[test]
fn a_resumed_population_fills_a_slot_left_empty_by_a_crash() {
    let mut tuner = resumed_with_slot_1_empty();
    assert_eq!(tuner.generate_parameters(3).unwrap(), Generated::Deferred);
    let intermediate = |step| Intermediate {
        step,
        checkpoint: true,
    };
    tuner
        .receive_intermediate_result(0, intermediate(0), 0.1)
        .unwrap();
    tuner
        .receive_intermediate_result(2, intermediate(0), 0.9)
        .unwrap();
    let emitted: Vec<Emitted> = tuner
        .take_suggestions()
        .unwrap()
        .into_iter()
        .map(read_suggestion)
        .collect();
    let member = emitted
        .iter()
        .find_map(|e| match e {
            Emitted::Member {
                parameter_id: 3,
                label,
                lineage,
                ..
            } => Some((label, lineage)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("slot 1 is filled through id 3: {emitted:?}"));
    assert_eq!(member.0, "m1-3");
    assert_eq!(member.1.replaces, Some(1));
    assert_eq!(member.1.parent, Some(2), "the top member with a checkpoint");
}

/// The same slot, when a donor is known before the host asks for an id: the id fills the slot
/// at once. Waiting for a top member's next report lost the slot when exploitations' own
/// successors took every free place first (`cli`'s kill-and-resume PBT test, now and then).
#[test]
fn a_resumed_population_fills_an_empty_slot_with_the_next_id_once_a_donor_is_known() {
    let mut tuner = resumed_with_slot_1_empty();
    // A donor reports (a checkpoint, a score) while no id is waiting.
    report_checkpoint(&mut tuner, 2, 0.9);
    match tuner.generate_parameters(3).unwrap() {
        Generated::Member { label, lineage, .. } => {
            assert_eq!(label, "m1-3");
            assert_eq!(lineage.replaces, Some(1));
            assert_eq!(lineage.parent, Some(2));
        }
        other => panic!("slot 1 is filled through id 3, got {other:?}"),
    }
    // The population is whole again: the next id waits.
    assert_eq!(tuner.generate_parameters(4).unwrap(), Generated::Deferred);
}

#[test]
fn bad_class_args_are_one_line_errors() {
    let error = |args: Value| PbtTuner::new(&args).unwrap_err().to_string();
    assert_eq!(
        error(json!({"quantile_fraction": 0.7})),
        "classArgs of PBT: quantile_fraction must be a number from 0 to 0.5, got 0.7"
    );
    assert_eq!(
        error(json!({"perturbation_factors": [1.2, -1]})),
        "classArgs of PBT: perturbation_factors must be a list of numbers above 0, such as [1.2, 0.8], got [1.2,-1]"
    );
    assert!(error(json!({"all_checkpoint_dir": "/x"})).contains("write name: PBTTuner"));
    assert!(error(json!({"population": 8})).contains("unknown argument \"population\""));
    assert_eq!(
        error(json!({"synch": "yes"})),
        "classArgs of PBT: synch must be true or false, got \"yes\""
    );
}

/// A successor waits in the tuner until an id is asked for; if its donor is replaced
/// meanwhile, the host deletes the donor's checkpoint when it ends (no member it knows of
/// starts from it), so the successor is handed out with another donor: the best living member
/// with a checkpoint.
#[test]
fn a_successor_whose_donor_was_replaced_while_it_waited_gets_another_donor() {
    let mut tuner =
        PbtTuner::new(&json!({"population_size": 4, "perturbation_interval": 1, "seed": 5}))
            .unwrap();
    tuner.update_search_space(&space()).unwrap();
    for id in 0..4 {
        assert!(matches!(
            tuner.generate_parameters(id).unwrap(),
            Generated::Member { .. }
        ));
    }
    let report = |tuner: &mut PbtTuner, id: u64, step: u64, value: f64| {
        let intermediate = Intermediate {
            step,
            checkpoint: true,
        };
        tuner
            .receive_intermediate_result(id, intermediate, value)
            .unwrap();
    };
    // Everyone scores (nobody is judged worst at its own report yet), then 0, the worst, is
    // replaced by a clone of 3, the best, queued (no id asked for yet).
    for (id, value) in [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)] {
        report(&mut tuner, id, 0, value);
    }
    report(&mut tuner, 0, 1, 0.0);
    // Then 3 falls to the bottom and is replaced in turn (by a clone of 2); both end.
    report(&mut tuner, 3, 1, -10.0);
    let stops: Vec<u64> = tuner
        .take_suggestions()
        .unwrap()
        .into_iter()
        .filter_map(|e| match read_suggestion(e) {
            Emitted::Stop(stop) => Some(stop.parameter_id),
            _ => None,
        })
        .collect();
    assert_eq!(stops, [0, 3]);
    tuner.trial_end(0, "EARLY_STOPPED").unwrap();
    tuner.trial_end(3, "EARLY_STOPPED").unwrap();
    let lineages: Vec<Lineage> = (4..6)
        .map(|id| match tuner.generate_parameters(id).unwrap() {
            Generated::Member { lineage, .. } => lineage,
            other => panic!("{other:?}"),
        })
        .collect();
    // 0's successor was to clone 3, which is gone: it clones 2 (the best living one).
    assert_eq!(lineages[0].replaces, Some(0));
    assert_eq!(lineages[0].parent, Some(2), "{lineages:?}");
    assert_eq!(lineages[1].replaces, Some(3));
    assert_eq!(lineages[1].parent, Some(2), "{lineages:?}");
}

/// Stops (with their messages) and every member's lineage: what a resume must not change.
type Judgments = (Vec<(u64, String)>, Vec<(u64, Lineage)>);

fn judgments(drive: &Drive) -> Judgments {
    let lineages = drive
        .created
        .iter()
        .map(|(id, _, _, lineage)| (*id, lineage.clone()))
        .collect();
    (drive.stops.clone(), lineages)
}

/// Donors, scores and order do not depend on the random stream: the bottom member of 3 is
/// replaced by the top one, whose `lr` (the score) a successor keeps.
fn steady_population() -> Value {
    json!({"population_size": 3, "perturbation_interval": 2, "burn_in_period": 8,
           "quantile_fraction": 0.34, "resample_probability": 0.0,
           "perturbation_factors": [1.0], "seed": 7})
}

/// A crash during burn-in: the members go on from the steps they had, so the stops ("at step
/// S", the donor's step) and the lineages' `parent_step` are the uninterrupted run's (found by
/// a fault hunt: burn-in began again, and successors counted from the resume).
#[test]
fn a_population_resumed_during_burn_in_continues_as_the_uninterrupted_one() {
    let score = |p: &Value, _| p["lr"].as_f64().unwrap();
    let run = |crash_after: Option<u64>| {
        let mut drive = Drive::new(steady_population());
        for _ in 0..3 {
            drive.ask();
        }
        for round in 0..30 {
            if Some(round) == crash_after {
                drive = drive.crash_and_resume(steady_population());
            }
            drive.step(score);
        }
        drive
    };
    let uninterrupted = run(None);
    assert!(uninterrupted.stops.len() >= 4, "{:?}", uninterrupted.stops);
    for crash_after in [1, 5, 7] {
        assert_eq!(
            judgments(&run(Some(crash_after))),
            judgments(&uninterrupted),
            "crash after {crash_after} steps"
        );
    }
}

/// After crashes among successors (where the scores from before a crash are not known again,
/// so who is replaced may differ), every step the tuner names is still the member's own count:
/// its lineage's `parent_step` plus its results in all attempts.
#[test]
fn a_resumed_member_counts_its_steps_on() {
    let score = |p: &Value, _| p["lr"].as_f64().unwrap();
    for crashes in [[9, 14], [11, 13], [12, 21]] {
        let mut drive = Drive::new(steady_population());
        for _ in 0..3 {
            drive.ask();
        }
        for round in 0..30 {
            if crashes.contains(&round) {
                drive = drive.crash_and_resume(steady_population());
            }
            drive.step(score);
        }
        let parent_step: BTreeMap<u64, u64> = drive
            .created
            .iter()
            .map(|(id, _, _, lineage)| (*id, lineage.parent_step.unwrap_or(0)))
            .collect();
        let parameters: BTreeMap<u64, Value> = drive
            .created
            .iter()
            .map(|(id, _, parameters, _)| (*id, parameters.clone()))
            .collect();
        let successors_after_crash = drive.created.iter().filter(|c| c.0 > 2).count();
        assert!(successors_after_crash >= 4, "crashes {crashes:?}");
        for ((bottom, reason), reports) in drive.stops.iter().zip(&drive.reports_at_stops) {
            let steps = |id: u64| parent_step[&id] + reports.get(&id).copied().unwrap_or(0);
            let donor: u64 = reason
                .split("parameter id ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|id| id.parse().ok())
                .unwrap_or_else(|| panic!("{reason}"));
            let expected = format!(
                "at step {} (score {}); replaced by a clone of parameter id {donor} (score {}, step {})",
                steps(*bottom),
                score(&parameters[bottom], 0),
                score(&parameters[&donor], 0),
                steps(donor)
            );
            assert!(
                reason.contains(&expected),
                "crashes {crashes:?}: {reason}, expected {expected}"
            );
        }
    }
}

/// A member's retry goes on from its checkpoint while the host numbers its results from 0
/// again: the member keeps its step count, as without the retry.
#[test]
fn a_retried_member_keeps_its_step_count() {
    let score = |p: &Value, _| p["lr"].as_f64().unwrap();
    let mut uninterrupted = Drive::new(steady_population());
    let mut retried = Drive::new(steady_population());
    for _ in 0..3 {
        uninterrupted.ask();
        retried.ask();
    }
    for round in 0..30 {
        if round == 5 || round == 12 {
            for member in retried.running.values_mut() {
                member.steps = 0;
            }
        }
        uninterrupted.step(score);
        retried.step(score);
    }
    assert_eq!(judgments(&retried), judgments(&uninterrupted));
}
