#!/usr/bin/env bash
# How long the manager's loop keeps a request waiting while the tuner thinks: knob's GPTuner
# (whose model fit grows with the results, up to 256 of them) on a 5-D quadratic, TRIALS trials of
# a Python one-liner, CONCURRENCY at a time; every 0.1 s `GET /api/v1/environments`, which the
# loop itself answers (as it does `knob update` and `knob stop`), is timed. With
# KNOB_BENCH_BEFORE_DIR, an older build runs the same experiment right after, for a side-by-side.
#
# Usage: benches/harness/tuner_wait.sh [TRIALS] [CONCURRENCY]     (defaults 330, 2)
#
# Prints, for each build, the experiment's wall time and the request's latency (median, 90th and
# 99th percentile, maximum) over the whole run and over its last third, when the model is largest.
#
# Environment: KNOB_BENCH_KNOB_DIR: the folder of the `knob` to time, its plugins beside it
# (default target/release: `cargo build --release --workspace` first); KNOB_BENCH_BEFORE_DIR: the
# same for an older build.
set -euo pipefail

trials=${1:-330}
concurrency=${2:-2}
for n in "$trials" "$concurrency"; do
    if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
        echo "usage: $0 [TRIALS, default 330] [CONCURRENCY, default 2]" >&2
        exit 2
    fi
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
knob_dir=${KNOB_BENCH_KNOB_DIR:-$root/target/release}
before_dir=${KNOB_BENCH_BEFORE_DIR:-}
for dir in "$knob_dir" $before_dir; do
    if [[ ! -x $dir/knob ]]; then
        echo "error: no knob in $dir: build it (cargo build --release --workspace) or set KNOB_BENCH_KNOB_DIR" >&2
        exit 1
    fi
done
command -v curl >/dev/null || { echo "error: curl is needed (apt-get install curl)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/knob-tuner-wait.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cat >"$work/trial.py" <<'PY'
import json, os
p = json.loads(os.environ["KNOB_PARAMETERS"])
print("KNOB_FINAL %r" % sum((v - 0.3) * (v - 0.3) for v in p.values()), flush=True)
PY
cat >"$work/config.yml" <<YML
searchSpace:
  a: {_type: uniform, _value: [0, 1]}
  b: {_type: uniform, _value: [0, 1]}
  c: {_type: uniform, _value: [0, 1]}
  d: {_type: uniform, _value: [0, 1]}
  e: {_type: uniform, _value: [0, 1]}
trialCommand: python3 $work/trial.py
trialCodeDirectory: $work
trialConcurrency: $concurrency
maxTrialNumber: $trials
experimentWorkingDirectory: $work/experiments
tuner:
  name: GPTuner
  classArgs: {optimize_mode: minimize}
trainingService:
  platform: local
YML

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

run_one() { # LABEL KNOB_DIR
    local label=$1 knob=$2/knob port pid began ended
    port=$(free_port)
    began=$(date +%s.%N)
    KNOB_HOME=$work/home "$knob" create --config "$work/config.yml" --id "$label" --port "$port" \
        >"$work/$label.out" 2>&1 &
    pid=$!
    : >"$work/$label.samples"
    while kill -0 "$pid" 2>/dev/null; do
        # Refused before the API is up and after it is gone: no sample then.
        if latency=$(curl -sf -o /dev/null -w '%{time_total}' --max-time 60 \
            "http://127.0.0.1:$port/api/v1/environments"); then
            echo "$(date +%s.%N) $latency" >>"$work/$label.samples"
        fi
        sleep 0.1
    done
    wait "$pid" || { echo "error: $label failed:" >&2; tail -5 "$work/$label.out" >&2; exit 1; }
    ended=$(date +%s.%N)
    python3 - "$label" "$began" "$ended" "$work/$label.samples" <<'PY'
import sys
label, began, ended, path = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rows = [tuple(map(float, line.split())) for line in open(path) if len(line.split()) == 2]
if not rows:
    sys.exit(f"error: {label}: no request was answered")
first, last = rows[0][0], rows[-1][0]

def summary(part):
    ms = sorted(latency * 1000 for _, latency in part)
    at = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]
    return f"{len(ms):4} requests: median {at(0.5):7.1f} ms, p90 {at(0.9):7.1f}, p99 {at(0.99):7.1f}, max {ms[-1]:7.1f}"

print(f"{label}: wall {ended - began:.1f} s")
print(f"  whole run   {summary(rows)}")
print(f"  last third  {summary([r for r in rows if r[0] >= first + 2 * (last - first) / 3])}")
PY
}

echo "GPTuner, $trials trials, concurrency $concurrency: latency of GET /api/v1/environments, answered by the manager's loop"
run_one knob "$knob_dir"
if [[ -n $before_dir ]]; then
    run_one older "$before_dir"
fi
