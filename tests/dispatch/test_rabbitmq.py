"""RabbitMQ as the broker: windows in Redis, messages in a real rabbitmq-server.

The node is private to the session (``rabbitmq_server`` in conftest.py,
tests/rabbitmq_node.py). Each test routes its tasks to queues of its own, so a
message left over by one test never reaches another test's worker. Results go to
the Redis result backend. Select these tests with ``-m rabbitmq``.

Here is what only an AMQP broker does (confirms, nacks, returns, priority queues,
resource alarms, a node stopped or killed) and the fault cases run on it. The
scenarios that hold on any broker are written once, with the ``broker`` fixture
(conftest.py), in tests/system/test_end_to_end.py: their ``[rabbitmq]`` cases.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import uuid
from typing import Any

import pytest
import redis
from celery import Celery
from celery.signals import before_task_publish
from fault_app import build
from helpers import debounced, make_app, running_worker, wait_until
from kombu import Exchange, Queue
from prometheus_client import CollectorRegistry
from rabbitmq_node import RabbitNode, own_queue
from reads import state_of, taken_count
from test_faults import (
    _burst_during_an_exclusive_run,
    doomed_dispatcher,
    runs,
    worker_process,
)

from celery_debounce import WindowQuarantined
from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.dispatch.publishers import AmqpPublisher, PoolPublisher
from celery_debounce.ops import metrics
from celery_debounce.ops.read_view import list_windows

pytestmark = pytest.mark.rabbitmq


def rabbit_app(redis_server: str, rabbit: RabbitNode, **conf: Any) -> Celery:
    """A make_app() app whose broker is the RabbitMQ node (windows and results in Redis)."""
    return make_app(redis_server, **{**rabbit.app_conf(), **conf})


def rabbit_fault_app(redis_server: str, rabbit: RabbitNode, **conf: Any) -> Celery:
    """tests/fault_app.py's app (runs recorded in Redis) on the RabbitMQ node."""
    return build(redis_server, **{**rabbit.app_conf(), **conf})


def queue_depth(app: Celery, queue: str) -> int:
    with app.connection_for_write() as conn:
        return int(conn.default_channel.queue_declare(queue, passive=True).message_count)


@pytest.fixture
def rabbit(rabbitmq_server: RabbitNode) -> Any:
    """The session's node; started again after a test that stopped it."""
    yield rabbitmq_server
    if not rabbitmq_server.accepts_amqp():
        rabbitmq_server.start()


def test_the_dispatcher_confirms_on_amqp_only(
    redis_server: str, redis_client: redis.Redis, rabbit: RabbitNode
) -> None:
    """On an AMQP broker the dispatcher publishes on a confirming channel of its own;
    the app's producers are left as they are. On a Redis broker nothing changes."""
    app = rabbit_app(redis_server, rabbit)
    assert isinstance(Dispatcher(app).publisher, AmqpPublisher)
    assert not app.conf.broker_transport_options.get("confirm_publish")
    assert isinstance(Dispatcher(make_app(redis_server)).publisher, PoolPublisher)


def test_a_burst_during_an_exclusive_run_gives_one_follow_up_after_it_on_rabbitmq(
    redis_server: str, redis_client: redis.Redis, rabbit: RabbitNode
) -> None:
    """``debounce_exclusive`` on RabbitMQ: the burst's window is held while the run
    lasts, published (with confirms) when it ends, and runs once, after it."""
    app = rabbit_fault_app(redis_server, rabbit)
    _burst_during_an_exclusive_run(app, app.tasks["faults.exclusive"], redis_client)


