//! `knob experiment export` and the dashboard's download buttons (`GET /api/v1/export`): one
//! description of an experiment as JSON or CSV, so the two cannot differ.

use std::collections::HashMap;
use std::io::Write;

use serde::Serialize;
use serde_json::{json, Value};

use crate::store::{ExperimentState, Lineage, MetricKind, MetricRecord, TrialState};

/// One step of a population member's parameter schedule (PBT): from step `from_step` on (its
/// parent's step when it was cloned; 0 for the first generation), the member trained with the
/// `parameters` of trial `trial_id`, itself or one of its ancestors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleStep {
    pub trial_id: String,
    pub from_step: u64,
    pub parameters: Option<Value>,
}

/// A population member's parameter schedule: its ancestors through their parents, oldest
/// first, then itself, each with the step it took over from and its parameters (read with
/// `parameters_of`). `None` for a trial that is no member (not in `lineages`). The one
/// description the export, the API (`GET /trials/ID`'s `schedule`) and `knob trial ls` share.
pub fn schedule<E>(
    trial_id: &str,
    lineages: &HashMap<String, Lineage>,
    mut parameters_of: impl FnMut(&str) -> Result<Option<Value>, E>,
) -> Result<Option<Vec<ScheduleStep>>, E> {
    let Some(lineage) = lineages.get(trial_id) else {
        return Ok(None);
    };
    let mut chain = vec![(trial_id.to_string(), lineage.parent_step.unwrap_or(0))];
    let mut current = lineage;
    // Bounded: a parent is always an older trial, but a damaged log must not loop forever.
    while let Some(parent) = &current.parent {
        if chain.len() > lineages.len() {
            break;
        }
        let Some(next) = lineages.get(parent) else {
            break;
        };
        chain.push((parent.clone(), next.parent_step.unwrap_or(0)));
        current = next;
    }
    chain.reverse();
    let mut steps = Vec::with_capacity(chain.len());
    for (id, from_step) in chain {
        let parameters = parameters_of(&id)?;
        steps.push(ScheduleStep {
            trial_id: id,
            from_step,
            parameters,
        });
    }
    Ok(Some(steps))
}

/// The lineage of every population member of `state`, by trial id.
fn lineages_of(state: &ExperimentState) -> HashMap<String, Lineage> {
    state
        .trials
        .iter()
        .filter_map(|t| Some((t.trial_id.clone(), t.lineage.clone()?)))
        .collect()
}

/// [`schedule`] of every population member of `state`, by trial id.
fn schedules_of(state: &ExperimentState) -> HashMap<String, Vec<ScheduleStep>> {
    let lineages = lineages_of(state);
    if lineages.is_empty() {
        return HashMap::new();
    }
    let parameters: HashMap<&str, &Value> = state
        .trials
        .iter()
        .map(|t| (t.trial_id.as_str(), &t.parameters))
        .collect();
    lineages
        .keys()
        .filter_map(|id| {
            let steps = schedule(id, &lineages, |id| {
                Ok::<_, std::convert::Infallible>(parameters.get(id).map(|p| (*p).clone()))
            })
            .unwrap_or_else(|never| match never {});
            Some((id.clone(), steps?))
        })
        .collect()
}

/// What the JSON export is made of, worked out once for all trials.
struct JsonExport<'a> {
    state: &'a ExperimentState,
    /// Whether the process that ran it is gone without recording its end.
    crashed: bool,
    /// Whether the experiment has `objectives` (else `pareto` is null).
    with_objectives: bool,
    entries: Vec<crate::objectives::ParetoEntry>,
    schedules: HashMap<String, Vec<ScheduleStep>>,
}

impl<'a> JsonExport<'a> {
    fn new(state: &'a ExperimentState, crashed: bool) -> Self {
        let (objectives, entries) = crate::objectives::of_state(state);
        JsonExport {
            state,
            crashed,
            with_objectives: !objectives.is_empty(),
            entries,
            schedules: schedules_of(state),
        }
    }

