//! The NNI v3 trial command channel: an HTTP server on 127.0.0.1, one URL per trial.
//!
//! It speaks what nni 3.0's trial side expects (`nni/runtime/command_channel/http.py`,
//! `trial_command_channel/v3.py`) and what NNI's own server does
//! (`ts/nni_manager/common/command_channel/http.ts`):
//!
//! - `PUT /env/<env>/<trial>` with `{"type":"request_parameter"}`: queues the trial's
//!   parameters; 200, empty body.
//! - `GET /env/<env>/<trial>`: the next queued command, held up to 1 s: 200 with
//!   `{"type":"parameter","parameter":"<NNI parameter record as JSON text>"}`, or 408 when
//!   nothing came (the client asks again at once).
//! - `PUT` with `{"type":"metric","metric":"<JSON text>"}`: the metric NNI's `trial.py` builds
//!   (see `nni_file`), whose `value` may hold NaN; 200, empty body.
//!
//! Unlike NNI, a trial's parameters are bound to the trial id in its URL (NNI 3.0 hands them
//! out first come, first served), and a request for a trial that is not running is answered
//! 404 (410 once the server is shutting down) with a one-line message, recording nothing.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::accept_pause::AcceptPause;
use crate::metrics::{excerpt, TrialRecorder, MAX_METRIC_BYTES};
use crate::nni_file::decode_nni_metric;

/// How long a GET is held when there is nothing to send (NNI's value; the client loops).
pub const LONG_POLL: Duration = Duration::from_secs(1);

/// The largest request body read. A metric is JSON text inside JSON text inside JSON, so each
/// level of escaping can grow it; the metric itself is held to [`MAX_METRIC_BYTES`].
pub const MAX_BODY_BYTES: usize = 4 * MAX_METRIC_BYTES;

/// How much of an oversized body is read and dropped before the connection is closed.
pub const MAX_DRAINED_BYTES: usize = 256 << 20;

/// One trial's end of the channel.
struct TrialChannel {
    recorder: Arc<TrialRecorder>,
    parameter_record: String,
    outgoing: Mutex<VecDeque<Value>>,
    queued: Notify,
}

#[derive(Default)]
struct Registry {
    /// (environment id, trial id) -> channel, for running trials only.
    trials: Mutex<HashMap<(String, String), Arc<TrialChannel>>>,
    closed: AtomicBool,
}

impl Registry {
    fn get(&self, env: &str, trial: &str) -> Option<Arc<TrialChannel>> {
        let trials = self.trials.lock().unwrap_or_else(|p| p.into_inner());
        trials.get(&(env.to_string(), trial.to_string())).cloned()
    }
}

/// The HTTP channel server of one service; serves every trial of every environment it runs.
pub struct ChannelServer {
    address: SocketAddr,
    registry: Arc<Registry>,
    stop: watch::Sender<bool>,
}

