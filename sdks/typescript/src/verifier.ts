/**
 * Webhook signature verification, Ed25519 and HMAC, every rule of the wire format, as strict
 * as the Python SDK's `WebhookVerifier`.
 *
 * Cheap checks run first (headers, timestamp window, signature shape) so a junk request costs
 * no key lookup; the body is parsed only after its signature checked out, from the very bytes
 * that were verified. A verifier that knows Ed25519 keys never falls back to HMAC: a weaker
 * scheme must not undo a stronger one.
 */

import { b64decode, concat, constantTimeEqual, hex, utf8, b64encode } from "./encoding.js";
import type { webcrypto } from "node:crypto";

import { isObject } from "./errors.js";
import { VerificationFailure as Fail, WebhookEvent, WebhookVerificationError, type Scheme, type WebhookBody } from "./event.js";
import { RemoteKeys, StaticKeys, type KeySource } from "./jwks.js";

// A 64-byte Ed25519 signature is 86 base64url characters (padding optional); an HMAC-SHA256
// is 64 hex characters. The shapes cannot be confused, which is how a verifier tells which
// scheme `X-...-Signature` carries.
const ED25519_RE = /^[A-Za-z0-9_-]{86}(==)?$/;
const HEX_RE = /^[0-9a-fA-F]{64}$/;
const STAMP_RE = /^[0-9]{1,12}$/;

/** Headers as Node's `http` (`IncomingHttpHeaders`), Express, or the Fetch API hold them. */
export type HeadersLike =
  | Headers
  | Readonly<Record<string, string | readonly string[] | undefined>>
  | Iterable<readonly [string, string]>;

export interface VerifierOptions {
  /** The service's `/api/v1/webhooks/jwks.json`: fetched, cached, re-fetched on rotation. */
  jwksUrl?: string;
  /** A fixed key set instead of `jwksUrl`. */
  jwks?: unknown;
  /** The account's signing secret: HMAC (and Standard Webhooks `v1`), only when no keys are given. */
  hmacSecret?: string;
  /** Replay window, seconds (default 300); `null` turns the check off (replaying stored deliveries in tests). */
  tolerance?: number | null;
  /** The service's header brand: `X-<brand>-Webhook-*` (default `Service`). */
  brand?: string;
  /** The longest a fetched key set is kept (default one hour): its lifetime when the service
   * states none, and the ceiling of a `max-age` it states. */
  maxKeyAgeMs?: number;
  /** At most one key-set fetch per this interval (default 30 s). */
  minRefetchIntervalMs?: number;
  /** Epoch milliseconds; drives the window and the key cache. */
  clock?: () => number;
  fetch?: typeof fetch;
}

function lowerHeaders(headers: HeadersLike): Map<string, string> {
  const out = new Map<string, string>();
  const entries: Iterable<readonly [string, unknown]> =
    Symbol.iterator in headers ? (headers as Iterable<readonly [string, string]>) : Object.entries(headers);
  for (const [name, value] of entries) {
    if (value === undefined) continue;
    // A repeated header is ambiguous; Node joins most with ", ", which no valid value contains.
    out.set(name.toLowerCase(), Array.isArray(value) ? value.join(", ") : String(value));
  }
  return out;
}

interface Pending {
  kid: string;
  signature: Uint8Array;
  message: Uint8Array;
  body: Uint8Array;
  timestamp: number;
  webhookId: string;
  event: string | undefined;
  standard: boolean;
}

export class WebhookVerifier {
  readonly keys: KeySource | undefined;
  readonly tolerance: number | null;
  readonly brand: string;
  private readonly hmacSecret: string | undefined;
  private readonly clock: () => number;
  private readonly names: { id: string; event: string; timestamp: string; signature: string; signatureEd25519: string; keyId: string };
  private hmacKeys = new Map<string, Promise<webcrypto.CryptoKey>>();

  constructor(options: VerifierOptions) {
    if (options.jwksUrl !== undefined && options.jwks !== undefined) throw new Error("give jwksUrl or jwks, not both");
    if (options.jwksUrl === undefined && options.jwks === undefined && !options.hmacSecret) {
      throw new Error("give jwksUrl, jwks or hmacSecret");
    }
    this.clock = options.clock ?? Date.now;
    if (options.jwksUrl !== undefined) {
      this.keys = new RemoteKeys(options.jwksUrl, {
        ...(options.maxKeyAgeMs !== undefined ? { maxKeyAgeMs: options.maxKeyAgeMs } : {}),
        ...(options.minRefetchIntervalMs !== undefined ? { minRefetchIntervalMs: options.minRefetchIntervalMs } : {}),
        ...(options.fetch !== undefined ? { fetch: options.fetch } : {}),
        clock: this.clock,
      });
    } else if (options.jwks !== undefined) {
      this.keys = new StaticKeys(options.jwks);
    }
    this.hmacSecret = options.hmacSecret || undefined;
    this.tolerance = options.tolerance === undefined ? 300 : options.tolerance;
    this.brand = options.brand ?? "Service";
    const prefix = `X-${this.brand}-Webhook-`;
    this.names = {
      id: prefix + "Id",
      event: prefix + "Event",
      timestamp: prefix + "Timestamp",
      signature: prefix + "Signature",
      signatureEd25519: prefix + "Signature-Ed25519",
      keyId: prefix + "Key-Id",
    };
  }

