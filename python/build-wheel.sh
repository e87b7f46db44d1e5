#!/usr/bin/env bash
# Builds knob's wheel into target/wheels/ and prints its path on stdout.
#
# Usage: python/build-wheel.sh [release|dev]      (the cargo profile; default release)
#
# maturin (`KNOB_MATURIN`, else `maturin` on PATH) builds `knob` from cli/ and packs the Python
# packages; the rest of the wheel is staged here first, from the same cargo profile, into
# target/wheel-data/ (pyproject.toml's `data`): `knob-agent` (scripts/, installed beside `knob`)
# and the built-in plugin libraries (data/lib/knob/plugins/, installed as
# <prefix>/lib/knob/plugins, where knob looks for them). The workspace is built first with the
# same command the README and CI use, so that a finished release build is reused, not redone.
set -euo pipefail

profile=${1:-release}
case $profile in
    release) profile_dir=release ;;
    dev) profile_dir=debug ;;
    *) echo "usage: $0 [release|dev]" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
maturin=${KNOB_MATURIN:-maturin}
if ! command -v "$maturin" >/dev/null; then
    echo "error: maturin not found; pip install 'maturin>=1.16,<2' (or set KNOB_MATURIN)" >&2
    exit 2
fi
cd "$root"

echo "build-wheel: cargo build --profile $profile --workspace" >&2
cargo build --profile "$profile" --workspace --quiet

built=$root/target/$profile_dir
stage=$root/target/wheel-data
rm -rf "$stage"
mkdir -p "$stage/scripts" "$stage/data/lib/knob/plugins"
cp "$built/knob-agent" "$stage/scripts/"
plugins=(libknob_tuners.so libknob_assessors.so libknob_training_services.so libknob_nni_dispatcher.so)
for plugin in "${plugins[@]}"; do
    if [[ ! -f $built/$plugin ]]; then
        echo "error: $built/$plugin was not built" >&2
        exit 1
    fi
    cp "$built/$plugin" "$stage/data/lib/knob/plugins/"
done

# `man knob` in an activated virtualenv finds <venv>/share/man; the completion scripts go where
# a system install keeps them, for a user to source or link.
mkdir -p "$stage/data/share/man/man1" "$stage/data/share/bash-completion/completions" \
    "$stage/data/share/zsh/site-functions" "$stage/data/share/fish/vendor_completions.d"
"$built/knob" man >"$stage/data/share/man/man1/knob.1"
"$built/knob" completions bash >"$stage/data/share/bash-completion/completions/knob"
"$built/knob" completions zsh >"$stage/data/share/zsh/site-functions/_knob"
"$built/knob" completions fish >"$stage/data/share/fish/vendor_completions.d/knob.fish"

echo "build-wheel: maturin build --profile $profile" >&2
rm -rf "$root/target/wheels"
(cd "$root/python" && "$maturin" build --quiet --profile "$profile" --out "$root/target/wheels") >&2
wheels=("$root"/target/wheels/*.whl)
if [[ ${#wheels[@]} -ne 1 || ! -f ${wheels[0]} ]]; then
    echo "error: expected one wheel in target/wheels, found: ${wheels[*]}" >&2
    exit 1
fi
# What must be inside, by name: a wheel without its plugins would install and then fail to run.
listing=$(python3 -m zipfile -l "${wheels[0]}")
for member in scripts/knob scripts/knob-agent "${plugins[@]/#/data/lib/knob/plugins/}" \
    data/share/man/man1/knob.1 knob/__init__.py knob_trial/__init__.py; do
    if ! grep -q "$member" <<<"$listing"; then
        echo "error: ${wheels[0]} lacks $member" >&2
        exit 1
    fi
done
if grep -q "nni.py\|tests/" <<<"$listing"; then
    echo "error: ${wheels[0]} holds the nni shim or the tests" >&2
    exit 1
fi
echo "${wheels[0]}"
