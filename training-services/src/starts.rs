//! Starts under way in the background, by trial, for the services whose starts wait on a
//! remote answer (`remote`; `slurm`, in an allocation or as a trial's own job's `sbatch`) when
//! the host takes late start failures (`ServiceContext::late_start_failures`). A kill of a
//! trial, a later attempt's start of it, and the service's shutdown wait for its start to be
//! over.

use std::collections::HashMap;

use tokio::sync::watch;

/// The starts under way, by trial.
#[derive(Default)]
pub(crate) struct StartsUnderWay(HashMap<String, watch::Receiver<()>>);

/// Held by a start while it runs; dropping it says the start is over.
pub(crate) struct Running {
    _sender: watch::Sender<()>,
}

/// Resolves once a start is over.
pub(crate) struct Over(watch::Receiver<()>);

impl StartsUnderWay {
    /// A start of `trial_id` begins: what it holds while it runs, and the start of an earlier
    /// attempt of the trial if that one is still under way (its host was lost meanwhile, which
    /// ended the attempt), which the new one goes after.
    pub fn begin(&mut self, trial_id: &str) -> (Running, Option<Over>) {
        self.0.retain(|_, over| over.has_changed().is_ok());
        let (running, over) = watch::channel(());
        let earlier = self.0.insert(trial_id.to_string(), over).map(Over);
        (Running { _sender: running }, earlier)
    }

    /// The start of `trial_id`, if one was begun and may still be under way.
    pub fn of(&self, trial_id: &str) -> Option<Over> {
        self.0.get(trial_id).cloned().map(Over)
    }

    /// Every start begun so far, forgotten here.
    pub fn take_all(&mut self) -> Vec<Over> {
        std::mem::take(&mut self.0)
            .into_values()
            .map(Over)
            .collect()
    }
}

impl Over {
    pub async fn wait(mut self) {
        // Answers an error once the start dropped its sender (nothing is ever sent).
        while self.0.changed().await.is_ok() {}
    }
}