def test_openers_queue_and_priority_are_honoured_by_a_priority_queue(
    redis_server: str, redis_client: redis.Redis, rabbit: RabbitNode
) -> None:
    """The opener's routing (a queue declared with ``x-max-priority``) and priority
    travel with the window; RabbitMQ hands the worker the highest priority first."""
    qname = own_queue()
    app = rabbit_app(
        redis_server,
        rabbit,
        debounce_dispatcher=False,
        worker_prefetch_multiplier=1,
        task_queues=[
            Queue(qname, Exchange(qname), routing_key=qname, queue_arguments={"x-max-priority": 10})
        ],
    )
    order: list[tuple[str, Any, Any]] = []

    @debounced(
        app,
        bind=True,
        debounce="100ms",
        debounce_key="k:{0}",
        debounce_max_wait="1s",
    )
    def work(self: Any, key: str) -> str:
        info = self.request.delivery_info
        order.append((key, info.get("priority"), info.get("routing_key")))
        return key

    results = [work.apply_async((f"p{p}",), queue=qname, priority=p) for p in (1, 9, 5)]
    # a later call joins the window: it cannot change its queue nor its priority
    assert work.apply_async(("p1",), queue="nobody", priority=0).id == results[0].id
    wait_until(lambda: all(w.deadline <= time.time() for w in list_windows(app)), 5)
    dispatcher = Dispatcher(app, name="prio")
    published = [0]
    wait_until(
        lambda: (
            published.__setitem__(0, published[0] + dispatcher.dispatch_once()[0])
            or published[0] == 3
        ),
        10,
    )
    dispatcher.close()
    assert queue_depth(app, qname) == 3  # all three wait in the priority queue
    with running_worker(app, queues=[qname]):
        assert [r.get(timeout=15) for r in results] == ["p1", "p9", "p5"]
    assert order == [("p9", 9, qname), ("p5", 5, qname), ("p1", 1, qname)]


def test_a_killed_dispatcher_is_taken_over_on_rabbitmq(
    redis_server: str, redis_client: redis.Redis, rabbit: RabbitNode
) -> None:
    """A dispatcher SIGKILLed after taking a window: another one publishes it to
    RabbitMQ once the lease expired, and it runs once."""
    app = rabbit_fault_app(redis_server, rabbit)
    call = app.tasks["faults.record"].delay("rk")
    wait_until(lambda: list_windows(app)[0].deadline <= time.time(), 5)
    time.sleep(0.05)
    assert doomed_dispatcher(redis_server, publish=False) == [call.id]
    assert [w.state for w in list_windows(app)] == ["dispatching"]
    with running_worker(app):
        wait_until(lambda: runs(redis_client, "rk"), 15)
        wait_until(lambda: not list_windows(app), 10)
    assert runs(redis_client, "rk") == [call.id]
    # Redis only: no store read returns a window's tries
    assert redis_client.hget(f"debounce:{{0}}:win:{call.id}", "tries") == b"2"


def test_a_run_killed_on_rabbitmq_is_redelivered_at_once_skipped_then_published_again(
    redis_server: str, redis_client: redis.Redis, rabbit: RabbitNode, tmp_path: Any
) -> None:
    """acks_late on RabbitMQ: a SIGKILLed worker's message is requeued at once, while its
    claim (6 s lease here) is still live. That delivery is skipped as a duplicate (the
    body must not run beside a run that may be alive) and marked; when the claim lapses
    the dispatcher publishes the window again and it runs: at least once, never twice
    at the same time."""
    key = f"rq{uuid.uuid4().hex[:6]}"
    app = rabbit_fault_app(redis_server, rabbit)
    # Redis only: the fault app's flag, read by the worker process: the first run blocks
    redis_client.set(f"block:{key}:1", 1)  # until the worker dies
    call = app.tasks["faults.record"].delay(key)
    env = {"FAULT_CLAIM_LEASE": "6"}
    with worker_process(
        redis_server, tmp_path / "w1.log", broker_url=rabbit.url, extra_env=env
    ) as worker:
        wait_until(lambda: runs(redis_client, key) == [call.id], 20)
        worker.kill()
        worker.wait(10)
        killed = time.monotonic()
    redis_client.delete(f"block:{key}:1")  # Redis only: the fault app's flag
    log = tmp_path / "w2.log"
    with worker_process(redis_server, log, broker_url=rabbit.url, name="w2", extra_env=env):
        wait_until(lambda: "skipped: a duplicate delivery" in log.read_text(), 20)
        assert time.monotonic() - killed < 6.0  # the dead claim was still live
        assert runs(redis_client, key) == [call.id]
        wait_until(lambda: len(runs(redis_client, key)) == 2, 20)  # published again, ran
        wait_until(lambda: not list_windows(app), 10)
    assert runs(redis_client, key) == [call.id, call.id]
    assert state_of(app, call.id) == "finished"
    # Redis only: no store read returns a claim's marks
    record = redis_client.hgetall(f"debounce:{{0}}:win:{call.id}")
    assert b"rd" not in record and b"sa" in record


