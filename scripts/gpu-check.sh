#!/usr/bin/env bash
# Real-GPU check of the out-of-GPU-memory path (issue 17): NVML's per-trial GPU memory peak, the
# kill of a trial over its trialGpuMemory, a CUDA out-of-memory error, and the GPU memory request
# raised from the sampled peak on the requeue.
#
# Needs: one NVIDIA GPU with its driver (NVML), python3 with torch (CUDA), and a release build:
#   cargo build --release -p knob-cli -p knob-tuners -p knob-training-services
# Only these files of it are used (knob loads the plugins from its own folder):
#   target/release/knob
#   target/release/libknob_tuners.so
#   target/release/libknob_training_services.so
# Usage: scripts/gpu-check.sh [folder with those files, default target/release]
# Runs in under 3 minutes (bounded by `timeout`); exits non-zero if a check fails.
set -euo pipefail

bin=$(cd "${1:-target/release}" && pwd)
knob=$bin/knob
for f in knob libknob_tuners.so libknob_training_services.so; do
  [ -e "$bin/$f" ] || { echo "gpu-check: $bin/$f is missing (build with cargo build --release)" >&2; exit 2; }
done
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { echo "gpu-check: python3 cannot use CUDA through torch" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export KNOB_HOME=$work/home
unset KNOB_SIMULATE_GPUS KNOB_PLUGIN_PATH
mkdir -p "$work/code"

echo "== knob gpu"
timeout 30 "$knob" gpu

# Three trials share the GPU (maxTrialNumberPerGpu 3), each asking for 4 GiB (trialGpuMemory):
#   fit      holds 2 GiB for 5 s: under its request, runs once;
#   over     holds 6 GiB: over its request, killed by knob from NVML's figure, runs again asking
#            for twice its peak, and then fits;
#   cuda_oom first holds 2 GiB, then asks CUDA for more than the GPU has (torch.OutOfMemoryError),
#            runs again asking for twice max(4 GiB, its peak), and then holds 2 GiB.
cat > "$work/code/trial.py" <<'PY'
import json, os, sys, time
import torch

mode = json.loads(os.environ["KNOB_PARAMETERS"])["mode"]
marker = os.path.join(os.environ["NNI_CODE_DIR"], "tried-" + os.environ["NNI_TRIAL_JOB_ID"])
first = not os.path.exists(marker)
open(marker, "a").close()
gib = 6 if mode == "over" else 2
block = torch.ones(gib << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(f"{mode}: holding {gib} GiB (first attempt: {first})", file=sys.stderr, flush=True)
if mode == "cuda_oom" and first:
    time.sleep(2)  # the runner samples GPU memory every 200 ms
    total = torch.cuda.get_device_properties(0).total_memory
    more = torch.empty(2 * total, dtype=torch.uint8, device="cuda")  # raises OutOfMemoryError
time.sleep(5)
print("KNOB_FINAL", float(block[0].item()), flush=True)
PY
cat > "$work/code/config.yml" <<YML
experimentName: gpu-check
trialCommand: python3 trial.py
trialCodeDirectory: .
trialConcurrency: 3
maxTrialNumber: 3
trialGpuNumber: 1
trialGpuMemory: 4GiB
maxTrialNumberPerGpu: 3
maxOomRetries: 2
experimentWorkingDirectory: $work/experiments
searchSpace:
  mode: {_type: choice, _value: [fit, over, cuda_oom]}
tuner:
  name: GridSearch
trainingService:
  platform: local
YML

echo "== knob create"
set +e
timeout 150 "$knob" create --config "$work/code/config.yml" --id gpucheck
created=$?
set -e
echo "(knob create exited $created)"

echo "== knob trial ls"
"$knob" trial ls gpucheck

echo "== GPU memory peaks and requests, from the export"
"$knob" experiment export gpucheck --format json > "$work/export.json"
python3 - "$work/export.json" <<'PY'
import json, re, sys
export = json.load(open(sys.argv[1]))
failed = []
modes = {}
for t in export["trials"]:
    mode = t["parameters"]["mode"]
    modes[mode] = t
    print(f"trial {t['id']} {mode}: {t['status']}, {len(t['attempt_history'])} attempt(s), "
          f"GPU memory request {t.get('gpu_memory_request_mib')} MiB")
    for a in t["attempt_history"]:
        requeued = a.get("requeued") or ""
        peak = re.search(r"GPU memory peak (\d+) MiB", requeued)
        print(f"  attempt {a['number']}: {a.get('status') or 'requeued'}; "
              f"GPU memory peak {peak.group(1) + ' MiB' if peak else '(not in the record)'}; "
              f"raised to {a.get('gpu_memory_request_mib')} MiB")
        if requeued:
            print(f"    {requeued}")
def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failed.append(what)
check(all(t["status"] == "SUCCEEDED" for t in export["trials"]) and len(modes) == 3,
      "the three trials succeeded")
check(len(modes.get("fit", {}).get("attempt_history", [])) == 1
      and modes.get("fit", {}).get("gpu_memory_request_mib") is None,
      "fit: one attempt, request not raised")
over = modes.get("over", {})
first = (over.get("attempt_history") or [{}])[0].get("requeued") or ""
check("(trialGpuMemory); killed as out of GPU memory" in first
      and (over.get("gpu_memory_request_mib") or 0) > 2 * 6 * 1024,
      "over: killed over trialGpuMemory from NVML's figure, request raised above twice 6 GiB")
oom = modes.get("cuda_oom", {})
first = (oom.get("attempt_history") or [{}])[0].get("requeued") or ""
check("OutOfMemoryError" in first and "out of GPU memory: the next attempt asks for" in first
      and (oom.get("gpu_memory_request_mib") or 0) >= 8192,
      "cuda_oom: torch's OutOfMemoryError seen, request raised to at least twice 4 GiB")
sys.exit(1 if failed else 0)
PY
