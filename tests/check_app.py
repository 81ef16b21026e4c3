"""An app for ``celery -A check_app debounce check`` and the worker's refusal.

``CHECK_APP_BAD=1`` also imports tests/check_tasks.py (through ``imports``, as a
worker would), whose two definitions are refused; both are ``shared=True`` (the
default), which once made every other task's path raise the first one's error.
``CHECK_APP_BROKEN=1`` imports tests/check_tasks_broken.py, which raises a NameError.
"""

from __future__ import annotations

import os

from helpers import make_app

from celery_debounce import DebouncedTask

app = make_app(os.environ["DEBOUNCE_TEST_REDIS_URL"], name="check_app")
if os.environ.get("CHECK_APP_BAD"):
    app.conf.imports = ["check_tasks"]
if os.environ.get("CHECK_APP_BROKEN"):  # a task module that raises while imported
    app.conf.imports = ["check_tasks_broken"]


@app.task(base=DebouncedTask, name="check.good", debounce="1h", debounce_max_wait="2h")
def good(x: int) -> int:
    return x
