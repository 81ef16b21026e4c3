"""Run inside the Django project with the windows' Redis down (the broker up): the
"must not lose a run" recipe, on-commit calls with ``CELERY_DEBOUNCE_ON_OUTAGE =
"publish"``. Prints one JSON line; tests/producer/test_django.py reads it."""

import json
import os
import sys

import django
from django.conf import settings

django.setup()
# the recipe's setting, and a windows' Redis nothing listens on (the broker stays up)
settings.CELERY_DEBOUNCE_ON_OUTAGE = "publish"
settings.CELERY_DEBOUNCE_REDIS_URL = os.environ["DJPROJ_DEAD_URL"]

from django.core.management import call_command
from django.db import transaction
from djproj.celery import app
from notes.models import Note
from notes.tasks import index_note

from celery_debounce import DebounceBackendError
from celery_debounce.signals import outage_fallback

call_command("migrate", run_syncdb=True, verbosity=0)
fallbacks: list[str] = []
outage_fallback.connect(lambda sender, task_id, **_: fallbacks.append(task_id), weak=False)
out: dict[str, object] = {"policy": app.conf.debounce_on_outage}

# 1. The recipe: the row commits, the on-commit hook publishes the run plainly.
with transaction.atomic():
    note = Note.objects.create(text="saved while Redis was down")
    index_note.delay_on_commit(note.id)
out["fallbacks"] = len(fallbacks)
out["result"] = app.AsyncResult(fallbacks[0]).get(timeout=30) if fallbacks else None

# 2. Under "raise" (today's default) the hook raises after the commit: the row is
# saved, its run is not.
raised = None
try:
    with transaction.atomic():
        lost = Note.objects.create(text="its run is lost")
        index_note.apply_async_on_commit((lost.id,), debounce_on_outage="raise")
except DebounceBackendError as exc:
    raised = [kind.__name__ for kind in type(exc).__mro__]  # the store's typed errors
out["raise_raised"] = raised
out["raise_row_saved"] = Note.objects.filter(pk=lost.id).exists()
out["raise_fallbacks"] = len(fallbacks)
print(json.dumps(out))
sys.stdout.flush()
