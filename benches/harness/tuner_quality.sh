#!/usr/bin/env bash
# Tuner quality: knob's tuners (through the plugin ABI) against Optuna's TPE and random search.
#
#   benches/harness/tuner_quality.sh [--quick] [more arguments of tuner_quality.rs]
#
# Sets up .ci-cache/optuna (Optuna 5.0.0 and its dependencies, pinned, binary wheels only) if it
# is missing or its pins changed, builds the release plugin library, then runs the harness
# (benches/harness/tuner_quality.rs). 20 seeds take about 9 minutes on two cores, most of it
# knob's GPTuner (7.5 min) and Optuna's TPE; --quick (5 seeds) about a quarter of that.
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=.ci-cache/optuna
pins=(optuna==5.0.0 alembic==1.20.1 colorlog==6.12.0 Mako==1.4.3 MarkupSafe==3.0.4
  numpy==2.4.6 packaging==26.3 PyYAML==6.0.3 SQLAlchemy==2.1.9 tqdm==4.70.1
  typing_extensions==4.16.0)
wanted=$(printf '%s\n' "${pins[@]}")
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.knob-pins" 2>/dev/null)" != "$wanted" ] ||
  ! "$venv/bin/python" -c "import optuna" 2>/dev/null; then
  echo "tuner_quality: creating $venv (optuna 5.0.0)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --no-input --only-binary=:all: "${pins[@]}" >&2
  printf '%s\n' "$wanted" >"$venv/.knob-pins"
fi

cargo build --release -p knob-tuners
cargo bench -p knob-benches --bench tuner_quality -- --python "$PWD/$venv/bin/python" "$@"
