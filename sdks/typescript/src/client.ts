/**
 * The API client. Retries follow the Python SDK's one rule: a request is re-sent only when
 * the service cannot have acted on it twice, i.e. reads on any transport error or 429/5xx,
 * a submit only when the connection was never made or the answer was 429 (or, with an
 * idempotency key, like a read, since the key makes a second task impossible).
 */

import { APIConnectionError, GenhookError, WaitTimeout, errorFromResponse, isObject } from "./errors.js";
import {
  isDone,
  lora,
  type JwkSet,
  type Kind,
  type LoraChoice,
  type ModelInfo,
  type Prediction,
  type Priority,
  type TaskEvent,
  type TaskPage,
  type Usage,
} from "./models.js";
import { SSEDecoder } from "./sse.js";

export const DEFAULT_BASE_URL = "http://127.0.0.1:8000";
export const EDIT_MODEL = "genhook/image-edit";
export const VERSION = "0.1.0";

const SUBMIT_PATHS: Readonly<Record<Kind, string>> = {
  image: "/api/v1/model/generateImage",
  video: "/api/v1/model/generateVideo",
  audio: "/api/v1/model/generateAudio",
};
const RETRY_IDEMPOTENT: ReadonlySet<number> = new Set([429, 500, 502, 503, 504]);
const RETRY_UNSAFE: ReadonlySet<number> = new Set([429]);
/** Error codes that prove no byte of the request reached the service. */
const NOT_SENT: ReadonlySet<string> = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);
const MAX_RETRY_AFTER_MS = 60_000;
/** The service sends a comment at least every 15 s on an idle event stream. */
const STREAM_IDLE_MS = 60_000;
/** The service's longest `Prefer: wait`. */
const MAX_SERVER_WAIT_S = 60;

export interface ClientOptions {
  /** Sent as `Authorization: Bearer <key>`; default `$GENHOOK_API_KEY`. */
  apiKey?: string;
  /** Default `$GENHOOK_BASE_URL`, else http://127.0.0.1:8000. */
  baseUrl?: string;
  /** Per HTTP request, milliseconds (default 30 000). */
  timeoutMs?: number;
  /** Retries of one call (default 3). */
  maxRetries?: number;
  /** First retry delay and cap, milliseconds (default 500 and 8 000). */
  retryBackoffMs?: number;
  retryBackoffCapMs?: number;
  /** Bring your own fetch (a proxy agent, a test double of the network). */
  fetch?: typeof fetch;
}

export interface SubmitOptions {
  /** Which submit endpoint: `generateImage` (default), `generateVideo` or `generateAudio`. */
  kind?: Kind;
  /** Seconds (at most 60) to hold the answer until the task ends: `Prefer: wait=N`. */
  wait?: number;
  /** Sent as `Idempotency-Key`: a retry of the submit can never make a second task. */
  idempotencyKey?: string;
  /** Seconds the task may wait in the queue before it ends `timeout`: `X-Start-Deadline`. */
  startDeadline?: number;
  /** Orders the account's own waiting tasks (`high`, `normal` (the service's default), `low`);
   * sent as the body's `priority`. Above the key's bound: `Forbidden` (403). */
  priority?: Priority;
  /** The `traceparent` of the caller's trace, so the task's spans join it. */
  traceparent?: string;
  signal?: AbortSignal;
}

export interface EditOptions extends SubmitOptions {
  model?: string;
  size?: string;
  output_format?: "jpeg" | "png";
  thinking?: "enabled" | "disabled";
  prompt_optimization_mode?: "standard" | "fast";
  enable_base64_output?: boolean;
  webhook_url?: string;
  /** Any further request field, sent as given. */
  extra?: Record<string, unknown>;
}

export interface WaitOptions {
  /** Give up after this many milliseconds (default 300 000); `null` waits forever. */
  timeoutMs?: number | null;
  /** `"prefer-wait"` (default) holds each request open until the task ends (one request per
   * minute at most); `"poll"` asks again after a growing interval. */
  mode?: "prefer-wait" | "poll";
  pollIntervalMs?: number;
  maxPollIntervalMs?: number;
  onUpdate?: (prediction: Prediction) => void;
  signal?: AbortSignal;
}

