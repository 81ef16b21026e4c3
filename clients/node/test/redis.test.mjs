// Against a real redis-server started here on a free port: the gate calls themselves,
// with ioredis 5 (`ioredis`) or, with DEBOUNCE_IOREDIS=ioredis6, ioredis 6: both are
// declared (a peer dependency), both run (`npm test`).
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { once } from "node:events";
import { createRequire } from "node:module";
import { connect, createServer } from "node:net";
import { after, before, test } from "node:test";
import {
  DebounceBackendError, DebounceConfigError, DebounceContractMismatch, DebounceKeyError,
  DebounceBulkError, DebounceOutcomeUnknown,
  GATE_SCRIPT, cancelWindow, debounce, debounceMany, flushWindow, gate, pendingWindow,
  prepare, redisBroker, sendGate,
} from "../dist/esm/index.js";
import { flatScript } from "../scripts/build.mjs";
import { freePort, silentServer, startRedis } from "./redis-server.mjs";

const { default: Redis } = await import(process.env.DEBOUNCE_IOREDIS ?? "ioredis");
let server;
let redis;

before(async () => {
  server = await startRedis();
  redis = new Redis({ port: server.port, host: "127.0.0.1" });
  await redis.ping();
});

after(async () => {
  redis?.disconnect();
  server?.stop();
});

test("the client under test is the ioredis asked for (5, or 6 with DEBOUNCE_IOREDIS=ioredis6)", () => {
  const name = process.env.DEBOUNCE_IOREDIS ?? "ioredis";
  const manifest = createRequire(import.meta.url).resolve(`${name}/package.json`);
  const major = JSON.parse(readFileSync(manifest, "utf8")).version.split(".")[0];
  assert.equal(major, name === "ioredis6" ? "6" : "5");
});

const OPTIONS = { debounce: "5m", key: "report:{0}", maxWait: "30m", replacePayload: false };
const OPEN = "debounce:{0}:open:17:proj.build_report:report:u1";

test("the shipped gate script is celery_debounce/store/redis/lua/gate.lua with its includes", () => {
  const source = new URL("../../../celery_debounce/store/redis/lua/gate.lua", import.meta.url);
  assert.ok(existsSync(source), "run from the repository");
  assert.equal(GATE_SCRIPT, flatScript("gate"));
  assert.match(GATE_SCRIPT, /^local CONTRACT = '1'$/m);
  assert.doesNotMatch(GATE_SCRIPT, /^--@include/m);
});

test("a burst is one window: one task id, the opener's arguments", async () => {
  await redis.flushdb();
  const ids = [];
  for (let i = 0; i < 5; i++) {
    ids.push(await debounce(redis, "proj.build_report", { args: ["u1"], kwargs: { n: i } }, OPTIONS));
  }
  assert.equal(typeof ids[0], "string");
  assert.equal(new Set(ids).size, 1);
  assert.equal(await redis.hget(OPEN, "n"), "5");
  assert.equal(await redis.hget(OPEN, "p"), '[["u1"], {"n": 0}, {}]');
  assert.equal(await redis.hget(OPEN, "id"), ids[0]);
  assert.ok(await redis.zscore("debounce:{0}:due", "17:proj.build_report:report:u1"));
});

test("replacePayload: the last call's arguments, the ceiling from the first call", async () => {
  await redis.flushdb();
  const first = await gate(redis, "proj.build_report", { args: ["u1"], kwargs: { n: 1 } },
    { ...OPTIONS, replacePayload: true, debounce: "10s", maxWait: "20s" });
  const second = await gate(redis, "proj.build_report", { args: ["u1"], kwargs: { n: 2 } },
    { ...OPTIONS, replacePayload: true, debounce: "10s", maxWait: "20s" });
  assert.ok(first.opened && !second.opened);
  assert.equal(second.taskId, first.taskId);
  assert.equal(await redis.hget(OPEN, "p"), '[["u1"], {"n": 2}, {}]');
  assert.ok(second.deadlineMs <= first.nowMs + 20_000);
});

