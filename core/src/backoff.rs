//! The one back-off schedule of the core: a pause that doubles after each failure in a row. A
//! failed trial waits by it before its next attempt (`manager::timers`), and a notification
//! that could not be sent before its next try (`notify::send_with_retry`).

use std::time::Duration;

/// The pause after the `failures`-th failure in a row: `first` after the first (and after
/// none), twice that after the second, and so on, at most `max`.
pub fn doubling(first: Duration, failures: u32, max: Duration) -> Duration {
    first
        .saturating_mul(1u32 << failures.saturating_sub(1).min(31))
        .min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_doubles_up_to_its_bound_and_never_overflows() {
        let s = Duration::from_secs(1);
        let pauses: Vec<u64> = (0..=8)
            .map(|n| doubling(s, n, Duration::from_secs(60)).as_secs())
            .collect();
        assert_eq!(pauses, [1, 1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(doubling(s, u32::MAX, Duration::MAX), s * (1 << 31));
    }
}
