//! The host side: find plugin libraries, load them, and run their components.
//!
//! Loading is four checks, each with its own one-line error: the file's ELF headers, program
//! headers and dynamic section lie within it, and the offsets and indexes in the tables it points
//! to within the library ([`precheck`], before `dlopen`, which would die of SIGBUS on a truncated
//! file and of SIGSEGV on such damage; a damaged value that still points inside passes);
//! `dlopen` takes it; it exports `knob_plugin_api_version` (else it
//! is not a knob plugin) and `knob_plugin_abi_version`, as functions (one exported as data would
//! be called all the same: SIGSEGV), with a compatible ABI version (see
//! [`check_abi_compatible`]); abi_stable finds the root module's layout identical to ours, or to
//! an earlier one of the same major ABI version (`abi::earlier_layouts`); it exports each (kind,
//! name) once, ignoring case (`check_distinct_names`). The full abi_stable report of a
//! layout mismatch goes to the debug log, the one line names the type.
//!
//! Each component object then runs on a thread of its own ([`TunerHandle`] and friends): the
//! async core awaits replies on channels and is never blocked by a slow or stuck plugin.

mod in_plugin;
pub mod in_process;
mod nni_names;
mod objects;
pub mod precheck;

pub use nni_names::{
    is_nni_dispatcher, nni_algorithm, NniAlgorithm, NNI_ALGORITHMS, NNI_DISPATCHER_ASSESSOR,
    NNI_DISPATCHER_TUNER,
};
#[cfg(test)]
pub(crate) use objects::unknown_request;
use objects::PluginThread;
pub use objects::{
    AssessorHandle, AssessorObject, EnvironmentReport, Reply, TrainingServiceHandle,
    TrainingServiceObject, TunerHandle, TunerObject,
};

use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use abi_stable::library::{lib_header_from_path, LibraryError};
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RStr, RString};
use serde_json::Value;

use crate::abi::{
    AbiComponentKind, AbiLogLevel, EventSinkAbi, EventSinkAbi_TO, HostLoggerAbi, HostLoggerAbi_TO,
    PluginModuleRef, ABI_VERSION_SYMBOL, API_VERSION_SYMBOL,
};
use crate::service::{ConfigCheck, ServiceContext, ServiceEvent};
use crate::ComponentKind;

/// Everything that can go wrong between the host and a plugin, one line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("{}: {reason}", path.display())]
    Load { path: PathBuf, reason: String },
    #[error("{kind} {name} is exported by two plugins: {} and {}; remove one of them from the plugin path", first.display(), second.display())]
    Duplicate {
        kind: ComponentKind,
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("unknown {kind} {name}{hint}; available: {available}{searched}")]
    Unknown {
        kind: ComponentKind,
        name: String,
        /// Empty, why a name NNI knows is not available here, or the known name nearest a
        /// misspelt one.
        hint: String,
        available: String,
        /// Where the plugins were looked for and which files were refused, and why: "; looked
        /// in A, B (no such folder); refused F (reason)" (empty for a registry not loaded from
        /// places).
        searched: String,
    },
    #[error("{kind} {name}: constructor failed: {message}")]
    Constructor {
        kind: ComponentKind,
        name: String,
        message: String,
    },
    #[error("{message}")]
    Call { message: String },
    #[error(
        "{label} stopped: its thread ended (it panicked outside a guarded call, or was shut down)"
    )]
    Gone { label: String },
}

/// One component of a plugin library, as the library describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ComponentInfo {
    pub kind: ComponentKind,
    pub name: String,
    pub version: String,
    pub description: String,
}

/// A loaded plugin library. Libraries stay loaded for the life of the process (unloading Rust
/// code that may have spawned threads or leaked statics is not safe).
#[derive(Clone)]
pub struct PluginLibrary {
    pub path: PathBuf,
    /// The knob-plugin-api crate version the library was built against.
    pub api_version: String,
    /// The plugin ABI version it was built for (see [`crate::ABI_VERSION`]).
    pub abi_version: String,
    pub components: Vec<ComponentInfo>,
    module: PluginModuleRef,
}

impl std::fmt::Debug for PluginLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginLibrary")
            .field("path", &self.path)
            .field("api_version", &self.api_version)
            .field("abi_version", &self.abi_version)
            .field("components", &self.components)
            .finish()
    }
}

// ---------------------------------------------------------------------------------------------
// Discovery

/// The places plugins are looked for, in order: the directory of the running executable and
/// `../lib/knob/plugins` beside it (where an installed knob keeps its built-in plugins: a
/// virtualenv from the wheel, `/usr/local`), each entry of `$KNOB_PLUGIN_PATH`, the user plugin
/// directory (`$XDG_DATA_HOME/knob/plugins`, by default `~/.local/share/knob/plugins`), then
/// `extra` (files or directories a config names).
pub fn plugin_search_path(extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut places = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        // Only where it exists: a cargo build's `target/lib` is not a place to mention.
        let installed = dir.parent().map(|prefix| prefix.join(INSTALLED_PLUGIN_DIR));
        places.push(dir);
        places.extend(installed.filter(|d| d.is_dir()));
    }
    if let Some(paths) = std::env::var_os("KNOB_PLUGIN_PATH") {
        places.extend(std::env::split_paths(&paths).filter(|p| !p.as_os_str().is_empty()));
    }
    if let Some(dir) = user_plugin_dir() {
        places.push(dir);
    }
    places.extend(extra.iter().cloned());
    places
}

/// Where an installed knob's built-in plugins are, relative to the prefix above the folder of its
/// executable (`<prefix>/bin/knob`), as the wheel installs them (`python/build-wheel.sh`).
pub const INSTALLED_PLUGIN_DIR: &str = "lib/knob/plugins";

/// `$XDG_DATA_HOME/knob/plugins`, falling back to `~/.local/share/knob/plugins`.
pub fn user_plugin_dir() -> Option<PathBuf> {
    let data_home = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        // $HOME, else the password database's, as knob's home folder is found.
        .or_else(|| std::env::home_dir().map(|home| home.join(".local/share")))?;
    Some(data_home.join("knob/plugins"))
}

fn is_shared_library(path: &Path) -> bool {
    let ext = path.extension().and_then(|e| e.to_str());
    matches!(ext, Some("so" | "dylib" | "dll"))
}

