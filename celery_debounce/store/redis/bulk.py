"""``enqueue_many``'s wire protocol: many gate calls in pipelined MULTI/EXEC chunks."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from ...errors import DebounceBackendError, DebounceOutcomeUnknown
from ...settings import Settings
from ..chunks import chunks
from ..domain import UNKNOWN_OUTCOME, WRITTEN, Outcome
from ..records import as_text
from ..results import GateResult, Shard
from .codec import gate_args, gate_keys, parse_reply
from .fields import F_ID
from .keys import bulk_marker_prefix, open_key
from .translate import _translated, is_outage, translate_errors
from .transport import Transport, _reply_or_error, checkout, cut_runs_nothing

if TYPE_CHECKING:  # pragma: no cover
    from ...producer.call import PreparedCall


#: How long a bulk chunk's "this chunk ran" marker key lives (ms).
_MARKER_TTL_MS = 60_000


class BulkGate:
    """:meth:`gate_many`, a part of :class:`~celery_debounce.store.WindowStore`."""

    settings: Settings
    client: Any
    scripts: dict[str, Script]
    gate_prefixes: tuple[tuple[str, str], ...]
    transport: Transport
    run_gate: Callable[[list[str], list[Any]], Any]
    send_on_node: Callable[..., list[Any]]

    if TYPE_CHECKING:  # pragma: no cover

        def tag(self, shard: Shard) -> str: ...

    def _wait_command(self) -> tuple[tuple[Any, ...], ...]:
        """``WAIT n timeout`` after each bulk chunk with ``debounce_redis_wait_replicas``."""
        wanted = self.settings.wait_replicas
        return (("WAIT", wanted, self.settings.wait_replicas_ms),) if wanted else ()

    def _chunk_commands(
        self,
        sha: str,
        calls: Sequence[PreparedCall],
        chunk: Sequence[int],
        marker: str,
        waited: tuple[tuple[Any, ...], ...],
    ) -> list[tuple[Any, ...]]:
        """One bulk chunk: its gate calls and its marker in one ``MULTI``/``EXEC``, then
        the ``WAIT`` of ``debounce_redis_wait_replicas`` if set."""
        return [
            ("MULTI",),
            *(
                ("EVALSHA", sha, 2, *gate_keys(self, calls[i]), *gate_args(self, calls[i]))
                for i in chunk
            ),
            ("SET", marker, 1, "PX", _MARKER_TTL_MS),
            ("EXEC",),
            *waited,
        ]

    def _check_acks(self, acks: Any, chunk: Sequence[int], outcomes: list[Any]) -> None:
        """Fewer replicas than ``debounce_redis_wait_replicas`` acknowledged a chunk: its
        written calls may not survive a failover (retrying them may count them twice)."""
        wanted = self.settings.wait_replicas
        if isinstance(acks, Exception):  # NOPERM without +wait, ...: the chunk ran
            error = DebounceOutcomeUnknown(
                f"debounce Redis refused WAIT after this chunk was written on the master "
                f"({type(acks).__name__}: {acks}); whether its calls survive a failover "
                "is unknown"
            )
            error.__cause__ = acks
        elif int(acks) >= wanted:
            return
        else:
            error = DebounceOutcomeUnknown(
                f"debounce_redis_wait_replicas={wanted}: only {int(acks)} replica(s) "
                "acknowledged this chunk; its calls were written on the master but may not "
                "survive a failover"
            )
        for i in chunk:
            if isinstance(outcomes[i], GateResult):
                outcomes[i] = error

    def gate_many(
        self,
        calls: Sequence[PreparedCall],
        chunk_size: int = 1000,
        on_chunk: Callable[[range], None] | None = None,
        into: list[Outcome] | None = None,
    ) -> list[Outcome]:
        """Run ``gate.lua`` for each call, in order, pipelined on one connection.

        Each chunk is one ``MULTI``/``EXEC`` transaction that also sets a short-lived
        marker key, so a chunk runs entirely or not at all, and after a connection
        error the marker tells whether an unanswered chunk ran (a chunk whose write
        failed part-way did not: its ``EXEC`` never ended; with ``WAIT`` after the
        ``EXEC`` it may have, and its marker says). Chunk ``k + 1`` is
        sent before the replies of chunk ``k`` are read, so the client's work overlaps
        Redis running the scripts. NOSCRIPT replies are run again once the script is
        loaded. Returns one outcome per call: its :class:`GateResult`, :data:`WRITTEN`
        (ran, reply lost, window id not found), or the exception that kept it out.
        ``on_chunk(indexes)`` runs after each chunk's replies were read, while the next
        chunk is already on its way (``into``, if given, is the list filled in).
        """
        outcomes: list[Any] = into if into is not None else []
        outcomes[:] = [None] * len(calls)
        missing: list[int] = []
        self.transport.gate_many(self, calls, chunk_size, on_chunk, outcomes, missing)
        self._rerun_missing(calls, outcomes, missing)
        _translate_outcomes(outcomes)
        return outcomes

    def _rerun_missing(
        self,
        calls: Sequence[PreparedCall],
        outcomes: list[Any],
        missing: list[int],
    ) -> None:
        """Run again, one by one, the bulk calls that met NOSCRIPT (a restart, SCRIPT
        FLUSH, a promoted replica)."""
        if not missing:
            return
        script = self.scripts["gate"]
        try:
            with translate_errors("gate (bulk)"):
                script.sha = self.client.script_load(script.script)
                for i in missing:  # one by one: each reply is known
                    try:
                        argv: list[Any] = gate_args(self, calls[i])
                        outcomes[i] = parse_reply(self.run_gate(gate_keys(self, calls[i]), argv))
                    except DebounceOutcomeUnknown as exc:  # this one may have run
                        outcomes[i] = exc
                        raise DebounceBackendError(
                            "debounce Redis: not sent (an earlier reply was lost)"
                        ) from exc
                    except DebounceBackendError as exc:
                        if not isinstance(exc.__cause__, redis.ResponseError):
                            raise
                        outcomes[i] = exc.__cause__
        except DebounceBackendError as exc:
            for i in missing:
                if outcomes[i] is None:
                    outcomes[i] = exc

    def _gate_many_pipelined(
        self,
        calls: Sequence[PreparedCall],
        chunk_size: int,
        on_chunk: Callable[[range], None] | None,
        outcomes: list[Any],
        missing: list[int],
    ) -> None:
        """:meth:`gate_many` on one node: every chunk on one connection, chunk ``k + 1``
        sent before the replies of chunk ``k`` are read."""
        script = self.scripts["gate"]
        client = self.client
        pool = client.connection_pool
        waited = self._wait_command()
        marker_prefix = bulk_marker_prefix(self.tag(0), uuid.uuid4().hex)
        sent: list[tuple[str, range]] = []  # (marker, chunk) sent and not answered
        answered: list[str] = []  # markers of the chunks whose replies were read
        failure: BaseException | None = None
        with translate_errors("gate (bulk)"):
            if not getattr(script, "_loaded_by_bulk", False):  # spare a chunk of NOSCRIPT
                script.sha = client.script_load(script.script)
                setattr(script, "_loaded_by_bulk", True)  # noqa: B010
            conn: Any = checkout(pool)  # refused: nothing sent

        def settle_oldest() -> None:
            """Read the oldest chunk in flight's replies (and its WAIT's): answered."""
            _read_chunk(conn, sent[0][1], outcomes, missing)
            if waited:
                self._check_acks(_reply_or_error(conn), sent[0][1], outcomes)
            marker, done = sent.pop(0)
            answered.append(marker)
            if on_chunk is not None:
                on_chunk(done)

        try:
            for chunk in chunks(calls, chunk_size):
                marker = f"{marker_prefix}{chunk.start}"
                wire = self._chunk_commands(script.sha, calls, chunk, marker, waited)
                sent.append((marker, chunk))  # its marker says whether it ran
                try:
                    conn.send_packed_command(conn.pack_commands(wire))
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    if cut_runs_nothing(wire):  # cut before its EXEC's end: it did not run
                        sent.pop()
                    raise  # else (EXEC then WAIT) its EXEC may be complete: it may have run
                if len(sent) > 1:
                    settle_oldest()  # while the chunk just sent runs
            while sent:
                settle_oldest()  # the last chunk too, as the contract says
            # every reply arrived: the markers served their purpose (else they expire)
            conn.send_command("DEL", *answered)
            _reply_or_error(conn)  # refused (no +del): they expire
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            conn.disconnect()
            failure = exc
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if failure is not None:
            self._settle(calls, sent, outcomes, failure)

    def _gate_many_cluster(
        self,
        calls: Sequence[PreparedCall],
        chunk_size: int,
        on_chunk: Callable[[range], None] | None,
        outcomes: list[Any],
        missing: list[int],
    ) -> None:
        """:meth:`gate_many` on a Redis Cluster: a ``MULTI``/``EXEC`` may hold one slot
        only, so calls are grouped by shard (in order within a shard: a window's calls
        are all in one shard) and each chunk goes to its shard's master, one chunk at a
        time; the marker key carries the shard's tag."""
        script = self.scripts["gate"]
        token = uuid.uuid4().hex
        waited = self._wait_command()
        by_shard: dict[int, list[int]] = {}
        for i, call in enumerate(calls):
            by_shard.setdefault(call.shard, []).append(i)
        markers: list[str] = []
        for shard, indexes in by_shard.items():
            prefix = bulk_marker_prefix(self.tag(shard), token)
            for part in chunks([calls[i] for i in indexes], chunk_size):
                chunk = indexes[part.start : part.stop]
                marker = f"{prefix}{shard}:{part.start}"
                commands = self._chunk_commands(script.sha, calls, chunk, marker, waited)
                try:
                    with translate_errors("gate (bulk)"):
                        replies = self.send_on_node(marker, commands)
                except DebounceBackendError as exc:
                    if is_outage(exc):  # the chunk may have run: its marker says
                        self._settle(calls, [(marker, chunk)], outcomes, exc)
                    else:
                        for i in chunk:
                            outcomes[i] = exc
                    continue
                executed = replies[len(chunk) + 2]
                if isinstance(executed, Exception):  # EXECABORT: nothing of this chunk ran
                    for i in chunk:
                        outcomes[i] = executed
                    continue
                for i, reply in zip(chunk, executed, strict=False):
                    if isinstance(reply, NoScriptError):
                        missing.append(i)
                    elif isinstance(reply, Exception):
                        outcomes[i] = reply
                    else:
                        outcomes[i] = parse_reply(reply)
                if waited:
                    self._check_acks(replies[-1], chunk, outcomes)
                markers.append(marker)
                if on_chunk is not None:
                    for i in chunk:
                        on_chunk(range(i, i + 1))
        if markers:
            try:
                self.client.delete(*markers)  # split by slot by the cluster client
            except redis.RedisError:
                pass  # they expire

    def _settle(
        self,
        calls: Sequence[PreparedCall],
        unanswered: Sequence[tuple[str, Sequence[int]]],
        outcomes: list[Any],
        failure: BaseException,
    ) -> None:
        """After a connection error: find out which unanswered chunks ran (their marker
        exists)."""
        error = DebounceBackendError(f"debounce Redis unreachable during gate (bulk): {failure}")
        pending = [
            i
            for i in range(len(calls))
            if outcomes[i] is None and not any(i in chunk for _, chunk in unanswered)
        ]
        for i in pending:  # never sent
            outcomes[i] = error
        try:
            with translate_errors("gate (bulk) check"):
                with self.client.pipeline(transaction=False) as pipe:
                    for marker, _ in unanswered:
                        pipe.exists(marker)
                    ran = pipe.execute()
                for (_, chunk), did_run in zip(unanswered, ran, strict=True):
                    if not did_run:
                        for i in chunk:
                            outcomes[i] = error
                        continue
                    with self.client.pipeline(transaction=False) as pipe:
                        for i in chunk:
                            pipe.hget(open_key(self.tag(calls[i].shard), calls[i].ident), F_ID)
                        ids = pipe.execute()
                    for i, tid in zip(chunk, ids, strict=True):
                        outcomes[i] = (
                            WRITTEN if tid is None else GateResult(as_text(tid), False, 0, 0, 0)
                        )
        except DebounceBackendError:
            for _, chunk in unanswered:
                for i in chunk:
                    if outcomes[i] is None:
                        outcomes[i] = UNKNOWN_OUTCOME