def test_rabbitmq_down_windows_wait_and_run_once_it_is_back(
    redis_server: str,
    redis_client: redis.Redis,
    rabbit: RabbitNode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = rabbit_fault_app(
        redis_server,
        rabbit,
        lease=5.0,
        broker_connection_timeout=1,
        broker_connection_max_retries=1,
    )
    rabbit.stop()
    ids = [app.tasks["faults.record"].delay(f"rd{i}").id for i in range(5)]
    dispatcher = Dispatcher(app, name="while-down")
    caplog.set_level(logging.WARNING, "celery_debounce.dispatcher")
    dispatcher.start()
    try:
        wait_until(lambda: "broker unavailable" in caplog.text, 15)
        time.sleep(1.5)  # a few refused rounds
        # nothing dropped, nothing acked: every window is still pending or leased
        assert sorted(w.task_id for w in list_windows(app)) == sorted(ids)
        assert {w.state for w in list_windows(app)} <= {"dispatching", "pending"}
        rabbit.start()
        with running_worker(app):
            wait_until(lambda: all(runs(redis_client, f"rd{i}") for i in range(5)), 30)
            wait_until(lambda: not list_windows(app), 10)
    finally:
        dispatcher.stop()
    assert [runs(redis_client, f"rd{i}") for i in range(5)] == [[tid] for tid in ids]


def test_a_memory_alarm_for_several_leases_quarantines_nothing(
    redis_server: str,
    redis_client: redis.Redis,
    rabbit: RabbitNode,
) -> None:
    """A RabbitMQ resource alarm blocks every publishing connection: no confirm comes for
    any message. That is the broker's fault, not any window's: for 6 leases of 1 s (more
    than ``MAX_TRIES`` attempts) nothing is counted, acked or quarantined, and once the
    alarm clears every window runs once."""
    app = rabbit_fault_app(redis_server, rabbit, debounce_dispatcher=False)
    task = app.tasks["faults.record"]
    dispatcher = Dispatcher(app, name="alarmed")
    warm = task.delay("alarm-warm")  # the confirming channel is open, the queue declared
    wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 5)
    assert rabbit.ctl("set_vm_memory_high_watermark", "0.0000001").returncode == 0
    try:
        wait_until(lambda: "Memory alarm on node" in rabbit.ctl("status").stdout, 30)
        ids = {f"al{i}": task.delay(f"al{i}").id for i in range(4)}
        dispatcher.start()
        time.sleep(6.5)  # several leases, more than MAX_TRIES attempts
        assert taken_count(app, "quarantine") == 0
        records = [f"debounce:{{0}}:win:{tid}" for tid in ids.values()]
        # Redis only: no store read returns a window's publish failures nor its tries
        assert [redis_client.hget(r, "fl") for r in records] == [None] * 4
        assert max(int(redis_client.hget(r, "tries") or 0) for r in records) >= 2
        # nothing the broker did not confirm is acked: each is leased, or not taken yet
        states = {state_of(app, tid) for tid in ids.values()}
        assert states <= {"dispatching", None}, states
    finally:
        rabbit.ctl("set_vm_memory_high_watermark", "0.4")
    try:
        with running_worker(app):
            wait_until(lambda: all(runs(redis_client, k) for k in ids), 60)
            wait_until(lambda: not list_windows(app), 20)
            time.sleep(1.5)  # a lease more: nothing runs twice
    finally:
        dispatcher.stop()
    assert {k: runs(redis_client, k) for k in ids} == {k: [tid] for k, tid in ids.items()}
    assert runs(redis_client, "alarm-warm") == [warm.id]
    assert taken_count(app, "quarantine") == 0


