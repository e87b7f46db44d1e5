//! Write routes. Each one is a [`Command`] to the running manager, which records the change
//! before it takes effect and answers whether it was applied; a refusal is a 4xx with its reason.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::StatusCode;
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::{ApiError, ApiState};
use crate::manager::{Command, Refusal, Update, UpdateOutcome};
use crate::registry::Registry;

/// How long a request waits for the manager's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

fn not_running() -> ApiError {
    ApiError::conflict("experiment is not running")
}

/// The 409 of a write this server has no running manager for. A read-only server (`knob view`,
/// or its list's `/e/ID/`) of an experiment another process runs says so, and where that
/// process's API is: "not running" contradicted the RUNNING its own `GET /experiment` shows.
/// Whether it runs is the registry's to say, as for `knob experiment list`.
async fn cannot_apply(state: &ApiState) -> ApiError {
    if state.config().commands.is_some() {
        // This process ran the experiment, and its run is over.
        return not_running();
    }
    let id = state.config().experiment_id.clone();
    let runner = {
        let id = id.clone();
        tokio::task::spawn_blocking(move || {
            let entry = Registry::open_default().and_then(|r| r.get(&id)).ok()?;
            // A process whose run is over, still sending its last notifications, has closed
            // its API; its registry entry says how the run ended already.
            (!entry.run_over() && entry.running_pid().is_some()).then(|| entry.api_address())
        })
        .await
        .ok()
        .flatten()
    };
    match runner {
        None => not_running(),
        Some(Some(address)) => ApiError::conflict(format!(
            "this server is read-only (`knob view`): experiment {id} is running and serves its own API and dashboard at http://{address}/"
        )),
        Some(None) => ApiError::conflict(format!(
            "this server is read-only (`knob view`): experiment {id} is running in another process"
        )),
    }
}

/// The largest body a write takes (axum's default, written out so that a refusal and
/// `openapi.yaml` can say it), but for [`SEARCH_SPACE_BODY_LIMIT`]'s route.
pub const BODY_LIMIT: usize = 2 << 20;

/// The largest body `PUT /experiment/search-space` takes: a search space as large as a config's
/// `searchSpaceFile` may be ([`MAX_SEARCH_SPACE_FILE_BYTES`]), four times over, since the same
/// space in JSON is longer than in YAML (every key and string quoted, every item's separator).
///
/// [`MAX_SEARCH_SPACE_FILE_BYTES`]: crate::config::MAX_SEARCH_SPACE_FILE_BYTES
pub const SEARCH_SPACE_BODY_LIMIT: usize = 4 * crate::config::MAX_SEARCH_SPACE_FILE_BYTES as usize;

/// A write's body, of at most `LIMIT` bytes. A longer one is refused with 413 and a JSON error
/// that names the limit: axum's own refusal (its `DefaultBodyLimit`, which this does not use) is
/// plain text, where the API promises `{"error": …}`. The rest of a body up to twice the limit
/// is read and dropped before the answer: a server that answers and closes while the client
/// still sends resets the connection, and the client then sees that instead of the answer.
/// A body declared longer than that is refused at once.
pub(super) struct Body<const LIMIT: usize>(Bytes);

impl<S: Send + Sync, const LIMIT: usize> FromRequest<S> for Body<LIMIT> {
    type Rejection = ApiError;

    async fn from_request(request: Request, _: &S) -> Result<Self, ApiError> {
        let route = format!("{} {}", request.method(), request.uri().path());
        let too_large = || {
            // A search space sent in a PATCH of the experiment has a route of its own.
            let elsewhere = if LIMIT < SEARCH_SPACE_BODY_LIMIT && route.ends_with("/experiment") {
                format!(
                    "; a search space alone may be up to {} MiB through PUT /api/v1/experiment/search-space",
                    SEARCH_SPACE_BODY_LIMIT >> 20
                )
            } else {
                String::new()
            };
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body is over {} MiB, the most {route} takes{elsewhere}",
                    LIMIT >> 20
                ),
            )
        };
        let drained_at_most = 2 * LIMIT;
        let declared = request
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|length| length > drained_at_most as u64) {
            return Err(too_large());
        }
        let mut chunks = request.into_body().into_data_stream();
        let mut body = Vec::new();
        let mut read = 0;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk
                .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
            read += chunk.len();
            if read <= LIMIT {
                body.extend_from_slice(&chunk);
            } else if read > drained_at_most {
                break;
            }
        }
        if read > LIMIT {
            return Err(too_large());
        }
        Ok(Body(body.into()))
    }
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request needs a JSON body"));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))
}

