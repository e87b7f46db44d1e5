"""A user's own NNI assessor, loaded by className, that takes `think` seconds over each verdict
and stops every trial at its first intermediate result: its kill reaches knob well after the
result, while the trial waits long before its next one."""

import time

from nni.assessor import Assessor, AssessResult


class SlowStop(Assessor):
    def __init__(self, think=1.0):
        self.think = think

    def assess_trial(self, trial_job_id, trial_history):
        time.sleep(self.think)
        return AssessResult.Bad

    def trial_end(self, trial_job_id, success):
        pass
