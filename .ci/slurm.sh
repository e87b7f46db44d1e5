#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for the `slurm` training service's tests
# (training-services/tests/it/slurm/). Debian's slurm-wlm and munge; munged runs as the `munge`
# user with a generated key, slurmctld and slurmd are started by root (no systemd here). The
# slurm.conf is the one issue 13 gives for these 2-core machines without cgroups.
#
# Idempotent: daemons already up are left alone and the config is rewritten only if it changed
# (then the running daemons are told to reread it). Waits, bounded, until `sinfo` shows the node
# idle, and exits non-zero naming what did not come up otherwise. Prints nothing on stdout but
# `export KNOB_TEST_SLURM=1` at the end, for `.ci/run` to eval.
set -euo pipefail

say() { printf 'slurm.sh: %s\n' "$*" >&2; }
fail() {
  say "FAILED: $*"
  for log in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log /var/log/munge/munged.log; do
    if [ -f "$log" ]; then
      say "last lines of $log:"
      tail -n 15 "$log" >&2 || true
    fi
  done
  exit 1
}

sudo_if_needed=""
[ "$(id -u)" = 0 ] || sudo_if_needed="sudo"

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
  || ! command -v munged >/dev/null 2>&1 || ! command -v sinfo >/dev/null 2>&1; then
  say "installing slurm-wlm and munge"
  $sudo_if_needed apt-get update -q >&2
  # policy-rc.d or not, the packages' scripts must not start daemons of their own: this script
  # starts them with its own configuration.
  $sudo_if_needed env RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends slurm-wlm munge >&2
fi

# --- munge: a key, then munged as the munge user.
if [ ! -s /etc/munge/munge.key ]; then
  say "generating /etc/munge/munge.key"
  $sudo_if_needed install -d -o munge -g munge -m 0700 /etc/munge
  $sudo_if_needed dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  $sudo_if_needed chown munge:munge /etc/munge/munge.key
  $sudo_if_needed chmod 0400 /etc/munge/munge.key
fi
$sudo_if_needed install -d -o munge -g munge -m 0755 /run/munge
$sudo_if_needed install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "starting munged"
  $sudo_if_needed runuser -u munge -- /usr/sbin/munged --force
  for _ in $(seq 1 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.1
  done
  munge -n | unmunge >/dev/null 2>&1 || fail "munged does not answer (munge -n | unmunge)"
fi

# --- slurm.conf
H=$(hostname -s)
# The node's memory as slurmd itself measures it: without RealMemory a node has 1 MB and any
# `--mem` (trialMemorySize) is refused; a figure above slurmd's own would drain the node.
real_memory=$(/usr/sbin/slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n 1)
[ -n "$real_memory" ] || fail "slurmd -C did not report the node's RealMemory"
conf=$(cat <<EOF
ClusterName=knobtest
SlurmctldHost=$H
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$H CPUs=2 RealMemory=$real_memory State=UNKNOWN
PartitionName=debug Nodes=$H Default=YES MaxTime=INFINITE State=UP
EOF
)
$sudo_if_needed install -d -m 0755 /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
conf_changed=false
if [ "$(cat /etc/slurm/slurm.conf 2>/dev/null || true)" != "$conf" ]; then
  printf '%s\n' "$conf" | $sudo_if_needed tee /etc/slurm/slurm.conf >/dev/null
  conf_changed=true
fi

running() { pgrep -x "$1" >/dev/null 2>&1; }

# --- the daemons, root-started and detached (they daemonize themselves).
if $conf_changed && { running slurmctld || running slurmd; }; then
  # A changed node line needs both daemons restarted (scontrol reconfigure does not do it
  # before Slurm 23.11); `scontrol shutdown` stops them both.
  say "slurm.conf changed: restarting slurmctld and slurmd"
  $sudo_if_needed scontrol shutdown >&2 || true
  for _ in $(seq 1 100); do
    running slurmctld || running slurmd || break
    sleep 0.1
  done
  if running slurmctld || running slurmd; then
    fail "slurmctld/slurmd still running 10 s after scontrol shutdown"
  fi
fi
if ! running slurmctld; then
  say "starting slurmctld"
  $sudo_if_needed /usr/sbin/slurmctld -L /var/log/slurm/slurmctld.log
fi
if ! running slurmd; then
  say "starting slurmd"
  $sudo_if_needed /usr/sbin/slurmd -L /var/log/slurm/slurmd.log
fi

# --- wait (bounded) for the node to be idle. A node left drained by an earlier run (a test
# that died before undraining it) is resumed: the tests need it idle.
deadline=$((SECONDS + 60))
state=""
while [ $SECONDS -lt $deadline ]; do
  state=$(sinfo --noheader --nodes="$H" --format=%T 2>/dev/null | head -n 1 || true)
  case "$state" in
    idle | mixed | allocated) break ;;
    drained | draining | drain*)
      say "node $H is $state from an earlier run; resuming it"
      $sudo_if_needed scontrol update nodename="$H" state=resume >&2 || true
      ;;
  esac
  sleep 0.5
done
case "$state" in
  idle | mixed | allocated) ;;
  *) fail "node $H is not idle after 60 s (sinfo says: '${state:-no answer}')" ;;
esac
# Leftover jobs of an earlier run would hold the node's CPUs.
leftover=$(squeue --noheader --format=%i 2>/dev/null | wc -l)
if [ "$leftover" -gt 0 ]; then
  say "cancelling $leftover leftover job(s)"
  $sudo_if_needed scancel --full --quiet $(squeue --noheader --format=%i) >&2 || true
fi
say "cluster knobtest is up: node $H $state"
sinfo >&2
echo "export KNOB_TEST_SLURM=1"
