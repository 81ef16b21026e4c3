// Task definitions (docs/contract.md, section 7): a call by task name reads the
// definition the Python app published in <prefix>:tasks, against a real redis-server.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import Redis from "ioredis";
import {
  CONTRACT_VERSION, DEFINITION_FORMAT, DebounceBackendError, DebounceConfigError,
  DebounceEncodeError, DebouncePayloadError, debounceMany,
  DebounceContractMismatch, DebounceKeyError, debounce, flushWindow, gate, pendingWindow, prepare,
} from "../dist/esm/index.js";
import { silentServer, startRedis } from "./redis-server.mjs";

let server;
const clients = [];

before(async () => { server = await startRedis(); });
after(() => { for (const c of clients) c.disconnect(); server?.stop(); });

/** A fresh client (the definition cache is per client) on an emptied database. */
async function fresh() {
  const client = new Redis({ port: server.port, host: "127.0.0.1" });
  clients.push(client);
  await client.flushdb();
  return client;
}

/** A definition as producer/published.py writes it, with `fields` replaced. */
function definition(task, fields = {}) {
  return {
    format: DEFINITION_FORMAT, contract: CONTRACT_VERSION, version: "0123456789abcdef", task,
    debounce_ms: 300000, max_wait_ms: 1800000, key: null, replace_payload: false,
    max_calls: null, leading: false, trailing: true, collect: false, exclusive: false,
    options: '{"queue": "reports", "priority": 7}', accepts_json: true, check_arguments: true,
    signature: [
      { name: "user_id", kind: "positional_or_keyword" },
      { name: "n", kind: "positional_or_keyword", default: 0 },
    ],
    shards: 1, max_key_length: 1024, max_payload_bytes: 1048576, history_ttl_ms: 3600000,
    result_expires_ms: 86400000, ...fields,
  };
}

const publish = (client, task, fields, prefix = "debounce") =>
  client.hset(`${prefix}:tasks`, task, JSON.stringify(definition(task, fields)));

test("a call with no options takes the task's window, route and binding", async () => {
  const redis = await fresh();
  await publish(redis, "proj.digest");
  const a = await gate(redis, "proj.digest", { args: ["u1"] });
  const b = await gate(redis, "proj.digest", { kwargs: { user_id: "u1" } });
  const c = await gate(redis, "proj.digest", { args: ["u1", 0] });
  assert.ok(a.opened && !b.opened && !c.opened);
  assert.equal(new Set([a.taskId, b.taskId, c.taskId]).size, 1);
  assert.equal(a.deadlineMs - a.nowMs, 300000);
  const [open] = await redis.keys("debounce:{0}:open:*");
  assert.deepEqual(JSON.parse(await redis.hget(open, "o")), { queue: "reports", priority: 7 });
  assert.equal(await redis.hget(open, "mw"), "1800000");
});

test("onOutage \"publish\": a task whose options a plain message cannot carry is refused on every call", async () => {
  const redis = await fresh();
  await publish(redis, "proj.zipped", { options: '{"queue": "reports", "compression": "zlib"}' });
  const options = { onOutage: "publish", publish: async () => {} };
  for (const attempt of [() => debounce(redis, "proj.zipped", { args: ["u1"] }, options),
    () => debounceMany(redis, "proj.zipped", [{ args: ["u1"] }], options)]) {
    await assert.rejects(attempt(), (exc) => exc instanceof DebounceConfigError &&
      /cannot publish a plain message with the option\(s\) compression/.test(exc.message));
  }
  assert.deepEqual(await redis.keys("debounce:{0}:open:*"), []);  // nothing written
  assert.equal(typeof await debounce(redis, "proj.zipped", { args: ["u1"] }), "string");  // "raise"
});

test("options on the call override the task's", async () => {
  const redis = await fresh();
  await publish(redis, "proj.digest", { key: "d:{user_id}" });
  const r = await gate(redis, "proj.digest", { args: ["u1"] }, { debounce: "2s", key: "{0}!" });
  assert.equal(r.deadlineMs - r.nowMs, 2000);
  assert.equal(await redis.exists("debounce:{0}:open:11:proj.digest:u1!"), 1);
});

