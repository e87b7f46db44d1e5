#!/usr/bin/env bash
# The manager's CPU while its trials run and do nothing: N trials of `sleep`, all running at
# once on the local service, and the CPU time `knob create` itself uses over a window once they
# all run (its own process: manager, store, the local service's threads, not the trials).
# Sleeping trials cost a supervisor nothing it must do, so what it uses is its own overhead:
# tails that woke on their own reads (a core a few trials, fixed 2026-11-29) and a read of
# `/proc` for each trial's every memory sample (trials × processes reads a second) were both
# found this way. No target is set; with KNOB_BENCH_BEFORE_DIR the older build is measured in
# the same rounds, alternating, so the two figures come from the same moments of the machine.
#
# Usage: benches/harness/idle_trials.sh [N ...]      (default: 16 64 128)
#
# Environment: KNOB_BENCH_KNOB_DIR, a folder holding the `knob` to measure and its plugins
# (default target/release, built first unless KNOB_SKIP_BUILD=1); KNOB_BENCH_BEFORE_DIR, the
# same for an older build; KNOB_BENCH_ROUNDS (default 2); KNOB_BENCH_WINDOW seconds measured
# (default 10), after KNOB_BENCH_SETTLE seconds (default 5) for the trials to start.
set -euo pipefail

sizes=("$@")
if [[ ${#sizes[@]} -eq 0 ]]; then
    sizes=(16 64 128)
fi
for n in "${sizes[@]}"; do
    if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
        echo "usage: $0 [N trials ...]; got $n" >&2
        exit 2
    fi
done
rounds=${KNOB_BENCH_ROUNDS:-2}
window=${KNOB_BENCH_WINDOW:-10}
settle=${KNOB_BENCH_SETTLE:-5}
for value in "$rounds" "$window" "$settle"; do
    if ! [[ $value =~ ^[1-9][0-9]*$ ]]; then
        echo "error: KNOB_BENCH_ROUNDS, KNOB_BENCH_WINDOW and KNOB_BENCH_SETTLE must be whole numbers, got $value" >&2
        exit 2
    fi
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
knob_dir=${KNOB_BENCH_KNOB_DIR:-$root/target/release}
before_dir=${KNOB_BENCH_BEFORE_DIR:-}
if [[ -z ${KNOB_SKIP_BUILD:-} && -z ${KNOB_BENCH_KNOB_DIR:-} ]]; then
    echo "building: cargo build --release --workspace" >&2
    (cd "$root" && cargo build --release --workspace --quiet)
fi
for dir in "$knob_dir" ${before_dir:+"$before_dir"}; do
    if [[ ! -x $dir/knob ]]; then
        echo "error: $dir holds no knob executable; run \`cargo build --release --workspace\` first" >&2
        exit 2
    fi
done
ticks_per_second=$(getconf CLK_TCK)

work=$(mktemp -d "${TMPDIR:-/tmp}/knob-idle-trials.XXXXXX")
running_pid=
cleanup() {
    if [[ -n $running_pid ]]; then
        kill -INT "$running_pid" 2>/dev/null || true
        sleep 1
        kill -KILL "$running_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
export KNOB_HOME=$work/home
export XDG_DATA_HOME=$work/data
unset KNOB_PLUGIN_PATH KNOB_SIMULATE_GPUS
mkdir -p "$work/code" "$work/experiments"

# The CPU ticks (user + system) process $1 has used so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# Runs N sleeping trials with the knob in folder $1; prints the CPU seconds it used a second
# over the window.
measure() {
    local dir=$1 n=$2 id=idle$RANDOM$RANDOM
    cat >"$work/config.yml" <<EOF
searchSpace:
  x: {_type: uniform, _value: [0, 1]}
trialCommand: sleep $((settle + window + 30))
trialCodeDirectory: $work/code
trialConcurrency: $n
maxTrialNumber: $n
experimentWorkingDirectory: $work/experiments
tuner: {name: Random}
trainingService: {platform: local}
EOF
    "$dir/knob" create --config "$work/config.yml" --id "$id" --detach >"$work/$id.out" 2>&1 || {
        echo "error: $dir/knob create failed:" >&2
        cat "$work/$id.out" >&2
        exit 1
    }
    running_pid=$(sed -n 's/.*(pid \([0-9]*\)).*/\1/p' "$work/$id.out" | head -n 1)
    sleep "$settle"
    local running
    running=$("$dir/knob" trial ls "$id" --status RUNNING | tail -n +2 | wc -l)
    if [[ $running -ne $n ]]; then
        echo "error: only $running of $n trials run after ${settle} s; raise KNOB_BENCH_SETTLE" >&2
        exit 1
    fi
    local first last
    first=$(cpu_ticks "$running_pid")
    sleep "$window"
    last=$(cpu_ticks "$running_pid")
    "$dir/knob" stop "$id" >/dev/null
    running_pid=
    python3 -c "print(f'{($last - $first) / $ticks_per_second / $window:.4f}')"
}

echo "the manager's CPU while N trials sleep: ${window} s measured after ${settle} s, $rounds round(s)${before_dir:+, alternating with the older build}" >&2
for n in "${sizes[@]}"; do
    now=() before=()
    for _ in $(seq "$rounds"); do
        now+=("$(measure "$knob_dir" "$n")")
        if [[ -n $before_dir ]]; then
            before+=("$(measure "$before_dir" "$n")")
        fi
    done
    python3 - "$n" "${now[*]}" "${before[*]:-}" <<'EOF'
import statistics, sys
n, now, before = int(sys.argv[1]), [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
line = f"N = {n:4}: knob {statistics.median(now) * 100:6.2f} % of a core (rounds: {', '.join(f'{x * 100:.2f}' for x in now)})"
if before:
    line += f"   older knob {statistics.median(before) * 100:6.2f} % ({', '.join(f'{x * 100:.2f}' for x in before)})"
print(line)
EOF
done
