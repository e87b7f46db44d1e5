//! Read routes: the experiment, its trials and metrics, the event log, all from the store.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, ApiState};
use crate::export::KeyPath;
use crate::objectives::Ranking;
use crate::store::{
    Attempts, ExperimentStatus, MetricKind, StoreReader, TrialQuery, TrialRow, TrialStatus,
};

/// The most rows one request returns; larger `limit`s are cut to this.
const MAX_PAGE: u64 = 10_000;
const DEFAULT_TRIAL_PAGE: u64 = 1_000;
const DEFAULT_LOG_PAGE: u64 = 5_000;

pub(super) type QueryParams = Result<Query<HashMap<String, String>>, QueryRejection>;

/// The query string as a map; a malformed one is a 400 with one line.
pub(super) fn params(query: QueryParams) -> Result<HashMap<String, String>, ApiError> {
    query
        .map(|Query(map)| map)
        .map_err(|e| ApiError::bad_request(format!("malformed query string: {e}")))
}

/// An optional non-negative integer parameter.
pub(super) fn number_param(
    params: &HashMap<String, String>,
    name: &str,
) -> Result<Option<u64>, ApiError> {
    params
        .get(name)
        .map(|text| {
            text.trim().parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!(
                    "query parameter {name} must be a non-negative integer, got {text:?}"
                ))
            })
        })
        .transpose()
}

fn page_limit(params: &HashMap<String, String>, default: u64) -> Result<u64, ApiError> {
    Ok(number_param(params, "limit")?
        .unwrap_or(default)
        .min(MAX_PAGE))
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A trial as the API shows it: the stored row plus its duration so far, and whether it ranks
/// (`objectives::Ranking`: it may be named the best), which the dashboard takes as it is
/// rather than judging results again.
pub(super) fn trial_json(trial: &TrialRow, now: i64, ranking: &Ranking) -> Value {
    let mut value = serde_json::to_value(trial).unwrap_or(Value::Null);
    let duration = trial
        .started_ms
        .map(|start| trial.ended_ms.unwrap_or(now).saturating_sub(start));
    value["duration_ms"] = json!(duration);
    value["ranks"] = json!(ranking.ranks_row(trial));
    value
}

/// How the experiment in the store judges "best" (see [`Ranking`]).
fn ranking_of(reader: &StoreReader) -> Result<Ranking, crate::store::StoreError> {
    Ok(match reader.experiment()? {
        Some(experiment) => Ranking::of_config(&experiment.config),
        None => Ranking::new(crate::store::Direction::Maximize, &[]),
    })
}

pub(super) async fn experiment(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let id = state.config().experiment_id.clone();
    let writable = state
        .config()
        .commands
        .as_ref()
        .is_some_and(|c| !c.is_closed());
    let crashed = crashed(&state).await;
    let mut summary = state
        .read(move |reader| experiment_snapshot(reader, !crashed))
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!("experiment {id} has no record in its store yet"))
        })?;
    summary["writable"] = json!(writable);
    if let Some(recorded) = summary["status"].as_str().and_then(ExperimentStatus::parse) {
        let message = summary["status_message"].as_str().map(str::to_string);
        let (status, message) =
            crate::registry::served_status(&id, crashed, recorded, message.as_deref());
        summary["status"] = json!(status);
        summary["status_message"] = json!(message);
    }
    Ok(Json(summary))
}

/// Whether the experiment is crashed: read-only (`knob view`), whether the process running it
/// is still there is the registry's to say, as for `knob experiment list`; the experiment's own
/// API runs in that process.
async fn crashed(state: &ApiState) -> bool {
    if state.config().commands.is_some() {
        return false;
    }
    let id = state.config().experiment_id.clone();
    tokio::task::spawn_blocking(move || {
        crate::registry::Registry::open_default()
            .and_then(|registry| registry.get(&id))
            .is_ok_and(|entry| entry.crashed())
    })
    .await
    .unwrap_or(false)
}

/// How many best trials a snapshot lists.
const SNAPSHOT_BEST: u64 = 10;

