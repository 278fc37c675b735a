/**
 * The webhook signing key set: parsing, caching and rate-limited refetch.
 *
 * A verifier sees the key id on every delivery. An unknown id usually means the service
 * rotated its key, so the set is fetched again; but an attacker can send unknown ids at will,
 * so fetches (of any cause) are at most one per `minRefetchIntervalMs`, and concurrent
 * callers share one fetch. A fetched set is kept for the lifetime the service states
 * (`Cache-Control: max-age`; `no-store`/`no-cache`: not at all), never longer than
 * `maxKeyAgeMs` (default one hour), the rule of the Python SDK: a key the service stops
 * publishing stops verifying when that time is up. A stale key is still used while a
 * refetch is refused or fails.
 */

import type { webcrypto } from "node:crypto";

import { b64decode } from "./encoding.js";
import { isObject } from "./errors.js";
import { VerificationFailure, WebhookVerificationError } from "./event.js";

export type Keys = Map<string, webcrypto.CryptoKey>;

/** Ed25519 signing keys by kid; entries of other kinds or malformed ones are skipped. */
export async function parseJwks(data: unknown): Promise<Keys> {
  const keys: Keys = new Map();
  if (!isObject(data) || !Array.isArray(data["keys"])) return keys;
  for (const jwk of data["keys"] as unknown[]) {
    if (!isObject(jwk)) continue;
    const kid = jwk["kid"];
    const x = jwk["x"];
    if (jwk["kty"] !== "OKP" || jwk["crv"] !== "Ed25519") continue;
    if ((jwk["use"] ?? "sig") !== "sig" || typeof kid !== "string" || typeof x !== "string") continue;
    if (!/^[A-Za-z0-9_-]+$/.test(x)) continue;
    const raw = b64decode(x);
    if (raw === undefined || raw.length !== 32) continue;
    keys.set(kid, await crypto.subtle.importKey("raw", raw, { name: "Ed25519" }, false, ["verify"]));
  }
  return keys;
}

/** Milliseconds of `Cache-Control: max-age`, or undefined; `no-store`/`no-cache` are 0. */
export function statedMaxAge(cacheControl: string | null): number | undefined {
  if (!cacheControl) return undefined;
  const directives = cacheControl.toLowerCase().split(",").map((d) => d.trim());
  if (directives.includes("no-store") || directives.includes("no-cache")) return 0;
  for (const directive of directives) {
    const match = /^max-age\s*=\s*"?(\d+)"?$/.exec(directive);
    if (match) return Number(match[1]) * 1000;
  }
  return undefined;
}

function unknown(kid: string): WebhookVerificationError {
  return new WebhookVerificationError(VerificationFailure.UNKNOWN_KEY, `no signing key with kid ${JSON.stringify(kid)} in the key set`);
}

export interface KeySource {
  key(kid: string): Promise<webcrypto.CryptoKey>;
}

/** A key set given up front (`jwks`); never fetched. */
export class StaticKeys implements KeySource {
  private readonly keys: Promise<Keys>;

  constructor(jwks: unknown) {
    this.keys = parseJwks(jwks);
  }

  async key(kid: string): Promise<webcrypto.CryptoKey> {
    const key = (await this.keys).get(kid);
    if (key === undefined) throw unknown(kid);
    return key;
  }
}

export interface RemoteKeysOptions {
  /** The longest a fetched set is kept (default one hour): the lifetime when the response
   * states none, the ceiling of a `max-age` it states. */
  maxKeyAgeMs?: number;
  minRefetchIntervalMs?: number;
  timeoutMs?: number;
  /** Epoch milliseconds; drives the cache (tests move it). */
  clock?: () => number;
  fetch?: typeof fetch;
}

/** A key set fetched from a JWKS URL and cached. */
export class RemoteKeys implements KeySource {
  readonly url: string;
  readonly defaultMaxAgeMs: number;
  readonly minRefetchIntervalMs: number;
  readonly timeoutMs: number;
  /** How many fetches were started; for metrics and tests. */
  fetches = 0;
  private keys: Keys = new Map();
  private fetchedAt: number | undefined;
  private maxAgeMs: number;
  private attemptedAt: number | undefined;
  private lastError: unknown;
  private inflight: Promise<void> | undefined;
  private readonly clock: () => number;
  private readonly fetchImpl: typeof fetch;

  constructor(url: string, options: RemoteKeysOptions = {}) {
    this.url = url;
    this.defaultMaxAgeMs = options.maxKeyAgeMs ?? 3_600_000;
    this.maxAgeMs = this.defaultMaxAgeMs;
    this.minRefetchIntervalMs = options.minRefetchIntervalMs ?? 30_000;
    this.timeoutMs = options.timeoutMs ?? 5_000;
    this.clock = options.clock ?? Date.now;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** How long the current set is kept, as the last response stated it. */
  get maxAge(): number {
    return this.maxAgeMs;
  }

  private fresh(kid: string): webcrypto.CryptoKey | undefined {
    if (this.fetchedAt === undefined || this.clock() - this.fetchedAt >= this.maxAgeMs) return undefined;
    return this.keys.get(kid);
  }

  private mayFetch(): boolean {
    return this.attemptedAt === undefined || this.clock() - this.attemptedAt >= this.minRefetchIntervalMs;
  }

  private async load(): Promise<void> {
    this.attemptedAt = this.clock();
    this.fetches++;
    try {
      const response = await this.fetchImpl(this.url, {
        headers: { Accept: "application/json" },
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const data: unknown = await response.json();
      if (!isObject(data)) throw new Error("the JWKS document is not a JSON object");
      this.keys = await parseJwks(data);
      this.fetchedAt = this.clock();
      const stated = statedMaxAge(response.headers.get("Cache-Control"));
      this.maxAgeMs = Math.min(stated ?? this.defaultMaxAgeMs, this.defaultMaxAgeMs);
      this.lastError = undefined;
    } catch (error) {
      this.lastError = error;
    }
  }

  async key(kid: string): Promise<webcrypto.CryptoKey> {
    const cached = this.fresh(kid);
    if (cached !== undefined) return cached;
    if (this.inflight === undefined && this.mayFetch()) {
      this.inflight = this.load().finally(() => {
        this.inflight = undefined;
      });
    }
    if (this.inflight !== undefined) await this.inflight;
    // After a fetch (or a refused one): the key, a stale cached key, or an error.
    const key = this.keys.get(kid);
    if (key !== undefined) return key;
    if (this.lastError !== undefined && this.keys.size === 0) {
      const reason = this.lastError instanceof Error ? this.lastError.message : String(this.lastError);
      throw new WebhookVerificationError(VerificationFailure.KEYS_UNAVAILABLE, `could not fetch the key set from ${this.url}: ${reason}`);
    }
    throw unknown(kid);
  }
}