test("prefix and shards as the Python settings", async () => {
  await redis.flushdb();
  const call = prepare("proj.build_report", { args: ["u1"] }, { ...OPTIONS, prefix: "myapp", shards: 8 });
  await debounce(redis, "proj.build_report", { args: ["u1"] }, { ...OPTIONS, prefix: "myapp", shards: 8 });
  assert.equal(await redis.exists(call.keys[0]), 1);
  assert.ok(call.keys[0].startsWith(`myapp:{${call.shard}}:open:`));
});

test("a producer of another contract version is refused, nothing written", async () => {
  await redis.flushdb();
  const call = prepare("proj.build_report", { args: ["u1"] }, OPTIONS);
  call.argv[3] = "2:0";
  await assert.rejects(sendGate(redis, call), (exc) => {
    assert.ok(exc instanceof DebounceContractMismatch);
    assert.equal(exc.producer, "2");
    assert.equal(exc.gate, "1");
    assert.match(exc.message, /DEBOUNCE_CONTRACT_MISMATCH producer 2 gate 1/);
    return true;
  });
  assert.deepEqual(await redis.keys("*"), []);
});

test("errors are refused before anything is sent", async () => {
  await redis.flushdb();
  await assert.rejects(debounce(redis, "t", { args: [null] }, { ...OPTIONS, key: "k:{0}" }), DebounceKeyError);
  await assert.rejects(debounce(redis, "t", { args: [] }, { debounce: "5m" }), DebounceConfigError);
  await assert.rejects(debounce(redis, "t", { args: [] }, { ...OPTIONS, maxWait: "1m" }), DebounceConfigError);
  await assert.rejects(debounce(redis, "t", { args: [] }, { ...OPTIONS, maxwait: "1h" }), /did you mean 'maxWait'/);
  assert.deepEqual(await redis.keys("*"), []);
});

test("CommonJS: require() gives the same API", () => {
  const require = createRequire(import.meta.url);
  const cjs = require("../dist/cjs/index.js");
  assert.equal(typeof cjs.debounce, "function");
  assert.equal(cjs.prepare("proj.build_report", { args: ["u1"] }, OPTIONS).ident,
    "17:proj.build_report:report:u1");
});

test("after SCRIPT FLUSH the gate is loaded again and runs once", async () => {
  await redis.flushdb();
  await redis.script("FLUSH");
  const result = await gate(redis, "proj.build_report", { args: ["u1"] }, OPTIONS);
  assert.ok(result.opened);
  assert.equal(await redis.hget(OPEN, "n"), "1");
});

test("the documented least-privilege user (and +info) can debounce, after SCRIPT FLUSH too", async () => {
  const page = readFileSync(new URL("../../../docs/guarantees.md", import.meta.url), "utf8");
  const line = page.split("\n").find((l) => l.startsWith("ACL SETUSER debouncer "));
  assert.ok(line, "the ACL line in docs/guarantees.md");
  const rules = line.split(" ").slice(3).map((r) => (r === ">PASSWORD" ? ">secret" : r));
  await redis.call("ACL", "SETUSER", "debouncer", "reset", ...rules, "+info");
  await redis.flushdb();
  await redis.script("FLUSH");
  const limited = new Redis({ port: redis.options.port, host: "127.0.0.1", username: "debouncer",
    password: "secret" });
  try {
    const first = await debounce(limited, "proj.build_report", { args: ["u1"] }, OPTIONS);
    assert.equal(await debounce(limited, "proj.build_report", { args: ["u1"] }, OPTIONS), first);
    assert.equal(await redis.hget(OPEN, "n"), "2");
    // the operators' calls too: a definition read (HGET), a read, a flush, a cancel
    const second = await debounce(limited, "proj.build_report", { args: ["u2"] }, OPTIONS);
    const u1 = { args: ["u1"] };
    assert.equal((await pendingWindow(limited, "proj.build_report", u1, OPTIONS)).taskId, first);
    assert.equal((await flushWindow(limited, "proj.build_report", u1, OPTIONS)).taskId, first);
    const u2 = { args: ["u2"] };
    assert.equal((await cancelWindow(limited, "proj.build_report", u2, OPTIONS)).taskId, second);
    assert.equal(await redis.zscore("debounce:{0}:expiring", second), "0");  // handed to the sweep
    // kept the record TTL (7 days by default), not the history TTL (1 h): a dispatcher
    // outage of hours still finds it
    assert.ok(await redis.pttl(`debounce:{0}:win:${second}`) > 6 * 86_400_000);
  } finally {
    limited.disconnect();
    await redis.call("ACL", "DELUSER", "debouncer");
  }
});

