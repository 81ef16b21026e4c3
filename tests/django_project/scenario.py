"""Run inside the Django project: on-commit calls of a debounced task, then their runs.

Prints one line per check; the test reads them. A worker started by the test runs
the windows.
"""

import json
import sys

import django
import redis

django.setup()

from django.core.management import call_command
from django.db import transaction
from djproj.celery import app
from notes.models import Note
from notes.tasks import index_note, plain

from celery_debounce import DebounceAdmin

call_command("migrate", run_syncdb=True, verbosity=0)
admin = DebounceAdmin(app)
client = redis.Redis.from_url(app.conf.debounce_redis_url)
out: dict[str, object] = {
    "settings_prefix": app.conf.debounce_key_prefix,
    "plain_has_on_commit": hasattr(plain, "delay_on_commit"),
}

# 1. Committed: nothing is written until the commit, then one window.
with transaction.atomic():
    note = Note.objects.create(text="first draft")
    index_note.delay_on_commit(note.id)
    index_note.apply_async_on_commit(kwargs={"note_id": note.id})
    # what a call writes (the worker's dispatcher may already have written its own keys)
    out["keys_inside_transaction"] = len(
        [
            k
            for k in client.scan_iter("djdebounce:*")
            if b":open:" in k or k.endswith((b":due", b":ids"))
        ]
    )
window = admin.window("notes.tasks.index_note", f"note:{note.id}")
out["window_after_commit"] = None if window is None else window.calls

# 2. Rolled back: nothing written at all.
try:
    with transaction.atomic():
        other = Note.objects.create(text="never saved")
        index_note.delay_on_commit(other.id)
        raise RuntimeError("roll back")
except RuntimeError:
    pass
out["window_after_rollback"] = admin.window("notes.tasks.index_note", f"note:{other.id}")
out["windows_after_rollback"] = len(admin.windows(task="notes.tasks.index_note"))

# 3. The window runs on the worker and reads the committed row.
note.text = "final text"
note.save()
result = app.AsyncResult(window.task_id) if window else None
out["result"] = result.get(timeout=30) if result else None
print(json.dumps(out))
sys.stdout.flush()
