//! `knob view` with no id: one server for every experiment of the registry. `/` lists them
//! (web/list.html, from `GET /api/v1/experiments`), and `/e/{id}/` serves each one's dashboard
//! and read-only API, the same router `knob view ID` serves, mounted under its prefix (the
//! dashboard asks for `api/v1/…` relative to its own address).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tower::ServiceExt;

use super::{guard, router, same_secret, ApiConfig, ApiError, ApiState, ServeError};
use crate::registry::{Registry, RegistryEntry};
use crate::store::{StoreReader, DB_FILE_NAME};

/// What the catalog server needs: the registry, and the API options of `knob view`.
pub struct CatalogConfig {
    pub token: Option<String>,
    pub allowed_hosts: Vec<String>,
}

#[derive(Clone)]
struct Catalog {
    inner: Arc<CatalogInner>,
}

struct CatalogInner {
    config: CatalogConfig,
    /// The registry's connection, one request at a time (a SQLite connection is not `Sync`).
    registry: Mutex<Registry>,
    /// Each experiment's router and its state, made when first asked for (each watches its
    /// store's files).
    experiments: Mutex<HashMap<String, (Router, ApiState)>>,
}

/// The catalog's own routes (besides the dashboards under `/e/{id}/`).
pub const ROUTES: [&str; 2] = ["/", "/api/v1/experiments"];

/// What the catalog answers with GET (each experiment's own router answers under `/e/{id}/`,
/// with every method, and explains its own 405s).
fn get_routes() -> Vec<(&'static str, &'static str)> {
    ROUTES
        .iter()
        .chain(&["/assets/{name}", "/e/{id}"])
        .map(|path| ("get", *path))
        .collect()
}

/// Serves the catalog on `listener` until the task is dropped.
pub async fn serve_catalog(
    listener: TcpListener,
    registry: Registry,
    config: CatalogConfig,
) -> Result<(), ServeError> {
    let bound = listener.local_addr()?;
    super::check_bind(bound, config.token.as_deref())?;
    let rule = Arc::new(guard::HostRule {
        bound,
        names: config.allowed_hosts.clone(),
    });
    let catalog = Catalog {
        inner: Arc::new(CatalogInner {
            config,
            registry: Mutex::new(registry),
            experiments: Mutex::new(HashMap::new()),
        }),
    };
    let app = Router::new()
        .route(
            ROUTES[0],
            get(|headers: HeaderMap| async move { super::web::asset("list.html", &headers) }),
        )
        .route(
            "/assets/{name}",
            get(|Path(name): Path<String>, headers: HeaderMap| async move {
                super::web::asset(&name, &headers)
            }),
        )
        .route(
            ROUTES[1],
            get(experiments).layer(middleware::from_fn_with_state(
                catalog.clone(),
                require_token,
            )),
        )
        .route("/e/{id}", get(to_dashboard))
        .route("/e/{id}/", axum::routing::any(experiment))
        .route("/e/{id}/{*rest}", axum::routing::any(experiment))
        // As an experiment's own server answers: JSON errors, 405s that say what is allowed.
        .fallback(|| async {
            ApiError::not_found(
                "no such page: the list is at /, each experiment's dashboard at /e/ID/ and its API at /e/ID/api/v1/, the list's own at /api/v1/experiments",
            )
        })
        .layer(middleware::from_fn(super::plain_errors_as_json))
        .layer(middleware::from_fn_with_state(
            get_routes as guard::RouteTable,
            guard::explain_method_not_allowed,
        ))
        .layer(middleware::from_fn(guard::forbid_framing))
        .layer(tower_http::compression::CompressionLayer::new())
        .with_state(catalog)
        .layer(middleware::from_fn_with_state(rule, guard::check_host));
    super::serve_within_limits(listener, app).await?;
    Ok(())
}

/// `/e/ID` is `/e/ID/`, the dashboard (whose relative links need the slash). The path as the
/// request wrote it, not the decoded `{id}`: a decoded id is no header value (`/e/a%0Ab` was a
/// 500, "failed to parse header value") or not the bytes a browser reads back (`%C3%A9`, sent
/// raw, named another id).
async fn to_dashboard(uri: Uri) -> Response {
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    Redirect::permanent(&format!("{}/{query}", uri.path())).into_response()
}

async fn require_token(State(catalog): State<Catalog>, request: Request, next: Next) -> Response {
    if !authorized(catalog.inner.config.token.as_deref(), request.headers()) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong token: send Authorization: Bearer <token>",
        )
        .into_response();
    }
    next.run(request).await
}

/// Whether a request with `headers` may read: no token is configured, or it sends it.
fn authorized(token: Option<&str>, headers: &HeaderMap) -> bool {
    let Some(token) = token else { return true };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(guard::bearer_token)
        .is_some_and(|given| same_secret(given.as_bytes(), token.as_bytes()))
}