/// Plugin files under `places`: a file is taken as named; a directory contributes its shared
/// libraries (not recursively). Missing directories are skipped; a named file that does not
/// exist is an error. Each file appears once, however many ways it was reached.
pub fn discover_plugin_files(places: &[PathBuf]) -> (Vec<PathBuf>, Vec<HostError>) {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for place in places {
        let mut candidates = Vec::new();
        if place.is_dir() {
            match std::fs::read_dir(place) {
                Ok(entries) => {
                    let mut named: Vec<PathBuf> = entries
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| is_shared_library(p))
                        .collect();
                    named.sort();
                    for path in named {
                        // A symlink whose target is gone (a build folder cleaned since) or a
                        // loop is refused in words, as every refused file is: skipped, it was
                        // missing from the unknown-name error without a reason.
                        match std::fs::metadata(&path) {
                            Ok(meta) if meta.is_file() => candidates.push(path),
                            Ok(_) => {}
                            Err(e) => problems.push(HostError::Load {
                                path,
                                reason: format!("cannot open: {e}"),
                            }),
                        }
                    }
                }
                Err(e) => problems.push(HostError::Load {
                    path: place.clone(),
                    reason: format!("cannot read plugin directory: {e}"),
                }),
            }
        } else if place.is_file() {
            candidates.push(place.clone());
        } else if place.extension().is_some() {
            // Looks like a file someone named on purpose (a config's pluginPaths entry).
            problems.push(HostError::Load {
                path: place.clone(),
                reason: "no such plugin file".into(),
            });
        }
        for file in candidates {
            let canonical = file.canonicalize().unwrap_or_else(|_| file.clone());
            if seen.insert(canonical) {
                files.push(file);
            }
        }
    }
    (files, problems)
}

// ---------------------------------------------------------------------------------------------
// Loading

/// How the host reports what plugins log: level, target, message.
pub type PluginLogFn = dyn Fn(LogLevel, &str, &str) + Send + Sync;

/// Severity of a plugin's log message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

static PLUGIN_LOGGER: OnceLock<Box<PluginLogFn>> = OnceLock::new();

/// Routes what plugins log to `log`. Call once, before loading plugins; later calls are ignored.
/// Without it, plugin messages go to stderr.
pub fn set_plugin_logger(log: Box<PluginLogFn>) {
    let _ = PLUGIN_LOGGER.set(log);
}

fn host_log(level: LogLevel, target: &str, message: &str) {
    match PLUGIN_LOGGER.get() {
        Some(log) => log(level, target, message),
        // Dropped when stderr is gone: a panic here would unwind through a plugin's call.
        None => {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "[{level:?} {target}] {message}");
        }
    }
}

struct HostLogger;

impl HostLoggerAbi for HostLogger {
    fn log(&self, level: AbiLogLevel, target: RStr<'_>, message: RStr<'_>) {
        let level = match level {
            AbiLogLevel::Error => LogLevel::Error,
            AbiLogLevel::Warn => LogLevel::Warn,
            AbiLogLevel::Info => LogLevel::Info,
            AbiLogLevel::Debug => LogLevel::Debug,
            AbiLogLevel::Trace => LogLevel::Trace,
        };
        host_log(level, target.as_str(), message.as_str());
    }
}

/// Libraries already loaded in this process, by canonical path: a file is loaded once.
fn loaded_libraries() -> &'static Mutex<HashMap<PathBuf, Result<PluginLibrary, HostError>>> {
    static LOADED: OnceLock<Mutex<HashMap<PathBuf, Result<PluginLibrary, HostError>>>> =
        OnceLock::new();
    LOADED.get_or_init(Default::default)
}

/// Loads one plugin library (or returns the copy already loaded).
pub fn load_library(path: &Path) -> Result<PluginLibrary, HostError> {
    let canonical = path.canonicalize().map_err(|e| HostError::Load {
        path: path.to_path_buf(),
        reason: format!("cannot open: {e}"),
    })?;
    let mut loaded = loaded_libraries()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(result) = loaded.get(&canonical) {
        return result.clone();
    }
    let result = load_uncached(&canonical).map_err(|reason| HostError::Load {
        path: path.to_path_buf(),
        reason,
    });
    loaded.insert(canonical, result.clone());
    result
}

fn load_uncached(path: &Path) -> Result<PluginLibrary, String> {
    precheck::check_file(path).map_err(|reason| {
        format!("not a loadable shared library ({reason}); remove it from the plugin path")
    })?;
    let (api_version, declared_abi) = read_versions(path)?;
    if let Some(abi) = &declared_abi {
        check_abi_compatible(abi)?;
    }
    check_release_line(&api_version)?;

    // dlopen runs the library's initializers, and the calls below run its code: a crash or an
    // exit there names the file (see `in_plugin`).
    let _in_plugin = in_plugin::InPlugin::enter(&format!("plugin library {}", path.display()));
    let header =
        lib_header_from_path(path).map_err(|e| describe_library_error(&e, &api_version))?;
    let (module, layout_abi) = match header.init_root_module::<PluginModuleRef>() {
        Ok(module) => (module, crate::ABI_VERSION),
        Err(error) => match built_with_earlier_layout(header) {
            // SAFETY: the library's root module has the layout of an earlier release, a prefix
            // of the current one; the accessors of the fields appended since read the library's
            // own field count and answer `None` for each.
            Some(earlier) => (
                unsafe { header.init_root_module_with_unchecked_layout::<PluginModuleRef>() }
                    .map_err(|e| describe_library_error(&e, &api_version))?,
                earlier,
            ),
            None => return Err(describe_library_error(&error, &api_version)),
        },
    };
    // A library from before ABI versions is the version whose layout it has.
    let abi_version = declared_abi.unwrap_or_else(|| layout_abi.to_owned());

    let logger = HostLoggerAbi_TO::from_value(HostLogger, TD_Opaque);
    (module.set_host_logger())(logger);
    let components = (module.components())()
        .into_iter()
        .map(|c| ComponentInfo {
            kind: match c.kind {
                AbiComponentKind::Tuner => ComponentKind::Tuner,
                AbiComponentKind::Assessor => ComponentKind::Assessor,
                AbiComponentKind::TrainingService => ComponentKind::TrainingService,
            },
            name: c.name.into_string(),
            version: c.version.into_string(),
            description: c.description.into_string(),
        })
        .collect::<Vec<_>>();
    check_distinct_names(&components)?;
    Ok(PluginLibrary {
        path: path.to_path_buf(),
        api_version,
        abi_version,
        components,
        module,
    })
}

/// A library must export each (kind, name) once, names compared ignoring case as a config's are:
/// a config could not say which of two it means. Refusing the file (not one of its names) keeps
/// the registry's rule that a name has one provider per library, and the other plugins load.
fn check_distinct_names(components: &[ComponentInfo]) -> Result<(), String> {
    for (i, later) in components.iter().enumerate() {
        let Some(earlier) = components[..i].iter().find(|earlier| {
            earlier.kind == later.kind && earlier.name.to_lowercase() == later.name.to_lowercase()
        }) else {
            continue;
        };
        let exported = if earlier.name == later.name {
            format!("{} {} twice", later.kind, later.name)
        } else {
            format!(
                "{kind} {} and {kind} {}, names a config does not tell apart (case is ignored)",
                earlier.name,
                later.name,
                kind = later.kind
            )
        };
        return Err(format!(
            "not a usable knob plugin (it exports {exported}); rebuild it exporting each name once, or remove it from the plugin path"
        ));
    }
    Ok(())
}

/// The ABI version of the earlier release whose root-module layout (one without the fields
/// appended since) the library has exactly: such a library loads, and the host gives it the old
/// behaviour (see `abi::earlier_layouts`).
fn built_with_earlier_layout(header: &abi_stable::library::LibHeader) -> Option<&'static str> {
    let layout = header.layout()?;
    crate::abi::earlier_layouts::newest_first()
        .into_iter()
        .find(|(_, earlier)| {
            abi_stable::abi_stability::abi_checking::check_layout_compatibility(earlier, layout)
                .is_ok()
        })
        .map(|(version, _)| version)
}

