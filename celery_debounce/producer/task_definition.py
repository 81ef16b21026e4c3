"""A ``DebouncedTask`` class's definition, checked as Celery registers it: options
(a misspelt one refused), the key template against the function, a
``debounce_collect`` class's ``run`` wrapped; a definition refused while its app
finalizes is recorded on the class instead of raised (``refuse_later``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import Task

from ..errors import DebounceConfigError
from ..unknown_names import PREFIX, unknown_name
from .collect import wrap_run
from .options import OPTION_NAMES

if TYPE_CHECKING:
    from .task import DebouncedTask


def _base() -> type[DebouncedTask]:
    from .task import DebouncedTask  # the class being defined imports this module

    return DebouncedTask


def check_key_template(cls: type[DebouncedTask]) -> None:
    """A ``debounce_key`` naming a parameter the task's function does not have (or a
    position past its last) is refused when the task is registered, the signature
    being known there; a ``debounce_collect`` task's keys resolve against each call."""
    defaults = cls._debounce_defaults
    run = cls.__dict__.get("run")  # this class's own function (@app.task builds one)
    if defaults.debounce_key is None or defaults.debounce_collect or run is None:
        return
    from .key_templates import check_against, parse_template

    fn = run.__func__ if isinstance(run, staticmethod) else run
    check_against(
        parse_template(defaults.debounce_key),
        fn,
        str(cls.__dict__.get("name") or cls.__name__),
        skip_first=not isinstance(run, staticmethod),
    )


def definition_error(cls: type[DebouncedTask], exc: DebounceConfigError) -> DebounceConfigError:
    """``exc`` naming the task it refuses (its name, else the class's module and name):
    a definition refused at once (a class statement, ``lazy=False``) is raised from
    the task module's import, whose message must say which of its tasks is wrong."""
    name = str(cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}")
    message = str(exc)
    if message.startswith(f"{name}:"):
        return exc
    try:  # its own class (a DebounceConfigError subclass) where it takes a message
        return type(exc)(f"{name}: {message}")
    except TypeError:
        return DebounceConfigError(f"{name}: {message}")


def refuse_later(cls: type[DebouncedTask], exc: DebounceConfigError) -> bool:
    """Record ``exc`` on a task class Celery builds while its app finalizes, instead
    of raising it; True if recorded.

    Raised there, it would abort ``app.finalize()`` half-way (``app.tasks`` then
    raises this task's error from any other task's path), and, Celery keeping the
    constructor of every ``shared=True`` task for each app it finalizes, poison every
    later app of the process too. Recorded, it names this task only: its calls raise
    it, ``celery debounce check`` and the Django check list it, and a worker of the
    app refuses to start (``worker_steps.refuse_invalid_tasks``). A definition outside
    a finalize (``lazy=False``, an app already finalized, a class statement) still
    raises at once.
    """
    if not cls.__dict__.get("_decorated"):
        return False
    mutex = getattr(cls.__dict__.get("app"), "_finalize_mutex", None)
    owned = getattr(mutex, "_is_owned", None)
    if owned is not None and not owned():
        return False
    name = str(cls.__dict__.get("name") or cls.__name__)
    message = str(exc)
    cls._debounce_refused = DebounceConfigError(
        message if message.startswith(f"{name}:") else f"{name}: {message}"
    )
    return True


def refuse_unknown_class_options(cls: type[DebouncedTask]) -> None:
    """A misspelt task option (``debounce_colect=True``) would be a silent class
    attribute: refused at registration, the closest option named. Methods and other
    descriptors named ``debounce_*`` (a subclass's own helpers) are not options."""
    for name, value in cls.__dict__.items():
        if (
            name.startswith(PREFIX)
            and name not in OPTION_NAMES
            and not callable(value)
            and not hasattr(value, "__get__")
            and not hasattr(_base(), name)
        ):
            raise unknown_name(f"task option of {cls.__name__}", name, value, OPTION_NAMES)


def plain_class(cls: type[DebouncedTask]) -> None:
    """A task class without ``debounce_collect`` that inherits a collect class's
    wrapped ``run`` gets the function itself back (it takes its own arguments)."""
    run = _find_run(cls)
    original = getattr(_function_of(run), "__debounce_collect_of__", None)
    if original is not None and "run" not in cls.__dict__:
        cls.run = original
        if "typing" not in cls.__dict__:
            cls.typing = Task.typing


def _find_run(cls: type) -> Any:
    for klass in cls.__mro__:
        if "run" in klass.__dict__:
            return klass.__dict__["run"]
    return None


def _function_of(run: Any) -> Any:
    return run.__func__ if isinstance(run, staticmethod) else run


def collect_class(cls: type[DebouncedTask]) -> None:
    """Make a ``debounce_collect`` task class take the list of its window's calls.

    Its ``run`` converts the body's call elements into :class:`DebouncedCall`; the
    function's own signature ``(calls)`` is not the calls' one, so Celery's argument
    check is off (``typing=False``) and key templates bind to each call's own args
    and kwargs. A serializer other than JSON is refused here when the task names
    one, else when it is bound to the app (``on_bound``).
    """
    serializer = cls.__dict__.get("serializer")
    if serializer is not None and serializer != "json":
        raise DebounceConfigError(
            f"debounce_collect=True needs serializer='json' (got serializer={serializer!r}): "
            "the run's body is spliced from the calls' JSON"
        )
    run = _find_run(cls)  # its own, or inherited (a subclass of a plain task class)
    if run is not None and run is not Task.__dict__.get("run"):
        cls.run = wrap_run(run)
    cls.typing = False
