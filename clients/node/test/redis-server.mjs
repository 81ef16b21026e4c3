// A throwaway redis-server on a free port for a test file: start() and stop().
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { connect, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export function freePort() {
  return new Promise((resolve) => {
    const probe = createServer().listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

export function reachable(port) {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1", () => { socket.end(); resolve(true); });
    socket.on("error", () => resolve(false));
  });
}

/** A redis-server answering on 127.0.0.1: `{ port, stop() }`. */
export async function startRedis() {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), "debounce-node-"));
  const child = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "",
    "--appendonly", "no", "--dir", dir], { stdio: "ignore" });
  const deadline = Date.now() + 10_000;
  while (!(await reachable(port))) {
    if (Date.now() > deadline) throw new Error(`redis-server did not start on ${port}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    port,
    stop() {
      child.kill();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A server on 127.0.0.1 that accepts connections and never answers: `{ port, close() }`. */
export async function silentServer() {
  const held = new Set();
  const server = createServer((socket) => { held.add(socket); socket.on("error", () => {}); });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    port: server.address().port,
    close() {
      for (const socket of held) socket.destroy();
      server.close();
    },
  };
}
