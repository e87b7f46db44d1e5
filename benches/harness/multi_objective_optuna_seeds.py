"""Optuna's TPE alone on any seeds, the counterpart of tuners/examples/mo_driver.rs for comparing
knob's default with Optuna on seeds neither was tuned on (benches/README.md, multi_objective.sh).

    .ci-cache/optuna-fanova/bin/python benches/harness/multi_objective_optuna_seeds.py \
        PROBLEM FIRST_SEED LAST_SEED TRIALS      # e.g. zdt3 100 119 200

TPESampler(seed=s) with Optuna's defaults and the ask/tell loop of multi_objective.py (points
round-trip through JSON as there); the problems as in multi_objective_problems.rs; prints one
line per seed: problem, seed, hypervolume of all trials against the harness's reference point
(exact, Optuna's own), seconds. Seed 0 of zdt1 x 100 trials gives 9.1785, as the harness."""
import json, math, sys, time
import numpy as np
import optuna
from optuna._hypervolume import compute_hypervolume
optuna.logging.set_verbosity(optuna.logging.WARNING)

def zdt_g(x):
    return 1.0 + 9.0 * sum(x[1:]) / (len(x) - 1)
def zdt1(x):
    g = zdt_g(x); return [x[0], g * (1.0 - math.sqrt(x[0] / g))]
def zdt2(x):
    g = zdt_g(x); return [x[0], g * (1.0 - (x[0] / g) ** 2)]
def zdt3(x):
    g = zdt_g(x); r = x[0] / g
    return [x[0], g * (1.0 - math.sqrt(r) - r * math.sin(10.0 * math.pi * x[0]))]
def dtlz2(x):
    g = sum((v - 0.5) ** 2 for v in x[2:]); a = x[0] * math.pi / 2; b = x[1] * math.pi / 2
    return [(1 + g) * math.cos(a) * math.cos(b), (1 + g) * math.cos(a) * math.sin(b), (1 + g) * math.sin(a)]
PROBLEMS = {"zdt1": (30, [1.1, 11.0], zdt1), "zdt2": (30, [1.1, 11.0], zdt2),
            "zdt3": (30, [1.1, 11.0], zdt3), "dtlz2": (12, [3.85] * 3, dtlz2)}

if len(sys.argv) != 5 or sys.argv[1] not in PROBLEMS:
    sys.exit(f"usage: PROBLEM ({', '.join(PROBLEMS)}) FIRST_SEED LAST_SEED TRIALS")
name, lo, hi, trials = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dims, ref, f = PROBLEMS[name]
for seed in range(lo, hi + 1):
    t0 = time.time()
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed),
                                directions=["minimize"] * len(ref))
    points = []
    for _ in range(trials):
        trial = study.ask()
        x = [trial.suggest_float(f"x{i}", 0.0, 1.0) for i in range(dims)]
        x = json.loads(json.dumps(x))
        v = f(x); points.append(v); study.tell(trial, v)
    pts = np.array(points)
    hv = compute_hypervolume(pts, np.array(ref))
    print(f"{name} {seed} {hv:.6f} {time.time() - t0:.0f}s", flush=True)
