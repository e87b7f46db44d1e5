# Sourced by the harness scripts that run NNI's own algorithms: sets `root` (the repository),
# `python` (a Python with nni 3.0: KNOB_BENCH_NNI3_PYTHON, else KNOB_TEST_NNI3_PYTHON, else
# .ci-cache/nni3/bin/python, made by .ci/nni-venvs.sh) and `knob` (release/, else debug/, of
# $CARGO_TARGET_DIR when set, else of target/, with the NNI dispatcher plugin beside it), or
# exits with a line saying what to do.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${KNOB_BENCH_NNI3_PYTHON:-${KNOB_TEST_NNI3_PYTHON:-$root/.ci-cache/nni3/bin/python}}
if [[ ! -x $python ]]; then
    echo "error: $python not found; run .ci/nni-venvs.sh (or set KNOB_BENCH_NNI3_PYTHON to a python with nni 3.0)" >&2
    exit 2
fi
target=${CARGO_TARGET_DIR:-$root/target}
knob=$target/release/knob
[[ -x $knob ]] || knob=$target/debug/knob
if [[ ! -x $knob || ! -f $(dirname "$knob")/libknob_nni_dispatcher.so ]]; then
    echo "error: no knob with its plugins in $target; run cargo build --workspace" >&2
    exit 2
fi
