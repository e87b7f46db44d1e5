#!/usr/bin/env bash
# Creates .ci-cache/optuna-fanova, a virtualenv with Optuna and scikit-learn from PyPI (binary
# wheels only, pinned), for core's importance test: knob's fANOVA against Optuna's
# FanovaImportanceEvaluator on the same trials (core/tests/it/importance.rs).
#
# Idempotent: a venv whose pins are unchanged and whose imports work is kept. Progress goes to
# stderr; stdout is one `export KNOB_TEST_OPTUNA_PYTHON=...` line, so callers can
# `eval "$(.ci/optuna-fanova.sh)"`.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.ci-cache/optuna-fanova
pins=(optuna==5.0.0 scikit-learn==1.9.1 scipy==1.17.1 joblib==1.6.0 threadpoolctl==3.8.0
  numpy==2.4.6 alembic==1.20.1 colorlog==6.12.0 Mako==1.4.3 MarkupSafe==3.0.4
  packaging==26.4 PyYAML==6.0.4 SQLAlchemy==2.1.9 tqdm==4.70.1 typing_extensions==4.16.0)
wanted=$(printf '%s\n' "${pins[@]}")
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.knob-pins" 2>/dev/null)" != "$wanted" ] ||
  ! "$venv/bin/python" -c "import optuna, sklearn" 2>/dev/null; then
  echo "optuna-fanova: creating $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --no-input --only-binary=:all: "${pins[@]}" >&2
  printf '%s\n' "$wanted" >"$venv/.knob-pins"
fi
echo "export KNOB_TEST_OPTUNA_PYTHON=$PWD/$venv/bin/python"
