import os

from celery import shared_task

from celery_debounce import DebouncedTask


@shared_task(
    base=DebouncedTask, debounce="300ms", debounce_max_wait="10s", debounce_key="note:{note_id}"
)
def index_note(note_id: int) -> str:
    from notes.models import Note

    return Note.objects.get(pk=note_id).text


@shared_task
def plain(x: int) -> int:
    return x


if os.environ.get("DJPROJ_BAD"):  # tests/producer/test_django.py: manage.py check refuses it

    @shared_task(base=DebouncedTask, debounce="1s", debounce_max_wait="2s", debounce_colect=True)
    def misspelt(x: int) -> int:
        return x


if os.environ.get("DJPROJ_BROKEN"):  # tests/producer/test_django.py: a module that fails to import
    settings_module_typo  # type: ignore[name-defined]  # noqa: F821
