"""Runs the nni-mnist-like trial script unchanged, and records what `nni` handed it and what it
reported, for cli/tests/it/nni.rs: writes `seen-<trial id>.json` in the working directory.

Usage: python record_trial.py mnist_like.py

Also run without nni installed, by knob's `nni` shim (cli/tests/it/nni.rs).
"""
import json
import os
import runpy
import sys

import nni

seen = {
    "nni_version": nni.__version__,
    "experiment_id": nni.get_experiment_id(),
    "trial_id": nni.get_trial_id(),
    "sequence_id": nni.get_sequence_id(),
    "env": {
        name: os.environ.get(name)
        for name in ("NNI_PLATFORM", "NNI_SYS_DIR", "NNI_OUTPUT_DIR", "NNI_TRIAL_COMMAND_CHANNEL")
    },
    "parameter_cfg_offered": os.path.isfile(os.path.join(os.environ["NNI_SYS_DIR"], "parameter.cfg")),
    "parameters": None,
    "intermediate": [],
    "final": [],
}


def recording(function, record):
    def wrapper(*args, **kwargs):
        result = function(*args, **kwargs)
        record(args, result)
        return result

    return wrapper


nni.get_next_parameter = recording(
    nni.get_next_parameter, lambda args, result: seen.__setitem__("parameters", result)
)
nni.report_intermediate_result = recording(
    nni.report_intermediate_result, lambda args, result: seen["intermediate"].append(args[0])
)
nni.report_final_result = recording(
    nni.report_final_result, lambda args, result: seen["final"].append(args[0])
)

runpy.run_path(sys.argv[1], run_name="__main__")


def channel_in_use():
    """The module (and class) through which this nni sent its metrics."""
    if getattr(nni, "__knob_shim__", False):  # knob's shim (python/shim/nni.py): knob's protocol.
        return "knob shim"
    try:  # nni 3.x: one trial command channel object, chosen from the environment.
        from nni.runtime.trial_command_channel import get_default_trial_command_channel
    except ImportError:  # nni 2.x: `nni.runtime.platform` re-exports one platform module.
        from nni.runtime import platform

        return platform.send_metric.__module__
    channel = type(get_default_trial_command_channel())
    return f"{channel.__module__}.{channel.__qualname__}"


seen["channel"] = channel_in_use()
with open(f"seen-{seen['trial_id']}.json", "w") as out:
    json.dump(seen, out)