/// The experiment as `GET /api/v1/experiment` shows it, from its store: status, times, the
/// tuner's direction, trial counts, the best trials, the last event's sequence and the config;
/// `None` while the store holds no experiment. The one form of it: the route adds `writable`
/// (and `CRASHED` under `knob view`), `knob top` reads it for an experiment not running.
/// `running`: whether a process still runs it; an active one whose process is gone (crashed)
/// stopped its clock when it was last known alive, not now.
pub fn experiment_snapshot(
    reader: &StoreReader,
    running: bool,
) -> Result<Option<Value>, crate::store::StoreError> {
    let Some(experiment) = reader.experiment()? else {
        return Ok(None);
    };
    let counts = reader.trial_counts()?;
    let total: u64 = counts.values().sum();
    let ranking = Ranking::of_config(&experiment.config);
    let direction = ranking.direction;
    let best = reader.best_trials(&ranking, SNAPSHOT_BEST)?;
    let last_seq = reader.counters()?.next_event_seq.saturating_sub(1);
    let now = now_ms();
    let end = match (experiment.status.is_active(), running) {
        (true, true) => now,
        (true, false) => reader
            .last_alive_ms()?
            .map_or(experiment.updated_ms, |alive| {
                alive.max(experiment.updated_ms)
            }),
        (false, _) => experiment.updated_ms,
    };
    let counts: serde_json::Map<String, Value> = counts
        .into_iter()
        .map(|(status, n)| (status.as_str().to_string(), json!(n)))
        .collect();
    Ok(Some(json!({
        "id": experiment.experiment_id,
        "name": experiment.config.get("experimentName").cloned().unwrap_or(Value::Null),
        "status": experiment.status,
        "status_message": experiment.status_message,
        "start_time_ms": experiment.start_time_ms,
        "updated_ms": experiment.updated_ms,
        // Wall time since creation, stopped spells included.
        "elapsed_ms": end.saturating_sub(experiment.start_time_ms),
        // The time that counts toward maxExperimentDuration: running, across every run.
        "running_ms": reader.active_time_ms(end)?,
        "optimize_mode": direction.as_str(),
        "trial_counts": counts,
        "trial_total": total,
        "best_trials": best.iter().map(|t| trial_json(t, now, &ranking)).collect::<Vec<_>>(),
        "last_seq": last_seq,
        "config": experiment.config,
    })))
}

fn status_filter(params: &HashMap<String, String>) -> Result<Vec<TrialStatus>, ApiError> {
    let Some(text) = params.get("status") else {
        return Ok(Vec::new());
    };
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            TrialStatus::parse(&s.trim().to_ascii_uppercase()).ok_or_else(|| {
                let known: Vec<&str> = TrialStatus::ALL.iter().map(|s| s.as_str()).collect();
                ApiError::bad_request(format!(
                    "unknown trial status {s:?}; known: {}",
                    known.join(", ")
                ))
            })
        })
        .collect()
}

pub(super) async fn trials(
    State(state): State<ApiState>,
    query: QueryParams,
) -> Result<Json<Value>, ApiError> {
    let params = params(query)?;
    let statuses = status_filter(&params)?;
    let offset = number_param(&params, "offset")?.unwrap_or(0);
    let limit = page_limit(&params, DEFAULT_TRIAL_PAGE)?;
    let query = TrialQuery {
        statuses: statuses.clone(),
        offset,
        limit: Some(limit),
    };
    let (rows, counts, ranking) = state
        .read(move |reader| {
            Ok((
                reader.trials(&query)?,
                reader.trial_counts()?,
                ranking_of(reader)?,
            ))
        })
        .await?;
    let total: u64 = counts
        .iter()
        .filter(|(status, _)| statuses.is_empty() || statuses.contains(status))
        .map(|(_, n)| n)
        .sum();
    let now = now_ms();
    Ok(Json(json!({
        "total": total,
        "offset": offset,
        "limit": limit,
        "trials": rows.iter().map(|t| trial_json(t, now, &ranking)).collect::<Vec<_>>(),
    })))
}

