import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { createServer, request as httpRequest } from "node:http";
import { after, before, describe, test } from "node:test";

import {
  expressWebhook,
  fetchHandler,
  verifyNodeRequest,
  WebhookVerificationError,
  WebhookVerifier,
  type ExpressLikeRequest,
  type ExpressLikeResponse,
} from "../src/index.js";
import { body, jwksServer, newSigner, now, signed, type JwksServer, type Signer } from "./keys.js";

const SECRET = "account-signing-secret";

async function refused(promise: Promise<unknown>, reason: string): Promise<void> {
  await assert.rejects(promise, (error: unknown) => {
    assert.ok(error instanceof WebhookVerificationError, String(error));
    assert.equal(error.reason, reason);
    return true;
  });
}

describe("Ed25519 with a key set", () => {
  let signer: Signer;
  let verifier: WebhookVerifier;

  before(async () => {
    signer = await newSigner("k1");
    verifier = new WebhookVerifier({ jwks: { keys: [signer.jwk] } });
  });

  test("accepts a migration delivery and returns the typed event", async () => {
    const raw = body("t-1");
    const event = await verifier.verify(await signed(signer, raw, { secret: SECRET }), raw);
    assert.equal(event.sessionId, "t-1");
    assert.equal(event.scheme, "ed25519");
    assert.equal(event.keyId, "k1");
    assert.ok(event.ok);
    assert.deepEqual(event.payload.outputs, ["https://x/1.png"]);
  });

  test("accepts Ed25519 moved to X-Service-Webhook-Signature once HMAC retired", async () => {
    const raw = body();
    const event = await verifier.verify(await signed(signer, raw, { retired: true }), raw);
    assert.equal(event.scheme, "ed25519");
  });

  test("takes Fetch Headers and Node's lower-case header objects alike", async () => {
    const raw = body();
    const headers = await signed(signer, raw);
    await verifier.verify(new Headers(headers), raw);
    await verifier.verify(Object.fromEntries(Object.entries(headers).map(([k, v]) => [k.toLowerCase(), v])), raw);
  });

  test("refuses a changed body, a changed timestamp and another key's signature", async () => {
    const raw = body();
    const headers = await signed(signer, raw);
    await refused(verifier.verify(headers, Buffer.concat([raw, Buffer.from(" ")])), "bad_signature");
    const stamp = String(Number(headers["X-Service-Webhook-Timestamp"]) - 1);
    await refused(verifier.verify({ ...headers, "X-Service-Webhook-Timestamp": stamp }, raw), "bad_signature");
    const other = await newSigner("k1");
    await refused(verifier.verify(await signed(other, raw), raw), "bad_signature");
  });

  test("never falls back to HMAC when it has keys", async () => {
    const raw = body();
    await refused(verifier.verify(await signed(undefined, raw, { secret: SECRET }), raw), "no_usable_signature");
  });

  test("keeps the 300 s window", async () => {
    const raw = body();
    await refused(verifier.verify(await signed(signer, raw, { stamp: now() - 301 }), raw), "timestamp_out_of_tolerance");
    await refused(verifier.verify(await signed(signer, raw, { stamp: now() + 301 }), raw), "timestamp_out_of_tolerance");
    await verifier.verify(await signed(signer, raw, { stamp: now() - 290 }), raw);
    const replay = new WebhookVerifier({ jwks: { keys: [signer.jwk] }, tolerance: null });
    await replay.verify(await signed(signer, raw, { stamp: now() - 86_400 }), raw);
  });

  test("refuses malformed headers before any key lookup", async () => {
    const raw = body();
    const headers = await signed(signer, raw);
    await refused(verifier.verify({ ...headers, "X-Service-Webhook-Timestamp": "12.5" }, raw), "invalid_timestamp");
    await refused(verifier.verify({ ...headers, "X-Service-Webhook-Signature-Ed25519": "abc" }, raw), "malformed_signature");
    const { "X-Service-Webhook-Key-Id": _kid, ...noKid } = headers;
    await refused(verifier.verify(noKid, raw), "missing_header");
    const { "X-Service-Webhook-Id": _id, ...noId } = headers;
    await refused(verifier.verify(noId, raw), "missing_header");
    await refused(verifier.verify({ ...headers, "X-Service-Webhook-Key-Id": "nope" }, raw), "unknown_key");
  });

  test("checks the id and event headers against the verified body", async () => {
    const raw = body("t-1");
    await refused(verifier.verify(await signed(signer, raw, { id: "t-2" }), raw), "id_mismatch");
    await refused(verifier.verify(await signed(signer, raw, { event: "video.task.terminal" }), raw), "event_mismatch");
    const notJson = Buffer.from("[1, 2]");
    await refused(verifier.verify(await signed(signer, notJson, { id: "x" }), notJson), "invalid_body");
  });

  test("Standard Webhooks v1a verifies with the key; v1 alone is refused", async () => {
    const raw = body("t-1");
    const stamp = String(now());
    const message = Buffer.concat([Buffer.from(`msg_1.${stamp}.`), raw]);
    const v1a = Buffer.from(await signer.sign(message), "base64url").toString("base64");
    const v1 = createHmac("sha256", SECRET).update(message).digest("base64");
    const headers = { "webhook-id": "msg_1", "webhook-timestamp": stamp, "X-Service-Webhook-Key-Id": "k1" };
    const event = await verifier.verify({ ...headers, "webhook-signature": `v1,${v1} v1a,${v1a}` }, raw);
    assert.equal(event.scheme, "ed25519");
    assert.equal(event.sessionId, "t-1");
    await refused(verifier.verify({ ...headers, "webhook-signature": `v1,${v1}` }, raw), "no_usable_signature");
    await refused(verifier.verify({ ...headers, "webhook-signature": `v1a,${v1a}` }, Buffer.concat([raw, Buffer.from("\n")])), "bad_signature");
  });
});

