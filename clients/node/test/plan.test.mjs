// prepare() derives what a call's task and options alone decide once per options object;
// a changed option is seen on the next call, as if each call were checked afresh.
import assert from "node:assert/strict";
import { test } from "node:test";
import { DebounceConfigError, DebounceEncodeError, prepare } from "../dist/esm/index.js";

const call = { args: ["u1"] };

test("a changed option's value is used on the next call of the same options object", () => {
  const options = { debounce: "5m", maxWait: "30m", key: "report:{0}" };
  assert.deepEqual(prepare("proj.t", call, options).argv.slice(1, 4), ["300000", "1800000", "1:0"]);
  options.debounce = "10s";
  options.replacePayload = true;
  options.prefix = "myapp";
  const after = prepare("proj.t", call, options);
  assert.deepEqual(after.argv.slice(1, 4), ["10000", "1800000", "1:1"]);
  assert.deepEqual(after.keys, ["myapp:{0}:open:6:proj.t:report:u1", "myapp:{0}:due"]);
  options.key = "r:{0}";
  assert.equal(prepare("proj.t", call, options).key, "r:u1");
});

test("an option made invalid or unknown after a call is refused, as on the first call", () => {
  const options = { debounce: "5m", maxWait: "30m" };
  prepare("proj.t", call, options);
  options.maxWait = "1m";
  assert.throws(() => prepare("proj.t", call, options), DebounceConfigError);
  options.maxWait = "30m";
  prepare("proj.t", call, options);
  options.maxwait = "30m";
  assert.throws(() => prepare("proj.t", call, options), /did you mean 'maxWait'/);
  delete options.maxwait;
  options.prefix = "a{b}";
  assert.throws(() => prepare("proj.t", call, options), /prefix=/);
});

test("one options object for two tasks, shard counts and client kinds", () => {
  const options = { debounce: "5m", maxWait: "30m", key: "{0}", shards: 8 };
  const a = prepare("proj.a", call, options);
  const b = prepare("proj.b", call, options);
  assert.equal(a.ident, "6:proj.a:u1");
  assert.equal(b.ident, "6:proj.b:u1");
  assert.equal(prepare("proj.a", call, options).ident, a.ident);
  const plain = prepare("proj.a", call, options, false).keys;
  const cluster = prepare("proj.a", call, options, true).keys;
  assert.equal(plain[0], `debounce:{${a.shard}}:open:6:proj.a:u1`);
  assert.notDeepEqual(cluster, plain);
  assert.deepEqual(prepare("proj.a", call, options, false).keys, plain);
  options.shards = 1;
  assert.deepEqual(prepare("proj.a", call, options).keys, ["debounce:{0}:open:6:proj.a:u1", "debounce:{0}:due"]);
});

test("a task name that is not valid Unicode is refused on every call", () => {
  const options = { debounce: "5m", maxWait: "30m", key: "{0}" };
  assert.throws(() => prepare("proj.\uD800", call, options), /not valid Unicode/);
  assert.throws(() => prepare("proj.\uD800", call, options), /not valid Unicode/);
});

test("an error names the value it refused by its path", () => {
  const options = { debounce: "5m", maxWait: "30m", key: "{0}" };
  assert.throws(() => prepare("proj.t", { args: ["u1", { a: [1, undefined] }] }, options),
    { message: 'args[1]["a"][1] is undefined: not JSON' });
  assert.throws(() => prepare("proj.t", { args: ["u1"], kwargs: { n: 2 ** 60 } }, options),
    { message: /^kwargs\["n"\] is 1152921504606847000, an integer past 2\^53/ });
  const loop = [];
  loop.push(loop);
  assert.throws(() => prepare("proj.t", { args: ["u1", loop] }, options),
    { message: "args[1][0] refers to itself" });
  const twice = { x: 1 };
  assert.equal(prepare("proj.t", { args: ["u1", [twice, twice]] }, options).body,
    '[["u1", [{"x": 1}, {"x": 1}]], {}, {}]');
  assert.throws(() => prepare("proj.t", { args: [{ a: 1 }] }, { ...options, key: "{0.a.b}" }),
    { message: 'key "{0.a.b}": {0.a.b} needs \'0.a\' to be an object, got number' });
  assert.throws(() => prepare("proj.t", { args: [{ a: {} }] }, { ...options, key: "{0.a.b}" }),
    { message: 'key "{0.a.b}": {0.a.b}: \'0.a\' has no key \'b\'' });
});

test("arguments of the wrong shape are refused before anything is sent (the types let them through)", () => {
  // Call's types take any object for kwargs and any array for args, so that values typed
  // by an interface compile: the shape is checked here, at call time
  const options = { debounce: "5m", maxWait: "30m" };
  for (const kwargs of [["u1"], "u1", 3]) {  // null, as Python's None: no kwargs
    assert.throws(() => prepare("proj.t", { args: [], kwargs }, options),
      (exc) => exc instanceof DebounceConfigError && /^kwargs:/.test(exc.message), String(kwargs));
  }
  for (const args of [{ 0: "u1" }, "u1", 3]) {
    assert.throws(() => prepare("proj.t", { args, kwargs: {} }, options),
      (exc) => exc instanceof DebounceConfigError && /^args:/.test(exc.message), String(args));
  }
  assert.throws(() => prepare("proj.t", { args: [], kwargs: { f: () => 1 } }, options),
    (exc) => exc instanceof DebounceEncodeError && exc.message === 'kwargs["f"] is function: not JSON');
});

test("debounceMany's chunks: at most chunkSize calls and CHUNK_BYTES bytes, the first whatever its size", async () => {
  const { createRequire } = await import("node:module");
  const { CHUNK_BYTES, chunked } = createRequire(import.meta.url)("../dist/cjs/plan.js");
  assert.equal(CHUNK_BYTES, 16 * 1024 * 1024);  // Python's store/chunks.py
  const sizes = [5, 5, 5, 20, 1, 1, 1, 1];
  const at = (i) => sizes[i];
  assert.deepEqual(chunked([...sizes.keys()], 3, at, 12), [[0, 1], [2], [3], [4, 5, 6], [7]]);
  assert.deepEqual(chunked([...sizes.keys()], 1000, at, 1000), [[0, 1, 2, 3, 4, 5, 6, 7]]);
  assert.deepEqual(chunked([7, 3], 1, at), [[7], [3]]);
  assert.deepEqual(chunked([], 5, at), []);
});