/// `GET /trial-columns`: the trial list as the dashboard draws it, one array per field instead
/// of one object per trial, with each parameter flattened into a column of its own, named as
/// `knob experiment export` names its `param:` columns (`a/b` for a nested one; JSON Pointers
/// where two would share a name), each name's key path in `parameter_paths`. At 10 000 trials this is a third of `/trials`' bytes and far less to parse: the
/// field names are written once, not once a trial. `last_seq` is read before the trials, so a
/// page that follows `/stream` from it misses no change made after the list.
///
/// The answer is kept (the last one, in the server's memory) while the store has no new event
/// and no trial in it is still running, whose duration would grow: a finished experiment's list,
/// asked again by every page load, is then served without reading and encoding 10 000 trials.
pub(super) async fn trial_columns(
    State(state): State<ApiState>,
    headers: HeaderMap,
    query: QueryParams,
) -> Result<Response, ApiError> {
    let gzip_accepted = super::web::accepts_gzip(&headers);
    let params = params(query)?;
    let statuses = status_filter(&params)?;
    let offset = number_param(&params, "offset")?.unwrap_or(0);
    let limit = page_limit(&params, MAX_PAGE)?;
    let query = TrialQuery {
        statuses: statuses.clone(),
        offset,
        limit: Some(limit),
    };
    let (last_seq, counts) = state
        .read(|reader| {
            let last_seq = reader.counters()?.next_event_seq.saturating_sub(1);
            Ok((last_seq, reader.trial_counts()?))
        })
        .await?;
    let key = format!("{last_seq} {offset} {limit} {statuses:?}");
    if let Some((body, gzip)) = state.cached_trial_columns(&key) {
        return Ok(if gzip_accepted {
            gzip_json_body(gzip)
        } else {
            json_body(body)
        });
    }
    let (rows, ranking) = state
        .read(move |reader| Ok((reader.trials(&query)?, ranking_of(reader)?)))
        .await?;
    let total: u64 = counts
        .iter()
        .filter(|(status, _)| statuses.is_empty() || statuses.contains(status))
        .map(|(_, n)| n)
        .sum();
    let mut answer = columns_json(&rows, now_ms(), &ranking);
    answer["total"] = json!(total);
    answer["offset"] = json!(offset);
    answer["limit"] = json!(limit);
    answer["last_seq"] = json!(last_seq);
    let body = Bytes::from(answer.to_string());
    // A trial that started and has not ended has a duration that depends on the time of asking.
    // It is kept gzipped too: compressing 1.5 MB for every page load cost more than reading it.
    if rows
        .iter()
        .all(|t| t.started_ms.is_none() || t.ended_ms.is_some())
    {
        let plain = body.clone();
        let gzip = tokio::task::spawn_blocking(move || gzip(&plain))
            .await
            .map_err(|e| ApiError::internal(format!("compressing the trial list failed: {e}")))?;
        state.keep_trial_columns(key, body.clone(), gzip.clone());
        if gzip_accepted {
            return Ok(gzip_json_body(gzip));
        }
    }
    Ok(json_body(body))
}

/// The export's response body as it is written: each write is a chunk of it. A write fails once
/// the response is dropped (the client went away), which ends the export.
struct BodyWriter(tokio::sync::mpsc::Sender<std::io::Result<Bytes>>);

impl std::io::Write for BodyWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
            })?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A JSON answer already encoded.
fn json_body(body: Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A JSON answer already encoded and gzipped (the compression layer leaves it alone).
fn gzip_json_body(gzip: Bytes) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CONTENT_ENCODING, "gzip"),
            (header::VARY, "Accept-Encoding"),
        ],
        gzip,
    )
        .into_response()
}

/// `bytes` gzipped at the default level.
fn gzip(bytes: &[u8]) -> Bytes {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let gzip = encoder
        .write_all(bytes)
        .and_then(|()| encoder.finish())
        .unwrap_or_default();
    Bytes::from(gzip)
}

