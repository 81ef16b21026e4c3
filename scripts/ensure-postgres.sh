#!/usr/bin/env bash
# Make sure Debian's PostgreSQL server binaries (initdb, postgres, pg_isready) and PgBouncer
# are installed, for the PostgreSQL store's tests. The tests start their own private server
# (celery_debounce/testing/postgres.py) and PgBouncer in front of it
# (celery_debounce/testing/pgbouncer.py), so the services the packages set up are kept
# from starting here. Safe to run again: nothing is done when the binaries are there.
#
# Set DEBOUNCE_SKIP_POSTGRES=1 to skip the installation (outside CI the PostgreSQL tests
# then skip; in CI a missing server fails them).
set -euo pipefail
if [ -n "${DEBOUNCE_SKIP_POSTGRES:-}" ]; then
  exit 0
fi
have_server() {
  local dir
  for dir in ${CELERY_DEBOUNCE_PG_BINDIR:-} /usr/lib/postgresql/*/bin; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ] && [ -x "$dir/pg_isready" ]; then
      return 0
    fi
  done
  return 1
}
have_bouncer() {
  [ -x "${CELERY_DEBOUNCE_PGBOUNCER:-/usr/sbin/pgbouncer}" ] || command -v pgbouncer >/dev/null
}
have() { have_server && have_bouncer; }
if have; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1 || { [ "$(id -u)" != "0" ] && [ -z "$SUDO" ]; }; then
  echo "ensure-postgres: cannot install postgresql (no apt-get, or not root and no sudo);" \
       "the PostgreSQL store tests will fail in CI and skip elsewhere" >&2
  exit 0
fi
echo "+ installing postgresql and pgbouncer (apt)" >&2
# keep the package's postinst from starting its service (policy-rc.d exit 101 = "not
# allowed"); remove our policy file afterwards. The default cluster it creates stays
# down and unused.
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
  postgresql pgbouncer >/dev/null
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now postgresql pgbouncer >/dev/null 2>&1 || true
fi
if ! have_server; then
  echo "ensure-postgres: postgresql installed but no initdb/postgres/pg_isready found" \
       "under /usr/lib/postgresql/*/bin" >&2
  exit 1
fi
if ! have_bouncer; then
  echo "ensure-postgres: pgbouncer installed but no /usr/sbin/pgbouncer found" >&2
  exit 1
fi
