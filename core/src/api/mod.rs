//! The experiment's HTTP API (`/api/v1/…`) and the dashboard (`/`), served by the process that
//! runs the experiment (`knob create`, `knob resume`) or, read-only, by `knob view`.
//!
//! Reads come from the experiment's store on read-only connections; every write is a
//! [`Command`] to the manager, which records it before it takes effect and answers whether it
//! was applied. `openapi.yaml` documents every route; a test checks it against the router's
//! own table, [`api_routes`].

mod catalog;
mod environments;
mod guard;
mod importance;
mod logs;
mod pareto;
mod reads;
mod stream;
mod web;
mod writes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::manager::Command;
use crate::store::{EventSeq, StoreError, StoreFile, StoreGone, StoreReader, DB_FILE_NAME};

/// The OpenAPI description of every route, served at `/api/v1/openapi.yaml`.
pub const OPENAPI_YAML: &str = include_str!("openapi.yaml");

/// One API operation: a method on a path (OpenAPI's `{param}` form, which axum shares) and its
/// handler. [`router`] serves exactly [`api_routes`], and a test checks that `openapi.yaml`
/// documents exactly these and that the router answers each of them.
pub struct ApiRoute {
    /// Lower case, as OpenAPI writes it.
    pub method: &'static str,
    pub path: &'static str,
    handler: MethodRouter<ApiState>,
}

fn operation<H, T>(method: &'static str, path: &'static str, handler: H) -> ApiRoute
where
    H: Handler<T, ApiState>,
    T: 'static,
{
    let filter = match method {
        "get" => MethodFilter::GET,
        "put" => MethodFilter::PUT,
        "post" => MethodFilter::POST,
        "patch" => MethodFilter::PATCH,
        _ => MethodFilter::DELETE,
    };
    let handler = on(filter, handler);
    // On the routed method only, so a method the path does not serve gets its 405 (with what is
    // allowed) rather than a refusal of its content type.
    let handler = if method == "get" {
        handler
    } else {
        handler.route_layer(middleware::from_fn(guard::check_write))
    };
    ApiRoute {
        method,
        path,
        handler,
    }
}

/// Every API operation; the only place a route is added.
pub fn api_routes() -> Vec<ApiRoute> {
    vec![
        operation("get", "/api/v1/experiment", reads::experiment),
        operation("patch", "/api/v1/experiment", writes::update_experiment),
        operation("put", "/api/v1/experiment", writes::update_experiment),
        operation(
            "put",
            "/api/v1/experiment/search-space",
            writes::update_search_space,
        ),
        operation("post", "/api/v1/experiment/stop", writes::stop),
        operation("get", "/api/v1/trials", reads::trials),
        operation("get", "/api/v1/trial-columns", reads::trial_columns),
        operation("post", "/api/v1/trials", writes::add_trial),
        operation("get", "/api/v1/trials/{trial_id}", reads::trial),
        operation("post", "/api/v1/trials/{trial_id}/kill", writes::kill_trial),
        operation(
            "get",
            "/api/v1/trials/{trial_id}/metrics",
            reads::trial_metrics,
        ),
        operation(
            "get",
            "/api/v1/trials/{trial_id}/logs/{name}",
            logs::trial_log,
        ),
        operation("get", "/api/v1/metrics", reads::metrics),
        operation("get", "/api/v1/events", reads::events),
        operation("get", "/api/v1/export", reads::export),
        operation("get", "/api/v1/importance", importance::importance),
        operation("get", "/api/v1/environments", environments::environments),
        operation("get", "/api/v1/pareto", pareto::pareto),
        operation("get", "/api/v1/stream", stream::stream),
        operation("get", PUBLIC_API_PATH, openapi),
    ]
}