    /// With `objectives`: whether the trial is on the Pareto front (null without objectives).
    fn pareto(&self, id: &str) -> Value {
        if !self.with_objectives {
            return Value::Null;
        }
        Value::Bool(self.entries.iter().any(|e| e.trial_id == id && e.pareto))
    }

    /// The document without its trials: `trials` is null, in its place.
    fn document(&self) -> Value {
        // CRASHED, as the API says, where the store still says it runs.
        let (status, message) = crate::registry::served_status(
            &self.state.experiment_id,
            self.crashed,
            self.state.status,
            self.state.status_message.as_deref(),
        );
        json!({
            "experiment": {
                "id": self.state.experiment_id,
                "status": status,
                "message": message,
                "start_time_ms": self.state.start_time_ms,
                "config": self.state.config,
            },
            // In its place: each trial (`write_json` fills it in).
            "trials": Value::Null,
            // The experiment's log of warnings (a tuner's dropped parameters, environments lost
            // and back, a service's reports), oldest first.
            "warnings": self.state.warnings.iter().map(|w| json!({
                "time_ms": w.time_ms,
                "trial_id": w.trial_id,
                "message": w.message,
            })).collect::<Vec<_>>(),
        })
    }

    /// One trial without its intermediate results: `intermediate` is null, in its place.
    fn trial_json(&self, t: &TrialState) -> Value {
        let last_attempt = t.attempts.last();
        let final_metric = t.final_metric();
        json!({
            "id": t.trial_id,
            "sequence": t.sequence,
            "parameter_id": t.parameter_id,
            // The id the trial saw when its tuner labeled it (Hyperband's "0-4_0_3").
            "parameter_label": t.parameter_label,
            "parameters": t.parameters,
            "status": t.status.as_str(),
            "final": final_metric.and_then(|m| m.value),
            "final_raw": final_metric.map(|m| &m.raw),
            // In its place: each `intermediate_json` (`write_json` fills it in).
            "intermediate": Value::Null,
            "created_ms": t.created_ms,
            "started_ms": last_attempt.map(|a| a.started_ms),
            "ended_ms": t.end.as_ref().map(|e| e.time_ms),
            "attempts": t.attempts.len(),
            // Where each attempt ran and how it ended: a retried trial, or one whose host
            // was lost and that ran again elsewhere, shows every attempt.
            "attempt_history": t.attempts.iter().map(|a| {
                // Each attempt's own first final: a retried or resumed trial's earlier
                // results stay in the export (`final` is the current attempt's).
                let attempt_final = t.metrics.iter().find(|m| {
                    m.kind == MetricKind::Final && m.attempt == a.number
                });
                json!({
                "number": a.number,
                "final": attempt_final.and_then(|m| m.value),
                "final_raw": attempt_final.map(|m| &m.raw),
                "environment_id": a.environment_id,
                "gpu_indices": a.gpu_indices,
                "started_ms": a.started_ms,
                "ended_ms": a.end.as_ref().map(|e| e.time_ms)
                    .or_else(|| a.requeued.as_ref().map(|r| r.time_ms)),
                "status": a.end.as_ref().map(|e| e.status.as_str()),
                "message": a.end.as_ref().and_then(|e| e.message.clone()),
                "requeued": a.requeued.as_ref().map(|r| r.reason.clone()),
                // Raised for the next attempt after this one ran out of memory.
                "memory_request_mib": a.requeued.as_ref().and_then(|r| r.memory_request_mib),
                "gpu_memory_request_mib": a.requeued.as_ref().and_then(|r| r.gpu_memory_request_mib),
                // What this attempt used, as its service measured it (null: not reported).
                "peak_memory_mib": a.peak_memory_mib,
                "peak_gpu_memory_mib": a.peak_gpu_memory_mib,
                })
            }).collect::<Vec<_>>(),
            // The host memory its attempts ask for since it ran out of memory (absent:
            // trialMemorySize).
            "memory_request_mib": t.memory_request_mib,
            // The GPU memory per GPU its attempts ask for since it ran out of GPU memory
            // (absent: trialGpuMemory).
            "gpu_memory_request_mib": t.gpu_memory_request_mib,
            "exit_code": t.end.as_ref().and_then(|e| e.exit_code),
            "message": t.end.as_ref().and_then(|e| e.message.clone()),
            "pareto": self.pareto(&t.trial_id),
            // A population member's origin (PBT): the trial whose checkpoint it started
            // from, the one it replaced, and the parent's step; null for other trials.
            "lineage": t.lineage,
            // A population member's parameters over time (PBT), null for other trials.
            "schedule": self.schedules.get(&t.trial_id),
        })
    }
}

