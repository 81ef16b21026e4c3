// The shipped types, as ESM and CommonJS consumers compile against them.
import { execFileSync } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

test("the .d.ts type-check for an ESM and a CommonJS consumer", () => {
  const tsc = fileURLToPath(new URL("../node_modules/typescript/bin/tsc", import.meta.url));
  const project = fileURLToPath(new URL("./types/tsconfig.json", import.meta.url));
  execFileSync(process.execPath, [tsc, "-p", project], { stdio: "pipe" });
});
