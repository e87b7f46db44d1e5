//! Saying so when a plugin ends the process. Plugins run inside knob's process, so a plugin that
//! calls `exit` (its own code, or a library it wraps that "handles" an error so) ends knob with
//! it, in the middle of an experiment or a `config check`, with the plugin's status and no word
//! of why. Each thread that runs a plugin's code for the host is marked with the component it
//! runs ([`InPlugin`]); an exit hook, registered when plugins are first loaded, writes one line
//! naming it when `exit` is called on such a thread. `abort` and signals run no hook: those
//! show as the process killed by that signal.

use std::cell::Cell;
use std::ffi::{c_int, c_void};

thread_local! {
    /// The component whose code this thread runs for the host, if any. Of a `Copy` type, so
    /// that it has no destructor: glibc runs a thread's destructors before the exit hooks.
    static RUNNING: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Marks the current thread as running `label`'s code ("tuner Foo") until dropped.
pub(crate) struct InPlugin {
    outer: Option<&'static str>,
}

impl InPlugin {
    /// `label` is kept for as long as the process runs (the hook may read it at any time): a
    /// few bytes a component made, which a process makes a handful of.
    pub(crate) fn enter(label: &str) -> InPlugin {
        let label: &'static str = Box::leak(label.to_owned().into_boxed_str());
        InPlugin {
            outer: RUNNING.replace(Some(label)),
        }
    }
}

impl Drop for InPlugin {
    fn drop(&mut self) {
        RUNNING.set(self.outer);
    }
}

/// Registers the exit hook, once a process.
pub(crate) fn say_when_a_plugin_exits() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `atexit` takes a function of no arguments that it calls at `exit`; the hook
        // touches only its thread's mark and writes to fd 2.
        unsafe {
            atexit(plugin_ended_the_process);
        }
    });
}

/// The line for a plugin's `exit`, when the thread calling it runs a plugin's code.
fn exit_line() -> Option<String> {
    let label = RUNNING.try_with(Cell::get).ok().flatten()?;
    Some(format!(
        "error: {label} ended knob's process from inside the plugin (it called exit): plugins run in knob's own process, so a plugin must return an error instead (an experiment it ran is left crashed: `knob resume ID` continues it)\n"
    ))
}

extern "C" fn plugin_ended_the_process() {
    let Some(line) = exit_line() else {
        return;
    };
    // Not through `std::io::stderr()`: another thread may hold its lock for ever now.
    // SAFETY: `write` reads `line.len()` bytes of a live buffer.
    unsafe {
        write(2, line.as_ptr().cast(), line.len());
    }
}

extern "C" {
    fn atexit(function: extern "C" fn()) -> c_int;
    fn write(fd: c_int, buf: *const c_void, count: usize) -> isize;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_thread_marked_as_running_a_plugin_names_it() {
        assert_eq!(exit_line(), None);
        {
            let _tuner = InPlugin::enter("tuner Foo");
            {
                let _inner = InPlugin::enter("assessor Bar");
                assert!(exit_line()
                    .unwrap()
                    .starts_with("error: assessor Bar ended"));
            }
            assert!(exit_line()
                .unwrap()
                .starts_with("error: tuner Foo ended knob's process"));
        }
        assert_eq!(exit_line(), None);
    }
}
