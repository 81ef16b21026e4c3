/** A call's arguments bound to its task's published signature, as the Python producer
 * binds them (Python's `inspect.Signature.bind`, then the defaults): the default key
 * digests, and key templates resolve against, the bound arguments (docs/contract.md,
 * "Binding"). */

/** A parameter's kind, by Python's `inspect.Parameter` kinds. */
export type ParameterKind =
  "positional_only" | "positional_or_keyword" | "var_positional" | "keyword_only" | "var_keyword";

/** One parameter of a published signature. */
export interface Parameter {
  name: string;
  kind: ParameterKind;
  /** The default, when it has one JSON carries as Python holds it. */
  default?: unknown;
  /** It has a default that JSON cannot carry as Python holds it (a date, 1.0...). */
  default_unusable?: boolean;
}

/** The call does not fit the signature: Python's `Signature.bind` raises TypeError. */
export class BindError extends Error {}

/** The call needs a default that only Python holds (`default_unusable`). */
export class UnusableDefault extends Error {
  constructor(readonly parameter: string) {
    super(`parameter ${JSON.stringify(parameter)} has a default only Python can hold`);
  }
}

const has = (o: object, k: string): boolean => Object.prototype.hasOwnProperty.call(o, k);
/** Set an own data property (a key "__proto__" included, never the prototype). */
const put = (o: Record<string, unknown>, k: string, v: unknown): void => {
  Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
};

/** `[positional, named]` of a call: each parameter that is not keyword-only in
 * `positional`, every named one in `named`, `*args` spread into `positional` and
 * `**kwargs` into `named`, defaults applied. A BindError where Python's bind raises. */
export function bindArguments(params: readonly Parameter[], args: readonly unknown[],
                              kwargs: Record<string, unknown>): [unknown[], Record<string, unknown>] {
  const bound = new Map<string, unknown>();
  const left: Record<string, unknown> = { ...kwargs };
  let i = 0;
  let rest: unknown[] = [];
  for (let p = 0; p < params.length && i < args.length; p++) {
    const param = params[p];
    if (param.kind === "var_keyword" || param.kind === "keyword_only") break;
    if (param.kind === "var_positional") { rest = args.slice(i); i = args.length; break; }
    if (param.kind !== "positional_only" && has(left, param.name)) {
      throw new BindError(`multiple values for argument ${JSON.stringify(param.name)}`);
    }
    bound.set(param.name, args[i++]);
  }
  if (i < args.length) throw new BindError("too many positional arguments");
  const varKeyword = params.find((param) => param.kind === "var_keyword");
  for (const param of params) {
    if (bound.has(param.name) || param.kind === "var_positional" || param.kind === "var_keyword") continue;
    if (param.kind === "positional_only" && has(left, param.name) && varKeyword === undefined) {
      throw new BindError(`${JSON.stringify(param.name)} parameter is positional only, but was passed as a keyword`);
    }
    if (param.kind !== "positional_only" && has(left, param.name)) {
      bound.set(param.name, left[param.name]);
      delete left[param.name];
    } else if (param.default_unusable) {
      throw new UnusableDefault(param.name);
    } else if (has(param, "default")) {
      bound.set(param.name, param.default);
    } else {
      throw new BindError(`missing a required argument: ${JSON.stringify(param.name)}`);
    }
  }
  if (varKeyword === undefined) {
    const extra = Object.keys(left)[0];
    if (extra !== undefined) throw new BindError(`got an unexpected keyword argument ${JSON.stringify(extra)}`);
  }
  const positional: unknown[] = [];
  const named: Record<string, unknown> = {};
  for (const param of params) {
    if (param.kind === "var_positional") positional.push(...rest);
    else if (param.kind === "var_keyword") for (const k of Object.keys(left)) put(named, k, left[k]);
    else {
      const value = bound.get(param.name);
      if (param.kind !== "keyword_only") positional.push(value);
      put(named, param.name, value);
    }
  }
  return [positional, named];
}
