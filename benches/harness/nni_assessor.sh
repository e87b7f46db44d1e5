#!/usr/bin/env bash
# What an NNI assessor run through NNI's own dispatcher costs an experiment, against the same
# experiment without an assessor and with knob's native Medianstop, in the same run: TRIALS
# trials, CONCURRENCY at a time, each reporting RESULTS intermediate results PAUSE_MS apart. Both
# assessors keep every trial (Medianstop with a start_step past the last result), so the three
# runs do the same work and any difference is what the assessor's verdicts cost.
#
# Usage: benches/harness/nni_assessor.sh [ROUNDS] [TRIALS] [CONCURRENCY] [RESULTS] [PAUSE_MS]
#        (defaults 3, 12, 4, 20, 50)
#
# Prints each run's wall time (the experiment's start to its end, from its export), the median
# over rounds of each, and the ratios to the run without an assessor.
#
# Environment: KNOB_BENCH_NNI3_PYTHON (default .ci-cache/nni3/bin/python, made by
# .ci/nni-venvs.sh; KNOB_TEST_NNI3_PYTHON is used when set); knob from release/, else debug/, of
# $CARGO_TARGET_DIR when set, else of target/ (`cargo build --workspace` first: the plugins sit
# beside it).
set -euo pipefail

rounds=${1:-3}
trials=${2:-12}
concurrency=${3:-4}
results=${4:-20}
pause_ms=${5:-50}
for n in "$rounds" "$trials" "$concurrency" "$results" "$pause_ms"; do
    if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
        echo "usage: $0 [ROUNDS, default 3] [TRIALS, default 12] [CONCURRENCY, default 4] [RESULTS, default 20] [PAUSE_MS, default 50]" >&2
        exit 2
    fi
done

# shellcheck source=nni_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/nni_env.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/knob-nni-assessor.XXXXXX")
trap 'rm -rf "$work"' EXIT
cat >"$work/trial.py" <<PY
import time
for step in range($results):
    time.sleep($pause_ms / 1000)
    print("KNOB_INTERMEDIATE", step + 1.0, flush=True)
print("KNOB_FINAL", 1.0)
PY

run_one() { # KIND ROUND -> prints the run's wall time in seconds
    local kind=$1 round=$2 id assessor=""
    id="${kind}r${round}"
    case $kind in
    native) assessor="assessor:
  name: Medianstop
  classArgs: {optimize_mode: maximize, start_step: $((results + 1))}" ;;
    nni) assessor="assessor:
  name: Medianstop
  useNniImplementation: true
  pythonInterpreter: $python
  classArgs: {optimize_mode: maximize, start_step: $((results + 1))}" ;;
    esac
    cat >"$work/$id.yml" <<YML
searchSpace:
  x: {_type: uniform, _value: [0, 1]}
trialCommand: python3 $work/trial.py
trialCodeDirectory: $work
trialConcurrency: $concurrency
maxTrialNumber: $trials
experimentWorkingDirectory: $work/experiments
tuner:
  name: Random
$assessor
trainingService:
  platform: local
YML
    KNOB_HOME=$work/home "$knob" create --config "$work/$id.yml" --id "$id" >"$work/$id.out" 2>&1 ||
        { echo "error: $id failed:" >&2; tail -5 "$work/$id.out" >&2; exit 1; }
    KNOB_HOME=$work/home "$knob" experiment export "$id" --format json >"$work/$id.json"
    python3 - "$work/$id.json" "$trials" <<'PY'
import json, sys
export = json.load(open(sys.argv[1]))
trials = export["trials"]
assert export["experiment"]["status"] == "DONE", export["experiment"]
assert len(trials) == int(sys.argv[2]), len(trials)
assert all(t["status"] == "SUCCEEDED" for t in trials), [t["status"] for t in trials]
start = min(t["created_ms"] for t in trials)
end = max(t["ended_ms"] for t in trials)
print(f"{(end - start) / 1000:.2f}")
PY
}

declare -A walls
for round in $(seq 1 "$rounds"); do
    for kind in none native nni; do
        wall=$(run_one "$kind" "$round")
        walls[$kind]="${walls[$kind]:-} $wall"
        echo "nni_assessor: round $round, $kind: $wall s" >&2
    done
done

python3 - "$trials" "$concurrency" "$results" "$pause_ms" "${walls[none]}" "${walls[native]}" "${walls[nni]}" <<'PY'
import statistics, sys
trials, concurrency, results, pause_ms = sys.argv[1:5]
none, native, nni = ([float(w) for w in arg.split()] for arg in sys.argv[5:8])
med = statistics.median
print(f"{trials} trials, {concurrency} at a time, {results} intermediate results {pause_ms} ms apart each; "
      "wall time from the first trial's creation to the last one's end, s")
for name, walls in (("no assessor", none), ("native Medianstop", native), ("NNI Medianstop", nni)):
    print(f"{name:20} median {med(walls):7.2f}  rounds {', '.join(f'{w:.2f}' for w in walls)}")
print(f"ratio native/none: {med(native) / med(none):.2f}x")
print(f"ratio NNI/none: {med(nni) / med(none):.2f}x")
PY