/** A TCP proxy to the test server that can swallow the server's replies, or forward one
 * EVALSHA and drop the connection instead of its reply (`dropAfterEvalsha`). */
function proxy(port) {
  const state = { swallow: false, dropAfterEvalsha: false, sockets: new Set(), connections: 0,
    evalshas: 0 };
  const server = createServer((client) => {
    state.connections += 1;
    const upstream = connect(port, "127.0.0.1");
    let dropping = false;
    state.sockets.add(client).add(upstream);
    client.on("data", (d) => {
      state.evalshas += (d.toString("latin1").match(/evalsha/gi) ?? []).length;
      if (state.dropAfterEvalsha && /evalsha/i.test(d.toString("latin1"))) {
        state.dropAfterEvalsha = false;
        dropping = true;
      }
      upstream.write(d);
    });
    upstream.on("data", (d) => {
      if (dropping) { client.destroy(); upstream.destroy(); return; }  // the EVALSHA ran
      if (!state.swallow) client.write(d);
    });
    const close = () => { client.destroy(); upstream.destroy(); };
    client.on("error", close).on("close", close);
    upstream.on("error", close).on("close", close);
  });
  state.cut = () => { for (const s of state.sockets) s.destroy(); state.sockets.clear(); };
  state.close = () => new Promise((r) => { state.cut(); server.close(r); });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => {
    state.port = server.address().port;
    resolve(state);
  }));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test("a gate call whose reply is lost is outcome-unknown and is not sent again", async () => {
  await redis.flushdb();
  const link = await proxy(redis.options.port);
  const client = new Redis(link.port, "127.0.0.1");  // ioredis's defaults: it resends
  try {
    await client.ping();
    await debounce(client, "proj.build_report", { args: ["u0"] }, OPTIONS);  // connected
    link.swallow = true;
    const started = Date.now();
    await assert.rejects(debounce(client, "proj.build_report", { args: ["u1"] },
      { ...OPTIONS, timeout: "300ms" }),
    (exc) => exc instanceof DebounceOutcomeUnknown && /may or may not have run/.test(exc.message));
    assert.ok(Date.now() - started < 1000, "rejected within the timeout");
    assert.equal(await redis.hget(OPEN, "n"), "1");  // it ran once, on the server
    link.swallow = false;
    const ready = once(client, "ready");
    link.cut();  // the link dies: the client reconnects
    await ready;
    await client.ping();
    await sleep(200);
    assert.equal(await redis.hget(OPEN, "n"), "1");  // and did not send it again
  } finally {
    client.disconnect();
    await link.close();
  }
});

test("onOutage \"publish\": a call the store cannot take is one plain message, through the publisher given", async () => {
  await redis.flushdb();
  const client = new Redis(server.port, "127.0.0.1");
  const sent = [];
  const options = { ...OPTIONS, onOutage: "publish", publish: async (m) => { sent.push(m); },
    queue: "reports", priority: 5 };
  await debounce(client, "proj.build_report", { args: ["u1"] }, options);  // the task has no definition
  assert.equal(sent.length, 0);  // the store took it
  const ended = once(client, "end");
  client.disconnect();  // the store is gone from here on
  await ended;
  await sleep(50);  // the gate's own connection closes on the client's end
  const result = await gate(client, "proj.build_report",
    { args: ["u2"], kwargs: { n: 1 }, taskId: "mine" }, options);
  assert.deepEqual([result.published, result.taskId, result.opened], [true, "mine", false]);
  assert.equal(sent.length, 1);
  const [m] = sent;
  assert.deepEqual([m.queue, m.routingKey, m.exchange, m.priority], ["reports", "reports", "", 5]);
  assert.deepEqual([m.headers.task, m.headers.id, m.headers.root_id, m.headers.lang, m.headers.retries],
    ["proj.build_report", "mine", "mine", "py", 0]);
  assert.equal(m.properties.correlation_id, "mine");
  assert.deepEqual(JSON.parse(m.body), [["u2"], { n: 1 }, {}]);
  const id = await debounce(client, "proj.build_report", { args: ["u3"] }, options);
  assert.equal(sent[1].headers.id, id);  // a fresh id, the message's
  await assert.rejects(debounce(client, "proj.build_report", { args: ["u4"] },
    { ...options, publish: async () => { throw new Error("broker down"); } }),
  (exc) => exc instanceof DebounceBackendError && /failed too: broker down/.test(exc.message));
  const started = Date.now();  // a publisher that never settles: the call's timeout ends it
  await assert.rejects(debounce(client, "proj.build_report", { args: ["u4"] },
    { ...options, timeout: "300ms", publish: () => new Promise(() => {}) }),
  (exc) => exc instanceof DebounceOutcomeUnknown && /did not finish within 300 ms/.test(exc.message));
  assert.ok(Date.now() - started < 2000);
  await assert.rejects(debounce(client, "proj.build_report", { args: ["u5"] }, OPTIONS),
    (exc) => exc instanceof DebounceBackendError && !/plainly/.test(exc.message));  // "raise"
  await assert.rejects(debounce(client, "proj.other", { args: ["u6"] }, options),  // never read
    (exc) => exc instanceof DebounceBackendError && /not published plainly either/.test(exc.message));
  assert.equal(sent.length, 2);
  assert.deepEqual(await redis.keys("debounce:{0}:open:*"), [OPEN]);  // u1's alone: none of them
});

