#!/usr/bin/env bash
# Fuzzes knob's parsers of untrusted input (the cargo-fuzz crate in fuzz/) for a bounded time per
# target, starting from the committed seed corpora in fuzz/corpus/<target>/ (with the libFuzzer
# dictionary fuzz/dict/<target>.dict where there is one). Fails on any crash (a panic), timeout
# (one input running longer than KNOB_FUZZ_INPUT_TIMEOUT seconds: a hang) or out-of-memory, and
# prints the input that did it.
#
#   KNOB_FUZZ_SECONDS        fuzzing time per target (default 30)
#   KNOB_FUZZ_INPUT_TIMEOUT  seconds one input may take before it counts as a hang (default 20)
#   KNOB_FUZZ_JOBS           targets fuzzed at the same time (default 2, one per core)
#   KNOB_FUZZ_TARGETS        which targets (default: all of `cargo fuzz list`)
#
# cargo-fuzz passes nightly-only flags to rustc; knob builds on stable, where RUSTC_BOOTSTRAP=1
# allows them. cargo-fuzz (pinned) is installed under .ci-cache/ when missing, and the targets
# are built there too, so a CI machine that keeps .ci-cache/ rebuilds only knob's crates.
# Nothing in the tree is written: corpora are copied to a scratch folder, which also receives
# new corpus entries and crash artifacts and is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

cargo_fuzz_version=0.13.2
seconds=${KNOB_FUZZ_SECONDS:-30}
input_timeout=${KNOB_FUZZ_INPUT_TIMEOUT:-20}
jobs=${KNOB_FUZZ_JOBS:-2}
export RUSTC_BOOTSTRAP=1
export CARGO_TERM_COLOR=never

# --- cargo-fuzz, pinned. A debug build installs in about a third of the time of a release
# build and is just as good: it only drives cargo and libFuzzer.
cargo_fuzz_root="$root/.ci-cache/cargo-fuzz"
export PATH="$cargo_fuzz_root/bin:$PATH"
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $cargo_fuzz_version" ]; then
  echo "installing cargo-fuzz $cargo_fuzz_version into $cargo_fuzz_root" >&2
  cargo install cargo-fuzz --version "=$cargo_fuzz_version" --locked --debug \
    --root "$cargo_fuzz_root" --quiet
fi
cargo fuzz --version

# --- build. CI builds in dev mode (the fuzz crate's dev profile is opt-level 1, with debug
# assertions and overflow checks) and without AddressSanitizer (the targets run safe Rust; ASan
# would double the build time and halve the executions). `cargo fuzz run` with the same flags
# reuses this build.
build_flags=(--dev --sanitizer none --target-dir "$root/.ci-cache/fuzz-target")
cargo fuzz build "${build_flags[@]}"

if [ -n "${KNOB_FUZZ_TARGETS:-}" ]; then
  read -r -a targets <<<"$KNOB_FUZZ_TARGETS"
else
  mapfile -t targets < <(cargo fuzz list)
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/knob-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# fuzz_one TARGET: fuzzes TARGET into $scratch/TARGET/ (corpus/, artifacts/, log).
fuzz_one() {
  local target=$1 dir="$scratch/$1"
  mkdir -p "$dir/corpus" "$dir/artifacts" "$dir/tmp"
  cp -R "fuzz/corpus/$target/." "$dir/corpus/"
  local dict=()
  if [ -f "fuzz/dict/$target.dict" ]; then
    dict=(-dict="$root/fuzz/dict/$target.dict")
  fi
  # TMPDIR: the config target's project folder goes to the scratch folder too.
  TMPDIR="$dir/tmp" cargo fuzz run "${build_flags[@]}" "$target" "$dir/corpus" -- \
    -max_total_time="$seconds" -timeout="$input_timeout" -rss_limit_mb=2048 \
    -artifact_prefix="$dir/artifacts/" -print_final_stats=1 "${dict[@]}" >"$dir/log" 2>&1
}

step_start=$SECONDS
failed=()
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  batch=("${targets[@]:i:jobs}")
  pids=()
  for target in "${batch[@]}"; do
    fuzz_one "$target" &
    pids+=($!)
  done
  for j in "${!batch[@]}"; do
    target=${batch[j]}
    if wait "${pids[j]}"; then
      runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$target/log" | grep -o '[0-9]*$' || true)
      echo "fuzz $target: ok, ${runs:-?} inputs in ${seconds}s"
    else
      failed+=("$target")
      echo "fuzz $target: FAILED:"
      # From the panic (or libFuzzer's error) on, without progress lines and backtrace frames.
      grep -v '^#[0-9]' "$scratch/$target/log" |
        sed -n '/panicked at\|ERROR: libFuzzer/,$p' |
        grep -v '^ *[0-9]*: \|^ *at ' | head -n 60 || true
      for artifact in "$scratch/$target/artifacts/"*; do
        [ -f "$artifact" ] || continue
        echo "input $(basename "$artifact") (base64; save it and run" \
          "RUSTC_BOOTSTRAP=1 cargo fuzz run $target FILE to reproduce):"
        base64 "$artifact"
      done
    fi
  done
done
echo "fuzzing took $((SECONDS - step_start))s for ${#targets[@]} targets"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz targets failed: ${failed[*]}" >&2
  exit 1
fi
