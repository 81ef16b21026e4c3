"""Run by ``python -m django test djproj.pg_tests`` (tests/producer/test_django.py): the
windows follow Django's test database, and the store lets go of it before Django drops
it."""

from django.db import connection
from django.test import TestCase

from celery_debounce import DebouncedTask
from celery_debounce.testing import close_store, django_database_url, use_postgres

from .celery import app


@app.task(base=DebouncedTask, name="djproj.reindex", debounce=60, debounce_max_wait=120)
def reindex(doc_id: int) -> int:
    return doc_id


class WindowsInTheTestDatabase(TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        use_postgres(app, django_database_url())

    @classmethod
    def tearDownClass(cls) -> None:
        close_store(app)
        super().tearDownClass()

    def test_a_window_lands_in_the_test_database(self) -> None:
        first = reindex.delay(7)
        assert reindex.delay(7).id == first.id
        assert connection.settings_dict["NAME"].startswith("test_")
        with connection.cursor() as cursor:  # the app's prefix names its schema
            cursor.execute("SELECT task_id, calls FROM djdebounce.debounce_open")
            assert cursor.fetchall() == [(first.id, 2)]
            # Django's own migrations put the tables in the deployment's schema too
            cursor.execute("SELECT version FROM djdebounce.debounce_schema")
            assert cursor.fetchone() is not None
