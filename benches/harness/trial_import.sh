#!/usr/bin/env bash
# Trial-side cost: a fresh Python process that imports the trial API, gets its parameters and
# sends one report, with knob's `knob_trial` against `import nni` (nni 3.0), in the same run and
# the same interpreter. Target (issue 18): knob_trial's import + report < 20 ms.
#
# Usage: benches/harness/trial_import.sh [RUNS]     (default 20; nni gets max(RUNS/4, 3) runs)
#
# Both run in a trial folder laid out as knob lays one out (parameters.json, metrics.knob,
# parameter.cfg, .nni/), with the variables a trial gets; nni takes its file channel (no
# NNI_TRIAL_COMMAND_CHANNEL: the HTTP channel would add a server round trip, not the import).
# Two numbers per run: inside the process, from before the import to after the report
# (time.perf_counter), and the whole process (start-up included) from outside. Each report is
# checked to have reached its file, so a broken import cannot look fast.
#
# Environment: KNOB_BENCH_NNI3_PYTHON (default .ci-cache/nni3/bin/python, made by
# .ci/nni-venvs.sh; KNOB_TEST_NNI3_PYTHON is used when set).
set -euo pipefail

runs=${1:-20}
if ! [[ $runs =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [RUNS, default 20]" >&2
    exit 2
fi
nni_runs=$(( runs / 4 > 3 ? runs / 4 : 3 ))
target_ms=20

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${KNOB_BENCH_NNI3_PYTHON:-${KNOB_TEST_NNI3_PYTHON:-$root/.ci-cache/nni3/bin/python}}
if [[ ! -x $python ]]; then
    echo "error: $python not found; run .ci/nni-venvs.sh (or set KNOB_BENCH_NNI3_PYTHON to a python with nni 3.0)" >&2
    exit 2
fi
if ! env -u NNI_PLATFORM "$python" -c "import nni, sys; sys.exit(nni.__version__ != '3.0')" 2>/dev/null; then
    echo "error: $python has no nni 3.0" >&2
    exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/knob-trial-import.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$python" - "$python" "$root/python" "$work" "$runs" "$nni_runs" "$target_ms" <<'PY'
import json, os, statistics, subprocess, sys, time

python, knob_python, work, runs, nni_runs, target_ms = sys.argv[1:]
runs, nni_runs, target_ms = int(runs), int(nni_runs), float(target_ms)

CASES = {
    "knob_trial": (
        "import knob_trial\n"
        "knob_trial.get_parameters()\n"
        "knob_trial.report_final(0.5)\n",
        "metrics.knob",
    ),
    "nni 3.0": (
        "import nni\n"
        "nni.get_next_parameter()\n"
        "nni.report_final_result(0.5)\n",
        ".nni/metrics",
    ),
}
TIMED = (
    "import time\n"
    "_start = time.perf_counter()\n"
    "{body}"
    "_spent = time.perf_counter() - _start\n"
    "open({out!r}, 'w').write(repr(_spent))\n"
)


def trial_folder(index):
    folder = os.path.join(work, f"trial{index}")
    os.makedirs(os.path.join(folder, ".nni"))
    parameters = {"lr": 0.01}
    with open(os.path.join(folder, "parameters.json"), "w") as f:
        json.dump(parameters, f)
    with open(os.path.join(folder, "parameter.cfg"), "w") as f:
        json.dump({"parameter_id": 0, "parameter_source": "algorithm",
                   "parameters": parameters, "parameter_index": 0}, f)
    for name in ("metrics.knob", ".nni/metrics"):
        open(os.path.join(folder, name), "w").close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KNOB_", "NNI_"))}
    env.update(
        PYTHONPATH=knob_python,
        KNOB_TRIAL_ID=f"t{index}", KNOB_TRIAL_DIR=folder, KNOB_PARAMETERS=json.dumps(parameters),
        KNOB_PARAMETERS_FILE=os.path.join(folder, "parameters.json"),
        KNOB_METRICS_FILE=os.path.join(folder, "metrics.knob"),
        NNI_PLATFORM="local", NNI_EXP_ID="bench", NNI_TRIAL_JOB_ID=f"t{index}",
        NNI_SYS_DIR=folder, NNI_OUTPUT_DIR=folder, NNI_TRIAL_SEQ_ID=str(index), NNI_CODE_DIR=work,
    )
    return folder, env


counter = 0
results = {}
# Warm the page cache (and write any __pycache__) before timing either.
for name, (body, _) in CASES.items():
    counter += 1
    _, env = trial_folder(counter)
    warm = subprocess.run([python, "-c", body], env=env, cwd=work, capture_output=True, text=True)
    if warm.returncode != 0:
        sys.exit(f"{name} failed:\n{warm.stderr}")
for name, (body, metrics) in CASES.items():
    inside, whole = [], []
    for _ in range(runs if name == "knob_trial" else nni_runs):
        counter += 1
        folder, env = trial_folder(counter)
        out = os.path.join(folder, "spent")
        started = time.perf_counter()
        done = subprocess.run([python, "-c", TIMED.format(body=body, out=out)], env=env, cwd=work,
                              capture_output=True, text=True, timeout=120)
        whole.append(time.perf_counter() - started)
        if done.returncode != 0:
            sys.exit(f"{name} failed:\n{done.stderr}")
        if os.path.getsize(os.path.join(folder, metrics)) == 0:
            sys.exit(f"{name}: the report did not reach {metrics}")
        inside.append(float(open(out).read()))
    results[name] = (statistics.median(inside) * 1000, statistics.median(whole) * 1000, len(inside))

starts = []
for _ in range(5):
    started = time.perf_counter()
    subprocess.run([python, "-c", "pass"], check=True)
    starts.append(time.perf_counter() - started)
start_ms = statistics.median(starts) * 1000

print(f"python: {python} ({sys.version.split()[0]}); medians; an empty `python -c pass`: {start_ms:.1f} ms")
print(f"{'':12} {'runs':>4} {'import+params+report':>21} {'whole process':>14}")
for name, (inside_ms, whole_ms, n) in results.items():
    print(f"{name:12} {n:>4} {inside_ms:>18.1f} ms {whole_ms:>11.1f} ms")
knob_inside, knob_whole, _ = results["knob_trial"]
nni_inside, nni_whole, _ = results["nni 3.0"]
print(f"nni 3.0 / knob_trial: {nni_inside / knob_inside:.0f}x inside, {nni_whole / knob_whole:.1f}x whole process")
verdict = "met" if knob_inside < target_ms else "MISSED"
print(f"target: knob_trial import + report < {target_ms:.0f} ms: {verdict} ({knob_inside:.1f} ms)")
PY
