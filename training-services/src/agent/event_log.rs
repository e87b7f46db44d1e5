//! The daemon's numbered, unacknowledged events: what a re-attaching service gets replayed.

use std::collections::VecDeque;

use knob_plugin_api::service::{MetricKind, ServiceEvent};

use crate::agent_protocol::unix_ms;

/// Unacknowledged events kept at most; beyond this the oldest that a trial's life does not
/// need are dropped (and the next client is told how many), so a manager that never comes back
/// cannot exhaust the host's memory before the orphan timeout ends the daemon.
pub const MAX_BUFFERED_EVENTS: usize = 200_000;

/// Whether the service can do without `event`: an intermediate result, a warning, a report
/// of the host or of a trial's peak usage. A trial's start, final result, checkpoint and end
/// are kept: a dropped end left the trial running in the core for ever.
fn expendable(event: &ServiceEvent) -> bool {
    match event {
        ServiceEvent::Metric { kind, .. } => *kind == MetricKind::Intermediate,
        ServiceEvent::Warning { .. }
        | ServiceEvent::Environment { .. }
        | ServiceEvent::TrialUsage { .. } => true,
        _ => false,
    }
}

/// Events numbered 1, 2, 3, ... for the daemon's life; kept until acknowledged.
#[derive(Debug)]
pub struct EventLog {
    next_seq: u64,
    /// (seq, when it was recorded in Unix ms, the event).
    buffer: VecDeque<(u64, i64, ServiceEvent)>,
    capacity: usize,
    dropped: u64,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog::with_capacity(MAX_BUFFERED_EVENTS)
    }
}

impl EventLog {
    pub fn with_capacity(capacity: usize) -> EventLog {
        EventLog {
            next_seq: 1,
            buffer: VecDeque::new(),
            capacity: capacity.max(1),
            dropped: 0,
        }
    }

    /// Numbers and keeps an event, recorded now; returns its seq.
    pub fn push(&mut self, event: ServiceEvent) -> u64 {
        self.push_at(event, unix_ms())
    }