def test_a_nacked_publish_is_not_acked_and_the_window_is_retried(
    redis_server: str,
    redis_client: redis.Redis,
    rabbit: RabbitNode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Publisher confirms: a queue that holds 2 messages and rejects more
    (``x-max-length`` 2, ``overflow=reject-publish``) nacks 3 of 5 publishes. Only
    the 2 confirmed windows are acked (queued); the 3 nacked ones stay leased, are
    published again once the queue has room, and every window runs exactly once."""
    qname = own_queue()
    app = rabbit_fault_app(
        redis_server,
        rabbit,
        debounce_dispatcher=False,
        task_queues=[
            Queue(
                qname,
                Exchange(qname),
                routing_key=qname,
                queue_arguments={"x-max-length": 2, "x-overflow": "reject-publish"},
            )
        ],
    )
    task = app.tasks["faults.record"]
    ids = [task.apply_async((f"nk{i}",), queue=qname).id for i in range(5)]
    wait_until(lambda: all(w.deadline <= time.time() for w in list_windows(app)), 5)
    dispatcher = Dispatcher(app, name="confirming")
    caplog.set_level(logging.WARNING, "celery_debounce.dispatcher")
    registry = CollectorRegistry()
    enabled = metrics.enable(registry)
    try:
        published, _ = dispatcher.dispatch_once()
    finally:
        enabled.disable()
    assert published == 2
    assert "the broker refused (nack) 3 message(s)" in caplog.text
    # the metrics count each nack as a publish failure of kind "nack", nothing else
    assert (
        registry.get_sample_value(
            "celery_debounce_publish_failures_total", {"task": task.name, "kind": "nack"}
        )
        == 3
    )
    assert (
        registry.get_sample_value("celery_debounce_windows_dispatched_total", {"task": task.name})
        == 2
    )
    states = {w.task_id: w.state for w in list_windows(app)}
    assert sorted(states.values()) == ["dispatching"] * 3 + ["queued"] * 2
    assert queue_depth(app, qname) == 2
    dispatcher.start()  # keeps retrying the nacked ones
    try:
        with running_worker(app, queues=[qname]):
            wait_until(lambda: all(runs(redis_client, f"nk{i}") for i in range(5)), 30)
            wait_until(lambda: not list_windows(app), 15)
    finally:
        dispatcher.stop()
    assert [runs(redis_client, f"nk{i}") for i in range(5)] == [[tid] for tid in ids]


def test_an_unroutable_message_is_retried_then_quarantined_with_the_reason(
    redis_server: str,
    redis_client: redis.Redis,
    rabbit: RabbitNode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rule "every id resolves": a window routed to an exchange with a routing key no
    queue binds (``amq.direct``, a key nobody uses). RabbitMQ confirms such a message
    and drops it; the dispatcher publishes with ``mandatory`` and reads the
    ``basic.return``, so the window is not acked: it is retried, then quarantined with
    the reason, and the caller's ``.get()`` raises ``WindowQuarantined`` instead of
    waiting forever. A routable window of the same pass runs."""
    qname = own_queue()
    app = rabbit_app(
        redis_server,
        rabbit,
        debounce_dispatcher=False,
        debounce_dispatch_lease="1s",
        task_default_queue=qname,
    )
    ran: list[str] = []

    @debounced(
        app,
        debounce="100ms",
        debounce_key="{0}",
        debounce_max_wait="1s",
    )
    def task(key: str) -> str:
        ran.append(key)
        return key

    nowhere = f"nobody-{uuid.uuid4().hex[:8]}"
    lost = task.apply_async(("ur",), exchange="amq.direct", routing_key=nowhere)
    fine = task.apply_async(("ok",))
    wait_until(lambda: all(w.deadline <= time.time() for w in list_windows(app)), 5)
    caplog.set_level(logging.WARNING, "celery_debounce.dispatcher")
    dispatcher = Dispatcher(app, name="returns")
    registry = CollectorRegistry()
    enabled = metrics.enable(registry)
    assert dispatcher.dispatch_once()[0] == 1  # the routable one only
    assert f"unroutable: exchange amq.direct routing key '{nowhere}'" in caplog.text
    assert state_of(app, lost.id) == "dispatching"  # not acked: retried
    dispatcher.start()
    try:
        with pytest.raises(WindowQuarantined, match=f"unroutable: .*'{nowhere}'"):
            lost.get(timeout=30)
        with running_worker(app, queues=[qname]):
            assert fine.get(timeout=15) == "ok"
    finally:
        dispatcher.stop()
        enabled.disable()
    assert ran == ["ok"]
    assert state_of(app, lost.id) == "quarantined"

    # each returned publish is a failure of its own message; the fifth quarantines it
    def value(name: str, kind: str) -> float | None:
        return registry.get_sample_value(
            f"celery_debounce_{name}_total", {"task": task.name, "kind": kind}
        )

    assert value("publish_failures", "message") == 5
    assert value("windows_quarantined", "publish_failed") == 1


def test_a_queue_deleted_after_its_first_publish_is_declared_again_not_quarantined(
    redis_server: str,
    redis_client: redis.Redis,
    rabbit: RabbitNode,
) -> None:
    """kombu declares a routed queue once per connection. The queue is deleted after
    the dispatcher's first publish to it (an operator, ``x-expires``): the next
    window's message is returned unroutable; the dispatcher declares again on the
    retry, so the window runs (tries 2) instead of being quarantined."""
    qname = own_queue()
    app = rabbit_app(redis_server, rabbit, debounce_dispatcher=False, task_default_queue=qname)

    @debounced(
        app,
        debounce="100ms",
        debounce_key="{0}",
        debounce_max_wait="1s",
    )
    def task(key: str) -> str:
        return key

    dispatcher = Dispatcher(app, name="redeclare")
    first = task.delay("a")
    wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 5)
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(qname)
    second = task.delay("b")
    dispatcher.start()
    try:
        record = f"debounce:{{0}}:win:{second.id}"
        wait_until(lambda: state_of(app, second.id) == "queued", 10)
        # Redis only: no store read returns a window's tries
        assert redis_client.hget(record, "tries") == b"2"  # returned once, then declared
        with running_worker(app, queues=[qname]):
            assert second.get(timeout=15) == "b"
    finally:
        dispatcher.stop()
    assert first.id != second.id


