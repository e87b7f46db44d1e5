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
    """Ray Tune's PBT with its defaults, on both problems, one population per problem and seed.

    What is compared is as in knob's half: 8 members at once, perturbation_interval 4 (in steps),
    40 steps a member, a checkpoint at every step. What is set only for speed: one Ray for all
    runs (8 logical CPUs, so that the 8 members run at once as knob's trialConcurrency 8 does),
    no dashboard, no per-result loggers, no saving of the experiment's state, workers at the
    harness's priority, actors reused by exploited members (`reuse_actors`), and Ray's storage
    and temporary files in one scratch folder on tmpfs, removed at the end.
    """
    import random
    import shutil
    import tempfile

    import numpy as np

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray lowers its workers' priority by 15 (worker_niceness); knob's trials keep the harness's.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # The CSV, JSON and TensorBoard loggers that Tune adds by default write every result.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # The experiment's state is saved for resuming, which this harness never does.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1000000")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    scratch = tempfile.mkdtemp(prefix="knob-pbt-ray-", dir=shm)
    t0 = time.monotonic()
    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    # Tune prints its tables on stdout even at verbose=0: stdout is kept for the result lines.
    out, sys.stdout = sys.stdout, sys.stderr
    try:
        ray.init(
            num_cpus=POPULATION,
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=False,
            _temp_dir=os.path.join(scratch, "ray"),
        )
        print(f"pbt ray: import and ray.init {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
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
                        with tempfile.TemporaryDirectory(dir=shm) as d:
                            json.dump(state, open(os.path.join(d, "state.json"), "w"))
                            t.report({"score": value, "step": state["step"]}, checkpoint=Checkpoint.from_directory(d))

                # PBT's perturbations draw from `random`, and Ray's samplers from numpy's global state.
                random.seed(seed)
                np.random.seed(seed)
                scheduler = PopulationBasedTraining(
                    time_attr="step",
                    perturbation_interval=4,
                    hyperparam_mutations=spaces[problem],
                    quantile_fraction=0.25,
                    resample_probability=0.25,
                )
                start = time.monotonic()
                tuner = tune.Tuner(
                    trainable,
                    param_space=spaces[problem],
                    tune_config=tune.TuneConfig(
                        metric="score", mode="max", num_samples=POPULATION, scheduler=scheduler, reuse_actors=True
                    ),
                    run_config=tune.RunConfig(
                        name=f"{problem}-{seed}",
                        stop={"step": STEPS},
                        verbose=0,
                        storage_path=os.path.join(scratch, "storage"),
                    ),
                )
                results = tuner.fit()
                best = max(r.metrics.get("score", -math.inf) for r in results if r.metrics)
                shutil.rmtree(os.path.join(scratch, "storage", f"{problem}-{seed}"), ignore_errors=True)
                seconds = round(time.monotonic() - start, 1)
                row = {"method": "ray-pbt", "problem": problem, "seed": seed, "best": best, "seconds": seconds}
                # How many exploits the run made (a private counter of Ray's PBT; absent if renamed).
                if isinstance(getattr(scheduler, "_num_perturbations", None), int):
                    row["perturbations"] = scheduler._num_perturbations
                print(json.dumps(row), file=out, flush=True)
    finally:
        ray.shutdown()
        sys.stdout = out
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "knob":
        knob_trial()
    else:
        ray_pbt([int(s) for s in sys.argv[2:]])
