#!/usr/bin/env bash
# Creates two virtualenvs with the real `nni` package from PyPI, for the NNI compatibility
# tests (cli/tests/it/nni.rs):
#
#   .ci-cache/nni3  nni 3.0     -> its trials use the v3 HTTP channel (NNI_TRIAL_COMMAND_CHANNEL)
#   .ci-cache/nni2  nni 2.10.1  -> its trials use the 2.x file channel (parameter.cfg, .nni/metrics)
#
# Idempotent: a venv whose pins are unchanged and whose `import nni` works is kept. Progress
# goes to stderr; stdout is one `export KNOB_TEST_NNI{3,2}_PYTHON=...` line per venv, so
# callers can `eval "$(.ci/nni-venvs.sh)"`.
#
# Pins: nni and every package it pulls in, at versions verified together on CPython 3.11
# (Debian 12), binary wheels only so nothing compiles. Nothing beyond nni's own ranges was
# needed to install (nni 3.0 wants typeguard<4.1.3 and filelock<3.12; nni 2.10.1 wants
# typeguard<3); the exact pins keep a new release of a dependency (numpy, pandas, scipy,
# json-tricks, which `import nni` loads) from changing what CI tests.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# Shared by both nni versions.
common_pins=(
  astor==0.8.1 certifi==2026.10.18 charset-normalizer==3.5.2 cloudpickle==3.1.2
  colorama==0.4.6 filelock==3.11.0 idna==3.20 joblib==1.6.0 json-tricks==3.17.3
  packaging==26.3 prettytable==3.18.0
  psutil==7.2.2 PythonWebHDFS==0.2.3 PyYAML==6.0.3 requests==2.34.2
  responses==0.26.3 schema==0.7.8 simplejson==4.3.0
  threadpoolctl==3.8.0 tqdm==4.70.1 typing_extensions==4.16.0 tzdata==2026.6
  urllib3==2.8.0 wcwidth==0.9.4 websockets==17.4
)
# nni 3.0 gets the numeric stack of its own time (2023): its Metis passes a 2-D x0 to
# scipy.optimize.minimize, which scipy >= 1.11 refuses ("'x0' must only have one dimension"),
# so with today's scipy NNI's Metis fails on its first suggestion after the cold start.
nni3_pins=(
  nni==3.0 typeguard==4.1.2 nvidia-ml-py==13.615.71 "${common_pins[@]}"
  numpy==1.26.4 scipy==1.10.1 scikit-learn==1.3.2 pandas==2.2.3 pytz==2025.2
  python-dateutil==2.9.0.post0
)
nni2_pins=(
  nni==2.10.1 typeguard==2.13.3 "${common_pins[@]}"
  narwhals==2.29.0 numpy==2.4.6 pandas==3.1.1 python-dateutil==4.0.0 scikit-learn==1.9.1
  scipy==1.17.1
)

# make_venv DIR NNI_VERSION PINS...
make_venv() {
  local dir=$1 version=$2
  shift 2
  local python="$root/$dir/bin/python" pins started
  pins=$(printf '%s\n' "$@")
  # NNI_PLATFORM unset: `import nni` outside a trial must work too.
  if [ -x "$python" ] && [ "$(cat "$root/$dir/.knob-pins" 2>/dev/null)" = "$pins" ] &&
    env -u NNI_PLATFORM "$python" -c "import nni, sys; sys.exit(nni.__version__ != '$version')" 2>/dev/null; then
    echo "nni-venvs: $dir (nni $version) is ready" >&2
  else
    echo "nni-venvs: creating $dir (nni $version)" >&2
    started=$SECONDS
    rm -rf "${root:?}/$dir"
    python3 -m venv "$root/$dir"
    "$python" -m pip install --quiet --no-input --only-binary=:all: "$@" >&2
    env -u NNI_PLATFORM "$python" -c "import nni, sys; print('nni-venvs: imported nni', nni.__version__, 'on Python', sys.version.split()[0], file=sys.stderr); sys.exit(nni.__version__ != '$version')"
    printf '%s\n' "$pins" >"$root/$dir/.knob-pins"
    echo "nni-venvs: $dir took $((SECONDS - started)) s" >&2
  fi
}

# Side by side: most of the time goes to pip byte-compiling one file after another.
make_venv .ci-cache/nni3 3.0 "${nni3_pins[@]}" &
nni3_job=$!
make_venv .ci-cache/nni2 2.10.1 "${nni2_pins[@]}" &
nni2_job=$!
nni3_status=0 nni2_status=0
wait "$nni3_job" || nni3_status=$?
wait "$nni2_job" || nni2_status=$?
if [ "$nni3_status" -ne 0 ] || [ "$nni2_status" -ne 0 ]; then
  echo "nni-venvs: failed (nni3: exit $nni3_status, nni2: exit $nni2_status)" >&2
  exit 1
fi
printf 'export KNOB_TEST_NNI3_PYTHON=%q\n' "$root/.ci-cache/nni3/bin/python"
printf 'export KNOB_TEST_NNI2_PYTHON=%q\n' "$root/.ci-cache/nni2/bin/python"
