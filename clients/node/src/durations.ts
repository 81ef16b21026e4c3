import { DebounceConfigError } from "./errors.js";

/** A duration: seconds as a number, or text such as "250ms", "10s", "5m", "1h30m", "1d". */
export type Duration = number | string;

const UNIT_MS: Record<string, number> = { d: 86_400_000, h: 3_600_000, m: 60_000, s: 1000, ms: 1 };
const NUM = "[0-9]+(?:\\.[0-9]+)?";
const WHOLE = new RegExp(
  `^(?:(?<d>${NUM})d)?(?:(?<h>${NUM})h)?(?:(?<m>${NUM})m(?!s))?(?:(?<s>${NUM})s)?(?:(?<ms>${NUM})ms)?$`);
const CAPITAL_M = /M(?![sS])/;
const SECONDS = new RegExp(`^(?:-?${NUM}|-?\\.[0-9]+)$`);
/** Longest duration accepted (10 years). */
export const MAX_MS = 10 * 365 * 86_400_000;

/** Python's round(): halves to even. */
function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const diff = x - f;
  if (diff > 0.5) return f + 1;
  if (diff < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/** `value` as a positive whole number of milliseconds (docs/contract.md, section 6). */
export function parseDuration(option: string, value: unknown): number {
  let ms: number;
  const shown = JSON.stringify(value) ?? String(value);
  if (typeof value === "boolean") {
    throw new DebounceConfigError(`${option}=${shown}: expected a duration, not a boolean`);
  } else if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new DebounceConfigError(`${option}=${shown}: duration must be finite`);
    ms = value * 1000;
  } else if (typeof value === "string") {
    if (CAPITAL_M.test(value)) {
      throw new DebounceConfigError(
        `${option}=${shown}: 'M' is ambiguous (minutes, or months as in ISO 8601 and many config ` +
        "formats?): write 'm' for minutes, or the duration in days ('30d')");
    }
    const text = value.trim().toLowerCase().replace(/ /g, "");
    const whole = text ? WHOLE.exec(text) : null;
    const groups = whole?.groups ?? {};
    if (whole && Object.values(groups).some((v) => v !== undefined)) {
      ms = 0;
      for (const unit of ["d", "h", "m", "s", "ms"]) {
        const num = groups[unit];
        if (num !== undefined) ms += Number(num) * UNIT_MS[unit];
      }
    } else if (SECONDS.test(text)) {
      ms = Number(text) * 1000;
    } else {
      throw new DebounceConfigError(
        `${option}=${shown}: cannot parse duration; use e.g. '250ms', '10s', '5m', '2h', '1d', ` +
        "'1h30m' (each unit once, largest first) or seconds as a number with ASCII digits");
    }
  } else {
    throw new DebounceConfigError(
      `${option}=${shown}: expected a duration (a number of seconds or a string), got ${typeof value}`);
  }
  if (ms > MAX_MS) throw new DebounceConfigError(`${option}=${shown}: duration longer than 10 years`);
  if (ms <= 0) throw new DebounceConfigError(`${option}=${shown}: duration must be positive`);
  const result = roundHalfEven(ms);
  if (result <= 0) {
    throw new DebounceConfigError(
      `${option}=${shown}: duration below 1 ms (durations are whole milliseconds; the shortest is '1ms')`);
  }
  return result;
}
