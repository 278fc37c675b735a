/**
 * Errors as the service names them. An HTTP error answer `{code, message, errors}` becomes the
 * class the server raised (InvalidRequest for 400, NotFound for 404, ...), with the server's
 * field errors, so callers branch on one set of names on both sides of the wire.
 */

import type { Prediction } from "./models.js";

/** One rejected field, e.g. `images[3]`, and why. */
export interface FieldError {
  readonly field: string;
  readonly message: string;
}

/** The base of every error the client raises; `statusCode` is 0 when no answer came. */
export class GenhookError extends Error {
  readonly statusCode: number;
  readonly fieldErrors: readonly FieldError[];

  constructor(message: string, statusCode = 500, fieldErrors: readonly FieldError[] = []) {
    super(message);
    this.name = new.target.name;
    this.statusCode = statusCode;
    this.fieldErrors = fieldErrors;
  }
}

export class InvalidRequest extends GenhookError {}
export class Unauthorized extends GenhookError {}
export class Forbidden extends GenhookError {}
export class NotFound extends GenhookError {}
export class Conflict extends GenhookError {}
export class Gone extends GenhookError {}
export class PayloadTooLarge extends GenhookError {}
export class TooManyRequests extends GenhookError {}
export class ServiceUnavailable extends GenhookError {}

/** The service could not be reached (after the configured retries). */
export class APIConnectionError extends GenhookError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, 0);
    if (options?.cause !== undefined) this.cause = options.cause;
  }
}

/** `wait` gave up before the task ended; `last` is the last answer seen. */
export class WaitTimeout extends GenhookError {
  readonly last: Prediction;

  constructor(message: string, last: Prediction) {
    super(message, 0);
    this.last = last;
  }
}

/** Raised by `raiseForFailure` for a `failed`, `timeout` or `canceled` task. */
export class TaskFailed extends GenhookError {
  readonly prediction: Prediction;
  readonly errorCode: number | undefined;

  constructor(message: string, prediction: Prediction) {
    super(message, 0);
    this.prediction = prediction;
    this.errorCode = prediction.error_code ?? undefined;
  }
}

type ErrorClass = new (message: string, status: number, errors: readonly FieldError[]) => GenhookError;

const BY_STATUS: ReadonlyMap<number, ErrorClass> = new Map<number, ErrorClass>([
  [400, InvalidRequest],
  [401, Unauthorized],
  [403, Forbidden],
  [404, NotFound],
  [409, Conflict],
  [410, Gone],
  [413, PayloadTooLarge],
  [429, TooManyRequests],
  [503, ServiceUnavailable],
]);

/**
 * The exception for an error answer. A body that is not the documented shape (a proxy's HTML
 * page) still gives the right class, with the body's start as the message.
 */
export function errorFromResponse(status: number, body: string): GenhookError {
  let message = "";
  const fieldErrors: FieldError[] = [];
  let data: unknown;
  try {
    data = JSON.parse(body);
  } catch {
    data = undefined;
  }
  if (isObject(data)) {
    if (typeof data["message"] === "string") message = data["message"];
    const errors = data["errors"];
    if (Array.isArray(errors)) {
      for (const item of errors) {
        if (isObject(item)) {
          fieldErrors.push({ field: String(item["field"] ?? ""), message: String(item["message"] ?? "") });
        }
      }
    }
  }
  if (!message) message = body.slice(0, 200).trim() || `HTTP ${status}`;
  const cls = BY_STATUS.get(status) ?? GenhookError;
  return new cls(message, status, fieldErrors);
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