  /** Verify one delivery; throws `WebhookVerificationError` on any failure. `rawBody` must be
   * the exact bytes received, before any JSON parsing. */
  async verify(headers: HeadersLike, rawBody: Uint8Array | ArrayBuffer | string): Promise<WebhookEvent> {
    const body = typeof rawBody === "string" ? utf8(rawBody) : rawBody instanceof Uint8Array ? rawBody : new Uint8Array(rawBody);
    const h = lowerHeaders(headers);
    const checked = await this.check(h, body);
    if (checked instanceof WebhookEvent) return checked;
    if (this.keys === undefined) throw new Error("unreachable: a pending Ed25519 check needs keys");
    const key = await this.keys.key(checked.kid);
    const valid = await crypto.subtle.verify({ name: "Ed25519" }, key, checked.signature, checked.message);
    if (!valid) throw new WebhookVerificationError(Fail.BAD_SIGNATURE, "Ed25519 signature mismatch");
    return this.event(checked.body, checked.timestamp, checked.webhookId, checked.event, "ed25519", checked.kid, checked.standard);
  }

  private missing(name: string): WebhookVerificationError {
    return new WebhookVerificationError(Fail.MISSING_HEADER, `missing ${name}`);
  }

  private stamp(stamp: string, name: string): number {
    if (!STAMP_RE.test(stamp)) throw new WebhookVerificationError(Fail.INVALID_TIMESTAMP, `${name} is not epoch seconds`);
    const timestamp = Number(stamp);
    if (this.tolerance !== null && Math.abs(this.clock() / 1000 - timestamp) > this.tolerance) {
      throw new WebhookVerificationError(Fail.TIMESTAMP_OUT_OF_TOLERANCE, `timestamp ${timestamp} is more than ${this.tolerance} s from now`);
    }
    return timestamp;
  }

  private async check(h: Map<string, string>, body: Uint8Array): Promise<WebhookEvent | Pending> {
    const n = this.names;
    const webhookId = h.get(n.id.toLowerCase());
    if (!webhookId) {
      if (h.has("webhook-id")) return this.checkStandard(h, body);
      throw this.missing(n.id);
    }
    const stampText = h.get(n.timestamp.toLowerCase());
    if (!stampText) throw this.missing(n.timestamp);
    const timestamp = this.stamp(stampText, n.timestamp);
    const event = h.get(n.event.toLowerCase());
    const signatureEd = h.get(n.signatureEd25519.toLowerCase());
    const signature = h.get(n.signature.toLowerCase());
    if (this.keys !== undefined) {
      // Prefer the -Ed25519 header; after HMAC retires, Ed25519 moves to -Signature.
      let candidate = signatureEd;
      if (candidate === undefined && signature !== undefined && ED25519_RE.test(signature)) candidate = signature;
      if (candidate !== undefined) {
        const kid = h.get(n.keyId.toLowerCase());
        if (!kid) throw this.missing(n.keyId);
        const decoded = ED25519_RE.test(candidate) ? b64decode(candidate) : undefined;
        if (decoded === undefined || decoded.length !== 64) {
          throw new WebhookVerificationError(Fail.MALFORMED_SIGNATURE, "the Ed25519 signature is not 64 bytes of base64url");
        }
        const message = concat(utf8(stampText + "."), body);
        return { kid, signature: decoded, message, body, timestamp, webhookId, event, standard: false };
      }
      if (signature !== undefined) {
        throw new WebhookVerificationError(
          Fail.NO_USABLE_SIGNATURE,
          "the delivery carries no Ed25519 signature; a verifier with Ed25519 keys does not accept HMAC (configure hmacSecret alone for HMAC-only)",
        );
      }
    } else if (this.hmacSecret !== undefined && signature !== undefined) {
      if (ED25519_RE.test(signature)) {
        throw new WebhookVerificationError(Fail.NO_USABLE_SIGNATURE, "the delivery is signed with Ed25519 only; give the verifier jwksUrl");
      }
      if (!HEX_RE.test(signature)) {
        throw new WebhookVerificationError(Fail.MALFORMED_SIGNATURE, `${n.signature} is not a hex HMAC-SHA256`);
      }
      const expected = utf8(hex(await this.hmac(utf8(this.hmacSecret), body)));
      if (!constantTimeEqual(expected, utf8(signature.toLowerCase()))) {
        throw new WebhookVerificationError(Fail.BAD_SIGNATURE, "HMAC signature mismatch");
      }
      return this.event(body, timestamp, webhookId, event, "hmac", undefined, false);
    }
    if (signatureEd === undefined && signature === undefined) {
      throw new WebhookVerificationError(Fail.MISSING_HEADER, `missing ${n.signatureEd25519} and ${n.signature}`);
    }
    const have = this.keys === undefined ? "an HMAC secret" : "Ed25519 keys";
    throw new WebhookVerificationError(Fail.NO_USABLE_SIGNATURE, `the delivery carries no signature this verifier can check (it has ${have})`);
  }

