//! The dashboard: static files from `web/`, compiled into the binary (no build step).

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::ApiState;

/// (name, content type, content) of every dashboard file.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../../web/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../web/app.js"),
    ),
    (
        "list.html",
        "text/html; charset=utf-8",
        include_str!("../../../web/list.html"),
    ),
    (
        "list.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../web/list.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../../web/style.css"),
    ),
    (
        "echarts.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../web/vendor/echarts.min.js"),
    ),
];

/// The dashboard's paths, all served with GET only.
pub(super) const ROUTES: [&str; 2] = ["/", "/assets/{name}"];

pub(super) fn routes() -> Router<ApiState> {
    Router::new()
        .route(ROUTES[0], get(|| async { asset("index.html") }))
        .route(
            ROUTES[1],
            get(|Path(name): Path<String>| async move { asset(&name) }),
        )
}

pub(super) fn asset(name: &str) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, content)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *content,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}
