"""Debounce options: validated at registration, merged with per-call overrides."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..durations import parse_duration
from ..errors import DebounceConfigError
from ..settings import OUTAGE_POLICIES, check_on_outage
from ..unknown_names import PREFIX, unknown_name
from .key_templates import KeyTemplate, parse_template

__all__ = [
    "OPTION_NAMES",
    "OUTAGE_POLICIES",
    "DebounceSpec",
    "TaskDefaults",
    "build_spec",
    "check_on_outage",
]

#: The options a task or a call may set.
OPTION_NAMES = (
    "debounce",
    "debounce_key",
    "debounce_max_wait",
    "debounce_replace_payload",
    "debounce_max_calls",
    "debounce_leading",
    "debounce_trailing",
    "debounce_collect",
    "debounce_exclusive",
    "debounce_on_outage",
)

_KNOWN = frozenset(OPTION_NAMES)


def refuse_unknown_options(options: Mapping[str, Any], kind: str = "option") -> None:
    """A ``debounce_*`` name that is not an option is a typo: refused, the closest
    option named (it would otherwise be ignored, or leak into the message)."""
    for name in options:
        if name.startswith(PREFIX) and name not in _KNOWN:
            raise unknown_name(kind, name, options[name], _KNOWN)


#: ``gate.lua``'s ARGV[13] per (leading, trailing); trailing only sends nothing.
EDGE_MODES: dict[tuple[bool, bool], bytes | None] = {
    (False, True): None,
    (True, False): b"L",
    (True, True): b"B",
}


@dataclass(frozen=True)
class DebounceSpec:
    """How one call is debounced."""

    window_ms: int
    max_wait_ms: int
    key: KeyTemplate | None  # None: a digest of all the call's arguments
    replace_payload: bool
    max_calls: int | None = None  # None: no cap (gate.lua gets no extra ARGV)
    leading: bool = False
    trailing: bool = True
    collect: bool = False  # True: the run receives every call (see collect.py)
    exclusive: bool = False  # True: runs of one (task, key) never overlap (take.lua holds)
    on_outage: str | None = None  # None: the debounce_on_outage setting (outage.py)

    @cached_property
    def edge(self) -> bytes | None:
        """``gate.lua``'s ARGV[13]: None for trailing only (nothing more is sent)."""
        return EDGE_MODES[self.leading, self.trailing]


