"""``DebouncedTask`` and the by-name producer ``send_task``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from celery import Celery, Task
from celery.result import AsyncResult

from .admin import DebounceAdmin
from .aliases import FixedId, fixed_id, result_id
from .call import call_key, prepare_call, refuse_schedule, static_routing
from .collect import single_call_args, wrap_run
from .errors import DebounceConfigError
from .gate import GateResult, enter
from .on_commit import OnCommitMixin
from .options import OPTION_NAMES, DebounceSpec, TaskDefaults
from .settings import settings_for
from .store import store_for
from .windows import WindowInfo


class DebouncedTask(OnCommitMixin, Task):  # type: ignore[misc]
    """A Celery task whose calls are collapsed into one run per window.

    Task options: ``debounce`` (window), ``debounce_max_wait`` (ceiling, required
    with ``debounce``), ``debounce_key`` (key template; default: a digest of the
    arguments), ``debounce_replace_payload``, ``debounce_max_calls`` (a cap on
    calls per window), ``debounce_leading`` / ``debounce_trailing`` (which edge of
    a burst runs, as lodash's ``debounce``) and ``debounce_collect`` (the run gets
    every call; refused with ``debounce_leading=True``). The same names work per call on
    ``apply_async``; ``debounce=False`` on a call publishes it plainly.
    """

    debounce: Any = None
    debounce_key: str | None = None
    debounce_max_wait: Any = None
    debounce_replace_payload: bool = False
    debounce_max_calls: int | None = None
    debounce_leading: bool = False
    debounce_trailing: bool = True
    debounce_collect: bool = False

    _debounce_defaults: ClassVar[TaskDefaults] = TaskDefaults()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Runs inside Celery's type() call, so a bad option fails the registration.
        cls._debounce_defaults = TaskDefaults.validate(
            {name: getattr(cls, name) for name in OPTION_NAMES}
        )
        if cls._debounce_defaults.debounce_collect:
            _collect_class(cls)

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        super().on_bound(app)
        if cls._debounce_defaults.debounce_collect and cls.serializer != "json":
            # the app's task_serializer, known once the task is bound to the app
            raise DebounceConfigError(
                f"{cls.name}: debounce_collect=True needs serializer='json' (the task's "
                f"serializer is {cls.serializer!r}): the run's body is spliced from the "
                "calls' JSON"
            )

    def debounce_signature(self) -> inspect.Signature | None:
        """The run function's signature, used to bind arguments for key templates.

        None for a ``debounce_collect`` task: its function takes the list of calls,
        so ``{name}`` and ``{0}`` resolve against each call's own kwargs and args.
        """
        if self._debounce_defaults.debounce_collect:
            return None
        sig: inspect.Signature | None = self.__dict__.get("_debounce_sig")
        if sig is None:
            sig = inspect.signature(self.run)
            self.__dict__["_debounce_sig"] = sig
        return sig

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> AsyncResult:
        if "retries" in options:  # a retry of a run: never gated again
            for name in OPTION_NAMES:
                options.pop(name, None)
            spec: DebounceSpec | None = None
        else:
            spec = self._debounce_defaults.for_call(options)
        if spec is None or self.app.conf.task_always_eager:
            if spec is not None:
                refuse_schedule(options)
            if self._debounce_defaults.debounce_collect and "retries" not in options:
                # published without a window: the run still gets a list, of this call
                args, kwargs = single_call_args(args, kwargs, task_id), {}
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        check_arguments(self, args, kwargs)
        fixed = fixed_id(task_id, options)  # a caller-chosen or canvas id: see aliases.py
        if fixed is not None and spec.leading and not spec.trailing:
            refuse_fixed_leading(self.name)
        result = self._gate(spec, args, kwargs, task_id, link, link_error, shadow, options, fixed)
        return self.AsyncResult(result_id(result.task_id, fixed))

    # -- steering a window by the task's own arguments -------------------------
    def debounce_pending(
        self, *args: Any, debounce_key: str | None = None, **kwargs: Any
    ) -> WindowInfo | None:
        """The pending window a call with these arguments would join, or None.

        The key is resolved exactly as ``delay(*args, **kwargs)`` resolves it (same
        binding, template or default digest); pass ``debounce_key=`` if the calls
        override the task's template. Reads only (one HMGET and one ZSCORE).
        """
        return self._debounce_admin().window(self.name, self._debounce_key_of(
            args, kwargs, debounce_key))

    def debounce_flush(
        self, *args: Any, debounce_key: str | None = None, **kwargs: Any
    ) -> WindowInfo:
        """Run the pending window for these arguments now: close it to new calls and
        make it due at once (the next call opens a new window). Returns the window as
        flushed; raises :class:`~celery_debounce.WindowNotFound` if none is open."""
        return self._debounce_admin().flush(self.name, self._debounce_key_of(
            args, kwargs, debounce_key))

    def debounce_cancel(
        self, *args: Any, debounce_key: str | None = None, **kwargs: Any
    ) -> WindowInfo:
        """Drop the pending window for these arguments so it never runs; its result
        (and every caller-chosen id it absorbed) is marked revoked. Returns the window
        cancelled; raises :class:`~celery_debounce.WindowNotFound` if none is open."""
        return self._debounce_admin().cancel(self.name, self._debounce_key_of(
            args, kwargs, debounce_key))

    def _debounce_key_of(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None
    ) -> str:
        """The key a call with these arguments resolves to: ``call.call_key``, the
        code path ``prepare_call`` uses, after Celery's signature check as a call."""
        spec = self._debounce_defaults.for_call({} if key is None else {"debounce_key": key})
        if spec is None:
            raise DebounceConfigError(
                f"{self.name}: debounce=None on the task: it has no debounce window to steer"
            )
        check_arguments(self, args, kwargs)
        return call_key(settings_for(self.app), self.name, spec, args, kwargs,
                        self.debounce_signature(), self.serializer)

    def _debounce_admin(self) -> DebounceAdmin:
        return DebounceAdmin(self.app)

    def _debounce_exec_defaults(self) -> dict[str, Any]:
        """The task's own execution options (queue=, priority=, expires=, ... on the task).

        Merged into every call's options as ``Task.apply_async`` does; the route they
        give is resolved at call time and stored with the window, so any dispatcher
        publishes with it, whether or not it has the task registered.
        """
        cached: dict[str, Any] | None = self.__dict__.get("_debounce_exec")
        if cached is None:
            cached = exec_defaults(self)
            self.__dict__["_debounce_exec"] = cached
        return cached

    def _gate(
        self,
        spec: DebounceSpec,
        args: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
        task_id: str | None,
        link: Any,
        link_error: Any,
        shadow: str | None,
        options: dict[str, Any],
        fixed: FixedId | None = None,
    ) -> GateResult:
        app = self.app
        own = bool(options) or link is not None or link_error is not None
        shadow = shadow or self.shadow_name(args, kwargs, options)
        if shadow is not None:
            own = True
            options["shadow"] = shadow
        defaults = self._debounce_exec_defaults()
        if defaults:  # the task's own queue, priority, ...: as Task.apply_async merges them
            options = {**defaults, **options}
        if link is not None:
            options["link"] = link
        if link_error is not None:
            options["link_error"] = link_error
        call = prepare_call(
            settings_for(app),
            self.name,
            spec,
            args,
            kwargs,
            options,
            self.debounce_signature(),
            options.pop("serializer", None) or self.serializer,
            task_id,
            app=app,
            task_type=self,
            static=None if own else static_routing(app),
        )
        return enter(store_for(app, call=True), call, fixed)


