"""A user's own NNI assessor, loaded by className: stops a trial once it has `after`
intermediate results and the last one is below `threshold`."""

from nni.assessor import Assessor, AssessResult


class ThresholdStop(Assessor):
    def __init__(self, threshold, after=2):
        self.threshold = threshold
        self.after = after

    def assess_trial(self, trial_job_id, trial_history):
        if len(trial_history) >= self.after and trial_history[-1] < self.threshold:
            return AssessResult.Bad
        return AssessResult.Good

    def trial_end(self, trial_job_id, success):
        pass