    /// Numbers and keeps an event recorded at `time_ms` (Unix ms); returns its seq.
    pub fn push_at(&mut self, event: ServiceEvent, time_ms: i64) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.buffer.len() == self.capacity {
            // The oldest expendable ones, an eighth of the buffer at once: one pass over it
            // then makes room for many pushes (removing one at a time scanned and shifted up
            // to the whole 200 000 for every event while the service stayed away). Only a
            // buffer of nothing else loses its oldest.
            let room = (self.capacity / 8).max(1);
            let mut freed = 0;
            self.buffer.retain(|(_, _, event)| {
                let drop = freed < room && expendable(event);
                freed += usize::from(drop);
                !drop
            });
            if freed == 0 {
                self.buffer.pop_front();
                freed = 1;
            }
            self.dropped += freed as u64;
        }
        self.buffer.push_back((seq, time_ms, event));
        seq
    }

    /// Drops events up to and including `seq`: the service has them.
    pub fn ack(&mut self, seq: u64) {
        while self.buffer.front().is_some_and(|(s, _, _)| *s <= seq) {
            self.buffer.pop_front();
        }
    }

    /// Forgets every buffered event (a fresh start); numbering goes on.
    pub fn clear(&mut self) {
        self.buffer.clear();
        self.dropped = 0;
    }

    /// Prepares a replay for a service that has seen events up to `last_seq`: returns the
    /// buffered events after it. A `last_seq` at or beyond this daemon's numbering means the
    /// service numbered events of an earlier daemon (this one was restarted): numbering then
    /// continues after `last_seq`, so the service never sees a seq twice.
    /// Each comes with the time it was recorded (Unix ms).
    pub fn resume_after(&mut self, last_seq: u64) -> Vec<(u64, i64, ServiceEvent)> {
        if last_seq >= self.next_seq {
            // The buffered events are the ones the service lacks: they follow `last_seq`.
            let first = self
                .buffer
                .front()
                .map_or(self.next_seq, |(seq, _, _)| *seq);
            let shift = last_seq + 1 - first;
            for (seq, _, _) in &mut self.buffer {
                *seq += shift;
            }
            self.next_seq += shift;
            return self.buffer.iter().cloned().collect();
        }
        self.buffer
            .iter()
            .filter(|(seq, _, _)| *seq > last_seq)
            .cloned()
            .collect()
    }

    /// How many events were dropped since the last call (the buffer was full).
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warning(text: &str) -> ServiceEvent {
        ServiceEvent::Warning {
            trial_id: None,
            message: text.to_string(),
        }
    }

    fn seqs(events: &[(u64, i64, ServiceEvent)]) -> Vec<u64> {
        events.iter().map(|(s, _, _)| *s).collect()
    }

    fn metric(trial: &str, kind: MetricKind, sequence: u64) -> ServiceEvent {
        ServiceEvent::Metric {
            trial_id: trial.to_string(),
            kind,
            sequence,
            value: "0.5".to_string(),
        }
    }

    /// A service away while trials report many intermediate results: when the buffer is full,
    /// those go (oldest first), and the trials' starts, finals and ends stay. The oldest event
    /// went whatever it was, and a trial whose end it was ran in the core for ever.
    #[test]
    fn a_full_buffer_drops_intermediate_results_not_a_trials_start_final_or_end() {
        let mut log = EventLog::with_capacity(4);
        log.push(ServiceEvent::TrialStarted {
            trial_id: "t".into(),
            pid: Some(7),
        });
        for sequence in 0..10 {
            log.push(metric("t", MetricKind::Intermediate, sequence));
        }
        log.push(metric("t", MetricKind::Final, 0));
        log.push(ServiceEvent::TrialEnded {
            trial_id: "t".into(),
            exit_code: Some(0),
            signal: None,
            killed_reason: None,
            stderr_tail: String::new(),
            ended_ms: None,
            environment_lost: None,
        });
        let kept: Vec<ServiceEvent> = log.resume_after(0).into_iter().map(|(_, _, e)| e).collect();
        assert!(
            matches!(kept[0], ServiceEvent::TrialStarted { .. }),
            "{kept:?}"
        );
        assert_eq!(kept[1], metric("t", MetricKind::Intermediate, 9));
        assert_eq!(kept[2], metric("t", MetricKind::Final, 0));
        assert!(
            matches!(kept[3], ServiceEvent::TrialEnded { .. }),
            "{kept:?}"
        );
        assert_eq!(log.take_dropped(), 9);
        // Nothing expendable left: the oldest goes, so memory stays bounded.
        log.push(ServiceEvent::TrialStarted {
            trial_id: "u".into(),
            pid: None,
        });
        log.push(ServiceEvent::TrialStarted {
            trial_id: "v".into(),
            pid: None,
        });
        assert_eq!(log.len(), 4);
        assert_eq!(log.take_dropped(), 2);
    }

    /// A full buffer makes room an eighth at a time, so that a service away for long does not
    /// cost a pass over the whole buffer for every event.
    #[test]
    fn a_full_buffer_makes_room_for_many_events_at_once() {
        let mut log = EventLog::with_capacity(16);
        for sequence in 0..17 {
            log.push(metric("t", MetricKind::Intermediate, sequence));
        }
        assert_eq!(log.take_dropped(), 2);
        assert_eq!(log.len(), 15);
        log.push(metric("t", MetricKind::Intermediate, 17));
        assert_eq!(log.take_dropped(), 0);
        let kept: Vec<ServiceEvent> = log.resume_after(0).into_iter().map(|(_, _, e)| e).collect();
        assert_eq!(kept[0], metric("t", MetricKind::Intermediate, 2));
    }

    #[test]
    fn replay_ack_and_restarted_numbering() {
        let mut log = EventLog::with_capacity(3);
        for name in ["a", "b", "c"] {
            log.push(warning(name));
        }
        assert_eq!(seqs(&log.resume_after(1)), [2, 3]);
        log.ack(2);
        assert_eq!(seqs(&log.resume_after(0)), [3]);
        // Full: the oldest goes, and is counted.
        log.push(warning("d"));
        log.push(warning("e"));
        log.push(warning("f"));
        assert_eq!(seqs(&log.resume_after(0)), [4, 5, 6]);
        assert_eq!(log.take_dropped(), 1);
        assert_eq!(log.take_dropped(), 0);
        // A service that saw seq 40 from an earlier daemon: numbering moves past it.
        assert_eq!(seqs(&log.resume_after(40)), [41, 42, 43]);
        assert_eq!(log.push(warning("g")), 44);
        log.clear();
        assert!(log.is_empty());
        assert_eq!(log.push(warning("h")), 45);
    }
}