def send_task(
    app: Celery,
    name: str,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    task_id: str | None = None,
    **options: Any,
) -> AsyncResult:
    """Debounced counterpart of ``app.send_task``, for producers that do not import the task.

    Takes the same debounce options as a call (``debounce``, ``debounce_key``,
    ``debounce_max_wait``, ``debounce_replace_payload``, ``debounce_max_calls``,
    ``debounce_leading``, ``debounce_trailing``, ``debounce_collect``) plus
    Celery's own. Without
    a signature, ``{0}`` is ``args[0]`` and ``{name}`` is ``kwargs["name"]``. If the
    task is registered in this process, its signature and defaults are used.
    """
    if not isinstance(name, str) or not name:
        raise DebounceConfigError(f"send_task name={name!r}: expected a non-empty task name")
    local = app.tasks.get(name)
    debounced = local if isinstance(local, DebouncedTask) else None
    defaults = debounced._debounce_defaults if debounced else TaskDefaults()
    spec = defaults.for_call(options, collect_fixed=debounced is not None)
    if spec is None:
        return app.send_task(name, args, kwargs, task_id=task_id, **options)
    if app.conf.task_always_eager and debounced is not None:
        return debounced.apply_async(args, kwargs, task_id=task_id, debounce=False, **options)
    if local is not None:
        check_arguments(local, args, kwargs)
        own = exec_defaults(local)
        if own:  # as app.send_task: a locally registered task's options apply
            options = {**own, **options}
    signature = debounced.debounce_signature() if debounced else _signature_of(local)
    serializer = options.pop("serializer", None) or (
        local.serializer if local is not None else app.conf.task_serializer
    )
    fixed = fixed_id(task_id, options)  # a caller-chosen or canvas id: see aliases.py
    if fixed is not None and spec.leading and not spec.trailing:
        refuse_fixed_leading(name)
    call = prepare_call(
        settings_for(app), name, spec, args, kwargs, options, signature, serializer, task_id,
        app=app, task_type=local,
    )
    return app.AsyncResult(result_id(enter(store_for(app, call=True), call, fixed).task_id, fixed))


def refuse_fixed_leading(name: str) -> None:
    """A caller-chosen or canvas id cannot be combined with leading only: a call the
    quiet period suppresses has no window to record its id in, so it would never
    resolve (see docs/design.md, "Leading and trailing edge")."""
    raise DebounceConfigError(
        f"{name}: debounce_leading=True, debounce_trailing=False cannot be combined with "
        "task_id= or canvas (group, chord, chain): a suppressed call's id would never get "
        "a result; use debounce_trailing=True, or no fixed id"
    )


def _collect_class(cls: type[DebouncedTask]) -> None:
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
    run = cls.__dict__.get("run")
    if run is not None:
        cls.run = wrap_run(run)
    cls.typing = False


def exec_defaults(task: Task) -> dict[str, Any]:
    """A task's execution options that are set (``Task._get_exec_options``), by value."""
    return {k: v for k, v in task._get_exec_options().items() if v is not None}


def check_arguments(task: Task, args: Any, kwargs: Any) -> None:
    """Celery's early signature check, where the task has one (``typing=True``).

    Tasks built from functions have ``__header__``; class-based tasks registered
    with ``app.register_task`` do not, and Celery skips the check for them too.
    """
    if task.typing:
        header = getattr(task, "__header__", None)
        if header is not None:
            header(*(args or ()), **(kwargs or {}))


def _signature_of(task: Task | None) -> inspect.Signature | None:
    if task is None:
        return None
    try:
        return inspect.signature(task.run)
    except (TypeError, ValueError):
        return None