/// `{count, columns: {field: [...]}, parameters: {name: [...]}, parameter_paths: {name: [key,
/// ...]}}`; a parameter a trial lacks is `null` in its column.
fn columns_json(rows: &[TrialRow], now: i64, ranking: &Ranking) -> Value {
    let column =
        |field: fn(&TrialRow) -> Value| -> Value { Value::Array(rows.iter().map(field).collect()) };
    let columns = json!({
        "trial_id": column(|t| json!(t.trial_id)),
        "sequence": column(|t| json!(t.sequence)),
        "status": column(|t| json!(t.status)),
        "attempts": column(|t| json!(t.attempts)),
        "started_ms": column(|t| json!(t.started_ms)),
        "ended_ms": column(|t| json!(t.ended_ms)),
        "duration_ms": Value::Array(rows.iter().map(|t| json!(t
            .started_ms
            .map(|start| t.ended_ms.unwrap_or(now).saturating_sub(start)))).collect()),
        "final_value": column(|t| json!(t.final_value)),
        "ranks": Value::Array(rows.iter().map(|t| json!(ranking.ranks_row(t))).collect()),
        "environment_id": column(|t| json!(t.environment_id)),
        "end_message": column(|t| json!(t.end_message)),
        "waiting_reason": column(|t| json!(t.waiting_reason)),
    });
    // Each distinct key path a column, in the order first seen, named as the export names them.
    let mut paths: Vec<KeyPath> = Vec::new();
    let mut index: HashMap<KeyPath, usize> = HashMap::new();
    let mut parameters: Vec<Vec<Value>> = Vec::new();
    for (row, trial) in rows.iter().enumerate() {
        let mut flat = Vec::new();
        flatten_parameters(&trial.parameters, &mut Vec::new(), &mut flat);
        for (path, value) in flat {
            let at = *index.entry(path.clone()).or_insert_with(|| {
                paths.push(path);
                parameters.push(vec![Value::Null; rows.len()]);
                parameters.len() - 1
            });
            parameters[at][row] = value;
        }
    }
    let names = crate::export::column_names(&paths);
    let parameter_paths: serde_json::Map<String, Value> = names
        .iter()
        .cloned()
        .zip(paths.iter().map(|path| json!(path)))
        .collect();
    let parameters: serde_json::Map<String, Value> = names
        .into_iter()
        .zip(parameters.into_iter().map(Value::Array))
        .collect();
    json!({
        "count": rows.len(),
        "columns": columns,
        "parameters": parameters,
        "parameter_paths": parameter_paths,
    })
}

/// A trial's parameters as (key path, value) pairs, a nested object's keys one by one; arrays
/// and other values stay whole. Named by `export::column_names`, as the CSV export's columns:
/// `opt/lr` for `lr` inside `opt`, JSON Pointers where two paths would share a name (a
/// top-level `opt/lr` beside it is `opt~1lr`). Joining with `.` had let a top-level `opt.lr`
/// take the nested one's column, its values lost without a word.
fn flatten_parameters(value: &Value, path: &mut KeyPath, out: &mut Vec<(KeyPath, Value)>) {
    let Some(object) = value.as_object() else {
        return;
    };
    for (key, value) in object {
        path.push(key.clone());
        if value.is_object() {
            flatten_parameters(value, path, out);
        } else {
            out.push((path.clone(), value.clone()));
        }
        path.pop();
    }
}

/// `?attempt=`: absent for each trial's latest attempt, `all`, or a number.
fn attempts_param(params: &HashMap<String, String>) -> Result<Attempts, ApiError> {
    match params.get("attempt").map(|text| text.trim()) {
        None | Some("") | Some("latest") => Ok(Attempts::Latest),
        Some("all") => Ok(Attempts::All),
        Some(text) => match text.parse::<u32>() {
            Ok(number) if number >= 1 => Ok(Attempts::Only(number)),
            _ => Err(ApiError::bad_request(format!(
                "query parameter attempt must be all, latest or an attempt number (1, 2, ...), got {text:?}"
            ))),
        },
    }
}

