//! What a notification says: a subject, a plain-text body (the mail), and the same as JSON for a
//! webhook (`text` as Slack shows it, `knob` with the fields for a program).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::ExperimentContext;
use crate::store::{Direction, ExperimentStatus, StoreError, StoreReader, TrialRow, TrialStatus};

/// How many of the best trials an end-of-experiment summary lists.
pub const BEST_TRIALS_SHOWN: u64 = 3;

/// [`Notification::event`] of a new best.
pub const NEW_BEST: &str = "new_best";

/// One message, the same for every sink.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// `done`, `error`, `stopped`, `new_best`, `failures_in_a_row` or `test`.
    pub event: &'static str,
    pub subject: String,
    pub body: String,
    /// The facts of the message, for a program at the other end of a webhook.
    pub details: Value,
}

impl Notification {
    /// Whether this is the end of the experiment's message (DONE, ERROR or STOPPED).
    pub fn ends_experiment(&self) -> bool {
        matches!(self.event, "done" | "error" | "stopped")
    }

    /// The webhook's JSON: Slack's incoming-webhook `text`, plus knob's own fields.
    pub fn webhook_body(&self) -> Value {
        json!({
            "text": format!("{}\n{}", self.subject, self.body),
            "knob": self.details,
        })
    }

    /// `knob notify test`'s message.
    pub fn test(source: &str) -> Notification {
        Notification {
            event: "test",
            subject: "knob: test notification".into(),
            body: format!(
                "This is a test message from `knob notify test --config {source}`: this sink works.\n"
            ),
            details: json!({"event": "test", "config": source}),
        }
    }

    pub(super) fn ended(context: &ExperimentContext, summary: &Summary) -> Notification {
        let id = &context.experiment_id;
        let status = summary.status.as_str();
        let mut subject = format!("knob: experiment {id} {status}");
        if let Some(best) = summary.best.first() {
            if let Some(value) = best.final_value {
                subject.push_str(&format!(", best {value} (trial {})", best.trial_id));
            }
        }
        let mut body = format!("Experiment {id}");
        if let Some(name) = &summary.name {
            body.push_str(&format!(" ({name})"));
        }
        body.push_str(&format!(
            " is {status} after {}.\n",
            duration_text(summary.duration_ms)
        ));
        if let Some(message) = &summary.message {
            body.push_str(&format!("Reason: {message}\n"));
        }
        body.push_str(&format!("Trials: {}\n", counts_text(&summary.counts)));
        if summary.best.is_empty() {
            body.push_str("No trial reported a final result.\n");
        } else {
            body.push_str(&format!(
                "Best trials ({}):\n",
                direction_word(context.ranking.direction)
            ));
            for (rank, trial) in summary.best.iter().enumerate() {
                body.push_str(&format!("  {}. {}\n", rank + 1, trial_line(trial)));
            }
        }
        body.push_str(&dashboard_lines(context));
        Notification {
            event: match summary.status {
                ExperimentStatus::Error => "error",
                ExperimentStatus::Stopped => "stopped",
                _ => "done",
            },
            subject,
            body,
            details: json!({
                "event": summary.status.as_str().to_ascii_lowercase(),
                "experimentId": id,
                "experimentName": summary.name,
                "status": status,
                "message": summary.message,
                "durationSeconds": summary.duration_ms.max(0) / 1000,
                "trials": summary.counts.iter().map(|(status, count)| (status.as_str(), *count)).collect::<BTreeMap<_, _>>(),
                "direction": direction_word(context.ranking.direction),
                "best": summary.best.iter().map(trial_json).collect::<Vec<_>>(),
                "dashboardUrl": context.dashboard_url,
            }),
        }
    }