test("the cap and the leading edge of the definition reach the gate", async () => {
  const redis = await fresh();
  await publish(redis, "proj.capped", { max_calls: 2, key: "{0}" });
  await publish(redis, "proj.lead", { leading: true, key: "{0}" });
  await debounce(redis, "proj.capped", { args: ["u"] });
  await debounce(redis, "proj.capped", { args: ["u"] });
  assert.equal(await redis.exists("debounce:{0}:open:11:proj.capped:u"), 0);  // closed by its cap
  const first = await gate(redis, "proj.lead", { args: ["u"] });
  const second = await gate(redis, "proj.lead", { args: ["u"] });
  assert.equal(first.edge, "lead");
  assert.equal(second.edge, "");
  assert.notEqual(first.taskId, second.taskId);  // the quiet period's trailing window
});

test("a task without a definition needs debounce and maxWait, naming prefix and database", async () => {
  const redis = await fresh();
  await publish(redis, "proj.digest", {}, "other");
  await assert.rejects(debounce(redis, "proj.digest", { args: ["u1"] }),
    (exc) => exc instanceof DebounceConfigError && /no definition.*prefix.*database/.test(exc.message));
  assert.equal(await redis.exists("debounce:tasks"), 0);
  assert.deepEqual(await redis.keys("debounce:{*"), []);
  const id = await debounce(redis, "proj.digest", { args: ["u1"] }, { debounce: "1m", maxWait: "5m" });
  assert.equal(typeof id, "string");
});

test("what this producer cannot call as Python would is refused, nothing written", async () => {
  const redis = await fresh();
  await publish(redis, "proj.gather", { collect: true, signature: null });
  await publish(redis, "proj.pickled", { accepts_json: false });
  await publish(redis, "proj.newer", { contract: CONTRACT_VERSION + 1 });
  await publish(redis, "proj.format", { format: DEFINITION_FORMAT + 1 });
  await publish(redis, "proj.excl", { exclusive: true });
  await publish(redis, "proj.dated", { signature: [
    { name: "user_id", kind: "positional_or_keyword" },
    { name: "when", kind: "positional_or_keyword", default_unusable: true }] });
  const refused = async (task, call, options, check) =>
    assert.rejects(debounce(redis, task, call, options), check);
  await refused("proj.gather", { args: ["u"] }, { leading: true },
    (e) => e instanceof DebounceConfigError && /debounce_collect/.test(e.message));
  await refused("proj.pickled", { args: ["u"] }, undefined,
    (e) => e instanceof DebounceConfigError && /accept_content/.test(e.message));
  await refused("proj.newer", { args: ["u"] }, undefined,
    (e) => e instanceof DebounceContractMismatch && e.gate === String(CONTRACT_VERSION + 1));
  await refused("proj.format", { args: ["u"] }, undefined,
    (e) => e instanceof DebounceConfigError && /format/.test(e.message));
  await refused("proj.excl", { args: ["u"] }, { leading: true },
    (e) => e instanceof DebounceConfigError && /exclusive/.test(e.message));
  await refused("proj.dated", { args: ["u"] }, undefined,
    (e) => e instanceof DebounceConfigError && /"when"/.test(e.message));
  await refused("proj.digest", { args: ["u"] }, { maxCalls: 0, debounce: "1s", maxWait: "1s" },
    (e) => e instanceof DebounceConfigError && /maxCalls=0/.test(e.message));
  assert.deepEqual(await redis.keys("debounce:{*"), []);
  // with the date given, the call fits
  assert.equal(typeof await debounce(redis, "proj.dated", { args: ["u", "2026-01-01"] }), "string");
});

test("arguments that do not fit the signature: refused where the task checks them", async () => {
  const redis = await fresh();
  await publish(redis, "proj.checked");
  await publish(redis, "proj.loose", { check_arguments: false });
  await publish(redis, "proj.keyed", { check_arguments: false, key: "{user_id}" });
  await assert.rejects(debounce(redis, "proj.checked", { args: ["u"], kwargs: { nope: 1 } }),
    (e) => e instanceof DebounceConfigError && /unexpected keyword argument "nope"/.test(e.message));
  await assert.rejects(debounce(redis, "proj.keyed", { kwargs: { nope: 1 } }),
    (e) => e instanceof DebounceKeyError);
  assert.equal(typeof await debounce(redis, "proj.loose", { kwargs: { nope: 1 } }), "string");
});

