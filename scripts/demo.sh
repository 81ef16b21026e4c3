#!/usr/bin/env bash
# Run the example project's demo: a burst of calls becoming one run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m example_project.demo "$@"
