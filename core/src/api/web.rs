//! The dashboard: static files from `web/`, compiled into the binary (no build step).
//!
//! Each file is gzipped once per process (not once a request: ECharts alone is 1 MB, tens of
//! milliseconds of CPU that a page load would otherwise wait for) and carries an `ETag` of its
//! content, so a browser that has it revalidates in one 304 and reuses its copy, including the
//! compiled code Chromium caches for scripts it saw before.

use std::io::Write;
use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::ApiState;

/// A dashboard file: its name, content type and content.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    content: &'static str,
}

/// What is computed once per file: its `ETag` and its gzipped bytes.
struct Prepared {
    etag: String,
    gzip: Vec<u8>,
}

/// Every dashboard file.
const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        content: include_str!("../../../web/index.html"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        content: include_str!("../../../web/app.js"),
    },
    Asset {
        name: "list.html",
        content_type: "text/html; charset=utf-8",
        content: include_str!("../../../web/list.html"),
    },
    Asset {
        name: "list.js",
        content_type: "text/javascript; charset=utf-8",
        content: include_str!("../../../web/list.js"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        content: include_str!("../../../web/style.css"),
    },
    Asset {
        name: "echarts.min.js",
        content_type: "text/javascript; charset=utf-8",
        content: include_str!("../../../web/vendor/echarts.min.js"),
    },
];

/// One slot per entry of [`ASSETS`], filled on first use.
static PREPARED: [OnceLock<Prepared>; ASSETS.len()] = [const { OnceLock::new() }; ASSETS.len()];

/// The dashboard's paths, all served with GET only.
pub(super) const ROUTES: [&str; 2] = ["/", "/assets/{name}"];

pub(super) fn routes() -> Router<ApiState> {
    prepare_in_background();
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

/// Compresses every file on a thread of its own when a server starts, so the first page load
/// finds them ready (a request that comes first waits for its file only).
pub(super) fn prepare_in_background() {
    if PREPARED.iter().all(|slot| slot.get().is_some()) {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("knob-web-gzip".to_string())
        .spawn(|| {
            for index in 0..ASSETS.len() {
                prepared(index);
            }
        });
}

fn prepared(index: usize) -> &'static Prepared {
    PREPARED[index].get_or_init(|| {
        let content = ASSETS[index].content.as_bytes();
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        // Writing into a Vec cannot fail.
        let gzip = encoder
            .write_all(content)
            .and_then(|()| encoder.finish())
            .unwrap_or_default();
        Prepared {
            etag: format!("\"{:016x}-{:x}\"", fnv1a(content), content.len()),
            gzip,
        }
    })
}

/// FNV-1a, 64 bits: an `ETag` needs a hash that is the same in every process serving the same
/// file, which the standard library's hashers do not promise.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
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
    let Some(index) = ASSETS.iter().position(|a| a.name == name) else {
        return (StatusCode::NOT_FOUND, "no such file").into_response();
    };
    let asset = &ASSETS[index];
    let prepared = prepared(index);
    // `no-cache`: the browser asks every time (a newer knob serves newer files under the same
    // names), and the ETag makes the asking cheap.
    let common = [
        (header::CACHE_CONTROL, "no-cache"),
        (header::ETAG, prepared.etag.as_str()),
        (header::VARY, "Accept-Encoding"),
    ];
    if not_modified(headers, &prepared.etag) {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    if accepts_gzip(headers) && !prepared.gzip.is_empty() {
        // The compression layer leaves a response that already has a Content-Encoding alone.
        (
            common,
            [
                (header::CONTENT_TYPE, asset.content_type),
                (header::CONTENT_ENCODING, "gzip"),
            ],
            prepared.gzip.clone(),
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

        // Another file, another tag.
        let css = asset("style.css", &HeaderMap::new());
        assert_ne!(css.headers()[header::ETAG], etag.as_str());
        assert_eq!(
            asset("nope.js", &HeaderMap::new()).status(),
            StatusCode::NOT_FOUND
        );
    }
}