test("a changed definition is read again once older than definitionMaxAge", async () => {
  const redis = await fresh();
  await publish(redis, "proj.digest", { key: "a:{0}" });
  const options = { definitionMaxAge: "200ms" };
  await debounce(redis, "proj.digest", { args: ["u"] }, options);
  await publish(redis, "proj.digest", { key: "b:{0}" });
  await debounce(redis, "proj.digest", { args: ["u"] }, options);  // still the cached one
  assert.equal(await redis.exists("debounce:{0}:open:11:proj.digest:b:u"), 0);
  await new Promise((r) => setTimeout(r, 250));
  await debounce(redis, "proj.digest", { args: ["u"] }, options);
  assert.equal(await redis.exists("debounce:{0}:open:11:proj.digest:a:u"), 1);
  assert.equal(await redis.exists("debounce:{0}:open:11:proj.digest:b:u"), 1);
});

test("prepare binds against a definition given to it, as the vectors do", () => {
  const d = definition("proj.digest");
  const a = prepare("proj.digest", { args: ["u1"] }, undefined, false, d);
  const b = prepare("proj.digest", { kwargs: { user_id: "u1", n: 0 } }, undefined, false, d);
  assert.equal(a.ident, b.ident);
  assert.notEqual(a.body, b.body);  // the body keeps the call as made
  assert.equal(a.argv[6], '{"queue": "reports", "priority": 7}');
});

test("routing and exclusive given on the call override the task's", async () => {
  const redis = await fresh();
  await publish(redis, "proj.digest", { key: "{0}", options: '{"queue": "reports", "priority": 7}' });
  await debounce(redis, "proj.digest", { args: ["a"] }, { queue: "urgent", priority: 9 });
  assert.deepEqual(JSON.parse(await redis.hget("debounce:{0}:open:11:proj.digest:a", "o")),
    { queue: "urgent", priority: 9 });
  await debounce(redis, "proj.digest", { args: ["b"] }, { exclusive: true, routingKey: "rk" });
  assert.deepEqual(JSON.parse(await redis.hget("debounce:{0}:open:11:proj.digest:b", "o")),
    { queue: "reports", priority: 7, routing_key: "rk", headers: { debounce_exclusive: 1 } });
  await publish(redis, "proj.excl", { key: "{0}", exclusive: true,
    options: '{"headers": {"debounce_exclusive": 1}}' });
  await debounce(redis, "proj.excl", { args: ["c"] }, { exclusive: false });
  assert.equal(await redis.hget("debounce:{0}:open:9:proj.excl:c", "o"), null);  // {}: not stored
  for (const [options, pattern] of [[{ priority: 300 }, /priority=300/], [{ queue: "" }, /queue=""/],
    [{ exclusive: true, leading: true }, /exclusive with leading/], [{ onOutage: "publish" }, /onOutage/]]) {
    await assert.rejects(debounce(redis, "proj.digest", { args: ["d"] }, options),
      (e) => e instanceof DebounceConfigError && pattern.test(e.message));
  }
  assert.equal(await redis.exists("debounce:{0}:open:11:proj.digest:d"), 0);
});

test("after a call that waited its timeout, calls fail at once until one tries again", async () => {
  const silent = await silentServer();
  const mute = new Redis(silent.port, "127.0.0.1", { lazyConnect: true });
  mute.on("error", () => {});
  const options = { debounce: "1s", maxWait: "2s", timeout: "300ms", outageProbeInterval: "500ms" };
  const timed = async () => {
    const started = Date.now();
    const error = await debounce(mute, "proj.x", { args: [1] }, options).then(() => null, (e) => e);
    return [error, Date.now() - started];
  };
  try {
    const [first, waited] = await timed();
    assert.ok(first instanceof DebounceBackendError && waited >= 250, `${first} ${waited}`);
    const [fast, quick] = await timed();
    assert.ok(fast instanceof DebounceBackendError && /outageProbeInterval/.test(fast.message), `${fast}`);
    assert.ok(quick < 100, `${quick} ms`);
    await new Promise((r) => setTimeout(r, 550));
    const [probe, probed] = await timed();  // one call tries again, and waits
    assert.ok(probe instanceof DebounceBackendError && probed >= 250, `${probe} ${probed}`);
  } finally {
    mute.disconnect();
    silent.close();
  }
});