test("wrong credentials are a config error by name, never an outage: not published plainly", async () => {
  await redis.call("ACL", "SETUSER", "locked", "on", ">right", "~*", "+@all");
  const sent = [];
  const wrong = new Redis({ port: redis.options.port, host: "127.0.0.1", username: "locked",
    password: "wrong" });  // ioredis retries as by default: a wrong password stays wrong
  wrong.on("error", () => {});
  try {
    for (let i = 0; i < 2; i++) {  // the second too: no breaker opened
      await assert.rejects(debounce(wrong, "proj.build_report", { args: ["u1"] },
        { ...OPTIONS, onOutage: "publish", publish: async (m) => { sent.push(m); } }),
      (exc) => exc instanceof DebounceConfigError && /WRONGPASS|invalid/.test(exc.message));
    }
    assert.equal(sent.length, 0);
  } finally {
    wrong.disconnect();
    await redis.call("ACL", "DELUSER", "locked");
  }
});

test("onOutage is \"raise\" or \"publish\", and \"publish\" needs a publisher", async () => {
  await assert.rejects(debounce(redis, "proj.t", { args: [1] }, { ...OPTIONS, onOutage: "publish" }),
    (exc) => exc instanceof DebounceConfigError && /needs publish/.test(exc.message));
  await assert.rejects(debounce(redis, "proj.t", { args: [1] }, { ...OPTIONS, onOutage: "later" }),
    (exc) => exc instanceof DebounceConfigError && /expected "raise" or "publish"/.test(exc.message));
});

test("redisBroker writes kombu's Redis envelope on the queue's list, a priority on kombu's step list", async () => {
  await redis.flushdb();
  const publish = redisBroker(redis);
  const message = { queue: "reports", exchange: "", routingKey: "reports", priority: 5,
    headers: { task: "t", id: "i" }, body: "[[1], {}, {}]", contentType: "application/json",
    contentEncoding: "utf-8", properties: { correlation_id: "i", reply_to: "", delivery_mode: 2 } };
  await publish(message);
  await publish({ ...message, priority: 0 });
  const stepped = JSON.parse(await redis.rpop("reports\x06\x163"));
  assert.equal(Buffer.from(stepped.body, "base64").toString(), "[[1], {}, {}]");
  assert.deepEqual([stepped["content-type"], stepped["content-encoding"], stepped.headers],
    ["application/json", "utf-8", { task: "t", id: "i" }]);
  assert.deepEqual([stepped.properties.body_encoding, stepped.properties.priority,
    stepped.properties.delivery_info], ["base64", 5, { exchange: "", routing_key: "reports" }]);
  assert.equal(await redis.llen("reports"), 1);
  const prefixed = new Redis({ lazyConnect: true, keyPrefix: "app:" });
  assert.throws(() => redisBroker(prefixed), DebounceConfigError);
  prefixed.disconnect();
});

