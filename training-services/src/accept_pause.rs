//! How a server's accept loop waits after a failed accept.

use std::time::Duration;

/// The pause of an accept loop while its accepts fail. Out of file descriptors, say, the
/// refused connection stays in the backlog and the listener reads as ready again at once:
/// trying again without a pause spins a core (and a loop that says each failure fills its log)
/// until a descriptor frees. The pause starts at 1 ms and doubles up to 100 ms while accepts
/// fail; an accept that works starts it again at 1 ms.
#[derive(Debug)]
pub(crate) struct AcceptPause {
    next: Duration,
    failures: u64,
}

impl AcceptPause {
    const FIRST: Duration = Duration::from_millis(1);
    pub(crate) const LONGEST: Duration = Duration::from_millis(100);

    pub(crate) fn new() -> AcceptPause {
        AcceptPause {
            next: AcceptPause::FIRST,
            failures: 0,
        }
    }

    /// An accept failed: how long to wait before the next one.
    pub(crate) fn failed(&mut self) -> Duration {
        self.failures += 1;
        let pause = self.next;
        self.next = (pause * 2).min(AcceptPause::LONGEST);
        pause
    }

    /// Whether the last failure was the first of its run (the one worth saying).
    pub(crate) fn first_failure(&self) -> bool {
        self.failures == 1
    }

    /// An accept worked: how many failed in a row before it.
    pub(crate) fn succeeded(&mut self) -> u64 {
        self.next = AcceptPause::FIRST;
        std::mem::take(&mut self.failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_doubles_to_its_longest_and_starts_again_after_a_success() {
        let mut pause = AcceptPause::new();
        let pauses: Vec<u128> = (0..9).map(|_| pause.failed().as_millis()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 64, 100, 100]);
        assert!(!pause.first_failure());
        assert_eq!(pause.succeeded(), 9);
        assert_eq!(pause.failed(), Duration::from_millis(1));
        assert!(pause.first_failure());
    }
}
