"""Optuna's side of knob's tuner quality harness (benches/harness/tuner_quality.rs).

Reads studies from stdin, one JSON line each: {"sampler": "tpe" | "random", "seed": S,
"space": <NNI search space>, "trials": N}. For each, asks Optuna for N points one after another:
writes each point as an NNI parameters object (one JSON line on stdout) and reads its objective
value back (one line on stdin), so the objective is computed by the Rust harness for Optuna and
knob alike. TPE runs with Optuna's defaults.
"""

import json
import math
import sys

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)


def suggest(trial, space, prefix=""):
    """An NNI parameters object for `space`, its values drawn by `trial`."""
    params = {}
    for name, spec in space.items():
        if name == "_name":
            continue
        label = prefix + name
        kind, args = spec["_type"], spec["_value"]
        if kind == "choice":
            if all(isinstance(v, dict) and "_name" in v for v in args):
                names = [v["_name"] for v in args]
                chosen = trial.suggest_categorical(label, names)
                option = args[names.index(chosen)]
                params[name] = {"_name": chosen, **suggest(trial, option, f"{label}/{chosen}/")}
            else:
                index = trial.suggest_categorical(label, list(range(len(args))))
                params[name] = args[index]
        elif kind == "randint":
            params[name] = trial.suggest_int(label, args[0], args[1] - 1)
        elif kind in ("uniform", "loguniform"):
            params[name] = trial.suggest_float(label, args[0], args[1], log=kind == "loguniform")
        elif kind == "quniform":
            low, high, q = args
            steps = (high - low) / q
            if abs(steps - round(steps)) > 1e-9:
                raise SystemExit(f"quniform {args}: the harness needs (high - low) a multiple of q")
            params[name] = trial.suggest_float(label, low, high, step=q)
        else:
            raise SystemExit(f"the Optuna driver does not translate _type {kind}")
    return params


def main():
    for line in sys.stdin:
        study_spec = json.loads(line)
        seed = study_spec["seed"]
        if study_spec["sampler"] == "tpe":
            sampler = optuna.samplers.TPESampler(seed=seed)
        else:
            sampler = optuna.samplers.RandomSampler(seed=seed)
        study = optuna.create_study(sampler=sampler, direction="minimize")
        for _ in range(study_spec["trials"]):
            trial = study.ask()
            print(json.dumps(suggest(trial, study_spec["space"])), flush=True)
            value = float(sys.stdin.readline())
            study.tell(trial, value if math.isfinite(value) else float("inf"))


if __name__ == "__main__":
    main()
