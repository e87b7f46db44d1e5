//! What keeps a web page in the user's browser away from the API it can reach on loopback.
//!
//! Two attacks need no token when none is set (the default on loopback):
//! - DNS rebinding: a page on `evil.example` makes its name resolve to 127.0.0.1 and then reads
//!   the API as same-origin. Its requests still carry `Host: evil.example`, so every request
//!   must name this server ([`host_allowed`]).
//! - Cross-site writes: a page may POST a form or `text/plain` to any address without a CORS
//!   preflight. Writes must therefore be `application/json` (which a cross-site page can only
//!   send after a preflight this server never grants) and, when the browser says where they come
//!   from (`Origin`), come from the dashboard itself ([`check_write`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;

/// The host part of a `Host` header (`name`, `1.2.3.4`, `[::1]`, each with an optional
/// `:port`), without brackets; `None` when it is not of that form.
fn host_name(host: &str) -> Option<&str> {
    if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port_ok = after.is_empty()
            || after
                .strip_prefix(':')
                .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()));
        return port_ok.then_some(inside);
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        Some(_) => return None,
        None => host,
    };
    (!name.is_empty() && !name.contains(':')).then_some(name)
}

/// Whether a request whose `Host` header is `host` may be answered by a server bound to `bound`:
/// `localhost`, the bound address, or one of `names` (`--allow-host`: a name, or an IP such as
/// the address of a port forward to this server). On an unspecified bind (`0.0.0.0`, `::`) any
/// IP literal is this machine's: a browser sends an IP as `Host` only for a page whose own
/// origin is that IP, so it cannot be a rebinding.
pub fn host_allowed(host: &str, bound: IpAddr, names: &[String]) -> bool {
    let Some(name) = host_name(host) else {
        return false;
    };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Ok(ip) = name.parse::<IpAddr>() {
        return bound.is_unspecified()
            || ip == bound
            || names.iter().any(|allowed| allowed_ip(allowed) == Some(ip));
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    names
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(name))
}

/// The IP an `--allow-host` value names, if it is one (`10.0.0.5`, `::1` or `[::1]`).
pub fn allowed_ip(name: &str) -> Option<IpAddr> {
    let bare = name
        .strip_prefix('[')
        .and_then(|inside| inside.strip_suffix(']'))
        .unwrap_or(name);
    bare.parse().ok()
}

/// What [`check_host`] needs: where the server listens and the extra names it answers to.
pub(super) struct HostRule {
    pub bound: SocketAddr,
    pub names: Vec<String>,
}

fn requested_host(request: &Request) -> Option<&str> {
    match request.headers().get(header::HOST) {
        Some(value) => value.to_str().ok(),
        None => request.uri().authority().map(|a| a.as_str()),
    }
}

/// Refuses (403) a request that names another host than this server: see [`host_allowed`].
pub(super) async fn check_host(
    State(rule): State<Arc<HostRule>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(host) = requested_host(&request) else {
        return ApiError::bad_request("the request names no Host").into_response();
    };
    if !host_allowed(host, rule.bound.ip(), &rule.names) {
        let port = rule.bound.port();
        return ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "Host {host:?} is not this server's: use localhost:{port} or the address knob printed, or start knob with --allow-host NAME for a name that reaches it"
            ),
        )
        .into_response();
    }
    next.run(request).await
}

/// Whether `origin` is the dashboard served as `host` (http, or https behind a proxy).
fn same_origin(origin: &str, host: &str) -> bool {
    ["http://", "https://"].iter().any(|scheme| {
        origin
            .get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
            && origin[scheme.len()..].eq_ignore_ascii_case(host)
    })
}

/// Why a write (any method but GET and HEAD) is refused, if it is: an `Origin` that is not the
/// dashboard's own (403), or a body that is not declared `application/json` (415).
fn write_refusal(method: &Method, headers: &HeaderMap) -> Option<ApiError> {
    if method == Method::GET || method == Method::HEAD {
        return None;
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if !same_origin(origin, host) {
            return Some(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "cross-origin write refused: Origin {origin:?} is not this dashboard's (http://{host})"
                ),
            ));
        }
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let essence = content_type
        .as_deref()
        .and_then(|t| t.split(';').next())
        .map(str::trim);
    if !essence.is_some_and(|e| e.eq_ignore_ascii_case("application/json")) {
        return Some(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "a write needs Content-Type: application/json, got {}",
                content_type.as_deref().unwrap_or("none")
            ),
        ));
    }
    None
}

/// Applies [`write_refusal`] to a request routed to a write.
pub(super) async fn check_write(request: Request, next: Next) -> Response {
    match write_refusal(request.method(), request.headers()) {
        Some(refusal) => refusal.into_response(),
        None => next.run(request).await,
    }
}