/// What the server needs to know about the experiment it serves.
pub struct ApiConfig {
    pub experiment_id: String,
    pub dir: PathBuf,
    /// The running manager; `None` serves the store read-only (writes answer 409).
    pub commands: Option<mpsc::UnboundedSender<Command>>,
    /// When set, every `/api/` request but `openapi.yaml` needs `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Names a request's `Host` may carry besides `localhost` and the bound address
    /// (`--allow-host`; see [`guard::host_allowed`]).
    pub allowed_hosts: Vec<String>,
    /// The store's commit watch ([`Store::commits`](crate::store::Store::commits)) when this
    /// process writes the store. `None` (`knob view`): another process or none writes it, so
    /// the store's files are watched instead (inotify); either way the live stream waits on a
    /// change, never on a timer.
    pub commits: Option<watch::Receiver<EventSeq>>,
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
    /// The store file those connections read, to notice that it was deleted or moved: they
    /// would go on answering from the old file (SQLite reads an unlinked file as before).
    store: Mutex<StoreWatch>,
    /// Changes whenever the store may hold new events.
    changes: watch::Receiver<EventSeq>,
    /// Feeds `changes` when the store is another process's; dropped with the state.
    _file_watcher: Option<RecommendedWatcher>,
    /// Why the stream cannot be live, when it cannot.
    live_unavailable: Option<String>,
    /// The last `/importance` answer and the key it was computed for (see `importance`).
    importance: tokio::sync::Mutex<Option<(String, serde_json::Value)>>,
    /// The last few `/trial-columns` answers that do not depend on the time of asking, each
    /// with the key it answers (the store's last event and the query; see
    /// `reads::trial_columns`), its JSON and that JSON gzipped once. A page load asks for the
    /// list's first page and then the whole list, so one slot would keep neither.
    trial_columns: Mutex<Vec<(String, axum::body::Bytes, axum::body::Bytes)>>,
    /// Whether `changes` is this process's own store writer, whose end (the watch closing)
    /// is the end of every change: then `/stream` says so (`event: end`). A file watch, or
    /// none, never ends.
    own_writer: bool,
    /// How many `/stream` responses are open (see `streams_closed`).
    open_streams: watch::Sender<usize>,
}

impl ApiState {
    pub fn new(mut config: ApiConfig) -> ApiState {
        let own_writer = config.commits.is_some();
        let (changes, file_watcher, live_unavailable) = match config.commits.take() {
            Some(commits) => (commits, None, None),
            None => match watch_store_files(&config.dir) {
                Ok((changes, watcher)) => (changes, Some(watcher), None),
                Err(reason) => (watch::channel(0).1, None, Some(reason)),
            },
        };
        ApiState {
            inner: Arc::new(Shared {
                config,
                readers: Mutex::new(Vec::new()),
                store: Mutex::new(StoreWatch::NotOpened),
                changes,
                _file_watcher: file_watcher,
                live_unavailable,
                importance: tokio::sync::Mutex::new(None),
                trial_columns: Mutex::new(Vec::new()),
                own_writer,
                open_streams: watch::channel(0).0,
            }),
        }
    }

    /// Waits until no `/stream` response is open, `within` at most; whether none is. A page
    /// closes its stream once it has read the experiment's end (`event: end`), so a process
    /// that is about to exit can let its open pages read the final state first.
    pub async fn streams_closed(&self, within: std::time::Duration) -> bool {
        let mut open = self.inner.open_streams.subscribe();
        tokio::time::timeout(within, open.wait_for(|open| *open == 0))
            .await
            .is_ok_and(|closed| closed.is_ok())
    }

    /// Why the live stream will not see new events (the OS refused a file watch), if so.
    pub fn live_unavailable(&self) -> Option<&str> {
        self.inner.live_unavailable.as_deref()
    }

    /// A receiver that changes whenever the store may hold new events.
    fn changes(&self) -> watch::Receiver<EventSeq> {
        self.inner.changes.clone()
    }

    fn config(&self) -> &ApiConfig {
        &self.inner.config
    }

    /// The 404 of a trial id this experiment does not have, naming both.
    fn no_trial(&self, trial_id: &str) -> ApiError {
        ApiError::not_found(format!(
            "no trial {trial_id} in experiment {}",
            self.config().experiment_id
        ))
    }

    /// The kept `/trial-columns` answer for `key` (its JSON and its gzip), if one is kept.
    fn cached_trial_columns(&self, key: &str) -> Option<(axum::body::Bytes, axum::body::Bytes)> {
        let kept = self.inner.trial_columns.lock().ok()?;
        kept.iter()
            .find(|(kept_key, ..)| kept_key == key)
            .map(|(_, body, gzip)| (body.clone(), gzip.clone()))
    }

    /// Keeps an answer; those of an older store state (the key's first word, the last event)
    /// go, and at most `KEPT_TRIAL_COLUMNS` stay.
    fn keep_trial_columns(&self, key: String, body: axum::body::Bytes, gzip: axum::body::Bytes) {
        const KEPT_TRIAL_COLUMNS: usize = 4;
        let state_of = |key: &str| key.split(' ').next().unwrap_or_default().to_string();
        if let Ok(mut kept) = self.inner.trial_columns.lock() {
            let now = state_of(&key);
            kept.retain(|(kept_key, ..)| state_of(kept_key) == now && *kept_key != key);
            if kept.len() >= KEPT_TRIAL_COLUMNS {
                kept.remove(0);
            }
            kept.push((key, body, gzip));
        }
    }

