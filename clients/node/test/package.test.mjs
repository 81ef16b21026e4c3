// The package as a user installs it: the packed tarball in a project of its own, with
// ioredis 5 or 6 beside it (a peer dependency: the project's one ioredis), the README's
// example compiled under NodeNext and Bundler and run against a real redis-server.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import {
  mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";
import { startRedis } from "./redis-server.mjs";

const here = fileURLToPath(new URL("..", import.meta.url));
const modules = join(here, "node_modules");
const tsc = join(modules, "typescript", "bin", "tsc");
let work;
let tarball;
let server;

before(async () => {
  work = mkdtempSync(join(tmpdir(), "debounce-pack-"));
  const out = execFileSync("npm", ["pack", "--ignore-scripts", "--pack-destination", work],
    { cwd: here, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  tarball = join(work, out.trim().split("\n").pop());
  server = await startRedis();
});

after(() => {
  server?.stop();
  if (work) rmSync(work, { recursive: true, force: true });
});

/** The README's first TypeScript block, as a user copies it. */
function readmeExample() {
  const found = /```ts\n([\s\S]*?)```/.exec(readFileSync(join(here, "README.md"), "utf8"));
  assert.ok(found, "README.md has a ```ts example");
  return found[1];
}

// values typed by interfaces, as an application's own types are
const INTERFACES = `import { Redis } from "ioredis";
import { DebounceError, debounce } from "celery-debounced";

interface Report { user: string; pages: number; tags: string[] }
interface Filters { since: string; report: Report }

export async function call(redis: Redis, report: Report, filters: Filters): Promise<string> {
  try {
    return await debounce(redis, "proj.build_report", { args: [report], kwargs: filters },
      { debounce: "5m", maxWait: "30m", key: "report:{0.user}" });
  } catch (exc) {
    if (exc instanceof DebounceError) throw new Error(exc.message);
    throw exc;
  }
}
`;

const RESOLUTIONS = {
  NodeNext: { module: "NodeNext", moduleResolution: "NodeNext" },
  Bundler: { module: "ESNext", moduleResolution: "Bundler" },
};

/** A project with the tarball installed and `ioredis` the dev copy `ioredis` (5) or
 * `ioredis6`; the README's example pointed at the test's server. */
function project(ioredis, resolution) {
  const dir = mkdtempSync(join(work, `${ioredis}-${resolution}-`));
  const installed = join(dir, "node_modules", "celery-debounced");
  mkdirSync(installed, { recursive: true });
  execFileSync("tar", ["xzf", tarball, "-C", installed, "--strip-components=1"]);
  symlinkSync(join(modules, ioredis), join(dir, "node_modules", "ioredis"), "dir");
  symlinkSync(join(modules, "@types"), join(dir, "node_modules", "@types"), "dir");
  writeFileSync(join(dir, "package.json"), JSON.stringify({ type: "module", private: true }));
  const example = readmeExample();
  const local = example.replace("redis://localhost:6379/0", `redis://127.0.0.1:${server.port}/0`);
  assert.notEqual(local, example, "the README's example names redis://localhost:6379/0");
  writeFileSync(join(dir, "example.ts"), local);
  writeFileSync(join(dir, "interfaces.ts"), INTERFACES);
  writeFileSync(join(dir, "tsconfig.json"), JSON.stringify({
    compilerOptions: {
      ...RESOLUTIONS[resolution], target: "ES2022", strict: true, outDir: "out",
      types: ["node"], skipLibCheck: true,
    },
    files: ["example.ts", "interfaces.ts"],
  }));
  return dir;
}

function compile(dir) {
  try {
    execFileSync(process.execPath, [tsc, "-p", dir], { encoding: "utf8", stdio: "pipe" });
  } catch (exc) {
    assert.fail(`tsc in ${dir}:\n${exc.stdout}${exc.stderr}`);
  }
}

for (const ioredis of ["ioredis", "ioredis6"]) {
  for (const resolution of Object.keys(RESOLUTIONS)) {
    test(`the README's example compiles and runs with ${ioredis} under ${resolution}`, () => {
      const dir = project(ioredis, resolution);
      compile(dir);
      const printed = execFileSync(process.execPath, [join(dir, "out", "example.js")],
        { cwd: dir, encoding: "utf8", timeout: 30_000 });
      assert.match(printed.trim(), /^[0-9a-f-]{36}$/, "the window's task id");
    });
  }
}

test("the ioredis copies are a 5 and a 6, and the package asks for either as a peer", () => {
  const major = (name) =>
    JSON.parse(readFileSync(join(modules, name, "package.json"), "utf8")).version.split(".")[0];
  assert.deepEqual([major("ioredis"), major("ioredis6")], ["5", "6"]);
  const manifest = JSON.parse(readFileSync(join(here, "package.json"), "utf8"));
  assert.equal(manifest.dependencies, undefined, "ioredis is not bundled: one copy, the user's");
  assert.equal(manifest.peerDependencies.ioredis, "^5.4.1 || ^6.0.0");
});

test("one class per error when a process both imports and requires the package", () => {
  const dir = project("ioredis", "NodeNext");
  writeFileSync(join(dir, "both.mjs"), `
import { createRequire } from "node:module";
import * as imported from "celery-debounced";
const required = createRequire(import.meta.url)("celery-debounced");
const names = Object.keys(imported).sort();
const same = names.filter((name) => imported[name] === required[name]);
const caught = new required.DebounceConfigError("x") instanceof imported.DebounceError;
console.log(JSON.stringify({ names, same, caught }));
`);
  const { names, same, caught } = JSON.parse(execFileSync(process.execPath, [join(dir, "both.mjs")],
    { cwd: dir, encoding: "utf8" }));
  assert.ok(names.includes("DebounceConfigError") && names.includes("debounce"), names.join());
  assert.deepEqual(same, names);
  assert.equal(caught, true);
});
