//! A small client of a running experiment's HTTP API (its address from the registry).

use std::time::Duration;

use anyhow::Context;
use knob_core::registry::RegistryEntry;
use knob_plugin_api::secrets::API_TOKEN;
use serde_json::Value;

pub struct ApiClient {
    base: String,
    agent: ureq::Agent,
    /// From `KNOB_API_TOKEN` (empty is unset).
    token: Option<String>,
    /// The experiment's id, which a refusal names.
    experiment: String,
    /// The process serving the API.
    pid: u32,
}

/// Whether process `pid` is stopped (suspended by Ctrl-Z in its terminal or SIGSTOP, or held by
/// a debugger): state `T` or `t`, the field after the command name in `/proc/PID/stat`.
fn suspended(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The command name (field 2) may hold spaces and parentheses: the state follows the
        // last ')'.
        stat.rfind(')')
            .and_then(|end| stat[end + 1..].split_whitespace().next())
            .is_some_and(|state| matches!(state, "T" | "t"))
    })
}

/// `text` as one segment of a URL path, percent-encoded (RFC 3986): every byte but the
/// unreserved ones, and the dots of a segment of dots alone, which a path would otherwise read as
/// "this folder" or "the one above". A trial id `../x` must reach the API as one id, not move
/// the request to another route.
pub fn path_segment(text: &str) -> String {
    let dots_only = text.bytes().all(|b| b == b'.');
    let mut segment = String::with_capacity(text.len());
    for byte in text.bytes() {
        let plain = byte.is_ascii_alphanumeric()
            || matches!(byte, b'-' | b'_' | b'~')
            || (byte == b'.' && !dots_only);
        if plain {
            segment.push(char::from(byte));
        } else {
            segment.push_str(&format!("%{byte:02X}"));
        }
    }
    segment
}

impl ApiClient {
    /// The API of the experiment, if a live process serves one.
    pub fn for_running(entry: &RegistryEntry) -> Option<ApiClient> {
        let pid = entry.running_pid()?;
        let address = entry.api_address()?;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Some(ApiClient {
            base: format!("http://{address}/api/v1"),
            agent,
            token: std::env::var(API_TOKEN).ok().filter(|t| !t.is_empty()),
            experiment: entry.id.clone(),
            pid,
        })
    }

    /// A suspended process accepts the connection (the kernel does) and never answers: a
    /// request waited its whole minute, then said only "timeout". Said at once instead, with
    /// what to do.
    fn refuse_suspended(&self) -> anyhow::Result<()> {
        if suspended(self.pid) {
            let (id, pid) = (&self.experiment, self.pid);
            anyhow::bail!(
                "experiment {id}'s process {pid} is suspended (Ctrl-Z in its terminal, or SIGSTOP), so its API cannot answer; `kill -CONT {pid}` (or `fg` in its terminal) continues it, `knob stop {id}` stops it"
            );
        }
        Ok(())
    }

    pub fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.refuse_suspended()?;
        let mut request = self.agent.get(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        self.answer(path, request.call())
    }

    /// Sends `method` (POST, PATCH, PUT) with a JSON body (or none).
    pub fn send(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        self.refuse_suspended()?;
        let url = format!("{}{path}", self.base);
        let mut request = match method {
            "PATCH" => self.agent.patch(url),
            "PUT" => self.agent.put(url),
            _ => self.agent.post(url),
        };
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        // The API takes writes only as JSON, bodiless ones included (see `core::api::guard`).
        let request = request.header("Content-Type", "application/json");
        let response = match body {
            Some(body) => request.send_json(body),
            None => request.send_empty(),
        };
        self.answer(path, response)
    }

    fn answer(
        &self,
        path: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> anyhow::Result<Value> {
        if response.is_err() {
            // Suspended while it was asked.
            self.refuse_suspended()?;
        }
        let mut response = response
            .with_context(|| format!("cannot reach the experiment's API at {}", self.base))?;
        let status = response.status();
        let text = response
            .body_mut()
            .read_to_string()
            .with_context(|| format!("reading the answer to {path}"))?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            Ok(value)
        } else if status == ureq::http::StatusCode::UNAUTHORIZED {
            // The server's own line tells an HTTP client what header to send; a user of these
            // commands sets the variable they read.
            let experiment = &self.experiment;
            if self.token.is_some() {
                anyhow::bail!("${API_TOKEN} is set, but not to experiment {experiment}'s API token: set it to the token the experiment was started with (HTTP 401)")
            }
            anyhow::bail!("experiment {experiment} needs its API token: set ${API_TOKEN} to the token it was started with (--token) (HTTP 401)")
        } else {
            let message = value
                .get("error")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string());
            anyhow::bail!("{message} (HTTP {})", status.as_u16())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::path_segment;

    #[test]
    fn a_path_segment_is_percent_encoded() {
        assert_eq!(path_segment("trial-1_a~b.c"), "trial-1_a~b.c");
        assert_eq!(path_segment("../x"), "..%2Fx");
        assert_eq!(path_segment(".."), "%2E%2E");
        assert_eq!(path_segment("a b?c#d%"), "a%20b%3Fc%23d%25");
        assert_eq!(path_segment("é"), "%C3%A9");
    }
}
