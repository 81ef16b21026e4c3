#!/usr/bin/env bash
# The whole test suite against a real redis-server that the tests start.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