/// Reads the plain C version symbols: the crate version the library was built against, and the
/// ABI version it was built for (absent in libraries from before ABI versions, which are taken
/// as the ABI whose layout they have). This dlopens the file; the handle is kept for the life of
/// the process, as abi_stable does with the same file right after.
fn read_versions(path: &Path) -> Result<(String, Option<String>), String> {
    // SAFETY: loading a library runs its initialisers; that is what loading a plugin means, and
    // the user put the file on the plugin path.
    let library = unsafe { libloading::Library::new(path) }.map_err(|e| {
        format!(
            "not a loadable shared library ({}); remove it from the plugin path",
            first_line(&e.to_string())
        )
    })?;
    precheck::check_exported_functions(path, &[API_VERSION_SYMBOL, ABI_VERSION_SYMBOL])
        .map_err(|reason| format!("not a knob plugin ({reason})"))?;
    let read = |symbol: &str| -> Option<Result<String, String>> {
        // SAFETY: every knob plugin exports these symbols with exactly this signature (and
        // `check_exported_functions` refused a library that exports them as anything but code).
        let symbol = unsafe {
            library.get::<unsafe extern "C" fn() -> *const std::ffi::c_char>(symbol.as_bytes())
        }
        .ok()?;
        // SAFETY: the symbol returns a pointer to a NUL-terminated static string.
        let ptr = unsafe { symbol() };
        if ptr.is_null() {
            return Some(Err(
                "not a knob plugin (its version symbol returned null)".into()
            ));
        }
        // SAFETY: non-null, NUL-terminated, static in the library, which stays loaded.
        Some(Ok(unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned()))
    };
    let api_version = read(API_VERSION_SYMBOL).ok_or_else(|| {
        "not a knob plugin (it does not export knob_plugin_api_version; plugins are built with knob_plugin_api::export_plugin!)".to_string()
    })??;
    let abi_version = read(ABI_VERSION_SYMBOL).transpose()?;
    if abi_version.is_none() && !api_version.starts_with("0.1.") {
        return Err(format!(
            "built against knob-plugin-api {api_version}, which declares no plugin ABI version: rebuild the plugin against knob-plugin-api {}",
            crate::API_VERSION
        ));
    }
    std::mem::forget(library);
    Ok((api_version, abi_version))
}

/// A semver version: the core numbers and the pre-release identifiers (build metadata is
/// ignored, as semver says). `0.1.0-alpha.1` is *below* `0.1.0`: a plugin built against a
/// pre-release of the host's version is older than it, not the same.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    core: (u64, u64, u64),
    pre: Vec<PreRelease>,
}

/// One dot-separated pre-release identifier: numeric ones sort numerically and below
/// alphanumeric ones, which sort as ASCII (semver 2.0.0, rule 11).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum PreRelease {
    Numeric(u64),
    Alphanumeric(String),
}

impl Version {
    fn parse(text: &str) -> Option<Version> {
        let without_build = text.split('+').next()?;
        let (core, pre) = match without_build.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (without_build, None),
        };
        let numbers: Vec<u64> = core
            .split('.')
            .map(|part| part.parse::<u64>().ok())
            .collect::<Option<_>>()?;
        let [major, minor, patch] = numbers[..] else {
            return None;
        };
        let pre = match pre {
            None => Vec::new(),
            Some(pre) => pre
                .split('.')
                .map(|id| {
                    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                        None
                    } else if id.chars().all(|c| c.is_ascii_digit()) {
                        id.parse().ok().map(PreRelease::Numeric)
                    } else {
                        Some(PreRelease::Alphanumeric(id.to_owned()))
                    }
                })
                .collect::<Option<_>>()?,
        };
        Some(Version {
            core: (major, minor, patch),
            pre,
        })
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Version) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Version) -> std::cmp::Ordering {
        // A release sorts above its pre-releases; pre-releases compare field by field, a longer
        // list above its prefix.
        self.core
            .cmp(&other.core)
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Greater,
                (false, true) => std::cmp::Ordering::Less,
                (false, false) => self.pre.cmp(&other.pre),
            })
    }
}

/// The compatibility rule, stated once, on ABI versions (the crate version plays no part): a
/// plugin must be built for the host's major ABI version (its minor for `0.x`). An older minor
/// lacks fields appended since, and the host gives it the old behaviour; a newer minor only
/// appended fields the host does not read. A pre-release ABI promises no compatibility (semver
/// item 9): a plugin built for one loads only into a host of exactly that pre-release. Build
/// metadata is ignored.
pub fn check_abi_compatible(plugin_abi: &str) -> Result<(), String> {
    let host = crate::ABI_VERSION;
    let api = crate::API_VERSION;
    let (Some(plugin), Some(host_version)) = (Version::parse(plugin_abi), Version::parse(host))
    else {
        return Err(format!("built for plugin ABI \"{plugin_abi}\", which is not a version number; rebuild it against knob-plugin-api {api} (ABI {host})"));
    };
    if !plugin.pre.is_empty() && plugin != host_version {
        return Err(format!(
            "built for the pre-release plugin ABI {plugin_abi}, knob's is {host}: a pre-release ABI is compatible only with itself; rebuild the plugin against knob-plugin-api {api} (ABI {host})"
        ));
    }
    let (p, h) = (plugin.core, host_version.core);
    let same_line = if h.0 == 0 {
        p.0 == 0 && p.1 == h.1
    } else {
        p.0 == h.0
    };
    if !same_line {
        return Err(if plugin > host_version {
            format!("built for plugin ABI {plugin_abi}, knob's is {host}: upgrade knob, or rebuild the plugin against knob-plugin-api {api}")
        } else {
            format!("built for plugin ABI {plugin_abi}, which knob's {host} no longer supports: rebuild the plugin against knob-plugin-api {api}")
        });
    }
    Ok(())
}

/// abi_stable's layout check also compares the crate version each type was built with, by
/// cargo's rule (same major; same minor for `0.x`): a plugin built against a knob-plugin-api of
/// another release line fails it whatever its ABI version. Said here first, in words. (So a
/// knob-plugin-api release that keeps the ABI's major is a semver-compatible one, and one that
/// raises it is semver-major: the two move together.)
fn check_release_line(plugin_api: &str) -> Result<(), String> {
    let host = crate::API_VERSION;
    let (Some(plugin), Some(host_version)) = (Version::parse(plugin_api), Version::parse(host))
    else {
        return Err(format!("built against knob-plugin-api \"{plugin_api}\", which is not a version number; rebuild it against {host}"));
    };
    let (p, h) = (plugin.core, host_version.core);
    let same_line = if h.0 == 0 {
        p.0 == 0 && p.1 == h.1
    } else {
        p.0 == h.0
    };
    match (same_line, p > h) {
        (true, _) => Ok(()),
        (false, true) => Err(format!("built against knob-plugin-api {plugin_api}, a newer release line than knob's {host}: upgrade knob, or rebuild the plugin against knob-plugin-api {host}")),
        (false, false) => Err(format!("built against knob-plugin-api {plugin_api}, an older release line than knob's {host}: rebuild the plugin against knob-plugin-api {host}")),
    }
}

