"""The key end-to-end tests again, with the windows on a real Redis Cluster.

The tests are functions of test_end_to_end.py (and the worker tests of the leading
edge in test_leading_edge.py), imported here: pytest runs them a
second time with this module's fixtures, which keep the windows on a 3-master,
3-replica cluster (``debounce_redis_cluster=True``, 6 shards, so every master holds
windows) while the broker and results stay on the single test redis-server (the
tests that take the ``broker`` fixture run here on that Redis broker only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import Broker, make_app
from test_end_to_end import (  # noqa: F401 - collected again here
    test_burst_coalesces_into_one_run_with_the_openers_arguments,
    test_by_name_producer_that_never_imported_the_task,
    test_calls_slide_the_deadline,
    test_claimed_window_is_never_changed_and_the_next_call_opens_a_new_one,
    test_countdown_or_eta_with_debounce_is_refused,
    test_dispatcher_can_be_switched_off_and_run_elsewhere,
    test_every_coalesced_result_gets_the_one_runs_value,
    test_fixed_window_when_max_wait_equals_window,
    test_key_placeholders_bind_to_the_signature,
    test_max_wait_forces_a_run_under_a_never_ending_stream,
    test_no_key_means_a_digest_of_the_arguments,
    test_no_keys_left_behind_after_the_history_ttl,
    test_openers_routing_priority_headers_and_expires_win,
    test_per_call_options_override_the_task_defaults,
    test_replace_payload_runs_with_the_newest_arguments,
    test_retries_never_pass_through_the_gate_again,
    test_same_key_under_two_tasks_is_two_windows,
    test_task_level_queue_is_stored_with_the_window,
    test_unresolvable_keys_raise_and_write_nothing,
)
from test_leading_edge import (  # noqa: F401 - collected again here
    test_enqueue_many_follows_the_edge_rules,
    test_worker_leading_and_trailing_burst_runs_first_then_trailing,
    test_worker_leading_only_burst_runs_once_at_once_and_suppresses_the_rest,
)

from celery_debounce.testing.redis_cluster import LocalCluster

pytestmark = pytest.mark.cluster

#: Shards on the 3-master test cluster: two per master.
CLUSTER_SHARDS = 6


def cluster_conf(cluster: LocalCluster) -> dict[str, Any]:
    return {
        "debounce_redis_url": f"{cluster.url}/0",
        "debounce_redis_cluster": True,
        "debounce_shards": CLUSTER_SHARDS,
    }


@pytest.fixture
def redis_client(redis_server: str, redis_cluster: LocalCluster) -> Iterator[redis.RedisCluster]:
    """The windows' store here: a cluster client (emptied); the broker's DBs emptied too."""
    single = redis.Redis.from_url(f"{redis_server}/0")
    single.flushall()
    single.close()
    redis_cluster.flushall()
    client = redis.RedisCluster.from_url(f"{redis_cluster.url}/0")
    yield client
    client.close()


@pytest.fixture
def app_factory(
    redis_client: redis.RedisCluster, redis_server: str, redis_cluster: LocalCluster
) -> Callable[..., Celery]:
    def factory(**conf: Any) -> Celery:
        return make_app(redis_server, **{**cluster_conf(redis_cluster), **conf})

    return factory


@pytest.fixture
def broker() -> Broker:
    """The Redis broker only: the cluster changes where the windows are, not the broker."""
    return Broker("redis")
