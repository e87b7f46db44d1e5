#!/usr/bin/env bash
# Prints the shell block that follows `<!-- ci:NAME -->` in README.md, so that CI runs the
# README's commands verbatim (.ci/run, .ci/wheel.sh); fails naming the marker if there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: .ci/readme-block.sh NAME (the NAME of a <!-- ci:NAME --> marker in README.md)}
block=$(awk -v marker="<!-- ci:$name -->" '$0 == marker {f=1; next} f && /^```/{ if (inside) exit; inside=1; next } f && inside {print}' README.md)
if [ -z "$block" ]; then
  echo "README.md has no shell block after a <!-- ci:$name --> marker" >&2
  exit 1
fi
printf '%s\n' "$block"
