"""An unmodified NNI trial script: it gets parameters from nni and reports an accuracy per
epoch and a final accuracy. The "training" is a synthetic learning curve (no dataset, no GPU)
whose plateau depends on the hyperparameters the way a real MNIST run roughly would."""
import math
import random

import nni


def plateau(params):
    lr_penalty = abs(math.log10(params["lr"]) + 2.0) * 0.04  # best near lr = 0.01
    size_bonus = math.log2(params["hidden_size"] / 128) * 0.01
    batch_penalty = abs(math.log2(params["batch_size"] / 32)) * 0.005
    return 0.99 - lr_penalty + size_bonus - batch_penalty - (1 - params["momentum"]) * 0.02


def main():
    params = nni.get_next_parameter()
    rng = random.Random(repr(sorted(params.items())))
    top = plateau(params)
    accuracy = 0.0
    for epoch in range(1, 11):
        accuracy = top * (1 - math.exp(-epoch / 3)) + rng.gauss(0, 0.002)
        nni.report_intermediate_result(accuracy)
    nni.report_final_result(accuracy)


if __name__ == "__main__":
    main()