/// A trial's row and its metrics of the attempts asked for (by default its latest attempt, so
/// a trial run again after a crash shows one final, not one per attempt).
async fn trial_with_metrics(
    state: &ApiState,
    trial_id: &str,
    query: QueryParams,
) -> Result<(TrialRow, Vec<crate::store::MetricRecord>), ApiError> {
    let attempts = attempts_param(&params(query)?)?;
    let id = trial_id.to_string();
    let (row, metrics) = state
        .read(move |reader| Ok((reader.trial(&id)?, reader.metrics_of_trial(&id)?)))
        .await?;
    let row = row.ok_or_else(|| state.no_trial(trial_id))?;
    // An attempt the trial never had is refused, as the log route refuses it: an empty list
    // read as "that attempt ran and reported nothing".
    if let Attempts::Only(number) = attempts {
        if number > row.attempts.max(1) {
            return Err(no_such_attempt(trial_id, row.attempts));
        }
    }
    let metrics = metrics
        .into_iter()
        .filter(|m| attempts.includes(m.attempt, row.attempts))
        .collect();
    Ok((row, metrics))
}

/// The 400 for an attempt number a trial with `attempts` attempts never had.
pub(super) fn no_such_attempt(trial_id: &str, attempts: u32) -> ApiError {
    ApiError::bad_request(format!(
        "trial {trial_id} has attempts 1 to {}",
        attempts.max(1)
    ))
}

pub(super) async fn trial(
    State(state): State<ApiState>,
    Path(trial_id): Path<String>,
    query: QueryParams,
) -> Result<Json<Value>, ApiError> {
    let (row, metrics) = trial_with_metrics(&state, &trial_id, query).await?;
    let id = trial_id.clone();
    let (schedule, ranking) = state
        .read(move |reader| Ok((schedule_of(reader, &id)?, ranking_of(reader)?)))
        .await?;
    let mut value = trial_json(&row, now_ms(), &ranking);
    value["metrics"] = json!(metrics);
    if let Some((lineage, schedule)) = schedule {
        value["lineage"] = json!(lineage);
        value["schedule"] = json!(schedule);
    }
    Ok(Json(value))
}

/// A population member's lineage (PBT) and the schedule of its parameters
/// (`crate::export::schedule`, which the export shares). `None` for a trial that is no member.
fn schedule_of(
    reader: &crate::store::StoreReader,
    trial_id: &str,
) -> Result<Option<(crate::store::Lineage, Vec<Value>)>, crate::store::StoreError> {
    // Most trials are no members: their page does not read every creation in the log.
    if reader.lineage(trial_id)?.is_none() {
        return Ok(None);
    }
    let lineages = reader.lineages()?;
    let Some(lineage) = lineages.get(trial_id) else {
        return Ok(None);
    };
    let steps = crate::export::schedule(trial_id, &lineages, |id| {
        Ok(reader.trial(id)?.map(|row| row.parameters))
    })?
    .unwrap_or_default();
    let schedule = steps.iter().map(|step| json!(step)).collect();
    Ok(Some((lineage.clone(), schedule)))
}

pub(super) async fn trial_metrics(
    State(state): State<ApiState>,
    Path(trial_id): Path<String>,
    query: QueryParams,
) -> Result<Json<Value>, ApiError> {
    let (_, metrics) = trial_with_metrics(&state, &trial_id, query).await?;
    Ok(Json(json!({ "trial_id": trial_id, "metrics": metrics })))
}

/// The most trials one `/metrics?trial_ids=` request names.
const MAX_TRIAL_IDS: usize = 1_000;

