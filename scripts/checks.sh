#!/usr/bin/env bash
# Lint, type and docs checks (the tox envs lint, type, docs) in the project's .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
"$VENV/bin/pip" install -q -e ".[test,docs]" "ruff>=0.17,<0.18" "mypy>=1.10"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy" --strict celery_debounce
NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --site-dir "$(mktemp -d)"
