"""``task_always_eager`` read once per configuration change, not on every call.

Reading a setting from ``app.conf`` walks Celery's chained mappings with its key
translation (about 2.5 us); every ``.delay()`` reads ``task_always_eager``. Here
the value is cached per app and read again whenever the configuration may have
changed: the app's ``conf`` object was replaced (``config_from_object`` after
finalization, ``app.conf = ...``) or written through one of its mutating methods
(``app.conf.x = v``, ``app.conf["x"] = v``, ``update``, ``setdefault``, ``pop``,
``clear``, ``add_defaults``, ...). For that, the app's ``Settings`` object is given
a subclass of its own class whose mutating methods count changes. Until Celery has
finalized the configuration (``PendingConfiguration``), nothing is cached.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.app.utils import Settings

#: The mutating methods of ``Settings`` (and the mappings it inherits from).
MUTATORS = ("__setitem__", "__delitem__", "__setattr__", "__delattr__", "update",
            "setdefault", "pop", "popitem", "clear", "add_defaults", "swap_with")

_generation = itertools.count(1)
_GEN = "_debounce_generation"
_CACHE = "_debounce_eager"


def _counting(original: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:  # also after an error: the change may have been partly made
            object.__getattribute__(self, "__dict__")[_GEN] = next(_generation)

    method.__name__ = getattr(original, "__name__", "method")
    method.__doc__ = getattr(original, "__doc__", None)
    return method


_watched_class: type[Settings] = type("Settings", (Settings,), {
    "__module__": Settings.__module__, "__qualname__": Settings.__qualname__,
    **{name: _counting(getattr(Settings, name)) for name in MUTATORS
       if hasattr(Settings, name)},
})


def watch(conf: Any) -> bool:
    """Make ``conf`` count its changes; False for a configuration that cannot be
    watched (not finalized yet, or not Celery's own ``Settings`` class)."""
    if type(conf) is _watched_class:
        return True
    if type(conf) is not Settings:
        return False
    conf.__dict__.setdefault(_GEN, 0)
    object.__setattr__(conf, "__class__", _watched_class)  # its __setattr__ sets a key
    return True


def always_eager(app: Celery) -> bool:
    """``app.conf.task_always_eager``, cached until the configuration changes."""
    conf = app._conf
    cached: tuple[Any, int, bool] | None = app.__dict__.get(_CACHE)
    if cached is not None and cached[0] is conf and cached[1] == conf.__dict__.get(_GEN):
        return cached[2]
    value = bool(app.conf.task_always_eager)
    conf = app._conf  # reading may have finalized it
    if watch(conf):
        app.__dict__[_CACHE] = (conf, conf.__dict__[_GEN], value)
    return value
