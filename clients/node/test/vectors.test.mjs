// The shared conformance cases (contract/vectors.json, docs/contract.md) against this producer.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import {
  CONTRACT_VERSION, DebounceConfigError, DebounceEncodeError, DebounceKeyError,
  DebouncePayloadError, prepare,
} from "../dist/esm/index.js";

const vectors = JSON.parse(
  readFileSync(new URL("../../../contract/vectors.json", import.meta.url), "utf8"));

function decode(value) {
  if (Array.isArray(value)) return value.map(decode);
  if (value && typeof value === "object") {
    const keys = Object.keys(value);
    if (keys.length === 1 && keys[0] === "$int") return BigInt(value.$int);
    if (keys.length === 1 && keys[0] === "$number") return Number(value.$number);
    if (keys.length === 1 && keys[0] === "$float") throw new Error("a Python-only case");
    return Object.fromEntries(keys.map((k) => [k, decode(value[k])]));
  }
  return value;
}

/** A published definition whose every option the case's own options override: only its
 * signature counts. */
function definitionWith(task, signature, collect = false) {
  return {
    format: 1, contract: CONTRACT_VERSION, version: "v", task, debounce_ms: 1000,
    max_wait_ms: 1000, key: null, replace_payload: false, max_calls: null, leading: false,
    trailing: true, collect, exclusive: false, options: "{}", accepts_json: true,
    check_arguments: false, signature, shards: 1, max_key_length: 1024,
    max_payload_bytes: 1048576, history_ttl_ms: 3600000, result_expires_ms: null,
  };
}

function kind(exc) {
  if (exc instanceof DebounceKeyError) return "key";
  if (exc instanceof DebouncePayloadError) return "payload";
  if (exc instanceof DebounceEncodeError) return "encode";
  if (exc instanceof DebounceConfigError) return "config";
  throw exc;
}

function outcome(c) {
  let call;
  try {
    const options = { ...c.options, ...(c.settings ?? {}) };
    call = prepare(c.task, { args: decode(c.args), kwargs: decode(c.kwargs) }, options, false,
      c.signature || c.collect ? definitionWith(c.task, c.signature ? decode(c.signature) : null, c.collect) : null);
  } catch (exc) {
    return { error: { kind: kind(exc) } };
  }
  return { expect: {
    key: call.key, ident: call.ident, shard: call.shard, keys: call.keys,
    argv: [...call.argv.slice(1, 5), call.argv[6], ...call.argv.slice(11)], body: call.body,
  } };
}

test("one contract version: the package's and the vectors'", () => {
  assert.equal(CONTRACT_VERSION, vectors.contract_version);
});

for (const c of vectors.cases) {
  if (!(c.sides ?? ["python", "node"]).includes("node")) continue;
  test(`vector: ${c.name}`, () => {
    const want = c.expect ? { expect: c.expect } : { error: c.error };
    assert.deepEqual(outcome(c), want);
  });
}
