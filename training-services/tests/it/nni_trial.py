"""A trial as NNI users write it, nothing knob-specific. Run by tests/it/real_nni.rs with the
real `nni` package, over the v3 HTTP channel and over the 2.x file channel."""

import json
import os

import nni

params = nni.get_next_parameter()
# Which parameters arrived, for the test to check they are this trial's own.
with open(os.path.join(os.environ["KNOB_TRIAL_DIR"], "received.json"), "w") as f:
    json.dump(params, f)

x = params["x"]
for step in range(3):
    nni.report_intermediate_result(x * step)
nni.report_intermediate_result(float("nan"))
nni.report_final_result({"default": x, "steps": 3})
print("finished")  # nni sends this to $NNI_OUTPUT_DIR/trial.log
