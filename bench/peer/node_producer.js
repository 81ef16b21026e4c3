// One sequential producer of our Node client (clients/node, npm name celery-debounced,
// packed and installed into the bench cache), driven by bench/bullmq.py.
//
// Reads commands on stdin, one a line: "hot N" (N calls of one key) or "new N" (a new
// key per call). Each call is debounce() of bench.debounced with the Python task's
// window, ceiling and key template (1 h, 2 h, u:{user_id}, here u:{0}) and its arguments
// (["<id>"], {n: 1}), on one ioredis client. Answers each command with one JSON line
// {"seconds": s}. Environment: BENCH_REDIS_HOST, BENCH_REDIS_PORT, BENCH_REDIS_DB.
"use strict";

const readline = require("node:readline");
const IORedis = require("ioredis");
const { debounce } = require("celery-debounced");

const redis = new IORedis({
  host: process.env.BENCH_REDIS_HOST || "127.0.0.1",
  port: Number(process.env.BENCH_REDIS_PORT || 6379),
  db: Number(process.env.BENCH_REDIS_DB || 0),
});
const TASK = "bench.debounced";
const OPTIONS = { debounce: "1h", maxWait: "2h", key: "u:{0}" };
let fresh = 0;

function call(id) {
  return debounce(redis, TASK, { args: [id], kwargs: { n: 1 } }, OPTIONS);
}

async function run(mode, n) {
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i++) {
    await call(mode === "hot" ? "hot" : `n${fresh++}`);
  }
  return Number(process.hrtime.bigint() - start) / 1e9;
}

async function main() {
  await call("hot"); // open the hot key's window, and load the script
  process.stdout.write(JSON.stringify({ ready: true }) + "\n");
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const [mode, count] = line.trim().split(/\s+/);
    if (mode === "quit") break;
    const seconds = await run(mode, Number(count));
    process.stdout.write(JSON.stringify({ seconds }) + "\n");
  }
  await redis.quit();
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + "\n");
  process.exit(1);
});
