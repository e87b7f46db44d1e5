#!/usr/bin/env bash
# Creates .ci-cache/smtpd, a virtualenv with aiosmtpd from PyPI (binary wheels only, pinned):
# the real SMTP server that the notification tests start on 127.0.0.1 (cli/tests/it/notify.rs),
# with STARTTLS and AUTH, to receive the mail `knob create` sends when an experiment ends.
#
# Idempotent: a venv whose pins are unchanged and whose import works is kept. Progress goes to
# stderr; stdout is one `export KNOB_TEST_SMTPD_PYTHON=...` line, so callers can
# `eval "$(.ci/smtpd-venv.sh)"`.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.ci-cache/smtpd
pins=(aiosmtpd==1.4.6 atpublic==9.0.0 attrs==26.1.0)
wanted=$(printf '%s\n' "${pins[@]}")
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.knob-pins" 2>/dev/null)" != "$wanted" ] ||
  ! "$venv/bin/python" -c "import aiosmtpd.controller, aiosmtpd.smtp" 2>/dev/null; then
  echo "smtpd: creating $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --no-input --only-binary=:all: "${pins[@]}" >&2
  printf '%s\n' "$wanted" >"$venv/.knob-pins"
fi
echo "export KNOB_TEST_SMTPD_PYTHON=$PWD/$venv/bin/python"
