//! `GET /importance`: each parameter's importance for the final result, by fANOVA over a random
//! forest ([`crate::importance`], the method of Optuna's `FanovaImportanceEvaluator`), over the
//! trials that have a final result, computed here so that the page need not download or fit
//! 10 000 trials itself.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, ApiState};
use crate::importance::{fanova, Scale, Value as Coordinate};
use crate::store::TrialQuery;

/// The forest's seed: the same trials give the same answer.
const SEED: u64 = 0;

pub(super) const METHOD: &str = "fANOVA (Hutter et al. 2014) over a random forest of 64 \
    regression trees, as Optuna's FanovaImportanceEvaluator: each parameter's share of the \
    variance of the final result it explains alone; shares sum to 1";

pub(super) async fn importance(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    // One computation at a time: a second page asking meanwhile waits and gets the cached answer.
    let mut cache = state.inner.importance.lock().await;
    let cached_key = cache_key(&cache).map(String::from);
    let (key, experiment, trials) = state
        .read(move |reader| {
            // The answer changes when a trial finishes (or the search space does): the counts of
            // trials in final states key the cache, so new, waiting and running trials do not
            // cost a forest each.
            let ended: Vec<String> = reader
                .trial_counts()?
                .into_iter()
                .filter(|(status, _)| status.is_final())
                .map(|(status, n)| format!("{}={n}", status.as_str()))
                .collect();
            let experiment = reader.experiment()?;
            let space = experiment
                .as_ref()
                .and_then(|e| e.config.get("searchSpace"))
                .map_or(String::new(), Value::to_string);
            let key = format!("{} {space}", ended.join(","));
            let stale = cached_key.as_deref() != Some(key.as_str());
            let trials = if stale {
                Some(reader.trials(&TrialQuery::default())?)
            } else {
                None
            };
            Ok((key, experiment, trials))
        })
        .await?;
    let Some(experiment) = experiment else {
        return Err(ApiError::not_found(
            "the experiment has no record in its store yet",
        ));
    };
    let Some(trials) = trials else {
        if let Some((_, answer)) = cache.as_ref() {
            let mut answer = answer.clone();
            answer["cached"] = json!(true);
            return Ok(Json(answer));
        }
        return Err(ApiError::internal("importance cache emptied while in use"));
    };
    let space = experiment
        .config
        .get("searchSpace")
        .cloned()
        .unwrap_or(Value::Null);
    let finished: Vec<(Value, f64)> = trials
        .into_iter()
        .filter_map(|t| {
            t.final_value
                .filter(|v| v.is_finite())
                .map(|v| (t.parameters, v))
        })
        .collect();
    let mut answer = tokio::task::spawn_blocking(move || compute(&space, &finished))
        .await
        .map_err(|e| ApiError::internal(format!("importance failed: {e}")))?;
    answer["cached"] = json!(false);
    *cache = Some((key, answer.clone()));
    Ok(Json(answer))
}

/// The key of the cached answer, if any.
fn cache_key(cache: &Option<(String, Value)>) -> Option<&str> {
    cache.as_ref().map(|(key, _)| key.as_str())
}

/// How each top-level parameter of the search space maps to fANOVA's cube; a parameter of
/// another form is named in `skipped`.
/// A parameter's name, its scale, and a choice's options.
type Column = (String, Scale, Option<Vec<Value>>);

fn scales(space: &Value) -> (Vec<Column>, Vec<Value>) {
    let mut columns = Vec::new();
    let mut skipped = Vec::new();
    for (name, spec) in space.as_object().into_iter().flatten() {
        let kind = spec.get("_type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "choice" => {
                let options = spec
                    .get("_value")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                columns.push((
                    name.clone(),
                    Scale::Choice {
                        options: options.len(),
                    },
                    Some(options),
                ));
            }
            "loguniform" | "qloguniform" | "lognormal" | "qlognormal" => {
                columns.push((name.clone(), Scale::Number { log: true }, None))
            }
            "uniform" | "quniform" | "normal" | "qnormal" | "randint" => {
                columns.push((name.clone(), Scale::Number { log: false }, None))
            }
            other => skipped.push(json!({
                "name": name,
                "reason": format!("its _type {other:?} is not one fANOVA reads"),
            })),
        }
    }
    (columns, skipped)
}

/// The option a trial's value is (a nested choice by its `_name`).
fn option_index(options: &[Value], value: &Value) -> Option<usize> {
    options.iter().position(|option| {
        option == value
            || (option.get("_name").is_some() && option.get("_name") == value.get("_name"))
    })
}

fn compute(space: &Value, finished: &[(Value, f64)]) -> Value {
    let (columns, mut skipped) = scales(space);
    // Trials whose every parameter reads (a trial from before a search-space change may not).
    let rows: Vec<(Vec<Coordinate>, f64)> = finished
        .iter()
        .filter_map(|(parameters, y)| {
            let row: Option<Vec<Coordinate>> = columns
                .iter()
                .map(|(name, _, options)| {
                    let value = parameters.get(name)?;
                    match options {
                        Some(options) => option_index(options, value).map(Coordinate::Choice),
                        None => value.as_f64().map(Coordinate::Number),
                    }
                })
                .collect();
            row.map(|row| (row, *y))
        })
        .collect();
    let mut parameters: Vec<Value> = Vec::new();
    if rows.len() >= 2 {
        let scales: Vec<Scale> = columns.iter().map(|(_, s, _)| s.clone()).collect();
        for ((name, _, _), share) in columns.iter().zip(fanova(&scales, &rows, SEED)) {
            match share {
                Ok(share) => parameters.push(json!({"name": name, "importance": share})),
                Err(why) => skipped.push(json!({"name": name, "reason": why.to_string()})),
            }
        }
        parameters.sort_by(|a, b| {
            b["importance"]
                .as_f64()
                .unwrap_or(0.0)
                .total_cmp(&a["importance"].as_f64().unwrap_or(0.0))
        });
    }
    json!({
        "method": METHOD,
        "trials": rows.len(),
        "parameters": parameters,
        "skipped": skipped,
        "note": if rows.len() < 2 {
            Value::from("needs at least 2 trials with a final result")
        } else if rows.iter().all(|(_, y)| *y == rows[0].1) {
            // Nothing varies, so nothing explains any of it: every share is 0, not summing to 1.
            Value::from("every trial's final result is the same, so no parameter explains any of it")
        } else {
            Value::Null
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All-zero shares "summing to 1" came with no word when every final was the same.
    #[test]
    fn equal_finals_say_why_every_share_is_zero() {
        let space = json!({"a": {"_type": "uniform", "_value": [0, 1]}});
        let finished: Vec<(Value, f64)> = (0..6)
            .map(|i| (json!({"a": f64::from(i) / 10.0}), 1.0))
            .collect();
        let answer = compute(&space, &finished);
        assert_eq!(
            answer["parameters"][0]["importance"],
            json!(0.0),
            "{answer}"
        );
        assert_eq!(
            answer["note"],
            json!("every trial's final result is the same, so no parameter explains any of it")
        );
        let varied: Vec<(Value, f64)> = (0..6)
            .map(|i| (json!({"a": f64::from(i) / 10.0}), f64::from(i)))
            .collect();
        assert_eq!(compute(&space, &varied)["note"], Value::Null);
    }
}
