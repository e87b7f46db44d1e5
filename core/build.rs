//! Gzips the dashboard's files (`web/`) at build time, so that no process pays for it: at
//! `Compression::best()` ECharts alone took tens of milliseconds of CPU, which every `knob
//! create` spent at its start (on a thread of its own, beside the experiment's first trials)
//! whether or not anyone opened the dashboard. Writes `web_assets.rs` into `OUT_DIR`: the
//! `ASSETS` table of `src/api/web.rs`, each file with its content, gzipped bytes and `ETag`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Every dashboard file: the name it is served under, its path below `web/` and content type.
const FILES: &[(&str, &str, &str)] = &[
    ("index.html", "index.html", "text/html; charset=utf-8"),
    ("app.js", "app.js", "text/javascript; charset=utf-8"),
    ("list.html", "list.html", "text/html; charset=utf-8"),
    ("list.js", "list.js", "text/javascript; charset=utf-8"),
    ("style.css", "style.css", "text/css; charset=utf-8"),
    (
        "echarts.min.js",
        "vendor/echarts.min.js",
        "text/javascript; charset=utf-8",
    ),
];

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let web = manifest.join("../web");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let mut table = String::from("&[\n");
    for (name, path, content_type) in FILES {
        let source = web.join(path);
        println!("cargo::rerun-if-changed={}", source.display());
        let content = std::fs::read(&source)
            .unwrap_or_else(|e| panic!("cannot read the dashboard file {}: {e}", source.display()));
        let gzip_path = out.join(format!("{name}.gz"));
        write_gzip(&content, &gzip_path);
        writeln!(
            table,
            "    Asset {{ name: {name:?}, content_type: {content_type:?}, \
             content: include_str!({source:?}), gzip: include_bytes!({gzip_path:?}), \
             etag: {etag:?} }},",
            source = absolute(&source),
            gzip_path = absolute(&gzip_path),
            etag = format!("\"{:016x}-{:x}\"", fnv1a(&content), content.len()),
        )
        .expect("writing to a String cannot fail");
    }
    table.push(']');
    std::fs::write(out.join("web_assets.rs"), table).expect("cannot write OUT_DIR/web_assets.rs");
}

fn write_gzip(content: &[u8], to: &Path) {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder
        .write_all(content)
        .expect("writing to a Vec cannot fail");
    let gzip = encoder.finish().expect("writing to a Vec cannot fail");
    std::fs::write(to, gzip).unwrap_or_else(|e| panic!("cannot write {}: {e}", to.display()));
}

/// A path for `include_str!` / `include_bytes!` in the generated file, whatever the build's
/// current folder.
fn absolute(path: &Path) -> String {
    std::path::absolute(path)
        .expect("an absolute path")
        .to_str()
        .expect("the build's paths are UTF-8")
        .to_string()
}

/// FNV-1a, 64 bits: an `ETag` needs a hash that is the same in every build of the same file,
/// which the standard library's hashers do not promise.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
