#!/usr/bin/env bash
# Create .venv with the package and its test tools, and make sure a real
# redis-server (and rabbitmq-server, for the RabbitMQ-broker tests) is installed.
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip >/dev/null 2>&1 || true
"$VENV/bin/pip" install -q -e ".[test,hiredis]"
scripts/ensure-redis.sh
scripts/ensure-rabbitmq.sh
scripts/ensure-observability.sh