  /** The Standard Webhooks header family: `v1a` (Ed25519) when this verifier has keys, `v1`
   * (HMAC over id, timestamp and body) only when it is HMAC-only. */
  private async checkStandard(h: Map<string, string>, body: Uint8Array): Promise<WebhookEvent | Pending> {
    const webhookId = h.get("webhook-id") ?? "";
    const stampText = h.get("webhook-timestamp");
    if (!stampText) throw this.missing("webhook-timestamp");
    const timestamp = this.stamp(stampText, "webhook-timestamp");
    const listed = h.get("webhook-signature");
    if (!listed) throw this.missing("webhook-signature");
    const signatures = new Map<string, string[]>();
    for (const entry of listed.split(/\s+/).filter(Boolean)) {
      const comma = entry.indexOf(",");
      const version = comma < 0 ? entry : entry.slice(0, comma);
      const value = comma < 0 ? "" : entry.slice(comma + 1);
      signatures.set(version, [...(signatures.get(version) ?? []), value]);
    }
    const message = concat(utf8(`${webhookId}.${stampText}.`), body);
    const event = h.get(this.names.event.toLowerCase());
    if (this.keys !== undefined) {
      const ed25519 = signatures.get("v1a");
      if (!ed25519?.length) {
        throw new WebhookVerificationError(
          Fail.NO_USABLE_SIGNATURE,
          "webhook-signature has no v1a (Ed25519) signature; a verifier with Ed25519 keys does not accept v1 (HMAC)",
        );
      }
      const kid = h.get(this.names.keyId.toLowerCase());
      if (!kid) throw this.missing(this.names.keyId);
      const first = ed25519[0] ?? "";
      const signature = /^[A-Za-z0-9+/]*={0,2}$/.test(first) ? b64decode(first) : undefined;
      if (signature === undefined || signature.length !== 64) {
        throw new WebhookVerificationError(Fail.MALFORMED_SIGNATURE, "the v1a signature is not 64 bytes of base64");
      }
      return { kid, signature, message, body, timestamp, webhookId, event, standard: true };
    }
    const secret = this.hmacSecret ?? "";
    const expected = utf8(b64encode(await this.hmac(standardSecretKey(secret), message)));
    for (const value of signatures.get("v1") ?? []) {
      if (constantTimeEqual(expected, utf8(value))) return this.event(body, timestamp, webhookId, event, "hmac", undefined, true);
    }
    if (!signatures.has("v1")) throw new WebhookVerificationError(Fail.NO_USABLE_SIGNATURE, "webhook-signature has no v1 (HMAC) signature");
    throw new WebhookVerificationError(Fail.BAD_SIGNATURE, "v1 signature mismatch");
  }

  private async hmac(key: Uint8Array, message: Uint8Array): Promise<Uint8Array> {
    const id = hex(key);
    let imported = this.hmacKeys.get(id);
    if (imported === undefined) {
      imported = crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
      this.hmacKeys.set(id, imported);
    }
    return new Uint8Array(await crypto.subtle.sign("HMAC", await imported, message));
  }

  /** `standard`: `webhook-id` names the delivery, not the task, so it is not compared with
   * `session_id`. */
  private event(
    body: Uint8Array,
    timestamp: number,
    webhookId: string,
    event: string | undefined,
    scheme: Scheme,
    kid: string | undefined,
    standard: boolean,
  ): WebhookEvent {
    let data: unknown;
    try {
      data = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body));
    } catch {
      data = undefined;
    }
    if (!isObject(data)) throw new WebhookVerificationError(Fail.INVALID_BODY, "the body is not a JSON object");
    if (!standard && data["session_id"] !== webhookId) {
      throw new WebhookVerificationError(Fail.ID_MISMATCH, "the Webhook-Id header differs from the body's session_id");
    }
    if (event !== undefined && data["event_type"] !== event) {
      throw new WebhookVerificationError(Fail.EVENT_MISMATCH, "the Webhook-Event header differs from the body's event_type");
    }
    return new WebhookEvent(data as WebhookBody, scheme, kid, timestamp);
  }
}

/** The Standard Webhooks `v1` HMAC key: the bytes an account secret (`whsec_` + base64)
 * encodes; any other secret is used as its UTF-8 bytes. */
export function standardSecretKey(secret: string): Uint8Array {
  if (secret.startsWith("whsec_")) {
    const decoded = b64decode(secret.slice("whsec_".length));
    if (decoded !== undefined) return decoded;
  }
  return utf8(secret);
}
