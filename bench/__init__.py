"""Benchmarks for celery_debounce: ``python -m bench [--quick] [--json]``.

Every target is a ratio against a baseline measured in the same run, against a
local redis-server the command starts itself. Benchmarks are not tests.
"""
