/** A verified webhook delivery, and the one error a refused delivery raises. */

import type { Prediction } from "./models.js";

/** Machine-readable reasons a delivery was refused; the Python SDK's, stable to branch on. */
export const VerificationFailure = {
  MISSING_HEADER: "missing_header",
  INVALID_TIMESTAMP: "invalid_timestamp",
  TIMESTAMP_OUT_OF_TOLERANCE: "timestamp_out_of_tolerance",
  NO_USABLE_SIGNATURE: "no_usable_signature",
  MALFORMED_SIGNATURE: "malformed_signature",
  UNKNOWN_KEY: "unknown_key",
  KEYS_UNAVAILABLE: "keys_unavailable",
  BAD_SIGNATURE: "bad_signature",
  INVALID_BODY: "invalid_body",
  ID_MISMATCH: "id_mismatch",
  EVENT_MISMATCH: "event_mismatch",
} as const;

export type VerificationFailure = (typeof VerificationFailure)[keyof typeof VerificationFailure];

export class WebhookVerificationError extends Error {
  readonly reason: VerificationFailure;

  constructor(reason: VerificationFailure, message: string) {
    super(`${reason}: ${message}`);
    this.name = "WebhookVerificationError";
    this.reason = reason;
  }
}

export type Scheme = "ed25519" | "hmac";

/** The delivery body (docs/webhooks.md), as sent. */
export interface WebhookBody {
  readonly session_id: string;
  readonly event_type: string;
  readonly status: "OK" | "ERROR" | (string & {});
  readonly created_at?: number;
  readonly payload?: Prediction;
  readonly error?: string;
  readonly [field: string]: unknown;
}

/** A delivery whose signature, timestamp and id checked out. */
export class WebhookEvent {
  readonly sessionId: string;
  readonly eventType: string;
  readonly status: string;
  /** Which signature was verified, and with which key. */
  readonly scheme: Scheme;
  readonly keyId: string | undefined;
  /** The signed delivery time, epoch seconds. */
  readonly timestamp: number;
  readonly raw: WebhookBody;

  constructor(raw: WebhookBody, scheme: Scheme, keyId: string | undefined, timestamp: number) {
    this.raw = raw;
    this.sessionId = String(raw.session_id ?? "");
    this.eventType = String(raw.event_type ?? "");
    this.status = String(raw.status ?? "");
    this.scheme = scheme;
    this.keyId = keyId;
    this.timestamp = timestamp;
  }

  /** `status` is `OK`: `payload.outputs` holds a usable result. */
  get ok(): boolean {
    return this.status === "OK";
  }

  get taskId(): string {
    return this.sessionId;
  }

  /** The task, in the result endpoint's shape. */
  get payload(): Prediction {
    const payload = this.raw.payload;
    return { id: this.sessionId, model: "", status: "", ...(payload ?? {}) } as Prediction;
  }

  /** Why the task failed or timed out; only when `status` is `ERROR`. */
  get error(): string | undefined {
    return typeof this.raw.error === "string" ? this.raw.error : undefined;
  }

  /** Task creation time, epoch milliseconds. */
  get createdAt(): number | undefined {
    return Number.isInteger(this.raw.created_at) ? this.raw.created_at : undefined;
  }
}
