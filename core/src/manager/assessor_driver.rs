//! The assessor driver: what the manager asks of the assessor and tells it.
//!
//! An assessor is a plugin the loop must not wait on: one stuck in a call (waiting on a lock, a
//! dead subprocess, a slow model fit) froze the whole experiment while its verdict was awaited
//! inline: finished trials stayed RUNNING with their results unrecorded, and a stop was never
//! heard. So a verdict is asked for and waited for [`ANSWER_WAIT`] at most, as the tuner's
//! parameters are (`tuner_driver`); a later one is taken in when it comes (`answered`, a branch of
//! the loop's wait), and acted on only if it still means something (the loop checks that the
//! trial runs the same attempt). A trial's final result and its end are *told*: the call is
//! queued on the assessor's thread and the loop goes on. The assessor takes its calls in order,
//! so it sees the same sequence as if each had been waited for; a failed call costs that call
//! (a warning about its trial), never the experiment.
//!
//! A call unanswered for [`LATE_AFTER`] is named once on the console, so that a stuck assessor
//! is not mistaken for trials that never stop.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use knob_plugin_api::host::{AssessorHandle, Reply};
use knob_plugin_api::Verdict;
use tokio::time::Instant;

/// How long asking for a verdict waits for it before the loop goes on without it (taking it
/// when it comes). Medianstop and knob's Curvefitting answer in microseconds, NNI's
/// dispatcher in a few milliseconds: they are acted on in the same turn, as before.
pub(super) const ANSWER_WAIT: Duration = Duration::from_millis(20);

/// A call unanswered this long makes the console name the assessor (once while it stays so).
pub(super) const LATE_AFTER: Duration = Duration::from_secs(30);

/// What the assessor answered that the loop must act on.
#[derive(Debug, PartialEq)]
pub(super) enum Answer {
    /// Stop the trial's attempt `attempt`, for `reason` (if it still runs it).
    Stop {
        trial_id: String,
        attempt: u32,
        reason: String,
    },
    /// A call about the trial failed: that call is lost, the experiment goes on.
    Failed { trial_id: String, message: String },
}

enum Call {
    /// A verdict on the trial's attempt `attempt`; `None`: a resume's replay, whose verdict
    /// nothing acts on.
    Assess(Option<u32>, Reply<Verdict>),
    /// A final result or an end, told; its answer says only whether it failed.
    Told(Reply<()>),
}

/// A call whose answer is not taken in yet.
struct Pending {
    trial_id: String,
    call: Call,
    since: Instant,
}

impl Pending {
    /// Waits for the answer; cut short, it takes nothing (see `Reply::answer`).
    async fn answer(&mut self) -> Option<Answer> {
        let answer = match &mut self.call {
            Call::Assess(attempt, reply) => reply
                .answer()
                .await
                .map(|verdict| stop(&self.trial_id, *attempt, verdict)),
            Call::Told(reply) => reply.answer().await.map(|()| None),
        };
        answer.unwrap_or_else(|e| {
            Some(Answer::Failed {
                trial_id: self.trial_id.clone(),
                message: e.to_string(),
            })
        })
    }

    /// The answer if it is there now.
    fn try_answer(self) -> Result<Option<Answer>, Pending> {
        let Pending {
            trial_id,
            call,
            since,
        } = self;
        let failed = |trial_id: String, e: knob_plugin_api::host::HostError| {
            Some(Answer::Failed {
                trial_id,
                message: e.to_string(),
            })
        };
        match call {
            Call::Assess(attempt, reply) => match reply.try_get() {
                Ok(Ok(verdict)) => Ok(stop(&trial_id, attempt, verdict)),
                Ok(Err(e)) => Ok(failed(trial_id, e)),
                Err(reply) => Err(Pending {
                    trial_id,
                    call: Call::Assess(attempt, reply),
                    since,
                }),
            },
            Call::Told(reply) => match reply.try_get() {
                Ok(Ok(())) => Ok(None),
                Ok(Err(e)) => Ok(failed(trial_id, e)),
                Err(reply) => Err(Pending {
                    trial_id,
                    call: Call::Told(reply),
                    since,
                }),
            },
        }
    }
}