/// `GET /metrics?since=SEQ&limit=N[&trial_ids=a,b&kind=intermediate&attempt=all]`: metrics
/// logged after `since`, oldest first, of each trial's latest attempt (or the attempts asked
/// for); of the named trials only, and of one kind, when asked.
pub(super) async fn metrics(
    State(state): State<ApiState>,
    query: QueryParams,
) -> Result<Json<Value>, ApiError> {
    let params = params(query)?;
    let since = number_param(&params, "since")?.unwrap_or(0);
    let limit = page_limit(&params, DEFAULT_LOG_PAGE)?;
    let kind = match params.get("kind").map(|k| k.trim()) {
        None | Some("") => None,
        Some(text) => Some(MetricKind::parse(text).ok_or_else(|| {
            ApiError::bad_request(format!(
                "query parameter kind must be intermediate or final, got {text:?}"
            ))
        })?),
    };
    let trial_ids: Option<Vec<String>> = params.get("trial_ids").map(|text| {
        text.split(',')
            .map(str::trim)
            .filter(|id| !id.is_empty())
            .map(String::from)
            .collect()
    });
    if trial_ids
        .as_ref()
        .is_some_and(|ids| ids.len() > MAX_TRIAL_IDS)
    {
        return Err(ApiError::bad_request(format!(
            "query parameter trial_ids names more than {MAX_TRIAL_IDS} trials; ask in several requests"
        )));
    }
    let attempts = attempts_param(&params)?;
    let metrics = state
        .read(move |reader| match (&trial_ids, kind, attempts) {
            (None, None, Attempts::All) => reader.metrics_since(since, limit),
            (ids, kind, attempts) => {
                reader.metrics_matching(ids.as_deref(), kind, attempts, since, limit)
            }
        })
        .await?;
    let last_seq = metrics.last().map_or(since, |m| m.seq);
    Ok(Json(json!({ "metrics": metrics, "last_seq": last_seq })))
}

/// `GET /events?since=SEQ&limit=N`: the log after `since` (metrics included), oldest first.
pub(super) async fn events(
    State(state): State<ApiState>,
    query: QueryParams,
) -> Result<Json<Value>, ApiError> {
    let params = params(query)?;
    let since = number_param(&params, "since")?.unwrap_or(0);
    let limit = page_limit(&params, DEFAULT_LOG_PAGE)?;
    let events = state
        .read(move |reader| reader.events_since(since, limit))
        .await?;
    let last_seq = events.last().map_or(since, |e| e.seq);
    Ok(Json(json!({ "events": events, "last_seq": last_seq })))
}

/// `GET /export?format=json|csv`: the experiment as `knob experiment export` writes it (the same
/// code), as a download.
pub(super) async fn export(
    State(state): State<ApiState>,
    query: QueryParams,
) -> Result<axum::response::Response, ApiError> {
    use axum::http::header;
    use axum::response::IntoResponse;
    let params = params(query)?;
    let csv = match params.get("format").map(|f| f.trim()) {
        None | Some("") | Some("json") => false,
        Some("csv") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "query parameter format must be json or csv, got {other:?}"
            )))
        }
    };
    let experiment_state = state.read(|reader| reader.replay()).await?;
    let crashed = crashed(&state).await;
    // Only the characters a file name and a header carry safely.
    let id: String = state
        .config()
        .experiment_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let (content_type, extension) = if csv {
        ("text/csv; charset=utf-8", "csv")
    } else {
        ("application/json", "json")
    };
    // Written into the response as it is made, on a thread of its own: the JSON of a million
    // intermediate results is 160 MB, and as one value it took 2 GB that the serving process
    // (the running experiment's, for the dashboard's download) kept.
    let (sender, mut receiver) = tokio::sync::mpsc::channel(16);
    tokio::task::spawn_blocking(move || {
        let mut out = BodyWriter(sender.clone());
        let written = if csv {
            crate::export::write_csv(&experiment_state, &mut out).map_err(std::io::Error::from)
        } else {
            crate::export::write_json(&experiment_state, crashed, &mut out)
        };
        // A failure ends the response unfinished rather than as a document that looks whole;
        // a client that went away is told nothing.
        if let Err(error) = written {
            let _ = sender.blocking_send(Err(error));
        }
    });
    // `poll_fn` over the channel, which answers "ended" however often it is asked again: the
    // gzip layer asks once more after the end (`stream::unfold` panicked there).
    let body = axum::body::Body::from_stream(futures_util::stream::poll_fn(move |context| {
        receiver.poll_recv(context)
    }));
    let disposition = format!("attachment; filename=\"{id}.{extension}\"");
    Ok((
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        body,
    )
        .into_response())
}