fn first_line(text: &str) -> &str {
    text.trim().lines().next().unwrap_or("").trim()
}

/// Turns abi_stable's multi-line report into one line, logging the whole report at debug level.
fn describe_library_error(error: &LibraryError, api_version: &str) -> String {
    let report = error.to_string();
    host_log(LogLevel::Debug, "knob::plugin", &report);
    match error {
        LibraryError::AbiInstability(_) => format!(
            "layout mismatch in type {}: the plugin was built against a modified knob-plugin-api {api_version}; rebuild it against the released crate",
            mismatched_type(&report).unwrap_or_else(|| "PluginModule".into())
        ),
        LibraryError::IncompatibleVersionNumber { expected_version, actual_version, .. } => format!(
            "its root module declares version {actual_version}, knob expects {expected_version}: rebuild the plugin against knob-plugin-api {}", crate::API_VERSION
        ),
        LibraryError::InvalidAbiHeader(_) => {
            "built with an incompatible abi_stable version; rebuild it against this knob's knob-plugin-api".into()
        }
        LibraryError::GetSymbolError { .. } => "not a knob plugin (no knob root module)".into(),
        LibraryError::RootModule { err, .. } => format!("its root module failed to initialise: {}", first_line(&err.to_string())),
        _ => first_line(&report).to_string(),
    }
}

/// Finds the innermost type abi_stable complains about in its layout report, the field that
/// differs, and what is wrong with it (never the wrapper the mismatch sits in, such as
/// `RResult`).
///
/// The report walks the type tree; every step prints "<n> error(s)inside:" followed by the
/// path so far and the "Layout of expected type:" of the step's type. The first step with a
/// non-zero count is the innermost mismatching type; its errors follow as "Error:<what>".
fn mismatched_type(report: &str) -> Option<String> {
    let failing_step = report
        .split("error(s)inside:")
        .skip(1)
        .zip(report.split("error(s)inside:"))
        .find_map(|(step, before)| {
            let count = before
                .trim_end()
                .rsplit(|c: char| !c.is_ascii_digit())
                .next()?;
            (count.parse::<u32>().ok()? > 0).then_some(step)
        })?;
    let expected = &failing_step[failing_step.find("Layout of expected type:")?..];
    let type_name = expected
        .lines()
        .find_map(|line| line.trim().strip_prefix("type:"))?
        .trim();
    // The step's first error: "Error:<what>", then "Expected:" and "Found:", each followed by
    // what differs (a field's layout starts with its "field_name:").
    let Some(error) = failing_step.split("\nError:").nth(1) else {
        return Some(type_name.to_string());
    };
    let problem = error.lines().next().unwrap_or("").trim();
    let first_line_after = |label: &str| {
        error
            .split_once(label)
            .and_then(|(_, rest)| rest.lines().map(str::trim).find(|l| !l.is_empty()))
            .unwrap_or("")
    };
    let (expected, found) = (first_line_after("Expected:"), first_line_after("Found:"));
    Some(
        match (
            expected.strip_prefix("field_name:"),
            found.strip_prefix("field_name:"),
        ) {
            (Some(ours), Some(theirs)) if ours != theirs => {
                format!("{type_name}, field {ours} ({problem}; the plugin has {theirs} there)")
            }
            (Some(ours), _) => format!("{type_name}, field {ours} ({problem})"),
            _ if expected.is_empty() => format!("{type_name} ({problem})"),
            _ => format!("{type_name} ({problem}: knob has {expected}, the plugin {found})"),
        },
    )
}

// ---------------------------------------------------------------------------------------------
// The registry

/// Every plugin library found, and which library provides each (kind, name).
///
/// Cloned to build a component on a thread of its own (a config check's tuner, which may never
/// return); the libraries stay loaded for the life of the process either way.
#[derive(Debug, Default, Clone)]
pub struct PluginRegistry {
    libraries: Vec<PluginLibrary>,
    problems: Vec<HostError>,
    /// (kind, lowercased name) -> indexes into `libraries`; more than one is a duplicate.
    providers: BTreeMap<(ComponentKind, String), Vec<usize>>,
    /// The places the plugins were looked for, in order.
    searched: Vec<PathBuf>,
}

impl PluginRegistry {
    /// Loads every plugin on the search path (see [`plugin_search_path`]). Never fails: files
    /// that do not load are recorded in [`PluginRegistry::problems`].
    pub fn load(extra: &[PathBuf]) -> PluginRegistry {
        Self::load_from(&plugin_search_path(extra))
    }

    /// Loads the plugins in exactly these places.
    pub fn load_from(places: &[PathBuf]) -> PluginRegistry {
        in_plugin::say_when_a_plugin_exits();
        let (files, mut problems) = discover_plugin_files(places);
        let mut registry = PluginRegistry {
            searched: places.to_vec(),
            ..PluginRegistry::default()
        };
        for file in files {
            match load_library(&file) {
                Ok(library) => registry.add(library),
                Err(e) => problems.push(e),
            }
        }
        registry.problems.extend(problems);
        registry
    }

    fn add(&mut self, library: PluginLibrary) {
        let index = self.libraries.len();
        // In the list before its names are: a name the library exports twice (which
        // `load_library` refuses) would otherwise look up its own index before it exists.
        self.libraries.push(library);
        let library = &self.libraries[index];
        for component in &library.components {
            let providers = self
                .providers
                .entry((component.kind, component.name.to_lowercase()))
                .or_default();
            if let Some(&first) = providers.first() {
                self.problems.push(HostError::Duplicate {
                    kind: component.kind,
                    name: component.name.clone(),
                    first: self.libraries[first].path.clone(),
                    second: library.path.clone(),
                });
            }
            providers.push(index);
        }
    }

    pub fn libraries(&self) -> &[PluginLibrary] {
        &self.libraries
    }

    /// Files that failed to load and names exported twice.
    pub fn problems(&self) -> &[HostError] {
        &self.problems
    }

