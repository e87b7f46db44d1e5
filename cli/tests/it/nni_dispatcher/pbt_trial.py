"""A small numpy model trained one PBT step per trial, as NNI's PBTTuner expects of a trial:
it loads the checkpoint in `load_checkpoint_dir` when there is one, takes a few gradient steps
towards a fixed target with its `lr`, saves the weights to `save_checkpoint_dir`, and reports
minus the squared error. Beside the weights it writes `trial.json`: which directory it loaded
from, the weights it found there and those it saved, so a test can check from the trial's own
files that each load read what an earlier trial had saved."""

import json
import os

import numpy as np

import nni

TARGET = np.array([1.0, -1.0, 0.5])

params = nni.get_next_parameter()
load_dir = params['load_checkpoint_dir']
save_dir = params['save_checkpoint_dir']
checkpoint = os.path.join(load_dir, 'model.npy')
loaded = os.path.isfile(checkpoint)
weights = np.load(checkpoint) if loaded else np.zeros_like(TARGET)
weights_in = weights.copy()
for _ in range(3):
    weights = weights - params['lr'] * 2.0 * (weights - TARGET)
os.makedirs(save_dir, exist_ok=True)
np.save(os.path.join(save_dir, 'model.npy'), weights)
with open(os.path.join(save_dir, 'trial.json'), 'w') as f:
    json.dump({
        'load_checkpoint_dir': load_dir,
        'save_checkpoint_dir': save_dir,
        'loaded': loaded,
        'weights_in': weights_in.tolist(),
        'weights_out': weights.tolist(),
    }, f)
nni.report_final_result(-float(np.sum((weights - TARGET) ** 2)))