    /// Runs a store query on a blocking thread with a pooled read-only connection. A store
    /// deleted or moved since this server first read it is answered 410 ([`Self::store_gone`]).
    async fn read<T: Send + 'static>(
        &self,
        query: impl FnOnce(&StoreReader) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let state = self.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(gone) = state.store_gone() {
                return Err(gone);
            }
            // A failure of a store that went meanwhile ("no such file") is its 410, not a 500.
            let failed = |error: StoreError| state.store_gone().unwrap_or_else(|| error.into());
            let pooled = state.inner.readers.lock().ok().and_then(|mut p| p.pop());
            let reader = match pooled {
                Some(reader) => reader,
                None => StoreReader::open(&state.config().dir).map_err(failed)?,
            };
            let result = query(&reader);
            if let Ok(mut pool) = state.inner.readers.lock() {
                pool.push(reader);
            }
            result.map_err(failed)
        })
        .await
        .map_err(|e| ApiError::internal(format!("store query failed: {e}")))?
    }

    /// The 410 of a store no longer at its path: deleted (`knob experiment delete`, its folder
    /// removed) or moved since this server first read it, or not there at all. Once its file
    /// is gone, the experiment this server showed is too: the pooled connections (which hold
    /// the deleted file's space) are closed, and it answers 410 from then on, also when a new
    /// store is made at the path (`knob view`'s list then serves that one anew, see
    /// `catalog`). One `fstat` and one `stat` a read.
    fn store_gone(&self) -> Option<ApiError> {
        let id = &self.config().experiment_id;
        let path = self.config().dir.join(DB_FILE_NAME);
        let mut store = self.inner.store.lock().ok()?;
        if let StoreWatch::NotOpened = *store {
            match StoreFile::open(&path) {
                Ok(file) => *store = StoreWatch::Opened(file),
                // Not kept: its store may yet be made (or put back) there.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Some(ApiError::gone(format!(
                        "experiment {id} has no store at {}: it was deleted, or its folder moved; `knob experiment list` shows the experiments there are",
                        path.display()
                    )))
                }
                // Reading it says why.
                Err(_) => return None,
            }
        }
        if let StoreWatch::Opened(file) = &*store {
            let message = match file.gone()? {
                StoreGone::Deleted => format!(
                    "experiment {id} was deleted while this server showed it: its store {} is gone (`knob experiment delete`, or its folder removed); there is nothing more to show",
                    path.display()
                ),
                StoreGone::Moved => format!(
                    "experiment {id} is no longer at {}: its folder was moved while this server showed it; `knob experiment delete {id} --yes` and `knob experiment register NEW_FOLDER` point knob at it, then `knob view {id}` shows it",
                    self.config().dir.display()
                ),
            };
            *store = StoreWatch::Gone(message);
        }
        let StoreWatch::Gone(message) = &*store else {
            return None;
        };
        if let Ok(mut pool) = self.inner.readers.lock() {
            pool.clear();
        }
        Some(ApiError::gone(message.clone()))
    }

    /// Whether this server found its store deleted or moved (and so answers 410 for good).
    fn store_lost(&self) -> bool {
        self.inner
            .store
            .lock()
            .is_ok_and(|store| matches!(*store, StoreWatch::Gone(_)))
    }
}

/// The store file a server reads, as far as it knows ([`ApiState::store_gone`]).
enum StoreWatch {
    /// Not read yet.
    NotOpened,
    Opened(StoreFile),
    /// Deleted or moved, and why, as answered.
    Gone(String),
}

/// Bumps a counter whenever the store's database or its write-ahead log changes: how a server
/// learns of commits made by another process. The directory is watched, so a WAL file created
/// later is seen too, and so is the directory itself removed or moved (a live stream then
/// learns that its store is gone).
fn watch_store_files(
    dir: &std::path::Path,
) -> Result<(watch::Receiver<EventSeq>, RecommendedWatcher), String> {
    let (sender, changes) = watch::channel::<EventSeq>(0);
    let database = dir.join(DB_FILE_NAME);
    let wal = dir.join(format!("{DB_FILE_NAME}-wal"));
    let folder = dir.to_path_buf();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if event
            .paths
            .iter()
            .any(|p| *p == database || *p == wal || *p == folder)
        {
            sender.send_modify(|n| *n = n.wrapping_add(1));
        }
    })
    .map_err(|e| format!("cannot watch {} for changes: {e}", dir.display()))?;
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(|e| format!("cannot watch {} for changes: {e}", dir.display()))?;
    Ok((changes, watcher))
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

pub use catalog::{serve_catalog, CatalogConfig};
pub use guard::{allowed_ip, host_allowed};
pub use reads::experiment_snapshot;
pub use writes::check_update;

