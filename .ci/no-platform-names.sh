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
set -euo pipefail
cd "$(dirname "$0")/.."

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
      | grep -vE 'const SHORTCUT_PLATFORM: &str = "local";' || true)
  else
    hits=$(grep -rniwE --include='*.rs' -- "$name" core/src cli/src || true)
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
