#!/usr/bin/env bash
# Multi-objective quality: knob's NSGA2, multi-objective TPE and Random (through the plugin ABI)
# against Optuna's NSGAIISampler and TPESampler, on ZDT1, ZDT2, ZDT3 (30-D) and 3-objective
# DTLZ2 (12-D), 10 seeds, 200 trials, the hypervolume of each run's trials against a fixed
# reference point per problem; prints medians and ratios to Optuna's best.
#
#   benches/harness/multi_objective.sh [more arguments of multi_objective.rs: --seeds N,
#                                       --trials N, --problems a,b, --tuners A,B]
#
# Uses the Optuna virtualenv that .ci builds (.ci/optuna-fanova.sh: Optuna 5.0.0 from PyPI,
# pinned), creating it if missing, and builds the release plugin library first.
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(.ci/optuna-fanova.sh)"
cargo build --release -p knob-tuners
cargo bench -p knob-benches --bench multi_objective -- --python "$KNOB_TEST_OPTUNA_PYTHON" "$@"
