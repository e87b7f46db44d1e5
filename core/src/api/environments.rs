//! `GET /environments`: the platform with its environments, for the dashboard's experiment
//! panel. The environments a training service reported (hosts, cluster allocations, the local
//! machine, each ready or not and why) live only in the running manager, which answers
//! [`Command::Environments`]; the store adds how many trials each one ran. Under `knob view`, or
//! once the experiment ended, only the store answers: the environments its trials ran on.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::{ApiError, ApiState};
use crate::manager::{Command, EnvironmentView};

/// How long the request waits for the manager (busy placing trials, say) before it answers
/// from the store alone.
const MANAGER_PATIENCE: Duration = Duration::from_secs(5);

pub(super) async fn environments(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let live = live_environments(&state).await;
    let (experiment, counts) = state
        .read(|reader| Ok((reader.experiment()?, reader.environment_trial_counts()?)))
        .await?;
    let Some(experiment) = experiment else {
        return Err(ApiError::not_found(
            "the experiment has no record in its store yet",
        ));
    };
    // The config's trainingService: one object, or a list of them (hybrid).
    let services: Vec<Value> = match experiment.config.get("trainingService") {
        Some(Value::Array(list)) => list.clone(),
        Some(one) => vec![one.clone()],
        None => Vec::new(),
    };
    let platforms: Vec<Value> = services
        .iter()
        .map(|service| {
            let mut settings = service.as_object().cloned().unwrap_or_default();
            let platform = settings.remove("platform").unwrap_or(Value::Null);
            json!({"platform": platform, "settings": settings})
        })
        .collect();
    let mut rows: BTreeMap<String, Value> = BTreeMap::new();
    if let Some(views) = &live {
        for view in views {
            rows.insert(
                view.id.clone(),
                json!({"id": view.id, "platform": view.platform, "host": view.host,
                       "ready": view.ready, "why": view.why, "trials": 0, "running": 0}),
            );
        }
    }
    for (id, trials, running) in counts {
        let row = rows.entry(id.clone()).or_insert_with(|| {
            json!({"id": id, "platform": Value::Null, "host": Value::Null, "ready": Value::Null,
                   "why": Value::Null})
        });
        row["trials"] = json!(trials);
        row["running"] = json!(running);
    }
    Ok(Json(json!({
        "live": live.is_some(),
        "platforms": platforms,
        "environments": rows.into_values().collect::<Vec<_>>(),
        "note": if live.is_some() {
            Value::Null
        } else {
            Value::from("the experiment is not running here: environments as its trials recorded them")
        },
    })))
}

/// The running manager's environments; `None` read-only, or when it does not answer in time.
async fn live_environments(state: &ApiState) -> Option<Vec<EnvironmentView>> {
    let commands = state.config().commands.as_ref()?;
    let (answer, answered) = oneshot::channel();
    commands.send(Command::Environments(answer)).ok()?;
    tokio::time::timeout(MANAGER_PATIENCE, answered)
        .await
        .ok()?
        .ok()
}
