"""A population member for knob's PBT tuner: the toy of the PBT paper (Jaderberg et al. 2017).

Q(theta) = 1.2 - theta0^2 - theta1^2 is maximised by gradient ascent on the surrogate
Q_hat(theta | h) = 1.2 - h0 * theta0^2 - h1 * theta1^2, whose hyperparameters h0 and h1 weigh the
two coordinates; `lr` is the step size. A member reports Q after every step (`KNOB_INTERMEDIATE`),
so PBT can copy good members' weights (`theta`) into bad ones and explore their hyperparameters.

The checkpoint protocol (see the README's "Population-based training"):
- save to `$KNOB_CHECKPOINT_DIR` (this member's own folder, the same for all its attempts)
  before reporting the step: knob clones only members that have saved;
- start from your own checkpoint if there is one (an attempt run again after a resume), else
  from `$KNOB_RESTORE_FROM` (the parent's folder, or a copy of it taken when this member was
  created, set when PBT started this member from another one's weights), else from scratch.
Write checkpoints atomically (a temporary file, then a rename): a parent keeps training while its
successor reads its folder.

Only Python's standard library. Each attempt also writes its parameters and what it started
from to `$KNOB_TRIAL_DIR/pbt.json` (the tests read it back).
"""

import json
import os
import time

STEPS = int(os.environ.get("PBT_STEPS", "40"))
STEP_SECONDS = float(os.environ.get("PBT_STEP_SECONDS", "0.05"))

parameters = json.loads(os.environ["KNOB_PARAMETERS"])
trial = os.environ["KNOB_TRIAL_ID"]
own_dir = os.environ["KNOB_CHECKPOINT_DIR"]
restore_dir = os.environ.get("KNOB_RESTORE_FROM")
own = os.path.join(own_dir, "state.json")


def load(path):
    with open(path) as f:
        return json.load(f)


def save(state):
    os.makedirs(own_dir, exist_ok=True)
    temporary = own + ".tmp"
    with open(temporary, "w") as f:
        json.dump(state, f)
    os.replace(temporary, own)


log = {
    "trial": trial,
    "parameters": parameters,
    "restore_from": restore_dir,
    "restored": None,
    "resumed": None,
}
if os.path.exists(own):
    state = load(own)
    log["resumed"] = dict(state)
elif restore_dir:
    state = load(os.path.join(restore_dir, "state.json"))
    log["restored"] = dict(state)
else:
    state = {"step": 0, "theta": [0.9, 0.9]}
log_path = os.path.join(os.environ["KNOB_TRIAL_DIR"], "pbt.json")


def write_log():
    with open(log_path + ".tmp", "w") as f:
        json.dump(log, f)
    os.replace(log_path + ".tmp", log_path)


# Written at once (a member may be stopped before it ends), and again at the end.
write_log()
if log["restored"] is not None:
    # Saved at once: this member has a checkpoint of its own even if the parent's was final.
    save(dict(state, written_by=trial))


def q(theta):
    return 1.2 - theta[0] ** 2 - theta[1] ** 2


lr, h = parameters["lr"], (parameters["h0"], parameters["h1"])
while state["step"] < STEPS:
    theta = state["theta"]
    # Gradient ascent on the surrogate: d/dtheta_i of -h_i theta_i^2.
    state["theta"] = [theta[i] - lr * 2 * h[i] * theta[i] for i in range(2)]
    state["step"] += 1
    state["written_by"] = trial
    save(state)
    print("KNOB_INTERMEDIATE", q(state["theta"]), flush=True)
    time.sleep(STEP_SECONDS)

log["steps"] = state["step"]
write_log()
print("KNOB_FINAL", q(state["theta"]), flush=True)