/// Serves the API and the dashboard on `listener` until the task is dropped. Every request must
/// name this server as its `Host` ([`host_allowed`]), which [`router`] alone does not check
/// because it does not know the address.
pub async fn serve(listener: TcpListener, state: ApiState) -> Result<(), ServeError> {
    let bound = listener.local_addr()?;
    check_bind(bound, state.config().token.as_deref())?;
    let rule = Arc::new(guard::HostRule {
        bound,
        names: state.config().allowed_hosts.clone(),
    });
    let app = router(state).layer(middleware::from_fn_with_state(rule, guard::check_host));
    serve_within_limits(listener, app).await?;
    Ok(())
}

/// How long a client has to send a request's head (its line and headers), and how long an idle
/// kept-alive connection stays open.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How many connections are served at once; one more waits, unanswered, until one closes.
const MAX_CONNECTIONS: usize = 512;

/// Serves `app` on `listener` as `axum::serve` does, within what it does not bound: a client
/// that opened connections and sent half a request held each one open for ever (`axum::serve`
/// sets hyper no timer, so hyper's header timeout never ran), and enough of them used up the
/// file descriptors of the process, which runs the experiment: its store, its trials' logs. Any
/// local user can reach 127.0.0.1, and with `--bind` the token is checked only once the head
/// has arrived.
pub(crate) async fn serve_within_limits(listener: TcpListener, app: Router) -> std::io::Result<()> {
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = Arc::clone(&connections)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // The client gave up before it was accepted: nothing to serve.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                continue
            }
            // Out of file descriptors, say: as axum::serve does, wait for some to be freed
            // rather than spin or stop serving.
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let mut connection = hyper::server::conn::http1::Builder::new();
            connection
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let served = connection
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .with_upgrades();
            // A connection's own failure (the client went away, sent garbage, was too slow)
            // concerns that client alone.
            let _ = served.await;
            drop(permit);
        });
    }
}

/// The whole application: API routes (token-checked; writes only as JSON from the dashboard's
/// own origin, see `guard`), the dashboard, JSON 404s and 405s.
pub fn router(state: ApiState) -> Router {
    let api = api_routes()
        .into_iter()
        .fold(Router::new(), |api, route| {
            api.route(route.path, route.handler)
        })
        .fallback(|| async { ApiError::not_found("no such API route; see /api/v1/openapi.yaml") })
        .layer(middleware::from_fn(plain_errors_as_json))
        .layer(middleware::from_fn_with_state(state.clone(), require_token));
    // gzip shrinks the JSON of a 10 000-trial experiment and the vendored ECharts several
    // times over; tower-http's default predicate leaves the event stream uncompressed.
    web::routes()
        .merge(api)
        .layer(middleware::from_fn_with_state(
            served_routes as guard::RouteTable,
            guard::explain_method_not_allowed,
        ))
        .layer(middleware::from_fn(guard::forbid_framing))
        .layer(tower_http::compression::CompressionLayer::new())
        .with_state(state)
}

/// Every (method, path) [`router`] serves: the API's and the dashboard's.
fn served_routes() -> Vec<(&'static str, &'static str)> {
    let web = web::ROUTES.iter().map(|path| ("get", *path));
    api_routes()
        .iter()
        .map(|route| (route.method, route.path))
        .chain(web)
        .collect()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/yaml")], OPENAPI_YAML).into_response()
}

/// The one API route served without the token, as `openapi.yaml` marks it (`security: []`).
const PUBLIC_API_PATH: &str = "/api/v1/openapi.yaml";

