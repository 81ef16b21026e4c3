#!/usr/bin/env bash
# A few minutes' check from the checkout: the contract subset (scripts/corners.toml's
# [contract]: the end-to-end tests of the core promise, the leading edge, collect, the
# cap, the CLI verbs, a fresh install) on .venv's versions against one real redis-server
# that the tests start. The whole suite is scripts/test.sh (about an hour).
# Needs .venv with the test extra (made here if missing) and a redis-server (installed by
# scripts/ensure-redis.sh when none is found). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
if ! "$VENV/bin/python" -c "import celery_debounce, pytest, fakeredis" >/dev/null 2>&1; then
  [ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/pip" install -q -e ".[test]" "build>=1"
fi
if ! "$VENV/bin/python" -c "from celery_debounce.testing.servers import find_redis_server as f
f()" >/dev/null 2>&1; then
  VENV="$VENV" scripts/ensure-redis.sh
fi
mapfile -t selection < <("$VENV/bin/python" scripts/corners.py tests lowest)
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" "${selection[@]}"