/// One intermediate result of the export's `intermediate` list; every attempt's are there, each
/// tagged with it.
fn intermediate_json(m: &MetricRecord) -> Value {
    json!({"attempt": m.attempt, "sequence": m.trial_sequence, "value": m.value, "raw": m.raw, "time_ms": m.time_ms})
}

/// A trial's intermediate results, every attempt's, in the order they were reported.
fn intermediates(t: &TrialState) -> impl Iterator<Item = &MetricRecord> {
    t.metrics
        .iter()
        .filter(|m| m.kind == MetricKind::Intermediate)
}

/// The whole experiment as pretty JSON and a newline: its status and config, and every trial
/// with its parameters, final and intermediate results and each attempt. Written part by part:
/// a trial and each of its intermediate results are made as JSON only while they are written,
/// so the memory it takes is the experiment's state and one trial's entries, whatever the
/// number of metrics (a million intermediate results took 2 GB as one `Value`). `crashed`: the
/// experiment's registry entry says its process is gone without recording its end
/// ([`crate::registry::RegistryEntry::crashed`]); its status is then
/// [`crate::registry::CRASHED_STATUS`], as in the API, not the RUNNING its store still says.
pub fn write_json(
    state: &ExperimentState,
    crashed: bool,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let export = JsonExport::new(state, crashed);
    let whole = WithEntry {
        object: export.document(),
        key: "trials",
        value: Trials(&export),
    };
    let mut out = std::io::BufWriter::new(out);
    serde_json::to_writer_pretty(&mut out, &whole)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// A JSON object whose entry `key` (a placeholder in `object`) is written as `value`, in its
/// place: the same bytes as the object holding `value` there, as `Value` writes an object.
struct WithEntry<T> {
    object: Value,
    key: &'static str,
    value: T,
}

impl<T: Serialize> Serialize for WithEntry<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Value::Object(entries) = &self.object else {
            return self.object.serialize(serializer);
        };
        let mut map = serializer.serialize_map(Some(entries.len()))?;
        for (key, value) in entries {
            if key == self.key {
                map.serialize_entry(key, &self.value)?;
            } else {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

/// The export's `trials`, each made as JSON only while it is written.
struct Trials<'a>(&'a JsonExport<'a>);

impl Serialize for Trials<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.state.trials.iter().map(|t| WithEntry {
            object: self.0.trial_json(t),
            key: "intermediate",
            value: Intermediates(t),
        }))
    }
}

/// A trial's `intermediate`, each made as JSON only while it is written.
struct Intermediates<'a>(&'a TrialState);

impl Serialize for Intermediates<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(intermediates(self.0).map(intermediate_json))
    }
}