def _translate_outcomes(outcomes: list[Any]) -> None:
    """Every redis-py error a bulk call met leaves as a DebounceBackendError (its cause)."""
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, redis.RedisError):
            outcomes[i] = _translated("gate (bulk)", outcome)
            outcomes[i].__cause__ = outcome


def _read_chunk(conn: Any, chunk: range, outcomes: list[Any], missing: list[int]) -> None:
    """Read one chunk's MULTI/QUEUED.../EXEC replies into ``outcomes``."""
    queue_error: redis.ResponseError | None = None
    for _ in range(len(chunk) + 2):  # MULTI's OK, then QUEUED per command (+ the marker)
        try:
            conn.read_response()
        except redis.ResponseError as exc:  # refused at queue time (OOM, ...): EXEC aborts
            queue_error = queue_error or exc
    try:
        replies = conn.read_response()
    except redis.ResponseError as exc:  # EXECABORT: nothing of this chunk ran
        for i in chunk:
            outcomes[i] = queue_error or exc
        return
    for i, reply in zip(chunk, replies, strict=False):
        if isinstance(reply, NoScriptError):
            missing.append(i)
        elif isinstance(reply, Exception):  # this script failed; the others ran
            outcomes[i] = reply
        else:
            outcomes[i] = parse_reply(reply)
