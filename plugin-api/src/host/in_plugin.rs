//! Saying so when a plugin ends the process. Plugins run inside knob's process, so a plugin that
//! calls `exit` (its own code, or a library it wraps that "handles" an error so) ends knob with
//! it, in the middle of an experiment or a `config check`, with the plugin's status and no word
//! of why. Each thread that runs a plugin's code for the host is marked with the component it
//! runs ([`InPlugin`]); an exit hook, registered when plugins are first loaded, writes one line
//! naming it when `exit` is called on such a thread. A plugin that crashes the process (a fault,
//! SIGSEGV or SIGBUS, an illegal instruction, a division trap, or `abort`) is named the same way
//! by a hook on those signals, which then lets the signal do what it did before: Rust's own
//! stack-overflow report for SIGSEGV and SIGBUS, else the default, the process killed by it.

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

/// Registers the exit hook and the crash hooks, once a process.
pub(crate) fn say_when_a_plugin_exits() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `atexit` takes a function of no arguments that it calls at `exit`; the hook
        // touches only its thread's mark and writes to fd 2.
        unsafe {
            atexit(plugin_ended_the_process);
        }
        crash_hooks::install();
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

/// The hooks on the signals a crash raises. A signal handler may call only async-signal-safe
/// functions: no allocation (the crash may be inside `malloc`), no lock; the line is written
/// in pieces with `write`, and the thread's mark is a `const` thread local of a `Copy` type,
/// read without initialization or registration.
mod crash_hooks {
    use super::RUNNING;
    use std::ffi::{c_int, c_void};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;

    const SIGNALS: [(c_int, &str); 5] = [
        (
            libc::SIGSEGV,
            "SIGSEGV, signal 11: an invalid memory access",
        ),
        (libc::SIGBUS, "SIGBUS, signal 7: an invalid memory access"),
        (libc::SIGILL, "SIGILL, signal 4: an illegal instruction"),
        (libc::SIGFPE, "SIGFPE, signal 8: an arithmetic trap"),
        (libc::SIGABRT, "SIGABRT, signal 6: it called abort"),
    ];

    /// What each signal did before the hook, in the order of [`SIGNALS`]; set before any hook
    /// is installed, so a hook always finds it.
    static PREVIOUS: OnceLock<Vec<libc::sigaction>> = OnceLock::new();

    /// One line a process: Rust's stack-overflow report for SIGSEGV ends in `abort`, which
    /// would otherwise name the plugin a second time.
    static SAID: AtomicBool = AtomicBool::new(false);

    pub(super) fn install() {
        let previous = SIGNALS
            .iter()
            .map(|&(signal, _)| {
                // SAFETY: a zeroed `sigaction` is a valid out-parameter; a null new action
                // only reads the current one.
                unsafe {
                    let mut current: libc::sigaction = std::mem::zeroed();
                    libc::sigaction(signal, std::ptr::null(), &mut current);
                    current
                }
            })
            .collect();
        if PREVIOUS.set(previous).is_err() {
            return;
        }
        for &(signal, _) in &SIGNALS {
            // SAFETY: `crashed` is an `SA_SIGINFO` handler of the matching signature that
            // calls only async-signal-safe functions (see the module's comment).
            unsafe {
                let mut hook: libc::sigaction = std::mem::zeroed();
                hook.sa_sigaction = crashed as *const () as usize;
                hook.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut hook.sa_mask);
                libc::sigaction(signal, &hook, std::ptr::null_mut());
            }
        }
    }

    /// Whether the signal comes from what this thread did: a fault the kernel raised for its
    /// instruction, or `abort`/`raise` in this process. One sent by `kill` from elsewhere may
    /// land on any thread, a plugin's thread waiting for its next call among them: that is no
    /// plugin's crash.
    fn raised_by_this_thread(info: *const libc::siginfo_t) -> bool {
        if info.is_null() {
            return false;
        }
        // SAFETY: the kernel's `siginfo_t` for this signal; `si_pid` is read only for
        // `SI_TKILL`, whose fields hold the sender's pid; `getpid` is async-signal-safe.
        unsafe {
            let code = (*info).si_code;
            code > 0 || (code == libc::SI_TKILL && (*info).si_pid() == libc::getpid())
        }
    }

    extern "C" fn crashed(signal: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
        let index = SIGNALS.iter().position(|&(s, _)| s == signal);
        let label = RUNNING.try_with(|r| r.get()).ok().flatten();
        if let (Some(index), Some(label), true) = (index, label, raised_by_this_thread(info)) {
            if !SAID.swap(true, Ordering::Relaxed) {
                for piece in [
                    "error: ",
                    label,
                    " crashed knob's process from inside the plugin (",
                    SIGNALS[index].1,
                    "): plugins run in knob's own process, so a crash in one ends knob (an experiment it ran is left crashed: `knob resume ID` continues it)\n",
                ] {
                    // SAFETY: `write` reads `piece.len()` bytes of a live string.
                    unsafe {
                        libc::write(2, piece.as_ptr().cast(), piece.len());
                    }
                }
            }
        }
        let previous = index.and_then(|index| PREVIOUS.get().map(|all| all[index]));
        match previous {
            Some(action)
                if action.sa_sigaction != libc::SIG_DFL && action.sa_sigaction != libc::SIG_IGN =>
            {
                // SAFETY: the handler that was installed before, called as it asked to be
                // (with `SA_SIGINFO`, three arguments; else one).
                unsafe {
                    if action.sa_flags & libc::SA_SIGINFO != 0 {
                        let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                            std::mem::transmute(action.sa_sigaction);
                        handler(signal, info, context);
                    } else {
                        let handler: extern "C" fn(c_int) =
                            std::mem::transmute(action.sa_sigaction);
                        handler(signal);
                    }
                }
            }
            _ => {
                // The default again, and the signal raised anew: it is blocked until this
                // handler returns, then kills the process as it would have (a fault's
                // instruction is not run again first).
                // SAFETY: `signal` and `raise` are async-signal-safe.
                unsafe {
                    libc::signal(signal, libc::SIG_DFL);
                    libc::raise(signal);
                }
            }
        }
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
