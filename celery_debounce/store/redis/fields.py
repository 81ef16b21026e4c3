"""The Redis store's window record: its hash's field names, the field tuples each script's
reply or each reader uses (docs/design.md, "Window record fields"), and
:func:`decode_record`, the one decoder into :class:`~celery_debounce.store.records.Record`.
Nothing here talks to Redis.
"""

from __future__ import annotations

from typing import Any

from ...stored_call import DEFAULT_CONTENT_TYPE, EMPTY_OPTIONS
from ..records import Record, as_text
from ..states import as_state

F_ID = "id"  # the window's Celery task id
F_IDENT = "i"  # the ident, copied in when taken
F_FIRST_SEEN = "fs"  # first call, ms
F_DEADLINE = "dl"  # deadline ms (taken windows; pending ones: the due score)
F_MAX_WAIT = "mw"  # max wait in ms (a duration, from fs)
F_CALLS = "n"  # calls absorbed
F_CONTENT_TYPE = "ct"  # payload content type; absent: DEFAULT_CONTENT_TYPE
F_PAYLOAD = "p"  # the protocol-2 body
F_OPTIONS = "o"  # stored options JSON; absent: EMPTY_OPTIONS
F_STATE = "st"  # state once taken
F_ERROR = "qe"  # quarantine reason
F_MAX_CALLS = "mc"  # debounce_max_calls of the opener
F_CAPPED = "cx"  # 1: closed by the call cap, 2: a collect window closed full
F_COLLECT_LIST = "cl"  # a collect window's list suffix (calls_key), until take.lua splices
F_COLLECT_BYTES = "cb"  # a collect window: bytes of the body its run gets
F_TRIES = "tries"  # times taken
F_FAILURES = "fl"  # publish failures counted against it (not the broker's outages)
F_LEADING = "ld"  # 1: a leading run (debounce_leading), closed by gate.lua at once
F_TRAILING = "tr"  # 1: a trailing window, opened during a quiet period

#: The quiet period's hash (:func:`quiet_key`): the leading run's id, the leading
#: call's first seen and max wait, the quiet period's end (ms), calls, mode (L or B).
QUIET_FIELDS = ("id", "fs", "mw", "dl", "n", "m")
QUIET_ID, QUIET_END = QUIET_FIELDS[0], QUIET_FIELDS[3]  # what operator views read

#: Fields an operator view reads (HMGET) from a record.
INSPECT_FIELDS = (
    F_ID,
    F_IDENT,
    F_FIRST_SEEN,
    F_DEADLINE,
    F_MAX_WAIT,
    F_CALLS,
    F_STATE,
    F_ERROR,
    F_MAX_CALLS,
    F_LEADING,
    F_TRAILING,
    F_COLLECT_BYTES,
)
#: Fields the testing helpers read from a pending record (its payload and options too).
PAYLOAD_FIELDS = (
    F_ID,
    F_FIRST_SEEN,
    F_MAX_WAIT,
    F_CALLS,
    F_CONTENT_TYPE,
    F_PAYLOAD,
    F_OPTIONS,
    F_COLLECT_LIST,
)
#: The order of each window in take.lua's reply.
TAKE_FIELDS = (
    F_ID,
    F_IDENT,
    F_FIRST_SEEN,
    F_DEADLINE,
    F_MAX_WAIT,
    F_CALLS,
    F_CONTENT_TYPE,
    F_PAYLOAD,
    F_OPTIONS,
    F_TRIES,
    F_CAPPED,
    F_LEADING,
)
#: The order of each window in list.lua's reply (after its ident).
LIST_FIELDS = (
    F_ID,
    F_FIRST_SEEN,
    F_DEADLINE,
    F_MAX_WAIT,
    F_CALLS,
    F_MAX_CALLS,
    F_TRAILING,
    F_COLLECT_BYTES,
)
#: flush.lua's reply.
FLUSH_FIELDS = (F_ID, F_FIRST_SEEN, F_DEADLINE, F_MAX_WAIT, F_CALLS)
#: cancel.lua's reply (then the aliases).
CANCEL_FIELDS = (F_ID, F_CALLS, F_FIRST_SEEN, F_DEADLINE, F_MAX_WAIT)


def _strict_int(value: Any) -> int:
    return int(value)


def _lenient_int(value: Any) -> int:
    """0 when missing or garbled (an unreadable record is still shown)."""
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 0


def decode_record(
    fields: tuple[str, ...],
    row: list[Any] | tuple[Any, ...],
    *,
    ident: str | None = None,
    deadline: Any = None,
    strict: bool = False,
) -> Record | None:
    """The one record decoder: ``row`` holds the values of ``fields`` (an HMGET or a
    script's reply in that order). None when the record has no id (gone).

    ``ident``/``deadline`` supply what a pending record keeps outside its hash (its
    due member and score). ``strict``: a missing or garbled number raises
    (TypeError/ValueError/UnicodeDecodeError: the dispatcher quarantines the record);
    otherwise it reads as 0 (operator views show such records as they are).
    """
    get = dict(zip(fields, row, strict=False)).get
    tid = get(F_ID)
    if tid is None:
        return None
    number = _strict_int if strict else _lenient_int
    raw_ident = get(F_IDENT)
    ct = get(F_CONTENT_TYPE)
    opts = get(F_OPTIONS)
    mc = get(F_MAX_CALLS)
    st = get(F_STATE)
    qe = get(F_ERROR)
    payload = get(F_PAYLOAD)
    tries = get(F_TRIES)
    return Record(
        task_id=as_text(tid),
        ident=ident
        if ident is not None
        else (as_text(raw_ident) if raw_ident is not None else None),
        first_seen_ms=number(get(F_FIRST_SEEN)),
        deadline_ms=number(deadline if deadline is not None else get(F_DEADLINE)),
        max_wait_ms=number(get(F_MAX_WAIT)),
        calls=number(get(F_CALLS)),
        state=as_state(as_text(st)) if st is not None else None,
        error=as_text(qe) if qe is not None else None,
        max_calls=_lenient_int(mc) if mc is not None else None,
        content_type=as_text(ct) if ct is not None else DEFAULT_CONTENT_TYPE,
        payload=(
            payload if isinstance(payload, bytes) or payload is None else as_text(payload).encode()
        ),
        options_json=as_text(opts) if opts is not None else EMPTY_OPTIONS,
        tries=int(tries or 1) if strict else _lenient_int(tries or 1),
        capped=get(F_CAPPED) is not None,
        leading=get(F_LEADING) is not None,
        trailing=get(F_TRAILING) is not None,
        collected_bytes=_lenient_int(cb) if (cb := get(F_COLLECT_BYTES)) is not None else None,
        collect_list=as_text(cl) if (cl := get(F_COLLECT_LIST)) is not None else None,
    )