/// One row per trial; parameters flattened into one column each (nested choices as `a/b`; two
/// values that would share a name are told apart as [`column_names`] says), the latest
/// attempt's intermediate results as a JSON list in one column; `final_raw` is the final result
/// as reported (the JSON export's `final_raw`). A final result reported as a dict gives
/// each of its entries but `default` (which is `final`) a `final:` column, so that the other
/// metrics and a multi-objective experiment's objectives are there as numbers; with
/// `objectives`, a `pareto` column says which trials are on the front, as in the JSON.
pub fn write_csv(state: &ExperimentState, out: &mut dyn Write) -> csv::Result<()> {
    let parameters = FlatColumns::new(state.trials.iter().map(|t| {
        let mut cells = Vec::new();
        flatten(&mut Vec::new(), &t.parameters, &mut cells);
        cells
    }));
    let finals = FlatColumns::new(state.trials.iter().map(|t| {
        let mut cells = Vec::new();
        let reported = t
            .final_metric()
            .and_then(|m| knob_plugin_api::metric::parse_lenient(&m.raw).ok());
        if let Some(Value::Object(entries)) = reported {
            for (key, value) in entries.iter().filter(|(key, _)| *key != "default") {
                flatten(&mut vec![key.clone()], value, &mut cells);
            }
        }
        // NaN and ±Infinity as Python writes them, not as the lenient reader marks them.
        for (_, cell) in &mut cells {
            use knob_plugin_api::metric::{INF, NAN, NEG_INF};
            let spelled = [(NAN, "NaN"), (INF, "Infinity"), (NEG_INF, "-Infinity")]
                .into_iter()
                .find(|(sentinel, _)| cell == sentinel);
            if let Some((_, spelled)) = spelled {
                *cell = spelled.to_string();
            }
        }
        cells
    }));
    let (objectives, entries) = crate::objectives::of_state(state);
    let with_objectives = !objectives.is_empty();
    let mut writer = csv::Writer::from_writer(out);
    let mut header: Vec<String> = [
        "trial_id",
        "sequence",
        "status",
        "final",
        "final_raw",
        "started_ms",
        "ended_ms",
        "duration_s",
        "message",
        "intermediate",
    ]
    .map(String::from)
    .to_vec();
    // Population members (PBT): their lineage and parameter schedule, each as JSON in one
    // column (as `intermediate`); other experiments have no such columns.
    let schedules = schedules_of(state);
    let members = !schedules.is_empty();
    if members {
        header.extend(["lineage".to_string(), "schedule".to_string()]);
    }
    if with_objectives {
        header.push("pareto".to_string());
    }
    header.extend(finals.names.iter().map(|c| format!("final:{c}")));
    header.extend(parameters.names.iter().map(|c| format!("param:{c}")));
    writer.write_record(&header)?;
    for (row, trial) in state.trials.iter().enumerate() {
        let started = trial.attempts.last().map(|a| a.started_ms);
        let ended = trial.end.as_ref().map(|e| e.time_ms);
        // The latest attempt's curve, as its status and final (and the API's metric routes)
        // describe it: a retried or resumed trial's attempts run together would be one saw-tooth
        // with nothing to say where an attempt ends. The JSON export has every attempt's, tagged.
        let attempt = trial.current_attempt();
        let intermediate: Vec<Value> = trial
            .metrics
            .iter()
            .filter(|m| m.kind == MetricKind::Intermediate && m.attempt == attempt)
            .map(|m| {
                m.value
                    .map(Value::from)
                    .unwrap_or_else(|| Value::String(m.raw.clone()))
            })
            .collect();
        let mut record = vec![
            trial.trial_id.clone(),
            trial.sequence.to_string(),
            trial.status.as_str().to_string(),
            trial.final_metric().map(final_cell).unwrap_or_default(),
            trial
                .final_metric()
                .map(|m| m.raw.clone())
                .unwrap_or_default(),
            started.map(|v| v.to_string()).unwrap_or_default(),
            ended.map(|v| v.to_string()).unwrap_or_default(),
            match (started, ended) {
                (Some(s), Some(e)) => format!("{:.3}", (e - s) as f64 / 1000.0),
                _ => String::new(),
            },
            trial
                .end
                .as_ref()
                .and_then(|e| e.message.clone())
                .unwrap_or_default(),
            Value::from(intermediate).to_string(),
        ];
        if members {
            let json_cell = |value: Option<Value>| value.map(|v| v.to_string()).unwrap_or_default();
            record.push(json_cell(trial.lineage.as_ref().map(|l| json!(l))));
            record.push(json_cell(
                schedules.get(&trial.trial_id).map(|steps| json!(steps)),
            ));
        }
        if with_objectives {
            let on_front = entries
                .iter()
                .any(|e| e.trial_id == trial.trial_id && e.pareto);
            record.push(on_front.to_string());
        }
        record.extend(finals.row(row));
        record.extend(parameters.row(row));
        writer.write_record(&record)?;
    }
    writer.flush()?;
    Ok(())
}

