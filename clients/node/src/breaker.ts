/** The outage breaker, per client (Python's producer/outage.py): after a call that waited
 * its whole timeout, calls fail at once until one call finds the store back. */
import { DebounceBackendError } from "./errors.js";
import type { GateResult } from "./plan.js";

/** Per client, while its store is taken for down: until when calls fail at once, and
 * whether a call is trying it again (Python's breaker, producer/outage.py). */
const breakers = new WeakMap<object, { until: number; probing: boolean }>();
let openBreakers = 0;

/** The errors of calls the store did not take for an outage (nothing reached it, no reply
 * came, the breaker was open): what `onOutage: "publish"` publishes plainly. */
const outages = new WeakSet<Error>();

/** `error`, marked as an outage's (Python's producer/outage.py outage_kind). */
export function outage<E extends Error>(error: E): E {
  outages.add(error);
  return error;
}

/** Whether `error` is an outage's (see `outage`). */
export function isOutage(error: unknown): boolean {
  return error instanceof Error && outages.has(error);
}

/** Whether any client's breaker is open (the hot path looks no further when none is). */
export function anyBreakerOpen(): boolean {
  return openBreakers > 0;
}

/** The error of a call the client's open breaker refuses at once; undefined when the call
 * may go (the breaker is shut, or this call is the one that tries again). */
export function breakerRefusal(client: object, timeoutMs: number): Error | undefined {
  const breaker = breakers.get(client);
  if (breaker === undefined) return undefined;
  if (Date.now() < breaker.until || breaker.probing) {
    return outage(new DebounceBackendError(
      `the store did not answer a call within its timeout (${timeoutMs} ms): calls fail at ` +
      "once until one call finds it back (outageProbeInterval); nothing was sent"));
  }
  breaker.probing = true;
  return undefined;
}

/** `result`, minding the breaker: a call that failed after waiting its whole timeout opens
 * it (or keeps it open), a call that got an answer shuts it. */
export function watched(client: object, timeoutMs: number, probeMs: number,
                 result: Promise<GateResult>): Promise<GateResult> {
  const started = Date.now();
  return result.then((answer) => {
    if (breakers.delete(client)) openBreakers--;
    return answer;
  }, (exc: unknown) => {
    const breaker = breakers.get(client);
    if (exc instanceof DebounceBackendError && Date.now() - started >= timeoutMs * 0.9) {
      if (breaker === undefined) openBreakers++;
      breakers.set(client, { until: Date.now() + probeMs, probing: false });
    } else if (breaker !== undefined) {
      breakers.delete(client);  // it answered (a refusal, a fast error): not taken for down
      openBreakers--;
    }
    throw exc;
  });
}
