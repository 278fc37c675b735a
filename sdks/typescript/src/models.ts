/**
 * The service's answers, typed as they arrive on the wire (snake_case field names), so a
 * field documented in docs/api.md is found under the same name here. Every field but `id`,
 * `model` and `status` may be absent: an older or newer service never breaks parsing.
 */

import { TaskFailed } from "./errors.js";

export type Kind = "image" | "video" | "audio";

export type TaskStatus =
  | "created"
  | "processing"
  | "completed"
  | "failed"
  | "timeout"
  | "canceled";

/** Statuses after which a task never changes again. */
export const TERMINAL_STATUSES: ReadonlySet<string> = new Set([
  "completed",
  "failed",
  "timeout",
  "canceled",
]);

export interface LogLine {
  readonly at: string;
  readonly message: string;
}

export interface SttSegment {
  readonly start: number;
  readonly end: number;
  readonly text: string;
}

export interface SttWord {
  readonly word: string;
  readonly start: number;
  readonly end: number;
  readonly probability: number;
}

export interface SttResult {
  readonly text: string;
  readonly language: string;
  readonly language_probability: number;
  readonly duration: number;
  readonly segments?: readonly SttSegment[];
  readonly words?: readonly SttWord[];
}

/** A task's priority: the order among its account's own waiting tasks. */
export type Priority = "high" | "normal" | "low";

/** A task as the submit, result, cancel and listing endpoints (and webhooks) render it. */
export interface Prediction {
  readonly id: string;
  readonly model: string;
  readonly status: TaskStatus | (string & {});
  readonly outputs?: readonly string[];
  readonly has_nsfw_contents?: readonly boolean[];
  readonly created_at?: string;
  readonly completed_at?: string | null;
  readonly urls?: Readonly<Record<string, string>>;
  readonly error?: string | null;
  readonly error_code?: number | null;
  readonly info?: Readonly<Record<string, unknown>> | null;
  readonly queue_position?: number | null;
  readonly started_at?: string | null;
  readonly progress?: number | null;
  readonly logs?: readonly LogLine[] | null;
  readonly outputs_expire_at?: string | null;
  readonly stt_result?: SttResult | null;
  /** Present when the task's priority is not `normal`. */
  readonly priority?: Priority;
  readonly [field: string]: unknown;
}

/** One event of a task's stream: `event` is the status it reports. */
export interface TaskEvent {
  readonly id: string;
  readonly event: string;
  readonly prediction: Prediction;
}

export interface TaskPage {
  readonly items: readonly Prediction[];
  /** Pass as `cursor` for the next page; null on the last. */
  readonly next_cursor: string | null;
}

export interface ModelInfo {
  readonly id: string;
  readonly kind: Kind | (string & {});
  readonly description: string;
  readonly submit_paths: readonly string[];
  readonly request_schema: Readonly<Record<string, unknown>>;
  readonly pricing: Readonly<Record<string, unknown>>;
  readonly deadline_seconds: number;
  /** Named choices of request fields with what each is: voices, styles, a local model's `loras`. */
  readonly choices?: Readonly<Record<string, unknown>> | null;
}

/** A request's LoRA adapter (local models): one the model offers by `name`, or a `url`
 * where the service allows them; `scale` unset takes the adapter's own. */
export interface LoraChoice {
  readonly name?: string;
  readonly url?: string;
  readonly scale?: number;
}

/** One adapter a local model offers, as its catalogue entry's `choices.loras` lists it. */
export interface LoraOption {
  readonly name: string;
  readonly description: string;
  readonly scale: number;
  readonly price_usd: string;
}

/** A LoRA adapter from `NAME`, `NAME:SCALE` (`film:0.8`) or an https URL; an object is kept. */
export function lora(choice: string | LoraChoice): LoraChoice {
  if (typeof choice !== "string") return choice;
  if (/^https?:\/\//.test(choice)) return { url: choice };
  const colon = choice.lastIndexOf(":");
  if (colon < 0) return { name: choice };
  const scale = Number(choice.slice(colon + 1));
  if (choice.slice(colon + 1).trim() === "" || !Number.isFinite(scale)) {
    throw new TypeError(`LoRA ${JSON.stringify(choice)}: the scale after ':' must be a number`);
  }
  return { name: choice.slice(0, colon), scale };
}

/** The LoRA adapters a model offers (none for a model without any). */
export function loraOptions(model: ModelInfo): LoraOption[] {
  const offered = model.choices?.["loras"];
  return Array.isArray(offered) ? (offered as LoraOption[]) : [];
}

export interface UsageItem {
  readonly task_id: string;
  readonly model: string;
  readonly tier: string;
  readonly output_pixels: number;
  readonly input_images: number;
  readonly lines: readonly (readonly [string, string])[];
  /** A decimal string: money is never a binary float. */
  readonly amount_usd: string;
  readonly created_at: string;
}

export interface Usage {
  readonly account_id: string;
  readonly currency: "USD";
  readonly total_usd: string;
  readonly task_count: number;
  readonly items: readonly UsageItem[];
  readonly next_cursor?: number | null;
}

export interface Jwk {
  readonly kty: string;
  readonly crv?: string;
  readonly x?: string;
  readonly use?: string;
  readonly alg?: string;
  readonly kid?: string;
}

export interface JwkSet {
  readonly keys: readonly Jwk[];
}

export function isDone(prediction: Prediction): boolean {
  return TERMINAL_STATUSES.has(prediction.status);
}

/** Returns the task when it completed; throws `TaskFailed` when it failed, timed out or was
 * canceled. A task still running is returned as it is. */
export function raiseForFailure(prediction: Prediction): Prediction {
  if (isDone(prediction) && prediction.status !== "completed") {
    const reason = prediction.error ?? prediction.status;
    throw new TaskFailed(`task ${prediction.id} ${prediction.status}: ${reason}`, prediction);
  }
  return prediction;
}