/// The `final` column of a trial's final result: its number, and a NaN or ±Infinity spelt as
/// Python writes it (as the `final:` and `intermediate` columns beside it are), so that a
/// diverged final is not as empty as one never reported. The store keeps no number for those
/// (`value` is None), so it is read again from what the trial sent.
fn final_cell(metric: &crate::store::MetricRecord) -> String {
    if let Some(value) = metric.value {
        return number_cell(value);
    }
    match knob_plugin_api::metric::default_value(&metric.raw) {
        Ok(value) if value.is_nan() => "NaN".to_string(),
        Ok(value) if value == f64::INFINITY => "Infinity".to_string(),
        Ok(value) if value == f64::NEG_INFINITY => "-Infinity".to_string(),
        // Not a number at all: nothing a column of numbers can hold.
        _ => String::new(),
    }
}

/// A finite number as a cell: the shortest text that reads back as the same number, with an
/// exponent outside 1e-5..1e16 (`1e-7`, `1e+300`, `0.30000000000000004`, `3`), as the JSON export and
/// the `final:`, `param:` and `intermediate` cells beside it write numbers (serde_json's, as
/// Python's `repr` and JSON writers do). Rust's `Display` wrote 1e-7 as `0.0000001` and 1e300
/// as 301 digits.
fn number_cell(value: f64) -> String {
    let Some(number) = serde_json::Number::from_f64(value) else {
        return String::new();
    };
    // A whole number without serde_json's `.0` (`3`, as reported and as `Display` wrote it):
    // the shortest text that reads back the same.
    let text = number.to_string();
    match text.strip_suffix(".0") {
        Some(whole) => whole.to_string(),
        None => text,
    }
}

/// The path of keys to one value inside a trial's parameters or final dict, outermost first.
pub(crate) type KeyPath = Vec<String>;

/// Named cells of each row (a trial's flattened parameters, say), and every name any row has,
/// in the order first seen: the CSV's columns of that kind.
struct FlatColumns {
    names: Vec<String>,
    rows: Vec<Vec<(usize, String)>>,
}

impl FlatColumns {
    /// `rows`: each row's values by their key path. Each distinct path gets a column of its own,
    /// named by [`column_names`].
    fn new(rows: impl Iterator<Item = Vec<(KeyPath, String)>>) -> FlatColumns {
        let mut paths: Vec<KeyPath> = Vec::new();
        let rows: Vec<Vec<(usize, String)>> = rows
            .map(|cells| {
                cells
                    .into_iter()
                    .map(|(path, value)| {
                        let column = match paths.iter().position(|p| *p == path) {
                            Some(column) => column,
                            None => {
                                paths.push(path);
                                paths.len() - 1
                            }
                        };
                        (column, value)
                    })
                    .collect()
            })
            .collect();
        FlatColumns {
            names: column_names(&paths),
            rows,
        }
    }

    /// Row `row`'s cell in each column, empty where it has none.
    fn row(&self, row: usize) -> impl Iterator<Item = String> + '_ {
        let cells = &self.rows[row];
        (0..self.names.len()).map(move |column| {
            cells
                .iter()
                .find(|(cell_column, _)| *cell_column == column)
                .map(|(_, value)| value.clone())
                .unwrap_or_default()
        })
    }
}

