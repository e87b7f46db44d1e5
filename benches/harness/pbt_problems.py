"""The two problems of benches/harness/pbt.sh, as a knob trial and as a Ray Tune trainable.

- toy: the PBT paper's toy (Jaderberg et al. 2017, section 4.1): maximise
  Q(theta) = 1.2 - theta0^2 - theta1^2 from theta = (0.9, 0.9) by gradient ascent on the
  surrogate Q_hat(theta | h) = 1.2 - h0 theta0^2 - h1 theta1^2, step 0.02: h0 and h1 in [0, 1]
  are the coordinates' step sizes. A step reports Q.
- logreg: logistic regression trained by minibatch SGD (10 minibatches of 8 a step) on a fixed
  synthetic data set: 20 000 training and 5 000 validation points, 20 features, labels drawn
  from a logistic model whose weights have norm 10 (the Bayes log-loss is 0.134); `lr` in
  [1e-3, 10] (log). A step reports minus the validation log-loss. The best learning rate falls
  during training: the best constant rate for 1 step is 1.8, for 4 to 12 steps 1.0, for 20 to 40
  steps 0.56 (-0.159 at step 40), while a decaying rate (3 x 0.9^step) ends at -0.136 (measured
  with this file's data; see benches/README.md). The first version (2 000 points, 10% flipped
  labels, minibatches of 32) was not schedule-dependent: its best constant rate (0.03) beat
  every large-then-small schedule, and its validation loss rose again with training.

Every member runs STEPS steps in all (a clone continues from its parent's step), so at equal
steps each method spends population x STEPS. The checkpoint protocol is the README's: save to
$KNOB_CHECKPOINT_DIR before reporting, start from it, else from $KNOB_RESTORE_FROM.

  python pbt_problems.py knob            # a knob trial (PBT_PROBLEM, PBT_STEPS, PBT_STEP_SECONDS)
  python pbt_problems.py ray SEEDS...    # Ray Tune's PBT on both problems; prints JSON lines
"""

import json
import math
import os
import sys
import time

STEPS = int(os.environ.get("PBT_STEPS", "40"))
POPULATION = 8


def toy_init():
    return {"step": 0, "theta": [0.9, 0.9]}


def toy_step(state, p):
    h = (p["h0"], p["h1"])
    state["theta"] = [t - 0.02 * 2 * h[i] * t for i, t in enumerate(state["theta"])]
    return 1.2 - state["theta"][0] ** 2 - state["theta"][1] ** 2


_DATA = None
BATCH = 8


def data():
    global _DATA
    if _DATA is None:
        import numpy as np

        rng = np.random.default_rng(12345)
        x = rng.normal(size=(25000, 20))
        w = rng.normal(size=20)
        w *= 10 / np.linalg.norm(w)
        y = (rng.random(25000) < 1 / (1 + np.exp(-(x @ w)))).astype(float)
        x = np.hstack([x, np.ones((25000, 1))])
        _DATA = (x[:20000], y[:20000], x[20000:], y[20000:])
    return _DATA


def logreg_init():
    return {"step": 0, "w": [0.0] * 21}


def logreg_step(state, p):
    import numpy as np

    x, y, vx, vy = data()
    w = np.array(state["w"])
    # The minibatches depend on the step only: every member sees the same data at a step.
    rng = np.random.default_rng(state["step"] * 7919 + 17)
    for _ in range(10):
        idx = rng.integers(0, len(x), BATCH)
        z = np.clip(x[idx] @ w, -30, 30)
        grad = x[idx].T @ (1 / (1 + np.exp(-z)) - y[idx]) / BATCH
        w = w - p["lr"] * grad
    state["w"] = w.tolist()
    prob = np.clip(1 / (1 + np.exp(-np.clip(vx @ w, -30, 30))), 1e-9, 1 - 1e-9)
    loss = -np.mean(vy * np.log(prob) + (1 - vy) * np.log(1 - prob))
    return -float(loss)


PROBLEMS = {"toy": (toy_init, toy_step), "logreg": (logreg_init, logreg_step)}


def knob_trial():
    init, step = PROBLEMS[os.environ.get("PBT_PROBLEM", "toy")]
    delay = float(os.environ.get("PBT_STEP_SECONDS", "0.02"))
    p = json.loads(os.environ["KNOB_PARAMETERS"])
    own_dir = os.environ["KNOB_CHECKPOINT_DIR"]
    own = os.path.join(own_dir, "state.json")
    restore = os.environ.get("KNOB_RESTORE_FROM")
    if os.path.exists(own):
        state = json.load(open(own))
    elif restore and os.path.exists(os.path.join(restore, "state.json")):
        state = json.load(open(os.path.join(restore, "state.json")))
    else:
        state = init()
    value = None
    os.makedirs(own_dir, exist_ok=True)
    while state["step"] < STEPS:
        value = step(state, p)
        state["step"] += 1
        with open(own + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(own + ".tmp", own)
        print("KNOB_INTERMEDIATE", value, flush=True)
        time.sleep(delay)
    print("KNOB_FINAL", value if value is not None else "NaN", flush=True)


def ray_pbt(seeds):
    import random
    import tempfile

    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    ray.init(num_cpus=POPULATION, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    spaces = {
        "toy": {"h0": tune.uniform(0, 1), "h1": tune.uniform(0, 1)},
        "logreg": {"lr": tune.loguniform(1e-3, 10)},
    }
    for problem, (init, step) in PROBLEMS.items():
        for seed in seeds:

            def trainable(config, init=init, step=step):
                from ray import tune as t
                from ray.tune import Checkpoint

                state = init()
                checkpoint = t.get_checkpoint()
                if checkpoint:
                    with checkpoint.as_directory() as d:
                        state = json.load(open(os.path.join(d, "state.json")))
                while state["step"] < STEPS:
                    value = step(state, config)
                    state["step"] += 1
                    with tempfile.TemporaryDirectory() as d:
                        json.dump(state, open(os.path.join(d, "state.json"), "w"))
                        t.report({"score": value, "step": state["step"]}, checkpoint=Checkpoint.from_directory(d))

            random.seed(seed)
            scheduler = PopulationBasedTraining(
                time_attr="step",
                perturbation_interval=4,
                hyperparam_mutations=spaces[problem],
                quantile_fraction=0.25,
                resample_probability=0.25,
            )
            tuner = tune.Tuner(
                trainable,
                param_space=spaces[problem],
                tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=POPULATION, scheduler=scheduler),
                run_config=tune.RunConfig(stop={"step": STEPS}, verbose=0, storage_path=tempfile.mkdtemp()),
            )
            results = tuner.fit()
            best = max(r.metrics.get("score", -math.inf) for r in results if r.metrics)
            print(json.dumps({"method": "ray-pbt", "problem": problem, "seed": seed, "best": best}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "knob":
        knob_trial()
    else:
        ray_pbt([int(s) for s in sys.argv[2:]])