    /// Names of every component of `kind`, sorted.
    pub fn names(&self, kind: ComponentKind) -> Vec<String> {
        let mut names: Vec<String> = self
            .libraries
            .iter()
            .flat_map(|l| &l.components)
            .filter(|c| c.kind == kind)
            .map(|c| c.name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The library exporting `kind` `name` (matched case-insensitively, as NNI does), and the
    /// exact name it exports it under. A name no plugin exports but NNI 3.0 knows for an
    /// algorithm knob has natively (`GP`, `BatchTuner`) is the native one ([`NNI_ALGORITHMS`]).
    pub fn find(
        &self,
        kind: ComponentKind,
        name: &str,
    ) -> Result<(&PluginLibrary, String), HostError> {
        let providers_of = |name: &str| {
            self.providers
                .get(&(kind, name.to_lowercase()))
                .map(Vec::as_slice)
                .unwrap_or_default()
        };
        let nni = nni_algorithm(kind, name);
        // `lookup` is the name a plugin exports; `name` stays what the user wrote, for messages.
        let mut lookup = name;
        let mut providers = providers_of(name);
        if let (true, Some(native)) = (providers.is_empty(), nni.and_then(|nni| nni.native)) {
            providers = providers_of(native);
            lookup = native;
        }
        match providers {
            [] => {
                // The NNI dispatcher's bridge is not a name a config can give (see
                // `is_nni_dispatcher`): offered here, it was refused for lacking its algorithm.
                let names: Vec<String> = self
                    .names(kind)
                    .into_iter()
                    .filter(|name| !is_nni_dispatcher(name))
                    .collect();
                let hint = match nni {
                    Some(NniAlgorithm { native: None, .. }) => {
                        " (an NNI 3.0 algorithm that knob does not have natively; knob's core \
                         runs it through NNI's own dispatcher, the NniDispatcher plugin)"
                            .to_owned()
                    }
                    // A misspelt name (`Rnadom` for `Random`).
                    _ => {
                        let known: Vec<&str> = names.iter().map(String::as_str).collect();
                        crate::config::suggestion(name, &known)
                            .map(|near| format!(" (did you mean {near}?)"))
                            .unwrap_or_default()
                    }
                };
                Err(HostError::Unknown {
                    kind,
                    name: as_named(name),
                    searched: self.where_looked(),
                    hint,
                    available: if names.is_empty() {
                        "none (no plugin on the plugin path provides one; see `knob plugin list`)"
                            .into()
                    } else {
                        names.join(", ")
                    },
                })
            }
            [only] => {
                let library = &self.libraries[*only];
                let exact = library
                    .components
                    .iter()
                    .find(|c| c.kind == kind && c.name.eq_ignore_ascii_case(lookup))
                    .map(|c| c.name.clone())
                    .unwrap_or_else(|| lookup.to_string());
                Ok((library, exact))
            }
            [first, second, ..] => Err(HostError::Duplicate {
                kind,
                name: name.to_string(),
                first: self.libraries[*first].path.clone(),
                second: self.libraries[*second].path.clone(),
            }),
        }
    }

    /// "; looked in A, B (no such folder); refused F (reason), G (reason)": what an unknown
    /// name's error adds, so that a user sees where knob looked and which files it did not take.
    fn where_looked(&self) -> String {
        let mut text = String::new();
        if !self.searched.is_empty() {
            let places: Vec<String> = self
                .searched
                .iter()
                .map(|place| {
                    if place.exists() {
                        place.display().to_string()
                    } else {
                        format!("{} (no such folder)", place.display())
                    }
                })
                .collect();
            text.push_str(&format!("; looked in {}", places.join(", ")));
        }
        let refused: Vec<String> = self
            .problems
            .iter()
            .filter_map(|problem| match problem {
                HostError::Load { path, reason } => Some(format!("{} ({reason})", path.display())),
                _ => None,
            })
            .collect();
        if !refused.is_empty() {
            text.push_str(&format!("; refused {}", refused.join(", ")));
        }
        text
    }

    /// Builds a tuner object, to be called on the current thread (see [`TunerHandle`] for the
    /// threaded form the core uses).
    pub fn tuner_object(&self, name: &str, class_args: &Value) -> Result<TunerObject, HostError> {
        let (library, exact) = self.find(ComponentKind::Tuner, name)?;
        // Its constructor or call runs plugin code on this thread: see `in_plugin`.
        let _in_plugin = in_plugin::InPlugin::enter(&format!("{} {exact}", ComponentKind::Tuner));
        let args = class_args.to_string();
        let raw = (library.module.new_tuner())(RStr::from_str(&exact), RStr::from_str(&args));
        let raw = constructed(ComponentKind::Tuner, &exact, raw)?;
        // A library built before objectives cannot say; its tuners take a scalar.
        #[allow(unused_assignments, unused_mut)]
        let mut takes_objectives = false;
        // ---- appended-fields: begin ----
        takes_objectives = library
            .module
            .tuner_takes_objectives()
            .is_some_and(|takes| takes(RStr::from_str(&exact)));
        let takes_whole_metrics = library
            .module
            .tuner_takes_whole_metrics()
            .is_some_and(|takes| takes(RStr::from_str(&exact)));
        // ---- appended-fields: end ----
        Ok(TunerObject {
            raw,
            label: format!("tuner {exact}"),
            takes_objectives,
            wakes: false,
            takes_whole_metrics,
        })
    }

    /// Builds a tuner running on its own thread.
    pub fn tuner(&self, name: &str, class_args: &Value) -> Result<TunerHandle, HostError> {
        let object = self.tuner_object(name, class_args)?;
        Ok(TunerHandle::new(object))
    }

    /// Builds an assessor, on the current thread, with the experiment's context. A library
    /// built before contexts (ABI 1.1 and before) builds it without: its assessor keeps its own
    /// default direction and never hears of finals ([`AssessorObject::trial_final`] does nothing).
    pub fn assessor_object(
        &self,
        name: &str,
        class_args: &Value,
        context: &crate::AssessorContext,
    ) -> Result<AssessorObject, HostError> {
        let (library, exact) = self.find(ComponentKind::Assessor, name)?;
        // Its constructor or call runs plugin code on this thread: see `in_plugin`.
        let _in_plugin =
            in_plugin::InPlugin::enter(&format!("{} {exact}", ComponentKind::Assessor));
        let args = class_args.to_string();
        let (name_arg, args_arg) = (RStr::from_str(&exact), RStr::from_str(&args));
        let raw = match library.module.new_assessor_in_context() {
            Some(new) => objects::AssessorRaw::InContext(constructed(
                ComponentKind::Assessor,
                &exact,
                new(name_arg, args_arg, RStr::from_str(&json_text(context))),
            )?),
            None => objects::AssessorRaw::Plain(constructed(
                ComponentKind::Assessor,
                &exact,
                (library.module.new_assessor())(name_arg, args_arg),
            )?),
        };
        Ok(AssessorObject {
            raw,
            label: format!("assessor {exact}"),
        })
    }

    pub fn assessor(
        &self,
        name: &str,
        class_args: &Value,
        context: &crate::AssessorContext,
    ) -> Result<AssessorHandle, HostError> {
        Ok(AssessorHandle::new(
            self.assessor_object(name, class_args, context)?,
        ))
    }

    /// Builds a training service on its own thread from its config alone, as hosts did before
    /// contexts (tests and tools; the core uses [`PluginRegistry::create_training_service`]).
    pub fn training_service(
        &self,
        name: &str,
        class_args: &Value,
        on_event: impl Fn(Result<ServiceEvent, String>) + Send + Sync + 'static,
    ) -> Result<TrainingServiceHandle, HostError> {
        let (library, exact) = self.find(ComponentKind::TrainingService, name)?;
        // Its constructor or call runs plugin code on this thread: see `in_plugin`.
        let _in_plugin =
            in_plugin::InPlugin::enter(&format!("{} {exact}", ComponentKind::TrainingService));
        let args = class_args.to_string();
        let sink =
            EventSinkAbi_TO::from_value(EventForwarder::new(&exact, Box::new(on_event)), TD_Opaque);
        let raw = (library.module.new_training_service())(
            RStr::from_str(&exact),
            RStr::from_str(&args),
            sink,
        );
        service_handle(&exact, raw)
    }

    // ---- appended-fields: begin ----
    // (The host's use of the appended root-module fields; the loader tests strip it with them.)
    /// Builds a tuner on the current thread with a waker (ABI 1.4): `on_wake` runs, on one of
    /// the plugin's threads, whenever the tuner has parameters ready outside a call; keep it
    /// short (send into a channel), then call [`TunerObject::take_suggestions`]. A library
    /// built before wakers builds it without one ([`TunerObject::wakes`] is then false).
    pub fn tuner_object_waking(
        &self,
        name: &str,
        class_args: &Value,
        on_wake: WakeCallback,
    ) -> Result<TunerObject, HostError> {
        let (library, exact) = self.find(ComponentKind::Tuner, name)?;
        // Its constructor or call runs plugin code on this thread: see `in_plugin`.
        let _in_plugin = in_plugin::InPlugin::enter(&format!("{} {exact}", ComponentKind::Tuner));
        let Some(new) = library.module.new_tuner_with_waker() else {
            return self.tuner_object(name, class_args);
        };
        let args = class_args.to_string();
        let sink = EventSinkAbi_TO::from_value(WakeForwarder(on_wake), TD_Opaque);
        let built = constructed(
            ComponentKind::Tuner,
            &exact,
            new(RStr::from_str(&exact), RStr::from_str(&args), sink),
        )?;
        let takes_objectives = library
            .module
            .tuner_takes_objectives()
            .is_some_and(|takes| takes(RStr::from_str(&exact)));
        let takes_whole_metrics = library
            .module
            .tuner_takes_whole_metrics()
            .is_some_and(|takes| takes(RStr::from_str(&exact)));
        Ok(TunerObject {
            raw: built.tuner,
            label: format!("tuner {exact}"),
            takes_objectives,
            wakes: built.wakes,
            takes_whole_metrics,
        })
    }

    /// [`PluginRegistry::tuner_object_waking`], running on its own thread.
    pub fn tuner_waking(
        &self,
        name: &str,
        class_args: &Value,
        on_wake: WakeCallback,
    ) -> Result<TunerHandle, HostError> {
        Ok(TunerHandle::new(
            self.tuner_object_waking(name, class_args, on_wake)?,
        ))
    }

    /// Builds an assessor on its own thread with its context and a waker (ABI 1.4): `on_wake`
    /// runs when the assessor has decided about a trial outside a call; the host then asks it
    /// again about its running trials. A library built before wakers builds it as
    /// [`PluginRegistry::assessor`] does.
    pub fn assessor_waking(
        &self,
        name: &str,
        class_args: &Value,
        context: &crate::AssessorContext,
        on_wake: WakeCallback,
    ) -> Result<AssessorHandle, HostError> {
        Ok(AssessorHandle::new(self.assessor_object_waking(
            name, class_args, context, on_wake,
        )?))
    }

    /// [`PluginRegistry::assessor_waking`], to be called on the current thread.
    pub fn assessor_object_waking(
        &self,
        name: &str,
        class_args: &Value,
        context: &crate::AssessorContext,
        on_wake: WakeCallback,
    ) -> Result<AssessorObject, HostError> {
        let (library, exact) = self.find(ComponentKind::Assessor, name)?;
        // Its constructor or call runs plugin code on this thread: see `in_plugin`.
        let _in_plugin =
            in_plugin::InPlugin::enter(&format!("{} {exact}", ComponentKind::Assessor));
        let Some(new) = library.module.new_assessor_with_waker() else {
            return self.assessor_object(name, class_args, context);
        };
        let args = class_args.to_string();
        let sink = EventSinkAbi_TO::from_value(WakeForwarder(on_wake), TD_Opaque);
        let raw = constructed(
            ComponentKind::Assessor,
            &exact,
            new(
                RStr::from_str(&exact),
                RStr::from_str(&args),
                RStr::from_str(&json_text(context)),
                sink,
            ),
        )?;
        Ok(AssessorObject {
            raw: objects::AssessorRaw::InContext(raw),
            label: format!("assessor {exact}"),
        })
    }

    /// Builds a training service on its own thread from its checked config (secrets in clear)
    /// and the experiment's context. Its events are handed to `on_event`, from whichever thread
    /// the service reports on; keep it short (e.g. send into a channel). A library built before
    /// contexts is constructed from the config alone.
    pub fn create_training_service(
        &self,
        name: &str,
        config: &Value,
        context: &ServiceContext,
        on_event: impl Fn(Result<ServiceEvent, String>) + Send + Sync + 'static,
    ) -> Result<TrainingServiceHandle, HostError> {
        let (library, exact) = self.find(ComponentKind::TrainingService, name)?;
        // Its constructor or call runs plugin code on this thread: see `in_plugin`.
        let _in_plugin =
            in_plugin::InPlugin::enter(&format!("{} {exact}", ComponentKind::TrainingService));
        let config = config.to_string();
        let sink =
            EventSinkAbi_TO::from_value(EventForwarder::new(&exact, Box::new(on_event)), TD_Opaque);
        if let Some(create) = library.module.create_training_service_with_requests() {
            let raw = create(
                RStr::from_str(&exact),
                RStr::from_str(&config),
                RStr::from_str(&json_text(context)),
                sink,
            );
            let raw = constructed(ComponentKind::TrainingService, &exact, raw)?;
            return Ok(service_thread(
                &exact,
                objects::ServiceRaw::WithRequests(raw),
            ));
        }
        let raw = match library.module.create_training_service() {
            Some(create) => create(
                RStr::from_str(&exact),
                RStr::from_str(&config),
                RStr::from_str(&json_text(context)),
                sink,
            ),
            None => (library.module.new_training_service())(
                RStr::from_str(&exact),
                RStr::from_str(&config),
                sink,
            ),
        };
        service_handle(&exact, raw)
    }

    /// Asks the service `name` to check its config (see
    /// [`TrainingService::check_config`](crate::TrainingService::check_config)), on this thread.
    /// `Err` is a failure of the call itself (unknown service, a panic); the service's verdict,
    /// good or bad, is the `Ok`. A library built before services checked their configs accepts
    /// any mapping as written, with no secrets.
    pub fn check_training_service(
        &self,
        name: &str,
        config: &Value,
        context: &ServiceContext,
    ) -> Result<ConfigCheck, HostError> {
        let (library, exact) = self.find(ComponentKind::TrainingService, name)?;
        // Its constructor or call runs plugin code on this thread: see `in_plugin`.
        let _in_plugin =
            in_plugin::InPlugin::enter(&format!("{} {exact}", ComponentKind::TrainingService));
        let Some(check) = library.module.check_training_service() else {
            return Ok(match crate::sdk::accept_as_written(config) {
                Ok(checked) => ConfigCheck::Checked(checked),
                Err(problems) => ConfigCheck::Problems(problems),
            });
        };
        let answer = check(
            RStr::from_str(&exact),
            RStr::from_str(&config.to_string()),
            RStr::from_str(&json_text(context)),
        )
        .into_result()
        .map_err(|message| HostError::Call {
            message: plugin_text(&format!("training service {exact}"), message.as_str()),
        })?;
        serde_json::from_str(answer.as_str()).map_err(|e| HostError::Call {
            message: format!("training service {exact} answered a config check in bad JSON: {e}"),
        })
    }

    /// Asks the service `name` to end what an earlier run of the experiment left running for
    /// `trial_ids` (see
    /// [`TrainingService::clean_up_leftovers`](crate::TrainingService::clean_up_leftovers)), on
    /// this thread (it may block: call it where blocking is fine). Returns the service's
    /// one-line reports. A library built before this call has nothing to clean up.
    pub fn clean_up_training_service(
        &self,
        name: &str,
        config: &Value,
        context: &ServiceContext,
        trial_ids: &[String],
    ) -> Result<Vec<String>, HostError> {
        let (library, exact) = self.find(ComponentKind::TrainingService, name)?;
        // Its constructor or call runs plugin code on this thread: see `in_plugin`.
        let _in_plugin =
            in_plugin::InPlugin::enter(&format!("{} {exact}", ComponentKind::TrainingService));
        let Some(clean_up) = library.module.clean_up_training_service() else {
            return Ok(Vec::new());
        };
        let answer = clean_up(
            RStr::from_str(&exact),
            RStr::from_str(&config.to_string()),
            RStr::from_str(&json_text(context)),
            RStr::from_str(&json_text(&trial_ids)),
        )
        .into_result()
        .map_err(|message| HostError::Call {
            message: plugin_text(&format!("training service {exact}"), message.as_str()),
        })?;
        serde_json::from_str(answer.as_str()).map_err(|e| HostError::Call {
            message: format!("training service {exact} reported its clean-up in bad JSON: {e}"),
        })
    }
    // ---- appended-fields: end ----
}

/// Our own serializable types as JSON text (their serialization cannot fail).
fn json_text(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "{}".into())
}

fn service_handle(
    exact: &str,
    raw: RResult<crate::abi::TrainingServiceBox, RString>,
) -> Result<TrainingServiceHandle, HostError> {
    let raw = constructed(ComponentKind::TrainingService, exact, raw)?;
    Ok(service_thread(exact, objects::ServiceRaw::Plain(raw)))
}

/// A training service's object on a thread of its own.
fn service_thread(exact: &str, raw: objects::ServiceRaw) -> TrainingServiceHandle {
    let label = format!("training service {exact}");
    let object = TrainingServiceObject::new(raw, label.clone());
    TrainingServiceHandle::new(PluginThread::spawn(label, object))
}

fn constructed<T>(
    kind: ComponentKind,
    name: &str,
    raw: RResult<T, RString>,
) -> Result<T, HostError> {
    raw.into_result()
        .map_err(|message| constructor_error(kind, name, message.as_str()))
}

/// A constructor's failure; a message that starts by naming the component again (`training
/// service slurm: ...`) loses that start, which the error says already. The message is made one
/// line ([`plugin_text`]).
pub(crate) fn constructor_error(kind: ComponentKind, name: &str, message: &str) -> HostError {
    let said = format!("{kind} {name}: ");
    let message = plugin_text(&format!("{kind} {name}"), message);
    HostError::Constructor {
        kind,
        name: name.to_string(),
        message: message.strip_prefix(&said).unwrap_or(&message).to_string(),
    }
}

/// The most characters of a plugin's message (a call's or constructor's error, a training
/// service's warning or reason) that knob keeps. More than a trial's end message keeps (500):
/// an error may rightly list what it tried (hosts, fields, a Python traceback's last lines
/// joined), and it is shown once, not in a cell of a table; a flood of 30 MB is still cut.
pub const MAX_PLUGIN_MESSAGE_CHARS: usize = 2_000;

/// The most characters of a changed message's text as sent that [`plugin_text`] logs.
const MAX_LOGGED_CHARS: usize = 100_000;

/// A plugin's message as the host passes it on (to the console, the store, `knob plugin try`):
/// one line of visible text ([`crate::text::one_line`]: lines joined by spaces, terminal escape
/// sequences removed, other control characters shown as `�`), cut to
/// [`MAX_PLUGIN_MESSAGE_CHARS`]. A plugin, or a library it wraps, words errors as it likes:
/// passed on as sent, 200 lines with colour codes flooded the console, turned the user's
/// terminal red, and were stored so. The text as sent is not dropped: when it was changed it is
/// logged at debug level (`KNOB_LOG=debug`), escaped (`\n`, `\u{1b}`) so that not even then
/// does it drive the terminal, since a multi-line message (a traceback, context) is what the
/// plugin's author needs to find the fault.
pub(crate) fn plugin_text(label: &str, text: &str) -> String {
    let line = crate::text::one_line(text, MAX_PLUGIN_MESSAGE_CHARS);
    // Only to a host's logger: without one (a test, a tool) a debug line is not worth stderr.
    if let Some(log) = PLUGIN_LOGGER.get().filter(|_| line != text) {
        let sent: String = text.chars().take(MAX_LOGGED_CHARS).collect();
        log(
            LogLevel::Debug,
            label,
            &format!("message as sent: {}", sent.escape_debug()),
        );
    }
    line
}

type EventCallback = Box<dyn Fn(Result<ServiceEvent, String>) + Send + Sync>;

/// What the host runs when a tuner or assessor wakes it (see [`PluginRegistry::tuner_waking`]).
pub type WakeCallback = Box<dyn Fn() + Send + Sync>;

// ---- appended-fields: begin ----
/// A waker's sink: what a plugin emits on it only means "call me".
struct WakeForwarder(WakeCallback);

impl EventSinkAbi for WakeForwarder {
    fn emit(&self, _event_json: RStr<'_>) {
        // The callback is host code; a panic in it must not unwind into the plugin.
        let _ = catch_unwind(AssertUnwindSafe(|| (self.0)()));
    }
}
// ---- appended-fields: end ----

/// Hands a training service's events to the host's callback, its text made one line
/// ([`plugin_text`]): a warning, a failed start's message, a reason to place a trial again and
/// a lost environment's reason are shown on the console and stored as the service words them.
/// A trial's `stderr_tail` stays as the trial wrote it: the store keeps it so, and the core
/// makes the end message of its last visible line.
struct EventForwarder {
    label: String,
    callback: EventCallback,
}

impl EventForwarder {
    fn new(name: &str, callback: EventCallback) -> Self {
        Self {
            label: format!("training service {name}"),
            callback,
        }
    }