/// A column name for each of `paths` (distinct), all of them distinct: the keys joined with
/// `/` (`opt/lr` for `lr` inside `opt`), which is what a name is unless that would give two
/// paths the same column, as a key `opt/lr` beside `opt` holding `lr` would. Then each path
/// involved is spelt as a JSON Pointer (RFC 6901) without its leading `/`: `/` inside a key
/// becomes `~1` and `~` becomes `~0` (`opt~1lr` for the key `opt/lr`; `opt/lr` stays the
/// nested one's). Escaping only on a collision keeps the common names as they are (a metric
/// `val/acc` stays `val/acc`), and a pointer is one spelling for one path, so no value is
/// left without a column. A plain name that equals another path's pointer is spelt as a
/// pointer too, until no two names are the same. The API's `/trial-columns` (what the
/// dashboard draws) names its parameters with it too, so that the page and the export agree.
pub(crate) fn column_names(paths: &[KeyPath]) -> Vec<String> {
    let plain = |path: &KeyPath| path.join("/");
    let pointer = |path: &KeyPath| {
        path.iter()
            .map(|key| key.replace('~', "~0").replace('/', "~1"))
            .collect::<Vec<_>>()
            .join("/")
    };
    let mut names: Vec<String> = paths.iter().map(plain).collect();
    let mut escaped = vec![false; paths.len()];
    // Each round escapes at least one more path or ends; pointers never collide with each other.
    loop {
        let mut changed = false;
        for at in 0..paths.len() {
            let shared = names
                .iter()
                .enumerate()
                .any(|(other, name)| other != at && *name == names[at]);
            if shared && !escaped[at] {
                escaped[at] = true;
                changed = true;
            }
        }
        if !changed {
            return names;
        }
        for at in 0..paths.len() {
            if escaped[at] {
                names[at] = pointer(&paths[at]);
            }
        }
    }
}

/// Each leaf of `value` with its key path below `path` (`path` itself for a value that is no
/// object), a string as its text and anything else as JSON.
fn flatten(path: &mut KeyPath, value: &Value, cells: &mut Vec<(KeyPath, String)>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                path.push(key.clone());
                flatten(path, value, cells);
                path.pop();
            }
        }
        Value::String(s) => cells.push((path.clone(), s.clone())),
        other => cells.push((path.clone(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(paths: &[&[&str]]) -> Vec<String> {
        let paths: Vec<KeyPath> = paths
            .iter()
            .map(|path| path.iter().map(|key| key.to_string()).collect())
            .collect();
        column_names(&paths)
    }

    #[test]
    fn column_names_join_keys_with_a_slash_and_escape_only_colliding_keys() {
        // No collision: a key with `/` or `~` keeps its name.
        assert_eq!(
            names(&[&["opt", "lr"], &["val/acc"], &["a~b"]]),
            ["opt/lr", "val/acc", "a~b"]
        );
        // A key `opt/lr` beside `lr` inside `opt`: the literal key is escaped, whichever came
        // first.
        assert_eq!(names(&[&["opt/lr"], &["opt", "lr"]]), ["opt~1lr", "opt/lr"]);
        assert_eq!(names(&[&["opt", "lr"], &["opt/lr"]]), ["opt/lr", "opt~1lr"]);
        // A plain name equal to an escaped one is escaped in turn, and `~` with it.
        assert_eq!(
            names(&[
                &["opt", "lr"],
                &["opt/lr"],
                &["opt~1lr"],
                &["a", "b/c"],
                &["a/b", "c"]
            ]),
            ["opt/lr", "opt~1lr", "opt~01lr", "a/b~1c", "a~1b/c"]
        );
    }

    #[test]
    fn a_schedule_follows_the_parents_oldest_first_and_ends_on_a_damaged_log() {
        let member = |parent: Option<&str>, step: Option<u64>| Lineage {
            parent: parent.map(str::to_string),
            replaces: None,
            parent_step: step,
        };
        let mut lineages = HashMap::from([
            ("a".to_string(), member(None, None)),
            ("b".to_string(), member(Some("a"), Some(4))),
            ("c".to_string(), member(Some("b"), Some(9))),
        ]);
        let parameters = |id: &str| Ok::<_, ()>(Some(json!({ "of": id })));
        let steps = schedule("c", &lineages, parameters).unwrap().unwrap();
        let summary: Vec<(&str, u64)> = steps
            .iter()
            .map(|s| (s.trial_id.as_str(), s.from_step))
            .collect();
        assert_eq!(summary, [("a", 0), ("b", 4), ("c", 9)]);
        assert_eq!(steps[1].parameters, Some(json!({"of": "b"})));
        assert_eq!(schedule("x", &lineages, parameters), Ok(None));
        // A cycle (a damaged log) ends: each trial at most once more than the members.
        lineages.insert("a".to_string(), member(Some("c"), Some(1)));
        let steps = schedule("c", &lineages, parameters).unwrap().unwrap();
        assert!(steps.len() <= lineages.len() + 1, "{steps:?}");
    }
}
