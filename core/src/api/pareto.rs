//! `GET /pareto`: a multi-objective experiment's results ([`crate::objectives`]): each
//! succeeded trial's listed metrics, whether it is feasible and on the Pareto front, and the
//! hypervolume after each trial (in the order they ended) against the reference point, for the
//! dashboard's scatter and hypervolume charts and for scripts.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, ApiState};

pub(super) async fn pareto(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let experiment_state = state.read(|reader| reader.replay()).await?;
    let (objectives, entries) = crate::objectives::of_state(&experiment_state);
    if objectives.is_empty() {
        return Ok(Json(json!({
            "objectives": [],
            "trials": [],
            "reference": null,
            "hypervolume": [],
            "note": "this experiment lists no objectives (a knob extension); it has one final result per trial",
        })));
    }
    let (reference, history) = crate::objectives::hypervolume_history(&objectives, &entries);
    Ok(Json(json!({
        "objectives": objectives,
        "trials": entries,
        "reference": reference,
        "hypervolume": entries.iter().zip(&history).map(|(e, hv)| json!({
            "trial_id": e.trial_id,
            "hypervolume": hv,
        })).collect::<Vec<_>>(),
    })))
}