/// `GET /api/v1/experiments`: every experiment of the registry, oldest first, with its status
/// (CRASHED when its process is gone without recording an end), name, start, trial counts and
/// best final; one whose store cannot be read says why in `error`.
async fn experiments(State(catalog): State<Catalog>) -> Result<Json<Value>, ApiError> {
    let catalog = catalog.clone();
    let list = tokio::task::spawn_blocking(move || -> Result<Vec<Value>, ApiError> {
        let entries = catalog
            .inner
            .registry
            .lock()
            .map_err(|_| ApiError::internal("the registry's lock is poisoned"))?
            .list()
            .map_err(|e| ApiError::internal(e.to_string()))?;
        Ok(entries.iter().map(summary).collect())
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(Json(json!({ "experiments": list })))
}

fn summary(entry: &RegistryEntry) -> Value {
    let mut value = json!({
        "id": entry.id,
        "name": entry.name,
        "status": if entry.crashed() { crate::registry::CRASHED_STATUS } else { entry.status.as_str() },
        "created_ms": entry.created_ms,
        // Only while its process runs (a crashed one's port is served by nobody).
        "port": entry.running_pid().and(entry.port),
        // Where its own dashboard listens, when that is one address (`--bind`); the page links
        // to the host it was itself opened on otherwise.
        "host": entry.api_host.filter(|ip| !ip.is_unspecified()),
        "dir": entry.dir,
    });
    let read = || -> Result<Value, crate::store::StoreError> {
        let reader = StoreReader::open(&entry.dir)?;
        let Some(experiment) = reader.experiment()? else {
            return Ok(json!({}));
        };
        let counts = reader.trial_counts()?;
        let ranking = crate::objectives::Ranking::of_config(&experiment.config);
        let direction = ranking.direction;
        let best = reader.best_trials(&ranking, 1)?;
        Ok(json!({
            "start_time_ms": experiment.start_time_ms,
            "trial_total": counts.values().sum::<u64>(),
            "trial_counts": counts.iter().map(|(s, n)| (s.as_str().to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "best": best.first().map(|t| json!({"trial_id": t.trial_id, "final_value": t.final_value})),
            "optimize_mode": direction.as_str(),
            "recorded_status": experiment.status,
        }))
    };
    match read() {
        Ok(Value::Object(extra)) => value.as_object_mut().unwrap().extend(extra),
        Ok(_) => {}
        Err(error) => value["error"] = json!(format!("cannot read its store: {error}")),
    }
    value
}

/// Everything under `/e/{id}/`: that experiment's own router (read-only), with the prefix taken
/// off the path.
async fn experiment(
    State(catalog): State<Catalog>,
    Path(params): Path<HashMap<String, String>>,
    request: Request,
) -> Response {
    let Some(id) = params.get("id").cloned() else {
        return ApiError::not_found("no experiment id").into_response();
    };
    let router = {
        let cached = catalog
            .inner
            .experiments
            .lock()
            .ok()
            .and_then(|map| map.get(&id).cloned());
        match cached {
            Some((router, state)) if !state.store_lost() => router,
            // Not served yet, or its store was deleted or moved: looked up (again). An
            // experiment of that id made (again) or registered since is served anew; without
            // one, the old router goes on answering 410 for the one it served.
            cached => {
                let config = &catalog.inner.config;
                let found = match catalog.inner.registry.lock() {
                    Ok(registry) => registry.get(&id),
                    Err(_) => {
                        return ApiError::internal("the registry's lock is poisoned")
                            .into_response()
                    }
                };
                let state = |dir: PathBuf| {
                    ApiState::new(ApiConfig {
                        experiment_id: id.clone(),
                        dir,
                        commands: None,
                        token: config.token.clone(),
                        allowed_hosts: config.allowed_hosts.clone(),
                        commits: None,
                    })
                };
                let lost = cached.map(|(router, state)| (router, state.config().dir.clone()));
                match (found, lost) {
                    // Its folder moved: the registry still names the old one, with no store.
                    (Ok(entry), Some((router, dir)))
                        if entry.dir == dir && !dir.join(DB_FILE_NAME).exists() =>
                    {
                        router
                    }
                    (Ok(entry), _) => {
                        let state = state(entry.dir);
                        let router = router(state.clone());
                        if let Ok(mut map) = catalog.inner.experiments.lock() {
                            map.insert(id.clone(), (router.clone(), state));
                        }
                        router
                    }
                    (Err(_), Some((router, _))) => router,
                    // A client without the token is answered as for an experiment that exists
                    // (401 on the API, the dashboard's files), by a router over no store and
                    // kept nowhere: a 404 would tell it which ids exist, and where the
                    // registry is.
                    (Err(_), None) if !authorized(config.token.as_deref(), request.headers()) => {
                        router(state(PathBuf::new()))
                    }
                    (Err(error), None) => {
                        return ApiError::not_found(error.to_string()).into_response()
                    }
                }
            }
        }
    };
    let path_and_query = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    // What follows `/e/<id>`, cut at the id's segment as written: `{id}` is decoded, and a
    // prefix rebuilt from it (`/e/A`) did not match `/e/%41/...`, which was then forwarded as
    // `/` (the dashboard's page for every API path). The routes guarantee a `/` after it.
    let inner = path_and_query
        .strip_prefix("/e/")
        .and_then(|after| after.find('/').map(|slash| &after[slash..]))
        .unwrap_or("/")
        .to_string();
    let Ok(uri) = inner.parse::<Uri>() else {
        return ApiError::bad_request("malformed path").into_response();
    };
    // A new request, not this one with its URI changed: axum keeps the path parameters it
    // matched (`{id}`, `{*rest}`) in the request's extensions and the experiment's router adds
    // its own to them, so its `Path` extractors (`/trials/{id}`) found three and answered 500.
    let (parts, body) = request.into_parts();
    let mut forwarded = Request::new(body);
    *forwarded.method_mut() = parts.method;
    *forwarded.uri_mut() = uri;
    *forwarded.version_mut() = parts.version;
    *forwarded.headers_mut() = parts.headers;
    match router.oneshot(forwarded).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}
