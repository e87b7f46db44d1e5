#!/usr/bin/env bash
# What running a tuner through NNI's own dispatcher costs against knob's native version, in the
# same run: NNI 3.0's TPE (`useNniImplementation: true`, `python -m nni` over the tuner command
# channel) and knob's native TPE, on Branin (minimize; global minimum 0.397887), TRIALS trials one
# at a time, for each of SEEDS seeds.
#
# Usage: benches/harness/nni_dispatcher.sh [SEEDS] [TRIALS] [FIRST_SEED]   (defaults 10, 100, 1)
#
# FIRST_SEED lets a long run be finished in parts (seeds FIRST_SEED .. FIRST_SEED+SEEDS-1); each
# seed's best result does not depend on the machine, its latency does.
#
# Prints, for each: the median over seeds of the best result found, and the suggestion latency,
# the median over trials of the time from one trial's end to the next trial's creation (the
# tuner's answer plus the manager's turn, which is the same for both), then the ratios.
# Trials speak knob's own protocol (`$KNOB_PARAMETERS`, `KNOB_FINAL`) from the plain python3 on
# PATH, so the trial side costs both the same.
#
# Environment: KNOB_BENCH_NNI3_PYTHON (default .ci-cache/nni3/bin/python, made by
# .ci/nni-venvs.sh; KNOB_TEST_NNI3_PYTHON is used when set); knob from release/, else debug/, of
# $CARGO_TARGET_DIR when set, else of target/ (`cargo build --workspace` first: the plugins sit
# beside it).
set -euo pipefail

seeds=${1:-10}
trials=${2:-100}
first_seed=${3:-1}
for n in "$seeds" "$trials" "$first_seed"; do
    if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
        echo "usage: $0 [SEEDS, default 10] [TRIALS, default 100] [FIRST_SEED, default 1]" >&2
        exit 2
    fi
done

# shellcheck source=nni_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/nni_env.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/knob-nni-dispatcher.XXXXXX")
trap 'rm -rf "$work"' EXIT
cat >"$work/branin.py" <<'PY'
import json, math, os
p = json.loads(os.environ["KNOB_PARAMETERS"])
x1, x2 = p["x1"], p["x2"]
b, c, r, s, t = 5.1 / (4 * math.pi ** 2), 5 / math.pi, 6, 10, 1 / (8 * math.pi)
print("KNOB_FINAL", (x2 - b * x1 ** 2 + c * x1 - r) ** 2 + s * (1 - t) * math.cos(x1) + s)
PY

run_one() { # IMPLEMENTATION SEED -> prints the export's path
    local implementation=$1 seed=$2 id extra=""
    id="${implementation}s${seed}"
    if [[ $implementation == nni ]]; then
        extra="  useNniImplementation: true
  pythonInterpreter: $python"
    fi
    cat >"$work/$id.yml" <<YML
searchSpace:
  x1: {_type: uniform, _value: [-5, 10]}
  x2: {_type: uniform, _value: [0, 15]}
trialCommand: python3 $work/branin.py
trialCodeDirectory: $work
trialConcurrency: 1
maxTrialNumber: $trials
experimentWorkingDirectory: $work/experiments
tuner:
  name: TPE
  classArgs: {optimize_mode: minimize, seed: $seed}
$extra
trainingService:
  platform: local
YML
    KNOB_HOME=$work/home "$knob" create --config "$work/$id.yml" --id "$id" >"$work/$id.out" 2>&1 ||
        { echo "error: $id failed:" >&2; tail -5 "$work/$id.out" >&2; exit 1; }
    KNOB_HOME=$work/home "$knob" experiment export "$id" --format json >"$work/$id.json"
    echo "$work/$id.json"
}

exports=()
for seed in $(seq "$first_seed" $((first_seed + seeds - 1))); do
    for implementation in native nni; do
        exports+=("$(run_one "$implementation" "$seed")")
        echo "nni_dispatcher: $implementation seed $seed done" >&2
    done
done

python3 - "$trials" "${exports[@]}" <<'PY'
import json, statistics, sys

trials = int(sys.argv[1])
results = {
    implementation: {"best": [], "latency": [], "seed_latency": []} for implementation in ("native", "nni")
}
for path in sys.argv[2:]:
    export = json.load(open(path))
    implementation = "nni" if export["experiment"]["id"].startswith("nni") else "native"
    rows = sorted(export["trials"], key=lambda t: t["sequence"])
    assert export["experiment"]["status"] == "DONE", (path, export["experiment"])
    assert len(rows) == trials, (path, len(rows))
    finals = [t["final"] for t in rows if isinstance(t.get("final"), (int, float))]
    assert len(finals) == trials, (path, len(finals))
    results[implementation]["best"].append(min(finals))
    gaps = [after["created_ms"] - before["ended_ms"] for before, after in zip(rows, rows[1:])]
    results[implementation]["latency"].extend(gaps)
    results[implementation]["seed_latency"].append(statistics.median(gaps))

native, nni = results["native"], results["nni"]
med = statistics.median
print(f"Branin, TPE, {trials} trials, {len(native['best'])} seeds (global minimum 0.397887)")
print(f"{'':24}{'native':>12}{'NNI via dispatcher':>22}")
print(f"{'median best':24}{med(native['best']):12.4f}{med(nni['best']):22.4f}")
print(f"{'suggestion latency ms':24}{med(native['latency']):12.1f}{med(nni['latency']):22.1f}")
print(f"ratio best (nni/native): {med(nni['best']) / med(native['best']):.3f}")
print(f"ratio latency (nni/native): {med(nni['latency']) / max(med(native['latency']), 0.1):.1f}x")
print("best per seed, native:", ", ".join(f"{b:.4f}" for b in native["best"]))
print("best per seed, NNI:   ", ", ".join(f"{b:.4f}" for b in nni["best"]))
print("latency ms per seed, native:", ", ".join(f"{l:.1f}" for l in native["seed_latency"]))
print("latency ms per seed, NNI:   ", ", ".join(f"{l:.1f}" for l in nni["seed_latency"]))
PY
