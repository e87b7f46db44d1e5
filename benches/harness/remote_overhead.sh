#!/usr/bin/env bash
# Remote overhead: N trivial trials through `knob create` on `platform: remote` (one host: an
# sshd of our own on 127.0.0.1, reusable environment) against the same N trials on
# `platform: local`, both at the same concurrency, in the same run. Prints both times and the
# ratio remote / local: the per-trial cost of going through SSH and knob-agent.
#
# Usage: benches/harness/remote_overhead.sh [N] [CONCURRENCY]     (defaults: 200 2)
#
# Each trial is `/bin/bash -c 'echo "KNOB_FINAL 1"'`. The remote run includes connecting,
# uploading knob-agent (a fresh agent root each run) and the code, and shutting the agent down;
# the local run includes knob's own start-up and end. Both experiments must end with N
# SUCCEEDED trials or the script fails.
#
# Needs: sshd (KNOB_TEST_SSHD or /usr/sbin/sshd), ssh-keygen, python3; run as a user sshd lets
# in with a key (root works; the sshd config has PermitRootLogin yes).
# Environment: KNOB_SKIP_BUILD=1 skips `cargo build --release --workspace` (then the release
# `knob` and `knob-agent` must already be built); KNOB_BENCH_KEEP=1 keeps the temporary folder.
set -euo pipefail

trials=${1:-200}
concurrency=${2:-2}

if ! [[ $trials =~ ^[1-9][0-9]*$ && $concurrency =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [N trials, default 200] [concurrency, default 2]" >&2
    exit 2
fi
sshd=${KNOB_TEST_SSHD:-/usr/sbin/sshd}
[[ -x $sshd ]] || { echo "error: no sshd at $sshd; install openssh-server or set KNOB_TEST_SSHD" >&2; exit 2; }
for tool in python3 ssh-keygen date; do
    command -v "$tool" >/dev/null || { echo "error: $tool is needed and not on PATH" >&2; exit 2; }
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
knob=$root/target/release/knob
if [[ -z ${KNOB_SKIP_BUILD:-} ]]; then
    echo "building: cargo build --release --workspace" >&2
    (cd "$root" && cargo build --release --workspace --quiet)
fi
for binary in "$knob" "$root/target/release/knob-agent"; do
    if [[ ! -x $binary ]]; then
        echo "error: $binary not found; run \`cargo build --release --workspace\` first" >&2
        exit 2
    fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/knob-remote-overhead.XXXXXX")
sshd_pid=
cleanup() {
    [[ -n $sshd_pid ]] && kill "$sshd_pid" 2>/dev/null || true
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

# Our own sshd: a fresh host key, our client key authorized, a free port on 127.0.0.1.
ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/client_key"
cp "$work/client_key.pub" "$work/authorized_keys"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $work/host_key
AuthorizedKeysFile $work/authorized_keys
StrictModes no
UsePAM no
PermitRootLogin yes
PasswordAuthentication no
PidFile $work/sshd.pid
MaxStartups 50
EOF
[[ -d /run/sshd ]] || mkdir -p /run/sshd
"$sshd" -D -e -f "$work/sshd_config" 2>"$work/sshd.log" &
sshd_pid=$!
for _ in $(seq 100); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null && break
    sleep 0.1
done
echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$work/host_key.pub")" >"$work/known_hosts"
user=$(id -un)

write_config() { # name platform-block
    cat >"$work/$1.yml" <<EOF
experimentName: remote-overhead-$1
searchSpace:
  x:
    _type: randint
    _value: [0, 1000000000]
trialCommand: 'echo "KNOB_FINAL 1"'
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
$2
EOF
}
write_config local "  platform: local"
write_config remote "  platform: remote
  reuseMode: true
  knownHostsFile: $work/known_hosts
  agentRoot: $work/agent-root
  machineList:
    - host: 127.0.0.1
      port: $port
      user: $user
      sshKeyFile: $work/client_key"

now() { date +%s.%N; }
run() { # name -> prints seconds
    local start end
    start=$(now)
    if ! "$knob" create --config "$work/$1.yml" --id "$1$$" \
            >"$work/$1.out" 2>"$work/$1.err" </dev/null; then
        echo "error: knob create ($1) failed; its output:" >&2
        tail -n 20 "$work/$1.out" "$work/$1.err" >&2
        exit 1
    fi
    end=$(now)
    "$knob" experiment export "$1$$" --format json --output "$work/$1.json"
    python3 -c "print($end - $start)"
}

echo "running $trials trials at concurrency $concurrency: local, then remote over SSH (127.0.0.1:$port)" >&2
local_s=$(run local)
remote_s=$(run remote)

python3 - "$work/local.json" "$work/remote.json" "$trials" "$concurrency" "$local_s" "$remote_s" <<'EOF'
import json, sys
from collections import Counter

local_path, remote_path = sys.argv[1], sys.argv[2]
trials, concurrency = int(sys.argv[3]), int(sys.argv[4])
local_s, remote_s = float(sys.argv[5]), float(sys.argv[6])

failed = False
for name, path in (("local", local_path), ("remote", remote_path)):
    with open(path) as f:
        exported = json.load(f)
    rows = exported["trials"] if isinstance(exported, dict) else exported
    statuses = Counter(str(t.get("status")) for t in rows)
    if statuses.get("SUCCEEDED", 0) != trials or len(rows) != trials:
        print(f"error: {name}: expected {trials} SUCCEEDED trials, got {dict(statuses)}", file=sys.stderr)
        failed = True

print(f"remote overhead: {trials} trials of `echo \"KNOB_FINAL 1\"` at concurrency {concurrency}")
print(f"  local   {local_s:8.3f} s  ({local_s / trials * 1e3:6.2f} ms a trial)")
print(f"  remote  {remote_s:8.3f} s  ({remote_s / trials * 1e3:6.2f} ms a trial, SSH to 127.0.0.1, reusable environment)")
print(f"  remote / local  {remote_s / local_s:6.2f}x")
print(f"  added by SSH and knob-agent: {(remote_s - local_s) / trials * 1e3:.2f} ms a trial "
      f"(setup included: connect, agent and code upload, shutdown)")
sys.exit(1 if failed else 0)
EOF
