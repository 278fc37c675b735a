/** Signing on the test's side: an Ed25519 key pair and the service's wire format, so the
 * verifier's refusals can be checked one rule at a time. */

import { createHmac, webcrypto } from "node:crypto";
import { createServer, type Server } from "node:http";

export interface Signer {
  kid: string;
  jwk: Record<string, string>;
  sign(message: Uint8Array): Promise<string>;
}

export async function newSigner(kid: string): Promise<Signer> {
  const pair = (await webcrypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"])) as webcrypto.CryptoKeyPair;
  const raw = new Uint8Array(await webcrypto.subtle.exportKey("raw", pair.publicKey));
  const x = Buffer.from(raw).toString("base64url");
  return {
    kid,
    jwk: { kty: "OKP", crv: "Ed25519", x, use: "sig", alg: "EdDSA", kid },
    async sign(message) {
      return Buffer.from(await webcrypto.subtle.sign({ name: "Ed25519" }, pair.privateKey, message)).toString("base64url");
    },
  };
}

export const now = (): number => Math.floor(Date.now() / 1000);

export function body(id = "task-1", extra: Record<string, unknown> = {}): Buffer {
  return Buffer.from(
    JSON.stringify({
      session_id: id,
      event_type: "image.task.terminal",
      status: "OK",
      created_at: 1_700_000_000_000,
      payload: { id, model: "m", status: "completed", outputs: ["https://x/1.png"] },
      ...extra,
    }),
  );
}

/** Headers of a delivery in the migration scheme (HMAC and Ed25519), or only one of them. */
export async function signed(
  signer: Signer | undefined,
  raw: Buffer,
  options: { secret?: string; stamp?: number; id?: string; event?: string; retired?: boolean } = {},
): Promise<Record<string, string>> {
  const stamp = String(options.stamp ?? now());
  const headers: Record<string, string> = {
    "X-Service-Webhook-Id": options.id ?? (JSON.parse(raw.toString()) as { session_id: string }).session_id,
    "X-Service-Webhook-Event": options.event ?? "image.task.terminal",
    "X-Service-Webhook-Timestamp": stamp,
    "Content-Type": "application/json",
  };
  if (options.secret !== undefined) headers["X-Service-Webhook-Signature"] = createHmac("sha256", options.secret).update(raw).digest("hex");
  if (signer !== undefined) {
    const signature = await signer.sign(Buffer.concat([Buffer.from(`${stamp}.`), raw]));
    headers[options.retired ? "X-Service-Webhook-Signature" : "X-Service-Webhook-Signature-Ed25519"] = signature;
    headers["X-Service-Webhook-Key-Id"] = signer.kid;
  }
  return headers;
}

/** A JWKS endpoint on loopback whose key set and Cache-Control the test changes. */
export interface JwksServer {
  url: string;
  fetches: number;
  keys: Record<string, string>[];
  cacheControl: string | undefined;
  close(): Promise<void>;
}

export async function jwksServer(keys: Record<string, string>[], cacheControl?: string): Promise<JwksServer> {
  const state = { fetches: 0, keys, cacheControl } as JwksServer;
  const server: Server = createServer((_req, res) => {
    state.fetches++;
    const headers: Record<string, string> = { "Content-Type": "application/json" };
    if (state.cacheControl !== undefined) headers["Cache-Control"] = state.cacheControl;
    res.writeHead(200, headers).end(JSON.stringify({ keys: state.keys }));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const address = server.address();
  state.url = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}/jwks.json`;
  state.close = () => new Promise<void>((r) => server.close(() => r()));
  return state;
}
