#!/usr/bin/env bash
# The whole test suite against a real redis-server that the tests start, then the
# lint, type and docs checks. Extra arguments go to pytest (and skip the checks).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/python -m pytest "$@"
if [ "$#" -eq 0 ]; then
  scripts/checks.sh
fi
