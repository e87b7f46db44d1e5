"""Optuna's side of knob's multi-objective harness (benches/harness/multi_objective.rs).

Reads studies from stdin, one JSON line each: {"sampler": "nsga2" | "tpe", "seed": S,
"dims": D, "objectives": M, "trials": N}. For each, asks Optuna for N points one after another
over x0..x{D-1} in [0, 1]: writes each point as an NNI parameters object (one JSON line on
stdout) and reads its M objective values back (one JSON list on stdin), so the objectives are
computed by the Rust harness for Optuna and knob alike. Both samplers run with Optuna's defaults
(NSGAIISampler: population 50; TPESampler: 10 start-up trials, univariate).
"""

import json
import sys

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)


def main():
    for line in sys.stdin:
        spec = json.loads(line)
        seed = spec["seed"]
        if spec["sampler"] == "nsga2":
            sampler = optuna.samplers.NSGAIISampler(seed=seed)
        elif spec["sampler"] == "tpe":
            sampler = optuna.samplers.TPESampler(seed=seed)
        else:
            raise SystemExit(f"unknown sampler {spec['sampler']}")
        study = optuna.create_study(sampler=sampler, directions=["minimize"] * spec["objectives"])
        for _ in range(spec["trials"]):
            trial = study.ask()
            params = {f"x{i}": trial.suggest_float(f"x{i}", 0.0, 1.0) for i in range(spec["dims"])}
            print(json.dumps(params), flush=True)
            values = json.loads(sys.stdin.readline())
            study.tell(trial, values)


if __name__ == "__main__":
    print(f"optuna {optuna.__version__}", file=sys.stderr, flush=True)
    main()
