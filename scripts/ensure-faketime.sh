#!/usr/bin/env bash
# Make sure libfaketime is installed: tests/dispatch/test_clock_step.py steps the clock of a
# running server with it (LD_PRELOAD, FAKETIME_TIMESTAMP_FILE), from Debian's package
# when we can install it. Without apt that test is skipped, with the reason.
set -euo pipefail
if compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null \
    || [ -e /usr/lib/faketime/libfaketime.so.1 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = "0" ] || [ -n "$SUDO" ]; }; then
  echo "+ installing libfaketime (apt)" >&2
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    libfaketime >/dev/null
  exit 0
fi
echo "+ cannot install libfaketime (no apt): tests/dispatch/test_clock_step.py will be skipped" >&2
