//! The HTTP API and dashboard options of `knob create` / `knob resume`, and starting the server
//! beside the manager.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use knob_core::api::{self, ApiConfig, ApiState};
use knob_core::manager::Command;
use knob_core::store::EventSeq;
use tokio::sync::{mpsc, watch};

#[derive(clap::Args, Clone, Default)]
pub struct ServeArgs {
    /// Serve the API and dashboard on this port (default: a free port; the URL is printed).
    #[arg(long)]
    pub port: Option<u16>,
    /// Address to listen on (default 127.0.0.1); any other than loopback needs --token.
    #[arg(long)]
    pub bind: Option<IpAddr>,
    /// Require `Authorization: Bearer TOKEN` on every API request (also $KNOB_API_TOKEN).
    #[arg(long)]
    pub token: Option<String>,
    /// Also answer requests whose Host is NAME, a name or an IP such as a port forward's
    /// (besides localhost and the bound address); repeatable. Other names are refused, which
    /// stops DNS rebinding.
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allow_host: Vec<String>,
}

impl ServeArgs {
    pub fn address(&self) -> SocketAddr {
        SocketAddr::new(
            self.bind.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            self.port.unwrap_or(0),
        )
    }

    pub fn token(&self) -> Option<String> {
        self.token
            .clone()
            .or_else(|| std::env::var(knob_plugin_api::secrets::API_TOKEN).ok())
            .filter(|t| !t.is_empty())
    }

    /// Refuses a blank token, a blank or malformed `--allow-host`, and a non-loopback address
    /// without a token, before anything starts.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.token.as_ref().is_some_and(|t| t.trim().is_empty()) {
            anyhow::bail!("--token is blank: give a non-empty token, or leave --token out");
        }
        if std::env::var(knob_plugin_api::secrets::API_TOKEN)
            .is_ok_and(|t| !t.is_empty() && t.trim().is_empty())
        {
            anyhow::bail!("$KNOB_API_TOKEN is blank: set a non-empty token, or unset it");
        }
        let given = match &self.token {
            Some(token) => Some(("--token", token.clone())),
            None => std::env::var(knob_plugin_api::secrets::API_TOKEN)
                .ok()
                .map(|token| ("$KNOB_API_TOKEN", token)),
        };
        if let Some((source, token)) = given {
            if let Some(problem) = unsendable(&token) {
                anyhow::bail!(
                    "{source} {problem}, which no request can send back in its Authorization header (every one would get 401): use letters, digits and ASCII punctuation"
                );
            }
        }
        for name in &self.allow_host {
            let ip = api::allowed_ip(name).is_some();
            if name.is_empty() || !ip && name.contains([':', '/', ' ', '[', ']']) {
                anyhow::bail!(
                    "--allow-host {name:?}: give a host name or IP alone, without scheme or port (e.g. --allow-host knob.lab)"
                );
            }
        }
        api::check_bind(self.address(), self.token().as_deref())?;
        Ok(())
    }

    /// The arguments that pass these options on to a background `knob` (the token travels in
    /// the environment, not on a command line other users can read).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(port) = self.port {
            args.extend(["--port".to_string(), port.to_string()]);
        }
        if let Some(bind) = self.bind {
            args.extend(["--bind".to_string(), bind.to_string()]);
        }
        for name in &self.allow_host {
            args.extend(["--allow-host".to_string(), name.clone()]);
        }
        args
    }

    /// Binds the listener (synchronously, so a taken port fails before the manager starts).
    pub fn bind(&self) -> anyhow::Result<std::net::TcpListener> {
        self.check()?;
        let address = self.address();
        let listener = std::net::TcpListener::bind(address).map_err(|error| {
            let advice = match error.kind() {
                std::io::ErrorKind::AddrInUse => {
                    "; another process serves that port: give another --port, or leave --port out for a free one"
                }
                std::io::ErrorKind::AddrNotAvailable => {
                    "; this machine has no such address: --bind one of its own (`ip -brief address`), or leave --bind out for 127.0.0.1"
                }
                std::io::ErrorKind::PermissionDenied if address.port() < 1024 => {
                    "; a port below 1024 needs root: give --port 1024 or above, or leave --port out for a free one"
                }
                _ => "",
            };
            anyhow::anyhow!("cannot serve the API on {address}: {error}{advice}")
        })?;
        listener.set_nonblocking(true)?;
        // Once this process is sure to serve (a `--detach` hands the token to its background
        // `knob` in the environment): the token stays in this command line while it runs.
        if self.token.is_some() {
            errln!(
                "warning: --token shows the token to every user of this machine (ps, /proc/PID/cmdline) for as long as knob runs; export {} instead",
                knob_plugin_api::secrets::API_TOKEN
            );
        }
        Ok(listener)
    }
}

/// What makes a token impossible to present, if anything. A header value is visible ASCII
/// (`HeaderValue::to_str` refuses anything else, and a browser's `fetch` throws on it), and the
/// server trims the spaces around a Bearer token, as HTTP trims those of every header value.
/// The token itself is not named: it is a secret.
fn unsendable(token: &str) -> Option<&'static str> {
    if token.trim() != token {
        Some("begins or ends with a space")
    } else if token.chars().any(|c| c.is_ascii_control()) {
        Some("holds a control character")
    } else if !token.is_ascii() {
        Some("holds a character beyond ASCII")
    } else {
        None
    }
}

/// The URL a browser on this machine opens.
pub fn dashboard_url(address: SocketAddr) -> String {
    let host = if address.ip().is_unspecified() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        address.ip()
    };
    format!("http://{}/", SocketAddr::new(host, address.port()))
}

/// Starts serving on the current tokio runtime; the task ends with the runtime. `commits` is
/// the store's commit watch when this process writes the store (see `ApiConfig::commits`).
pub fn spawn_api(
    listener: std::net::TcpListener,
    experiment_id: String,
    dir: PathBuf,
    commands: Option<mpsc::UnboundedSender<Command>>,
    commits: Option<watch::Receiver<EventSeq>>,
    serve: &ServeArgs,
) -> anyhow::Result<(tokio::task::JoinHandle<()>, ApiState)> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let state = ApiState::new(ApiConfig {
        experiment_id,
        dir,
        commands,
        token: serve.token(),
        allowed_hosts: serve.allow_host.clone(),
        commits,
    });
    if let Some(reason) = state.live_unavailable() {
        errln!("warning: the dashboard will not update live: {reason}");
    }
    let served = state.clone();
    Ok((
        tokio::spawn(async move {
            if let Err(e) = api::serve(listener, served).await {
                errln!("error: {e}");
            }
        }),
        state,
    ))
}
