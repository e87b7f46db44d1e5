//! The dashboard: static files from `web/`, compiled into the binary.
//!
//! Each file is gzipped at build time (`core/build.rs`: not once a request, since ECharts alone
//! is 1 MB, tens of milliseconds of CPU that a page load would otherwise wait for, nor once a
//! process, which every `knob create` paid at its start beside its first trials) and carries
//! an `ETag` of its content, so a browser that has it revalidates in one 304 and reuses its
//! copy, including the compiled code Chromium caches for scripts it saw before.

use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::ApiState;

/// A dashboard file: its name, content type, content, gzipped content and `ETag`.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    content: &'static str,
    gzip: &'static [u8],
    etag: &'static str,
}

/// Every dashboard file, as `build.rs` lists and compresses them.
const ASSETS: &[Asset] = include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));

/// The dashboard's paths, all served with GET only.
pub(super) const ROUTES: [&str; 2] = ["/", "/assets/{name}"];

pub(super) fn routes() -> Router<ApiState> {
    Router::new()
        .route(
            ROUTES[0],
            get(|headers: HeaderMap| async move { asset("index.html", &headers) }),
        )
        .route(
            ROUTES[1],
            get(|Path(name): Path<String>, headers: HeaderMap| async move {
                asset(&name, &headers)
            }),
        )
}

/// Whether `Accept-Encoding` allows gzip (`gzip` or `*`, not refused with `q=0`).
pub(super) fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// Whether `If-None-Match` names `etag` (or is `*`).
fn not_modified(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == etag || tag == "*")
}

pub(super) fn asset(name: &str, headers: &HeaderMap) -> Response {
    let Some(asset) = ASSETS.iter().find(|a| a.name == name) else {
        return (StatusCode::NOT_FOUND, "no such file").into_response();
    };
    // `no-cache`: the browser asks every time (a newer knob serves newer files under the same
    // names), and the ETag makes the asking cheap.
    let common = [
        (header::CACHE_CONTROL, "no-cache"),
        (header::ETAG, asset.etag),
        (header::VARY, "Accept-Encoding"),
    ];
    if not_modified(headers, asset.etag) {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    if accepts_gzip(headers) {
        // The compression layer leaves a response that already has a Content-Encoding alone.
        (
            common,
            [
                (header::CONTENT_TYPE, asset.content_type),
                (header::CONTENT_ENCODING, "gzip"),
            ],
            Bytes::from_static(asset.gzip),
        )
            .into_response()
    } else {
        (
            common,
            [(header::CONTENT_TYPE, asset.content_type)],
            asset.content,
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::io::Read;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    async fn body(response: Response) -> Vec<u8> {
        use http_body_util::BodyExt;
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    #[tokio::test]
    async fn files_come_gzipped_when_asked_and_revalidate_with_their_etag() {
        let plain = asset("app.js", &HeaderMap::new());
        assert_eq!(plain.status(), StatusCode::OK);
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
        let etag = plain.headers()[header::ETAG].to_str().unwrap().to_string();
        assert_eq!(body(plain).await, ASSETS[1].content.as_bytes());

        let gzipped = asset(
            "app.js",
            &headers(&[(header::ACCEPT_ENCODING, "br, gzip;q=0.8")]),
        );
        assert_eq!(gzipped.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(gzipped.headers()[header::ETAG], etag.as_str());
        let mut unzipped = String::new();
        flate2::read::GzDecoder::new(body(gzipped).await.as_slice())
            .read_to_string(&mut unzipped)
            .unwrap();
        assert_eq!(unzipped, ASSETS[1].content);

        let refused = asset("app.js", &headers(&[(header::ACCEPT_ENCODING, "gzip;q=0")]));
        assert!(refused.headers().get(header::CONTENT_ENCODING).is_none());

        let again = asset(
            "app.js",
            &headers(&[(header::IF_NONE_MATCH, &format!("\"other\", {etag}"))]),
        );
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert!(body(again).await.is_empty());
        let stale = asset("app.js", &headers(&[(header::IF_NONE_MATCH, "\"other\"")]));
        assert_eq!(stale.status(), StatusCode::OK);

        // Every file's gzipped bytes are its content; each has its own tag.
        for file in ASSETS {
            let mut unzipped = String::new();
            flate2::read::GzDecoder::new(file.gzip)
                .read_to_string(&mut unzipped)
                .unwrap();
            assert!(unzipped == file.content, "{}", file.name);
            assert!(file.etag.ends_with(&format!("-{:x}\"", file.content.len())));
        }
        let mut tags: Vec<&str> = ASSETS.iter().map(|a| a.etag).collect();
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), ASSETS.len());
        // Another file, another tag.
        let css = asset("style.css", &HeaderMap::new());
        assert_ne!(css.headers()[header::ETAG], etag.as_str());
        assert_eq!(
            asset("nope.js", &HeaderMap::new()).status(),
            StatusCode::NOT_FOUND
        );
    }
}
