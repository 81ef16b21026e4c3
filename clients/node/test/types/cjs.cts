// Compiled (not run) by test/types.test.mjs: the shipped .d.ts as a CommonJS consumer sees them.
import { debounce, GATE_SCRIPT } from "celery-debounced";
export const f: typeof debounce = debounce;
export const script: string = GATE_SCRIPT;