test("a flush whose reply is lost is outcome-unknown, ran once and is not sent again", async () => {
  await redis.flushdb();
  const link = await proxy(redis.options.port);
  const client = new Redis(link.port, "127.0.0.1");  // ioredis's defaults: it resends
  try {
    const id = await debounce(client, "proj.build_report", { args: ["u1"] }, OPTIONS);
    assert.equal(await flushWindow(client, "proj.build_report", { args: ["u9"] }, OPTIONS), null);
    link.dropAfterEvalsha = true;  // the flush script is loaded: its one EVALSHA runs it
    const before = link.evalshas;
    await assert.rejects(flushWindow(client, "proj.build_report", { args: ["u1"] }, OPTIONS),
      (exc) => exc instanceof DebounceOutcomeUnknown && /was not sent again/.test(exc.message));
    assert.equal(await redis.exists(OPEN), 0);  // it ran, on the server
    assert.equal(await redis.hget(`debounce:{0}:win:${id}`, "st"), "dispatching");
    await client.ping();  // reconnected meanwhile
    await sleep(300);
    assert.equal(link.evalshas - before, 1);  // and was not sent again
  } finally {
    client.disconnect();
    await link.close();
  }
});

test("the proxy reproduces the hazard: ioredis's defaults resend an EVALSHA whose reply was lost", async () => {
  await redis.flushdb();
  const link = await proxy(redis.options.port);
  const client = new Redis(link.port, "127.0.0.1");
  try {
    const sha = await client.script("LOAD", "return redis.call('INCR', KEYS[1])");
    link.dropAfterEvalsha = true;
    assert.equal(await client.evalsha(sha, 1, "counter"), 2);  // answered after the resend
    assert.equal(await redis.get("counter"), "2");
  } finally {
    client.disconnect();
    await link.close();
  }
});

test("a plain new Redis(port): a connection lost after the EVALSHA is applied once, outcome-unknown", async () => {
  await redis.flushdb();
  const link = await proxy(redis.options.port);
  const client = new Redis(link.port, "127.0.0.1");
  try {
    const first = await debounce(client, "proj.build_report", { args: ["u1"] }, OPTIONS);
    link.dropAfterEvalsha = true;
    await assert.rejects(debounce(client, "proj.build_report", { args: ["u1"] }, OPTIONS),
      (exc) => exc instanceof DebounceOutcomeUnknown && /not sent again/.test(exc.message));
    assert.equal(await redis.hget(OPEN, "n"), "2");  // it ran, once
    await sleep(500);  // the gate connection reconnects meanwhile
    assert.equal(await redis.hget(OPEN, "n"), "2");  // nothing was sent again
    assert.equal(await debounce(client, "proj.build_report", { args: ["u1"] }, OPTIONS), first);
    assert.equal(await redis.hget(OPEN, "n"), "3");
  } finally {
    client.disconnect();
    await link.close();
  }
});

test("a refused connection is DebounceBackendError (nothing sent), within the timeout", async () => {
  const closed = new Redis(await freePort(), "127.0.0.1", { lazyConnect: true });
  closed.on("error", () => {});
  try {
    const started = Date.now();
    await assert.rejects(debounce(closed, "proj.build_report", { args: ["u1"] },
      { ...OPTIONS, timeout: "1s" }),
    (exc) => exc instanceof DebounceBackendError && !(exc instanceof DebounceOutcomeUnknown) &&
      /unreachable.*nothing was sent/.test(exc.message));
    assert.ok(Date.now() - started < 1500);
  } finally {
    closed.disconnect();
  }
  // a server that accepts and never answers: the connection is not ready within the timeout
  const silent = await silentServer();
  const mute = new Redis(silent.port, "127.0.0.1", { lazyConnect: true });
  mute.on("error", () => {});
  try {
    const started = Date.now();
    await assert.rejects(debounce(mute, "proj.build_report", { args: ["u1"] },
      { ...OPTIONS, timeout: "300ms" }),
    (exc) => exc instanceof DebounceBackendError && !(exc instanceof DebounceOutcomeUnknown) &&
      /not connected within 300 ms/.test(exc.message));
    assert.ok(Date.now() - started < 1000);
  } finally {
    mute.disconnect();
    silent.close();
  }
});