/// Sends one update to the manager and waits for its answer.
async fn send_update(state: &ApiState, update: Update) -> Result<UpdateOutcome, ApiError> {
    let Some(commands) = state.config().commands.as_ref() else {
        return Err(cannot_apply(state).await);
    };
    let (answer, answered) = oneshot::channel();
    commands
        .send(Command::Update(update, answer))
        .map_err(|_| not_running())?;
    match tokio::time::timeout(ANSWER_TIMEOUT, answered).await {
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the experiment did not answer within 30 s",
        )),
        Ok(Err(_)) => Err(not_running()),
        Ok(Ok(Err(Refusal::Invalid(why)))) => Err(ApiError::bad_request(why)),
        Ok(Ok(Err(Refusal::Conflict(why)))) => Err(ApiError::conflict(why)),
        Ok(Ok(Ok(outcome))) => Ok(outcome),
    }
}

/// `trialConcurrency`, `trial_concurrency` and `TrialConcurrency` are one field, as in configs.
fn field_key(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

fn positive_integer(field: &str, value: &Value) -> Result<u64, ApiError> {
    value.as_u64().ok_or_else(|| {
        ApiError::bad_request(format!("{field} must be a positive integer, got {value}"))
    })
}

fn duration(value: &Value) -> Result<Duration, ApiError> {
    let seconds = match value {
        Value::String(text) => crate::config::duration_text_seconds(text)
            .map_err(|e| ApiError::bad_request(format!("maxExperimentDuration: {e}")))?,
        // A number of seconds is checked as the config's is (positive, at most 100 years): a
        // larger one would saturate to u64::MAX, which the manager's deadline cannot hold.
        Value::Number(n) => crate::config::duration_text_seconds(&n.to_string())
            .map_err(|e| ApiError::bad_request(format!("maxExperimentDuration: {e}")))?,
        other => {
            return Err(ApiError::bad_request(format!(
                "maxExperimentDuration must be a duration like \"30m\" or seconds, got {other}"
            )))
        }
    };
    Ok(Duration::from_secs(seconds))
}

/// Checks a `PATCH /experiment` body as the API reads it, without an experiment to send it to:
/// `knob update` says what is wrong with a value (`concurrency ID -1`) before it looks for the
/// running experiment, which, stopped, was all it said.
pub fn check_update(body: &Value) -> Result<(), String> {
    updates_of(body).map(|_| ()).map_err(|e| e.message)
}

/// Reads the updates a `PATCH /experiment` body asks for, refusing the whole body if any
/// field is unknown or of the wrong type.
fn updates_of(body: &Value) -> Result<Vec<(&'static str, Update)>, ApiError> {
    let object = body.as_object().ok_or_else(|| {
        ApiError::bad_request("the body must be a JSON object, e.g. {\"trialConcurrency\": 4}")
    })?;
    if object.is_empty() {
        return Err(ApiError::bad_request(
            "nothing to update: give trialConcurrency, maxTrialNumber, maxExperimentDuration or searchSpace",
        ));
    }
    let mut updates = Vec::new();
    for (name, value) in object {
        let update = match field_key(name).as_str() {
            "trialconcurrency" => {
                let n = positive_integer("trialConcurrency", value)?;
                let n = u32::try_from(n).map_err(|_| {
                    ApiError::bad_request(format!("trialConcurrency {n} is too large"))
                })?;
                ("trialConcurrency", Update::TrialConcurrency(n))
            }
            "maxtrialnumber" => (
                "maxTrialNumber",
                Update::MaxTrialNumber(positive_integer("maxTrialNumber", value)?),
            ),
            "maxexperimentduration" => (
                "maxExperimentDuration",
                Update::MaxExperimentDuration(duration(value)?),
            ),
            "searchspace" => ("searchSpace", Update::SearchSpace(search_space(value)?)),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "cannot update {name:?}: only trialConcurrency, maxTrialNumber, maxExperimentDuration and searchSpace change while an experiment runs"
                )))
            }
        };
        updates.push(update);
    }
    Ok(updates)
}

