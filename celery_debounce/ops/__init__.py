"""The ops stage of celery_debounce (see docs/design.md, "Module map")."""
