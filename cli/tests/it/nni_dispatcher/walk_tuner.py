"""A user's own NNI tuner, loaded by className: draws each parameter uniformly from a seeded
stream and writes what it hands out and what it is told to `record` (a JSON lines file), so a
test can hold knob's store against what the dispatcher saw (and find the dispatcher's pid). `die_at`: the tuner's process kills
itself (SIGKILL) when asked for that many parameter sets, as a crashing dispatcher would;
`raise_at`: generate_parameters raises then, as a broken tuner does (NNI's Metis under a newer
scipy, for one); `end_delay`: seconds each trial_end takes (a tuner that updates a model
there), so that trials ending together queue their ends behind one another; `think`: seconds
each generate_parameters takes (a GP or Metis tuner fitting its model), recorded as it starts;
`construct`: seconds the constructor takes (a tuner that loads a model), recorded as it starts."""

import json
import logging
import os
import random
import signal
import time

from nni.tuner import Tuner

logger = logging.getLogger('walk_tuner')


class WalkTuner(Tuner):
    def __init__(self, record, optimize_mode='maximize', seed=0, die_at=None, raise_at=None,
                 end_delay=0, think=0, construct=0):
        self.record = record
        if construct:
            self._write(event='constructing', pid=os.getpid())
            time.sleep(construct)
        self.optimize_mode = optimize_mode
        self.rng = random.Random(seed)
        self.die_at = die_at
        self.raise_at = raise_at
        self.end_delay = end_delay
        self.think = think
        self.generated = 0
        self.space = {}

    def _write(self, **entry):
        with open(self.record, 'a') as f:
            f.write(json.dumps(entry) + '\n')

    def update_search_space(self, search_space):
        self.space = search_space
        self._write(event='space', space=search_space, pid=os.getpid(),
                    include_intermediate_results=os.environ.get('NNI_INCLUDE_INTERMEDIATE_RESULTS'),
                    cuda_visible_devices=os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>'),
                    knob_environment=''.join(f'{k}={v}\n' for k, v in sorted(os.environ.items())
                                             if k.startswith('KNOB_')))

    def generate_parameters(self, parameter_id, **kwargs):
        self.generated += 1
        if self.think:
            self._write(event='thinking', parameter_id=parameter_id)
            time.sleep(self.think)
        if self.die_at is not None and self.generated >= self.die_at:
            logger.info('walk_tuner: killing my own dispatcher at parameter %s', parameter_id)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)
        if self.raise_at is not None and self.generated >= self.raise_at:
            raise RuntimeError(f'walk_tuner: raising at parameter {parameter_id}')
        params = {}
        for name, spec in self.space.items():
            low, high = spec['_value']
            params[name] = self.rng.uniform(low, high)
        self._write(event='generate', parameter_id=parameter_id, parameters=params)
        return params

    def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
        self._write(event='result', parameter_id=parameter_id, parameters=parameters, value=value)

    def trial_end(self, parameter_id, success, **kwargs):
        time.sleep(self.end_delay)
        self._write(event='end', parameter_id=parameter_id, success=success)

    def import_data(self, data):
        self._write(event='import', data=data)
