//! The experiment's HTTP API (`/api/v1/…`) and the dashboard (`/`), served by the process that
//! runs the experiment (`knob create`, `knob resume`) or, read-only, by `knob view`.
//!
//! Reads come from the experiment's store on read-only connections; every write is a
//! [`Command`] to the manager, which records it before it takes effect and answers whether it
//! was applied. `openapi.yaml` documents every route; a test checks it against [`ROUTES`].

mod logs;
mod reads;
mod stream;
mod web;
mod writes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::manager::Command;
use crate::store::{StoreError, StoreReader};

/// The OpenAPI description of every route, served at `/api/v1/openapi.yaml`.
pub const OPENAPI_YAML: &str = include_str!("openapi.yaml");

/// Every API route as `(method, path)`, path in OpenAPI's `{param}` form: what `openapi.yaml`
/// must document, and what [`router`] serves.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/api/v1/experiment"),
    ("patch", "/api/v1/experiment"),
    ("put", "/api/v1/experiment"),
    ("put", "/api/v1/experiment/search-space"),
    ("post", "/api/v1/experiment/stop"),
    ("get", "/api/v1/trials"),
    ("post", "/api/v1/trials"),
    ("get", "/api/v1/trials/{trial_id}"),
    ("post", "/api/v1/trials/{trial_id}/kill"),
    ("get", "/api/v1/trials/{trial_id}/metrics"),
    ("get", "/api/v1/trials/{trial_id}/logs/{name}"),
    ("get", "/api/v1/metrics"),
    ("get", "/api/v1/events"),
    ("get", "/api/v1/stream"),
    ("get", "/api/v1/openapi.yaml"),
];

/// What the server needs to know about the experiment it serves.
pub struct ApiConfig {
    pub experiment_id: String,
    pub dir: PathBuf,
    /// The running manager; `None` serves the store read-only (writes answer 409).
    pub commands: Option<mpsc::UnboundedSender<Command>>,
    /// When set, every `/api/` request needs `Authorization: Bearer <token>`.
    pub token: Option<String>,
}

/// Shared by every request.
#[derive(Clone)]
pub struct ApiState {
    inner: Arc<Shared>,
}

struct Shared {
    config: ApiConfig,
    /// Idle read-only connections, reused so a request does not reopen the database.
    readers: Mutex<Vec<StoreReader>>,
}

impl ApiState {
    pub fn new(config: ApiConfig) -> ApiState {
        ApiState {
            inner: Arc::new(Shared {
                config,
                readers: Mutex::new(Vec::new()),
            }),
        }
    }

    fn config(&self) -> &ApiConfig {
        &self.inner.config
    }

    /// Runs a store query on a blocking thread with a pooled read-only connection.
    async fn read<T: Send + 'static>(
        &self,
        query: impl FnOnce(&StoreReader) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let state = self.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = state.inner.readers.lock().ok().and_then(|mut p| p.pop());
            let reader = match pooled {
                Some(reader) => reader,
                None => StoreReader::open(&state.config().dir)?,
            };
            let result = query(&reader);
            if let Ok(mut pool) = state.inner.readers.lock() {
                pool.push(reader);
            }
            Ok(result?)
        })
        .await
        .map_err(|e| ApiError::internal(format!("store query failed: {e}")))?
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to serve the API on {0} without a token: a non-loopback address needs --token"
    )]
    TokenRequired(SocketAddr),
    #[error("the API server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Refuses a non-loopback address unless a (non-empty) token protects it.
pub fn check_bind(address: SocketAddr, token: Option<&str>) -> Result<(), ServeError> {
    if address.ip().is_loopback() || token.is_some_and(|t| !t.is_empty()) {
        Ok(())
    } else {
        Err(ServeError::TokenRequired(address))
    }
}

/// Serves the API and the dashboard on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, state: ApiState) -> Result<(), ServeError> {
    check_bind(listener.local_addr()?, state.config().token.as_deref())?;
    axum::serve(listener, router(state)).await?;
    Ok(())
}

/// The whole application: API routes (token-checked), the dashboard, JSON 404s.
pub fn router(state: ApiState) -> Router {
    let api = Router::new()
        .route(
            "/api/v1/experiment",
            get(reads::experiment)
                .patch(writes::update_experiment)
                .put(writes::update_experiment),
        )
        .route(
            "/api/v1/experiment/search-space",
            axum::routing::put(writes::update_search_space),
        )
        .route("/api/v1/experiment/stop", post(writes::stop))
        .route("/api/v1/trials", get(reads::trials).post(writes::add_trial))
        .route("/api/v1/trials/{trial_id}", get(reads::trial))
        .route("/api/v1/trials/{trial_id}/kill", post(writes::kill_trial))
        .route(
            "/api/v1/trials/{trial_id}/metrics",
            get(reads::trial_metrics),
        )
        .route(
            "/api/v1/trials/{trial_id}/logs/{name}",
            get(logs::trial_log),
        )
        .route("/api/v1/metrics", get(reads::metrics))
        .route("/api/v1/events", get(reads::events))
        .route("/api/v1/stream", get(stream::stream))
        .route("/api/v1/openapi.yaml", get(openapi))
        .fallback(|| async { ApiError::not_found("no such API route; see /api/v1/openapi.yaml") })
        .layer(middleware::from_fn_with_state(state.clone(), require_token));
    web::routes().merge(api).with_state(state)
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/yaml")], OPENAPI_YAML).into_response()
}

/// With a token configured, an API request without `Authorization: Bearer <token>` gets 401.
/// The dashboard's static files hold no data and are served to anyone who can connect.
async fn require_token(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if let Some(token) = &state.config().token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| same_secret(g.as_bytes(), token.as_bytes())) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or wrong token: send Authorization: Bearer <token>",
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// Compares without stopping at the first difference, so timing does not reveal the prefix.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// An API failure: a status and one line, answered as `{"error": "<line>"}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        let message: String = message.into();
        let one_line = message.lines().collect::<Vec<_>>().join(" ");
        ApiError {
            status,
            message: one_line,
        }
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, message)
    }

    fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> ApiError {
        ApiError::internal(error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (method, path) of every operation in `openapi.yaml`, read from its layout: paths at
    /// two spaces of indent, methods at four.
    fn documented_routes() -> Vec<(String, String)> {
        let mut routes = Vec::new();
        let mut path = None;
        for line in OPENAPI_YAML.lines() {
            if let Some(p) = line.strip_prefix("  /").and_then(|p| p.strip_suffix(':')) {
                path = Some(format!("/{p}"));
            } else if !line.starts_with("  ") {
                path = None;
            } else if let (Some(path), Some(method)) = (
                &path,
                line.strip_prefix("    ").and_then(|m| m.strip_suffix(':')),
            ) {
                if ["get", "put", "post", "patch", "delete"].contains(&method) {
                    routes.push((method.to_string(), path.clone()));
                }
            }
        }
        routes.sort();
        routes
    }

    #[test]
    fn every_route_is_documented_and_every_documented_route_exists() {
        let mut served: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        served.sort();
        assert_eq!(documented_routes(), served);
    }

    #[test]
    fn a_non_loopback_address_needs_a_token() {
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let everywhere: SocketAddr = "0.0.0.0:0".parse().unwrap();
        assert!(check_bind(loopback, None).is_ok());
        assert!(check_bind("[::1]:0".parse().unwrap(), None).is_ok());
        assert!(check_bind(everywhere, None).is_err());
        assert!(check_bind(everywhere, Some("")).is_err());
        assert!(check_bind(everywhere, Some("s3cret")).is_ok());
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
    }
}