async function stats() {
  const info = (await redis.info("stats")) + (await redis.info("commandstats"));
  const read = (pattern) => Number(new RegExp(pattern, "m").exec(info)?.[1] ?? 0);
  return {
    evalsha: read("^cmdstat_evalsha:calls=(\\d+)"), script: read("^cmdstat_script\\|load:calls=(\\d+)"),
    connections: read("^total_connections_received:(\\d+)"),
  };
}

test("a burst costs one EVALSHA per call after the first, on one connection", async () => {
  await redis.flushdb();
  const client = new Redis(redis.options.port, "127.0.0.1");
  try {
    await debounce(client, "proj.build_report", { args: ["u1"] }, OPTIONS);
    const before = await stats();
    const ids = await Promise.all(Array.from({ length: 5 },
      () => debounce(client, "proj.build_report", { args: ["u1"] }, OPTIONS)));
    for (let i = 0; i < 5; i++) ids.push(await debounce(client, "proj.build_report", { args: ["u1"] }, OPTIONS));
    const after = await stats();
    assert.equal(new Set(ids).size, 1);
    assert.equal(await redis.hget(OPEN, "n"), "11");
    assert.equal(after.evalsha - before.evalsha, 10);  // one EVALSHA per call, nothing else
    assert.equal(after.script, before.script);
    assert.equal(after.connections, before.connections);
  } finally {
    client.disconnect();
  }
});

test("the gate connection has the client's settings (db, user, name) but not its keyPrefix, and closes with it", async () => {
  const page = readFileSync(new URL("../../../docs/guarantees.md", import.meta.url), "utf8");
  const line = page.split("\n").find((l) => l.startsWith("ACL SETUSER debouncer "));
  const rules = line.split(" ").slice(3).map((r) => (r === ">PASSWORD" ? ">secret" : r));
  await redis.call("ACL", "SETUSER", "debouncer", "reset", ...rules, "+info", "+select",
    "+client|setname");
  const own = new Redis({ port: redis.options.port, host: "127.0.0.1", db: 3, keyPrefix: "app:",
    username: "debouncer", password: "secret", connectionName: "webhooks" });
  const named = async () => (await redis.client("LIST")).split("\n").filter((l) => / name=webhooks /.test(l));
  try {
    await redis.select(3);
    await redis.flushdb();
    await debounce(own, "proj.build_report", { args: ["u1"] }, OPTIONS);
    // where the dispatchers read it (prefix "debounce"), not under the client's "app:"
    assert.equal(await redis.hget(OPEN, "n"), "1");
    assert.deepEqual(await redis.keys("app:*"), []);
    const lines = await named();
    assert.equal(lines.length, 2, "the client's connection and the gate's");
    for (const l of lines) assert.match(l, / db=3 .* user=debouncer /);
    await own.quit();
    for (let i = 0; i < 50 && (await named()).length > 0; i++) await sleep(20);
    assert.deepEqual(await named(), []);
    await assert.rejects(debounce(own, "proj.build_report", { args: ["u1"] }, OPTIONS),
      (exc) => exc instanceof DebounceBackendError && /nothing was sent/.test(exc.message));
  } finally {
    own.disconnect();
    await redis.flushdb();
    await redis.select(0);
    await redis.call("ACL", "DELUSER", "debouncer");
  }
});

test("debounceMany: a connection lost after its chunk was sent is a bulk error naming each call unknown, applied once", async () => {
  await redis.flushdb();
  const link = await proxy(redis.options.port);
  const client = new Redis(link.port, "127.0.0.1");
  try {
    await debounce(client, "proj.build_report", { args: ["u0"] }, OPTIONS);  // connected, loaded
    link.dropAfterEvalsha = true;
    const calls = [{ args: ["u1"] }, { args: ["u2"] }];
    await assert.rejects(debounceMany(client, "proj.build_report", calls, OPTIONS),
      (exc) => exc instanceof DebounceBulkError && exc.unknown.length >= 1 &&
        exc.taskIds.length === 2 && exc.unknown.every((i) => exc.errors.get(i) instanceof DebounceOutcomeUnknown));
    await sleep(500);  // the gate connection reconnects meanwhile: nothing is sent again
    const written = await Promise.all(["u1", "u2"].map((u) =>
      redis.hget(`debounce:{0}:open:17:proj.build_report:report:${u}`, "n")));
    assert.ok(written.every((n) => n === null || n === "1"), String(written));
  } finally {
    client.disconnect();
    await link.close();
  }
});