@dataclass(frozen=True)
class TaskDefaults:
    """A task's own debounce options, validated when the task class is built."""

    debounce: Any = None
    debounce_key: Any = None
    debounce_max_wait: Any = None
    debounce_replace_payload: Any = False
    debounce_max_calls: Any = None
    debounce_leading: Any = False
    debounce_trailing: Any = True
    debounce_collect: Any = False
    debounce_exclusive: Any = False
    debounce_on_outage: Any = None
    spec: DebounceSpec | None = None

    @classmethod
    def validate(cls, values: dict[str, Any]) -> TaskDefaults:
        defaults = cls(**{name: values.get(name, getattr(cls, name)) for name in OPTION_NAMES})
        if defaults.debounce_key is not None:
            parse_template(defaults.debounce_key)
        if defaults.debounce_max_wait is not None:
            parse_duration("debounce_max_wait", defaults.debounce_max_wait)
        _check_bool(defaults.debounce_replace_payload)
        check_max_calls(defaults.debounce_max_calls)
        lead, _ = check_edges(defaults.debounce_leading, defaults.debounce_trailing)
        check_collect_leading(
            check_collect(defaults.debounce_collect, defaults.debounce_replace_payload), lead
        )
        check_exclusive(defaults.debounce_exclusive, lead, defaults.debounce_max_calls)
        check_on_outage(defaults.debounce_on_outage)
        spec = None
        if defaults.debounce is not None:
            spec = build_spec(
                defaults.debounce,
                defaults.debounce_key,
                defaults.debounce_max_wait,
                defaults.debounce_replace_payload,
                defaults.debounce_max_calls,
                defaults.debounce_leading,
                defaults.debounce_trailing,
                defaults.debounce_collect,
                defaults.debounce_exclusive,
                defaults.debounce_on_outage,
            )
        return cls(
            defaults.debounce,
            defaults.debounce_key,
            defaults.debounce_max_wait,
            defaults.debounce_replace_payload,
            defaults.debounce_max_calls,
            defaults.debounce_leading,
            defaults.debounce_trailing,
            defaults.debounce_collect,
            defaults.debounce_exclusive,
            defaults.debounce_on_outage,
            spec,
        )

    def for_call(
        self,
        options: MutableMapping[str, Any],
        *,
        collect_fixed: bool = True,
    ) -> DebounceSpec | None:
        """Pop the debounce options from a call's ``options``; None: publish plainly.

        ``debounce_collect`` on a call must equal the task's own (the task function's
        shape decides it) unless ``collect_fixed`` is False: a by-name producer
        (``send_task``) of a task it does not have registered declares it per call.
        """
        if not options:
            return self.spec
        refuse_unknown_options(options)
        if not any(name in options for name in OPTION_NAMES):
            return self.spec
        debounce = options.pop("debounce", None)
        key = options.pop("debounce_key", None)
        max_wait = options.pop("debounce_max_wait", None)
        replace = options.pop("debounce_replace_payload", None)
        max_calls = options.pop("debounce_max_calls", None)
        leading = options.pop("debounce_leading", None)
        trailing = options.pop("debounce_trailing", None)
        collect = options.pop("debounce_collect", None)
        exclusive = options.pop("debounce_exclusive", None)
        on_outage = options.pop("debounce_on_outage", None)
        if collect is not None and collect_fixed and collect != self.debounce_collect:
            raise DebounceConfigError(
                f"debounce_collect={collect!r} on a call of a task with "
                f"debounce_collect={self.debounce_collect!r}: it is a task option (the task "
                "function takes either the list of calls or the call's own arguments)"
            )
        if debounce is False:
            return None
        return build_spec(
            self.debounce if debounce is None else debounce,
            self.debounce_key if key is None else key,
            self.debounce_max_wait if max_wait is None else max_wait,
            self.debounce_replace_payload if replace is None else replace,
            self.debounce_max_calls if max_calls is None else max_calls,
            self.debounce_leading if leading is None else leading,
            self.debounce_trailing if trailing is None else trailing,
            self.debounce_collect if collect is None else collect,
            self.debounce_exclusive if exclusive is None else exclusive,
            self.debounce_on_outage if on_outage is None else on_outage,
            given_on_call=True,
        )


def build_spec(
    debounce: Any,
    key: Any,
    max_wait: Any,
    replace: Any,
    max_calls: Any = None,
    leading: Any = False,
    trailing: Any = True,
    collect: Any = False,
    exclusive: Any = False,
    on_outage: Any = None,
    given_on_call: bool = False,
) -> DebounceSpec:
    """Validate one set of options; raise :class:`DebounceConfigError` naming the bad one."""
    if debounce is None:
        raise DebounceConfigError(
            "debounce=None: debounce_key/debounce_max_wait/debounce_replace_payload/"
            "debounce_max_calls/debounce_leading/debounce_trailing/debounce_collect were "
            "given on a call of a task that has no debounce window; pass debounce= too"
        )
    window = parse_duration("debounce", debounce)
    if max_wait is None:
        where = "on the call" if given_on_call else "on the task"
        raise DebounceConfigError(
            f"debounce={debounce!r} needs debounce_max_wait (none given {where}): "
            "the max wait is the ceiling that guarantees the task runs"
        )
    ceiling = parse_duration("debounce_max_wait", max_wait)
    if ceiling < window:
        raise DebounceConfigError(
            f"debounce_max_wait={max_wait!r} is shorter than debounce={debounce!r}; "
            "the max wait must be at least the window"
        )
    template = parse_template(key) if key is not None else None
    lead, trail = check_edges(leading, trailing)
    replace = _check_bool(replace)
    cap = check_max_calls(max_calls)
    return DebounceSpec(
        window,
        ceiling,
        template,
        replace,
        cap,
        lead,
        trail,
        check_collect_leading(check_collect(collect, replace), lead),
        check_exclusive(exclusive, lead, cap),
        check_on_outage(on_outage),
    )