/// With a token configured, an API request without `Authorization: Bearer <token>` gets 401.
/// The dashboard's static files and the API's description hold no data and are served to anyone
/// who can connect.
async fn require_token(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if let Some(token) = state
        .config()
        .token
        .as_ref()
        .filter(|_| request.uri().path() != PUBLIC_API_PATH)
    {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(guard::bearer_token);
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

/// The most of a plain-text error body [`plain_errors_as_json`] reads: axum's own are one short
/// line.
const PLAIN_ERROR_LIMIT: usize = 4096;

/// Answers axum's own rejections (a path segment that is not UTF-8, say) as every other API
/// error is, `{"error": "<line>"}`, which `openapi.yaml` promises: they come as plain text from
/// extractors before any handler of ours runs.
pub(super) async fn plain_errors_as_json(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let plain = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    if !(plain && (status.is_client_error() || status.is_server_error())) {
        return response;
    }
    let text = match axum::body::to_bytes(response.into_body(), PLAIN_ERROR_LIMIT).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_string()
    } else {
        text
    };
    ApiError::new(status, message).into_response()
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

    /// The experiment's store was deleted or moved ([`ApiState::store_gone`]).
    fn gone(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::GONE, message)
    }

    fn is_gone(&self) -> bool {
        self.status == StatusCode::GONE
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
    fn openapi_documents_exactly_the_routers_table() {
        let mut served: Vec<(String, String)> = api_routes()
            .iter()
            .map(|route| (route.method.to_string(), route.path.to_string()))
            .collect();
        served.sort();
        assert_eq!(documented_routes(), served);
    }

    /// Asks the real router for `method path` on a read-only experiment's store; returns the
    /// status and the body.
    async fn ask(router: &Router, method: &str, path: &str) -> (StatusCode, String) {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let uri = path
            .replace("{trial_id}", "no-such-trial")
            .replace("{name}", "stdout");
        let request = axum::http::Request::builder()
            .method(method.to_ascii_uppercase().as_str())
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from("{}"))
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        // The stream never ends; its status and headers are all this needs.
        if path.ends_with("/stream") {
            return (status, String::new());
        }
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn the_router_answers_every_documented_operation_and_no_other_method() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        store
            .append(crate::store::StoreEvent::ExperimentCreated {
                experiment_id: "routes".to_string(),
                config: serde_json::json!({"trialConcurrency": 1}),
                start_time_ms: 0,
            })
            .await
            .unwrap();
        let router = router(ApiState::new(ApiConfig {
            experiment_id: "routes".to_string(),
            dir: dir.path().to_path_buf(),
            commands: None,
            token: None,
            allowed_hosts: Vec::new(),
            commits: Some(store.commits()),
        }));
        let documented = documented_routes();
        let unrouted = ["no such API route", "no such file"];
        for (method, path) in &documented {
            let (status, body) = ask(&router, method, path).await;
            assert!(
                status != StatusCode::METHOD_NOT_ALLOWED
                    && !unrouted.iter().any(|u| body.contains(u)),
                "documented {method} {path} is not routed: {status} {body}"
            );
        }
        for path in documented.iter().map(|(_, path)| path) {
            for method in ["get", "put", "post", "patch", "delete"] {
                if documented.iter().any(|(m, p)| m == method && p == path) {
                    continue;
                }
                let (status, body) = ask(&router, method, path).await;
                assert_eq!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is routed but not documented in openapi.yaml: {body}"
                );
            }
        }
        let (status, body) = ask(&router, "get", "/api/v1/undocumented").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert!(body.contains("no such API route"), "{body}");
    }

    /// `/export` is written into the response as it is made (H2 F3): what a client gets, plain
    /// or gzipped, is the whole export. The gzip layer polls the body once more after its end,
    /// where a body from `stream::unfold` panicked and cut the download short.
    #[tokio::test]
    async fn the_export_downloads_whole_plain_and_gzipped() {
        use crate::store::{MetricKind, StoreEvent};
        use http_body_util::BodyExt;
        use std::io::Read;
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        store
            .append(StoreEvent::ExperimentCreated {
                experiment_id: "curves".to_string(),
                config: serde_json::json!({"trialConcurrency": 1}),
                start_time_ms: 0,
            })
            .await
            .unwrap();
        store
            .append(StoreEvent::TrialCreated {
                trial_id: "a".to_string(),
                sequence: 0,
                parameter_id: 0,
                parameter_label: None,
                parameters: serde_json::json!({"x": 1}),
                lineage: None,
            })
            .await
            .unwrap();
        store
            .append(StoreEvent::TrialStarted {
                trial_id: "a".to_string(),
                attempt: 1,
                environment_id: "box-1".to_string(),
                gpu_indices: vec![],
                pid: None,
            })
            .await
            .unwrap();
        // Enough for many chunks of the body.
        for sequence in 0..3000 {
            let raw = if sequence % 7 == 0 {
                "NaN".to_string()
            } else {
                format!("{sequence}.5")
            };
            store
                .append(StoreEvent::Metric {
                    trial_id: "a".to_string(),
                    attempt: 1,
                    kind: MetricKind::Intermediate,
                    trial_sequence: sequence,
                    value: raw.parse::<f64>().ok().filter(|v| v.is_finite()),
                    raw,
                })
                .await
                .unwrap();
        }
        let state = crate::store::StoreReader::open(dir.path())
            .unwrap()
            .replay()
            .unwrap();
        let router = router(ApiState::new(ApiConfig {
            experiment_id: "curves".to_string(),
            dir: dir.path().to_path_buf(),
            commands: None,
            token: None,
            allowed_hosts: Vec::new(),
            commits: Some(store.commits()),
        }));
        for format in ["json", "csv"] {
            let mut expected = Vec::new();
            if format == "json" {
                crate::export::write_json(&state, false, &mut expected).unwrap();
            } else {
                crate::export::write_csv(&state, &mut expected).unwrap();
            }
            for gzip in [false, true] {
                let mut request =
                    axum::http::Request::get(format!("/api/v1/export?format={format}"));
                if gzip {
                    request = request.header(header::ACCEPT_ENCODING, "gzip");
                }
                let request = request.body(axum::body::Body::empty()).unwrap();
                let response = router.clone().oneshot(request).await.unwrap();
                assert_eq!(response.status(), StatusCode::OK, "{format}");
                let body = response.into_body().collect().await.unwrap().to_bytes();
                let mut text = Vec::new();
                if gzip {
                    flate2::read::GzDecoder::new(&body[..])
                        .read_to_end(&mut text)
                        .unwrap();
                } else {
                    text = body.to_vec();
                }
                assert!(
                    text == expected,
                    "{format}, gzip {gzip}: {} bytes of {}",
                    text.len(),
                    expected.len()
                );
            }
        }
    }

    /// `/trial-columns` names a nested parameter apart from a top-level one that would share its
    /// name, as the CSV export does (a top-level `opt.lr` had taken the nested `lr`'s column).
    #[tokio::test]
    async fn trial_columns_name_parameters_as_the_export_does_and_lose_none() {
        use crate::store::StoreEvent;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let parameters = [
            serde_json::json!({"opt": {"_name": "sgd", "lr": 0.5}, "opt.lr": 5.5, "opt/lr": 7.5, "__proto__": [1, 2]}),
            serde_json::json!({"opt": {"_name": "sgd", "lr": 0.25}, "opt.lr": 5.25, "opt/lr": 7.25, "__proto__": [3, 4]}),
        ];
        store
            .append(StoreEvent::ExperimentCreated {
                experiment_id: "names".to_string(),
                config: serde_json::json!({"trialConcurrency": 1}),
                start_time_ms: 0,
            })
            .await
            .unwrap();
        for (sequence, parameters) in parameters.iter().enumerate() {
            store
                .append(StoreEvent::TrialCreated {
                    trial_id: format!("t{sequence}"),
                    sequence: sequence as u64,
                    parameter_id: sequence as u64,
                    parameter_label: None,
                    parameters: parameters.clone(),
                    lineage: None,
                })
                .await
                .unwrap();
        }
        let router = router(ApiState::new(ApiConfig {
            experiment_id: "names".to_string(),
            dir: dir.path().to_path_buf(),
            commands: None,
            token: None,
            allowed_hosts: Vec::new(),
            commits: Some(store.commits()),
        }));
        let (status, body) = ask(&router, "get", "/api/v1/trial-columns").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            answer["parameters"],
            serde_json::json!({
                "opt/_name": ["sgd", "sgd"],
                "opt/lr": [0.5, 0.25],
                "opt.lr": [5.5, 5.25],
                "opt~1lr": [7.5, 7.25],
                "__proto__": [[1, 2], [3, 4]],
            }),
            "{body}"
        );
        assert_eq!(
            answer["parameter_paths"],
            serde_json::json!({
                "opt/_name": ["opt", "_name"],
                "opt/lr": ["opt", "lr"],
                "opt.lr": ["opt.lr"],
                "opt~1lr": ["opt/lr"],
                "__proto__": ["__proto__"],
            }),
            "{body}"
        );
    }

    /// Every route that shows trials says whether each ranks (`objectives::Ranking`), and the
    /// experiment's best trials are those (H12 F1): not a final of a trial that then failed,
    /// nor one with a NaN objective; a tie goes to the earlier trial.
    #[tokio::test]
    async fn trials_say_whether_they_rank_and_the_best_are_those_that_do() {
        use crate::store::{MetricKind, StoreEvent, TrialStatus};
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let config = serde_json::json!({"trialConcurrency": 1, "objectives": [
            {"metric": "a", "mode": "maximize"}, {"metric": "b", "mode": "minimize"}]});
        let mut events = vec![StoreEvent::ExperimentCreated {
            experiment_id: "ranks".to_string(),
            config,
            start_time_ms: 0,
        }];
        // (id, a, b, status): a is the number the store records.
        let trials = [
            ("failed", 9.0, "1", TrialStatus::Failed),
            ("nan-b", 8.0, "NaN", TrialStatus::Succeeded),
            ("first", 5.0, "2", TrialStatus::Succeeded),
            ("tied", 5.0, "1", TrialStatus::Succeeded),
        ];
        for (sequence, (id, a, b, status)) in trials.iter().enumerate() {
            let trial_id = id.to_string();
            events.extend([
                StoreEvent::TrialCreated {
                    trial_id: trial_id.clone(),
                    sequence: sequence as u64,
                    parameter_id: sequence as u64,
                    parameter_label: None,
                    parameters: serde_json::json!({}),
                    lineage: None,
                },
                StoreEvent::TrialStarted {
                    trial_id: trial_id.clone(),
                    attempt: 1,
                    environment_id: "env".to_string(),
                    gpu_indices: Vec::new(),
                    pid: None,
                },
                StoreEvent::Metric {
                    trial_id: trial_id.clone(),
                    attempt: 1,
                    kind: MetricKind::Final,
                    trial_sequence: 0,
                    raw: format!(r#"{{"a": {a}, "b": {b}}}"#),
                    value: Some(*a),
                },
                StoreEvent::TrialEnded {
                    trial_id,
                    attempt: 1,
                    status: *status,
                    exit_code: Some(0),
                    signal: None,
                    message: None,
                    stderr_tail: None,
                    peak_memory_mib: None,
                    peak_gpu_memory_mib: None,
                    ended_ms: None,
                },
            ]);
        }
        for event in events {
            store.append(event).await.unwrap();
        }
        let router = router(ApiState::new(ApiConfig {
            experiment_id: "ranks".to_string(),
            dir: dir.path().to_path_buf(),
            commands: None,
            token: None,
            allowed_hosts: Vec::new(),
            commits: Some(store.commits()),
        }));
        let json = |body: &str| serde_json::from_str::<serde_json::Value>(body).unwrap();
        let expected = serde_json::json!([false, false, true, true]);
        let (_, body) = ask(&router, "get", "/api/v1/trial-columns").await;
        assert_eq!(json(&body)["columns"]["ranks"], expected, "{body}");
        let (_, body) = ask(&router, "get", "/api/v1/trials").await;
        let ranks: Vec<serde_json::Value> = json(&body)["trials"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["ranks"].clone())
            .collect();
        assert_eq!(serde_json::json!(ranks), expected, "{body}");
        let (_, body) = ask(&router, "get", "/api/v1/trials/nan-b").await;
        assert_eq!(json(&body)["ranks"], false, "{body}");
        let (_, body) = ask(&router, "get", "/api/v1/experiment").await;
        let best: Vec<serde_json::Value> = json(&body)["best_trials"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["trial_id"].clone())
            .collect();
        assert_eq!(best, ["first", "tied"], "{body}");
    }

    /// `/trial-columns` of a finished list is kept while the store has no new event; a list
    /// with a running trial (whose duration grows) is never kept.
    #[tokio::test]
    async fn a_finished_trial_list_is_kept_until_the_store_changes() {
        use crate::store::{StoreEvent, TrialStatus};
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let created = |id: &str, sequence: u64| StoreEvent::TrialCreated {
            trial_id: id.to_string(),
            sequence,
            parameter_id: sequence,
            parameter_label: None,
            parameters: serde_json::json!({"x": sequence}),
            lineage: None,
        };
        let started = |id: &str| StoreEvent::TrialStarted {
            trial_id: id.to_string(),
            attempt: 1,
            environment_id: "box-1".to_string(),
            gpu_indices: vec![],
            pid: None,
        };
        let ended = |id: &str| StoreEvent::TrialEnded {
            trial_id: id.to_string(),
            attempt: 1,
            status: TrialStatus::Succeeded,
            exit_code: Some(0),
            signal: None,
            message: None,
            stderr_tail: None,
            peak_memory_mib: None,
            peak_gpu_memory_mib: None,
            ended_ms: None,
        };
        let events = [
            StoreEvent::ExperimentCreated {
                experiment_id: "kept".to_string(),
                config: serde_json::json!({"trialConcurrency": 1}),
                start_time_ms: 0,
            },
            created("a", 0),
            started("a"),
            ended("a"),
        ];
        for event in events {
            store.append(event).await.unwrap();
        }
        let state = ApiState::new(ApiConfig {
            experiment_id: "kept".to_string(),
            dir: dir.path().to_path_buf(),
            commands: None,
            token: None,
            allowed_hosts: Vec::new(),
            commits: Some(store.commits()),
        });
        let router = &router(state.clone());
        let columns = move || async move {
            let (status, body) = ask(router, "get", "/api/v1/trial-columns").await;
            assert_eq!(status, StatusCode::OK, "{body}");
            serde_json::from_str::<serde_json::Value>(&body).unwrap()
        };
        let kept_at = || {
            state
                .inner
                .trial_columns
                .lock()
                .unwrap()
                .last()
                .map(|(key, ..)| key.split(' ').next().unwrap().parse::<u64>().unwrap())
        };
        let first = columns().await;
        assert_eq!(first["count"], 1, "{first}");
        assert_eq!(kept_at(), first["last_seq"].as_u64(), "{first}");
        assert_eq!(columns().await, first);
        // A client that takes gzip gets the kept gzip, the same list.
        {
            use http_body_util::BodyExt;
            use std::io::Read;
            use tower::ServiceExt;
            let request = axum::http::Request::get("/api/v1/trial-columns")
                .header(header::ACCEPT_ENCODING, "gzip")
                .body(axum::body::Body::empty())
                .unwrap();
            let response = router.clone().oneshot(request).await.unwrap();
            assert_eq!(response.headers()[header::CONTENT_ENCODING], "gzip");
            let gzip = response.into_body().collect().await.unwrap().to_bytes();
            let mut text = String::new();
            flate2::read::GzDecoder::new(&gzip[..])
                .read_to_string(&mut text)
                .unwrap();
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&text).unwrap(),
                first
            );
        }
        // The first page is kept beside the whole list, not instead of it.
        let (status, page) = ask(router, "get", "/api/v1/trial-columns?offset=0&limit=50").await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(state.inner.trial_columns.lock().unwrap().len(), 2);

        // A new trial, running: the answer has it, and is not kept.
        store.append(created("b", 1)).await.unwrap();
        store.append(started("b")).await.unwrap();
        let running = columns().await;
        assert_eq!(running["count"], 2, "{running}");
        assert_eq!(running["columns"]["status"][1], "RUNNING", "{running}");
        assert!(running["last_seq"].as_u64() > first["last_seq"].as_u64());
        assert_eq!(kept_at(), first["last_seq"].as_u64());

        // It ends: the new answer is kept.
        store.append(ended("b")).await.unwrap();
        let done = columns().await;
        assert_eq!(done["columns"]["status"][1], "SUCCEEDED", "{done}");
        assert_eq!(kept_at(), done["last_seq"].as_u64(), "{done}");
        assert_eq!(columns().await, done);
    }

    /// A write body over its route's limit gets a JSON 413 naming the limit; the search-space
    /// route takes a space larger than the others' limit; `openapi.yaml` states both limits.
    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_in_json_naming_the_limit() {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let router = router(ApiState::new(ApiConfig {
            experiment_id: "big".to_string(),
            dir: dir.path().to_path_buf(),
            commands: None,
            token: None,
            allowed_hosts: Vec::new(),
            commits: Some(store.commits()),
        }));
        // Valid JSON of `size` bytes: an object with one long string.
        let json_of = |size: usize| format!("{{\"x\": \"{}\"}}", "a".repeat(size - 9));
        let send = |method: &str, path: &str, body: String, declared: bool| {
            let mut request = axum::http::Request::builder()
                .method(method)
                .uri(path)
                .header(header::CONTENT_TYPE, "application/json");
            if declared {
                request = request.header(header::CONTENT_LENGTH, body.len());
            }
            let request = request.body(axum::body::Body::from(body)).unwrap();
            let router = router.clone();
            async move {
                let response = router.oneshot(request).await.unwrap();
                let status = response.status();
                let kind = response.headers()[header::CONTENT_TYPE].clone();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, kind, String::from_utf8_lossy(&body).into_owned())
            }
        };
        let over = json_of(writes::BODY_LIMIT + 1);
        for declared in [true, false] {
            let (status, kind, body) = send("POST", "/api/v1/trials", over.clone(), declared).await;
            assert_eq!(
                (status, kind.to_str().unwrap()),
                (StatusCode::PAYLOAD_TOO_LARGE, "application/json"),
                "{body}"
            );
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&body).unwrap()["error"],
                "the request body is over 2 MiB, the most POST /api/v1/trials takes"
            );
        }
        let (status, _, body) = send("PATCH", "/api/v1/experiment", over.clone(), true).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
        assert!(
            body.contains("2 MiB")
                && body.contains("up to 64 MiB through PUT /api/v1/experiment/search-space"),
            "{body}"
        );
        // Far over: refused from its Content-Length alone.
        let far = json_of(2 * writes::BODY_LIMIT + 1);
        let (status, _, body) = send("POST", "/api/v1/trials", far, true).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
        // The search-space route reads the space (and then says this server cannot apply it).
        let (status, _, body) = send("PUT", "/api/v1/experiment/search-space", over, true).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(body.contains("experiment is not running"), "{body}");
        let over = json_of(writes::SEARCH_SPACE_BODY_LIMIT + 1);
        let (status, _, body) = send("PUT", "/api/v1/experiment/search-space", over, true).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
        assert!(body.contains("over 64 MiB"), "{body}");

        for limit in [writes::BODY_LIMIT, writes::SEARCH_SPACE_BODY_LIMIT] {
            let stated = format!("{} MiB", limit >> 20);
            assert!(
                OPENAPI_YAML.contains(&stated),
                "openapi.yaml does not state {stated}"
            );
        }
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