test("a window is read and flushed by the call that would join it", async () => {
  const redis = await fresh();
  await publish(redis, "proj.digest", { key: "d:{user_id}", record_ttl_ms: 60000 });
  assert.equal(await pendingWindow(redis, "proj.digest", { args: ["u1"] }), null);
  const id = await debounce(redis, "proj.digest", { args: ["u1"] });
  await debounce(redis, "proj.digest", { kwargs: { user_id: "u1" } });
  const read = await pendingWindow(redis, "proj.digest", { args: ["u1", 0] });
  assert.equal(read.taskId, id);
  assert.equal(read.calls, 2);
  assert.ok(read.deadlineMs - read.firstSeenMs >= 300000);  // the second call moved it
  assert.ok(read.deadlineMs - read.firstSeenMs < 301000);
  const flushed = await flushWindow(redis, "proj.digest", { kwargs: { user_id: "u1" } });
  assert.equal(flushed.taskId, id);
  assert.ok(flushed.deadlineMs <= read.deadlineMs);
  assert.equal(await redis.exists("debounce:{0}:open:11:proj.digest:d:u1"), 0);
  assert.equal(await redis.hget(`debounce:{0}:win:${id}`, "st"), "dispatching");
  const ttl = await redis.pttl(`debounce:{0}:win:${id}`);
  assert.ok(ttl > 0 && ttl <= 60000, String(ttl));
  assert.notEqual(await redis.zscore("debounce:{0}:leased", id), null);
  assert.equal(await pendingWindow(redis, "proj.digest", { args: ["u1"] }), null);
  assert.equal(await flushWindow(redis, "proj.digest", { args: ["u1"] }), null);
});