export interface ListOptions {
  status?: string | readonly string[];
  model?: string;
  /** ISO 8601 with a zone, or epoch milliseconds. */
  since?: string;
  limit?: number;
  cursor?: string;
}

export type ImageInput = string | Uint8Array;

interface RequestSpec {
  method: "GET" | "POST";
  path: string;
  body?: unknown;
  headers?: Record<string, string>;
  idempotent: boolean;
  /** Extra read time on top of the client's timeout (a `Prefer: wait`). */
  extraMs?: number;
  signal?: AbortSignal | undefined;
  auth?: boolean;
}

function env(name: string): string | undefined {
  const value = typeof process !== "undefined" ? process.env[name] : undefined;
  return value === "" ? undefined : value;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Attempt 1 waits about `base`, attempt 2 about twice that, up to `cap`, with ±25% jitter. */
export function backoffDelay(attempt: number, baseMs: number, capMs: number): number {
  const delay = Math.min(capMs, baseMs * 2 ** Math.min(attempt - 1, 32));
  return Math.max(0, Math.min(capMs, delay * (1 + (Math.random() * 0.5 - 0.25))));
}

/** Milliseconds from a `Retry-After` value (seconds or an HTTP date), or undefined. */
export function parseRetryAfter(value: string | null): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  if (/^\d+(\.\d+)?$/.test(text)) return Number(text) * 1000;
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

function errorCode(error: unknown): string | undefined {
  for (let e: unknown = error, depth = 0; isObject(e) || e instanceof Error; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") return code;
    if (depth > 4) break;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/** Adds `Prefer: wait=N` for a wait of `wait` seconds; returns the read time it adds. */
function preferWait(headers: Record<string, string>, wait: number | undefined): number {
  if (wait === undefined) return 0;
  const seconds = Math.max(0, Math.ceil(wait));
  headers["Prefer"] = `wait=${seconds}`;
  return seconds * 1000;
}

function taskPath(taskId: string, tail = ""): string {
  return `/api/v1/model/result/${encodeURIComponent(taskId)}${tail}`;
}

const SIGNATURES: readonly (readonly [string, readonly number[]])[] = [
  ["image/jpeg", [0xff, 0xd8, 0xff]],
  ["image/png", [0x89, 0x50, 0x4e, 0x47]],
  ["image/gif", [0x47, 0x49, 0x46, 0x38]],
  ["image/bmp", [0x42, 0x4d]],
  ["image/tiff", [0x49, 0x49, 0x2a, 0x00]],
  ["image/tiff", [0x4d, 0x4d, 0x00, 0x2a]],
];

/** A base64 data URL of image bytes, its MIME type read from the bytes, never a name. */
export function dataUrl(bytes: Uint8Array): string {
  let mime = "application/octet-stream";
  for (const [type, magic] of SIGNATURES) {
    if (magic.every((b, i) => bytes[i] === b)) {
      mime = type;
      break;
    }
  }
  const riff = String.fromCharCode(...bytes.subarray(0, 4));
  const webp = String.fromCharCode(...bytes.subarray(8, 12));
  if (riff === "RIFF" && webp === "WEBP") mime = "image/webp";
  const brand = String.fromCharCode(...bytes.subarray(4, 12));
  if (/^ftyp(heic|heix|mif1|msf1|heif)/.test(brand)) mime = "image/heic";
  return `data:${mime};base64,${Buffer.from(bytes).toString("base64")}`;
}

/** A client of one genhook service. */
export class GenhookClient {
  readonly baseUrl: string;
  readonly apiKey: string | undefined;
  readonly timeoutMs: number;
  readonly maxRetries: number;
  private readonly backoffMs: number;
  private readonly backoffCapMs: number;
  private readonly fetchImpl: typeof fetch;

  constructor(options: ClientOptions = {}) {
    this.apiKey = options.apiKey ?? env("GENHOOK_API_KEY");
    this.baseUrl = (options.baseUrl ?? env("GENHOOK_BASE_URL") ?? DEFAULT_BASE_URL).replace(/\/+$/, "");
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.maxRetries = options.maxRetries ?? 3;
    this.backoffMs = options.retryBackoffMs ?? 500;
    this.backoffCapMs = options.retryBackoffCapMs ?? 8_000;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  private headers(accept = "application/json", auth = true): Record<string, string> {
    const headers: Record<string, string> = { Accept: accept, "User-Agent": `genhook-typescript/${VERSION}` };
    if (auth && this.apiKey) headers["Authorization"] = `Bearer ${this.apiKey}`;
    return headers;
  }

  private async request<T>(spec: RequestSpec): Promise<T> {
    const headers = { ...this.headers("application/json", spec.auth ?? true), ...spec.headers };
    let body: string | undefined;
    if (spec.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(spec.body);
    }
    for (let attempt = 1; ; attempt++) {
      const timeout = AbortSignal.timeout(this.timeoutMs + (spec.extraMs ?? 0));
      const signal = spec.signal ? AbortSignal.any([spec.signal, timeout]) : timeout;
      let response: Response;
      let text: string;
      try {
        response = await this.fetchImpl(this.baseUrl + spec.path, { method: spec.method, headers, body, signal });
        text = await response.text();
      } catch (error) {
        if (spec.signal?.aborted) throw spec.signal.reason;
        const sent = !NOT_SENT.has(errorCode(error) ?? "");
        if (attempt <= this.maxRetries && (spec.idempotent || !sent)) {
          await sleep(backoffDelay(attempt, this.backoffMs, this.backoffCapMs), spec.signal);
          continue;
        }
        const what = timeout.aborted ? "timed out" : `failed (${errorCode(error) ?? String(error)})`;
        throw new APIConnectionError(`${spec.method} ${spec.path} ${what}`, { cause: error });
      }
      if (response.status >= 400) {
        const allowed = spec.idempotent ? RETRY_IDEMPOTENT : RETRY_UNSAFE;
        if (attempt <= this.maxRetries && allowed.has(response.status)) {
          const after = parseRetryAfter(response.headers.get("Retry-After"));
          const delay =
            after !== undefined ? Math.min(after, MAX_RETRY_AFTER_MS) : backoffDelay(attempt, this.backoffMs, this.backoffCapMs);
          await sleep(delay, spec.signal);
          continue;
        }
        throw errorFromResponse(response.status, text);
      }
      try {
        return JSON.parse(text) as T;
      } catch {
        throw errorFromResponse(502, text);
      }
    }
  }

  private static prediction(data: unknown): Prediction {
    if (!isObject(data) || typeof data["id"] !== "string") {
      throw new GenhookError("the service answered with something other than a task", 502);
    }
    return data as unknown as Prediction;
  }

  /** Submit a task to any model. `fields` is the model's request body without `model`;
   * its `loras` may list `"NAME:SCALE"` strings (see `lora`). */
  async submit(model: string, fields: Record<string, unknown>, options: SubmitOptions = {}): Promise<Prediction> {
    const loras = fields["loras"];
    if (Array.isArray(loras)) fields = { ...fields, loras: loras.map((item) => lora(item as string | LoraChoice)) };
    const headers: Record<string, string> = {};
    if (options.idempotencyKey !== undefined) headers["Idempotency-Key"] = options.idempotencyKey;
    if (options.startDeadline !== undefined) headers["X-Start-Deadline"] = String(options.startDeadline);
    if (options.traceparent !== undefined) headers["traceparent"] = options.traceparent;
    const extraMs = preferWait(headers, options.wait);
    const data = await this.request<unknown>({
      method: "POST",
      path: SUBMIT_PATHS[options.kind ?? "image"],
      body: { ...fields, model, ...(options.priority !== undefined ? { priority: options.priority } : {}) },
      headers,
      idempotent: options.idempotencyKey !== undefined,
      extraMs,
      signal: options.signal,
    });
    return GenhookClient.prediction(data);
  }

  /** The image-edit submit: a prompt and 1 to 10 images (URLs, data URLs or raw bytes). */
  edit(prompt: string, images: ImageInput | readonly ImageInput[], options: EditOptions = {}): Promise<Prediction> {
    const list = Array.isArray(images) ? (images as readonly ImageInput[]) : [images as ImageInput];
    const fields: Record<string, unknown> = {
      prompt,
      images: list.map((item) => (typeof item === "string" ? item : dataUrl(item))),
    };
    for (const name of ["size", "output_format", "thinking", "prompt_optimization_mode", "enable_base64_output", "webhook_url"] as const) {
      // Unset options are left out so the service's documented defaults apply.
      if (options[name] !== undefined) fields[name] = options[name];
    }
    Object.assign(fields, options.extra);
    return this.submit(options.model ?? EDIT_MODEL, fields, options);
  }

  /** The task now, or once it ends within `wait` seconds; `logs` adds the engine's lines. */
  async result(taskId: string, options: { wait?: number; logs?: boolean; signal?: AbortSignal } = {}): Promise<Prediction> {
    const headers: Record<string, string> = {};
    const extraMs = preferWait(headers, options.wait);
    const data = await this.request<unknown>({
      method: "GET",
      path: taskPath(taskId, options.logs ? "?logs=1" : ""),
      headers,
      idempotent: true,
      extraMs,
      signal: options.signal,
    });
    return GenhookClient.prediction(data);
  }

  /** Until the task is completed, failed, timed out or canceled; a failed task is returned,
   * not thrown (see `raiseForFailure`). Throws `WaitTimeout` when `timeoutMs` passes first. */
  async wait(taskId: string, options: WaitOptions = {}): Promise<Prediction> {
    const timeoutMs = options.timeoutMs === undefined ? 300_000 : options.timeoutMs;
    const deadline = timeoutMs === null ? Infinity : Date.now() + timeoutMs;
    const mode = options.mode ?? "prefer-wait";
    let interval = options.pollIntervalMs ?? 500;
    const maxInterval = options.maxPollIntervalMs ?? 5_000;
    for (;;) {
      const left = deadline - Date.now();
      const wait = mode === "prefer-wait" ? Math.min(MAX_SERVER_WAIT_S, Math.floor(left / 1000)) : 0;
      const prediction = await this.result(taskId, {
        ...(wait > 0 ? { wait } : {}),
        ...(options.signal ? { signal: options.signal } : {}),
      });
      options.onUpdate?.(prediction);
      if (isDone(prediction)) return prediction;
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        throw new WaitTimeout(`task ${taskId} still ${prediction.status} after ${timeoutMs} ms`, prediction);
      }
      if (wait <= 0) {
        await sleep(Math.min(interval, remaining), options.signal);
        interval = Math.min(maxInterval, interval * 2);
      }
    }
  }

  /**
   * The task's event stream, ending after its terminal event. A broken connection is resumed
   * with `Last-Event-ID`, so no event is seen twice; after `maxRetries` failures in a row it
   * throws `APIConnectionError`. Pass `lastEventId` to resume a stream read earlier.
   */
  async *events(taskId: string, options: { lastEventId?: string; signal?: AbortSignal } = {}): AsyncGenerator<TaskEvent> {
    let lastId = options.lastEventId;
    let failures = 0;
    /** After a broken stream: wait before resuming, or give up once retries are spent. */
    const broken = async (error: unknown): Promise<void> => {
      if (options.signal?.aborted) throw options.signal.reason;
      failures++;
      if (failures > this.maxRetries) {
        throw new APIConnectionError(`the event stream of ${taskId} broke ${failures} times`, { cause: error });
      }
      await sleep(backoffDelay(failures, this.backoffMs, this.backoffCapMs), options.signal);
    };
    for (;;) {
      const controller = new AbortController();
      const abort = (): void => controller.abort(options.signal?.reason);
      options.signal?.addEventListener("abort", abort, { once: true });
      let idle: ReturnType<typeof setTimeout> | undefined;
      const arm = (): void => {
        clearTimeout(idle);
        idle = setTimeout(() => controller.abort(new Error("the event stream went silent")), STREAM_IDLE_MS);
      };
      try {
        const headers = this.headers("text/event-stream");
        if (lastId) headers["Last-Event-ID"] = lastId;
        arm();
        let response: Response;
        try {
          response = await this.fetchImpl(this.baseUrl + taskPath(taskId, "/events"), {
            headers,
            signal: controller.signal,
          });
        } catch (error) {
          await broken(error);
          continue;
        }
        if (response.status >= 400) {
          const text = await response.text();
          if (RETRY_IDEMPOTENT.has(response.status) && ++failures <= this.maxRetries) {
            await sleep(backoffDelay(failures, this.backoffMs, this.backoffCapMs), options.signal);
            continue;
          }
          throw errorFromResponse(response.status, text);
        }
        const decoder = new SSEDecoder();
        let ended = false;
        try {
          for await (const line of lines(response.body, arm)) {
            const event = decoder.feed(line);
            if (event === undefined) continue;
            failures = 0;
            lastId = event.id || lastId;
            yield event;
            if (isDone(event.prediction)) {
              ended = true;
              break;
            }
          }
        } catch (error) {
          await broken(error);
          continue;
        }
        if (ended) return;
        // The server closed the stream before the end (it restarted): resume.
        await broken(undefined);
      } finally {
        clearTimeout(idle);
        options.signal?.removeEventListener("abort", abort);
        controller.abort();
      }
    }
  }

  /** Cancel a task still created or processing; `Conflict` when it already ended. */
  async cancel(taskId: string, options: { signal?: AbortSignal } = {}): Promise<Prediction> {
    const data = await this.request<unknown>({
      method: "POST",
      path: taskPath(taskId, "/cancel"),
      idempotent: true,
      signal: options.signal,
    });
    return GenhookClient.prediction(data);
  }

  /** A page of the account's tasks, newest first. */
  tasks(options: ListOptions = {}): Promise<TaskPage> {
    const query = new URLSearchParams();
    if (options.status !== undefined) {
      query.set("status", typeof options.status === "string" ? options.status : options.status.join(","));
    }
    if (options.model !== undefined) query.set("model", options.model);
    if (options.since !== undefined) query.set("since", options.since);
    if (options.limit !== undefined) query.set("limit", String(options.limit));
    if (options.cursor !== undefined) query.set("cursor", options.cursor);
    const text = query.toString();
    return this.request<TaskPage>({
      method: "GET",
      path: "/api/v1/model/results" + (text ? `?${text}` : ""),
      idempotent: true,
    });
  }

  /** Every task of the account matching `options`, page after page. */
  async *allTasks(options: Omit<ListOptions, "cursor"> = {}): AsyncGenerator<Prediction> {
    let cursor: string | undefined;
    do {
      const page = await this.tasks({ ...options, ...(cursor ? { cursor } : {}) });
      yield* page.items;
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
  }

  async models(): Promise<ModelInfo[]> {
    const data = await this.request<{ models: ModelInfo[] }>({ method: "GET", path: "/api/v1/models", idempotent: true });
    return data.models;
  }

  /** One model of the catalogue; `NotFound` for an unknown id. */
  model(id: string): Promise<ModelInfo> {
    const path = "/api/v1/models/" + id.split("/").map(encodeURIComponent).join("/");
    return this.request<ModelInfo>({ method: "GET", path, idempotent: true });
  }

  usage(options: { limit?: number; cursor?: number } = {}): Promise<Usage> {
    const query = `limit=${options.limit ?? 100}` + (options.cursor !== undefined ? `&cursor=${options.cursor}` : "");
    return this.request<Usage>({ method: "GET", path: `/api/v1/usage?${query}`, idempotent: true });
  }

  /** The webhook signing keys (no API key needed). */
  jwks(): Promise<JwkSet> {
    return this.request<JwkSet>({ method: "GET", path: "/api/v1/webhooks/jwks.json", idempotent: true, auth: false });
  }
}

async function* lines(body: ReadableStream<Uint8Array> | null, onData: () => void): AsyncGenerator<string> {
  if (body === null) return;
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const chunk of body) {
    onData();
    buffer += decoder.decode(chunk, { stream: true });
    let start = 0;
    for (let end = buffer.indexOf("\n"); end >= 0; end = buffer.indexOf("\n", start)) {
      yield buffer.slice(start, end);
      start = end + 1;
    }
    buffer = buffer.slice(start);
  }
  buffer += decoder.decode();
  if (buffer) yield buffer;
}
