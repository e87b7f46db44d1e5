#!/usr/bin/env bash
# Trial overhead: N trivial trials run by `knob create` against the same N commands run by
# `xargs -P`, both at the same concurrency, in the same run. Target (issue 3): knob ≤ 1.3× xargs.
#
# Usage: benches/harness/trial_overhead.sh [N] [CONCURRENCY]     (defaults: 500 2)
#
# Each trial is `/bin/bash -c 'echo "KNOB_FINAL 1"'`: it reports its final metric through knob's
# own protocol and exits. knob runs it the way it runs every trial (its own process group,
# stdout and stderr to files in the trial directory, parameters in the environment and a file,
# every event in the store); xargs runs the same command line, output to /dev/null.
#
# The knob time is the whole of `knob create` in the foreground: start-up, plugin loading, the
# store, N trials, the end. The experiment must end with N SUCCEEDED trials or the script fails.
#
# Environment: KNOB_SKIP_BUILD=1 skips `cargo build --release --workspace` (then the release
# `knob` must already be built); KNOB_BENCH_KEEP=1 keeps the temporary folder for a look inside.
# KNOB_BENCH_KNOB_DIR: a folder holding the `knob` to time and its plugins (default
# target/release; no build then). KNOB_BENCH_BEFORE_DIR: the same for an older build; both are
# then timed in KNOB_BENCH_ROUNDS rounds (default 3), each round knob, xargs, the older knob, so
# that both ratios come from the same moments of a loaded machine.
set -euo pipefail

trials=${1:-500}
concurrency=${2:-2}
target_ratio=1.3

