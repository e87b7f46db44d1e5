"""A user's own NNI tuner, loaded by className, that answers every request late: it gives no
parameters when asked (so NNI's dispatcher answers `GE` with `NO`), and hands each set out
`delay` seconds later through the dispatcher's `st_callback`, from a timer thread, as NNI's
advisors and PBTTuner pay their credits. `record` (a JSON lines file) gets what it handed out."""

import json
import random
import threading

from nni.tuner import Tuner


class LateTuner(Tuner):
    def __init__(self, record, delay=2.0, seed=0):
        self.record = record
        self.delay = delay
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def update_search_space(self, search_space):
        pass

    def _late(self, callback, parameter_id, params):
        with self.lock:
            with open(self.record, 'a') as f:
                f.write(json.dumps({'event': 'late', 'parameter_id': parameter_id, 'parameters': params}) + '\n')
            callback(parameter_id, params)

    def generate_multiple_parameters(self, parameter_id_list, **kwargs):
        callback = kwargs['st_callback']
        for parameter_id in parameter_id_list:
            params = {'x': self.rng.uniform(0, 1)}
            threading.Timer(self.delay, self._late, args=(callback, parameter_id, params)).start()
        return []

    def generate_parameters(self, parameter_id, **kwargs):
        raise NotImplementedError('LateTuner answers through generate_multiple_parameters')

    def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
        pass
