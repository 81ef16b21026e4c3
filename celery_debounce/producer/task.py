"""``DebouncedTask`` and the by-name producer ``send_task``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any, ClassVar

from celery import Celery, Task
from celery.result import AsyncResult

from ..aliases import FixedId, fixed_id, result_id
from ..errors import DebounceBackendError, DebounceConfigError
from ..headers import COLLECT_HEADER, SHARD_HEADER
from ..settings import Settings, settings_for
from ..store import store_for
from ..store.idents import ident_prefix
from ..stored_call import new_task_id
from . import canvas, outage, steering, worker_steps
from .by_name import Published, published, refuse_unfit
from .call import call_key, prepare_call, refuse_schedule, static_routing
from .collect import single_call_args
from .confcache import always_eager
from .gate import GateResult, enter
from .on_commit import OnCommitMixin
from .options import OPTION_NAMES, DebounceSpec, TaskDefaults
from .result import light_result
from .steering import WindowInfo
from .task_definition import (
    check_key_template,
    collect_class,
    definition_error,
    plain_class,
    refuse_later,
    refuse_unknown_class_options,
)


class DebouncedTask(OnCommitMixin, Task):  # type: ignore[misc]
    """A Celery task whose calls are collapsed into one run per window.

    Task options: ``debounce`` (window), ``debounce_max_wait`` (ceiling, required
    with ``debounce``), ``debounce_key`` (key template; default: a digest of the
    arguments), ``debounce_replace_payload``, ``debounce_max_calls`` (a cap on
    calls per window), ``debounce_leading`` / ``debounce_trailing`` (which edge of
    a burst runs, as lodash's ``debounce``) and ``debounce_collect`` (the run gets
    every call; refused with ``debounce_leading=True``) and ``debounce_exclusive`` (runs of
    one key never overlap). The same names work per call on
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
    debounce_exclusive: bool = False
    debounce_on_outage: str | None = None

    #: The worker's main process finishes a window whose pool child died mid-run
    #: (``worker/request.py``'s WindowRequest, named by its path: the worker loads it);
    #: a custom Request should derive from it.
    Request = "celery_debounce.worker.receivers:WindowRequest"

    _debounce_defaults: ClassVar[TaskDefaults] = TaskDefaults()
    #: A definition refused while its app finalized (see ``refuse_later``): every
    #: call of the task raises it, and a worker of the app refuses to start.
    _debounce_refused: ClassVar[DebounceConfigError | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Runs inside Celery's type() call, so a bad option fails the registration.
        try:
            refuse_unknown_class_options(cls)
            cls._debounce_defaults = TaskDefaults.validate(
                {name: getattr(cls, name) for name in OPTION_NAMES}
            )
            check_key_template(cls)
            if cls._debounce_defaults.debounce_collect:
                collect_class(cls)
            else:
                plain_class(cls)
        except DebounceConfigError as exc:
            if not refuse_later(cls, exc):
                named = definition_error(cls, exc)  # raised at once: say which task
                if named is exc:
                    raise
                raise named from exc

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        super().on_bound(app)
        # the worker's receivers and bootsteps, wherever this app runs a worker: bound
        # here (a worker binds its app's tasks before worker_init), not by an import
        worker_steps.install()
        canvas.install(app)  # a chain/chord with this task later in it is checked when applied
        if (
            cls._debounce_refused is None
            and cls._debounce_defaults.debounce_collect
            and cls.serializer != "json"
        ):
            # the app's task_serializer, known once the task is bound to the app
            exc = DebounceConfigError(
                f"{cls.name}: debounce_collect=True needs serializer='json' (the task's "
                f"serializer is {cls.serializer!r}): the run's body is spliced from the "
                "calls' JSON"
            )
            if not refuse_later(cls, exc):
                raise exc

    def _refuse_if_invalid(self) -> None:
        refused = type(self)._debounce_refused
        if refused is not None:
            raise DebounceConfigError(str(refused))

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
        if type(self)._debounce_refused is not None:  # inline: every call's hot path
            self._refuse_if_invalid()
        if "retries" in options:  # a retry of a run: never gated again
            for name in OPTION_NAMES:
                options.pop(name, None)
            spec: DebounceSpec | None = None
        else:
            spec = self._debounce_defaults.for_call(options)
        if options and spec is not None and (options.get("chain") or options.get("chord")):
            canvas.refuse_deferred(self.app, options.get("chain"), options.get("chord"))
        if spec is None or always_eager(self.app):
            if spec is not None:  # eager: every check of a real call, nothing written
                check_eager(self, spec, args, kwargs, task_id, link, link_error, shadow, options)
            if self._debounce_defaults.debounce_collect and "retries" not in options:
                # published without a window: the run still gets a list, of this call
                args, kwargs = single_call_args(args, kwargs, task_id), {}
                options["headers"] = {**(options.get("headers") or {}), COLLECT_HEADER: 1}
            token = _CHECKED.set(True)  # eager: Task.apply below, already checked
            try:
                return super().apply_async(
                    args, kwargs, task_id, producer, link, link_error, shadow, **options
                )
            finally:
                _CHECKED.reset(token)
        check_arguments(self, args, kwargs)
        plain = dict(options) if options else None  # for a plain publish (outage.py)
        fixed = fixed_id(task_id, options)  # a caller-chosen or canvas id: see aliases.py
        if fixed is not None and spec.leading and not spec.trailing:
            refuse_fixed_leading(self.name)
        try:
            result = self._gate(
                spec, args, kwargs, task_id, link, link_error, shadow, options, fixed
            )
        except outage.Fallback as fallback:  # debounce_on_outage="publish"
            return fallback.published(
                self._publish_plainly(
                    args, kwargs, task_id, producer, link, link_error, shadow, plain or {}
                )
            )
        return light_result(self, result_id(result.task_id, fixed))

    def _publish_plainly(
        self,
        args: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
        task_id: str | None,
        producer: Any,
        link: Any,
        link_error: Any,
        shadow: str | None,
        options: dict[str, Any],
    ) -> AsyncResult:
        """Publish one call as ``debounce=False`` does: with its own options and id,
        never through the gate; a collect task's run still gets a list (of this call)."""
        if self._debounce_defaults.debounce_collect:
            args, kwargs = single_call_args(args, kwargs, task_id), {}
            options["headers"] = {**(options.get("headers") or {}), COLLECT_HEADER: 1}
        return super().apply_async(
            args, kwargs, task_id, producer, link, link_error, shadow, **options
        )

    def apply(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        link: Any = None,
        link_error: Any = None,
        task_id: str | None = None,
        retries: int | None = None,
        throw: bool | None = None,
        logfile: Any = None,
        loglevel: Any = None,
        headers: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Any:
        """Celery's ``apply``; in eager mode a canvas member's call is checked first.

        Eager canvas (``group``/``chord``/``chain`` with ``task_always_eager``) runs its
        members with ``Signature.apply`` -> ``Task.apply``, never ``apply_async``: such
        a call gets the checks of an eager ``apply_async`` (options, key, payload; leading
        only for a group member, whose id is fixed). Not checked: a call from this
        task's own ``apply_async`` (already checked), a retry, a window's run
        (``testing.run_windows``: it carries the shard header), and any call outside
        eager mode (``apply`` is then a local run, as in Celery).
        """
        self._refuse_if_invalid()
        if (
            self.app.conf.task_always_eager
            and not _CHECKED.get()
            and not retries
            and not (headers and SHARD_HEADER in headers)
        ):
            call_options = dict(options)
            spec = self._debounce_defaults.for_call(call_options)
            if spec is not None:
                # a group member's id is fixed (Celery freezes it), even if not passed here
                member = (task_id or new_task_id()) if call_options.get("group_id") else None
                check_eager(
                    self,
                    spec,
                    args,
                    kwargs,
                    member,
                    link,
                    link_error,
                    call_options.get("shadow"),
                    call_options,
                )
            for name in OPTION_NAMES:
                options.pop(name, None)
        return super().apply(
            args,
            kwargs,
            link,
            link_error,
            task_id,
            retries,
            throw,
            logfile,
            loglevel,
            headers,
            **options,
        )

    # -- the canvas shortcuts that would run the task inline, never gated --------
    def map(self, it: Any) -> Any:
        if self._debounce_defaults.spec is not None:
            raise canvas.refuse_shortcut(self.name, "map")
        return super().map(it)

    def starmap(self, it: Any) -> Any:
        if self._debounce_defaults.spec is not None:
            raise canvas.refuse_shortcut(self.name, "starmap")
        return super().starmap(it)

    def chunks(self, it: Any, n: int) -> Any:
        if self._debounce_defaults.spec is not None:
            raise canvas.refuse_shortcut(self.name, "chunks")
        return super().chunks(it, n)

    # -- steering a window by the task's own arguments -------------------------
    def debounce_pending(
        self, *args: Any, debounce_key: str | None = None, **kwargs: Any
    ) -> WindowInfo | None:
        """The pending window a call with these arguments would join, or None.

        The key is resolved exactly as ``delay(*args, **kwargs)`` resolves it (same
        binding, template or default digest); pass ``debounce_key=`` if the calls
        override the task's template. Reads only (one HMGET and one ZSCORE).
        """
        return steering.window(
            store_for(self.app), self.name, self._debounce_key_of(args, kwargs, debounce_key)
        )

    def debounce_flush(
        self, *args: Any, debounce_key: str | None = None, **kwargs: Any
    ) -> WindowInfo:
        """Run the pending window for these arguments now: close it to new calls and
        make it due at once (the next call opens a new window). Returns the window as
        flushed; raises :class:`~celery_debounce.WindowNotFound` if none is open."""
        return steering.flush(
            store_for(self.app), self.name, self._debounce_key_of(args, kwargs, debounce_key)
        )

    def debounce_cancel(
        self, *args: Any, debounce_key: str | None = None, **kwargs: Any
    ) -> WindowInfo:
        """Drop the pending window for these arguments so it never runs; its result
        (and every caller-chosen id it absorbed) is marked revoked. Returns the window
        cancelled; raises :class:`~celery_debounce.WindowNotFound` if none is open."""
        return steering.cancel(
            self.app,
            store_for(self.app),
            self.name,
            self._debounce_key_of(args, kwargs, debounce_key),
        )

    def _debounce_key_of(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None
    ) -> str:
        """The key a call with these arguments resolves to: ``call.call_key``, the
        code path ``prepare_call`` uses, after Celery's signature check as a call."""
        self._refuse_if_invalid()
        spec = self._debounce_defaults.for_call({} if key is None else {"debounce_key": key})
        if spec is None:
            raise DebounceConfigError(
                f"{self.name}: debounce=None on the task: it has no debounce window to steer"
            )
        check_arguments(self, args, kwargs)
        return call_key(
            settings_for(self.app),
            self.name,
            spec,
            args,
            kwargs,
            self.debounce_signature(),
            self.serializer,
        )

    def on_replace(self, sig: Any) -> Any:
        """``self.replace(sig)`` in a window's run: the window and its aliases get the
        replacement's outcome (``worker/receivers.py``'s ``forward_replacement``, imported
        here, in the worker's run: the producer stage does not import the worker's)."""
        if not self.request.is_eager:
            from ..worker.receivers import forward_replacement

            forward_replacement(self, sig)
        return super().on_replace(sig)

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
        if outage.OPEN:  # a breaker is open in this process: the slow path
            return outage.gate_guarded(app, call, fixed)
        try:
            return enter(store_for(app, call=True), call, fixed)
        except DebounceBackendError as exc:
            raise outage.failed(app, spec, self.name, call.key, exc) from exc


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
    Celery's own. If the task is registered in this process, its signature and
    defaults are used; if not, the definition its workers published (read from the store
    at most every few seconds: ``producer/by_name.py``), as a Node call uses it. With
    neither, ``{0}`` is ``args[0]`` and ``{name}`` is ``kwargs["name"]``.
    """
    if not isinstance(name, str) or not name:
        raise DebounceConfigError(f"send_task name={name!r}: expected a non-empty task name")
    ident_prefix(name)  # a name no store can hold is refused before any read by it
    local = app.tasks.get(name)
    debounced = local if isinstance(local, DebouncedTask) else None
    if debounced is not None:
        debounced._refuse_if_invalid()
    found = None if local is not None else _definition_of(app, name, options)
    defaults = (
        debounced._debounce_defaults if debounced else found.defaults if found else TaskDefaults()
    )
    original = dict(options)
    spec = defaults.for_call(options, collect_fixed=debounced is not None or found is not None)
    if spec is None:
        return app.send_task(name, args, kwargs, task_id=task_id, **options)
    if app.conf.task_always_eager and debounced is not None:  # checked as a call, run inline
        return debounced.apply_async(args, kwargs, task_id=task_id, **original)
    options = _task_options(name, local, found, args, kwargs, options)
    signature = (
        debounced.debounce_signature()
        if debounced
        else found.signature
        if found is not None and not spec.collect
        else _signature_of(local)
    )
    serializer = options.pop("serializer", None) or (
        local.serializer if local is not None else app.conf.task_serializer
    )
    fixed = fixed_id(task_id, options)  # a caller-chosen or canvas id: see aliases.py
    if fixed is not None and spec.leading and not spec.trailing:
        refuse_fixed_leading(name)
    call = prepare_call(
        settings_for(app),
        name,
        spec,
        args,
        kwargs,
        options,
        signature,
        serializer,
        task_id,
        app=app,
        task_type=local,
    )
    try:
        if outage.OPEN:
            result = outage.gate_guarded(app, call, fixed)
        else:
            try:
                result = enter(store_for(app, call=True), call, fixed)
            except DebounceBackendError as exc:
                raise outage.failed(app, spec, name, call.key, exc) from exc
    except outage.Fallback as fallback:  # debounce_on_outage="publish": no window
        plain = {k: v for k, v in original.items() if k not in OPTION_NAMES}
        if spec.collect:  # the run takes a list of calls: one, as debounce=False gives it
            args, kwargs = single_call_args(args, kwargs, task_id), {}
            plain["headers"] = {**(plain.get("headers") or {}), COLLECT_HEADER: 1}
        return fallback.published(app.send_task(name, args, kwargs, task_id=task_id, **plain))
    return app.AsyncResult(result_id(result.task_id, fixed))


def _task_options(
    name: str,
    local: Task | None,
    found: Published | None,
    args: Any,
    kwargs: Any,
    options: dict[str, Any],
) -> dict[str, Any]:
    """A call by name's options with the task's own under them (a task registered here,
    as ``app.send_task`` merges them; else its published definition's route and
    options, as its ``.delay()`` stores them), its arguments checked as the task would."""
    if local is not None:
        check_arguments(local, args, kwargs)
        own = exec_defaults(local)
        return {**own, **options} if own else options
    if found is not None:
        refuse_unfit(name, found, args, kwargs)
        return {**found.options, **options}
    return options


def _definition_of(app: Celery, name: str, options: Mapping[str, Any]) -> Published | None:
    """The published definition of ``name``; an outage is raised unless the call gives its
    own window (``debounce=``), which then goes on without one, as before definitions."""
    try:
        return published(app, name)
    except DebounceBackendError:
        if options.get("debounce") is None:
            raise
        return None


def check_eager(
    task: DebouncedTask,
    spec: DebounceSpec,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    task_id: str | None,
    link: Any,
    link_error: Any,
    shadow: str | None,
    options: Mapping[str, Any],
) -> None:
    """The checks a call makes before the gate (``prepare_call``: options, key,
    payload size; leading only with a fixed id), for a call eager mode runs inline:
    what production refuses, eager mode refuses too. Writes nothing, needs no Redis."""
    refuse_schedule(options)
    check_arguments(task, args, kwargs)
    copied = dict(options)
    fixed = fixed_id(task_id, copied)
    if fixed is not None and spec.leading and not spec.trailing:
        refuse_fixed_leading(task.name)
    if link is not None:
        copied["link"] = link
    if link_error is not None:
        copied["link_error"] = link_error
    if shadow is not None:
        copied["shadow"] = shadow
    defaults = task._debounce_exec_defaults()
    if defaults:
        copied = {**defaults, **copied}
    prepare_call(
        _eager_settings(task.app),
        task.name,
        spec,
        args,
        kwargs,
        copied,
        task.debounce_signature(),
        copied.pop("serializer", None) or task.serializer,
        task_id,
        app=task.app,
        task_type=task,
    )


def refuse_fixed_leading(name: str) -> None:
    """A caller-chosen or canvas id cannot be combined with leading only: a call the
    quiet period suppresses has no window to record its id in, so it would never
    resolve (see docs/design.md, "Leading and trailing edge")."""
    raise DebounceConfigError(
        f"{name}: debounce_leading=True, debounce_trailing=False cannot be combined with "
        "task_id= or canvas (group, chord, chain): a suppressed call's id would never get "
        "a result; use debounce_trailing=True, or no fixed id"
    )


def _eager_settings(app: Celery) -> Settings:
    """The settings a call's checks read (limits, shards), for eager mode: the app's,
    but without needing a Redis URL when none is set (eager mode needs no Redis)."""
    cached: Settings | None = getattr(app, "_debounce_eager_settings", None)
    if cached is None:
        if app.conf.get("debounce_redis_url"):
            cached = settings_for(app)
        else:
            cached = Settings.from_app(app, redis_url=EAGER_URL)
        app._debounce_eager_settings = cached  # type: ignore[attr-defined, unused-ignore]
    return cached


#: Set while ``apply_async`` hands an eager call (already checked) to ``Task.apply``.
_CHECKED: ContextVar[bool] = ContextVar("debounce_eager_checked", default=False)


#: The URL eager mode's checks use when the app sets none (nothing connects to it).
EAGER_URL = "redis://eager.invalid:6379/0"


def refused_tasks(app: Celery) -> dict[str, str]:
    """Task name -> the error of each debounced task of ``app`` whose definition was
    refused (finalizes the app)."""
    return {
        name: str(task._debounce_refused)
        for name, task in sorted(app.tasks.items())
        if isinstance(task, DebouncedTask) and task._debounce_refused is not None
    }


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
