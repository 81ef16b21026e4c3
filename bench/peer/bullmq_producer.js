// One sequential BullMQ producer in debounce mode, driven by bench/bullmq.py.
//
// Reads commands on stdin, one a line: "hot N" (N adds with one deduplication id)
// or "new N" (a new id per add). Each add is BullMQ's debounce mode: a delayed job
// whose deduplication entry is extended and whose data is replaced by every later
// add while it waits. Answers each command with one JSON line {"seconds": s}.
// Environment: BENCH_REDIS_HOST, BENCH_REDIS_PORT, BENCH_REDIS_DB, BENCH_WINDOW_MS; with
// BENCH_PG_URL set, the queue is on BullMQ's PostgreSQL backend at that URL instead
// (its schema migrated at start, one pg pool).
"use strict";

const readline = require("node:readline");
const { Queue, createPostgresBackend } = require("bullmq");

const windowMs = Number(process.env.BENCH_WINDOW_MS || 3600000);
const pgUrl = process.env.BENCH_PG_URL;
let connection = null;
let queue;
if (pgUrl) {
  queue = new Queue(
    "bench",
    { connection: { connectionString: pgUrl, migrate: true } },
    createPostgresBackend,
  );
} else {
  const IORedis = require("ioredis");
  connection = new IORedis({
    host: process.env.BENCH_REDIS_HOST || "127.0.0.1",
    port: Number(process.env.BENCH_REDIS_PORT || 6379),
    db: Number(process.env.BENCH_REDIS_DB || 0),
    maxRetriesPerRequest: null,
  });
  queue = new Queue("bench", { connection });
}
let fresh = 0;

function add(id) {
  return queue.add(
    "debounced",
    { user_id: id, n: 1 },
    { delay: windowMs, deduplication: { id, ttl: windowMs, extend: true, replace: true } },
  );
}

async function run(mode, n) {
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i++) {
    await add(mode === "hot" ? "u:hot" : `u:n${fresh++}`);
  }
  return Number(process.hrtime.bigint() - start) / 1e9;
}

async function main() {
  await queue.waitUntilReady();
  await add("u:hot"); // open the hot key's job, and load the scripts
  process.stdout.write(JSON.stringify({ ready: true }) + "\n");
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const [mode, count] = line.trim().split(/\s+/);
    if (mode === "quit") break;
    const seconds = await run(mode, Number(count));
    process.stdout.write(JSON.stringify({ seconds }) + "\n");
  }
  await queue.close();
  if (connection) await connection.quit();
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + "\n");
  process.exit(1);
});
