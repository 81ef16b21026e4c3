"""Redis Cluster: :class:`ClusterTransport`, the one module that knows the windows are
on a cluster (``debounce_redis_cluster``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError

from ...settings import Settings
from .tags import key_slot
from .translate import _translated
from .transport import RenewalLink, Route, Transport

if TYPE_CHECKING:  # pragma: no cover
    from ...producer.call import PreparedCall
    from .bulk import BulkGate

logger = logging.getLogger("celery_debounce.store")


class ClusterTransport(Transport):
    """A Redis Cluster client: commands go to the master of their key's slot, wake-ups
    use sharded pub/sub where every master has it (Redis >= 7).

    Sent twice: only what :meth:`run` sends (through redis-py's cluster client, which
    retries after a lost reply: scripts a repeat cannot change, and plain commands).
    :meth:`run_once` goes through :meth:`send_on_node` (and :meth:`renew` after a
    redirection), which resends only while nothing ran (MOVED, ASK, TRYAGAIN,
    CLUSTERDOWN, NOSCRIPT, a write of
    one command reset part-way); a reply lost after the write, or a failed write of
    several commands, is :class:`~celery_debounce.DebounceOutcomeUnknown`, a write of
    one command that timed out unreachable (it did not run). A flush of several windows
    flushes one by one (redis-py refuses scripts in a cluster pipeline).
    """

    direct = True

    def __init__(self, client: Any, settings: Settings) -> None:
        self.sharded_wake = _every_master_has_sharded_pubsub(client)
        super().__init__(client, settings)

    def run_once(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """A script sent at most once, to the master of its keys' slot, following
        redirections."""
        script = self.scripts[name]
        try:
            return self.send_on_node(
                keys[0], [("EVALSHA", script.sha, len(keys), *keys, *args)], name, operation=name
            )[0]
        except redis.RedisError as exc:
            raise _translated(name, exc) from exc

    def route(self, key: str) -> Redirections:
        """:meth:`send_on_node` follows this cluster's redirections."""
        return Redirections(self, key)

    def pool_for(self, key: str) -> Any:
        """The connection pool serving ``key``: the pool
        of the master that redis-py's slot table names for the key's slot."""
        client = self.client
        # redis-py's slot table read without its lock (the hot path): a dict and a list
        # read, each atomic; a stale entry is answered with MOVED, which is followed
        nodes = client.nodes_manager.slots_cache.get(key_slot(key))
        node = nodes[0] if nodes else client.nodes_manager.get_node_from_slot(key_slot(key))
        return (node.redis_connection or client.get_redis_connection(node)).connection_pool

    def refresh_topology(self) -> None:
        """Read the slot table again (after a failover or resharding)."""
        try:
            self.client.nodes_manager.initialize()
        except Exception as exc:  # no node answers: the caller's error says so
            logger.debug("debounce: cluster topology refresh failed: %r", exc)

    @property
    def master_switches(self) -> int:
        return 0  # no Sentinel on a cluster

    def servers(self) -> list[tuple[str, Any]]:
        return [
            (f"{node.host}:{node.port}", self.client.get_redis_connection(node))
            for node in self.client.get_primaries()
        ]

    def masters(self) -> list[Any]:
        return [self.client.get_redis_connection(node) for node in self.client.get_primaries()]

    def renew(self, sha: str, held: dict[str, list[str]], lease: int) -> None:
        """One write per master (redis-py's cluster pipeline refuses EVALSHA), on the
        renewer's own connection to it (:class:`RenewalLink`: a failed attempt costs one
        timeout); a redirection (the slot moved: nothing ran) is followed by
        :meth:`send_on_node`."""
        by_node: dict[str, tuple[Any, list[str]]] = {}
        for key in held:
            node = self.client.get_node_from_key(key)
            by_node.setdefault(node.name, (node, []))[1].append(key)
        links: dict[str, RenewalLink] = self.__dict__.setdefault("_renewals", {})
        for name, (node, keys) in by_node.items():
            commands = [("EVALSHA", sha, 1, key, lease, *held[key]) for key in keys]
            link = links.get(name) or links.setdefault(name, RenewalLink())
            try:
                link.send(self.client.get_redis_connection(node).connection_pool, commands)
            except (MovedError, AskError, TryAgainError, ClusterDownError):
                self.send_on_node(keys[0], commands, "renew", operation="renew")
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                self.refresh_topology()  # a failed-over master: its replica is found
                raise

    def gate_many(
        self,
        store: BulkGate,
        calls: Sequence[PreparedCall],
        chunk_size: int,
        on_chunk: Any,
        outcomes: list[Any],
        missing: list[int],
    ) -> None:
        """A ``MULTI``/``EXEC`` may hold one slot only: chunks per shard, one at a time."""
        store._gate_many_cluster(calls, chunk_size, on_chunk, outcomes, missing)


class Redirections(Route):
    """Where :meth:`ClusterTransport.send_on_node` sends one write: the master the slot
    table names for its key, or, for one write after ``ASK``, the node that asked (with
    ``ASKING`` ahead). A redirection anywhere in the replies means nothing ran (the
    command itself was refused, or, in a ``MULTI``, a queued one was and ``EXEC``
    aborted), so the write is sent again: after ``MOVED`` where the updated slot table
    says, after ``ASK`` to the node named, after ``TRYAGAIN`` or ``CLUSTERDOWN`` once
    the slot table was read again, 50 ms later, for at most ``redis_timeout_s`` in all
    (then the error is raised)."""

    def __init__(self, transport: ClusterTransport, key: str) -> None:
        super().__init__(transport, key)
        self.cluster = transport
        self.asking: tuple[str, int] | None = None
        self.deadline: float | None = None

    def pool(self) -> Any:
        if self.asking is None:
            return self.cluster.pool_for(self.key)
        client = self.cluster.client
        return client.get_redis_connection(client.get_node(*self.asking)).connection_pool

    def follow(self, error: Exception) -> bool:
        self.asking, self.ahead, self.elsewhere = None, [], False  # ASK holds for one write
        if isinstance(error, MovedError):
            manager = self.cluster.client.nodes_manager
            if hasattr(manager, "move_slot"):  # redis-py >= 6
                manager.move_slot(error)
            else:  # redis-py 5: applied by the next slot lookup
                manager.update_moved_exception(error)
            return True
        if isinstance(error, AskError):
            self.asking = (error.host, error.port)
            self.ahead, self.elsewhere = [("ASKING",)], True
            return True
        if isinstance(error, (TryAgainError, ClusterDownError)):
            if self.deadline is None:
                self.deadline = time.monotonic() + self.cluster.settings.redis_timeout_s
            if time.monotonic() >= self.deadline:
                raise error
            time.sleep(0.05)
            self.cluster.refresh_topology()
            return True
        return False


def _every_master_has_sharded_pubsub(client: Any) -> bool:
    """True when every master runs Redis >= 7.0 (SPUBLISH/SSUBSCRIBE)."""
    try:
        replies = client.info("server", target_nodes=redis.RedisCluster.PRIMARIES)
    except redis.RedisError:
        return False
    rows = (
        replies.values()
        if isinstance(replies, dict) and "redis_version" not in replies
        else [replies]
    )
    for row in rows:
        version = str(row.get("redis_version", "0")) if isinstance(row, dict) else "0"
        if int(version.split(".")[0] or 0) < 7:
            return False
    return True