def test_a_message_that_expires_in_a_rabbitmq_queue_finishes_its_window_revoked(
    redis_server: str,
    redis_client: redis.Redis,
    rabbit: RabbitNode,
) -> None:
    """Rule "every id resolves": RabbitMQ discards a message whose ``expires``
    (per-message TTL) passed in a queue no worker reads, and no worker signal fires.
    The dispatcher finishes the window as REVOKED once ``expires`` and the grace have
    passed: the window's id and a fixed-id alias raise ``TaskRevokedError``."""
    from celery.exceptions import TaskRevokedError

    qname = own_queue()
    app = rabbit_app(redis_server, rabbit, debounce_dispatcher=False, task_default_queue=qname)

    @debounced(
        app,
        debounce="100ms",
        debounce_key="{0}",
        debounce_max_wait="1s",
    )
    def task(key: str) -> str:
        return key

    first = task.apply_async(("x",), expires=1)
    alias = task.apply_async(("x",), expires=1, task_id=f"alias-{qname}")
    dispatcher = Dispatcher(app, name="expiry")
    dispatcher.start()
    try:
        record = f"debounce:{{0}}:win:{first.id}"
        wait_until(lambda: state_of(app, first.id) == "queued", 5)
        wait_until(lambda: queue_depth(app, qname) == 0, 5)  # RabbitMQ dropped it
        for result in (first, app.AsyncResult(alias.id)):
            with pytest.raises(TaskRevokedError):
                result.get(timeout=10)
    finally:
        dispatcher.stop()
    # Redis only: no store read returns a finished window's result state
    assert redis_client.hget(record, "rs") == b"REVOKED"


