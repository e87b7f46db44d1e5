#!/usr/bin/env bash
# Population-based training: knob's PBT against random search (and Ray Tune's PBT, when `ray`
# installs here) at equal total steps, on two problems (benches/harness/pbt_problems.py): the PBT
# paper's toy and a logistic regression whose best learning rate falls during training.
#
#   benches/harness/pbt.sh [SEEDS] [--no-ray]     # SEEDS: default 10
#
# Each method runs 8 members (PBT) or 8 trials (random search) of 40 steps each, all side by
# side (trialConcurrency 8): 320 steps per run. It prints, per problem and method, the median
# over the seeds of the best final result (larger is better), and the ratio of PBT's margin over
# random search. The virtualenv .ci-cache/pbt (or $KNOB_PBT_VENV; numpy, and ray[tune] 2.60.0
# unless --no-ray) is made on first use. knob runs as the release build in $CARGO_TARGET_DIR, else
# target/ (cargo build --release of knob-cli and its tuner and training-service plugins;
# KNOB_SKIP_BUILD=1 skips the build). Each result line also gives the seconds its run took (Ray's:
# its fit, without starting Ray).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
seeds=${1:-10}
# A step of a knob trial lasts this long (KNOB_PBT_STEP_SECONDS): members are processes that keep
# running while the manager reads their reports, so a step much shorter than the manager's
# reaction (tens of ms, more on a loaded machine) lets members run far past their interval before
# they are judged, and finish before their successors start. Ray's trainables wait at each report.
step_seconds=${KNOB_PBT_STEP_SECONDS:-0.2}
use_ray=1
[ "${2:-}" = "--no-ray" ] && use_ray=0

venv=${KNOB_PBT_VENV:-.ci-cache/pbt}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import numpy" 2>/dev/null; then
  echo "pbt: creating $venv (numpy)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --no-input --only-binary=:all: numpy==2.4.6 >&2
fi
ray_note=""
if [ "$use_ray" = 1 ] && ! "$venv/bin/python" -c "import ray.tune" 2>/dev/null; then
  if ! "$venv/bin/python" -m pip install --quiet --no-input --only-binary=:all: 'ray[tune]==2.60.0' >&2; then
    ray_note="ray[tune] 2.60.0 did not install here; Ray Tune's PBT not compared"
  fi
fi
python=$(cd "$venv" && pwd)/bin/python

[ "${KNOB_SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p knob-cli -p knob-tuners -p knob-training-services
knob=${CARGO_TARGET_DIR:-$root/target}/release/knob
if [ ! -x "$knob" ]; then
  echo "pbt: no $knob; run cargo build --release -p knob-cli -p knob-tuners -p knob-training-services" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export KNOB_HOME=$work/home

run_knob() { # problem method seed -> best final
  local problem=$1 method=$2 seed=$3 dir=$work/$1-$2-$3
  mkdir -p "$dir"
  cp benches/harness/pbt_problems.py "$dir/"
  local space tuner
  if [ "$problem" = toy ]; then
    space='{h0: {_type: uniform, _value: [0, 1]}, h1: {_type: uniform, _value: [0, 1]}}'
  else
    space='{lr: {_type: loguniform, _value: [0.001, 10]}}'
  fi
  if [ "$method" = pbt ]; then
    tuner="{name: PBT, classArgs: {population_size: 8, perturbation_interval: 4, seed: $seed}}"
  else
    tuner="{name: Random, classArgs: {seed: $seed}}"
  fi
  cat >"$dir/config.yml" <<YAML
searchSpace: $space
trialCommand: PBT_PROBLEM=$problem PBT_STEP_SECONDS=$step_seconds '$python' pbt_problems.py knob
trialConcurrency: 8
maxTrialNumber: $([ "$method" = pbt ] && echo 1000 || echo 8)
tuner: $tuner
trainingService: {platform: local}
experimentWorkingDirectory: $work/experiments
YAML
  "$knob" create --config "$dir/config.yml" --id "$problem-$method-$seed" >/dev/null 2>"$dir/err" ||
    { cat "$dir/err" >&2; exit 1; }
  "$knob" experiment export "$problem-$method-$seed" |
    "$python" -c 'import json,sys; t=json.load(sys.stdin)["trials"]; print(max(x["final"] for x in t if x["final"] is not None))'
}

results=$work/results.jsonl
for seed in $(seq 1 "$seeds"); do
  for problem in toy logreg; do
    for method in random pbt; do
      start=$(date +%s.%N)
      best=$(run_knob $problem $method $seed)
      seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
      echo "{\"method\": \"knob-$method\", \"problem\": \"$problem\", \"seed\": $seed, \"best\": $best, \"seconds\": $seconds}" | tee -a "$results" >&2
    done
  done
done
if [ "$use_ray" = 1 ] && [ -z "$ray_note" ]; then
  (cd "$work" && "$python" "$root/benches/harness/pbt_problems.py" ray $(seq 1 "$seeds")) 2>"$work/ray.err" |
    tee -a "$results" >&2 || ray_note="Ray Tune's PBT failed: $(tail -1 "$work/ray.err")"
elif [ "$use_ray" = 0 ]; then
  ray_note="Ray Tune's PBT not run (--no-ray)"
fi

"$python" - "$results" "$seeds" "$ray_note" <<'PY'
import json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
seeds, note = sys.argv[2], sys.argv[3]
steps = int(os.environ.get("PBT_STEPS", "40"))
print(f"pbt: median best final over {seeds} seeds, 8 members x {steps} steps ({8 * steps} steps per run); larger is better")
for problem in ("toy", "logreg"):
    medians, counts = {}, {}
    for method in ("knob-random", "knob-pbt", "ray-pbt"):
        values = [r["best"] for r in rows if r["problem"] == problem and r["method"] == method]
        if values:
            medians[method] = statistics.median(values)
            counts[method] = len(values)
    # A method with fewer seeds than asked (Ray stopped part-way) says over how many.
    line = "  ".join(f"{m} {v:.4f}" + ("" if counts[m] == int(seeds) else f" ({counts[m]} seeds)") for m, v in medians.items())
    verdict = "knob-pbt beats random" if medians["knob-pbt"] > medians["knob-random"] else "knob-pbt does NOT beat random"
    ray = f"; ray-pbt - random {medians['ray-pbt'] - medians['knob-random']:+.4f}" if "ray-pbt" in medians else ""
    print(f"{problem:7} {line}  ({verdict}: {medians['knob-pbt'] - medians['knob-random']:+.4f}{ray})")
times = []
for method in ("knob-random", "knob-pbt", "ray-pbt"):
    seconds = [r["seconds"] for r in rows if r["method"] == method and "seconds" in r]
    if seconds:
        times.append(f"{method} {statistics.median(seconds):.1f} s")
if times:
    print("median seconds a problem-seed: " + "  ".join(times))
if note:
    print(note)
PY
