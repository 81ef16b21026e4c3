/** `onOutage: "publish"` (Python's `debounce_on_outage="publish"`): when the windows' store
 * does not answer, the call is published as a plain Celery message, undebounced (it runs
 * once, as `debounce=False` would), through a publisher the caller gives; `redisBroker`
 * is one for Celery's Redis broker (kombu's Redis transport). docs/node.md, "When the
 * store is down". */
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import { DebounceConfigError } from "./errors.js";
import { pyString } from "./pyjson.js";

/** One Celery message (task protocol 2) and where it goes. */
export interface CeleryMessage {
  /** The queue it goes to (the task's route, or the call's `queue`). */
  queue: string;
  /** The exchange and routing key its delivery info names (default: "" and the queue). */
  exchange: string;
  routingKey: string;
  /** The message's priority (0 when none is set). */
  priority: number;
  /** Celery's protocol-2 headers: `task`, `id`, `lang`, `eta`, `expires`, ... */
  headers: Record<string, unknown>;
  /** The body, `[args, kwargs, embed]`, JSON as Python's producer writes it. */
  body: string;
  contentType: "application/json";
  contentEncoding: "utf-8";
  /** The message properties: `correlation_id` (the task id), `reply_to`, `delivery_mode`. */
  properties: { correlation_id: string; reply_to: string; delivery_mode: 2 };
}

/** Sends one message to the broker; its promise settles once the broker has it. */
export type Publisher = (message: CeleryMessage) => Promise<unknown>;

/** The stored options a plain message can carry (the rest refuse the fallback). */
const CARRIED = new Set(["queue", "routing_key", "exchange", "priority", "headers", "expires",
  "expires_at", "time_limit", "soft_time_limit", "ignore_result"]);
/** Headers that belong to a window's run, never to a plain message. */
const WINDOW_HEADERS = ["debounce_exclusive"];

/** The stored options `optionsJson` of a call of `task`, refused (DebounceConfigError)
 * when a plain message could not carry them: checked on every call with
 * `onOutage: "publish"`, so a call refused during an outage was refused before it too. */
export function checkPublishable(task: string, optionsJson: string): Record<string, unknown> {
  const options = optionsJson ? JSON.parse(optionsJson) as Record<string, unknown> : {};
  const other = Object.keys(options).filter((name) => !CARRIED.has(name));
  if (other.length) {
    throw new DebounceConfigError(
      `${task}: onOutage="publish" cannot publish a plain message with the option(s) ` +
      `${other.join(", ")} (a Node producer builds the message itself; use onOutage ` +
      '"raise" for this task): nothing was sent');
  }
  return options;
}

/** The plain message of one call of `task`: `args`/`kwargs` already encoded as the
 * body's first two items (`encoded`, "[args, kwargs"), its stored options JSON, a collect
 * task's run given a list of this one call (as Python's `single_call_args`). Throws
 * DebounceConfigError naming what a plain message cannot carry. */
export function plainMessage(task: string, encoded: string, optionsJson: string, collect: boolean,
                             taskId?: string): CeleryMessage {
  const options = checkPublishable(task, optionsJson);
  const id = taskId ?? randomUUID();
  const headers: Record<string, unknown> = { ...(options.headers as Record<string, unknown>) };
  for (const name of WINDOW_HEADERS) delete headers[name];
  const body = collect
    ? `[[[[${Date.now()}, ${encoded.slice(1)}${taskId ? `, ${pyString(taskId)}` : ""}]]], {}, {}]`
    : `${encoded}, {}]`;
  const expires = typeof options.expires === "number"
    ? new Date(Date.now() + options.expires * 1000).toISOString()
    : typeof options.expires_at === "string" ? options.expires_at : null;
  const queue = typeof options.queue === "string" ? options.queue : "celery";
  Object.assign(headers, {
    lang: "py", task, id, shadow: null, eta: null, expires, group: null, group_index: null,
    retries: 0, timelimit: [options.time_limit ?? null, options.soft_time_limit ?? null],
    root_id: id, parent_id: null, argsrepr: null, kwargsrepr: null,
    origin: `${process.pid}@${hostname()}`, ignore_result: options.ignore_result ?? false,
  });
  return {
    queue, exchange: typeof options.exchange === "string" ? options.exchange : "",
    routingKey: typeof options.routing_key === "string" ? options.routing_key : queue,
    priority: typeof options.priority === "number" ? options.priority : 0, headers, body,
    contentType: "application/json", contentEncoding: "utf-8",
    properties: { correlation_id: id, reply_to: "", delivery_mode: 2 },
  };
}

/** What `redisBroker` needs of an ioredis client. */
export interface BrokerRedis {
  lpush(key: string, value: string): Promise<unknown>;
  options?: { keyPrefix?: string };
}

/** kombu's Redis transport: a queue's priority steps, and the separator of a stepped
 * queue's list name (kombu/transport/redis.py). */
const PRIORITY_STEPS = [0, 3, 6, 9];
const STEP_SEPARATOR = "\x06\x16";

/** A publisher for Celery's Redis broker (`broker_url = "redis://..."`), on `client` (an
 * ioredis client of the broker's database): the message goes to its queue's list as
 * kombu's Redis transport writes it, which a worker consuming the queue reads. */
export function redisBroker(client: BrokerRedis): Publisher {
  if (client.options?.keyPrefix) {
    throw new DebounceConfigError(
      `redisBroker: the client has keyPrefix=${JSON.stringify(client.options.keyPrefix)}: ` +
      "kombu reads the queues' lists without it; give a client without keyPrefix");
  }
  return (message) => {
    const step = [...PRIORITY_STEPS].reverse().find((s) => s <= message.priority) ?? 0;
    const list = step ? `${message.queue}${STEP_SEPARATOR}${step}` : message.queue;
    const envelope = {
      body: Buffer.from(message.body, "utf8").toString("base64"),
      "content-encoding": message.contentEncoding,
      "content-type": message.contentType,
      headers: message.headers,
      properties: {
        ...message.properties, priority: message.priority, body_encoding: "base64",
        delivery_info: { exchange: message.exchange, routing_key: message.routingKey },
        delivery_tag: randomUUID(),
      },
    };
    return client.lpush(list, JSON.stringify(envelope));
  };
}
