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
knob=$root/target/release/knob
if [[ -z ${KNOB_SKIP_BUILD:-} ]]; then
    echo "building: cargo build --release --workspace" >&2
    (cd "$root" && cargo build --release --workspace --quiet)
fi
if [[ ! -x $knob ]]; then
    echo "error: $knob not found; run \`cargo build --release --workspace\` first" >&2
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

echo "running $trials trials at concurrency $concurrency: knob, then xargs -P $concurrency" >&2

knob_start=$(now)
if ! "$knob" create --config "$work/config.yml" --id "$experiment_id" \
        >"$work/knob-create.out" 2>"$work/knob-create.err" </dev/null; then
    echo "error: knob create failed; its output:" >&2
    tail -n 20 "$work/knob-create.out" "$work/knob-create.err" >&2
    exit 1
fi
knob_end=$(now)

xargs_start=$(now)
(cd "$work/xargs" && seq "$trials" | xargs -n 1 -P "$concurrency" /bin/bash -c "$trial_command" >/dev/null)
xargs_end=$(now)

"$knob" experiment export "$experiment_id" --format json --output "$work/export.json"

python3 - "$work/export.json" "$trials" "$concurrency" "$knob_start" "$knob_end" "$xargs_start" "$xargs_end" "$target_ratio" <<'EOF'
import json, sys
from collections import Counter

path, trials, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
knob_start, knob_end, xargs_start, xargs_end, target = map(float, sys.argv[4:])

with open(path) as f:
    exported = json.load(f)
rows = exported["trials"] if isinstance(exported, dict) else exported
statuses = Counter(str(t.get("status")) for t in rows)
succeeded = statuses.get("SUCCEEDED", 0)
finals = sum(1 for t in rows if t.get("status") == "SUCCEEDED" and t.get("final") is not None)

knob_s, xargs_s = knob_end - knob_start, xargs_end - xargs_start
ratio = knob_s / xargs_s
print(f"trial overhead: {trials} trials of `echo \"KNOB_FINAL 1\"` at concurrency {concurrency}")
print(f"  knob create   {knob_s:8.3f} s  ({knob_s / trials * 1e3:6.2f} ms a trial)")
print(f"  xargs -P {concurrency:<4} {xargs_s:8.3f} s  ({xargs_s / trials * 1e3:6.2f} ms a trial)")
print(f"  knob / xargs  {ratio:8.2f}x   target ≤ {target}x: {'met' if ratio <= target else 'MISSED'}")
print(f"  knob's overhead {(knob_s - xargs_s) / trials * 1e3:.2f} ms a trial "
      f"(≈ {(knob_s - xargs_s) / trials * concurrency * 1e3:.2f} ms of each slot's time per trial)")
if succeeded != trials or len(rows) != trials or finals != trials:
    print(f"error: expected {trials} SUCCEEDED trials each with a final metric; "
          f"the export has {len(rows)} trials: {dict(statuses)}, {finals} final metrics", file=sys.stderr)
    sys.exit(1)
EOF
