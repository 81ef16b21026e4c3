/** Key templates (docs/contract.md, section 3): parsed once, resolved per call. */
import { DebounceConfigError, DebounceKeyError } from "./errors.js";
import { pyNumber } from "./pyjson.js";

interface Placeholder { head: string | number; path: string[]; text: string }
type Part = string | Placeholder;

/** A parsed `key` template. */
export interface KeyTemplate {
  source: string;
  parts: Part[];
  /** `source` as error messages show it (JSON). */
  shown: string;
}

const FIELD = /^(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+)$/;
const SUBKEY = /^[^.{}[\]!:]+$/;
const cache = new Map<string, KeyTemplate>();

/** Parse `source`; a DebounceConfigError on bad syntax. */
export function parseTemplate(source: unknown, option = "key"): KeyTemplate {
  if (typeof source !== "string") {
    throw new DebounceConfigError(`${option}=${JSON.stringify(source)}: expected a string template`);
  }
  const known = cache.get(source);
  if (known) return known;
  const parts: Part[] = [];
  let literal = "";
  let i = 0;
  const shown = JSON.stringify(source);
  while (i < source.length) {
    const ch = source[i];
    if (ch === "{" && source.startsWith("{{", i)) { literal += "{"; i += 2; }
    else if (ch === "}" && source.startsWith("}}", i)) { literal += "}"; i += 2; }
    else if (ch === "}") {
      throw new DebounceConfigError(`${option}=${shown}: single '}' at ${i}; write '}}'`);
    } else if (ch === "{") {
      const end = source.indexOf("}", i);
      if (end < 0) throw new DebounceConfigError(`${option}=${shown}: unclosed '{' at ${i}`);
      const body = source.slice(i + 1, end);
      if (literal) { parts.push(literal); literal = ""; }
      const [head, ...path] = body.split(".");
      if (!FIELD.test(head) || !path.every((p) => SUBKEY.test(p))) {
        throw new DebounceConfigError(
          `${option}=${shown}: bad placeholder {${body}}; use {name}, {0} or {name.field} ` +
          "(no attribute access, indexing, conversions or format specs)");
      }
      parts.push({ head: /^[0-9]+$/.test(head) ? Number(head) : head, path, text: body });
      i = end + 1;
    } else { literal += ch; i += 1; }
  }
  if (literal) parts.push(literal);
  const template = { source, parts, shown };
  if (cache.size > 1024) cache.clear();
  cache.set(source, template);
  return template;
}

function isMapping(value: unknown): value is Record<string, unknown> {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function typeName(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value === "object" ? "object" : typeof value;
}

/** The key text of a scalar, or undefined for a value that is not one. */
export function scalarText(value: unknown, where: string): string | undefined {
  switch (typeof value) {
    case "string": return value;
    case "boolean": return value ? "true" : "false";
    case "number": return pyNumber(value, where);
    case "bigint": return value.toString();
    default: return undefined;
  }
}

/** The placeholder's head and its first `depth` fields, as an error message names them. */
function walkedTo(part: Placeholder, depth: number): string {
  return [part.head, ...part.path.slice(0, depth)].join(".");
}

/** Resolve `template` against a call's `args` and `kwargs`; a DebounceKeyError when a
 * placeholder resolves to nothing (nothing is written). */
export function resolveTemplate(template: KeyTemplate, args: readonly unknown[],
                                kwargs: Record<string, unknown>): string {
  const src = template.shown;
  let out = "";
  for (const part of template.parts) {
    if (typeof part === "string") { out += part; continue; }
    let value: unknown;
    if (typeof part.head === "number") {
      if (part.head >= args.length) {
        throw new DebounceKeyError(
          `key ${src}: {${part.text}} refers to argument ${part.head} but the call has ` +
          `${args.length} positional argument(s)`);
      }
      value = args[part.head];
    } else {
      if (!Object.prototype.hasOwnProperty.call(kwargs, part.head)) {
        throw new DebounceKeyError(
          `key ${src}: {${part.text}} names no argument of this call (arguments: ` +
          `${Object.keys(kwargs).join(", ") || "none"})`);
      }
      value = kwargs[part.head];
    }
    for (let depth = 0; depth < part.path.length; depth++) {
      const field = part.path[depth];
      if (!isMapping(value)) {
        throw new DebounceKeyError(
          `key ${src}: {${part.text}} needs '${walkedTo(part, depth)}' to be an object, got ${typeName(value)}`);
      }
      if (!Object.prototype.hasOwnProperty.call(value, field)) {
        throw new DebounceKeyError(`key ${src}: {${part.text}}: '${walkedTo(part, depth)}' has no key '${field}'`);
      }
      value = value[field];
    }
    const text = typeof value === "string" ? value : scalarText(value, `key ${src}: {${part.text}}`);
    if (text === undefined) {
      throw new DebounceKeyError(
        `key ${src}: {${part.text}} resolved to ${typeName(value)}; a key needs a string, ` +
        "number, bigint or boolean");
    }
    out += text;
  }
  if (!wellFormed(out)) {
    throw new DebounceKeyError(`key ${src} resolved to text that is not valid Unicode (a lone surrogate)`);
  }
  if (out.includes("\u0000")) {  // PostgreSQL's text cannot hold it: refused on every store
    throw new DebounceKeyError(
      `key ${src} resolved to text holding a NUL character (at position ${out.indexOf("\u0000")}); ` +
      "a key cannot hold NUL on any store");
  }
  return out;
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** True when `text` is valid Unicode (no lone surrogate): it has a UTF-8 encoding. */
export function wellFormed(text: string): boolean {
  return !LONE_SURROGATE.test(text);
}