def _check_bool(value: Any, name: str = "debounce_replace_payload") -> bool:
    if not isinstance(value, bool):
        raise DebounceConfigError(f"{name}={value!r}: expected True or False")
    return value


def check_edges(leading: Any, trailing: Any) -> tuple[bool, bool]:
    """``debounce_leading`` / ``debounce_trailing``: strict bools, not both False."""
    lead = _check_bool(leading, "debounce_leading")
    trail = _check_bool(trailing, "debounce_trailing")
    if not lead and not trail:
        raise DebounceConfigError(
            "debounce_leading=False, debounce_trailing=False: the task would never run; "
            "set at least one of them to True"
        )
    return lead, trail


#: The largest cap accepted (a window's call count is a Redis integer; far above any
#: sensible cap, it keeps the value exact in Lua's doubles).
MAX_CALLS_LIMIT = 2**31 - 1


def check_max_calls(value: Any) -> int | None:
    """``debounce_max_calls``: None (no cap) or a positive integer (not a bool)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not (1 <= value <= MAX_CALLS_LIMIT):
        raise DebounceConfigError(
            f"debounce_max_calls={value!r}: expected a positive integer (at most "
            f"{MAX_CALLS_LIMIT}) or None for no cap"
        )
    return value


def check_collect(value: Any, replace: Any = False) -> bool:
    """``debounce_collect``: True or False; it keeps every payload, so it cannot be
    combined with ``debounce_replace_payload=True`` (which keeps one)."""
    if not isinstance(value, bool):
        raise DebounceConfigError(f"debounce_collect={value!r}: expected True or False")
    if value and replace is True:
        raise DebounceConfigError(
            "debounce_collect=True with debounce_replace_payload=True: a collect window "
            "keeps every call's payload, there is none to replace"
        )
    return value


def check_exclusive(value: Any, leading: Any, max_calls: Any) -> bool:
    """``debounce_exclusive``: True or False; refused with ``debounce_leading=True``
    (a leading run is published at its first call, it cannot wait for a run) and with
    ``debounce_max_calls`` (a window closed by its cap is published at once, it can
    no longer absorb calls while it waits)."""
    exclusive = _check_bool(value, "debounce_exclusive")
    if exclusive and leading is True:
        raise DebounceConfigError(
            "debounce_exclusive=True with debounce_leading=True: a leading run is published "
            "at its first call and cannot wait for a run of its key to end; use "
            "debounce_leading=False with debounce_exclusive=True"
        )
    if exclusive and max_calls is not None:
        raise DebounceConfigError(
            f"debounce_exclusive=True with debounce_max_calls={max_calls!r}: a window closed "
            "by its call cap is published at once and cannot wait for a run of its key to "
            "end; drop debounce_max_calls (the max wait still bounds the window)"
        )
    return exclusive


def check_collect_leading(collect: bool, leading: bool) -> bool:
    """``debounce_collect=True`` is refused with ``debounce_leading=True`` (see
    docs/design.md, "Collect and the leading edge"); returns ``collect``."""
    if collect and leading:
        raise DebounceConfigError(
            "debounce_collect=True with debounce_leading=True: a collect run receives every "
            "call of a trailing window; a leading run is published at once and a leading-only "
            "quiet period suppresses calls, so not every call would reach a run. Use "
            "debounce_leading=False with debounce_collect=True"
        )
    return collect
