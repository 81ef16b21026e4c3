/** Errors, as the Python package names them (docs/contract.md). */

/** Base class of every error celery-debounced raises. */
export class DebounceError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** A debounce option or setting has a bad value (nothing was sent). */
export class DebounceConfigError extends DebounceError {}

/** A key template could not be resolved against the call's arguments (nothing was sent). */
export class DebounceKeyError extends DebounceError {}

/** The call's body exceeds `maxPayloadBytes` (nothing was sent). */
export class DebouncePayloadError extends DebounceError {}

/** An argument cannot be encoded as the Python producer would encode it (a number that
 * is not finite, an integer `number` past 2^53, a Date, a Map, undefined...): refused
 * rather than given another window (nothing was sent). */
export class DebounceEncodeError extends DebounceError {}

/** The debounce Redis could not be reached or refused the call. */
export class DebounceBackendError extends DebounceError {}

/** The gate call may have reached Redis but its reply was lost: it may or may not have
 * run, and it was not sent again. */
export class DebounceOutcomeUnknown extends DebounceBackendError {}

/** The gate refused the call: this producer speaks another version of the gate contract
 * than the gate script. Nothing was written. */
export class DebounceContractMismatch extends DebounceBackendError {
  constructor(message: string, readonly producer: string, readonly gate: string) {
    super(message);
  }
}

/** Some calls of a `debounceMany` were not written (as Python's DebounceBulkError):
 * `taskIds` has each written call's window id and null for the others; `errors` maps a
 * call's index to what kept it out; `unknown` lists those whose reply was lost (they may
 * have been written: retrying them may count them twice). Retry the others freely. */
export class DebounceBulkError extends DebounceBackendError {
  constructor(message: string, readonly taskIds: (string | null)[],
              readonly errors: ReadonlyMap<number, Error>, readonly unknown: readonly number[]) {
    super(message);
  }
}