if ! [[ $trials =~ ^[1-9][0-9]*$ && $concurrency =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [N trials, default 500] [concurrency, default 2]" >&2
    exit 2
fi
for tool in python3 xargs date; do
    command -v "$tool" >/dev/null || { echo "error: $tool is needed and not on PATH" >&2; exit 2; }
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
knob=${KNOB_BENCH_KNOB_DIR:-$root/target/release}/knob
before_dir=${KNOB_BENCH_BEFORE_DIR:-}
rounds=${KNOB_BENCH_ROUNDS:-3}
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "error: KNOB_BENCH_ROUNDS must be a number of rounds, got $rounds" >&2
    exit 2
fi
if [[ -z $before_dir ]]; then
    rounds=1
fi
if [[ -z ${KNOB_SKIP_BUILD:-} && -z ${KNOB_BENCH_KNOB_DIR:-} ]]; then
    echo "building: cargo build --release --workspace" >&2
    (cd "$root" && cargo build --release --workspace --quiet)
fi
if [[ ! -x $knob ]]; then
    echo "error: $knob not found; run \`cargo build --release --workspace\` first" >&2
    exit 2
fi
if [[ -n $before_dir && ! -x $before_dir/knob ]]; then
    echo "error: KNOB_BENCH_BEFORE_DIR=$before_dir holds no knob executable" >&2
    exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/knob-trial-overhead.XXXXXX")
if [[ -n ${KNOB_BENCH_KEEP:-} ]]; then
    echo "keeping $work" >&2
else
    trap 'rm -rf "$work"' EXIT
fi
# Nothing of the user's: a registry, plugin path and experiments of our own.
export KNOB_HOME=$work/home
export XDG_DATA_HOME=$work/data
unset KNOB_PLUGIN_PATH
mkdir -p "$work/code" "$work/experiments" "$work/xargs"

trial_command='echo "KNOB_FINAL 1"'
experiment_id=overhead$$

# One randint over a huge range and Random: N distinct points exist, so the tuner never ends
# the experiment early; maxTrialNumber does.
cat >"$work/config.yml" <<EOF
experimentName: trial-overhead
searchSpace:
  x:
    _type: randint
    _value: [0, 1000000000]
trialCommand: '$trial_command'
trialCodeDirectory: $work/code
trialConcurrency: $concurrency
maxTrialNumber: $trials
maxExperimentDuration: 1h
experimentWorkingDirectory: $work/experiments
tuner:
  name: Random
  classArgs:
    seed: 1
trainingService:
  platform: local
EOF

now() { date +%s.%N; }

# One `knob create` of the experiment with its own id, timed, then its export; prints
# "start end".
run_knob() {
    local bin=$1 id=$2
    local start end
    start=$(now)
    if ! "$bin" create --config "$work/config.yml" --id "$id" \
            >"$work/$id.out" 2>"$work/$id.err" </dev/null; then
        echo "error: $bin create failed; its output:" >&2
        tail -n 20 "$work/$id.out" "$work/$id.err" >&2
        exit 1
    fi
    end=$(now)
    "$bin" experiment export "$id" --format json --output "$work/$id.json"
    echo "$start $end"
}

run_xargs() {
    local start end
    start=$(now)
    (cd "$work/xargs" && seq "$trials" | xargs -n 1 -P "$concurrency" /bin/bash -c "$trial_command" >/dev/null)
    end=$(now)
    echo "$start $end"
}

echo "running $trials trials at concurrency $concurrency, $rounds round(s): knob, xargs -P $concurrency${before_dir:+, the older knob}" >&2
: >"$work/times"
for round in $(seq "$rounds"); do
    id=${experiment_id}r$round
    echo "knob $(run_knob "$knob" "$id") $work/$id.json" >>"$work/times"
    echo "xargs $(run_xargs) -" >>"$work/times"
    if [[ -n $before_dir ]]; then
        id=${experiment_id}b$round
        echo "before $(run_knob "$before_dir/knob" "$id") $work/$id.json" >>"$work/times"
    fi
done

python3 - "$work/times" "$trials" "$concurrency" "$target_ratio" <<'EOF'
import json, statistics, sys
from collections import Counter

times, trials, concurrency, target = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
runs = {"knob": [], "xargs": [], "before": []}
failed = False
with open(times) as f:
    for line in f:
        what, start, end, export = line.split()
        runs[what].append(float(end) - float(start))
        if export == "-":
            continue
        with open(export) as e:
            exported = json.load(e)
        rows = exported["trials"] if isinstance(exported, dict) else exported
        statuses = Counter(str(t.get("status")) for t in rows)
        finals = sum(1 for t in rows if t.get("status") == "SUCCEEDED" and t.get("final") is not None)
        if statuses.get("SUCCEEDED", 0) != trials or len(rows) != trials or finals != trials:
            print(f"error: {what}: expected {trials} SUCCEEDED trials each with a final metric; "
                  f"the export has {len(rows)} trials: {dict(statuses)}, {finals} final metrics", file=sys.stderr)
            failed = True

print(f"trial overhead: {trials} trials of `echo \"KNOB_FINAL 1\"` at concurrency {concurrency}, {len(runs['xargs'])} round(s)")
for i, xargs_s in enumerate(runs["xargs"]):
    line = f"  round {i + 1}: knob {runs['knob'][i]:.3f} s ({runs['knob'][i] / xargs_s:.2f}x)  xargs {xargs_s:.3f} s"
    if runs["before"]:
        line += f"  older knob {runs['before'][i]:.3f} s ({runs['before'][i] / xargs_s:.2f}x)"
    print(line)
knob_s, xargs_s = statistics.median(runs["knob"]), statistics.median(runs["xargs"])
ratio = statistics.median(k / x for k, x in zip(runs["knob"], runs["xargs"]))
print(f"  knob create   {knob_s:8.3f} s  ({knob_s / trials * 1e3:6.2f} ms a trial)")
print(f"  xargs -P {concurrency:<4} {xargs_s:8.3f} s  ({xargs_s / trials * 1e3:6.2f} ms a trial)")
print(f"  knob / xargs  {ratio:8.2f}x   target ≤ {target}x: {'met' if ratio <= target else 'MISSED'}")
print(f"  knob's overhead {(knob_s - xargs_s) / trials * 1e3:.2f} ms a trial "
      f"(≈ {(knob_s - xargs_s) / trials * concurrency * 1e3:.2f} ms of each slot's time per trial)")
if runs["before"]:
    before_s = statistics.median(runs["before"])
    before_ratio = statistics.median(b / x for b, x in zip(runs["before"], runs["xargs"]))
    print(f"  older knob    {before_s:8.3f} s  ({before_ratio:.2f}x xargs); knob / older knob "
          f"{statistics.median(k / b for k, b in zip(runs['knob'], runs['before'])):.2f}x")
if failed:
    sys.exit(1)
EOF
