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


def one(
    name: str,
    guarantee: str,
    path: str,
    find: str,
    replace: str,
    *tests: str,
    pending: str | None = None,
) -> Mutation:
    return Mutation(name, guarantee, (Edit(path, find, replace),), tests, pending)


LUA = "celery_debounce/store/redis/lua/"
CAP = "tests/producer/test_max_calls_and_steering.py::"
EDGE = "tests/producer/test_leading_edge.py::"
PKG = "celery_debounce/"
E2E = "tests/system/test_end_to_end.py::"
FAULTS = "tests/system/test_faults.py::"
HOSTILE = "tests/producer/test_hostile_input.py::"
PARITY = "tests/producer/test_parity.py::"
ROBUST = "tests/store/redis/test_robustness.py::"
ONCE = "tests/worker/test_at_most_once.py::"
ACL = "tests/store/redis/test_tls_acl.py::"
CLOCK = "tests/dispatch/test_clock_step.py::"
PGC = "tests/store/contract/test_contract.py::"

MUTATIONS: list[Mutation] = [
    # -- the three that survived the whole suite in issue 14 -----------------------
    one(
        "claim.lua re-claims a finished window",
        "inv 5: a claimed/finished window is never changed (duplicate run)",
        LUA + "claim.lua",
        "if st == 'finished' or live then",
        "if live then",
        FAULTS + "test_dispatcher_killed_after_publish_before_ack_runs_the_body_once",
        "tests/store/test_gate_model.py::test_the_store_matches_the_model_on_a_controlled_clock",
    ),
    one(
        "dispatcher acks the whole taken batch",
        "no call lost: a window not published stays leased and is retried",
        PKG + "dispatch/outcomes.py",
        "self.store.ack(shard, [w.task_id for w in sent])",
        "self.store.ack(shard, [w.task_id for w in windows])",
        FAULTS + "test_a_publish_is_not_started_after_half_the_lease",
    ),
    one(
        "default-key digest drops keyword-only / by-name kwargs",
        "inv 1: a window per (task, key); no key = a digest of all arguments",
        PKG + "producer/call.py",
        'return _canonical_json([list(positional), named]).encode("utf-8")',
        'return _canonical_json([list(positional)]).encode("utf-8")',
        E2E + "test_no_key_means_a_digest_of_the_arguments",
    ),
    # -- invariants ----------------------------------------------------------------
    one(
        "gate.lua never joins the open window",
        "inv 1: at most one open window per (task, key)",
        LUA + "gate.lua",
        "if found[1] then",
        "if false then",
        E2E + "test_racing_producers_in_several_processes_open_one_window",
    ),
    one(
        "ident without the task-name length",
        "inv 1: the ident is injective in (task, key)",
        PKG + "store/idents.py",
        'return f"{size}:{task_name}:"',
        'return f"{task_name}:"',
        HOSTILE + "test_task_names_with_separators_cannot_collide",
    ),
    one(
        "take.lua copies the open window instead of closing it",
        "inv 2: a call after the take opens a new window, never joins a taken one",
        LUA + "take.lua",
        "      key, id = close_to_record(tag, open, id, string.format('%d', now))\n",
        "      redis.call('COPY', open, tag .. ':win:' .. id)\n      key = tag .. ':win:' .. id\n",
        E2E + "test_claimed_window_is_never_changed_and_the_next_call_opens_a_new_one[redis-redis]",
    ),
    one(
        "gate.lua: a joiner drops the ceiling",
        "inv 3: the run starts by first_seen + max_wait",
        LUA + "gate.lua",
        "deadline = math.min(deadline, tonumber(found[2]) + tonumber(found[3]))",
        "-- (ceiling dropped)",
        "tests/store/redis/test_scripts.py::test_open_then_join_moves_the_deadline_never_past_the_ceiling",
        E2E + "test_max_wait_forces_a_run_under_a_never_ending_stream[redis-redis]",
    ),
    one(
        "max wait shorter than the window accepted",
        "inv 3 / hostile input: the ceiling is at least the window",
        PKG + "producer/options.py",
        "if ceiling < window:",
        "if ceiling < 0:",
        HOSTILE
        + "test_bad_input_raises_and_writes_nothing[redis-max wait shorter than the window]",
    ),
    one(
        "take.lua: no lease on take",
        "inv 4 + crash row 1: killed between take and publish, runs once",
        LUA + "take.lua",
        "      redis.call('ZADD', KEYS[2], lease_until, id)\n      taken = taken + 1",
        "      taken = taken + 1",
        FAULTS + "test_dispatcher_killed_between_take_and_publish_the_window_runs_once",
    ),
    one(
        "gate.lua replaces the payload without the flag",
        "inv 5 / concepts: the opener's arguments run unless replace is set",
        LUA + "gate.lua",
        "if found[1] and not collect and string.sub(replace_arg, 1, 1) == '1' then",
        "if found[1] and not collect then",
        E2E + "test_burst_coalesces_into_one_run_with_the_openers_arguments[redis-redis]",
    ),
    one(
        "gate.lua takes a producer of another contract version",
        "contract: a producer of another version is refused before anything is written",
        LUA + "gate.lua",
        "if contract ~= CONTRACT then",
        "if contract == nil then",
        "tests/system/test_contract_vectors.py::"
        "test_a_producer_of_another_contract_version_is_refused_and_writes_nothing",
    ),
    one(
        "ack.lua overwrites a claim",
        "inv 5: a claimed window is never changed",
        LUA + "ack.lua",
        "if redis.call('HGET', key, 'st') == 'dispatching' then",
        "if redis.call('HGET', key, 'st') then",
        FAULTS + "test_a_worker_claiming_before_the_lease_expires_stops_the_republish",
    ),
    # -- crash table -----------------------------------------------------------------
    one(
        "take.lua never retakes an expired lease",
        "crash row 2: killed after publish, before ack: published again (the duplicate skipped)",
        LUA + "take.lua",
        "elseif st == 'dispatching' then",
        "elseif st == 'retry' then",
        FAULTS + "test_dispatcher_killed_after_publish_before_ack_runs_the_body_once",
    ),
    one(
        "claim.lua keeps the lease",
        "crash row 3: a claim takes the window out of the lease set",
        LUA + "claim.lua",
        "redis.call('ZREM', KEYS[2], ARGV[1])",
        "-- (lease kept)",
        FAULTS + "test_a_worker_claiming_before_the_lease_expires_stops_the_republish",
    ),
    one(
        "half-lease guard in seconds instead of ms",
        "crash row 4: no publish is started after half the lease",
        PKG + "dispatch/dispatcher.py",
        "lease_end = took_at + self.settings.dispatch_lease_ms / 2000",
        "lease_end = took_at + self.settings.dispatch_lease_ms / 2",
        FAULTS + "test_a_publish_is_not_started_after_half_the_lease",
    ),
    one(
        "release.lua drops the lease instead of moving it",
        "crash row 5: a refused publish is retried, nothing dropped",
        LUA + "release.lua",
        "redis.call('ZADD', KEYS[1], at, id)",
        "-- (lease dropped)",
        "tests/producer/test_bulk.py::test_batched_publish_to_a_dead_broker_hands_windows_back",
    ),
    one(
        "batch error path forgets the windows already sent",
        "crash row 5: a failed batch is released as a whole",
        PKG + "dispatch/publishers.py",
        "            out.add_all(ok, Outcome.UNCERTAIN)\n"
        "        else:  # unreachable, or the broker refused from the first command on\n"
        "            out.add_all(ok, Outcome.UNSENT)\n",
        "            pass\n",
        "tests/producer/test_bulk.py::test_batched_publish_to_a_dead_broker_hands_windows_back",
    ),
    one(
        "redelivered run of a claimed window not logged",
        "crash row 6: acks_late redelivery logs 'runs again: its previous claim went stale'",
        PKG + "worker/receivers.py",
        'elif before in ("claimed", "stale") and not retry:',
        'elif before == "finished" and not retry:',
        FAULTS + "test_worker_killed_mid_run_with_acks_late_is_redelivered",
    ),
    one(
        "no socket timeout on the package's Redis",
        "crash row 8: an unresponsive Redis is an error within the timeout, never a hang",
        PKG + "store/redis/connect.py",
        "socket_timeout=timeout,",
        "socket_timeout=None,",
        FAULTS + "test_an_unresponsive_redis_is_an_error_within_the_timeout",
    ),
    one(
        "dispatcher retries without backing off",
        "crash row 8: dispatchers back off 0.1 s doubling to 5 s",
        PKG + "dispatch/dispatcher.py",
        "self._close_pubsub()\n                self._stop.wait(backoff)\n"
        "                backoff = min(backoff * 2, 5.0)",
        "self._close_pubsub()\n                self._stop.wait(backoff)\n"
        "                backoff = min(backoff, 5.0)",
        FAULTS + "test_redis_restart_with_aof_during_a_stream_of_calls",
    ),
    one(
        "quarantine reason lost",
        "crash row 9: quarantined with the reason, logged and in inspect",
        PKG + "dispatch/publishers.py",
        '            raise UnreadableWindow(f"{type(exc).__name__}: {exc}") from exc',
        '            raise UnreadableWindow("cannot build the message") from exc',
        FAULTS + "test_corrupt_records_are_quarantined_and_do_not_block_others",
    ),
    one(
        "release.lua ignores whose lease it is",
        "crash row 10: a stale dispatcher's release leaves another's lease alone",
        LUA + "release.lua",
        "if rec[1] == 'dispatching' and rec[2] == tries and",
        "if rec[1] == 'dispatching' and",
        ROBUST + "test_release_leaves_a_lease_another_dispatcher_took_over",
    ),
    one(
        "take.lua reads leased records without pcall",
        "crash row 11: a wrong-type key does not block the shard",
        LUA + "take.lua",
        "local st = redis.pcall('HGET', key, 'st')",
        "local st = redis.call('HGET', key, 'st')",
        ROBUST + "test_wrong_type_keys_and_broken_records_do_not_block_the_shard",
    ),
    one(
        "malformed ident not checked at take",
        "crash row 12: a garbled record is quarantined, never blocks the shard",
        PKG + "store/redis/codec.py",
        "    split_ident(record.ident)  # raises on a malformed ident\n",
        "",
        FAULTS + "test_a_malformed_ident_is_quarantined[garbage]",
    ),
    Mutation(
        "deadline from the producer's clock",
        "crash row 13: deadlines come from Redis TIME, not a skewed producer",
        (
            Edit(LUA + "gate.lua", "local now = now_ms()", "local now = tonumber(ARGV[8])"),
            Edit(
                PKG + "store/redis/codec.py",
                '"" if call.options_json == EMPTY_OPTIONS else call.options_json,\n',
                '"" if call.options_json == EMPTY_OPTIONS else call.options_json,\n'
                '        int(__import__("time").time() * 1000),\n',
            ),
        ),
        (FAULTS + "test_producer_clock_skew_does_not_change_deadlines",),
        notes="two edits: the producer must send its clock for the script to use it",
    ),
    # -- issue 11: the call cap, steering by arguments --------------------------------------
    one(
        "gate.lua never closes a window at its call cap",
        "concepts: the Nth call of a window with debounce_max_calls=N closes it, due at once",
        LUA + "gate.lua",
        "  if cap and calls >= tonumber(cap) then",
        "  if false then",
        CAP + "test_the_nth_call_closes_the_window_and_the_next_call_opens_a_new_one",
        CAP + "test_a_burst_of_25_with_max_calls_10_runs_10_10_then_5",
    ),
    one(
        "a leading call also opens the trailing window",
        "concepts: leading and trailing, a burst of one call runs once, not twice",
        LUA + "gate.lua",
        "    return close(id, 1, 1, 'ld')\n",
        "    close(id, 1, 1, 'ld')\n    redis.call('HSET', open, unpack(fields))\n",
        EDGE + "test_rule_6_a_burst_of_one_runs_once",
        EDGE + "test_worker_a_burst_of_one_runs_once",
    ),
    one(
        "gate.lua: the quiet period never slides",
        "concepts: the quiet period after a leading run slides with each call, up to "
        "the leading call's ceiling",
        LUA + "gate.lua",
        "    qend = math.min(deadline, tonumber(q[2]) + tonumber(q[3]))\n",
        "    qend = tonumber(q[4])\n",
        EDGE + "test_rule_3_the_quiet_period_slides_up_to_the_leading_calls_ceiling",
    ),
    one(
        "steering ignores the per-call key override",
        "operations: debounce_pending/flush/cancel resolve the key exactly as a call",
        PKG + "producer/task.py",
        'for_call({} if key is None else {"debounce_key": key})',
        "for_call({})",
        CAP + "test_steering_resolves_the_key_exactly_as_a_call",
    ),
    # -- records that linger ---------------------------------------------------------
    one(
        "IGNORED is not a final state",
        "lingering: a run ending IGNORED finishes its window",
        PKG + "worker/receivers.py",
        "_FINAL = frozenset(states.READY_STATES) | {states.IGNORED}",
        "_FINAL = frozenset(states.READY_STATES)",
        FAULTS + "test_an_ignored_run_finishes_its_window",
    ),
    one(
        "task_rejected not handled",
        "lingering: a message the worker rejects finishes its window (REJECTED)",
        PKG + "worker/receivers.py",
        "task_rejected.connect(_dropped, weak=False)",
        "",
        FAULTS + "test_a_message_the_worker_rejects_finishes_its_window",
    ),
    one(
        "task_revoked not handled",
        "lingering: a revoked/expired message finishes its window (REVOKED)",
        PKG + "worker/receivers.py",
        "task_revoked.connect(_revoked, weak=False)",
        "",
        ROBUST + "test_an_expired_message_finishes_its_window_as_revoked",
    ),
    one(
        "take.lua: no record TTL",
        "lingering: every taken record carries debounce_record_ttl",
        LUA + "take.lua",
        "redis.call('PEXPIRE', key, ttl)",
        "",
        FAULTS + "test_a_record_nobody_finishes_expires_after_the_record_ttl",
    ),
    one(
        "finish.lua: no history TTL",
        "lingering: a finished record expires after debounce_history_ttl",
        LUA + "finish.lua",
        "redis.call('PEXPIRE', KEYS[1], ARGV[3])",
        "",
        FAULTS + "test_an_ignored_run_finishes_its_window",
    ),
    # -- issue 9 and 13 classes -----------------------------------------------------
    one(
        "lib/close_to_record.lua (take, flush, gate's cap) renames a window over an "
        "existing record",
        "records are never overwritten: a reused id gets a new record",
        LUA + "lib/close_to_record.lua",
        "  if redis.call('RENAMENX', open, key) == 0 then",
        "  if redis.call('RENAME', open, key) == 0 then",
        "tests/store/redis/test_scripts.py::test_a_window_taken_over_an_existing_record_gets_a_new_id",
    ),
    one(
        "gate.lua opens under a caller id already in use",
        "records are never overwritten: an id in use opens under a fallback id",
        LUA + "gate.lua",
        "    if redis.call('EXISTS', win_key(tag, id)) == 1 or",
        "    if false and redis.call('EXISTS', win_key(tag, id)) == 1 or",
        "tests/store/redis/test_scripts.py::test_a_reused_caller_id_never_overwrites_a_record",
    ),
    one(
        "lib/keys.lua names the exclusive run marker apart from store/redis/keys.py",
        "one owner per key name: the scripts build the keys the Python side reads",
        LUA + "lib/keys.lua",
        "  return tag .. ':run:' .. ident",
        "  return tag .. ':runs:' .. ident",
        "tests/store/redis/test_lua_library.py::test_keys_lua_builds_the_names_keys_py_builds",
    ),
    one(
        "gate.lua reads the ident of its open key one byte early",
        "one owner per key name: the due member is the ident the open key names",
        LUA + "lib/keys.lua",
        "  return string.sub(key, #tag + 7)  -- after '<tag>:open:'",
        "  return string.sub(key, #tag + 6)  -- after '<tag>:open:'",
        "tests/store/redis/test_lua_library.py::test_keys_lua_builds_the_names_keys_py_builds",
        "tests/store/redis/test_scripts.py::test_take_closes_the_window_and_the_next_call_opens_a_new_one",
    ),
    one(
        "flush.lua leaves the window open to calls",
        "flush: the window is due and closed; the next call opens a new one",
        LUA + "flush.lua",
        "key, id = close_to_record(tag, KEYS[1], id, now)\n",
        "redis.call('COPY', KEYS[1], win_key(tag, id))\nkey = win_key(tag, id)\n",
        "tests/store/redis/test_scripts.py::test_a_call_after_flush_opens_a_new_window_and_cannot_move_the_flushed_one",
    ),
    one(
        "a window failing every publish is never quarantined",
        "no window waits on another: retried a bounded number of times, then quarantined",
        PKG + "dispatch/outcomes.py",
        "MAX_TRIES = 5",
        "MAX_TRIES = 10**9",
        "tests/dispatch/test_dispatch_isolation.py::"
        "test_a_window_failing_every_publish_at_the_head_of_500_does_not_hold_the_others",
    ),
    one(
        "a quarantined window leaves its callers waiting",
        "every id a caller holds resolves: a quarantined window fails with the reason",
        PKG + "dispatch/outcomes.py",
        "        if aliases is None:\n            return\n",
        "        return\n",
        "tests/dispatch/test_dispatch_isolation.py::"
        "test_a_window_failing_every_publish_at_the_head_of_500_does_not_hold_the_others",
    ),
    one(
        "take.lua retried after a lost reply",
        "a lost take reply is not retried (it would lease a second batch)",
        PKG + "store/redis/store.py",
        '        reply = self.run_once(\n            "take",',
        '        reply = self.run(\n            "take",',
        "tests/dispatch/test_dispatch_isolation.py::"
        "test_a_lost_take_reply_is_not_retried_and_its_windows_run_after_the_lease",
    ),
    # -- issue 19: at most once (a lost reply is never acted on twice) -----------
    one(
        "a gate call is sent again after its reply was lost",
        "at most once: a script that changes windows is sent at most once per call",
        PKG + "store/redis/node.py",
        "# READONLY: it did not run; the pool finds the master\n"
        "                    raise _lost(name, exc) from exc",
        "# READONLY: it did not run; the pool finds the master\n"
        "                    return self.client.evalsha(sha, numkeys, *keys_and_args)",
        ONCE + "test_every_script_is_sent_at_most_once_under_every_fault[redis-gate-collect-drop]",
        ONCE + "test_a_lost_gate_reply_is_reported_as_unknown_and_not_sent_again",
    ),
    one(
        "claim goes through redis-py's retry",
        "at most once: claim, finish and quarantine are sent at most once per call",
        PKG + "store/redis/store.py",
        'before, _, run = self.run_once("claim",',
        'before, _, run = self.run("claim",',
        ONCE + "test_every_script_is_sent_at_most_once_under_every_fault[redis-claim-drop]",
    ),
    one(
        "cancel sent again without its per-call token",
        "at most once: a cancel whose reply was lost answers once; its result is revoked",
        PKG + "store/redis/operators.py",
        "[ident, task_id, self.settings.history_ttl_ms, token]",
        '[ident, task_id, self.settings.history_ttl_ms, ""]',
        ONCE + "test_every_script_is_sent_at_most_once_under_every_fault[redis-cancel-drop]",
    ),
    one(
        "flush_all's pipeline sent through redis-py (resent after a lost reply)",
        "at most once: flush_all flushes each window once and counts it",
        PKG + "store/redis/node.py",
        'return self.pipeline_once("flush", calls)',
        'script = self.scripts["flush"]\n'
        "        with self.client.pipeline(False) as pipe:\n"
        "            for keys, args in calls:\n"
        "                script(keys=keys, args=args, client=pipe)\n"
        "            return pipe.execute()",
        ONCE + "test_every_script_is_sent_at_most_once_under_every_fault[redis-flush-all-drop]",
    ),
    # -- every timeout where a command may have reached Redis is a lost reply ------
    one(
        "a combined write of gate calls that timed out is not caught (write timeout)",
        "at most once: a failed write of several calls makes each of them unknown",
        PKG + "store/redis/node.py",
        "except LINK_ERRORS as exc:  # a timeout too: redis-py's is no ConnectionError",
        "except (redis.ConnectionError, OSError) as exc:",
        ONCE + "test_a_combined_write_of_gate_calls_that_times_out_makes_each_of_them_unknown",
    ),
    one(
        "a gate then WAIT whose write failed is taken for not run (write timeout)",
        "at most once: a failed write of a script then WAIT is an unknown outcome",
        PKG + "store/redis/transport.py",
        "if not cut_runs_nothing(wire):  # its first commands may have run",
        "if False:",
        ONCE + "test_every_script_is_sent_at_most_once_under_every_fault"
        "[redis-gate-wait-replicas-stall-write]",
        ONCE + "test_a_gate_write_reset_part_way_did_not_run_alone_and_is_unknown_before_wait"
        "[redis-then-wait]",
    ),
    one(
        "a lone gate call whose write timed out is sent again (write timeout)",
        "a write that timed out costs one timeout: a lone call is not sent again",
        PKG + "store/redis/node.py",
        "if attempt == 2 or isinstance(exc, redis.TimeoutError):",
        "if attempt == 2:",
        ONCE + "test_every_script_is_sent_at_most_once_under_every_fault[redis-gate-stall-write]",
    ),
    one(
        "a flush pipeline whose write failed after a complete flush is taken for not run",
        "at most once: a failed write of several calls makes each of them unknown",
        PKG + "store/redis/node.py",
        "                        and cut_runs_nothing(wire)\n",
        "",
        ONCE + "test_a_flush_pipeline_whose_write_times_out_is_unknown_unless_one_call_alone"
        "[redis-after-another]",
    ),
    one(
        "a cluster call whose connect timed out is not sent to the current master "
        "(connect timeout)",
        "a connect that timed out sent nothing: the slot table is read again",
        PKG + "store/redis/transport.py",
        "                conn: Any = checkout(pool)\n            except LINK_ERRORS as exc:",
        "                conn: Any = checkout(pool)\n"
        "            except (redis.ConnectionError, OSError) as exc:",
        "tests/producer/test_send_paths.py::"
        "test_a_cluster_call_whose_master_times_out_on_connect_finds_the_current_master",
    ),
    one(
        "a cluster call redirected by ASK is sent to the importing node without ASKING",
        "a call for a migrating slot follows ASK: written once on the node that holds it",
        PKG + "store/redis/cluster.py",
        '            self.ahead, self.elsewhere = [("ASKING",)], True',
        "            self.ahead, self.elsewhere = [], True",
        "tests/system/test_hostile_dist.py::"
        "test_a_call_for_a_migrating_slot_follows_ask_as_the_acl_user",
    ),
    one(
        "a cluster script goes through the cluster client's retry",
        "inv 13 on a cluster: a script whose reply was lost is unknown, never sent again",
        PKG + "store/redis/cluster.py",
        "            return self.send_on_node(\n"
        '                keys[0], [("EVALSHA", script.sha, len(keys), *keys, *args)], name, '
        "operation=name\n"
        "            )[0]",
        "            return self.run(name, keys, args)",
        ONCE + "test_a_cluster_node_that_loses_a_reply_or_stops_reading_gets_each_gate_sent_once"
        "[redis-gate-drop]",
    ),
    one(
        "a lone cluster call whose write timed out is sent again (write timeout)",
        "a write that timed out on a cluster node costs one timeout: a lone call is not resent",
        PKG + "store/redis/transport.py",
        "                    if attempt >= 2 or isinstance(exc, redis.TimeoutError):\n",
        "                    if attempt >= 2:\n",
        ONCE + "test_a_cluster_node_that_loses_a_reply_or_stops_reading_gets_each_gate_sent_once"
        "[redis-gate-stall-write]",
    ),
    # -- issue 19: the documented ACL line is complete -----------------------------
    one(
        "the documented ACL line lacks +wait",
        "ACL: the documented least-privilege line runs every feature",
        "docs/guarantees.md",
        "+multi +exec +set +wait +publish",
        "+multi +exec +set +publish",
        ACL + "test_the_documented_acl_line_is_the_one_tested",
    ),
    one(
        "the documented cluster ACL additions lack +asking",
        "ACL: the documented cluster additions follow a migrating slot's ASK",
        "docs/guarantees.md",
        "+cluster|slots +command +info\n  +asking +spublish",
        "+cluster|slots +command +info\n  +spublish",
        "tests/system/test_hostile_dist.py::test_the_documented_cluster_acl_additions_are_the_ones_tested",
    ),
    one(
        "a bulk call's redis-py error reaches the caller raw",
        "ACL: every raw redis-py exception reaches the caller as a DebounceError",
        PKG + "store/redis/bulk.py",
        "        self._rerun_missing(calls, outcomes, missing)\n"
        "        _translate_outcomes(outcomes)\n"
        "        return outcomes\n\n    def _rerun_missing(",
        "        self._rerun_missing(calls, outcomes, missing)\n"
        "        return outcomes\n\n    def _rerun_missing(",
        ACL + "test_a_command_the_user_lacks_reaches_the_caller_as_a_debounce_error[+set]",
    ),
    one(
        "aliases of a window are not resolved",
        "every id a caller holds resolves (groups, chords)",
        PKG + "worker/receivers.py",
        "    if aliases:\n        resolve_aliases(",
        "    if False:\n        resolve_aliases(",
        "tests/producer/test_ids_and_canvas.py::test_a_group_whose_members_join_one_window_completes",
    ),
    one(
        "a finish sent after an outage forgets the window's aliases",
        "every id a caller holds resolves, also when the finish was kept during an outage",
        PKG + "worker/receivers.py",
        "then=lambda done: _finished(app, task_id, done, state, retval))",
        "then=None)",
        "tests/worker/test_marks.py::test_aliases_of_a_finish_sent_after_an_outage_get_the_runs_result[redis]",
    ),
    one(
        "active ids of expired records are never pruned",
        "bounded structures: nothing but structural keys after the record TTL",
        LUA + "take.lua",
        "local PRUNE = 20",
        "local PRUNE = 0",
        FAULTS + "test_a_record_nobody_finishes_leaves_no_key_after_the_record_ttl",
    ),
    # -- issue 19: the opener's options, every id resolves, no secret ---------------------
    one(
        "a replacing join stores the joiner's whole body",
        "the opener's options are the window's: a joiner replaces the arguments only",
        LUA + "gate.lua",
        "    return string.sub(data, 1, mine - 1) .. string.sub(held[3], theirs)",
        "    return data",
        "tests/producer/test_window_options.py::"
        "test_the_spliced_body_is_the_joiners_arguments_and_the_openers_embed",
        "tests/producer/test_window_options.py::"
        "test_a_replacing_joiner_replaces_the_arguments_not_the_openers_link",
    ),
    one(
        "a replacing join of another serializer is taken",
        "the opener's options are the window's: its content type is the opener's",
        LUA + "gate.lua",
        "  if window_ct ~= ct then",
        "  if false then",
        "tests/producer/test_window_options.py::"
        "test_a_joiner_of_another_serializer_is_refused_and_writes_nothing",
    ),
    one(
        "a replacing join of another embed replaces a pickle body",
        "the opener's options are the window's: a body Lua cannot read keeps its embed",
        LUA + "gate.lua",
        "  if held[2] == false or held[2] == embed then",
        "  if true then",
        "tests/producer/test_window_options.py::"
        "test_a_pickle_window_keeps_its_embed_or_refuses_a_joiner_that_would_change_it",
    ),
    one(
        "self.replace() forwards nothing to the aliases",
        "every id resolves: a window whose run replaces itself resolves every alias",
        PKG + "producer/task.py",
        "            forward_replacement(self, sig)",
        "            pass",
        "tests/producer/test_replace.py::test_a_group_whose_members_join_a_replaced_window_completes",
        "tests/producer/test_replace.py::test_a_failed_replacement_fails_every_alias",
    ),
    one(
        "a leading-only quiet period outlasts result_expires",
        "every id resolves: a suppressed call's id names a result still stored",
        PKG + "store/redis/codec.py",
        'if call.spec.edge == b"L" and expires is not None and expires < call.spec.max_wait_ms:',
        "if False:",
        "tests/producer/test_quiet_period_ids.py::"
        "test_a_suppressed_call_never_gets_the_id_of_an_expired_result",
    ),
    one(
        "redact keeps a password that holds ';' or '/'",
        "no secret in any error or log: a URL's user info is hidden up to its last '@'",
        PKG + "redact.py",
        '        at = segment.rfind("@")',
        '        at = min((segment.find(c) for c in "@;/" if c in segment), default=-1)',
        "tests/store/test_secrets.py::test_redact_hides_every_password_whole",
        "tests/store/test_secrets.py::test_no_password_in_any_error_or_log",
    ),
    one(
        "the non-Redis broker URL is shown as it is",
        "no secret in any error or log: the broker URL the windows would fall back to",
        PKG + "settings.py",
        "redact(\n"
        '            f"debounce_redis_url is not set and the broker URL ({broker!r}) is not '
        'a Redis URL: "',
        "str(\n"
        '            f"debounce_redis_url is not set and the broker URL ({broker!r}) is not '
        'a Redis URL: "',
        "tests/store/test_secrets.py::test_no_password_in_any_error_or_log",
    ),
    one(
        "redis-py's URL error is shown",
        "no secret in any error or log: a URL redis-py cannot read",
        PKG + "store/redis/connect.py",
        "        return redis.Redis.from_url(settings.redis_url, **options)\n"
        "    except ValueError:\n"
        "        raise _unreadable_url(settings.redis_url) from None",
        "        return redis.Redis.from_url(settings.redis_url, **options)\n"
        "    except ValueError:\n"
        "        raise",
        "tests/store/test_secrets.py::test_no_password_in_any_error_or_log",
    ),
    one(
        "clear_windows matches <prefix>:*",
        "clear_windows deletes this app's keys only (a prefix another's starts with)",
        PKG + "store/redis/keys.py",
        '    return f"{escaped}:{{*"',
        '    return f"{escaped}:*"',
        "tests/ops/test_clear_windows.py::test_clear_windows_deletes_this_apps_keys_only",
    ),
    one(
        "clear_windows leaves glob characters in the prefix",
        "clear_windows deletes this app's keys only (a prefix with glob characters)",
        PKG + "store/redis/keys.py",
        '    escaped = "".join("\\\\" + c if c in "*?[]\\\\" else c for c in prefix)',
        "    escaped = prefix",
        "tests/ops/test_clear_windows.py::test_clear_windows_deletes_this_apps_keys_only",
    ),
    one(
        "Reject(requeue=False) is not final",
        "every id resolves: a run that rejects its message for good finishes its window",
        PKG + "worker/receivers.py",
        "    if state == states.REJECTED and shard is not None and "
        "_rejected_for_good(task, retval):",
        "    if False:",
        "tests/worker/test_reject.py::"
        "test_reject_without_requeue_finishes_the_window_and_fails_every_alias[redis]",
    ),
    one(
        "a requeued Reject finishes the window",
        "every id resolves to the run that follows a requeue, not to the Reject",
        PKG + "worker/receivers.py",
        '    return not (getattr(retval, "requeue", False) and task.acks_late)',
        "    return True",
        "tests/worker/test_reject.py::test_reject_with_requeue_waits_for_the_run_that_follows[redis]",
    ),
    # -- Sentinel ----------------------------------------------------------------------
    one(
        "no +switch-master watcher: pools stay on the old master until its demotion",
        "failover (Sentinel): calls accepted after the switch go to the new master",
        PKG + "store/redis/sentinel.py",
        "    SwitchWatcher(config, sentinel_kwargs, pool).start()",
        "    pass",
        "tests/store/redis/test_sentinel.py::"
        "test_calls_resume_after_a_failover_and_what_is_lost_is_measured[failover]",
    ),
    one(
        "the dispatcher's wake subscription stays on the old master",
        "failover (Sentinel): the dispatcher is woken by calls on the new master",
        PKG + "store/redis/wake.py",
        "if self.store.master_switches != switches:",
        "if False:",
        "tests/store/redis/test_sentinel.py::test_the_dispatchers_wake_subscription_follows_the_new_master",
    ),
    Mutation(
        "a dispatcher stops at its first Redis error",
        "failover (Sentinel, primary killed): the dispatcher outlives the dead master and "
        "dispatches the calls the new one accepts",
        (
            Edit(
                PKG + "dispatch/dispatcher.py",
                "                self.store.refresh_topology()  "
                "# a cluster's failover or resharding\n",
                "                break\n",
            ),
        ),
        (
            "tests/store/redis/test_sentinel.py::"
            "test_calls_resume_after_a_failover_and_what_is_lost_is_measured[kill]",
        ),
        notes="a product-side mutation: the harness race put back (down-after 1000 ms, "
        "the old primary restarted empty as a master) survived the test in 6 of 6 runs "
        "(its double failover came in 3 of 136 runs)",
    ),
    one(
        "a collect window appends a joining call at the front",
        "a collect window keeps every call in order (debounce_collect)",
        LUA + "gate.lua",
        "redis.call('RPUSH', calls_key(tag, found[5]), element)",
        "redis.call('LPUSH', calls_key(tag, found[5]), element)",
        "tests/producer/test_collect.py::test_a_collect_window_keeps_every_call_in_order",
        "tests/store/test_gate_model.py::test_the_store_matches_the_model_on_a_controlled_clock",
    ),
    one(
        "debounce_collect accepted with debounce_leading",
        "refused at call time: debounce_collect=True with debounce_leading=True",
        PKG + "producer/options.py",
        "    if collect and leading:\n",
        "    if False:\n",
        "tests/producer/test_collect.py::test_collect_refused_with_leading",
    ),
    one(
        "'' in ARGV[15] taken as a collect call",
        "a call sends only the ARGV it uses; '' means not given (gate.lua header)",
        LUA + "gate.lua",
        "local collect = budget ~= nil and budget ~= ''",
        "local collect = budget ~= nil",
        "tests/producer/test_collect.py::test_blank_edge_and_collect_argv_mean_not_given",
    ),
    one(
        "'' in ARGV[13] taken as an edge call",
        "a call sends only the ARGV it uses; '' means not given (gate.lua header)",
        LUA + "gate.lua",
        "if edge and edge ~= '' then",
        "if edge then",
        "tests/producer/test_collect.py::test_blank_edge_and_collect_argv_mean_not_given",
    ),
    # -- hostile input -----------------------------------------------------------------
    one(
        "eta accepted with debounce",
        "hostile input: countdown/eta with debounce is refused",
        PKG + "producer/call.py",
        'for name in ("countdown", "eta"):',
        'for name in ("countdown",):',
        HOSTILE + "test_bad_input_raises_and_writes_nothing[redis-eta with debounce]",
    ),
    one(
        "key length limit off by one",
        "hostile input: a key of exactly debounce_max_key_length is accepted",
        PKG + "producer/call.py",
        "if len(key) > settings.max_key_length:",
        "if len(key) >= settings.max_key_length:",
        HOSTILE + "test_key_at_the_length_limit_is_accepted",
    ),
    # -- parity everywhere (issue 19, items 10 and 11) ---------------------------------
    one(
        "a chain's later steps are not checked when the chain is applied",
        "parity: a deferred canvas position is refused at call time, not in the worker",
        PKG + "producer/canvas.py",
        "    if chain:\n        for step in chain:",
        "    if False:\n        for step in chain:",
        PARITY + "test_a_deferred_canvas_position_is_refused_when_the_canvas_is_applied"
        "[chain tail after a plain head]",
    ),
    one(
        "eager calls skip the call-time checks",
        "parity: eager mode refuses what a real call refuses",
        PKG + "producer/task.py",
        "            if spec is not None:  # eager: every check of a real call, nothing written",
        "            if False:  # eager: every check of a real call, nothing written",
        PARITY + "test_eager_mode_refuses_what_a_real_call_refuses_and_needs_no_redis",
    ),
    one(
        "eager canvas members are not checked",
        "parity: eager mode refuses what a real call refuses (canvas members too)",
        PKG + "producer/task.py",
        "self.app.conf.task_always_eager",
        "False",
        PARITY + "test_eager_canvas_members_are_checked_as_calls",
    ),
    one(
        "an eager chain or chord is not checked before its steps run",
        "parity: eager mode refuses what a real call refuses (a chain's steps and a "
        "chord's body, whose ids a real run fixes)",
        PKG + "producer/canvas.py",
        '        check_eager(self, options.get("body"))',
        "        pass",
        PARITY + "test_eager_canvas_members_are_checked_as_calls",
        PARITY + "test_every_way_in_works_or_is_refused_at_call_time"
        "[eager-function-leading only-no option-chain tail]",
    ),
    one(
        "debounce_collect wraps only a run defined on the class itself",
        "parity: debounce_collect wraps run for every task shape",
        PKG + "producer/task_definition.py",
        "    run = _find_run(cls)  # its own, or inherited",
        '    run = cls.__dict__.get("run")  # its own, or inherited',
        PARITY + "test_debounce_collect_wraps_run_for_every_task_shape[subclass inheriting run]",
    ),
    one(
        "celery.map of a debounced task is published",
        "parity: map/starmap/chunks of a task with a window are refused at call time",
        PKG + "producer/canvas.py",
        "    if name in INLINE_TASKS and inner_raw is not None:",
        "    if False:",
        PARITY + "test_map_starmap_chunks_of_a_debounced_task_are_refused_at_call_time",
    ),
    one(
        "a misspelt call option is ignored",
        "parity: unknown debounce_* names are refused, per call",
        PKG + "producer/options.py",
        "        refuse_unknown_options(options)\n",
        "",
        PARITY + "test_an_unknown_call_option_is_refused_and_nothing_is_written",
    ),
    one(
        "a misspelt task option is ignored",
        "parity: unknown debounce_* names are refused, at registration",
        PKG + "producer/task.py",
        "            refuse_unknown_class_options(cls)\n",
        "",
        PARITY + "test_an_unknown_task_option_is_refused_at_registration",
    ),
    one(
        "a misspelt setting is ignored",
        "parity: unknown debounce_* names are refused, at settings load",
        PKG + "settings.py",
        "        refuse_unknown_settings(conf, app.namespace, DEFAULTS)\n",
        "",
        PARITY + "test_an_unknown_setting_is_refused_at_settings_load",
    ),
    one(
        "enqueue_many reports a suppressed call as absorbed",
        "parity: enqueue_many sends the signals a single call sends (as stats counts)",
        PKG + "producer/many.py",
        "                announce(call, outcome)",
        '                announce(call, outcome._replace(edge=""))',
        PARITY + "test_enqueue_many_sends_the_signals_a_single_call_sends",
    ),
    one(
        "a collect window's calls reach a plain worker's task raw",
        "parity: a rolling deploy that toggles debounce_collect runs each window in the "
        "worker's shape",
        PKG + "worker/receivers.py",
        "    task_prerun.connect(_reshape, weak=False)\n",
        "",
        PARITY + "test_a_rolling_deploy_that_toggles_debounce_collect_runs_each_window_in_the_"
        "workers_shape[collect off]",
    ),
    one(
        "a collect task's run refuses a plain call's arguments in the worker",
        "parity: a rolling deploy that toggles debounce_collect runs each window in the "
        "worker's shape",
        PKG + "producer/collect.py",
        "        except TypeError:\n            if not _in_worker():\n                raise",
        "        except TypeError:\n            raise",
        PARITY + "test_a_rolling_deploy_that_toggles_debounce_collect_runs_each_window_in_the_"
        "workers_shape[collect on]",
    ),
    # -- issue 19: a shared fault is an outage; maxmemory on the windows' Redis --------
    one(
        "a broker's error reply about itself (OOM, READONLY) counts against the window",
        "a shared fault is an outage: never counted, nothing quarantined",
        PKG + "dispatch/publishers.py",
        "        if code in BROKER_WIDE_CODES:\n            return BROKER",
        "        if code in ():\n            return BROKER",
        "tests/store/redis/test_maxmemory.py::test_a_broker_refusing_every_message_for_several_leases_"
        "quarantines_nothing[readonly]",
    ),
    one(
        "a broker-wide code less rare than OOM (MISCONF) is taken for the message's own",
        "a shared fault is an outage: every broker-wide error reply, never counted",
        PKG + "dispatch/publishers.py",
        '    "MISCONF",  # stop-writes-on-bgsave-error: its last save failed',
        "    # MISCONF forgotten",
        "tests/store/redis/test_maxmemory.py::test_every_broker_wide_error_reply_counts_against_no_window"
        "[MISCONF]",
    ),
    one(
        "an unconfirmed publish (a RabbitMQ resource alarm blocks the connection) counts "
        "against the window",
        "a shared fault is an outage: an AMQP resource alarm is never counted",
        PKG + "dispatch/publishers.py",
        "out.add(window, Outcome.UNCERTAIN)",
        'out.add(window, Outcome.FAILED, "unconfirmed")',
        "tests/dispatch/test_rabbitmq.py::test_a_memory_alarm_for_several_leases_quarantines_nothing",
    ),
    one(
        "a key-dependent refusal (NOPERM) counts without another window published",
        "a shared fault is an outage: only an error shown to be one message's counts",
        PKG + "dispatch/outcomes.py",
        "            if sent:  # the broker took another window of this pass: these are their own",
        "            if True:  # the broker took another window of this pass: these are their own",
        "tests/store/redis/test_maxmemory.py::test_a_refused_key_counts_against_a_window_only_when_another_"
        "was_published[every queue]",
    ),
    one(
        "quarantine counts the takes a broker outage wasted (tries, not fl)",
        "a shared fault is an outage: never counted against a window",
        PKG + "dispatch/outcomes.py",
        "                if window.failures + 1 >= MAX_TRIES:",
        "                if max(window.failures + 1, window.tries) >= MAX_TRIES:",
        "tests/store/redis/test_maxmemory.py::test_takes_an_outage_wasted_never_count_toward_quarantine",
    ),
    one(
        "take.lua retakes a lease with a write that may grow memory first",
        "maxmemory on the windows' Redis: the dispatcher keeps taking what is due",
        LUA + "take.lua",
        "    redis.call('ZREM', KEYS[2], id)\n    redis.call('ZADD', KEYS[2], lease_until, id)",
        "    redis.call('ZADD', KEYS[2], lease_until, id)",
        "tests/store/redis/test_maxmemory.py::test_the_windows_redis_at_maxmemory_refuses_new_calls_and_"
        "keeps_dispatching",
    ),
    one(
        "release.lua moves a lease with ZADD XX (a write that may grow memory) first",
        "maxmemory on the windows' Redis: a failed publish is handed back",
        LUA + "release.lua",
        "      redis.call('ZREM', KEYS[1], id) == 1 then",
        "      redis.call('ZADD', KEYS[1], 'XX', 'CH', at, id) >= 0 then",
        "tests/store/redis/test_maxmemory.py::test_release_goes_through_on_a_windows_redis_at_maxmemory",
    ),
    one(
        "a half-failed batch is read as kombu raises it, not reply by reply",
        "a window runs once: a batch's messages that reached the broker are never sent again",
        PKG + "dispatch/publishers.py",
        "exact = _ExactBatch(producer) if batched else None",
        "exact = None",
        "tests/dispatch/test_dispatch_isolation.py::test_a_half_failed_batch_is_not_sent_again_while_"
        "the_queue_wait_exceeds_the_lease",
    ),
    one(
        "a batch reply that refused a message's first command is read as delivered",
        "no call lost: a window is acked only once the broker took its message",
        PKG + "dispatch/publishers.py",
        "            if not isinstance(first, Exception):\n                continue",
        "            if True:\n                continue",
        "tests/dispatch/test_dispatch_isolation.py::test_a_half_failed_batch_is_not_sent_again_while_"
        "the_queue_wait_exceeds_the_lease",
    ),
    one(
        "the back-off after a shared fault has no jitter",
        "a shared fault is an outage: dispatchers back off with jitter, not in step",
        PKG + "dispatch/dispatcher.py",
        "self._fault_delay = base * random.uniform(0.5, 1.0)  # jitter",
        "self._fault_delay = base",
        "tests/store/redis/test_maxmemory.py::test_the_back_off_after_a_shared_fault_grows_and_is_jittered",
    ),
    # -- RabbitMQ broker: publisher confirms ---------------------------------------
    one(
        "a nacked publish is acked in Redis",
        "no call lost on RabbitMQ: a window is acked only once the broker confirmed it",
        PKG + "dispatch/publishers.py",
        "            elif seq in result.nacked:\n                out.add(window, Outcome.REFUSED)",
        "            elif seq in result.nacked:\n                ok.append(window)",
        "tests/dispatch/test_rabbitmq.py::test_a_nacked_publish_is_not_acked_and_the_window_is_retried",
    ),
    one(
        "an unconfirmed publish is acked in Redis",
        "no call lost on RabbitMQ: a window is acked only once the broker confirmed it",
        PKG + "dispatch/publishers.py",
        "            else:\n                out.add(window, Outcome.UNCERTAIN)",
        "            else:\n                ok.append(window)",
        "tests/dispatch/test_rabbitmq.py::test_a_memory_alarm_for_several_leases_quarantines_nothing",
        "tests/dispatch/test_rabbitmq.py::test_rabbitmq_killed_mid_batch_loses_no_window",
    ),
    one(
        "the confirming connection is not checked before a batch",
        "RabbitMQ restarted between batches: the next batch is published at once",
        PKG + "dispatch/confirms.py",
        "if self._producer is not None and not self._alive():",
        "if self._producer is not None and not True:",
        "tests/dispatch/test_rabbitmq.py::test_a_rabbitmq_restart_between_batches_costs_no_lease",
    ),
    # -- rule "every id resolves" (issue 19, items 7 and 8) ---------------------------
    one(
        "an unroutable message is not published mandatory",
        "every id resolves: an unroutable message is retried, then quarantined (RabbitMQ)",
        PKG + "dispatch/publishers.py",
        'options["mandatory"] = True  # an unroutable message comes back (basic.return)',
        "pass",
        "tests/dispatch/test_rabbitmq.py::"
        "test_an_unroutable_message_is_retried_then_quarantined_with_the_reason",
    ),
    one(
        "the expiry finishes a running window",
        "every id resolves, never a false outcome: a claimed (running) window is never "
        "finished REVOKED by its message's expiry",
        LUA + "expire.lua",
        "local finish = st == 'queued'",
        "local finish = st == 'queued' or st == 'claimed'",
        "tests/store/redis/test_robustness.py::"
        "test_a_run_claimed_before_its_expires_is_never_revoked_by_the_expiry",
    ),
    one(
        "no dispatcher finishes windows whose message expired unseen",
        "every id resolves: a message that expires in a queue finishes its window REVOKED",
        PKG + "dispatch/dispatcher.py",
        "            self._finish_expired(shard)\n",
        "\n",
        "tests/store/redis/test_robustness.py::"
        "test_a_window_whose_message_expires_unseen_finishes_revoked_with_its_aliases",
    ),
    one(
        "the message names its record by shard number only",
        "every id resolves across a shard change: the message carries the record's tag",
        PKG + "headers.py",
        "if tag is not None or isinstance(shard, str):",
        "if False:",
        "tests/store/redis/test_cluster.py::"
        "test_a_worker_on_another_debounce_shards_finds_the_record_by_the_messages_tag",
    ),
    one(
        "dispatchers drain their own layout's shards only",
        "every id resolves across a shard change: the shards a lowered "
        "debounce_shards drops are drained",
        PKG + "dispatch/dispatcher.py",
        "                    foreign.setdefault(tag, set()).add(name)",
        "                    pass",
        "tests/system/test_hostile_dist.py::"
        "test_windows_of_shards_dropped_by_lowering_debounce_shards_still_run",
    ),
    one(
        "an expired window is returned once only",
        "every id resolves: a lost expire.lua reply still resolves the window's ids",
        LUA + "expire.lua",
        "local again = st == 'finished' and got[2] == '1'",
        "local again = false",
        "tests/store/redis/test_robustness.py::"
        "test_expire_returns_a_window_it_finished_until_its_outcome_is_stored",
    ),
    # -- Sentinel: the +switch-master watcher (issue 19, suspected) -------------------
    one(
        "the switch watcher listens to the first sentinel only",
        "Sentinel failover: a hung sentinel does not hide the switch the others announce",
        PKG + "store/redis/sentinel.py",
        "        for host, port in self.config.sentinels:\n            threading.Thread(",
        "        for host, port in self.config.sentinels[:1]:\n            threading.Thread(",
        "tests/store/redis/test_sentinel.py::"
        "test_the_switch_watcher_hears_a_failover_while_the_first_sentinel_hangs",
    ),
    one(
        "the switch watcher has no keepalive",
        "Sentinel failover: a subscription gone silent is replaced",
        PKG + "store/redis/sentinel.py",
        "    KEEPALIVE = 2.0",
        "    KEEPALIVE = 1e9",
        "tests/store/redis/test_sentinel.py::"
        "test_the_switch_watcher_pings_and_replaces_a_subscription_that_went_silent",
    ),
    one(
        "a returned message's queue is not declared again",
        "no window quarantined for a queue deleted since the dispatcher declared it",
        PKG + "dispatch/publishers.py",
        "                self.confirms.forget_declared()  # a queue deleted since it was declared",
        "                pass",
        "tests/dispatch/test_rabbitmq.py::"
        "test_a_queue_deleted_after_its_first_publish_is_declared_again_not_quarantined",
    ),
    one(
        "release.lua goes through the client's retry",
        "a publish failure is counted once (release.lua is sent at most once)",
        PKG + "store/redis/store.py",
        '        return int(self.run_once("release", [leased_key(tag)], '
        "[delay_ms, tag, *pairs])[0])",
        '        return int(self.run("release", [leased_key(tag)], [delay_ms, tag, *pairs])[0])',
        ONCE + "test_every_script_is_sent_at_most_once_under_every_fault[redis-release-drop]",
        "tests/worker/test_lease_budget.py::test_a_release_whose_reply_is_lost_counts_its_failure_once",
    ),
    one(
        "unclaim.lua goes through the client's retry",
        "inv 13: a put-back run's unclaim.lua is sent at most once (a lost reply is unknown)",
        PKG + "store/redis/store.py",
        '        return bool(int(self.run_once("unclaim", keys, '
        '[task_id, as_text(at), "queued"])))',
        '        return bool(int(self.run("unclaim", keys, [task_id, as_text(at), "queued"])))',
        ONCE + "test_every_script_is_sent_at_most_once_under_every_fault[redis-unclaim-drop]",
    ),
    one(
        "a requeued run's window is not put back",
        "exclusive: a Reject(requeue=True) keeps the key held until the requeued run ended",
        PKG + "worker/receivers.py",
        "        _put_back(store, shard, task_id, task.name)\n",
        "        _end_claim(store, shard, task_id, task.name)\n",
        "tests/producer/test_exclusive.py::"
        "test_a_run_put_back_with_reject_requeue_holds_its_key_until_it_ran_again",
    ),
    # -- claim leases and effectively once (issue 21) ----------------------------------
    one(
        "a duplicate delivery is not skipped",
        "effectively once: a delivery of a finished or live-claimed window never runs the body",
        PKG + "worker/receivers.py",
        "    if not run:\n",
        "    if False:\n",
        FAULTS + "test_dispatcher_killed_after_publish_before_ack_runs_the_body_once",
    ),
    one(
        "claims are never renewed",
        "claim leases: a running worker renews its claims (one round trip per period)",
        PKG + "worker/leases.py",
        "                done = self.renew_now()",
        "                done = {}",
        FAULTS + "test_worker_killed_mid_run_with_acks_late_is_redelivered",
    ),
    one(
        "a failed renewal waits a full period",
        "claim leases: a lease's budget (a failed renewal is tried again within it)",
        PKG + "worker/leases.py",
        "retry_at[store] = time.monotonic() + (min(wait, left / 4) if left > 0 else wait)",
        "retry_at[store] = time.monotonic() + lease / 3",
        "tests/worker/test_lease_budget.py::"
        "test_a_failed_renewal_is_tried_again_at_once_not_a_period_later",
        "tests/worker/test_lease_budget.py::test_a_refused_renewal_is_tried_again_within_the_lease",
    ),
    one(
        "the renewer's connection retries a timed-out attempt",
        "claim leases: a lease's budget (a failed renewal costs one timeout)",
        PKG + "store/redis/transport.py",
        '            kwargs = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}',
        '            kwargs = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 1)}',
        "tests/worker/test_lease_budget.py::test_a_failed_renewal_costs_one_timeout_not_two",
    ),
    one(
        "the renewer's connection does not ask Sentinel for the master",
        "claim leases: renewals reach Sentinel's master",
        PKG + "store/redis/transport.py",
        "                if conn._sock is None:  # connect() (Sentinel's finds the master), not\n"
        "                    conn.connect()",
        "                if False:\n                    conn.connect()",
        "tests/worker/test_lease_budget.py::"
        "test_a_renewal_reaches_sentinels_master_on_its_own_connection",
    ),
    one(
        "a forked child keeps the parent's renewal lock",
        "claim leases: a forked child renews (on a connection of its own)",
        PKG + "store/redis/transport.py",
        "            self.lock, self.conn, self.pid = threading.Lock(), None, os.getpid()",
        "            self.conn, self.pid = None, os.getpid()",
        "tests/worker/test_lease_budget.py::test_a_forked_child_renews_on_a_connection_of_its_own",
    ),
    one(
        "a renewal goes through the client's pipeline and its retry",
        "claim leases: renewals go on the renewer's own connection (a forked child's too)",
        PKG + "store/redis/transport.py",
        '        if self.direct:\n            link = self.__dict__.get("_renewal")',
        '        if False:\n            link = self.__dict__.get("_renewal")',
        "tests/worker/test_lease_budget.py::test_a_forked_child_renews_on_a_connection_of_its_own",
        "tests/worker/test_lease_budget.py::test_a_failed_renewal_costs_one_timeout_not_two",
    ),
    one(
        "renew.lua extends nothing",
        "claim leases: a renewal moves the claim's expiry",
        LUA + "renew.lua",
        "local until_ms = now + tonumber(ARGV[1])",
        "local until_ms = now",
        "tests/store/redis/test_scripts.py::test_a_claim_lives_while_renewed_and_a_lapsed_one_is_released",
        "tests/store/test_gate_model.py::test_the_store_matches_the_model_on_a_controlled_clock",
    ),
    one(
        "a stale claim is never released",
        "claim leases: a dead worker's claim goes stale within the lease (active released)",
        LUA + "take.lua",
        "local lapsed = redis.pcall('ZRANGEBYSCORE', claims, '-inf', lapse_upto, 'LIMIT', 0, 20)",
        "local lapsed = {}",
        "tests/store/redis/test_scripts.py::test_a_claim_lives_while_renewed_and_a_lapsed_one_is_released",
        FAULTS + "test_worker_killed_mid_run_without_acks_late_releases_its_claim_within_the_lease",
        "tests/store/test_gate_model.py::test_the_store_matches_the_model_on_a_controlled_clock",
    ),
    one(
        "a skipped duplicate of a claim that lapses is not published again",
        "at least once for a crash mid-run: a redelivery skipped under a dead claim runs",
        LUA + "take.lua",
        "    if redis.call('HGET', key, 'rd') then",
        "    if false then",
        "tests/store/redis/test_scripts.py::"
        "test_a_duplicate_skipped_under_a_claim_that_then_lapses_is_published_again",
        "tests/store/test_gate_model.py::test_the_store_matches_the_model_on_a_controlled_clock",
    ),
    one(
        "finish.lua keeps the claim",
        "claim leases: a finished run releases its claim",
        LUA + "finish.lua",
        "redis.pcall('ZREM', KEYS[4], ARGV[1])",
        "-- (claim kept)",
        "tests/store/redis/test_scripts.py::test_claim_and_finish_leave_only_a_ttld_history",
    ),
    one(
        "a requeued run keeps its claim",
        "effectively once: a Reject(requeue=True) delivery runs, it is no duplicate",
        PKG + "worker/receivers.py",
        "        _put_back(store, shard, task_id, task.name)\n",
        "        pass\n",
        "tests/worker/test_reject.py::test_reject_with_requeue_waits_for_the_run_that_follows[redis]",
    ),
    one(
        "an exclusive window is never held",
        "debounce_exclusive: runs of one key never overlap (a due window is held)",
        LUA + "take.lua",
        "    elseif id and held_by_run(ident, open) then",
        "    elseif id and false then",
        "tests/store/redis/test_scripts.py::"
        "test_an_exclusive_window_due_while_its_key_runs_is_held_until_the_run_ends",
        FAULTS + "test_a_burst_during_a_run_of_an_exclusive_task_gives_one_follow_up_after_the_run",
        "tests/store/test_gate_model.py::test_the_store_matches_the_model_on_a_controlled_clock",
    ),
    one(
        "finish.lua does not release the held window",
        "debounce_exclusive: a held window is published as soon as the run ends",
        LUA + "finish.lua",
        "      redis.call('ZADD', due_key(tag), now, ident)",
        "      redis.call('ZADD', due_key(tag), now + 60000, ident)",
        "tests/store/redis/test_scripts.py::"
        "test_an_exclusive_window_due_while_its_key_runs_is_held_until_the_run_ends",
        "tests/store/test_gate_model.py::test_the_store_matches_the_model_on_a_controlled_clock",
    ),
    one(
        "a stale claim keeps its exclusive key",
        "debounce_exclusive: a dead run holds its key for at most one claim lease",
        LUA + "take.lua",
        "      free_run(id, key, KEYS[1])",
        "      -- (key kept)",
        "tests/store/redis/test_scripts.py::"
        "test_an_exclusive_window_due_while_its_key_runs_is_held_until_the_run_ends",
        FAULTS + "test_a_window_held_behind_a_killed_exclusive_run_runs_within_one_claim_lease",
        "tests/store/test_gate_model.py::test_the_store_matches_the_model_on_a_controlled_clock",
    ),
    one(
        "a run whose pool child died leaves its aliases pending",
        "every id resolves: a prefork child killed mid-run fails every id its callers hold",
        PKG + "worker/request.py",
        "            _finish_window(app, shard, self.id, self.name, states.FAILURE, exc)",
        "            pass",
        FAULTS + "test_a_run_whose_worker_process_is_killed_resolves_every_id_its_callers_"
        "hold[child, no acks_late]",
        FAULTS + "test_a_killed_pool_child_frees_its_exclusive_key_at_once",
    ),
    one(
        "a run that stored SUCCESS and then lost its process leaves its aliases pending",
        "every id resolves: a child that died after storing its result resolves its aliases",
        PKG + "worker/request.py",
        '        if meta.get("status") != states.SUCCESS:',
        "        if True:",
        FAULTS + "test_a_run_that_stored_its_result_then_lost_its_process_resolves_every_id",
    ),
    one(
        "a run put back after its pool child died keeps the dead claim",
        "effectively once: a delivery put back after its pool child died runs at once",
        PKG + "worker/request.py",
        "            _end_claim(store_for(app), shard, self.id, self.name)",
        "            pass",
        FAULTS + "test_a_run_whose_worker_process_is_killed_resolves_every_id_its_callers_"
        "hold[child, acks_late, reject_on_worker_lost]",
    ),
    one(
        "expire.lua keeps the exclusive key of a window it revokes",
        "debounce_exclusive: a hold behind a lost message ends when its expires passed",
        LUA + "expire.lua",
        "    if run and redis.pcall('HGET', run, 'id') == id then",
        "    if false then",
        "tests/producer/test_exclusive.py::"
        "test_a_run_whose_message_the_broker_lost_holds_its_key_until_its_expires[expires]",
    ),
    one(
        "a flushed held window stays listed as held",
        "debounce_exclusive: flush publishes a held window now, and it is held no more",
        LUA + "flush.lua",
        "redis.pcall('ZREM', held_key(tag), ARGV[1])  -- pcall: a foreign key there never "
        "blocks it",
        "-- (held kept)",
        "tests/producer/test_exclusive.py::"
        "test_a_run_whose_message_the_broker_lost_holds_its_key_until_its_expires"
        "[no expires]",
    ),
    one(
        "a cancelled held window stays listed as held",
        "debounce_exclusive: a cancelled held window is held no more",
        LUA + "cancel.lua",
        "redis.pcall('ZREM', held_key(tag), ARGV[1])  -- a held exclusive window is held no more",
        "-- (held kept)",
        "tests/producer/test_exclusive.py::test_a_cancelled_held_window_is_held_no_more",
    ),
    one(
        "top does not show held windows",
        "top shows held windows and the run each waits for",
        PKG + "ops/top_render.py",
        "    if snap.held:\n",
        "    if False:\n",
        "tests/ops/test_top.py::test_top_shows_held_windows_and_the_run_each_waits_for",
    ),
    # -- monitoring that survives the workers (issue 22) -----------------------------
    one(
        "the exporter keeps its first reading",
        "monitoring: the exporter's gauges are read from Redis at each scrape",
        PKG + "ops/exporter.py",
        "            if time.monotonic() - self._read_at < self.min_interval:",
        "            if self._last is not None:",
        "tests/ops/test_exporter.py::"
        "test_the_exporter_exports_what_redis_holds_and_stops_cleanly_on_sigterm",
    ),
    one(
        "the exporter counts dispatchers as seen without a batch",
        "monitoring: DebounceDispatcherDown fires when no dispatcher took a batch",
        PKG + "ops/exporter.py",
        "                since = max(0.0, snap.at - max(snap.dispatchers.values()))",
        "                since = 0.0",
        "tests/ops/test_exporter.py::"
        "test_the_exporter_exports_what_redis_holds_and_stops_cleanly_on_sigterm",
    ),
    one(
        "the exposition ignores PROMETHEUS_MULTIPROC_DIR",
        "monitoring: calls made in prefork children (and pre-forked producers) are counted",
        PKG + "ops/metrics.py",
        "    path = multiprocess_dir()\n",
        "    path = None\n",
        "tests/ops/test_multiprocess.py::"
        "test_calls_of_preforked_producers_are_counted_by_the_master",
        "tests/ops/test_multiprocess.py::"
        "test_a_delay_inside_a_task_on_a_prefork_worker_is_counted[multiproc-dir]",
    ),
    one(
        "a call Redis did not answer is not counted",
        "monitoring: Redis errors on calls are counted (call_errors_total)",
        PKG + "producer/gate.py",
        "        if call_failed.receivers:",
        "        if False:",
        "tests/ops/test_metrics_errors.py::"
        "test_a_call_redis_does_not_answer_is_counted_by_error_and_timed",
    ),
    one(
        "windows a pass could not publish are not counted",
        "monitoring: failed publishes are counted by kind (publish_failures_total)",
        PKG + "dispatch/outcomes.py",
        "            if publish_failed.receivers or publish_refused.receivers:",
        "            if False:",
        "tests/ops/test_metrics_errors.py::"
        "test_windows_a_dead_broker_kept_back_are_counted_as_broker_failures",
    ),
    one(
        "enable() registers its metrics again",
        "monitoring: enable() twice never raises Duplicated timeseries",
        PKG + "ops/metrics.py",
        "    if namespace in done:",
        "    if False:",
        "tests/ops/test_metrics_errors.py::"
        "test_enable_twice_returns_the_same_metrics_and_counts_each_call_once",
    ),
    # -- the operator surface (issue 22, items 2 to 4) --------------------------------
    one(
        "gate.lua does not count calls in",
        "top's calls/s in are the calls the gate accepted",
        LUA + "gate.lua",
        "redis.pcall('HINCRBY', stats, 'i|' .. task, 1)",
        "redis.pcall('HINCRBY', stats, 'i|' .. task, 0)",
        "tests/ops/test_cli_conventions.py::test_top_takes_dash_j_too",
    ),
    one(
        "a dispatcher that stops cleanly does not say so",
        "ping and top mark a stopped dispatcher stopped, not alive or silent",
        PKG + "dispatch/dispatcher.py",
        "        self._stopped()\n        self.close()",
        "        self.close()",
        "tests/ops/test_cli_conventions.py::"
        "test_dispatch_detaches_with_pidfile_and_logfile_and_answers_ping",
    ),
    one(
        "a debounced run's argsrepr is the placeholder again",
        "Flower and celery events show a run's real arguments",
        PKG + "headers.py",
        "        if arguments is not None:\n            amqp = self.app.amqp",
        "        if arguments is not None and False:\n            amqp = self.app.amqp",
        "tests/dispatch/test_events.py::test_celery_events_show_a_debounced_runs_real_arguments",
    ),
    # -- the embedded dispatcher in a child process (issue 23, item 5) -----------------
    Mutation(
        "the dispatcher child outlives its SIGKILLed worker",
        "no dispatcher process outlives its worker",
        (
            Edit(PKG + "dispatch/process.py", "        _term_when_parent_dies()\n", ""),
            Edit(
                PKG + "dispatch/process.py",
                "while thread.is_alive() and not terms and not self._orphaned():",
                "while thread.is_alive() and not terms:",
            ),
        ),
        (
            "tests/dispatch/test_dispatcher_process.py::"
            "test_no_child_outlives_a_worker_sigkilled_at_any_point_of_its_start[redis]",
            "tests/dispatch/test_dispatcher_process.py::test_the_child_stops_when_its_worker_is_sigkilled[redis]",
        ),
    ),
    Mutation(
        "the dispatcher child reads its worker's pid itself, after its start-up",
        "no dispatcher process outlives its worker (one whose worker died early "
        "records init as its parent)",
        (
            Edit(
                PKG + "dispatch/process.py",
                "        if self._orphaned():  # the worker died before the prctl",
                "        if False:  # the worker died before the prctl",
            ),
            Edit(
                PKG + "dispatch/process.py",
                "        self.app.set_current()\n",
                "        self.app.set_current()\n        self.parent_pid = os.getppid()\n",
            ),
        ),
        (
            "tests/dispatch/test_dispatcher_process.py::"
            "test_no_child_outlives_a_worker_sigkilled_at_any_point_of_its_start[redis]",
            "tests/dispatch/test_dispatcher_process.py::"
            "test_a_child_whose_worker_died_before_it_started_starts_nothing[redis]",
        ),
    ),
    one(
        "the dispatcher child does not check its parent right after start",
        "a dispatcher child whose worker died before it started starts nothing",
        PKG + "dispatch/process.py",
        "        if self._orphaned():  # the worker died before the prctl",
        "        if False:  # the worker died before the prctl",
        "tests/dispatch/test_dispatcher_process.py::"
        "test_a_child_whose_worker_died_before_it_started_starts_nothing[redis]",
    ),
    Mutation(
        "the first dispatcher child is forked by the thread that calls start()",
        "a dispatcher child outlives no supervisor, and the end of the thread that "
        "started it does not stop it (PR_SET_PDEATHSIG follows the forking thread)",
        (
            Edit(
                PKG + "dispatch/process.py",
                "        self._supervisor.start()\n        self._started.wait()\n",
                "        self._spawn()\n        self._supervisor.start()\n"
                "        self._started.wait()\n",
            ),
            Edit(
                PKG + "dispatch/process.py",
                "        try:\n            if not self._spawn():\n                return\n",
                "        try:\n            if self._child is None:\n                return\n",
            ),
        ),
        (
            "tests/dispatch/test_dispatcher_process.py::"
            "test_a_child_started_from_a_thread_that_ends_keeps_running[redis]",
        ),
    ),
    one(
        "stop() does not wait for a respawn under way",
        "the worker's stop stops whichever dispatcher child is current",
        PKG + "dispatch/process.py",
        "        with self._lock:  # waits out a fork under way: its child is the one to stop\n",
        "        if True:\n",
        "tests/dispatch/test_dispatcher_process.py::test_stop_during_a_respawn_stops_the_new_child",
    ),
    one(
        "a dead dispatcher child is not started again",
        "the worker keeps its embedded dispatcher process running",
        PKG + "dispatch/process.py",
        "                if not self._spawn():\n                    return\n"
        "            except OSError",
        "                return\n            except OSError",
        "tests/dispatch/test_dispatcher_process.py::test_a_killed_child_is_started_again[redis]",
    ),
    # -- a Redis clock step (issue 19, suspected item) ---------------------------------
    one(
        "the expiry sweep judges a message's expiry on Redis's clock alone",
        "a Redis clock stepped forward revokes no message a worker would still run",
        LUA + "expire.lua",
        "  seen = math.min(now, tonumber(ARGV[5]))",
        "  seen = now",
        CLOCK + "test_a_redis_clock_stepped_an_hour_forward_loses_and_doubles_nothing",
    ),
    one(
        "a step forward of Redis's clock lapses the claims of runs still going",
        "a Redis clock stepped forward releases no live claim (duplicates stay skipped)",
        LUA + "take.lua",
        "  lapse_upto = math.min(now, tonumber(ARGV[8]))",
        "  lapse_upto = now",
        CLOCK + "test_a_redis_clock_stepped_an_hour_forward_loses_and_doubles_nothing",
    ),
    one(
        "a Redis clock stepped back is not noticed",
        "a Redis clock step is logged with what it does to the stored deadlines",
        PKG + "dispatch/dispatcher.py",
        "        if moved < least - CLOCK_STEP_MS:",
        "        if False:",
        CLOCK + "test_a_redis_clock_stepped_an_hour_back_delays_by_the_step_and_loses_nothing",
    ),
    # -- debounce_redis_wait_replicas and the worker's marks (issue 21, failover) ------
    one(
        "a claim too few replicas acknowledged runs at once",
        "a run claimed on a master a failover demotes does not run beside the promoted "
        "replica's copy (the claim's WAIT)",
        PKG + "store/redis/store.py",
        "            if not int(run) or not before:\n"
        "                return claim_result(before, run)",
        "            return claim_result(before, run)",
        "tests/worker/test_wait_claims.py::test_a_claim_too_few_replicas_acknowledged_is_delayed_not_"
        "lost_or_doubled",
    ),
    one(
        "a claim WAIT refused is not undone",
        "a delivery whose claim WAIT refused runs later (not skipped under its own claim)",
        PKG + "store/redis/store.py",
        '                self.run_once("unclaim", keys, [task_id, int(at), as_text(before)])',
        "                pass",
        "tests/worker/test_wait_claims.py::test_a_claim_too_few_replicas_acknowledged_is_delayed_not_"
        "lost_or_doubled",
    ),
    one(
        "a finish WAIT refused is not sent again",
        "a failover cannot forget a run that finished (its finish is replicated)",
        PKG + "worker/receivers.py",
        "        marks.keep(store, mark, exc)\n",
        "",
        "tests/worker/test_wait_claims.py::test_a_finish_too_few_replicas_acknowledged_is_sent_again",
    ),
    one(
        "a kept claim is sent again waited for by replicas",
        "a claim kept during an outage is sent once without WAIT (never undone as a "
        "claim too few replicas acknowledged: its run went ahead)",
        PKG + "store/redis/store.py",
        "        return WindowStore.claim(self, shard, task_id, task_name, retry)",
        "        return self.claim(shard, task_id, task_name, retry)",
        "tests/worker/test_wait_claims.py::"
        "test_a_kept_claim_is_sent_without_wait_and_only_the_waited_store_waits",
    ),
    one(
        "debounce_redis_wait_replicas builds the plain store",
        "with debounce_redis_wait_replicas every call, claim and finish is followed by WAIT",
        PKG + "store/redis/store.py",
        "        if cls is WindowStore and settings.wait_replicas:",
        "        if False:",
        "tests/worker/test_wait_claims.py::"
        "test_a_kept_claim_is_sent_without_wait_and_only_the_waited_store_waits",
    ),
    one(
        "unclaim.lua undoes a later claim",
        "a claim WAIT refused undoes only itself (another delivery's live claim stays)",
        LUA + "unclaim.lua",
        "    redis.call('HGET', KEYS[1], 'ca') ~= ARGV[2] then",
        "    false then",
        "tests/worker/test_wait_claims.py::test_unclaim_undoes_only_the_claim_it_names",
    ),
    one(
        "claim.lua ignores the ident of a window still open",
        "a delivery of a window whose take a failover lost does not run beside its new publish",
        LUA + "claim.lua",
        "  if ARGV[6] and ARGV[6] ~= '' then",
        "  if false then",
        "tests/worker/test_wait_claims.py::test_a_delivery_whose_window_is_still_open_here_is_skipped",
    ),
    one(
        "doctor's repair leaves an open window without a due entry",
        "doctor --repair makes a window no dispatcher would take due again",
        LUA + "doctor_open.lua",
        "      redis.call('ZADD', KEYS[1], now, ident)\n",
        "",
        "tests/ops/test_doctor.py::test_doctor_finds_and_repairs_each_broken_invariant[node]",
    ),
    one(
        "doctor reports a capped window not yet taken as a record without a TTL",
        "doctor reports nothing on a healthy store (a window mid-transition is no finding)",
        LUA + "doctor_ttl.lua",
        "          (state == 'dispatching' and redis.call('ZSCORE', KEYS[1], name)) then",
        "          false then",
        "tests/ops/test_doctor.py::test_doctor_finds_and_repairs_each_broken_invariant[node]",
    ),
    one(
        "an outage under 'publish' raises instead of publishing",
        "debounce_on_outage='publish': a call the windows' Redis cannot take runs anyway",
        PKG + "producer/outage.py",
        '    if kind is None or policy(app, spec) != "publish":\n        raise exc\n',
        "    raise exc\n",
        "tests/producer/test_outage_policy.py::test_publish_with_the_redis_stopped_runs_every_call_once_and_counts_it",
    ),
    one(
        "an OOM reply is not an outage",
        "OOM, READONLY and LOADING replies (the call did not run) fall back under 'publish'",
        PKG + "store/redis/translate.py",
        '        return ServerRefused(\n            f"debounce Redis is at maxmemory (OOM)',
        '        return DebounceBackendError(\n            f"debounce Redis is at maxmemory (OOM)',
        "tests/producer/test_outage_policy.py::test_which_errors_are_an_outage",
    ),
    one(
        "outage.py reads redis-py's error classes again",
        "outside celery_debounce/store/ no module imports redis-py, names a Lua script or "
        'builds a window\'s keys (docs/design.md, "The store contract")',
        PKG + "producer/outage.py",
        '    if isinstance(exc, ServerRefused):\n        return "refused"\n',
        "    import redis\n\n"
        "    if isinstance(exc, ServerRefused) or isinstance(exc.__cause__, redis.ResponseError):\n"
        '        return "refused"\n',
        "tests/store/test_store_seam.py::test_no_module_outside_the_store_reaches_past_it",
    ),
    one(
        "a plain publish of a collect call gets the raw arguments",
        "a debounce_collect task published plainly still gets a list of calls",
        PKG + "producer/task.py",
        "        if self._debounce_defaults.debounce_collect:\n"
        "            args, kwargs = single_call_args(args, kwargs, task_id), {}\n"
        '            options["headers"] = {**(options.get("headers") or {}), COLLECT_HEADER: 1}\n'
        "        return super().apply_async(\n",
        "        return super().apply_async(\n",
        "tests/producer/test_outage_policy.py::test_publish_with_the_redis_stopped_runs_every_call_once_and_counts_it",
    ),
    one(
        "the breaker never opens",
        "after a call timed out, the next calls skip Redis for the probe interval",
        PKG + "producer/outage.py",
        "        elif timed_out(exc) or breaker.since is not None:",
        "        elif False:",
        "tests/producer/test_outage_policy.py::test_raise_with_a_redis_that_never_answers_fails_fast_after_the_first_call",
    ),
    one(
        "every call probes an open breaker",
        "one call at a time probes an open breaker, the others skip Redis",
        PKG + "producer/outage.py",
        "            if not self.probing and time.monotonic() >= self.probe_at:",
        "            if time.monotonic() >= self.probe_at:",
        "tests/producer/test_outage_policy.py::test_one_call_probes_after_the_interval_and_its_success_closes_the_breaker",
    ),
    one(
        "a forked child inherits the open breaker",
        "a forked child starts with every breaker closed",
        PKG + "producer/outage.py",
        "    _lock = threading.Lock()\n    OPEN.clear()\n",
        "    _lock = threading.Lock()\n",
        "tests/producer/test_outage_policy.py::test_a_forked_child_starts_with_the_breaker_closed",
    ),
    # -- concurrency models decided at each call, not at import ------------------------
    one(
        "the kept connection is chosen at import (gevent patched later shares it)",
        "greenlets patched after import each get their own reply",
        PKG + "store/redis/node.py",
        "        if socket.socket is not _STD_SOCKET or threading.local is not _STD_LOCAL:",
        "        if _STD_SOCKET is None or _STD_LOCAL is None:",
        "tests/worker/test_gevent.py::test_greenlets_patched_before_or_after_import_each_get_their_own_reply[redis-gevent-cold]",
        "tests/worker/test_gevent.py::"
        "test_gunicorn_preload_with_gevent_workers_gives_each_request_its_own_replies[redis]",
    ),
    one(
        "store_for's lock is inherited locked by a forked child",
        "a fork while another thread holds a module lock does not deadlock the child",
        PKG + "store/factory.py",
        "os.register_at_fork(after_in_child=_forked)\n\n\n",
        "",
        "tests/worker/test_concurrency_models.py::"
        "test_a_fork_while_another_thread_holds_a_module_lock_does_not_deadlock_the_child[redis-store_for]",
    ),
    one(
        "store_for builds a cluster store under its lock (patched after import: hangs)",
        "greenlets patched after import each get their own reply",
        PKG + "store/factory.py",
        "        built = build_store(settings_for(app))\n"
        "        with _lock:  # nothing under it yields",
        "        with _lock:\n            built = build_store(settings_for(app))",
        "tests/worker/test_gevent.py::"
        "test_greenlets_patched_after_import_build_a_cluster_store_without_deadlock[redis]",
    ),
    one(
        "marks' retry thread is started under its lock (patched after import: hangs)",
        "greenlets patched after import each get their own reply",
        PKG + "worker/retry_queue.py",
        '            _state["thread"] = start\n',
        '            _state["thread"] = start\n'
        "            start.start()\n            start = None\n",
        "tests/worker/test_gevent.py::"
        "test_greenlets_patched_after_import_keep_failed_marks_without_deadlock[redis]",
    ),
    one(
        "marks' retry thread recorded but not yet started counts as none (two start)",
        "greenlets patched after import each get their own reply",
        PKG + "worker/retry_queue.py",
        "if thread is None or not (thread.ident is None or thread.is_alive()):",
        "if thread is None or not thread.is_alive():",
        "tests/worker/test_gevent.py::"
        "test_greenlets_patched_after_import_keep_failed_marks_without_deadlock[redis]",
    ),
    one(
        "marks' lock is inherited locked by a forked child",
        "a fork while another thread holds a module lock does not deadlock the child",
        PKG + "worker/retry_queue.py",
        "os.register_at_fork(after_in_child=_forked)\n\n\n",
        "",
        "tests/worker/test_concurrency_models.py::"
        "test_a_fork_while_another_thread_holds_a_module_lock_does_not_deadlock_the_child[redis-marks]",
    ),
    one(
        "a connection made before patching is used as it is (it blocks every greenlet)",
        "a call after patching never reads on a stdlib socket",
        PKG + "store/redis/node.py",
        "conn = checkout(pool)  # one made before patching is made anew",
        "conn = pool.get_connection(*_checkout_args())",
        "tests/worker/test_gevent.py::"
        "test_a_connection_made_before_patching_does_not_block_the_other_greenlets[redis-per-call]",
        "tests/worker/test_gevent.py::"
        "test_a_connection_made_before_patching_does_not_block_the_other_greenlets[redis-kept]",
    ),
    one(
        "a script then WAIT uses a connection made before patching (patched, blocks)",
        "a call after patching never reads on a stdlib socket",
        PKG + "store/redis/transport.py",
        "conn: Any = checkout(pool)\n",
        "conn: Any = pool.get_connection(*CHECKOUT_ARGS)\n",
        "tests/worker/test_gevent.py::"
        "test_a_connection_made_before_patching_does_not_block_the_other_greenlets[redis-then-wait]",
    ),
    one(
        "a TLS connection made before patching is taken for a patched one (patched)",
        "a call after patching never reads on a stdlib socket",
        PKG + "store/redis/transport.py",
        "and isinstance(conn._sock, STD_SOCKET)",
        "and type(conn._sock) is STD_SOCKET",
        "tests/worker/test_gevent.py::test_a_tls_connection_made_before_patching_is_made_anew[redis]",
    ),
    one(
        "a run past its ceiling is not counted as a max-wait violation",
        "max_wait_violations_total counts each run that starts past its ceiling plus the tolerance",
        PKG + "worker/ceiling.py",
        "    if late_ms is not None and late_ms > MAX_WAIT_TOLERANCE_S * 1000:\n",
        "    if late_ms is not None and late_ms > MAX_WAIT_TOLERANCE_S * 1000 + 60_000:\n",
        "tests/ops/test_operator_signals.py::"
        "test_a_run_past_its_ceiling_counts_one_max_wait_violation",
    ),
    one(
        "a debounce_exclusive window held behind a run is counted as a max-wait violation",
        "max_wait_violations_total counts a held exclusive window only past the later of its "
        "ceiling and the end of the run it was held behind",
        PKG + "store/redis/runs.py",
        "            ceiling = max(ceiling, int(deadline))  # held behind a run until then\n",
        "            pass\n",
        "tests/ops/test_operator_signals.py::"
        "test_an_exclusive_window_held_behind_a_run_is_not_a_max_wait_violation",
    ),
    one(
        "PostgreSQL: a held exclusive window's lateness counts from its own ceiling",
        "max_wait_violations_total counts a held exclusive window only past the later of its "
        "ceiling and the end of the run it was held behind",
        PKG + "store/postgres/runs.py",
        '"SELECT debounce_ms(clock_timestamp()) - CASE WHEN exclusive AND held_ms > 0 "',
        '"SELECT debounce_ms(clock_timestamp()) - CASE WHEN false "',
        PGC + "test_a_run_is_late_past_its_ceiling_or_past_the_end_of_the_run_it_was_held_"
        "behind[postgres]",
    ),
    one(
        "inspect shows a held window's next look as when it runs",
        "inspect shows a held window as running after the window it waits for ends",
        PKG + "ops/cli_common.py",
        "        if w.held_since is not None:  "
        "# its due score is only the next look, not its run\n",
        "        if False:\n",
        "tests/ops/test_operator_signals.py::"
        "test_inspect_shows_a_held_window_as_after_its_runner_ends",
    ),
    one(
        "a definition refused while its app finalizes raises there",
        "one bad debounced task definition names itself and never breaks the app's other "
        "tasks or a later app",
        PKG + "producer/task_definition.py",
        "    if owned is not None and not owned():\n        return False\n",
        "    if True:\n        return False\n",
        "tests/ops/test_check_command.py::"
        "test_one_refused_definition_does_not_break_the_apps_other_tasks",
    ),
    one(
        "a worker starts with a refused debounced task",
        "a worker refuses to start while a debounced task definition was refused",
        PKG + "producer/worker_steps.py",
        '        if refused_tasks(app):\n            app.steps["worker"].add(RefusedTasksStep)\n',
        "",
        "tests/ops/test_check_command.py::test_the_worker_refuses_to_start_with_the_same_messages",
    ),
    one(
        "check lets a task module's import error escape as a traceback",
        "debounce check reports every problem and -j always prints its JSON object",
        PKG + "ops/cli_health.py",
        "    except Exception as exc:  # a task module that fails to import: the worker fails too",
        "    except ImportError as exc:  # a task module that fails to import",
        "tests/ops/test_check_command.py::"
        "test_a_task_module_that_fails_to_import_is_a_problem_not_a_traceback",
    ),
    one(
        "a definition refused at once does not say which task",
        "one bad debounced task definition names itself",
        PKG + "producer/task.py",
        "                named = definition_error(cls, exc)  # raised at once: say which task",
        "                named = exc",
        "tests/ops/test_check_command.py::test_a_definition_refused_at_once_names_its_task",
    ),
    one(
        "the Django check lets a tasks module's import error escape as a traceback",
        "manage.py check reports a tasks module that fails to import as celery_debounce.E001",
        PKG + "contrib/django/apps.py",
        "        except Exception as exc:  # a tasks module that fails to import",
        "        except ImportError as exc:  # a tasks module that fails to import",
        "tests/producer/test_django.py::test_manage_py_check_refuses_a_bad_debounced_task[broken]",
    ),
    # -- the PostgreSQL store (store/postgres/functions/, steps/, store.py) ----------
    one(
        "debounce_cancel acts again on a token it has answered",
        "at most once on PostgreSQL: a cancel whose reply was lost answers with what it "
        "dropped (its result is revoked)",
        PKG + "store/postgres/functions/debounce_cancel.sql",
        "    RETURN QUERY SELECT * FROM debounce_cancelled c WHERE c.token = p_token;",
        "    RETURN QUERY SELECT * FROM debounce_cancelled c WHERE false;",
        PGC + "test_a_cancel_whose_reply_is_lost_gets_its_first_answer_and_acts_once[postgres]",
    ),
    one(
        "a PostgreSQL listing step starts at its cursor's window again",
        "inspect on PostgreSQL lists each open window once, in deadline order",
        PKG + "store/postgres/inspect.py",
        "AND (deadline, ident) > (%s::timestamptz, %s)",
        "AND (deadline, ident) >= (%s::timestamptz, %s)",
        PGC + "test_open_windows_are_listed_in_deadline_order_in_bounded_steps_by_task[postgres]",
    ),
    one(
        "the PostgreSQL store ignores debounce_postgres_timeout",
        "a call blocked on PostgreSQL fails within debounce_postgres_timeout",
        PKG + "store/postgres/app.py",
        "        timeout=settings.postgres_timeout_s,\n",
        "",
        "tests/system/test_postgres_e2e.py::"
        "test_a_call_blocked_on_the_server_fails_within_debounce_postgres_timeout",
    ),
    one(
        "debounce_cancel drops a window of another id",
        "a by-id cancel on PostgreSQL never drops a newer window of the key",
        PKG + "store/postgres/functions/debounce_cancel.sql",
        "    WITH gone AS (\n        DELETE FROM debounce_open o\n"
        "        WHERE o.ident = p_ident AND (p_task_id = '' OR o.task_id = p_task_id)",
        "    WITH gone AS (\n        DELETE FROM debounce_open o\n        WHERE o.ident = p_ident",
        PGC + "test_a_cancel_by_id_spares_a_newer_window_and_a_taken_window_is_not_cancelled"
        "[postgres]",
    ),
    one(
        "debounce_claim runs a finished window again",
        "inv 5 on PostgreSQL: a finished window is never claimed again (duplicate run)",
        PKG + "store/postgres/functions/debounce_claim.sql",
        "    IF v_state = 'finished' OR (v_state = 'claimed' AND NOT p_retry AND v_until > v_now)",
        "    IF (v_state = 'claimed' AND NOT p_retry AND v_until > v_now)",
        PGC + "test_a_claimed_window_is_never_pulled_back_a_call_during_its_run_opens_a_new_one"
        "[postgres]",
    ),
    one(
        "debounce_take leaves a lapsed claim stale when a duplicate was skipped under it",
        "at least once on PostgreSQL: a skipped delivery's window is published again when "
        "its claim lapses",
        PKG + "store/postgres/functions/debounce_take.sql",
        "    SET state = CASE WHEN t.redelivered THEN 'dispatching'\n",
        "    SET state = CASE WHEN false THEN 'dispatching'\n",
        PGC + "test_a_claim_lives_while_renewed_and_a_lapsed_one_runs_again[postgres]",
    ),
    one(
        "debounce_take takes an exclusive window while its key runs",
        "debounce_exclusive on PostgreSQL: runs of one key never overlap",
        PKG + "store/postgres/functions/debounce_take.sql",
        "        WHERE o.deadline <= v_now AND NOT (o.exclusive AND debounce_running(o.ident))",
        "        WHERE o.deadline <= v_now",
        PGC + "test_an_exclusive_window_due_while_its_key_runs_is_held_until_the_run_ends"
        "[postgres]",
    ),
    one(
        "debounce_gate reuses a fixed id whose window was taken",
        "a caller id in use is never reused on PostgreSQL (a record overwritten)",
        PKG + "store/postgres/functions/debounce_gate.sql",
        "            EXISTS (SELECT 1 FROM debounce_taken t WHERE t.task_id = p_task_id)",
        "            false",
        PGC + "test_a_fixed_id_opens_under_it_or_is_recorded_as_an_alias_of_the_window_it_"
        "joins[postgres]",
    ),
    one(
        "a replacing join on PostgreSQL takes the joiner's embed",
        "whose option wins: a replacing join keeps the opener's callbacks",
        PKG + "store/postgres/functions/debounce_replacement.sql",
        "        RETURN convert_to(json_build_array(v_mine -> 0, v_mine -> 1, v_theirs -> 2)",
        "        RETURN convert_to(json_build_array(v_mine -> 0, v_mine -> 1, v_mine -> 2)",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_join_replaces_the_arguments_only_with_replace_the_openers_embed_stays",
    ),
    one(
        "a PostgreSQL write whose reply was lost is sent again",
        "at most once on PostgreSQL: a lost reply is OutcomeUnknown, never resent",
        PKG + "store/postgres/sending.py",
        "        except psycopg.OperationalError as exc:\n            raise ReplyLost(",
        "        except psycopg.OperationalError as exc:\n            return self._read(fn)\n"
        "            raise ReplyLost(",
        "tests/store/postgres/test_postgres_store.py::test_a_gate_whose_reply_is_lost_is_not_sent_again",
        PGC + "test_a_claim_whose_reply_is_lost_is_outcome_unknown_and_never_sent_again[postgres]",
    ),
    one(
        "top lets the store's and the pool's warnings through while its view is live",
        "an outage reads well: nothing prints over top's screen; the lines are held",
        PKG + "ops/held_logs.py",
        "        log.addHandler(handler)\n        log.propagate = False\n",
        "",
        "tests/ops/test_top_postgres.py::test_top_on_postgres_keeps_its_screen_through_an_outage",
        "tests/ops/test_top.py::test_lines_logged_while_the_screen_is_live_are_held",
    ),
    one(
        "a PostgreSQL call cancelled at statement_timeout opens the outage breaker",
        "a lock on one window's row is that key's: the next call of the process goes on",
        PKG + "store/postgres/sending.py",
        "            raise StoreUnavailable(\n"
        '                f"PostgreSQL store cancelled the call, nothing written: {_safe(exc)}"\n'
        "            ) from exc",
        "            raise waited_out(StoreUnavailable(\n"
        '                f"PostgreSQL store cancelled the call, nothing written: {_safe(exc)}"\n'
        "            )) from exc",
        "tests/system/test_postgres_e2e.py::"
        "test_a_call_blocked_on_the_server_fails_within_debounce_postgres_timeout",
    ),
    one(
        "a PostgreSQL call the watchdog cut is not marked as one that waited its timeout",
        "the outage breaker covers PostgreSQL: after one call waits out a silent server, "
        "the next calls fail at once",
        PKG + "store/postgres/sending.py",
        "        if time.monotonic() - started >= seconds:  # the watchdog shut it down\n"
        "            waited_out(exc)",
        "        if time.monotonic() - started >= seconds:  # the watchdog shut it down\n"
        "            pass",
        "tests/producer/test_outage_policy.py::"
        "test_raise_with_a_postgres_that_never_answers_fails_fast_after_the_first_call",
    ),
    one(
        "a pooled PostgreSQL connection closed while idle is written on",
        "an outage on PostgreSQL is StoreUnavailable (nothing sent), not outcome unknown",
        PKG + "store/postgres/sending.py",
        "            if not _closed_while_idle(conn):",
        "            if True:",
        PGC + "test_an_unreachable_store_raises_its_typed_error_and_writes_nothing[postgres]",
    ),
    one(
        "an idle pooled PostgreSQL connection with bytes to read is written on",
        "a connection the server ended while idle (its FATAL read, its close not yet) is "
        "not trusted with a call: no outcome unknown for a call that never ran",
        PKG + "store/postgres/sending.py",
        "    return bool(readable) or conn.pgconn.status != psycopg.pq.ConnStatus.OK",
        "    return conn.pgconn.status != psycopg.pq.ConnStatus.OK",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_pooled_connection_the_server_ended_while_idle_is_not_written_on",
    ),
    one(
        "a worker drops a mark whose store's reply was lost or that could not reach it",
        "a claim or finish that failed in a store outage (either store's typed error) is "
        "kept and sent again once the store answers",
        PKG + "worker/retry_queue.py",
        "    return isinstance(exc, (StoreUnavailable, ReplyLost, NotReplicated))"
        " or is_outage(exc)",
        "    return isinstance(exc, NotReplicated) or is_outage(exc)",
        PGC + "test_a_claim_whose_reply_is_lost_is_outcome_unknown_and_never_sent_again[postgres]",
    ),
    one(
        "the PostgreSQL store lists every open window whatever the prefix",
        "debounce_windows(app, task) lists that task's windows only, on every store",
        PKG + "store/postgres/store.py",
        '    "WHERE left(ident, %s) = %s ORDER BY deadline, ident"',
        '    "WHERE %s >= 0 OR ident = %s ORDER BY deadline, ident"',
        PGC + "test_pending_payloads_lists_each_open_window_with_its_payload_and_delete_all_"
        "empties[postgres]",
    ),
    one(
        "redact leaves a password given as a URL's query parameter",
        "no password in any error or log line: a postgresql:// URL's ?password= too",
        PKG + "redact.py",
        '        segment = _QUERY_SECRET.sub(r"\\1***", text[match.end() : end])',
        "        segment = text[match.end() : end]",
        "tests/store/test_secrets.py::test_no_password_when_a_postgresql_store_url_is_refused",
    ),
    one(
        "a PostgreSQL call the server does not answer is waited for forever",
        "a store outage is an error in seconds, never a hang: a stopped server too",
        PKG + "store/postgres/sending.py",
        "        with guarded(conn, seconds):\n            return run(conn, work)",
        "        if seconds:\n            return run(conn, work)",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_server_that_stops_answering_fails_each_call_within_its_timeout",
    ),
    one(
        "a dispatcher's LISTEN on PostgreSQL waits for a server that stopped",
        "a dispatcher never hangs on its wake-up subscription: a server that stopped is "
        "an outage within the store's timeout",
        PKG + "store/postgres/wake.py",
        "            with guarded(conn, self.store.timeout + 1.0):"
        "  # a server that stopped: no hang",
        "            if conn:",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_server_that_stops_answering_fails_each_call_within_its_timeout",
    ),
    one(
        "gate_many on PostgreSQL goes on sending after a lost reply",
        "a batch whose reply was lost sends nothing more: the calls after it are reported "
        "unwritten, never sent to a server that just failed (each would wait its timeout)",
        PKG + "store/postgres/bulk.py",
        "            except ReplyLost as exc:  # the chunk ran whole, or not at all\n"
        "                down = exc\n",
        "            except ReplyLost as exc:  # the chunk ran whole, or not at all\n",
        "tests/store/postgres/test_postgres_store.py::"
        "test_gate_many_after_a_lost_reply_sends_nothing_more_and_says_so",
    ),
    one(
        "edge calls of one ident on PostgreSQL are not serialized",
        "a leading burst runs its leading run once on PostgreSQL (racing first calls)",
        PKG + "store/postgres/functions/debounce_gate.sql",
        "        PERFORM pg_advisory_xact_lock(hashtext('debounce_quiet:' || p_ident));\n",
        "",
        "tests/store/postgres/test_postgres_store.py::"
        "test_racing_first_calls_of_a_leading_burst_make_one_leading_run",
    ),
    one(
        "debounce_gate sends no wake-up for a new earliest window on PostgreSQL",
        "a dispatcher sleeping until a later deadline wakes for an earlier one (NOTIFY)",
        PKG + "store/postgres/functions/debounce_gate.sql",
        "        -- gone; at worst this call wakes one for nothing.\n"
        "        PERFORM pg_notify(debounce_wake_channel(), '');\n",
        "        NULL;\n",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_new_earliest_window_wakes_a_waiting_listener_well_before_its_timeout",
    ),
    one(
        "debounce_gate's wake-up check scans from the lowest deadline on PostgreSQL",
        "a call under a held snapshot reads no window churned long before it",
        PKG + "store/postgres/functions/debounce_gate.sql",
        "WHERE o.deadline < v_row.deadline AND o.deadline >= v_now - interval '1 second')",
        "WHERE o.deadline < v_row.deadline)",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_call_under_a_held_snapshot_reads_no_window_churned_long_ago",
    ),
    one(
        "a flushed window on PostgreSQL wakes no dispatcher",
        "a window made due now (flush, the cap, a leading run) wakes a dispatcher (NOTIFY)",
        PKG + "store/postgres/functions/debounce_close.sql",
        "    PERFORM pg_notify(debounce_wake_channel(), '');  -- due now (sent at commit)",
        "    NULL;",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_flush_wakes_a_listener_a_later_deadline_does_not",
    ),
    one(
        "a PostgreSQL wake listener keeps its failed connection",
        "a dispatcher whose wake connection was killed subscribes again and still wakes",
        PKG + "store/postgres/wake.py",
        "        except (OSError, psycopg.Error):\n            self.close()\n"
        "            return False",
        "        except (OSError, psycopg.Error):\n            return False",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_listener_whose_connection_is_killed_subscribes_again_and_still_wakes",
    ),
    one(
        "the PostgreSQL expiry sweep revokes a running window",
        "a claimed (running) window is never finished by the expiry sweep",
        PKG + "store/postgres/functions/debounce_expire.sql",
        "        IF v_row.state = 'queued' THEN",
        "        IF v_row.state IN ('queued', 'claimed') THEN",
        "tests/store/postgres/test_postgres_store.py::"
        "test_the_expiry_sweep_finishes_an_expired_queued_window_once_and_only_once",
    ),
    one(
        "the PostgreSQL expiry sweep forgets a window before its outcome is stored",
        "every id resolves: an expired window is returned by every sweep until "
        "debounce_expired confirms its REVOKED was stored",
        PKG + "store/postgres/functions/debounce_expire.sql",
        "        ELSIF NOT (v_row.state = 'finished' AND v_row.expired) THEN",
        "        ELSE",
        "tests/store/postgres/test_postgres_store.py::"
        "test_the_expiry_sweep_finishes_an_expired_queued_window_once_and_only_once",
    ),
    one(
        "the PostgreSQL expiry sweep finishes a swept window again",
        "an expired window is finished once and only once (its record not rewritten)",
        PKG + "store/postgres/functions/debounce_expire.sql",
        "        IF v_row.state = 'queued' THEN",
        "        IF v_row.state = 'queued' OR v_row.expired THEN",
        "tests/store/postgres/test_postgres_store.py::"
        "test_the_expiry_sweep_finishes_an_expired_queued_window_once_and_only_once",
    ),
    one(
        "PostgreSQL keeps shard layouts past the history TTL",
        "a layout no dispatcher wrote for debounce_history_ttl is no longer drained",
        PKG + "store/postgres/functions/debounce_layouts.sql",
        "    DELETE FROM debounce_layouts l\n"
        "    WHERE l.written_at < v_now - p_keep_ms * interval '1 millisecond';\n",
        "",
        "tests/store/postgres/test_postgres_store.py::"
        "test_heartbeats_and_layouts_are_on_the_servers_clock_and_age_out",
    ),
    one(
        "PostgreSQL's liveness reports a cleanly stopped dispatcher as running",
        "ping and top tell a dispatcher that stopped cleanly from one that runs",
        PKG + "store/postgres/store.py",
        "[(n, ms) for n, ms, alive in beats if alive],",
        "[(n, ms) for n, ms, alive in beats],",
        "tests/store/postgres/test_postgres_store.py::"
        "test_heartbeats_and_layouts_are_on_the_servers_clock_and_age_out",
    ),
    one(
        "the PostgreSQL record sweep deletes a window in progress",
        "a window in progress (dispatching, queued, claimed, stale) is never swept",
        PKG + "store/postgres/functions/debounce_sweep.sql",
        "        WHERE t.state IN ('finished', 'quarantined') AND t.until <= v_now",
        "        WHERE t.until <= v_now",
        "tests/store/postgres/test_postgres_store.py::"
        "test_the_record_sweep_deletes_records_past_their_ttl_in_batches_and_nothing_live",
    ),
    one(
        "the PostgreSQL record sweep deletes every record at once",
        "the record sweep deletes in batches (a bounded transaction per call)",
        PKG + "store/postgres/functions/debounce_sweep.sql",
        "        WHERE t.state IN ('finished', 'quarantined') AND t.until <= v_now\n"
        "        LIMIT p_limit FOR UPDATE SKIP LOCKED",
        "        WHERE t.state IN ('finished', 'quarantined') AND t.until <= v_now\n"
        "        FOR UPDATE SKIP LOCKED",
        "tests/store/postgres/test_postgres_store.py::"
        "test_the_record_sweep_deletes_records_past_their_ttl_in_batches_and_nothing_live",
    ),
    one(
        "the PostgreSQL dispatcher's periodic sweep leaves finished records",
        "finished records leave the PostgreSQL tables past their TTL, as they leave Redis",
        PKG + "store/postgres/functions/debounce_expire.sql",
        "    PERFORM debounce_sweep(p_sweep);\n",
        "",
        "tests/store/postgres/test_postgres_store.py::"
        "test_the_dispatchers_expiry_sweep_runs_the_record_sweep",
    ),
    one(
        "a quarantined PostgreSQL record is swept at its lease's end",
        "a quarantined record is kept for an operator (Redis: no TTL)",
        PKG + "store/postgres/functions/debounce_quarantine.sql",
        "reason = p_reason, until = 'infinity'",
        "reason = p_reason",
        "tests/store/postgres/test_postgres_store.py::"
        "test_the_record_sweep_deletes_records_past_their_ttl_in_batches_and_nothing_live",
    ),
    one(
        "a quarantined PostgreSQL window is taken again after its lease",
        "a quarantined window leaves the take for good",
        PKG + "store/postgres/functions/debounce_quarantine.sql",
        "    UPDATE debounce_taken t SET state = 'quarantined', reason = p_reason,",
        "    UPDATE debounce_taken t SET state = 'dispatching', reason = p_reason,",
        PGC + "test_a_quarantined_window_leaves_the_take_for_good_with_its_callers_ids[postgres]",
    ),
    one(
        "a lapsed PostgreSQL claim of the last delivery goes stale",
        'rule "every id resolves": the whole worker killed on the last delivery (PostgreSQL)',
        PKG + "store/postgres/functions/debounce_take.sql",
        "                     WHEN t.last_delivery THEN 'queued' ELSE 'stale' END,",
        "                     WHEN false THEN 'queued' ELSE 'stale' END,",
        PGC + "test_a_lapsed_claim_of_the_last_delivery_is_finished_revoked_by_the_expiry_sweep"
        "[postgres]",
    ),
    one(
        "a read-only PostgreSQL server's refusal is a raw psycopg error",
        "a read-only server (a standby) is ServerRefused, nothing written",
        PKG + "store/postgres/sending.py",
        "        if state.startswith(REFUSED):",
        "        if False:",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_read_only_server_refuses_every_write_typed_and_writes_nothing",
    ),
    one(
        "a PostgreSQL statement timeout is taken for a lost reply",
        "a call the server cancelled and undid is StoreUnavailable, not OutcomeUnknown",
        PKG + "store/postgres/sending.py",
        "        if state.startswith(UNDONE):",
        "        if False:",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_call_blocked_past_the_statement_timeout_is_unavailable_and_writes_nothing",
    ),
    one(
        "a PostgreSQL call blocked on a lock waits past the store's timeout",
        "a call blocked on the server fails within the store's timeout (statement_timeout)",
        PKG + "store/postgres/sending.py",
        "    \"SELECT set_config('statement_timeout', %s, true), \"\n",
        "    \"SELECT set_config('statement_timeout', '0', %s IS NULL), \"\n",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_call_blocked_past_the_statement_timeout_is_unavailable_and_writes_nothing",
    ),
    one(
        "a PostgreSQL call the watchdog ends leaves its backend waiting on the server",
        "no backend outlives its call: a commit waiting for a synchronous standby is "
        "cancelled on the server when the call's wait ends, so the waiting backends never "
        "exceed the pool's size",
        PKG + "store/postgres/watchdog.py",
        "        _cancels.put_nowait(conn)\n",
        "        _cancels.put_nowait(None and conn)\n",
        "tests/store/postgres/test_postgres_deployed.py::"
        "test_a_synchronous_standbys_outage_leaves_no_backend_waiting_past_its_call",
    ),
    one(
        "a key holding NUL reaches the store",
        "one key, every store: a key PostgreSQL cannot hold is refused by name on every "
        "store, nothing written",
        PKG + "producer/key_templates.py",
        '    if "\\x00" in key:  # PostgreSQL\'s text cannot hold it: refused on every '
        "store alike\n",
        '    if "\\x00" in key and False:\n',
        HOSTILE + "test_bad_input_raises_and_writes_nothing[redis-NUL in a templated key]",
        "tests/system/test_postgres_e2e.py::"
        "test_a_key_is_accepted_or_refused_alike_on_redis_and_on_postgres[key0]",
    ),
    one(
        "a misconfigured PostgreSQL connection is waited for as an outage",
        "a misconfiguration is not an outage: a wrong password, an unknown role or "
        "database is raised at once by name, never published plainly",
        PKG + "store/postgres/link.py",
        "        if any(part in lowered for part in MISCONFIGURED):\n",
        "        if False:\n",
        "tests/store/postgres/test_postgres_deployed.py::"
        "test_a_misconfigured_connection_is_raised_at_once_by_name_never_as_an_outage",
        "tests/system/test_postgres_e2e.py::"
        "test_a_misconfigured_store_is_raised_by_name_even_when_outages_publish",
    ),
    one(
        "the PostgreSQL pool hands out its idle connections in queue order",
        "a sequential caller stays on one warm backend (performance, row 12g)",
        PKG + "store/postgres/reuse.py",
        "        self.appendleft(item)\n",
        "        super().append(item)\n",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_caller_one_call_at_a_time_stays_on_one_backend_of_several_idle",
    ),
    one(
        "the PostgreSQL store quotes a text value by wrapping it in quotes",
        "user keys and arguments never become SQL (no injection through a quote)",
        PKG + "store/postgres/simple_query.py",
        '        return b"\'" + text.replace("\'", "\'\'").encode() + b"\'"\n',
        '        return b"\'" + text.encode() + b"\'"\n',
        "tests/store/postgres/test_simple_query.py::"
        "test_a_value_comes_back_as_the_cursor_sends_and_reads_it",
    ),
    one(
        "a refused PostgreSQL connection is waited for until the pool's timeout",
        "a store outage is an error the caller sees in well under a second when nothing listens",
        PKG + "store/postgres/sending.py",
        "            self.link.raise_if_hopeless()\n",
        "            pass\n",
        "tests/store/postgres/test_postgres_deployed.py::"
        "test_a_refused_connection_is_an_outage_in_well_under_a_second",
    ),
    one(
        "a PostgreSQL migration waits for its table locks as long as the statement runs",
        "a migration on a live database holds calls up briefly, retries, and names the "
        "sessions that keep it from its locks",
        PKG + "store/postgres/store.py",
        "            \"SELECT set_config('lock_timeout', %s, true)\", "
        '(f"{MIGRATE_LOCK_TIMEOUT_MS}ms",)\n',
        '            "SELECT set_config(\'lock_timeout\', %s, true)", ("0",)\n',
        "tests/store/postgres/test_postgres_store.py::"
        "test_migrate_beside_a_session_idle_in_transaction_holds_calls_up_briefly_and_names_it",
    ),
    one(
        "the PostgreSQL store's grants leave out a right the workers need",
        "the store runs as the documented least-privileged role after migrate --grant-to",
        PKG + "store/postgres/schema.py",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role};",
        "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {schema} TO {role};",
        "tests/system/test_postgres_e2e.py::"
        "test_the_least_privileged_role_runs_every_part_after_migrate_grants_it",
    ),
    one(
        "a PostgreSQL take waits for a due window another transaction holds",
        "a held row keeps back only its own window: the take returns the other due windows at once",
        PKG + "store/postgres/functions/debounce_take.sql",
        "        LIMIT greatest(p_batch - (SELECT count(*) FROM lapsed), 0)\n"
        "        FOR UPDATE SKIP LOCKED\n",
        "        LIMIT greatest(p_batch - (SELECT count(*) FROM lapsed), 0)\n        FOR UPDATE\n",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_take_skips_a_due_window_another_transaction_holds_and_returns_the_others_at_once"
        "[due]",
    ),
    one(
        "a PostgreSQL take waits for a flushed window another transaction holds",
        "a held row keeps back only its own window: the take returns the other closed "
        "windows at once",
        PKG + "store/postgres/functions/debounce_take.sql",
        '        ORDER BY t.until, t.task_id COLLATE "C" LIMIT p_batch FOR UPDATE SKIP LOCKED\n',
        '        ORDER BY t.until, t.task_id COLLATE "C" LIMIT p_batch FOR UPDATE\n',
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_take_skips_a_due_window_another_transaction_holds_and_returns_the_others_at_once"
        "[flushed]",
    ),
    one(
        "a PostgreSQL gate reads the transaction's start for its clock",
        "a call's window is measured from when it is gated: in a bulk chunk waiting on a "
        "lock, the later calls keep their whole window",
        PKG + "store/postgres/functions/debounce_gate.sql",
        "#variable_conflict use_column\nDECLARE\n    v_now timestamptz := clock_timestamp();\n"
        "    v_id text;\n    v_row record;\n    v_quiet record;",
        "#variable_conflict use_column\nDECLARE\n    v_now timestamptz := now();\n"
        "    v_id text;\n    v_row record;\n    v_quiet record;",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_bulk_chunk_waiting_on_one_calls_lock_gives_the_later_calls_their_whole_window",
    ),
    one(
        "a PostgreSQL exclusive key stays taken after its claim lapsed",
        "a lapsed claim frees its exclusive key: the held follow-up runs",
        PKG + "store/postgres/functions/debounce_running.sql",
        "                     AND t.state IN ('dispatching', 'queued', 'claimed'))",
        "                     AND t.state IN ('dispatching', 'queued', 'claimed', 'stale'))",
        PGC + "test_a_lapsed_claim_of_an_exclusive_window_frees_its_key_for_the_held_follow_up"
        "[postgres]",
    ),
    one(
        "the PostgreSQL store lets the driver prepare statements on the server",
        "behind PgBouncer in transaction mode each call runs its own statement: no "
        "server-side prepared statement another client's of the same name could replace",
        PKG + "store/postgres/store.py",
        '            "prepare_threshold": None,\n',
        '            "prepare_threshold": 5,\n',
        "tests/store/postgres/test_postgres_pgbouncer.py::"
        "test_a_claim_renewal_shares_a_server_connection_and_renews_its_claim",
        "tests/store/postgres/test_postgres_pgbouncer.py::"
        "test_racing_calls_through_the_bouncer_raise_no_driver_error",
        "tests/store/postgres/test_postgres_pgbouncer.py::"
        "test_a_call_leaves_its_server_connection_free_when_it_ends",
    ),
    one(
        "the PostgreSQL store pipelines a call with its settings",
        "behind PgBouncer a call's last message ends its transaction: no Flush after it "
        "holds the server connection while other clients wait",
        PKG + "store/postgres/sending.py",
        "            rows = simple_query(conn, sql, params)\n            if rows is UNQUOTABLE:",
        "            with conn.pipeline():\n"
        "                conn.execute(self.locals_sql, self.locals)\n"
        "                rows = conn.execute(work.sql, work.params)\n"
        "            rows = rows.fetchall()\n"
        "            if False:",
        "tests/store/postgres/test_postgres_pgbouncer.py::"
        "test_a_call_leaves_its_server_connection_free_when_it_ends",
    ),
    one(
        "a PostgreSQL take ignores its byte budget",
        "a take is bounded by bytes as well as by count: a backlog of large windows drains",
        PKG + "store/postgres/functions/debounce_take.sql",
        "        WHERE p_max_bytes IS NULL\n           OR c.before",
        "        WHERE true\n           OR c.before",
        PGC + "test_a_take_stops_once_its_bodies_reach_its_bytes[postgres]",
    ),
    one(
        "a Redis take ignores its byte budget",
        "a take is bounded by bytes as well as by count: a backlog of large windows drains",
        PKG + "store/redis/lua/take.lua",
        "    if bytes >= max_bytes then\n      break  -- the reply's bytes are reached: the rest "
        "stay due",
        "    if false then\n      break  -- the reply's bytes are reached: the rest stay due",
        PGC + "test_a_take_stops_once_its_bodies_reach_its_bytes[redis]",
    ),
    one(
        "a PostgreSQL take retakes lapsed leases past its byte budget",
        "a take is bounded by bytes as well as by count: a backlog of large windows drains",
        PKG + "store/postgres/functions/debounce_take.sql",
        "        WHERE p_max_bytes IS NULL OR l.before < p_max_bytes\n",
        "        WHERE true\n",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_take_stops_at_its_byte_budget_the_first_window_whatever_its_size",
        "tests/store/postgres/test_postgres_store.py::test_a_backlog_of_large_windows_drains_over_a_slow_link",
    ),
    one(
        "a failed PostgreSQL take does not shrink the next",
        "a take that the link could not carry within the timeout is followed by smaller ones",
        PKG + "store/postgres/store.py",
        "            self.take_bytes = max(1, budget // 2)\n",
        "            self.take_bytes = budget\n",
        "tests/store/postgres/test_postgres_store.py::test_a_backlog_of_large_windows_drains_over_a_slow_link",
    ),
    one(
        "the PostgreSQL store sets its timeout on the session",
        "behind PgBouncer the store's settings last for its own transaction: another "
        "application on the pool keeps the server's",
        PKG + "store/postgres/sending.py",
        "    \"SELECT set_config('statement_timeout', %s, true), \"\n",
        "    \"SELECT set_config('statement_timeout', %s, false), \"\n",
        "tests/store/postgres/test_postgres_pgbouncer.py::"
        "test_the_store_leaves_no_setting_on_a_shared_server_connection",
    ),
    one(
        "a PostgreSQL dispatcher trusts a LISTEN that never hears its own NOTIFY",
        "behind a pooler in transaction mode the dispatcher polls and says so; it never "
        "waits for a wake-up that cannot arrive",
        PKG + "store/postgres/wake.py",
        "        if arrived:\n",
        "        if True:\n",
        "tests/store/postgres/test_postgres_pgbouncer.py::"
        "test_a_dispatcher_behind_the_bouncer_polls_and_says_so",
    ),
    one(
        "a PostgreSQL pool waits past the store's timeout for a connection",
        "no connection to be had is StoreUnavailable within the store's timeout",
        PKG + "store/postgres/sending.py",
        "        deadline = time.monotonic() + self.timeout\n",
        "        deadline = time.monotonic() + self.timeout * 4\n",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_pool_that_cannot_give_a_connection_in_time_is_unavailable",
    ),
    one(
        "a timed-out handshake or command is retried by the client",
        "a Redis that accepts connections and never answers costs a call one timeout, not two",
        PKG + "store/redis/connect.py",
        "ExponentialBackoff(cap=0.5, base=0.05), 1, supported_errors=(redis.ConnectionError,)",
        "ExponentialBackoff(cap=0.5, base=0.05),\n        1,",
        "tests/store/redis/test_connect_timeout.py::"
        "test_a_silent_redis_costs_the_first_call_one_timeout_not_two",
    ),
    one(
        "the last delivery a quorum queue allows is taken for one before it",
        'rule "every id resolves": a window requeued on its last delivery is finished',
        PKG + "worker/deliveries.py",
        "    if limit is None or int(count) < limit:",
        "    if limit is None or int(count) <= limit:",
        "tests/dispatch/test_quorum_queues.py::"
        "test_a_window_requeued_on_its_last_delivery_resolves_its_ids_and_frees_its_key",
    ),
    one(
        "a pool child lost on a quorum queue's last delivery only ends its claim",
        'rule "every id resolves": a window put back on its last delivery is finished',
        PKG + "worker/request.py",
        'elif getattr(self, "_debounce_requeued", False) and (gone := dropped_delivery(',
        "elif False and (gone := dropped_delivery(",
        "tests/dispatch/test_quorum_queues.py::"
        "test_a_pool_child_lost_on_the_last_delivery_resolves_its_window",
    ),
    one(
        "a lapsed claim of a quorum queue's last delivery goes stale",
        'rule "every id resolves": the whole worker killed on the last delivery',
        LUA + "take.lua",
        "    elseif redis.call('HGET', key, 'lv') then",
        "    elseif false then",
        "tests/dispatch/test_quorum_queues.py::"
        "test_the_whole_worker_killed_on_the_last_delivery_resolves_its_window",
    ),
    one(
        "store_for ignores debounce_store_url: always the Redis store",
        "debounce_store_url = 'postgresql://...' keeps the windows in PostgreSQL (docs/stores.md)",
        PKG + "store/factory.py",
        "    if settings.postgres_url is None:\n        from .redis.store import WindowStore\n",
        "    if True:\n        from .redis.store import WindowStore\n",
        "tests/system/test_postgres_e2e.py::test_a_real_worker_runs_debounced_windows_from_postgres",
    ),
    Mutation(
        "a PostgreSQL collect window's body is built in the take's own statement",
        "a collect call committed while the take ran is in the body it took (PostgreSQL)",
        (
            Edit(
                PKG + "store/postgres/functions/debounce_take.sql",
                "               m.content_type, m.payload, m.options_json, 'dispatching', v_now,"
                " v_until, 1,",
                "               m.content_type, CASE WHEN m.collect_budget IS NULL THEN m.payload"
                " ELSE '\\x5b5b5b'::bytea || (SELECT string_agg(c.element, '\\x2c'::bytea"
                " ORDER BY c.seq) FROM debounce_calls c WHERE c.task_id = m.task_id)"
                " || '\\x5d5d2c7b7d2c'::bytea || m.payload || '\\x5d'::bytea END,"
                " m.options_json, 'dispatching', v_now, v_until, 1,",
            ),
            Edit(
                PKG + "store/postgres/functions/debounce_take.sql",
                "        PERFORM debounce_splice(v_collect);",
                "        DELETE FROM debounce_calls c WHERE c.task_id = ANY (v_collect);",
            ),
        ),
        (
            "tests/store/postgres/test_postgres_store.py::"
            "test_a_collect_call_committed_while_the_take_ran_is_in_the_body_it_took",
        ),
    ),
    one(
        "a cancelled PostgreSQL collect window's calls stay behind",
        "a cancelled collect window leaves nothing behind (PostgreSQL)",
        PKG + "store/postgres/functions/debounce_cancel.sql",
        "    DELETE FROM debounce_calls c USING debounce_cancelled k\n",
        "    SELECT FROM debounce_calls c, debounce_cancelled k\n",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_cancelled_collect_window_leaves_no_calls_behind",
    ),
    one(
        "a full PostgreSQL collect window is joined past its budget",
        "a collect window's body is never over debounce_max_payload_bytes (PostgreSQL)",
        PKG + "store/postgres/functions/debounce_gate.sql",
        "               OR w.collect_bytes + 1 + octet_length(v_element) <= w.collect_budget)",
        "               OR true)",
        PGC + "test_a_collect_window_full_by_bytes_is_due_at_once_and_the_call_opens_the_next"
        "[postgres]",
    ),
    one(
        "a PostgreSQL call of the other collect mode joins the open window",
        "a call of the other mode closes the open window and opens its own (PostgreSQL)",
        PKG + "store/postgres/functions/debounce_gate.sql",
        "        WHERE (w.collect_budget IS NULL) = (p_budget IS NULL)\n",
        "        WHERE true\n",
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_collect_window_closes_at_its_cap_and_a_call_of_the_other_mode_opens_its_own",
    ),
    one(
        "a PostgreSQL window taken again after its lease is counted again",
        "stats: a window is counted once, when first taken (PostgreSQL)",
        PKG + "store/postgres/functions/debounce_take.sql",
        "                 UNION ALL SELECT r.task_id FROM retaken r WHERE r.tries = 1),",
        "                 UNION ALL SELECT r.task_id FROM retaken r),",
        PGC + "test_a_window_is_counted_once_when_first_taken_and_a_reset_returns_the_counters"
        "[postgres]",
    ),
    one(
        "a flushed or capped PostgreSQL window is never counted",
        "stats: a window closed by a flush or its cap is counted when taken (PostgreSQL)",
        PKG + "store/postgres/functions/debounce_take.sql",
        "                 UNION ALL SELECT r.task_id FROM retaken r WHERE r.tries = 1),",
        "                 ),",
        PGC + "test_a_window_is_counted_once_when_first_taken_and_a_reset_returns_the_counters"
        "[postgres]",
    ),
    one(
        "the PostgreSQL gate counts no suppressed call",
        "stats: calls in and suppressed calls are counted at the gate (PostgreSQL)",
        PKG + "store/postgres/functions/debounce_gate.sql",
        "                PERFORM debounce_count_call(p_ident, true, v_now);\n",
        "",
        PGC + "test_leading_only_runs_the_first_call_and_suppresses_the_quiet_period[postgres]",
    ),
    one(
        "PostgreSQL counters reset by a statement that loses the last increments",
        "stats --reset returns every counter it zeroed (PostgreSQL)",
        PKG + "store/postgres/stats.py",
        '    "SELECT name, sum(n) FROM gone WHERE live GROUP BY name"',
        '    "SELECT name, max(n) FROM gone WHERE live GROUP BY name"',
        PGC + "test_a_window_is_counted_once_when_first_taken_and_a_reset_returns_the_counters"
        "[postgres]",
    ),
    one(
        "a PostgreSQL chunk gates its calls in the caller's order",
        "enqueue_many on PostgreSQL: chunks sharing keys never deadlock (ident order)",
        PKG + "store/postgres/functions/debounce_gate_many.sql",
        "               ORDER BY o.ident, o.k LOOP",
        "               ORDER BY o.k LOOP",
        "tests/store/postgres/test_postgres_store.py::"
        "test_concurrent_chunks_of_the_same_keys_in_opposite_orders_never_deadlock",
    ),
    one(
        "a refused call undoes its whole PostgreSQL chunk",
        "enqueue_many on PostgreSQL: a refused call keeps out only itself",
        PKG + "store/postgres/functions/debounce_gate_many.sql",
        "        EXCEPTION WHEN SQLSTATE 'DBA01' OR SQLSTATE 'DBR01' OR SQLSTATE 'DBP01' THEN",
        "        EXCEPTION WHEN SQLSTATE 'XX999' THEN",
        "tests/store/postgres/test_postgres_store.py::"
        "test_gate_many_gates_each_call_in_order_and_a_refused_one_keeps_out_only_itself",
    ),
    one(
        "a PostgreSQL chunk's calls are never counted",
        "stats: every call of an enqueue_many chunk is counted (PostgreSQL)",
        PKG + "store/postgres/functions/debounce_gate_many.sql",
        "    IF cardinality(v_idents) > 0 THEN\n",
        "    IF false THEN\n",
        "tests/store/postgres/test_postgres_store.py::"
        "test_gate_many_sends_a_chunk_in_one_statement_and_counts_every_call",
    ),
    one(
        "PostgreSQL reads a task name out of an ident by bytes, and errs on a cut character",
        "one malformed window never fails the take of the others (PostgreSQL counters)",
        PKG + "store/postgres/functions/debounce_task_of.sql",
        "    IF octet_length(left(v_rest, v_n)) = v_n THEN  -- one byte a character: the usual\n"
        "        RETURN left(v_rest, v_n);\n",
        "    IF true THEN\n"
        "        RETURN convert_from(substring(convert_to(v_rest, 'UTF8') FOR v_n), 'UTF8');\n",
        "tests/store/postgres/test_postgres_store.py::"
        "test_the_task_name_is_read_out_of_any_ident_and_a_malformed_one_fails_nothing",
    ),
    one(
        "a Django migration applies its schema step to a database already past it",
        "manage.py migrate and celery debounce migrate agree, in either order (PostgreSQL)",
        PKG + "contrib/django/migrations/__init__.py",
        "            steps = schema.steps_to(found, version)\n",
        "            steps = schema.steps_to(None, version)\n",
        "tests/system/test_postgres_e2e.py::"
        "test_django_migrations_create_and_upgrade_the_schema_and_agree_with_migrate",
    ),
    one(
        "a PostgreSQL store made before gevent patched select is kept",
        "a call waiting on PostgreSQL never blocks the other greenlets (gevent patched late)",
        PKG + "store/factory.py",
        "    if cached is not None and cached[0] == pid and outdated(cached[1]):\n",
        "    if False:\n",
        "tests/system/test_postgres_e2e.py::"
        "test_greenlets_wait_for_postgres_without_blocking_each_other[late]",
    ),
    one(
        "psycopg keeps the blocking wait it chose before gevent patched select",
        "a call waiting on PostgreSQL never blocks the other greenlets (gevent patched late)",
        PKG + "store/postgres/app.py",
        "        waiting.wait = waiting.wait_poll\n",
        "        pass\n",
        "tests/system/test_postgres_e2e.py::"
        "test_greenlets_wait_for_postgres_without_blocking_each_other[late]",
    ),
    one(
        "a forked child closes its parent's store made before gevent patched select",
        "a child patched by gevent after a fork leaves its parent's connections alone",
        PKG + "store/factory.py",
        "    if cached is not None and cached[0] == pid and outdated(cached[1]):\n",
        "    if cached is not None and outdated(cached[1]):\n",
        "tests/system/test_postgres_e2e.py::"
        "test_a_child_patched_after_a_fork_leaves_its_parents_postgres_connections_alone",
    ),
    one(
        "a full disk is not a refusal on PostgreSQL (a raw psycopg error)",
        "a full disk is a clear error within the timeout, nothing written (PostgreSQL)",
        PKG + "store/postgres/sending.py",
        'REFUSED = ("25006", "53", "57P03")\n',
        'REFUSED = ("25006", "57P03")\n',
        "tests/store/postgres/test_postgres_store.py::"
        "test_a_full_disk_refuses_the_call_typed_and_writes_nothing_then_calls_go_on",
    ),
    one(
        "a task definition carries no route",
        "a Node call by task name runs on the task's routed queue",
        PKG + "producer/published.py",
        "        app, task.name, task, spec, (), {}, dict(exec_defaults(task)), None\n",
        "        None, task.name, task, spec, (), {}, dict(exec_defaults(task)), None\n",
        "tests/producer/test_published.py::"
        "test_a_definition_holds_the_options_signature_route_and_settings_of_its_task",
    ),
    one(
        "a float default with an integral value is published as usable",
        "a Node call never digests 1 where Python digests 1.0 (another window)",
        PKG + "producer/published.py",
        "        return math.isfinite(value) and not value.is_integer()\n",
        "        return math.isfinite(value)\n",
        "tests/producer/test_published.py::"
        "test_a_default_no_other_language_can_hold_as_python_does_is_marked_unusable",
    ),
    one(
        "workers do not publish the task definitions as they start",
        "a Node call by task name finds the definition of every task a worker runs",
        PKG + "producer/worker_steps.py",
        '        app.steps["worker"].add(PublishDefinitionsStep)\n',
        "        pass\n",
        "tests/producer/test_published.py::"
        "test_publish_writes_what_changed_and_a_worker_writes_them_as_it_starts",
    ),
    one(
        "the Redis store rewrites every definition it is given",
        "publish writes only what is new or changed",
        PKG + "store/redis/store.py",
        "                if old is None or as_text(old) != definitions[name]\n",
        "                if True\n",
        "tests/store/contract/test_contract.py::"
        "test_task_definitions_are_written_when_new_or_changed_and_read_back_by_name[redis]",
    ),
    one(
        "the PostgreSQL store rewrites every definition it is given",
        "publish writes only what is new or changed",
        PKG + "store/postgres/definitions.py",
        '"written_at = clock_timestamp() WHERE t.definition IS DISTINCT FROM excluded.definition "',
        '"written_at = clock_timestamp() "',
        "tests/store/contract/test_contract.py::"
        "test_task_definitions_are_written_when_new_or_changed_and_read_back_by_name[postgres]",
    ),
    one(
        "gate.lua's calls-in counter leaves a new stats hash without a TTL",
        "bounded keys: nothing the package writes lives forever",
        LUA + "gate.lua",
        "== 1 and redis.call('PTTL', stats) == -1 then",
        "== 1 and redis.call('PTTL', stats) == -2 then",
        "tests/store/redis/test_scripts.py::"
        "test_the_calls_in_counter_never_leaves_the_stats_hash_without_a_ttl[redis-server]",
    ),
    one(
        "a PostgreSQL claim's renewal waits for the pool (its reconnects back off)",
        "a claim outlives a link refused for less than its lease, on every store",
        PKG + "store/postgres/runs.py",
        "        self._write_now(\n            one(_RENEW",
        "        self._write(\n            one(_RENEW",
        "tests/worker/test_lease_budget.py::"
        "test_a_claim_outlives_a_link_refused_for_half_its_lease[postgres]",
    ),
]