def test_rabbitmq_killed_mid_batch_loses_no_window(
    redis_server: str,
    redis_client: redis.Redis,
    rabbit: RabbitNode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RabbitMQ is SIGKILLed while a batch of 20 is being published. Windows whose
    messages the broker did not confirm are not acked; after the restart every
    window runs (at most twice: a message that reached the disk unconfirmed is
    delivered and, unless a worker claims it first, published again after the lease)."""
    app = rabbit_fault_app(
        redis_server,
        rabbit,
        debounce_dispatcher=False,
        lease=3.0,
        broker_connection_timeout=1,
        broker_connection_max_retries=1,
    )
    qname = app.conf.task_default_queue
    task = app.tasks["faults.record"]
    ids = [task.delay(f"mb{i}").id for i in range(20)]
    wait_until(lambda: all(w.deadline <= time.time() for w in list_windows(app)), 5)
    count = [0]

    def kill_on_the_tenth(**_: Any) -> None:
        count[0] += 1
        if count[0] == 10:
            rabbit.stop(kill=True)

    dispatcher = Dispatcher(app, name="mid-batch")
    caplog.set_level(logging.WARNING, "celery_debounce.dispatcher")
    before_task_publish.connect(kill_on_the_tenth, weak=False)
    try:
        published, _ = dispatcher.dispatch_once()
    finally:
        before_task_publish.disconnect(kill_on_the_tenth)
    assert published < 10, published  # nothing after the kill was confirmed
    states = {w.task_id: w.state for w in list_windows(app)}
    assert sorted(states) == sorted(ids)  # no window lost
    acked = [tid for tid, st in states.items() if st == "queued"]
    assert len(acked) == published
    rabbit.start()
    # what the broker confirmed it kept (persistent messages, durable queue)
    assert queue_depth(app, qname) >= len(acked)
    dispatcher.start()
    try:
        with running_worker(app):
            wait_until(lambda: all(runs(redis_client, f"mb{i}") for i in range(20)), 30)
            wait_until(lambda: not list_windows(app), 15)
    finally:
        dispatcher.stop()
    counts = [len(runs(redis_client, f"mb{i}")) for i in range(20)]
    assert all(1 <= c <= 2 for c in counts), counts


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_rabbitmq_restart_between_batches_costs_no_lease(
    redis_server: str, redis_client: redis.Redis, rabbit: RabbitNode, how: str
) -> None:
    """The dispatcher keeps its confirming connection between batches. After RabbitMQ
    restarted (stopped: it sent ``connection.close``; killed: the socket just ended),
    the next batch finds that connection closed before publishing on it (not by a
    missing confirm, which would hold its windows for a lease) and is published and
    confirmed at once on a new one."""
    app = rabbit_fault_app(redis_server, rabbit, debounce_dispatcher=False, lease=30.0)
    task = app.tasks["faults.record"]
    dispatcher = Dispatcher(app, name="kept-connection")
    try:
        task.delay("before")
        wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 5)
        rabbit.stop(kill=how == "killed")
        rabbit.start()
        after = task.delay("after").id
        wait_until(lambda: list_windows(app, states=["pending"])[0].deadline <= time.time(), 5)
        assert dispatcher.dispatch_once()[0] == 1  # the first pass after the restart
        assert {w.task_id: w.state for w in list_windows(app)}[after] == "queued"
    finally:
        dispatcher.close()


@pytest.mark.parametrize("broker", ["up", "down"])
def test_a_publish_that_failed_on_the_kept_connection_is_sent_on_a_new_one_next_pass(
    redis_server: str, rabbit: RabbitNode, broker: str
) -> None:
    """The kept confirming connection breaks under a publish (its socket shut, as when
    the broker died with our bytes unread), the broker up or down at that moment. The
    publish is not retried behind the dispatcher's back (kombu's retry would move the
    producer to a channel without confirms, or reconnect the connection under the
    channel kept on the dead socket: then every later pass failed on it); the window
    waits, and the next pass once the broker is up sends it on a new connection,
    confirmed, one message."""
    app = rabbit_fault_app(redis_server, rabbit, debounce_dispatcher=False, lease=30.0)
    qname = app.conf.task_default_queue
    task = app.tasks["faults.record"]
    dispatcher = Dispatcher(app, name="broken-send")
    assert isinstance(dispatcher.publisher, AmqpPublisher)
    confirms = dispatcher.publisher.confirms
    try:
        task.delay("before")
        wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 5)  # the connection is kept
        depth = queue_depth(app, qname)
        after = task.delay("after").id
        wait_until(lambda: list_windows(app, states=["pending"])[0].deadline <= time.time(), 5)

        def break_it(**_: Any) -> None:
            before_task_publish.disconnect(break_it)
            if broker == "down":
                rabbit.stop(kill=True)
            with contextlib.suppress(OSError):  # already reset by the kill
                confirms._channel.connection.transport.sock.shutdown(socket.SHUT_WR)

        before_task_publish.connect(break_it, weak=False)
        try:
            assert dispatcher.dispatch_once()[0] == 0
        finally:
            before_task_publish.disconnect(break_it)
        rabbit.start()
        assert {w.task_id: w.state for w in list_windows(app)}[after] != "queued"
        wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 10)
        assert {w.task_id: w.state for w in list_windows(app)}[after] == "queued"
        assert queue_depth(app, qname) == depth + 1  # one message: sent once, confirmed
    finally:
        dispatcher.close()


def test_confirm_bookkeeping_follows_amqp_numbering() -> None:
    """Single and ``multiple`` acks and nacks, as RabbitMQ sends them, sort each
    publish number (no broker needed: the channel's callbacks are called directly)."""
    from celery_debounce.dispatch.confirms import ConfirmingPublisher

    pub = ConfirmingPublisher(Celery("bookkeeping", broker="memory://", set_as_current=False))
    seqs = [pub.sent() for _ in range(8)]
    assert seqs == [1, 2, 3, 4, 5, 6, 7, 8]
    pub._on_ack(2, True)  # 1 and 2
    pub._on_nack(3, False)
    pub._on_ack(4, False)
    pub._on_nack(6, True)  # 5 and 6 (4 was acked on its own)
    pub._on_ack(7, False)
    answers = {s: pub._answer(s) for s in seqs}
    assert answers == {1: True, 2: True, 3: False, 4: True, 5: False, 6: False, 7: True, 8: None}
    result = pub.wait(seqs[:7], deadline=0)  # all of these answered: no waiting
    assert (sorted(result.acked), sorted(result.nacked)) == ([1, 2, 4, 7], [3, 5, 6])
    assert result.unconfirmed == set() and result.error is None
    late = pub.wait([8], deadline=0)  # no answer, no time left: unconfirmed
    assert late.unconfirmed == {8} and isinstance(late.error, TimeoutError)
