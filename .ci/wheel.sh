#!/usr/bin/env bash
# The pip path (README, "Installing with pip"), as a user without Rust meets it:
#   1. build the wheel from the release build (.ci/run's release step has just made it; cargo
#      finds nothing to redo) with maturin from PyPI, in .ci-cache/wheel-tools;
#   2. pip install it, offline (--no-index: it must need nothing else), into a fresh virtualenv;
#   3. with only that venv's bin and the system's on PATH (no cargo, no rustc, no target/), run
#      the README's pip quickstart (between the ci:pip-quickstart markers) and `knob plugin list`
#      (the built-in plugins must come from <venv>/lib/knob/plugins);
#   4. mypy --strict over python/, and python/tests with pytest, importing the installed packages
#      and running the installed `knob`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# Tools, pinned (verified together on CPython 3.11), binary wheels only. Idempotent like
# .ci/nni-venvs.sh: a venv whose pins are unchanged is kept.
tool_pins=(
  maturin==1.16.0 mypy==2.4.1 mypy_extensions==1.2.0 ast_serialize==0.13.1 librt==0.17.0
  pathspec==1.1.1 typing_extensions==4.16.0
)
test_pins=(pytest==9.2.0 iniconfig==2.3.1 packaging==26.4 pluggy==1.7.0 Pygments==2.21.0)
tools=$root/.ci-cache/wheel-tools
pins=$(printf '%s\n' "${tool_pins[@]}" "${test_pins[@]}")
if [ ! -x "$tools/bin/maturin" ] || [ "$(cat "$tools/.knob-pins" 2>/dev/null)" != "$pins" ]; then
  echo "wheel: creating $tools" >&2
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet --no-input --only-binary=:all: "${tool_pins[@]}" "${test_pins[@]}"
  printf '%s\n' "$pins" >"$tools/.knob-pins"
fi

# KNOB_WHEEL_PROFILE=dev: from the debug build instead (a quicker check by hand).
wheel=$(KNOB_MATURIN="$tools/bin/maturin" python/build-wheel.sh "${KNOB_WHEEL_PROFILE:-release}")
echo "wheel: $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"

work=$(mktemp -d "${TMPDIR:-/tmp}/knob-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
venv=$work/venv
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --no-input --no-index "$wheel"

# A user's shell: the venv activated, nothing of Rust's, a home and registry of its own.
rust_free_path=$venv/bin:/usr/local/bin:/usr/bin:/bin
for tool in cargo rustc; do
  if PATH=$rust_free_path command -v "$tool" >/dev/null; then
    echo "wheel: $tool is on the PATH meant to have no Rust: $(PATH=$rust_free_path command -v "$tool")" >&2
    exit 1
  fi
done
as_user() {
  env -i PATH="$rust_free_path" HOME="$work/home" VIRTUAL_ENV="$venv" LANG=C.UTF-8 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KNOB_TEST_REQUIRE_ALL=1 KNOB_TEST_INSTALLED=1 "$@"
}
mkdir -p "$work/home"

quickstart=$(.ci/readme-block.sh pip-quickstart)
# The wheel is already installed; the README's `pip install` of it must be a no-op that works.
echo "wheel: $quickstart"
(cd "$root" && as_user bash -c "set -e; shopt -s nullglob; $quickstart")

plugins=$(as_user knob plugin list --json)
for library in libknob_tuners.so libknob_assessors.so libknob_training_services.so; do
  if ! grep -q "\"$venv/lib/knob/plugins/$library\"" <<<"$plugins"; then
    echo "wheel: knob does not load $library from $venv/lib/knob/plugins:" >&2
    echo "$plugins" >&2
    exit 1
  fi
done
echo "wheel: knob-agent: $(as_user knob-agent --version)"
# The man page the wheel installed is the one this knob prints.
if ! as_user knob man | cmp -s - "$venv/share/man/man1/knob.1"; then
  echo "wheel: $venv/share/man/man1/knob.1 is missing or not what \`knob man\` prints" >&2
  exit 1
fi

"$tools/bin/mypy" --strict --no-incremental --cache-dir=/dev/null python/knob python/knob_trial python/shim/nni.py python/tests

"$venv/bin/pip" install --quiet --no-input --only-binary=:all: "${test_pins[@]}"
# The shim's API is compared with real nni's: the venvs `.ci/nni-venvs.sh` made (`.ci/run`
# exports where), passed through `as_user`'s clean environment.
nni_pythons=()
for variable in KNOB_TEST_NNI3_PYTHON KNOB_TEST_NNI2_PYTHON; do
  if [ -n "${!variable:-}" ]; then
    nni_pythons+=("$variable=${!variable}")
  fi
done
# From the repository root, tests by path: `import knob` must find the installed package (the
# tests check it), not python/knob.
as_user env "${nni_pythons[@]}" "$venv/bin/python" -m pytest -p no:cacheprovider -q python/tests