/// What a verdict asks of the loop: a stop of an attempt that runs now.
fn stop(trial_id: &str, attempt: Option<u32>, verdict: Verdict) -> Option<Answer> {
    let attempt = attempt.filter(|_| !verdict.keep_going)?;
    Some(Answer::Stop {
        trial_id: trial_id.to_string(),
        attempt,
        reason: verdict.reason,
    })
}

pub(super) struct AssessorDriver {
    assessor: AssessorHandle,
    /// Calls whose answers are not taken in yet, oldest first: the assessor answers in order.
    pending: VecDeque<Pending>,
    /// Whether the console was told that the oldest pending call is late (`late_warning`).
    told_late: bool,
}

impl AssessorDriver {
    pub fn new(assessor: AssessorHandle) -> AssessorDriver {
        AssessorDriver {
            assessor,
            pending: VecDeque::new(),
            told_late: false,
        }
    }

    /// Lets the assessor go once what it was told has run, and resolves when it has stopped
    /// (see `AssessorHandle::close`); calls still unanswered are dropped.
    pub fn close(self) -> impl std::future::Future<Output = ()> {
        self.assessor.close()
    }

    pub fn label(&self) -> &str {
        self.assessor.label()
    }

    /// Asks for a verdict on attempt `attempt` of `trial_id`, and waits [`ANSWER_WAIT`] at most
    /// for the answers before it and its own; what came is returned, in order. With an earlier
    /// call unanswered for that long already, the assessor is still busy with it: no wait (a
    /// stuck assessor would otherwise cost every result the wait).
    pub async fn assess(
        &mut self,
        trial_id: String,
        attempt: u32,
        history: Arc<Vec<f64>>,
    ) -> Vec<Answer> {
        let mut answers = self.take_answered();
        let busy = self
            .pending
            .front()
            .is_some_and(|oldest| oldest.since.elapsed() >= ANSWER_WAIT);
        // Stuck, the assessor would be handed a copy of every result of every trial until it
        // answers: one call per trial waits, on the history it had, and the next result after
        // it answers is judged on the whole history.
        let stuck = self
            .pending
            .front()
            .is_some_and(|oldest| oldest.since.elapsed() >= LATE_AFTER);
        if stuck
            && self.pending.iter().any(|pending| {
                pending.trial_id == trial_id && matches!(pending.call, Call::Assess(Some(_), _))
            })
        {
            return answers;
        }
        let reply = self.assessor.assess_trial(trial_id.clone(), history);
        self.push(trial_id, Call::Assess(Some(attempt), reply));
        answers.extend(self.take_answered());
        if busy {
            return answers;
        }
        let deadline = Instant::now() + ANSWER_WAIT;
        while let Some(oldest) = self.pending.front_mut() {
            let Ok(answer) = tokio::time::timeout_at(deadline, oldest.answer()).await else {
                break;
            };
            self.pending.pop_front();
            self.told_late = false;
            answers.extend(answer);
        }
        answers
    }

    /// A verdict on a trial of an earlier run, whose answer nothing acts on (a resume's replay
    /// rebuilds what the assessor knows); only a failure is taken in.
    pub fn replay_assess(&mut self, trial_id: String, history: Arc<Vec<f64>>) {
        let reply = self.assessor.assess_trial(trial_id.clone(), history);
        self.push(trial_id, Call::Assess(None, reply));
    }

    /// Tells the assessor a trial's final result.
    pub fn trial_final(&mut self, trial_id: String, value: f64) {
        let reply = self.assessor.trial_final(trial_id.clone(), value);
        self.push(trial_id, Call::Told(reply));
    }

    /// Tells the assessor a trial ended with `status`.
    pub fn trial_end(&mut self, trial_id: String, status: &str) {
        let reply = self.assessor.trial_end(trial_id.clone(), status.into());
        self.push(trial_id, Call::Told(reply));
    }

    fn push(&mut self, trial_id: String, call: Call) {
        self.pending.push_back(Pending {
            trial_id,
            call,
            since: Instant::now(),
        });
    }

