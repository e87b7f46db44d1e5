//! `knob experiment export` and the dashboard's download buttons (`GET /api/v1/export`): one
//! description of an experiment as JSON or CSV, so the two cannot differ.

use std::io::Write;

use serde_json::{json, Value};

use crate::store::{ExperimentState, MetricKind};

/// The whole experiment as JSON: its status and config, and every trial with its parameters,
/// final and intermediate results and each attempt.
pub fn to_json(state: &ExperimentState) -> Value {
    // With `objectives`: whether each trial is on the Pareto front (null without objectives).
    let (objectives, entries) = crate::objectives::of_state(state);
    let pareto = |id: &str| -> Value {
        if objectives.is_empty() {
            return Value::Null;
        }
        Value::Bool(entries.iter().any(|e| e.trial_id == id && e.pareto))
    };
    let trials: Vec<Value> = state
        .trials
        .iter()
        .map(|t| {
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
                "intermediate": t.metrics.iter().filter(|m| m.kind == MetricKind::Intermediate)
                    .map(|m| json!({"attempt": m.attempt, "sequence": m.trial_sequence, "value": m.value, "raw": m.raw, "time_ms": m.time_ms}))
                    .collect::<Vec<_>>(),
                "created_ms": t.created_ms,
                "started_ms": last_attempt.map(|a| a.started_ms),
                "ended_ms": t.end.as_ref().map(|e| e.time_ms),
                "attempts": t.attempts.len(),
                // Where each attempt ran and how it ended: a retried trial, or one whose host
                // was lost and that ran again elsewhere, shows every attempt.
                "attempt_history": t.attempts.iter().map(|a| json!({
                    "number": a.number,
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
                })).collect::<Vec<_>>(),
                // The host memory its attempts ask for since it ran out of memory (absent:
                // trialMemorySize).
                "memory_request_mib": t.memory_request_mib,
                // The GPU memory per GPU its attempts ask for since it ran out of GPU memory
                // (absent: trialGpuMemory).
                "gpu_memory_request_mib": t.gpu_memory_request_mib,
                "exit_code": t.end.as_ref().and_then(|e| e.exit_code),
                "message": t.end.as_ref().and_then(|e| e.message.clone()),
                "pareto": pareto(&t.trial_id),
                // A population member's origin (PBT): the trial whose checkpoint it started
                // from, the one it replaced, and the parent's step; null for other trials.
                "lineage": t.lineage,
            })
        })
        .collect();
    json!({
        "experiment": {
            "id": state.experiment_id,
            "status": state.status.as_str(),
            "message": state.status_message,
            "start_time_ms": state.start_time_ms,
            "config": state.config,
        },
        "trials": trials,
        // The experiment's log of warnings (a tuner's dropped parameters, environments lost
        // and back, a service's reports), oldest first.
        "warnings": state.warnings.iter().map(|w| json!({
            "time_ms": w.time_ms,
            "trial_id": w.trial_id,
            "message": w.message,
        })).collect::<Vec<_>>(),
    })
}

/// One row per trial; parameters flattened into one column each (nested choices as `a/b`),
/// intermediate results as a JSON list in one column.
pub fn write_csv(state: &ExperimentState, out: &mut dyn Write) -> csv::Result<()> {
    let mut parameter_columns: Vec<String> = Vec::new();
    let flat: Vec<Vec<(String, String)>> = state
        .trials
        .iter()
        .map(|t| {
            let mut cells = Vec::new();
            flatten("", &t.parameters, &mut cells);
            for (name, _) in &cells {
                if !parameter_columns.contains(name) {
                    parameter_columns.push(name.clone());
                }
            }
            cells
        })
        .collect();
    let mut writer = csv::Writer::from_writer(out);
    let mut header: Vec<String> = [
        "trial_id",
        "sequence",
        "status",
        "final",
        "started_ms",
        "ended_ms",
        "duration_s",
        "message",
        "intermediate",
    ]
    .map(String::from)
    .to_vec();
    header.extend(parameter_columns.iter().map(|c| format!("param:{c}")));
    writer.write_record(&header)?;
    for (trial, cells) in state.trials.iter().zip(flat) {
        let started = trial.attempts.last().map(|a| a.started_ms);
        let ended = trial.end.as_ref().map(|e| e.time_ms);
        let intermediate: Vec<Value> = trial
            .metrics
            .iter()
            .filter(|m| m.kind == MetricKind::Intermediate)
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
            trial
                .final_metric()
                .and_then(|m| m.value)
                .map(|v| v.to_string())
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
        record.extend(parameter_columns.iter().map(|c| {
            cells
                .iter()
                .find(|(name, _)| name == c)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        }));
        writer.write_record(&record)?;
    }
    writer.flush()?;
    Ok(())
}

fn flatten(prefix: &str, value: &Value, cells: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                let name = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}/{key}")
                };
                flatten(&name, value, cells);
            }
        }
        Value::String(s) => cells.push((prefix.to_string(), s.clone())),
        other => cells.push((prefix.to_string(), other.to_string())),
    }
}
