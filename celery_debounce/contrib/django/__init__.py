"""Django integration: add ``"celery_debounce.contrib.django"`` to ``INSTALLED_APPS``
and ``manage.py check`` (run by ``migrate`` and ``runserver`` too) refuses a debounced
task definition or a ``CELERY_DEBOUNCE_*`` setting that a worker would refuse."""

from .database import database_url

__all__ = ["database_url"]