test("a call of a collect task is an element of its window's list, as Python's", async () => {
  const redis = await fresh();
  await publish(redis, "proj.gather", { collect: true, signature: null, key: "g:{user_id}",
    options: '{"headers": {"debounce_collect": 1}}' });
  const first = await gate(redis, "proj.gather", { kwargs: { user_id: "u", n: 1 } });
  const second = await gate(redis, "proj.gather", { kwargs: { user_id: "u", n: 2 } });
  assert.ok(first.opened && !second.opened && second.calls === 2);
  const open = "debounce:{0}:open:11:proj.gather:g:u";
  const list = await redis.hget(open, "cl");
  const elements = await redis.lrange(`debounce:{0}:calls:${list}`, 0, -1);
  assert.deepEqual(elements.map((e) => e.replace(/^\[\d+,/, "[")),
    ['[[], {"user_id": "u", "n": 1}]', '[[], {"user_id": "u", "n": 2}]']);
  assert.equal(await redis.hget(open, "cz"), "1048576");
  await assert.rejects(
    debounce(redis, "proj.gather", { kwargs: { user_id: "u", big: "x".repeat(2000) } },
      { maxPayloadBytes: 1000 }),
    (e) => e instanceof DebouncePayloadError);
});

test("collect: a task with no definition is declared collecting per call; one with a definition keeps its own", async () => {
  const redis = await fresh();
  const options = { debounce: "1m", maxWait: "5m", key: "g:{user_id}", collect: true };
  const first = await gate(redis, "proj.unpublished", { kwargs: { user_id: "u", n: 1 } }, options);
  await gate(redis, "proj.unpublished", { kwargs: { user_id: "u", n: 2 } }, options);
  const open = "debounce:{0}:open:16:proj.unpublished:g:u";
  assert.ok(first.opened);
  assert.equal(await redis.llen(`debounce:{0}:calls:${await redis.hget(open, "cl")}`), 2);
  assert.deepEqual(JSON.parse(await redis.hget(open, "o")), { headers: { debounce_collect: 1 } });
  await publish(redis, "proj.gather", { collect: true, signature: null, key: "g:{user_id}",
    options: '{"headers": {"debounce_collect": 1}}' });
  await publish(redis, "proj.digest");
  for (const [task, collect] of [["proj.gather", false], ["proj.digest", true]]) {
    await assert.rejects(debounce(redis, task, { kwargs: { user_id: "u" } }, { collect }),
      (e) => e instanceof DebounceConfigError && /it is a task option/.test(e.message));
  }
  await assert.rejects(debounce(redis, "proj.x", { args: [1] }, { ...options, collect: "yes" }),
    (e) => e instanceof DebounceConfigError && /collect="yes": expected true or false/.test(e.message));
});

test("a call's own task id opens the window under it, or is recorded as an alias", async () => {
  const redis = await fresh();
  await publish(redis, "proj.digest", { key: "{0}" });
  const first = await gate(redis, "proj.digest", { args: ["a"], taskId: "mine-1" });
  assert.ok(first.opened && first.taskId === "mine-1");
  const second = await gate(redis, "proj.digest", { args: ["a"], taskId: "mine-2" });
  assert.equal(second.taskId, "mine-1");
  const open = "debounce:{0}:open:11:proj.digest:a";
  assert.equal(await redis.hget(open, "na"), "1");
  assert.deepEqual(JSON.parse(await redis.hget(open, "a1")), { id: "mine-2" });
  await publish(redis, "proj.lead", { key: "{0}", leading: true, trailing: false });
  await assert.rejects(debounce(redis, "proj.lead", { args: ["a"], taskId: "x" }),
    (e) => e instanceof DebounceConfigError && /taskId/.test(e.message));
  await assert.rejects(debounce(redis, "proj.digest", { args: ["b"], taskId: "" }),
    (e) => e instanceof DebounceConfigError && /taskId/.test(e.message));
});

test("debounceMany gates many calls in chunks, as many calls in order", async () => {
  const redis = await fresh();
  await publish(redis, "proj.digest", { key: "{0}" });
  const calls = ["a", "b", "a", "c", "a"].map((k, n) => ({ args: [k, n] }));
  const ids = await debounceMany(redis, "proj.digest", calls, undefined, 2);
  assert.equal(ids.length, 5);
  assert.ok(ids[0] === ids[2] && ids[2] === ids[4] && ids[0] !== ids[1] && ids[1] !== ids[3]);
  assert.equal(await redis.hget("debounce:{0}:open:11:proj.digest:a", "n"), "3");
  await redis.script("FLUSH");  // a server that lost its scripts: loaded, then run once
  const again = await debounceMany(redis, "proj.digest", [{ args: ["a", 9] }, { args: ["d", 9] }]);
  assert.equal(again[0], ids[0]);
  assert.equal(await redis.hget("debounce:{0}:open:11:proj.digest:a", "n"), "4");
  // one call refused: nothing written
  await assert.rejects(debounceMany(redis, "proj.digest", [{ args: ["e"] }, { args: ["e", undefined] }]),
    (e) => e instanceof DebounceEncodeError);
  assert.equal(await redis.exists("debounce:{0}:open:11:proj.digest:e"), 0);
  await assert.rejects(debounceMany(redis, "proj.digest", calls, undefined, 0),
    (e) => e instanceof DebounceConfigError && /chunkSize/.test(e.message));
});

test("debounceMany against a server that does not answer: every call named, none unknown", async () => {
  const silent = await silentServer();
  const mute = new Redis(silent.port, "127.0.0.1", { lazyConnect: true });
  mute.on("error", () => {});
  try {
    await assert.rejects(
      debounceMany(mute, "proj.x", [{ args: [1] }, { args: [2] }],
        { debounce: "1s", maxWait: "2s", timeout: "300ms" }),
      (e) => e instanceof DebounceBackendError && /definition/.test(e.message));
  } finally {
    mute.disconnect();
    silent.close();
  }
});
