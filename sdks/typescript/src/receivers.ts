/**
 * Raw-body helpers: a signature covers the exact bytes sent, so a receiver must verify those
 * bytes, never a re-serialized parse. One helper per way Node code receives a request: the
 * `http` module, Express (with or without `express.raw()`), and the Fetch API's `Request`.
 */

import type { IncomingMessage, ServerResponse } from "node:http";

import type { WebhookEvent } from "./event.js";
import { WebhookVerificationError } from "./event.js";
import type { WebhookVerifier } from "./verifier.js";

/** Deliveries are small JSON documents; a larger body is refused before it is buffered. */
export const DEFAULT_BODY_LIMIT = 1024 * 1024;

export class BodyTooLarge extends Error {
  constructor(limit: number) {
    super(`the request body exceeds ${limit} bytes`);
    this.name = "BodyTooLarge";
  }
}

/** The whole body of a Node request, as received; refuses more than `limit` bytes. */
export async function readRawBody(request: AsyncIterable<unknown> & Pick<IncomingMessage, "headers">, limit = DEFAULT_BODY_LIMIT): Promise<Uint8Array> {
  const declared = Number(request.headers["content-length"] ?? "0");
  if (declared > limit) throw new BodyTooLarge(limit);
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of request) {
    const bytes = typeof chunk === "string" ? Buffer.from(chunk) : (chunk as Uint8Array);
    size += bytes.length;
    if (size > limit) throw new BodyTooLarge(limit);
    chunks.push(bytes);
  }
  return Buffer.concat(chunks);
}

/** Verify a delivery arriving on Node's `http` (or `https`, `http2` compat) server. */
export async function verifyNodeRequest(verifier: WebhookVerifier, request: IncomingMessage, limit = DEFAULT_BODY_LIMIT): Promise<WebhookEvent> {
  return verifier.verify(request.headers, await readRawBody(request, limit));
}

/** Verify a Fetch API `Request` (Node 20's fetch, Deno, Bun, edge runtimes); the body is read. */
export async function verifyFetchRequest(verifier: WebhookVerifier, request: Request, limit = DEFAULT_BODY_LIMIT): Promise<WebhookEvent> {
  const declared = Number(request.headers.get("content-length") ?? "0");
  if (declared > limit) throw new BodyTooLarge(limit);
  const body = new Uint8Array(await request.arrayBuffer());
  if (body.length > limit) throw new BodyTooLarge(limit);
  return verifier.verify(request.headers, body);
}

function refusal(error: unknown): { status: number; body: string } | undefined {
  if (error instanceof WebhookVerificationError) {
    return { status: 400, body: JSON.stringify({ error: error.reason, message: error.message }) };
  }
  if (error instanceof BodyTooLarge) return { status: 413, body: JSON.stringify({ error: "body_too_large", message: error.message }) };
  return undefined;
}

/**
 * A Fetch handler: verifies, then calls `onEvent` and answers what it returns (204 when it
 * returns nothing). A refused delivery is answered 400 with `{error: <reason>}`, which the
 * service records and retries.
 */
export function fetchHandler(
  verifier: WebhookVerifier,
  onEvent: (event: WebhookEvent, request: Request) => Promise<Response | void> | Response | void,
): (request: Request) => Promise<Response> {
  return async (request) => {
    if (request.method !== "POST") return new Response(null, { status: 405, headers: { Allow: "POST" } });
    let event: WebhookEvent;
    try {
      event = await verifyFetchRequest(verifier, request);
    } catch (error) {
      const refused = refusal(error);
      if (refused === undefined) throw error;
      return new Response(refused.body, { status: refused.status, headers: { "Content-Type": "application/json" } });
    }
    return (await onEvent(event, request)) ?? new Response(null, { status: 204 });
  };
}

/** The parts of an Express request and response the middleware uses (no dependency on Express). */
export interface ExpressLikeRequest extends IncomingMessage {
  body?: unknown;
  genhookEvent?: WebhookEvent;
}

export interface ExpressLikeResponse extends ServerResponse {
  locals?: Record<string, unknown>;
}

/**
 * Express middleware: verifies the delivery and puts it on `req.genhookEvent` (and
 * `res.locals.genhookEvent`), then calls `next()`. Mount it before any JSON body parser, or
 * behind `express.raw({ type: "application/json" })`, whose Buffer it verifies; a body already
 * parsed to an object can no longer be verified and is refused with an error to `next`.
 */
export function expressWebhook(verifier: WebhookVerifier, options: { limit?: number } = {}) {
  const limit = options.limit ?? DEFAULT_BODY_LIMIT;
  return (request: ExpressLikeRequest, response: ExpressLikeResponse, next: (error?: unknown) => void): void => {
    const run = async (): Promise<void> => {
      let body: Uint8Array;
      if (request.body instanceof Uint8Array) {
        body = request.body;
      } else if (request.body !== undefined && !(typeof request.body === "object" && Object.keys(request.body as object).length === 0)) {
        throw new Error("the body was parsed before the webhook middleware: mount it before express.json(), or use express.raw()");
      } else {
        body = await readRawBody(request, limit);
      }
      const event = await verifier.verify(request.headers, body);
      request.genhookEvent = event;
      if (response.locals) response.locals["genhookEvent"] = event;
    };
    run().then(
      () => next(),
      (error: unknown) => {
        const refused = refusal(error);
        if (refused === undefined) {
          next(error);
          return;
        }
        response.statusCode = refused.status;
        response.setHeader("Content-Type", "application/json");
        response.end(refused.body);
      },
    );
  };
}