describe("HMAC only", () => {
  const verifier = new WebhookVerifier({ hmacSecret: SECRET });

  test("accepts the hex HMAC and refuses a wrong one", async () => {
    const raw = body();
    const event = await verifier.verify(await signed(undefined, raw, { secret: SECRET }), raw);
    assert.equal(event.scheme, "hmac");
    await refused(verifier.verify(await signed(undefined, raw, { secret: "other" }), raw), "bad_signature");
    const headers = await signed(undefined, raw, { secret: SECRET });
    await refused(verifier.verify({ ...headers, "X-Service-Webhook-Signature": "zz" }, raw), "malformed_signature");
  });

  test("refuses a delivery signed with Ed25519 only", async () => {
    const signer = await newSigner("k");
    const raw = body();
    await refused(verifier.verify(await signed(signer, raw, { retired: true }), raw), "no_usable_signature");
  });

  test("Standard Webhooks v1 with a whsec_ secret", async () => {
    const key = Buffer.from("0123456789abcdef0123456789abcdef");
    const whsec = "whsec_" + key.toString("base64");
    const standard = new WebhookVerifier({ hmacSecret: whsec });
    const raw = body();
    const stamp = String(now());
    const v1 = createHmac("sha256", key).update(Buffer.concat([Buffer.from(`msg_9.${stamp}.`), raw])).digest("base64");
    const headers = { "webhook-id": "msg_9", "webhook-timestamp": stamp };
    const event = await standard.verify({ ...headers, "webhook-signature": `v1,AAAA v1,${v1}` }, raw);
    assert.equal(event.scheme, "hmac");
    await refused(standard.verify({ ...headers, "webhook-signature": "v1,AAAA" }, raw), "bad_signature");
  });
});