    pub(super) fn new_best(context: &ExperimentContext, trial: &TrialRow) -> Notification {
        let id = &context.experiment_id;
        let value = trial.final_value.unwrap_or(f64::NAN);
        Notification {
            event: NEW_BEST,
            subject: format!(
                "knob: experiment {id}: new best {value} (trial {})",
                trial.trial_id
            ),
            body: format!(
                "Experiment {id} has a new best trial ({}):\n  {}\n{}",
                direction_word(context.ranking.direction),
                trial_line(trial),
                dashboard_lines(context)
            ),
            details: json!({
                "event": "new_best",
                "experimentId": id,
                "direction": direction_word(context.ranking.direction),
                "best": [trial_json(trial)],
                "dashboardUrl": context.dashboard_url,
            }),
        }
    }

    pub(super) fn failures_in_a_row(
        context: &ExperimentContext,
        failed: &[(String, Option<String>)],
    ) -> Notification {
        let id = &context.experiment_id;
        let count = failed.len();
        let mut body = format!("The last {count} trials of experiment {id} failed:\n");
        for (trial, message) in failed {
            body.push_str(&format!(
                "  trial {trial}: {}\n",
                message.as_deref().unwrap_or("failed")
            ));
        }
        body.push_str(&dashboard_lines(context));
        Notification {
            event: "failures_in_a_row",
            subject: format!("knob: experiment {id}: {count} trials failed in a row"),
            body,
            details: json!({
                "event": "failures_in_a_row",
                "experimentId": id,
                "failed": failed.iter().map(|(trial, message)| json!({"trialId": trial, "message": message})).collect::<Vec<_>>(),
                "dashboardUrl": context.dashboard_url,
            }),
        }
    }
}

/// What an end-of-experiment message reports, read from the store.
#[derive(Debug, Clone)]
pub(super) struct Summary {
    status: ExperimentStatus,
    message: Option<String>,
    name: Option<String>,
    duration_ms: i64,
    counts: BTreeMap<TrialStatus, u64>,
    best: Vec<TrialRow>,
}

impl Summary {
    pub(super) fn read(
        reader: &StoreReader,
        context: &ExperimentContext,
        status: ExperimentStatus,
        message: Option<String>,
        ended_ms: i64,
    ) -> Result<Summary, StoreError> {
        let experiment = reader.experiment()?;
        let name = experiment
            .as_ref()
            .and_then(|experiment| experiment.config.get("experimentName"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let started_ms = experiment.map_or(ended_ms, |experiment| experiment.start_time_ms);
        Ok(Summary {
            status,
            message,
            name,
            duration_ms: ended_ms - started_ms,
            counts: reader.trial_counts()?,
            best: reader.best_trials(&context.ranking, BEST_TRIALS_SHOWN)?,
        })
    }
}

fn direction_word(direction: Direction) -> &'static str {
    match direction {
        Direction::Maximize => "maximize",
        Direction::Minimize => "minimize",
    }
}

fn trial_line(trial: &TrialRow) -> String {
    let value = trial
        .final_value
        .map_or_else(|| "-".to_owned(), |value| value.to_string());
    format!("trial {}: {value}  {}", trial.trial_id, trial.parameters)
}

fn trial_json(trial: &TrialRow) -> Value {
    json!({
        "trialId": trial.trial_id,
        "value": trial.final_value,
        "parameters": trial.parameters,
    })
}

fn dashboard_lines(context: &ExperimentContext) -> String {
    let id = &context.experiment_id;
    match &context.dashboard_url {
        Some(url) => format!("Dashboard: {url} (while it runs; afterwards `knob view {id}`)\n"),
        None => format!("Dashboard: `knob view {id}`\n"),
    }
}

/// "24 (22 succeeded, 2 failed)".
fn counts_text(counts: &BTreeMap<TrialStatus, u64>) -> String {
    let total: u64 = counts.values().sum();
    let parts: Vec<String> = counts
        .iter()
        .map(|(status, count)| format!("{count} {}", status.as_str().to_ascii_lowercase()))
        .collect();
    if parts.is_empty() {
        format!("{total}")
    } else {
        format!("{total} ({})", parts.join(", "))
    }
}

/// "1h02m", "3m05s", "42s".
fn duration_text(ms: i64) -> String {
    let secs = ms.max(0) / 1000;
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60),
    }
}
