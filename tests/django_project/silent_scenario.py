"""Run inside the Django project with a windows' Redis that accepts connections and
never answers (the broker up): on-commit calls under ``CELERY_DEBOUNCE_ON_OUTAGE =
"publish"``, each commit timed. Prints one JSON line; tests/producer/test_django.py
reads it."""

import json
import os
import sys
import time

import django
from django.conf import settings

django.setup()
settings.CELERY_DEBOUNCE_ON_OUTAGE = "publish"
settings.CELERY_DEBOUNCE_REDIS_URL = os.environ["DJPROJ_SILENT_URL"]
settings.CELERY_DEBOUNCE_REDIS_TIMEOUT = float(os.environ["DJPROJ_TIMEOUT"])
settings.CELERY_DEBOUNCE_OUTAGE_PROBE_INTERVAL = 60  # no probe during the scenario

from django.core.management import call_command
from django.db import transaction
from djproj.celery import app
from notes.models import Note
from notes.tasks import index_note

from celery_debounce import DebounceBackendError
from celery_debounce.signals import outage_fallback

call_command("migrate", run_syncdb=True, verbosity=0)
fallbacks: list[tuple[str, str]] = []
outage_fallback.connect(
    lambda sender, task_id, reason, **_: fallbacks.append((task_id, reason)), weak=False
)


def saved(text: str) -> float:
    """Save a note and call the task on commit: the seconds the transaction took."""
    start = time.monotonic()
    with transaction.atomic():
        note = Note.objects.create(text=text)
        index_note.delay_on_commit(note.id)
    return time.monotonic() - start


out: dict[str, object] = {"timeout": app.conf.debounce_redis_timeout}
# 1. The first commit waits the timeout once, then publishes; the burst after it
# skips Redis (the breaker is open) and publishes each run at once.
out["first"] = saved("save 0")
out["burst"] = [saved(f"save {i}") for i in range(1, 6)]
out["reasons"] = [reason for _, reason in fallbacks]
out["results"] = [app.AsyncResult(task_id).get(timeout=30) for task_id, _ in fallbacks]

# 2. Under "raise" the hook fails fast too: the row is saved, the error is the
# breaker's, raised after the commit.
raised = None
start = time.monotonic()
try:
    with transaction.atomic():
        lost = Note.objects.create(text="its run is lost")
        index_note.apply_async_on_commit((lost.id,), debounce_on_outage="raise")
except DebounceBackendError as exc:
    raised = [kind.__name__ for kind in type(exc).__mro__]
out["raise_took"] = time.monotonic() - start
out["raise_raised"] = raised
out["raise_row_saved"] = Note.objects.filter(pk=lost.id).exists()
out["raise_fallbacks"] = len(fallbacks)
print(json.dumps(out))
sys.stdout.flush()
