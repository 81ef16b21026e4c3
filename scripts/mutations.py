"""The mutations scripts/mutation_check.py applies, one at a time, to a copy of the tree.

Each is a realistic bug (usually one line) in a Lua script or a Python hot path,
the guarantee it breaks (docs/guarantees.md), and the tests that guard that
guarantee, as pytest node ids, fastest killer first (the check runs them with -x).
Every ``find`` must occur exactly once in its file: a mutation whose target is gone
fails the check, so the list cannot go stale silently. Update it with the code.

``pending`` names the branch whose tests kill a mutation that may survive until it
is merged; such a survivor still fails the check unless ``--allow-pending`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    path: str  # relative to the repository root
    find: str  # must occur exactly once
    replace: str


@dataclass(frozen=True)
class Mutation:
    name: str
    guarantee: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]
    pending: str | None = None
    notes: str = ""


def one(name: str, guarantee: str, path: str, find: str, replace: str, *tests: str,
        pending: str | None = None) -> Mutation:
    return Mutation(name, guarantee, (Edit(path, find, replace),), tests, pending)


LUA = "celery_debounce/lua/"
CAP = "tests/test_max_calls_and_steering.py::"
EDGE = "tests/test_leading_edge.py::"
PKG = "celery_debounce/"
E2E = "tests/test_end_to_end.py::"
FAULTS = "tests/test_faults.py::"
HOSTILE = "tests/test_hostile_input.py::"
ROBUST = "tests/test_robustness.py::"

MUTATIONS: list[Mutation] = [
    # -- the three that survived the whole suite in issue 14 -----------------------
    one("claim.lua re-claims a finished window",
        "inv 5: a claimed/finished window is never changed (duplicate run)",
        LUA + "claim.lua",
        "if st == 'dispatching' or st == 'queued' then",
        "if st == 'dispatching' or st == 'queued' or st == 'finished' then",
        FAULTS + "test_dispatcher_killed_after_publish_before_ack_runs_twice",
),
    one("dispatcher acks the whole taken batch",
        "no call lost: a window not published stays leased and is retried",
        PKG + "dispatcher.py",
        "self.store.ack(shard, [w.task_id for w in sent])",
        "self.store.ack(shard, [w.task_id for w in windows])",
        FAULTS + "test_a_publish_is_not_started_after_half_the_lease"),
    one("default-key digest drops keyword-only / by-name kwargs",
        "inv 1: a window per (task, key); no key = a digest of all arguments",
        PKG + "call.py",
        "return _canonical_json([list(positional), named]).encode(\"utf-8\")",
        "return _canonical_json([list(positional)]).encode(\"utf-8\")",
        E2E + "test_no_key_means_a_digest_of_the_arguments"),
    # -- invariants ----------------------------------------------------------------
    one("gate.lua never joins the open window",
        "inv 1: at most one open window per (task, key)",
        LUA + "gate.lua",
        "if found[1] then",
        "if false then",
        E2E + "test_racing_producers_in_several_processes_open_one_window"),
    one("ident without the task-name length",
        "inv 1: the ident is injective in (task, key)",
        PKG + "layout.py",
        'return f"{size}:{task_name}:"',
        'return f"{task_name}:"',
        HOSTILE + "test_task_names_with_separators_cannot_collide"),
    one("take.lua copies the open window instead of closing it",
        "inv 2: a call after the take opens a new window, never joins a taken one",
        LUA + "take.lua",
        "      if redis.call('RENAMENX', open, key) == 0 then",
        "      if redis.call('COPY', open, key) == 0 then",
        E2E + "test_claimed_window_is_never_changed_and_the_next_call_opens_a_new_one"),
    one("gate.lua: a joiner drops the ceiling",
        "inv 3: the run starts by first_seen + max_wait",
        LUA + "gate.lua",
        "deadline = math.min(deadline, tonumber(found[2]) + tonumber(found[3]))",
        "-- (ceiling dropped)",
        "tests/test_scripts.py::test_open_then_join_moves_the_deadline_never_past_the_ceiling",
        E2E + "test_max_wait_forces_a_run_under_a_never_ending_stream"),
    one("max wait shorter than the window accepted",
        "inv 3 / hostile input: the ceiling is at least the window",
        PKG + "options.py",
        "if ceiling < window:",
        "if ceiling < 0:",
        HOSTILE + "test_bad_input_raises_and_writes_nothing[max wait shorter than the window]"),
    one("take.lua: no lease on take",
        "inv 4 + crash row 1: killed between take and publish, runs once",
        LUA + "take.lua",
        "      redis.call('ZADD', KEYS[2], lease_until, id)\n      taken = taken + 1",
        "      taken = taken + 1",
        FAULTS + "test_dispatcher_killed_between_take_and_publish_the_window_runs_once"),
    one("gate.lua replaces the payload without the flag",
        "inv 5 / concepts: the opener's arguments run unless replace is set",
        LUA + "gate.lua",
        "if ARGV[4] == '1' then",
        "if true then",
        E2E + "test_burst_coalesces_into_one_run_with_the_openers_arguments"),
    one("ack.lua overwrites a claim",
        "inv 5: a claimed window is never changed",
        LUA + "ack.lua",
        "if redis.call('HGET', key, 'st') == 'dispatching' then",
        "if redis.call('HGET', key, 'st') then",
        FAULTS + "test_a_worker_claiming_before_the_lease_expires_stops_the_republish"),
    # -- crash table -----------------------------------------------------------------
    one("take.lua never retakes an expired lease",
        "crash row 2: killed after publish, before ack: published again (2 runs)",
        LUA + "take.lua",
        "elseif st == 'dispatching' then",
        "elseif st == 'retry' then",
        FAULTS + "test_dispatcher_killed_after_publish_before_ack_runs_twice"),
    one("claim.lua keeps the lease",
        "crash row 3: a claim takes the window out of the lease set",
        LUA + "claim.lua",
        "redis.call('ZREM', KEYS[2], ARGV[1])",
        "-- (lease kept)",
        FAULTS + "test_a_worker_claiming_before_the_lease_expires_stops_the_republish"),
    one("half-lease guard in seconds instead of ms",
        "crash row 4: no publish is started after half the lease",
        PKG + "dispatcher.py",
        "lease_end = took_at + self.settings.dispatch_lease_ms / 2000",
        "lease_end = took_at + self.settings.dispatch_lease_ms / 2",
        FAULTS + "test_a_publish_is_not_started_after_half_the_lease"),
    one("release.lua drops the lease instead of moving it",
        "crash row 5: a refused publish is retried, nothing dropped",
        LUA + "release.lua",
        "redis.call('ZADD', KEYS[1], 'XX', 'CH', at, id)",
        "redis.call('ZREM', KEYS[1], id)",
        "tests/test_bulk.py::test_batched_publish_to_a_dead_broker_hands_windows_back"),
    one("batch error path forgets the windows already sent",
        "crash row 5: a failed batch is released as a whole",
        PKG + "dispatcher.py",
        "                    if is_error_reply(exc):\n"
        "                        uncertain.extend(ok)\n"
        "                    else:\n"
        "                        unsent.extend(ok)\n"
        "                    ok = []\n",
        "                    pass\n",
        "tests/test_bulk.py::test_batched_publish_to_a_dead_broker_hands_windows_back"),
    one("redelivered run of a claimed window not logged",
        "crash row 6: acks_late redelivery logs 'runs again (window was claimed)'",
        PKG + "worker_signals.py",
        'if before in ("claimed", "finished") and not task.request.retries:',
        'if before == "finished" and not task.request.retries:',
        FAULTS + "test_worker_killed_mid_run_with_acks_late_is_redelivered"),
    one("no socket timeout on the package's Redis",
        "crash row 8: an unresponsive Redis is an error within the timeout, never a hang",
        PKG + "store.py",
        "socket_timeout=timeout,",
        "socket_timeout=None,",
        FAULTS + "test_an_unresponsive_redis_is_an_error_within_the_timeout"),
    one("dispatcher retries without backing off",
        "crash row 8: dispatchers back off 0.1 s doubling to 5 s",
        PKG + "dispatcher.py",
        "self._close_pubsub()\n                self._stop.wait(backoff)\n"
        "                backoff = min(backoff * 2, 5.0)",
        "self._close_pubsub()\n                self._stop.wait(backoff)\n"
        "                backoff = min(backoff, 5.0)",
        FAULTS + "test_redis_restart_with_aof_during_a_stream_of_calls"),
    one("quarantine reason lost",
        "crash row 9: quarantined with the reason, logged and in inspect",
        PKG + "dispatcher.py",
        "                window.content_type, window.payload, window.options_json,\n"
        "            )\n"
        "        except Exception as exc:\n"
        '            raise UnreadableWindow(f"{type(exc).__name__}: {exc}") from exc',
        "                window.content_type, window.payload, window.options_json,\n"
        "            )\n"
        "        except Exception as exc:\n"
        '            raise UnreadableWindow("cannot build the message") from exc',
        FAULTS + "test_corrupt_records_are_quarantined_and_do_not_block_others"),
    one("release.lua ignores whose lease it is",
        "crash row 10: a stale dispatcher's release leaves another's lease alone",
        LUA + "release.lua",
        "if rec[1] == 'dispatching' and rec[2] == ARGV[i + 1] then",
        "if rec[1] == 'dispatching' then",
        ROBUST + "test_release_leaves_a_lease_another_dispatcher_took_over"),
    one("take.lua reads leased records without pcall",
        "crash row 11: a wrong-type key does not block the shard",
        LUA + "take.lua",
        "local st = redis.pcall('HGET', key, 'st')",
        "local st = redis.call('HGET', key, 'st')",
        ROBUST + "test_wrong_type_keys_and_broken_records_do_not_block_the_shard"),
    one("malformed ident not checked at take",
        "crash row 12: a garbled record is quarantined, never blocks the shard",
        PKG + "store.py",
        "    split_ident(record.ident)  # raises on a malformed ident\n",
        "",
        FAULTS + "test_a_malformed_ident_is_quarantined[garbage]"),
    Mutation(
        "deadline from the producer's clock",
        "crash row 13: deadlines come from Redis TIME, not a skewed producer",
        (Edit(LUA + "gate.lua",
              "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)",
              "local now = tonumber(ARGV[8])"),
         Edit(PKG + "gate.py",
              '"" if call.options_json == EMPTY_OPTIONS else call.options_json,\n',
              '"" if call.options_json == EMPTY_OPTIONS else call.options_json,\n'
              '        int(__import__("time").time() * 1000),\n')),
        (FAULTS + "test_producer_clock_skew_does_not_change_deadlines",),
        notes="two edits: the producer must send its clock for the script to use it"),
    # -- issue 11: the call cap, steering by arguments --------------------------------------
    one("gate.lua never closes a window at its call cap",
        "concepts: the Nth call of a window with debounce_max_calls=N closes it, due at once",
        LUA + "gate.lua",
        "  if cap and calls >= tonumber(cap) then",
        "  if false then",
        CAP + "test_the_nth_call_closes_the_window_and_the_next_call_opens_a_new_one",
        CAP + "test_a_burst_of_25_with_max_calls_10_runs_10_10_then_5"),
    one("a leading call also opens the trailing window",
        "concepts: leading and trailing, a burst of one call runs once, not twice",
        LUA + "gate.lua",
        "    return close(id, opened, calls, 'ld')\n",
        "    close(id, opened, calls, 'ld')\n    redis.call('HSET', open, unpack(fields))\n",
        EDGE + "test_rule_6_a_burst_of_one_runs_once",
        EDGE + "test_worker_a_burst_of_one_runs_once"),
    one("gate.lua: the quiet period never slides",
        "concepts: the quiet period after a leading run slides with each call, up to "
        "the leading call's ceiling",
        LUA + "gate.lua",
        "    qend = math.min(deadline, tonumber(q[2]) + tonumber(q[3]))\n",
        "    qend = tonumber(q[4])\n",
        EDGE + "test_rule_3_the_quiet_period_slides_up_to_the_leading_calls_ceiling"),
    one("steering ignores the per-call key override",
        "operations: debounce_pending/flush/cancel resolve the key exactly as a call",
        PKG + "task.py",
        'for_call({} if key is None else {"debounce_key": key})',
        "for_call({})",
        CAP + "test_steering_resolves_the_key_exactly_as_a_call"),
    # -- records that linger ---------------------------------------------------------
    one("IGNORED is not a final state",
        "lingering: a run ending IGNORED finishes its window",
        PKG + "worker_signals.py",
        "_FINAL = frozenset(states.READY_STATES) | {states.IGNORED}",
        "_FINAL = frozenset(states.READY_STATES)",
        FAULTS + "test_an_ignored_run_finishes_its_window"),
    one("task_rejected not handled",
        "lingering: a message the worker rejects finishes its window (REJECTED)",
        PKG + "worker_signals.py",
        "task_rejected.connect(_dropped, weak=False)",
        "",
        FAULTS + "test_a_message_the_worker_rejects_finishes_its_window"),
    one("task_revoked not handled",
        "lingering: a revoked/expired message finishes its window (REVOKED)",
        PKG + "worker_signals.py",
        "task_revoked.connect(_revoked, weak=False)",
        "",
        ROBUST + "test_an_expired_message_finishes_its_window_as_revoked"),
    one("take.lua: no record TTL",
        "lingering: every taken record carries debounce_record_ttl",
        LUA + "take.lua",
        "redis.call('PEXPIRE', key, ttl)",
        "",
        FAULTS + "test_a_record_nobody_finishes_expires_after_the_record_ttl"),
    one("finish.lua: no history TTL",
        "lingering: a finished record expires after debounce_history_ttl",
        LUA + "finish.lua",
        "redis.call('PEXPIRE', KEYS[1], ARGV[3])",
        "",
        FAULTS + "test_an_ignored_run_finishes_its_window"),
    # -- issue 9 and 13 classes -----------------------------------------------------
    one("take.lua renames a window over an existing record",
        "records are never overwritten: a reused id gets a new record",
        LUA + "take.lua",
        "      if redis.call('RENAMENX', open, key) == 0 then",
        "      if redis.call('RENAME', open, key) == 0 then",
        "tests/test_scripts.py::test_a_window_taken_over_an_existing_record_gets_a_new_id"),
    one("gate.lua opens under a caller id already in use",
        "records are never overwritten: an id in use opens under a fallback id",
        LUA + "gate.lua",
        "    if redis.call('EXISTS', tag .. ':win:' .. id) == 1 or",
        "    if false and redis.call('EXISTS', tag .. ':win:' .. id) == 1 or",
        "tests/test_scripts.py::test_a_reused_caller_id_never_overwrites_a_record"),
    one("flush.lua leaves the window open to calls",
        "flush: the window is due and closed; the next call opens a new one",
        LUA + "flush.lua",
        "if redis.call('RENAMENX', KEYS[1], key) == 0 then",
        "if redis.call('COPY', KEYS[1], key) == 0 then",
        "tests/test_scripts.py::test_a_call_after_flush_opens_a_new_window_and_cannot_move_the_flushed_one"),
    one("a window failing every publish is never quarantined",
        "no window waits on another: retried a bounded number of times, then quarantined",
        PKG + "dispatcher.py",
        "MAX_TRIES = 5",
        "MAX_TRIES = 10**9",
        "tests/test_dispatch_isolation.py::"
        "test_a_window_failing_every_publish_at_the_head_of_500_does_not_hold_the_others"),
    one("a quarantined window leaves its callers waiting",
        "every id a caller holds resolves: a quarantined window fails with the reason",
        PKG + "dispatcher.py",
        "        if aliases is None:\n            return\n",
        "        return\n",
        "tests/test_dispatch_isolation.py::"
        "test_a_window_failing_every_publish_at_the_head_of_500_does_not_hold_the_others"),
    one("take.lua retried after a lost reply",
        "a lost take reply is not retried (it would lease a second batch)",
        PKG + "store.py",
        "        reply = self.run_once(\n            \"take\",",
        "        reply = self.run(\n            \"take\",",
        "tests/test_dispatch_isolation.py::"
        "test_a_lost_take_reply_is_not_retried_and_its_windows_run_after_the_lease"),
    one("aliases of a window are not resolved",
        "every id a caller holds resolves (groups, chords)",
        PKG + "worker_signals.py",
        "    if aliases:\n        resolve_aliases(",
        "    if False:\n        resolve_aliases(",
        "tests/test_ids_and_canvas.py::test_a_group_whose_members_join_one_window_completes"),
    one("a finish sent after an outage forgets the window's aliases",
        "every id a caller holds resolves, also when the finish was kept during an outage",
        PKG + "worker_signals.py",
        "then=lambda reply: _finished(app, task_id, list(reply[2:]), state, retval))",
        "then=None)",
        "tests/test_marks.py::test_aliases_of_a_finish_sent_after_an_outage_get_the_runs_result"),
    one("active ids of expired records are never pruned",
        "bounded structures: nothing but structural keys after the record TTL",
        LUA + "take.lua",
        "local PRUNE = 20",
        "local PRUNE = 0",
        FAULTS + "test_a_record_nobody_finishes_leaves_no_key_after_the_record_ttl"),
    one("a collect window appends a joining call at the front",
        "a collect window keeps every call in order (debounce_collect)",
        LUA + "gate.lua",
        "redis.call('RPUSH', tag .. ':calls:' .. found[5], element)",
        "redis.call('LPUSH', tag .. ':calls:' .. found[5], element)",
        "tests/test_collect.py::test_a_collect_window_keeps_every_call_in_order",
        "tests/test_gate_model.py::test_scripts_match_the_model_on_a_controlled_clock"),
    # -- hostile input -----------------------------------------------------------------
    one("eta accepted with debounce",
        "hostile input: countdown/eta with debounce is refused",
        PKG + "call.py",
        'for name in ("countdown", "eta"):',
        'for name in ("countdown",):',
        HOSTILE + "test_bad_input_raises_and_writes_nothing[eta with debounce]"),
    one("key length limit off by one",
        "hostile input: a key of exactly debounce_max_key_length is accepted",
        PKG + "call.py",
        "if len(key) > settings.max_key_length:",
        "if len(key) >= settings.max_key_length:",
        HOSTILE + "test_key_at_the_length_limit_is_accepted"),
    # -- RabbitMQ broker: publisher confirms ---------------------------------------
    one("a nacked publish is acked in Redis",
        "no call lost on RabbitMQ: a window is acked only once the broker confirmed it",
        PKG + "dispatcher.py",
        "            elif seq in result.nacked:\n                refused.append(window)",
        "            elif seq in result.nacked:\n                ok.append(window)",
        "tests/test_rabbitmq.py::test_a_nacked_publish_is_not_acked_and_the_window_is_retried"),
    one("an unconfirmed publish is acked in Redis",
        "no call lost on RabbitMQ: a window is acked only once the broker confirmed it",
        PKG + "dispatcher.py",
        "            else:\n                uncertain.append(window)",
        "            else:\n                ok.append(window)",
        "tests/test_rabbitmq.py::test_rabbitmq_killed_mid_batch_loses_no_window"),
    one("the confirming connection is not checked before a batch",
        "RabbitMQ restarted between batches: the next batch is published at once",
        PKG + "confirms.py",
        "if self._producer is not None and not self._alive():",
        "if self._producer is not None and not True:",
        "tests/test_rabbitmq.py::test_a_rabbitmq_restart_between_batches_costs_no_lease"),
]