describe("a fetched key set", () => {
  let first: Signer;
  let second: Signer;
  let jwks: JwksServer;

  before(async () => {
    first = await newSigner("k1");
    second = await newSigner("k2");
    jwks = await jwksServer([first.jwk], "public, max-age=300");
  });
  after(() => jwks.close());

  test("re-fetches once on an unknown kid, then no more than once per interval", async () => {
    jwks.fetches = 0;
    jwks.keys = [first.jwk];
    let clock = Date.now();
    const verifier = new WebhookVerifier({ jwksUrl: jwks.url, clock: () => clock });
    const raw = body();
    const at = () => ({ stamp: Math.floor(clock / 1000) });
    await verifier.verify(await signed(first, raw, at()), raw);
    await verifier.verify(await signed(first, raw, at()), raw);
    assert.equal(jwks.fetches, 1);
    clock += 31_000;
    jwks.keys = [first.jwk, second.jwk]; // the service rotated
    await verifier.verify(await signed(second, raw, at()), raw);
    assert.equal(jwks.fetches, 2);
    const stranger = await newSigner("k3");
    await refused(verifier.verify(await signed(stranger, raw, at()), raw), "unknown_key");
    await refused(verifier.verify(await signed(stranger, raw, at()), raw), "unknown_key");
    assert.equal(jwks.fetches, 2, "unknown kids at will must not make the verifier fetch at will");
    clock += 31_000;
    await refused(verifier.verify(await signed(stranger, raw, at()), raw), "unknown_key");
    assert.equal(jwks.fetches, 3, "one re-fetch per interval");
  });

  test("concurrent verifications share one fetch", async () => {
    jwks.fetches = 0;
    const verifier = new WebhookVerifier({ jwksUrl: jwks.url });
    const raw = body();
    const headers = await signed(first, raw);
    await Promise.all(Array.from({ length: 10 }, () => verifier.verify(headers, raw)));
    assert.equal(jwks.fetches, 1);
  });

  test("keeps the set as long as Cache-Control max-age says, else the default", async () => {
    let clock = Date.now();
    const raw = body();
    const sign = () => signed(first, raw, { stamp: Math.floor(clock / 1000) });
    jwks.fetches = 0;
    jwks.cacheControl = "public, max-age=60";
    const verifier = new WebhookVerifier({ jwksUrl: jwks.url, clock: () => clock });
    await verifier.verify(await sign(), raw);
    clock += 59_000;
    await verifier.verify(await sign(), raw);
    assert.equal(jwks.fetches, 1);
    clock += 2_000;
    await verifier.verify(await sign(), raw);
    assert.equal(jwks.fetches, 2, "a set older than its max-age is fetched again");

    jwks.fetches = 0;
    jwks.cacheControl = undefined;
    const plain = new WebhookVerifier({ jwksUrl: jwks.url, clock: () => clock, maxKeyAgeMs: 600_000 });
    await plain.verify(await sign(), raw);
    clock += 599_000;
    await plain.verify(await sign(), raw);
    assert.equal(jwks.fetches, 1);
    clock += 2_000;
    await plain.verify(await sign(), raw);
    assert.equal(jwks.fetches, 2);
    jwks.cacheControl = "public, max-age=300";
  });

  test("a max-age past maxKeyAgeMs (default one hour) is held to it", async () => {
    let clock = Date.now();
    const raw = body();
    const sign = () => signed(first, raw, { stamp: Math.floor(clock / 1000) });
    jwks.cacheControl = "public, max-age=86400";
    for (const [options, ceiling] of [[{}, 3_600_000], [{ maxKeyAgeMs: 60_000 }, 60_000]] as const) {
      jwks.fetches = 0;
      const verifier = new WebhookVerifier({ jwksUrl: jwks.url, clock: () => clock, ...options });
      await verifier.verify(await sign(), raw);
      clock += ceiling - 1_000;
      await verifier.verify(await sign(), raw);
      assert.equal(jwks.fetches, 1);
      clock += 1_000;
      await verifier.verify(await sign(), raw);
      assert.equal(jwks.fetches, 2, `a set is fetched again after ${ceiling} ms, whatever max-age says`);
      clock += 31_000;
    }
    jwks.cacheControl = "public, max-age=300";
  });

  test("a stale key still verifies while the service is unreachable", async () => {
    let clock = Date.now();
    const local = await jwksServer([first.jwk], "max-age=10");
    const verifier = new WebhookVerifier({ jwksUrl: local.url, clock: () => clock });
    const raw = body();
    await verifier.verify(await signed(first, raw, { stamp: Math.floor(clock / 1000) }), raw);
    await local.close();
    clock += 60_000;
    const event = await verifier.verify(await signed(first, raw, { stamp: Math.floor(clock / 1000) }), raw);
    assert.equal(event.keyId, "k1");
    const cold = new WebhookVerifier({ jwksUrl: local.url });
    await refused(cold.verify(await signed(first, raw), raw), "keys_unavailable");
  });
});