    fn one_line(&self, event: ServiceEvent) -> ServiceEvent {
        let text = |text: String| plugin_text(&self.label, &text);
        match event {
            ServiceEvent::Warning { trial_id, message } => ServiceEvent::Warning {
                trial_id,
                message: text(message),
            },
            ServiceEvent::StartFailed { trial_id, message } => ServiceEvent::StartFailed {
                trial_id,
                message: text(message),
            },
            ServiceEvent::PlaceAgain { trial_id, reason } => ServiceEvent::PlaceAgain {
                trial_id,
                reason: text(reason),
            },
            ServiceEvent::TrialEnded {
                trial_id,
                exit_code,
                signal,
                killed_reason,
                stderr_tail,
                environment_lost,
                ended_ms,
            } => ServiceEvent::TrialEnded {
                trial_id,
                exit_code,
                signal,
                killed_reason,
                stderr_tail,
                environment_lost: environment_lost.map(text),
                ended_ms,
            },
            event => event,
        }
    }
}

impl EventSinkAbi for EventForwarder {
    fn emit(&self, event_json: RStr<'_>) {
        let event = serde_json::from_str(event_json.as_str())
            .map(|event| self.one_line(event))
            .map_err(|e| {
                plugin_text(
                    &self.label,
                    &format!(
                        "unreadable event from {} ({e}): {}",
                        self.label,
                        event_json.as_str()
                    ),
                )
            });
        // The callback is host code; a panic in it must not unwind into the plugin.
        let _ = catch_unwind(AssertUnwindSafe(|| (self.callback)(event)));
    }
}

/// A name the user wrote, as an error line shows it: plain when it is a word of letters, digits,
/// `_`, `.` and `-` (every component name), else quoted, so that a stray space or tab shows:
/// `name: "TPE "` was refused as `unknown tuner TPE  (did you mean TPE?)`, which reads as if
/// knob did not know TPE.
fn as_named(name: &str) -> String {
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-'));
    match plain {
        true => name.to_owned(),
        false => format!("{name:?}"),
    }
}

#[cfg(test)]
mod tests {
    /// A name with a space or a tab is quoted in the refusal, so that the stray character shows;
    /// a plain one is not (H3 F2).
    #[test]
    fn a_name_with_a_stray_space_is_quoted() {
        assert_eq!(super::as_named("TPE"), "TPE");
        assert_eq!(super::as_named("my_tuner.v2-b"), "my_tuner.v2-b");
        assert_eq!(super::as_named("TPE "), "\"TPE \"");
        assert_eq!(super::as_named("TPE\t"), "\"TPE\\t\"");
    }

