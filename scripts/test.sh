#!/usr/bin/env bash
# The whole test suite (the main run: .venv, newest Celery and redis-py, a real redis-server
# that the tests start), then the corners (scripts/test-corners.sh: the contract subset from
# the built wheel on the lowest, a middle and the newest supported versions; the newest is
# also the Valkey run), then the lint, type and docs checks, then the mutation check
# (scripts/mutation_check.py: every listed bug must be caught by the tests that guard its
# guarantee). The wheel and sdist are built once first (python -m build, twine check).
# Extra arguments go to pytest (and skip the corners, the checks and the mutation check).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
CELERY_DEBOUNCE_WHEEL="$(.venv/bin/python scripts/corners.py build)"
export CELERY_DEBOUNCE_WHEEL
.venv/bin/python -m pytest "$@"
if [ "$#" -eq 0 ]; then
  (cd clients/node && npm test)  # the Node producer: shared vectors, a real redis-server
  scripts/test-corners.sh --no-build
  scripts/checks.sh
  .venv/bin/python scripts/mutation_check.py --jobs 2
fi