impl ChannelServer {
    /// Binds 127.0.0.1 on a port the OS picks and serves on `runtime`.
    pub fn start(runtime: &tokio::runtime::Handle) -> std::io::Result<ChannelServer> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener)?
        };
        let registry = Arc::new(Registry::default());
        let (stop, stopped) = watch::channel(false);
        runtime.spawn(accept_loop(listener, registry.clone(), stopped));
        Ok(ChannelServer {
            address,
            registry,
            stop,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The `NNI_TRIAL_COMMAND_CHANNEL` of a trial.
    pub fn url_for(&self, env: &str, trial: &str) -> String {
        format!(
            "http://{}/env/{}/{}",
            self.address,
            percent_encode(env),
            percent_encode(trial)
        )
    }

    /// Opens the channel of a trial about to start; `parameter_record` is what it receives.
    pub fn register(&self, env: &str, recorder: Arc<TrialRecorder>, parameter_record: String) {
        let key = (env.to_string(), recorder.trial_id().to_string());
        let channel = Arc::new(TrialChannel {
            recorder,
            parameter_record,
            outgoing: Mutex::default(),
            queued: Notify::new(),
        });
        let mut trials = self
            .registry
            .trials
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        trials.insert(key, channel);
    }

    /// Closes a trial's channel: later requests get 404.
    pub fn unregister(&self, env: &str, trial: &str) {
        let removed = {
            let mut trials = self
                .registry
                .trials
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            trials.remove(&(env.to_string(), trial.to_string()))
        };
        if let Some(channel) = removed {
            channel.queued.notify_waiters();
        }
    }

    /// Stops accepting connections and answers every held or new request with 410.
    pub fn close(&self) {
        self.registry.closed.store(true, Ordering::SeqCst);
        let _ = self.stop.send(true);
        let trials = self
            .registry
            .trials
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for channel in trials.values() {
            channel.queued.notify_waiters();
        }
    }
}

impl Drop for ChannelServer {
    fn drop(&mut self) {
        self.close();
    }
}

async fn accept_loop(
    listener: TcpListener,
    registry: Arc<Registry>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut pause = AcceptPause::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    pause.succeeded();
                    stream
                }
                // Out of file descriptors, say: the trial will retry its request.
                Err(_) => {
                    tokio::select! {
                        _ = tokio::time::sleep(pause.failed()) => {}
                        _ = stopped.changed() => return,
                    }
                    continue;
                }
            },
            _ = stopped.changed() => return,
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let registry = registry.clone();
                async move { Ok::<_, Infallible>(handle(request, &registry).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, message: impl Into<String>) -> Reply {
    let mut response = Response::new(Full::new(Bytes::from(message.into())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, "text/plain; charset=utf-8".parse().unwrap());
    response
}

fn not_running(env: &str, trial: &str) -> Reply {
    reply(
        StatusCode::NOT_FOUND,
        format!("trial {trial} is not running on environment {env}; nothing recorded"),
    )
}

fn reply_json(command: &Value) -> Reply {
    let mut response = Response::new(Full::new(Bytes::from(command.to_string())));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, "application/json".parse().unwrap());
    response
}

async fn handle(request: Request<Incoming>, registry: &Registry) -> Reply {
    let Some((env, trial)) = parse_channel_path(request.uri().path()) else {
        return reply(
            StatusCode::NOT_FOUND,
            format!(
                "{} is not a trial channel (expected /env/<environment>/<trial>)",
                request.uri().path()
            ),
        );
    };
    if registry.closed.load(Ordering::SeqCst) {
        return reply(StatusCode::GONE, "the training service is shutting down");
    }
    let Some(channel) = registry.get(&env, &trial) else {
        return not_running(&env, &trial);
    };
    match *request.method() {
        Method::GET => long_poll(&channel, registry).await,
        Method::PUT => {
            let body = match read_body(request.into_body()).await {
                Ok(body) => body,
                Err(message) => {
                    channel
                        .recorder
                        .warn(format_args!("NNI channel: {message}"));
                    return reply(StatusCode::PAYLOAD_TOO_LARGE, message);
                }
            };
            receive(&channel, &env, &body)
        }
        _ => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "a trial channel takes GET and PUT",
        ),
    }
}

/// Reads a request body of at most [`MAX_BODY_BYTES`]. A larger one is still read to its end
/// (up to [`MAX_DRAINED_BYTES`]) and dropped as it comes: nni's `requests.put` raises if the
/// connection is cut while it sends, and that would kill the trial over one oversized metric.
async fn read_body(mut body: Incoming) -> Result<Bytes, String> {
    let mut kept = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("command not read: {e}"))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len();
        if total <= MAX_BODY_BYTES {
            kept.extend_from_slice(&data);
        } else {
            kept = Vec::new();
            if total > MAX_DRAINED_BYTES {
                break;
            }
        }
    }
    if total > MAX_BODY_BYTES {
        return Err(format!(
            "command of {} KiB refused (over {} KiB; metrics must be short)",
            total / 1024,
            MAX_BODY_BYTES / 1024
        ));
    }
    Ok(Bytes::from(kept))
}

