"""A minimal Django project whose Celery settings use the CELERY_ namespace."""

import os

REDIS = os.environ["DJPROJ_REDIS_URL"]
SECRET_KEY = "test-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["celery_debounce.contrib.django", "notes"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["DJPROJ_DB"]}}
if os.environ.get("DJPROJ_PG"):  # "host port user dbname": the database on PostgreSQL
    _host, _port, _user, _name = os.environ["DJPROJ_PG"].split()
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": _host,
        "PORT": _port,
        "USER": _user,
        "NAME": _name,
    }
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

CELERY_BROKER_URL = f"{REDIS}/1"
CELERY_RESULT_BACKEND = f"{REDIS}/2"
CELERY_DEBOUNCE_REDIS_URL = f"{REDIS}/0"
CELERY_DEBOUNCE_KEY_PREFIX = "djdebounce"
CELERY_DEBOUNCE_POLL_INTERVAL = 0.2
