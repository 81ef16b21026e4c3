"""RabbitMQ quorum queues' delivery limit, as a worker sees one delivery.

A quorum queue counts the returns of each message (header ``x-delivery-count``: absent
or 0 on its first delivery, one more after each return, a requeue or a consumer that
went away)
and drops a message returned past its ``x-delivery-limit``: the delivery whose count
has reached the limit is the last one. A window's message dropped so would leave its
window queued, its ids unresolved and an exclusive key held; the worker finishes it
instead (:func:`dropped_delivery`, :class:`DeliveryLimitReached`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..errors import DebounceError

logger = logging.getLogger("celery_debounce.worker")

#: The header a quorum queue puts on each delivery: returns so far.
DELIVERY_COUNT = "x-delivery-count"
#: The queue argument that bounds it.
DELIVERY_LIMIT = "x-delivery-limit"


class DeliveryLimitReached(DebounceError):
    """The window's message went back to its queue on its last delivery (its count
    reached the quorum queue's ``x-delivery-limit``): RabbitMQ drops it, so the window
    is finished as FAILURE with this error for its ids."""


def _name(entity: Any) -> str:
    return str(getattr(entity, "name", entity) or "")


def delivery_limit(app: Any, delivery_info: Mapping[str, Any] | None) -> int | None:
    """The ``x-delivery-limit`` of the app's queues (``task_queues``) that the delivery's
    exchange and routing key reach (the least one if several); None if none sets one."""
    if not delivery_info:
        return None
    exchange = _name(delivery_info.get("exchange"))
    key = delivery_info.get("routing_key")
    limits = []
    for queue in app.amqp.queues.values():
        limit = (queue.queue_arguments or {}).get(DELIVERY_LIMIT)
        if limit is None:
            continue
        if exchange:
            reached = _name(queue.exchange) == exchange and queue.routing_key == key
        else:  # the default exchange routes by queue name
            reached = queue.name == key
        if reached:
            limits.append(int(limit))
    return min(limits) if limits else None


def dropped_delivery(app: Any, request: Any) -> DeliveryLimitReached | None:
    """The error to finish a window with if RabbitMQ drops this delivery's message when it
    goes back to its queue (its ``x-delivery-count`` has reached its queue's
    ``x-delivery-limit``), else None (a classic queue sends no count). ``request`` is the
    run's (``task.request``) or the worker's :class:`~celery.worker.request.Request`."""
    headers = getattr(request, "request_dict", None) or {}
    count = headers.get(DELIVERY_COUNT, getattr(request, DELIVERY_COUNT, None))
    if count is None:
        return None
    limit = delivery_limit(app, getattr(request, "delivery_info", None))
    if limit is None or int(count) < limit:
        return None
    return DeliveryLimitReached(
        f"its message went back to its queue on delivery {int(count) + 1}, the last one "
        f"its quorum queue allows ({DELIVERY_LIMIT} {limit}): RabbitMQ dropped it"
    )


def store_failure(
    task: Any, task_id: str, exc: DeliveryLimitReached, request: Any
) -> DeliveryLimitReached:
    """Store FAILURE (``exc``) for the window's own id, which Celery leaves unstored (it
    expects the message to run again); errbacks and a chord see it as any failure.
    Never raises (the window is finished after it); returns ``exc``."""
    logger.warning(
        "debounce: %s[%s] %s: window finished as FAILURE, with its aliases", task.name, task_id, exc
    )
    if task.ignore_result and not task.store_errors_even_if_ignored:
        return exc
    try:
        task.backend.mark_as_failure(task_id, exc, request=request)
    except Exception:
        logger.exception("debounce: could not store FAILURE for %s[%s]", task.name, task_id)
    return exc