    use super::*;

    /// A symlink named as a plugin whose target is gone, or a loop, is refused with its reason
    /// (it was skipped without a word); a directory named so is told as one by the check.
    #[test]
    fn broken_symlinks_in_a_plugin_folder_are_refused_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path();
        std::os::unix::fs::symlink(folder.join("gone/libsweep.so"), folder.join("libsweep.so"))
            .unwrap();
        std::os::unix::fs::symlink(folder.join("loop2.so"), folder.join("loop1.so")).unwrap();
        std::os::unix::fs::symlink(folder.join("loop1.so"), folder.join("loop2.so")).unwrap();
        std::fs::create_dir(folder.join("dir.so")).unwrap();
        let (files, problems) = discover_plugin_files(&[folder.to_path_buf()]);
        assert!(files.is_empty(), "{files:?}");
        let problems: Vec<String> = problems
            .iter()
            .map(|p| p.to_string().replace(&folder.display().to_string(), "DIR"))
            .collect();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("DIR/libsweep.so") && problems[0].contains("cannot open"));
        assert!(problems[1].contains("DIR/loop1.so") && problems[1].contains("cannot open"));
        assert!(problems[2].contains("DIR/loop2.so") && problems[2].contains("cannot open"));
        assert_eq!(
            precheck::check_file(&folder.join("dir.so")).map(|_| ()),
            Err("is a directory, not a plugin file".to_string())
        );
    }

    #[test]
    fn a_library_may_export_a_name_once_per_kind() {
        let component = |kind, name: &str| ComponentInfo {
            kind,
            name: name.into(),
            version: "0.0.0".into(),
            description: String::new(),
        };
        let twice = [
            component(ComponentKind::Tuner, "Twice"),
            component(ComponentKind::Assessor, "Twice"),
            component(ComponentKind::Tuner, "Twice"),
        ];
        expect_test::expect![[r#"
            Err(
                "not a usable knob plugin (it exports tuner Twice twice); rebuild it exporting each name once, or remove it from the plugin path",
            )
        "#]]
        .assert_debug_eq(&check_distinct_names(&twice));
        // One name as a tuner and as an assessor is two components.
        assert_eq!(check_distinct_names(&twice[..2]), Ok(()));
    }

    #[test]
    fn the_abi_version_rule_is_semver_on_the_abi_alone() {
        let (major, minor, patch) = Version::parse(crate::ABI_VERSION).unwrap().core;
        assert!(check_abi_compatible(crate::ABI_VERSION).is_ok());
        // Older and newer minors and patches of the same major load.
        assert!(check_abi_compatible(&format!("{major}.{minor}.{}", patch + 1)).is_ok());
        assert!(check_abi_compatible(&format!("{major}.{}.0", minor + 1)).is_ok());
        assert!(check_abi_compatible(&format!("{major}.0.0")).is_ok());
        let err = check_abi_compatible(&format!("{}.0.0", major + 1)).unwrap_err();
        assert!(err.contains("upgrade knob"), "{err}");
        let err = check_abi_compatible("0.9.0").unwrap_err();
        assert!(err.contains("no longer supports"), "{err}");
        assert!(
            err.contains("rebuild the plugin against knob-plugin-api"),
            "{err}"
        );
        assert!(check_abi_compatible("banana").is_err());
        // The crate's release line (abi_stable's rule), not its patch, must match.
        assert!(check_release_line(crate::API_VERSION).is_ok());
        assert!(check_release_line("0.1.99").is_ok());
        assert!(check_release_line("0.1.0-alpha.1").is_ok());
        assert!(check_release_line("0.2.0")
            .unwrap_err()
            .contains("newer release line"));
        assert!(check_release_line("0.0.9")
            .unwrap_err()
            .contains("older release line"));
    }

    /// Pre-release and build-metadata versions are judged by semver: the suffix used to be
    /// dropped, so a plugin built against `X.Y.Z-alpha.1` passed as `X.Y.Z` (issue 19).
    #[test]
    fn pre_releases_and_build_metadata_follow_semver() {
        let (major, minor, patch) = Version::parse(crate::ABI_VERSION).unwrap().core;
        let host = format!("{major}.{minor}.{patch}");
        // A pre-release ABI is compatible with nothing but itself, even in the same major.
        for pre in [
            format!("{host}-alpha.1"),
            format!("{major}.{}.0-rc.1", minor + 1),
        ] {
            let err = check_abi_compatible(&pre).unwrap_err();
            assert!(err.contains("pre-release plugin ABI"), "{err}");
        }
        // Build metadata changes nothing.
        assert!(check_abi_compatible(&format!("{host}+build.7")).is_ok());
        assert!(check_abi_compatible(&format!("{host}-")).is_err());
        assert!(check_abi_compatible(&format!("{host}-a..b")).is_err());

        let v = |text: &str| Version::parse(text).unwrap();
        // semver.org's own example order.
        let ordered = [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
        ];
        for pair in ordered.windows(2) {
            assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
        }
        assert_eq!(v("1.0.0+a").cmp(&v("1.0.0+b")), std::cmp::Ordering::Equal);
    }
}
