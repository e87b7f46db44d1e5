#!/usr/bin/env bash
# Architecture invariant (issue 13): the core and the CLI name no training-service platform, so
# that adding a training service touches only its plugin. Fails listing each Rust source line of
# core/src or cli/src that names one.
#
# The names: every training service exported by this repository's plugins and examples
# (`training_service "NAME"` in `export_plugin!`), and NNI's platforms knob does not run. They are
# matched as whole words, ignoring case, in code and comments alike. `local` is the exception the
# invariant allows, as the platform NNI's top-level shortcut fields (useActiveGpu, gpuIndices, ...)
# go to: it may be written only as the value of `SHORTCUT_PLATFORM`, and it is matched only as a
# platform would be written ("local", platform: local), since "local" is also an ordinary word.
#
# Exempt, each with its reason (keep this list short; each entry is a debt):
# - core/src/config/v1.rs: the NNI v1 -> v2 conversion, a fixed translation of NNI's own v1
#   document format (NNI's to_v2), which names NNI's platforms and their v1 blocks. Moving it into
#   the plugins needs a service call of its own (a service converting its v1 block).
set -euo pipefail
cd "$(dirname "$0")/.."
exempt='^core/src/config/v1\.rs:'

names=$(
  {
    grep -rhoE 'training_service +"[A-Za-z0-9_-]+"' --include='*.rs' training-services examples 2>/dev/null \
      | sed -E 's/.*"([^"]+)"/\1/'
    printf '%s\n' openpai aml dlc kubeflow frameworkcontroller adl dlts
  } | tr 'A-Z' 'a-z' | sort -u
)
if ! grep -qx remote <<<"$names"; then
  echo "no-platform-names: found no exported training services (looked for training_service \"NAME\"); is the pattern stale?" >&2
  exit 1
fi

found=0
for name in $names; do
  if [ "$name" = local ]; then
    hits=$(grep -rnE --include='*.rs' "\"local\"|platform: *local\b" core/src cli/src \
      | grep -vE 'const SHORTCUT_PLATFORM: &str = "local";' | grep -vE "$exempt" || true)
  else
    hits=$(grep -rniwE --include='*.rs' -- "$name" core/src cli/src | grep -vE "$exempt" || true)
  fi
  if [ -n "$hits" ]; then
    echo "core/src and cli/src must not name the training-service platform \"$name\" (it belongs in its plugin):" >&2
    echo "$hits" >&2
    found=1
  fi
done
if [ "$found" = 1 ]; then
  exit 1
fi
echo "no platform named in core/src or cli/src (checked: $(echo $names))"
