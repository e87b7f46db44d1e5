"""Optuna's FanovaImportanceEvaluator on trials given as JSON (stdin), for knob's importance test.

Input: {"params": [{"name", "type": "float"|"log"|"choice", "low", "high", "choices"}],
        "trials": [{"params": {name: value}, "value": y}], "seed": int}
Output: {name: importance} (Optuna's, summing to 1).
"""
import json
import sys

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.importance import FanovaImportanceEvaluator

optuna.logging.set_verbosity(optuna.logging.WARNING)
problem = json.load(sys.stdin)
distributions = {}
for p in problem["params"]:
    if p["type"] == "choice":
        distributions[p["name"]] = CategoricalDistribution(p["choices"])
    else:
        distributions[p["name"]] = FloatDistribution(p["low"], p["high"], log=p["type"] == "log")
study = optuna.create_study(direction="maximize")
for t in problem["trials"]:
    study.add_trial(optuna.trial.create_trial(params=t["params"], distributions=distributions, value=t["value"]))
importances = optuna.importance.get_param_importances(
    study, evaluator=FanovaImportanceEvaluator(seed=problem["seed"]), normalize=True)
json.dump({k: float(v) for k, v in importances.items()}, sys.stdout)