    /// Whether some call's answer is still to come: `answered` will wake the loop with it.
    pub fn awaits_answers(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Takes in the answers that have come, in order, up to the first still to come.
    pub fn take_answered(&mut self) -> Vec<Answer> {
        let mut answers = Vec::new();
        while let Some(pending) = self.pending.pop_front() {
            match pending.try_answer() {
                Ok(answer) => {
                    self.told_late = false;
                    answers.extend(answer);
                }
                Err(pending) => {
                    self.pending.push_front(pending);
                    break;
                }
            }
        }
        answers
    }

    /// Waits for the oldest pending call's answer, then takes in it and whatever else has
    /// come; never resolves with none pending. Cut short (another branch of the loop's
    /// `select!` won), it takes nothing.
    pub async fn answered(&mut self) -> Vec<Answer> {
        let Some(oldest) = self.pending.front_mut() else {
            return std::future::pending().await;
        };
        let answer = oldest.answer().await;
        self.pending.pop_front();
        self.told_late = false;
        let mut answers: Vec<Answer> = answer.into_iter().collect();
        answers.extend(self.take_answered());
        answers
    }

    /// When the oldest unanswered call becomes late, unless the console was told already.
    pub fn late_at(&self) -> Option<Instant> {
        let oldest = self.pending.front().filter(|_| !self.told_late)?;
        Some(oldest.since + LATE_AFTER)
    }

    /// The console's line about the late call (once until the assessor answers again).
    pub fn late_warning(&mut self) -> Option<String> {
        if self.told_late {
            return None;
        }
        let oldest = self.pending.front()?;
        self.told_late = true;
        let what = match oldest.call {
            Call::Assess(..) => "a verdict on",
            Call::Told(_) => "the result or end of",
        };
        Some(format!(
            "{} has not answered in {} s when asked {what} trial {}; the experiment goes on without its verdicts until it does (trials run to their own end)",
            self.label(),
            oldest.since.elapsed().as_secs(),
            oldest.trial_id
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knob_plugin_api::host::in_process;
    use knob_plugin_api::{Assessor, AssessorContext, PluginError};
    use std::sync::mpsc;

    /// Answers its first call only when `hold` says so (or is dropped).
    struct Stuck(Option<mpsc::Receiver<()>>);

    impl Assessor for Stuck {
        fn new(_: &serde_json::Value) -> Result<Self, PluginError> {
            unreachable!("built by the test")
        }
        fn assess_trial(&mut self, _: &str, _: &[f64]) -> Result<Verdict, PluginError> {
            if let Some(hold) = self.0.take() {
                let _ = hold.recv();
            }
            Ok(Verdict::stop("late"))
        }
    }

    /// A stuck assessor costs one bounded wait, is named once, and its late verdict still
    /// comes back (for the loop to weigh) once it answers.
    #[tokio::test(start_paused = true)]
    async fn a_stuck_assessor_is_waited_for_once_and_named_once() {
        let (release, hold) = mpsc::channel();
        let handle =
            in_process::assessor_on_thread("Stuck", Stuck(Some(hold)), &AssessorContext::default())
                .unwrap();
        let mut driver = AssessorDriver::new(handle);
        assert_eq!(driver.assess("a".into(), 1, Arc::new(vec![0.5])).await, []);
        driver.trial_end("a".into(), "SUCCEEDED");
        assert!(driver.awaits_answers());
        let late_at = driver.late_at().expect("a late call to name");
        tokio::time::sleep_until(late_at).await;
        let warning = driver.late_warning().expect("named");
        assert!(
            warning.starts_with(
                "assessor Stuck has not answered in 30 s when asked a verdict on trial a;"
            ),
            "{warning}"
        );
        assert_eq!(driver.late_warning(), None);
        assert_eq!(driver.late_at(), None);
        release.send(()).unwrap();
        let answers = driver.answered().await;
        assert_eq!(
            answers.first(),
            Some(&Answer::Stop {
                trial_id: "a".into(),
                attempt: 1,
                reason: "late".into()
            })
        );
    }
}
