"""``task_always_eager`` read from ``app.conf`` without Celery's generic lookup.

Reading a setting from ``app.conf`` goes through ``ConfigurationView.__getitem__``
(key translation, a try/except per mapping and key: about 2.5 us); every
``.delay()`` reads ``task_always_eager``. :func:`always_eager` does the same
lookup, in the same order, with plain ``in`` tests: the first of the
configuration's mappings (``app.conf.changes``, the configuration source, Celery's
defaults) holding the setting under its name or its old name
(``CELERY_ALWAYS_EAGER``) gives the value. Nothing is cached, so every change is
seen at once, however it was made. Whenever the lookup is not that simple (the
configuration not finalized yet, a ``namespace=``, a mapping that is not a plain
``dict`` such as a module, class or Django settings given to
``config_from_object``, which Celery reads live), it asks ``app.conf`` itself.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.app.utils import Settings

_NAME = "task_always_eager"
_KEYS = "_debounce_eager_keys"


def _keys(conf: Any) -> tuple[str, ...] | None:
    """The names ``conf[_NAME]`` looks up, in order, or None when its lookup is not a
    plain one (a prefix, a key transform)."""
    cached: tuple[str, ...] | bool | None = conf.__dict__.get(_KEYS, False)
    if cached is not False:
        return cached  # type: ignore[return-value]
    keys: tuple[str, ...] | None = None
    if not conf.prefix and conf.__dict__.get("key_t") is None:
        keys = tuple(conf._to_keys(_NAME))
    conf.__dict__[_KEYS] = keys
    return keys


def always_eager(app: Celery) -> bool:
    """``app.conf.task_always_eager``, looked up as Celery does, without its overhead."""
    conf = app._conf
    if type(conf) is Settings:
        keys = _keys(conf)
        if keys is not None:
            for mapping in conf.maps:
                if type(mapping) is not dict:
                    break  # read live through its own lookup: let Celery do it
                for key in keys:
                    if key in mapping:
                        return bool(mapping[key])
    return bool(app.conf.task_always_eager)