/// The token of an `Authorization` header of the `Bearer` scheme, whose name is
/// case-insensitive (RFC 9110 §11.1).
pub(super) fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Whether `path` is an instance of the route `template` (`{param}` matches one segment).
fn route_matches(template: &str, path: &str) -> bool {
    let mut given = path.split('/');
    template.split('/').all(|part| {
        given
            .next()
            .is_some_and(|seg| part == seg || (part.starts_with('{') && !seg.is_empty()))
    }) && given.next().is_none()
}

/// The methods `path` is served with, upper case, by `routes` ((method, template) pairs).
pub(super) fn allowed_methods<'a>(
    routes: impl IntoIterator<Item = (&'a str, &'a str)>,
    path: &str,
) -> Vec<String> {
    let mut allowed: Vec<String> = Vec::new();
    for (method, template) in routes {
        if route_matches(template, path) {
            let method = method.to_ascii_uppercase();
            if method == "GET" {
                allowed.push("HEAD".to_string());
            }
            allowed.push(method);
        }
    }
    allowed.sort();
    allowed.dedup();
    allowed
}

/// Forbids every page of this server to be put in a frame of another site (`X-Frame-Options`
/// for older browsers, CSP `frame-ancestors` for the rest): a hostile page could otherwise load
/// the dashboard, which is same-origin with the API and passes every check above, in an
/// invisible frame and have the user click its Stop or Kill (clickjacking). The dashboard
/// frames nothing of its own.
pub(super) async fn forbid_framing(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::X_FRAME_OPTIONS,
        header::HeaderValue::from_static("DENY"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static("frame-ancestors 'none'"),
    );
    response
}

/// The (method, path template) pairs a server answers, lower case as in OpenAPI: what its
/// 405s list.
pub(super) type RouteTable = fn() -> Vec<(&'static str, &'static str)>;

/// axum answers a method a path does not serve with an empty 405 (and, as knob builds its
/// routes one operation at a time, without `Allow`); this one says what `routes` allow. A 405
/// with `Allow` is explained already, by the router of an experiment that `knob view`'s list
/// serves under `/e/ID/`, whose routes the list's table does not hold.
pub(super) async fn explain_method_not_allowed(
    State(routes): State<RouteTable>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    if response.status() != StatusCode::METHOD_NOT_ALLOWED
        || response.headers().contains_key(header::ALLOW)
    {
        return response;
    }
    let allowed = allowed_methods(routes(), &path).join(", ");
    let mut explained = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {path}; allowed: {allowed}"),
    )
    .into_response();
    if let Ok(value) = header::HeaderValue::from_str(&allowed) {
        explained.headers_mut().insert(header::ALLOW, value);
    }
    explained
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_the_bound_address_localhost_or_a_configured_name() {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        let names = vec!["knob.lab".to_string()];
        for host in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "localhost:8080",
            "LocalHost",
            "knob.lab:1",
            "KNOB.lab.",
        ] {
            assert!(host_allowed(host, loopback, &names), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.2:8080",
            "[::1]:8080",
            "localhost.evil.example",
            "",
            ":80",
            "127.0.0.1:80x",
            "a:b:c",
        ] {
            assert!(!host_allowed(host, loopback, &names), "{host}");
        }
        assert!(host_allowed("[::1]:8080", "::1".parse().unwrap(), &[]));
        assert!(host_allowed("192.168.1.5:8080", any, &[]));
        assert!(!host_allowed("evil.example:8080", any, &[]));
        // An IP given to --allow-host (where a port forward listens) is answered as a name is.
        let forwarded = vec!["10.0.0.5".to_string(), "[fd00::7]".to_string()];
        assert!(host_allowed("10.0.0.5:9000", loopback, &forwarded));
        assert!(host_allowed("[fd00::7]:9000", loopback, &forwarded));
        assert!(!host_allowed("10.0.0.6:9000", loopback, &forwarded));
    }

    #[test]
    fn allowed_methods_come_from_the_route_table() {
        let routes = [
            ("get", "/api/v1/trials/{trial_id}"),
            ("post", "/api/v1/trials/{trial_id}/kill"),
            ("patch", "/api/v1/experiment"),
            ("get", "/api/v1/experiment"),
        ];
        assert_eq!(allowed_methods(routes, "/api/v1/trials/7"), ["GET", "HEAD"]);
        assert_eq!(allowed_methods(routes, "/api/v1/trials/7/kill"), ["POST"]);
        assert_eq!(
            allowed_methods(routes, "/api/v1/experiment"),
            ["GET", "HEAD", "PATCH"]
        );
        assert!(allowed_methods(routes, "/api/v1/trials/").is_empty());
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearerabc"), None);
    }

    #[test]
    fn an_origin_is_the_dashboards_when_it_names_the_requested_host() {
        assert!(same_origin("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(same_origin("HTTPS://Knob.Lab", "knob.lab"));
        assert!(!same_origin("http://evil.example", "127.0.0.1:8080"));
        assert!(!same_origin("null", "127.0.0.1:8080"));
        assert!(!same_origin("http://127.0.0.1:8080", ""));
    }
}
