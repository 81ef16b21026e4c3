// A Redis Cluster of three masters started here: the producer routes each window to the
// master of its shard's slot, loads the script there, and wakes with SPUBLISH (Redis 7).
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Cluster, Redis } from "ioredis";
import { GATE_SCRIPT, cancelWindow, debounce, flushWindow, prepare } from "../dist/esm/index.js";
import { freePort } from "./redis-server.mjs";

const servers = [];
const ports = [];
let dir;
let cluster;

async function until(check, what, timeout = 20_000) {
  const deadline = Date.now() + timeout;
  for (;;) {
    try { if (await check()) return; } catch { /* not yet */ }
    if (Date.now() > deadline) throw new Error(`not within ${timeout} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "debounce-node-cluster-"));
  for (let i = 0; i < 3; i++) {
    const port = await freePort();
    ports.push(port);
    servers.push(spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1",
      "--cluster-enabled", "yes", "--cluster-config-file", join(dir, `nodes-${port}.conf`),
      "--save", "", "--appendonly", "no", "--dir", dir], { stdio: "ignore" }));
  }
  for (const port of ports) {
    await until(async () => {
      const probe = new Redis({ port, host: "127.0.0.1", lazyConnect: true, retryStrategy: () => null });
      try { await probe.connect(); return (await probe.ping()) === "PONG"; } finally { probe.disconnect(); }
    }, `redis-server on ${port}`);
  }
  execFileSync("redis-cli", ["--cluster", "create", ...ports.map((p) => `127.0.0.1:${p}`),
    "--cluster-replicas", "0", "--cluster-yes"], { stdio: "ignore", timeout: 30_000 });
  for (const port of ports) {
    await until(async () => {
      const probe = new Redis({ port, host: "127.0.0.1" });
      try { return /cluster_state:ok/.test(await probe.cluster("INFO")); } finally { probe.disconnect(); }
    }, `cluster_state:ok on ${port}`);
  }
  cluster = new Cluster([{ host: "127.0.0.1", port: ports[0] }]);  // ioredis's defaults
});

after(() => {
  cluster?.disconnect();
  for (const server of servers) server.kill();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const OPTIONS = { debounce: "5m", maxWait: "30m", key: "r:{0}", shards: 3 };

test("each shard's window is on its master, with the cluster tags, one window per key", async () => {
  for (const user of ["u1", "u2", "u3", "u4"]) {
    const call = prepare("proj.build_report", { args: [user] }, OPTIONS, true);
    const first = await debounce(cluster, "proj.build_report", { args: [user] }, OPTIONS);
    assert.equal(await debounce(cluster, "proj.build_report", { args: [user] }, OPTIONS), first);
    assert.equal(await cluster.hget(call.keys[0], "n"), "2");
    assert.equal(await cluster.hget(call.keys[0], "id"), first);
    assert.ok(await cluster.zscore(call.keys[1], call.ident));
  }
  const tags = new Set(["u1", "u2", "u3", "u4"].map(
    (u) => prepare("proj.build_report", { args: [u] }, OPTIONS, true).keys[0].split("}")[0]));
  assert.ok(tags.size > 1, "the keys spread over shards");
});

test("a flush and a cancel reach each window's master; the cancel's hand-off keeps the window's slot", async () => {
  for (const user of ["c1", "c2", "c3", "c4"]) {
    const call = prepare("proj.build_report", { args: [user] }, OPTIONS, true);
    const tag = call.keys[1].slice(0, call.keys[1].lastIndexOf(":"));
    const id = await debounce(cluster, "proj.build_report", { args: [user] }, OPTIONS);
    const op = user === "c1" || user === "c3" ? flushWindow : cancelWindow;
    assert.equal((await op(cluster, "proj.build_report", { args: [user] }, OPTIONS)).taskId, id);
    assert.equal(await cluster.exists(call.keys[0]), 0);
    if (op === cancelWindow) {
      assert.equal(await cluster.hget(`${tag}:win:${id}`, "rs"), "REVOKED");
      assert.equal(await cluster.zscore(`${tag}:expiring`, id), "0");
    }
  }
});

test("on Redis 7 masters the loaded script wakes with SPUBLISH", async () => {
  const sharded = GATE_SCRIPT.replace("local SHARDED_WAKE = false", "local SHARDED_WAKE = true");
  const sha = createHash("sha1").update(sharded).digest("hex");
  const call = prepare("proj.build_report", { args: ["u1"] }, OPTIONS, true);
  const owner = await cluster.cluster("KEYSLOT", call.keys[0]);
  const nodes = cluster.nodes("master");
  const found = await Promise.all(nodes.map((n) => n.script("EXISTS", sha)));
  assert.ok(found.some((row) => row[0] === 1), `slot ${owner}: sharded script loaded`);
});

test("a default Cluster client's gate connections close when the client ends", async () => {
  const probe = new Redis({ port: ports[0], host: "127.0.0.1" });
  const named = async () => (await probe.client("LIST")).split("\n").filter((l) => / name=gate-probe /.test(l));
  const own = new Cluster([{ host: "127.0.0.1", port: ports[0] }],
    { redisOptions: { connectionName: "gate-probe" } });
  try {
    for (const user of ["u1", "u2", "u3", "u4"]) {
      await debounce(own, "proj.build_report", { args: [user] }, OPTIONS);
    }
    assert.ok((await named()).length >= 1, "the gate's connection carries the client's name");
    own.disconnect();
    for (let i = 0; i < 50 && (await named()).length > 0; i++) await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual(await named(), []);
  } finally {
    own.disconnect();
    probe.disconnect();
  }
});