describe("raw-body helpers", () => {
  let signer: Signer;
  let verifier: WebhookVerifier;

  before(async () => {
    signer = await newSigner("k1");
    verifier = new WebhookVerifier({ jwks: { keys: [signer.jwk] } });
  });

  async function post(port: number, headers: Record<string, string>, raw: Buffer): Promise<{ status: number; text: string }> {
    return new Promise((done, fail) => {
      const req = httpRequest({ host: "127.0.0.1", port, method: "POST", path: "/hook", headers }, (res) => {
        let text = "";
        res.on("data", (d: Buffer) => (text += d.toString()));
        res.on("end", () => done({ status: res.statusCode ?? 0, text }));
      });
      req.on("error", fail);
      // Two chunks: the helper must join what arrives in pieces.
      req.write(raw.subarray(0, 7));
      req.end(raw.subarray(7));
    });
  }

  async function serving(handler: Parameters<typeof createServer>[1], run: (port: number) => Promise<void>): Promise<void> {
    const server = createServer(handler);
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const address = server.address();
    try {
      await run(typeof address === "object" && address ? address.port : 0);
    } finally {
      await new Promise<void>((r) => server.close(() => r()));
    }
  }

  test("Node http: verifyNodeRequest reads the exact bytes", async () => {
    const seen: string[] = [];
    await serving(
      async (req, res) => {
        try {
          seen.push((await verifyNodeRequest(verifier, req)).sessionId);
          res.writeHead(204).end();
        } catch (error) {
          res.writeHead(400).end(String(error));
        }
      },
      async (port) => {
        const raw = body("n-1");
        assert.equal((await post(port, await signed(signer, raw), raw)).status, 204);
        const forged = await post(port, await signed(signer, raw), Buffer.from(raw.toString().replace("OK", "ER")));
        assert.equal(forged.status, 400);
      },
    );
    assert.deepEqual(seen, ["n-1"]);
  });

  test("Express middleware: verifies the stream, or the Buffer of express.raw()", async () => {
    const middleware = expressWebhook(verifier);
    for (const preParsed of [false, true]) {
      const seen: string[] = [];
      await serving(
        (req, res) => {
          const request = req as ExpressLikeRequest;
          const response = res as ExpressLikeResponse;
          response.locals = {};
          const go = () =>
            middleware(request, response, (error?: unknown) => {
              if (error) {
                res.writeHead(500).end(String(error));
                return;
              }
              seen.push(request.genhookEvent?.sessionId ?? "");
              res.writeHead(200).end("ok");
            });
          if (!preParsed) {
            go();
            return;
          }
          // What express.raw() leaves: the whole body as a Buffer on req.body.
          const chunks: Buffer[] = [];
          req.on("data", (d: Buffer) => chunks.push(d));
          req.on("end", () => {
            request.body = Buffer.concat(chunks);
            go();
          });
        },
        async (port) => {
          const raw = body("e-1");
          assert.equal((await post(port, await signed(signer, raw), raw)).status, 200);
          const bad = await post(port, await signed(signer, raw, { stamp: now() - 1000 }), raw);
          assert.equal(bad.status, 400);
          assert.equal((JSON.parse(bad.text) as { error: string }).error, "timestamp_out_of_tolerance");
        },
      );
      assert.deepEqual(seen, ["e-1"]);
    }
  });

  test("Fetch handler: answers 204, 400 with the reason, or 405", async () => {
    const seen: string[] = [];
    const handle = fetchHandler(verifier, (event) => {
      seen.push(event.sessionId);
    });
    const raw = body("f-1");
    const ok = await handle(new Request("http://127.0.0.1/hook", { method: "POST", headers: await signed(signer, raw), body: raw }));
    assert.equal(ok.status, 204);
    const bad = await handle(new Request("http://127.0.0.1/hook", { method: "POST", headers: await signed(signer, raw, { id: "other" }), body: raw }));
    assert.equal(bad.status, 400);
    assert.equal(((await bad.json()) as { error: string }).error, "id_mismatch");
    assert.equal((await handle(new Request("http://127.0.0.1/hook"))).status, 405);
    assert.deepEqual(seen, ["f-1"]);
  });
});
