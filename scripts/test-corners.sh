#!/usr/bin/env bash
# The corners of the supported range (scripts/corners.toml: lowest, middle, newest, and one row each for Celery 5.4, Celery 5.6 and redis-py 7), each in
# a new venv with exactly its Python, Celery, kombu and redis-py, from the built wheel,
# against its own server (Redis 6.2, Redis 7.0, Valkey 8.1): the contract subset, and on the
# newest corner the Valkey selection too. Builds the wheel and sdist once (python -m build,
# twine check) unless --no-build reuses .corners/dist. Arguments: corner names (default all).
# A missing interpreter or a server of another version fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/corners.py run "$@"
