"""A user's own NNI tuner, loaded by className, that pays its first request only once a result
has come in, as NNI's PBTTuner and advisors pay a credit: the first `GE` gets no parameters (NNI's
dispatcher answers `NO`), and every later one gets its parameters at once (`TR`). The first
request's parameters go through the dispatcher's `st_callback` when the first result arrives.
`record` (a JSON lines file) gets what it handed out, and when."""

import json
import random
import threading

from nni.tuner import Tuner


class CreditTuner(Tuner):
    def __init__(self, record, seed=0):
        self.record = record
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.callback = None
        self.credit = []
        self.first_asked = False

    def update_search_space(self, search_space):
        pass

    def _hand_out(self, event, parameter_id):
        params = {'x': self.rng.uniform(0, 1)}
        with open(self.record, 'a') as f:
            f.write(json.dumps({'event': event, 'parameter_id': parameter_id, 'parameters': params}) + '\n')
        return params

    def generate_multiple_parameters(self, parameter_id_list, **kwargs):
        with self.lock:
            self.callback = kwargs['st_callback']
            handed = []
            for parameter_id in parameter_id_list:
                if self.first_asked:
                    handed.append(self._hand_out('now', parameter_id))
                else:
                    self.first_asked = True
                    self.credit.append(parameter_id)
            return handed

    def generate_parameters(self, parameter_id, **kwargs):
        raise NotImplementedError('CreditTuner answers through generate_multiple_parameters')

    def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
        with self.lock:
            while self.credit:
                owed = self.credit.pop(0)
                self.callback(owed, self._hand_out('credit', owed))
