#!/usr/bin/env bash
# Make sure Debian's rabbitmq-server (and the Erlang it pulls in) is installed, for
# the RabbitMQ-broker tests (pytest -m rabbitmq). The tests start their own private
# node (tests/rabbitmq.py), so the system service the package starts is stopped and
# disabled here. Safe to run again: nothing is done when the binary is already there.
#
# Set DEBOUNCE_SKIP_RABBITMQ=1 to skip the installation (the rabbitmq tests then
# skip only if that variable is also set when they run; CI leaves it unset, so a
# failed installation fails those tests instead of hiding them).
set -euo pipefail
if [ -n "${DEBOUNCE_SKIP_RABBITMQ:-}" ]; then
  exit 0
fi
PATH="$PATH:/usr/sbin:/usr/lib/rabbitmq/bin"
if command -v rabbitmq-server >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1 || { [ "$(id -u)" != "0" ] && [ -z "$SUDO" ]; }; then
  echo "ensure-rabbitmq: cannot install rabbitmq-server (no apt-get, or not root and no sudo);" \
       "the rabbitmq tests will fail (set DEBOUNCE_SKIP_RABBITMQ=1 to skip them)" >&2
  exit 0
fi
echo "+ installing rabbitmq-server (apt)" >&2
# the package's postinst starts the service when it can: keep it from doing so
# (policy-rc.d exit 101 = "not allowed"), and remove our policy file afterwards
policy=/usr/sbin/policy-rc.d
made_policy=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  made_policy=1
fi
cleanup() { if [ -n "$made_policy" ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT
$SUDO apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  rabbitmq-server >/dev/null
# where systemd runs (not in containers), make sure the system node is off: the
# tests own their broker
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now rabbitmq-server >/dev/null 2>&1 || true
fi
# a node the package managed to start anyway (sysvinit): stop it
if command -v rabbitmqctl >/dev/null 2>&1 && pgrep -u rabbitmq beam >/dev/null 2>&1; then
  $SUDO service rabbitmq-server stop >/dev/null 2>&1 || true
fi
