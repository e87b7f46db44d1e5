//! A small client of a running experiment's HTTP API (port from the registry, 127.0.0.1).

use std::time::Duration;

use anyhow::Context;
use knob_core::registry::RegistryEntry;
use serde_json::Value;

pub struct ApiClient {
    base: String,
    agent: ureq::Agent,
    token: Option<String>,
}

impl ApiClient {
    /// The API of the experiment, if a live process serves one.
    pub fn for_running(entry: &RegistryEntry) -> Option<ApiClient> {
        entry.running_pid()?;
        let port = entry.port?;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Some(ApiClient {
            base: format!("http://127.0.0.1:{port}/api/v1"),
            agent,
            token: std::env::var(knob_plugin_api::secrets::API_TOKEN)
                .ok()
                .filter(|t| !t.is_empty()),
        })
    }

    pub fn get(&self, path: &str) -> anyhow::Result<Value> {
        let mut request = self.agent.get(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        self.answer(path, request.call())
    }

    /// Sends `method` (POST, PATCH, PUT) with a JSON body (or none).
    pub fn send(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
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