fn search_space(value: &Value) -> Result<Value, ApiError> {
    if value.is_object() {
        Ok(value.clone())
    } else {
        Err(ApiError::bad_request(format!(
            "searchSpace must be a JSON object of parameters, got {value}"
        )))
    }
}

/// `PATCH|PUT /experiment`: applies the fields in order; the answer lists the applied ones.
pub(super) async fn update_experiment(
    State(state): State<ApiState>,
    Body(body): Body<BODY_LIMIT>,
) -> Result<Json<Value>, ApiError> {
    let body = parse_body(&body)?;
    let updates = updates_of(&body)?;
    let mut applied = Vec::new();
    for (field, update) in updates {
        send_update(&state, update).await.map_err(|e| {
            if applied.is_empty() {
                e
            } else {
                ApiError::new(
                    e.status,
                    format!("{} (already applied: {})", e.message, applied.join(", ")),
                )
            }
        })?;
        applied.push(field);
    }
    Ok(Json(json!({ "applied": applied })))
}

/// `PUT /experiment/search-space`: the body is the new search space.
pub(super) async fn update_search_space(
    State(state): State<ApiState>,
    Body(body): Body<SEARCH_SPACE_BODY_LIMIT>,
) -> Result<Json<Value>, ApiError> {
    let space = search_space(&parse_body(&body)?)?;
    send_update(&state, Update::SearchSpace(space)).await?;
    Ok(Json(json!({ "applied": ["searchSpace"] })))
}

/// `POST /trials` with `{"parameters": {...}}`: runs a trial with these parameters.
pub(super) async fn add_trial(
    State(state): State<ApiState>,
    Body(body): Body<BODY_LIMIT>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let body = parse_body(&body)?;
    let parameters = body
        .get("parameters")
        .filter(|p| p.is_object())
        .ok_or_else(|| {
            ApiError::bad_request("the body must be {\"parameters\": {<name>: <value>, ...}}")
        })?;
    match send_update(&state, Update::AddTrial(parameters.clone())).await? {
        UpdateOutcome::TrialAdded(trial_id) => {
            Ok((StatusCode::CREATED, Json(json!({ "trial_id": trial_id }))))
        }
        _ => Ok((StatusCode::CREATED, Json(json!({})))),
    }
}

/// `POST /trials/{id}/kill`: the trial is recorded USER_CANCELED. 200 once the kill is asked of
/// its service; 202 `{"kill_recorded": true, "pending": true, "message": …}` when its host cannot
/// be reached now, so that nothing reached the trial yet: knob kills it when the host answers.
pub(super) async fn kill_trial(
    State(state): State<ApiState>,
    Path(trial_id): Path<String>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = trial_id.clone();
    let row = state.read(move |reader| reader.trial(&id)).await?;
    let row = row.ok_or_else(|| state.no_trial(&trial_id))?;
    if row.status.is_final() {
        return Err(ApiError::conflict(format!(
            "trial {trial_id} already ended ({})",
            row.status.as_str()
        )));
    }
    match send_update(&state, Update::KillTrial(trial_id.clone())).await? {
        UpdateOutcome::KillPending { host, why } => Ok((
            StatusCode::ACCEPTED,
            Json(json!({
                "kill_recorded": true,
                "pending": true,
                "trial_id": trial_id,
                "message": kill_pending_message(&host),
                "why": why,
            })),
        )),
        _ => Ok((StatusCode::OK, Json(json!({ "killed": trial_id })))),
    }
}

/// What a kill whose host cannot be reached answers (the CLI prints it as it is).
fn kill_pending_message(host: &str) -> String {
    format!(
        "kill recorded, not yet carried out: {host} cannot be reached; knob kills the trial when it answers"
    )
}

/// `POST /experiment/stop`: stops as Ctrl-C would; the answer comes before trials are killed.
pub(super) async fn stop(
    State(state): State<ApiState>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Some(commands) = state.config().commands.as_ref() else {
        return Err(cannot_apply(&state).await);
    };
    commands.send(Command::Stop).map_err(|_| not_running())?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "stopping": true }))))
}