async fn long_poll(channel: &TrialChannel, registry: &Registry) -> Reply {
    let deadline = tokio::time::Instant::now() + LONG_POLL;
    loop {
        // Registered before looking at the queue, so a command queued in between still wakes us.
        let queued = channel.queued.notified();
        tokio::pin!(queued);
        queued.as_mut().enable();
        let next = channel
            .outgoing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        if let Some(command) = next {
            return reply_json(&command);
        }
        if registry.closed.load(Ordering::SeqCst) || !channel.recorder.is_running() {
            return reply(StatusCode::GONE, "the trial's channel is closed");
        }
        tokio::select! {
            _ = &mut queued => {}
            _ = tokio::time::sleep_until(deadline) => {
                return reply(StatusCode::REQUEST_TIMEOUT, "no command for the trial yet");
            }
        }
    }
}

fn receive(channel: &TrialChannel, env: &str, body: &[u8]) -> Reply {
    let refuse = |message: String| {
        channel
            .recorder
            .warn(format_args!("NNI channel: {message}"));
        reply(StatusCode::BAD_REQUEST, message)
    };
    if body.is_empty() {
        return refuse("empty command (expected a JSON object with a \"type\")".into());
    }
    let command: Value = match serde_json::from_slice(body) {
        Ok(command) => command,
        Err(e) => return refuse(format!("command {} is not JSON ({e})", excerpt(body))),
    };
    match command.get("type").and_then(Value::as_str) {
        Some("request_parameter") => {
            // Every request gets the trial's parameters: the processes of one trial (torchrun,
            // DDP: each rank calls `nni.get_next_parameter()`) cannot be told apart here, and
            // under NNI 2.x's file channel each of them reads `parameter.cfg` and gets them.
            // Answering only the first left every other rank with None.
            let parameter = channel.parameter_record.clone();
            channel
                .outgoing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(serde_json::json!({"type": "parameter", "parameter": parameter}));
            channel.queued.notify_one();
            reply(StatusCode::OK, "")
        }
        Some("metric") => {
            let Some(metric) = command.get("metric").and_then(Value::as_str) else {
                return refuse("metric command without a \"metric\" string".into());
            };
            if metric.len() > MAX_METRIC_BYTES {
                return refuse(format!(
                    "metric over {} KiB refused (metrics must be short)",
                    MAX_METRIC_BYTES / 1024
                ));
            }
            match decode_nni_metric(metric.as_bytes(), channel.recorder.trial_id()) {
                // An unreadable value is answered 200 too: what could be done with it was
                // (nni's client ignores the status anyway).
                Ok(metric) => match metric.record(&channel.recorder, "NNI channel") {
                    Ok(()) => reply(StatusCode::OK, ""),
                    // It ended while this request was on its way.
                    Err(_) => not_running(env, channel.recorder.trial_id()),
                },
                Err(why) => refuse(why),
            }
        }
        Some(other) => refuse(format!(
            "command type {other:?} is unknown (expected request_parameter or metric)"
        )),
        None => refuse(format!("command {} has no \"type\"", excerpt(body))),
    }
}

/// `/env/<env>/<trial>`, both segments percent-decoded.
fn parse_channel_path(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix("/env/")?;
    let (env, trial) = rest.split_once('/')?;
    if env.is_empty() || trial.is_empty() || trial.contains('/') {
        return None;
    }
    Some((percent_decode(env)?, percent_decode(trial)?))
}

/// Escapes everything but RFC 3986's unreserved characters, so any id fits in a URL segment.
pub fn percent_encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_paths() {
        assert_eq!(
            parse_channel_path("/env/local/Ab1"),
            Some(("local".into(), "Ab1".into()))
        );
        let url_segment = percent_encode("trial #1/é");
        assert_eq!(url_segment, "trial%20%231%2F%C3%A9");
        assert_eq!(
            parse_channel_path(&format!("/env/h%3A1/{url_segment}")),
            Some(("h:1".into(), "trial #1/é".into()))
        );
        assert_eq!(parse_channel_path("/env/local/a/b"), None);
        assert_eq!(parse_channel_path("/env/local/"), None);
        assert_eq!(parse_channel_path("/other"), None);
        assert_eq!(parse_channel_path("/env/local/%zz"), None);
    }
}
