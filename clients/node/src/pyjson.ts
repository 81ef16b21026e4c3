/** JSON text byte-for-byte as Python's json module writes it with ensure_ascii
 * (docs/contract.md, sections 2 and 5): kombu's body encoding and the digest's canonical form. */
import { DebounceEncodeError } from "./errors.js";

/** What a call's arguments may hold: JSON values, and bigint for integers past 2^53. */
export type JsonValue =
  | null | boolean | number | bigint | string | JsonValue[] | { [key: string]: JsonValue };

const SHORT: Record<string, string> = {
  '"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f",
};

/** A string as Python's json.dumps writes it: every character outside ' '..'~' escaped,
 * as \uXXXX in lowercase hex (UTF-16 units: an astral character is its surrogate pair). */
export function pyString(text: string): string {
  let out = '"';
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0x20 && c <= 0x7e && c !== 0x22 && c !== 0x5c) continue;
    out += text.slice(start, i);
    const ch = text[i];
    out += SHORT[ch] ?? "\\u" + c.toString(16).padStart(4, "0");
    start = i + 1;
  }
  return out + text.slice(start) + '"';
}

/** A float as Python's repr writes it: the shortest round-trip digits, positional for a
 * decimal exponent in [-4, 16), else d.ddde±XX. */
export function pyFloat(x: number): string {
  const [mantissa, expText] = x.toExponential().split("e");
  const negative = mantissa.startsWith("-");
  const digits = mantissa.replace("-", "").replace(".", "");
  const exp = Number(expText);
  let out: string;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      const whole = digits.slice(0, exp + 1).padEnd(exp + 1, "0");
      out = `${whole}.${digits.slice(exp + 1) || "0"}`;
    } else {
      out = `0.${"0".repeat(-exp - 1)}${digits}`;
    }
  } else {
    const rest = digits.slice(1);
    out = `${digits[0]}${rest ? "." + rest : ""}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
  }
  return negative ? "-" + out : out;
}

/** A number's text, or an error: an integral `number` is an integer (safe ones only). */
export function pyNumber(x: number, where: string): string {
  if (!Number.isFinite(x)) {
    throw new DebounceEncodeError(`${where} is ${x}: JSON has no non-finite numbers`);
  }
  if (Number.isInteger(x)) {
    if (!Number.isSafeInteger(x)) {
      throw new DebounceEncodeError(
        `${where} is ${x}, an integer past 2^53 held as a number: its digits are not the value ` +
        "written; pass it as a bigint (or a string)");
    }
    return String(x);
  }
  return pyFloat(x);
}

function isPlainObject(value: object): boolean {
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/** Code point order (Python's str order), not UTF-16 unit order. */
export function byCodePoint(a: string, b: string): number {
  const x = [...a];
  const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i].codePointAt(0)! - y[i].codePointAt(0)!;
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

type Path = (string | number)[];

/** The error message's name of the value at `path` under `root` (built only on an error). */
function whereOf(root: string, path: Path): string {
  let out = root;
  for (const step of path) out += typeof step === "number" ? `[${step}]` : `[${JSON.stringify(step)}]`;
  return out;
}

function encode(value: unknown, compact: boolean, root: string, path: Path, seen: object[]): string {
  if (value === null) return "null";
  switch (typeof value) {
    case "boolean": return value ? "true" : "false";
    case "number": return Number.isSafeInteger(value) ? String(value) : pyNumber(value, whereOf(root, path));
    case "bigint": return value.toString();
    case "string": return pyString(value);
    case "object": break;
    default:
      throw new DebounceEncodeError(`${whereOf(root, path)} is ${typeof value}: not JSON`);
  }
  const obj = value as object;
  if (seen.includes(obj)) throw new DebounceEncodeError(`${whereOf(root, path)} refers to itself`);
  seen.push(obj);
  const comma = compact ? "," : ", ";
  let out: string;
  if (Array.isArray(obj)) {
    out = "[";
    for (let i = 0; i < obj.length; i++) {
      path.push(i);
      out += (i ? comma : "") + encode(obj[i], compact, root, path, seen);
      path.pop();
    }
    out += "]";
  } else if (isPlainObject(obj)) {
    const keys = Object.keys(obj);
    if (compact) keys.sort(byCodePoint);
    const record = obj as Record<string, unknown>;
    const colon = compact ? ":" : ": ";
    out = "{";
    for (let i = 0; i < keys.length; i++) {
      const k = keys[i];
      path.push(k);
      out += (i ? comma : "") + pyString(k) + colon + encode(record[k], compact, root, path, seen);
      path.pop();
    }
    out += "}";
  } else {
    throw new DebounceEncodeError(
      `${whereOf(root, path)} is a ${obj.constructor?.name ?? "object"}: only plain objects, arrays, ` +
      "strings, numbers, bigints, booleans and null can be sent (as the Python side encodes JSON)");
  }
  seen.pop();
  return out;
}

/** ``json.dumps(value)`` (``compact``: separators ',' ':' and sorted keys, the digest's form);
 * `where` names the value in an error message. */
export function pyJson(value: unknown, compact: boolean, where = "the call"): string {
  return encode(value, compact, where, [], []);
}
