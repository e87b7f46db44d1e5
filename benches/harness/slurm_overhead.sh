#!/usr/bin/env bash
# Slurm overhead: N trivial trials through `knob create` on `platform: slurm`, with
# `reuseMode: true` (allocations that run many trials) and `reuseMode: false` (one sbatch job a
# trial), against the same N trials on `platform: local`, all at the same concurrency, in the
# same run. Prints the three times and the ratios slurm / local: the per-trial cost of going
# through Slurm (sbatch, the squeue poll, srun to the job's knob-agent).
#
# Usage: benches/harness/slurm_overhead.sh [N] [CONCURRENCY]     (defaults: 50 2)
#
# Each trial is `echo "KNOB_FINAL 1"` with trialCpuNumber 1. The slurm services run with their
# defaults (pollIntervalSecs 1, submitIntervalSecs 0.2), as a user's config would; the slurm
# runs include submitting, waiting for the jobs to run and their agents to come up, and
# cancelling what is left at the end. Every experiment must end with N SUCCEEDED trials and
# nothing of it left in `squeue`, or the script fails.
#
# Needs: a Slurm cluster this user can submit to whose nodes see this machine's /tmp (the
# single-node one `.ci/slurm.sh` starts: run it as root first), with CONCURRENCY CPUs free;
# python3. Environment: KNOB_SKIP_BUILD=1 skips `cargo build --release --workspace` (then the
# binaries must already be built); KNOB_BENCH_PROFILE=debug times the debug build instead
# (target/debug, built by `cargo build --workspace`); KNOB_BENCH_KEEP=1 keeps the temporary
# folder; KNOB_SLURM_PARTITION names a partition (default: the cluster's default one).
set -euo pipefail

trials=${1:-50}
concurrency=${2:-2}

if ! [[ $trials =~ ^[1-9][0-9]*$ && $concurrency =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [N trials, default 50] [concurrency, default 2]" >&2
    exit 2
fi
for tool in python3 date sbatch squeue scancel; do
    command -v "$tool" >/dev/null || {
        echo "error: $tool is needed and not on PATH (a Slurm cluster: .ci/slurm.sh starts one)" >&2
        exit 2
    }
done
squeue --noheader >/dev/null 2>&1 || {
    echo "error: squeue cannot reach the Slurm controller; start the cluster (.ci/slurm.sh)" >&2
    exit 2
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
profile=${KNOB_BENCH_PROFILE:-release}
case $profile in
    release) build=(cargo build --release --workspace) ;;
    debug) build=(cargo build --workspace) ;;
    *) echo "error: KNOB_BENCH_PROFILE must be release or debug, got $profile" >&2; exit 2 ;;
esac
knob=$root/target/$profile/knob
agent=$root/target/$profile/knob-agent
if [[ -z ${KNOB_SKIP_BUILD:-} ]]; then
    echo "building: ${build[*]}" >&2
    (cd "$root" && "${build[@]}" --quiet)
fi
for binary in "$knob" "$agent"; do
    if [[ ! -x $binary ]]; then
        echo "error: $binary not found; run \`${build[*]}\` first" >&2
        exit 2
    fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/knob-slurm-overhead.XXXXXX")
tag=slov$$
cleanup() {
    # Nothing of ours stays queued, whatever happened.
    local left
    left=$(squeue --noheader --format='%i %j' | awk -v t="-$tag" 'index($2, t) { print $1 }')
    [[ -z $left ]] || scancel $left 2>/dev/null || true
    if [[ -n ${KNOB_BENCH_KEEP:-} ]]; then
        echo "kept $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
export KNOB_HOME=$work/home
export XDG_DATA_HOME=$work/data
unset KNOB_PLUGIN_PATH
mkdir -p "$work/code" "$work/experiments"
partition=${KNOB_SLURM_PARTITION:+"  partition: $KNOB_SLURM_PARTITION"}

write_config() { # name platform-block
    cat >"$work/$1.yml" <<EOF
experimentName: slurm-overhead-$1
searchSpace:
  x:
    _type: randint
    _value: [0, 1000000000]
trialCommand: 'echo "KNOB_FINAL 1"'
trialCodeDirectory: $work/code
trialConcurrency: $concurrency
trialCpuNumber: 1
maxTrialNumber: $trials
maxExperimentDuration: 1h
experimentWorkingDirectory: $work/experiments
tuner:
  name: Random
  classArgs:
    seed: 1
trainingService:
$2
EOF
}
write_config local "  platform: local"
for reuse in true false; do
    write_config "reuse-$reuse" "  platform: slurm
  reuseMode: $reuse
  agentBinary: $agent
$partition"
done

now() { date +%s.%N; }
run() { # name -> prints seconds
    local start end id=$tag-$1
    start=$(now)
    if ! "$knob" create --config "$work/$1.yml" --id "$id" \
            >"$work/$1.out" 2>"$work/$1.err" </dev/null; then
        echo "error: knob create ($1) failed; its output:" >&2
        tail -n 20 "$work/$1.out" "$work/$1.err" >&2
        exit 1
    fi
    end=$(now)
    "$knob" experiment export "$id" --format json --output "$work/$1.json"
    # knob has cancelled what it submitted; Slurm may take a moment to forget it.
    for _ in $(seq 50); do
        squeue --noheader --format='%j' | grep -q -- "-$id-" || break
        sleep 0.2
    done
    if squeue --noheader --format='%j' | grep -q -- "-$id-"; then
        echo "error: jobs of $id are still in the queue after it ended:" >&2
        squeue --format='%i %j %T %r' | grep -- "-$id-" >&2
        exit 1
    fi
    python3 -c "print($end - $start)"
}

echo "running $trials trials at concurrency $concurrency ($profile build): local, then slurm with reuseMode true, then false" >&2
local_s=$(run local)
reuse_s=$(run reuse-true)
perjob_s=$(run reuse-false)

python3 - "$work" "$trials" "$concurrency" "$profile" "$local_s" "$reuse_s" "$perjob_s" <<'EOF'
import json, sys
from collections import Counter

work, trials, concurrency, profile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
local_s, reuse_s, perjob_s = map(float, sys.argv[5:8])

failed = False
for name in ("local", "reuse-true", "reuse-false"):
    with open(f"{work}/{name}.json") as f:
        exported = json.load(f)
    rows = exported["trials"] if isinstance(exported, dict) else exported
    statuses = Counter(str(t.get("status")) for t in rows)
    if statuses.get("SUCCEEDED", 0) != trials or len(rows) != trials:
        print(f"error: {name}: expected {trials} SUCCEEDED trials, got {dict(statuses)}", file=sys.stderr)
        failed = True

print(f"slurm overhead: {trials} trials of `echo \"KNOB_FINAL 1\"` at concurrency {concurrency} ({profile} build)")
print(f"  local                   {local_s:8.3f} s  ({local_s / trials * 1e3:7.1f} ms a trial)")
print(f"  slurm reuseMode: true   {reuse_s:8.3f} s  ({reuse_s / trials * 1e3:7.1f} ms a trial, allocations running many trials)")
print(f"  slurm reuseMode: false  {perjob_s:8.3f} s  ({perjob_s / trials * 1e3:7.1f} ms a trial, one sbatch job a trial)")
print(f"  slurm reuse / local     {reuse_s / local_s:6.2f}x")
print(f"  slurm per-job / local   {perjob_s / local_s:6.2f}x")
print(f"  per-job / reuse         {perjob_s / reuse_s:6.2f}x")
sys.exit(1 if failed else 0)
EOF
