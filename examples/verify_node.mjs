// Verify a genhook webhook in Node.js (>= 16) with the built-in crypto module only.
import { createHmac, createPublicKey, timingSafeEqual, verify } from "node:crypto";

// headers: Node's req.headers (lowercase names); rawBody: the exact Buffer received.
export function verifyDelivery(headers, rawBody, jwks, { hmacSecret, brand = "Service" } = {}) {
  const header = (name) => headers[`x-${brand.toLowerCase()}-webhook-${name}`];
  const timestamp = header("timestamp") ?? "";
  if (!/^\d+$/.test(timestamp) || Math.abs(Date.now() / 1000 - Number(timestamp)) > 300) {
    throw new Error("timestamp missing or outside the 300 s window");
  }
  const signature = header("signature-ed25519") ?? header("signature") ?? "";
  if (signature.replace(/=+$/, "").length === 86) {
    // Ed25519 over "<timestamp>.<raw body>": preferred.
    const jwk = jwks.keys.find((k) => k.kid === header("key-id"));
    if (!jwk) throw new Error("unknown key id: fetch the JWKS again (once), then retry");
    const key = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: jwk.x }, format: "jwk" });
    const message = Buffer.concat([Buffer.from(`${timestamp}.`), rawBody]);
    if (!verify(null, message, key, Buffer.from(signature, "base64url"))) {
      throw new Error("Ed25519 signature mismatch");
    }
  } else if (hmacSecret !== undefined) {
    // Legacy HMAC-SHA256 over the raw body only, compared in constant time.
    const expected = Buffer.from(createHmac("sha256", hmacSecret).update(rawBody).digest("hex"));
    const given = Buffer.from(signature);
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
      throw new Error("HMAC signature mismatch");
    }
  } else {
    throw new Error("no signature this receiver can check");
  }
  const event = JSON.parse(rawBody.toString("utf8"));
  if (event.session_id !== header("id")) throw new Error("header id differs from session_id");
  return event;
}

// `node verify_node.mjs < delivery.json` with {"headers", "body_base64", "jwks", "hmac_secret"}.
if (import.meta.url === `file://${process.argv[1]}`) {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const input = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  const headers = Object.fromEntries(
    Object.entries(input.headers).map(([k, v]) => [k.toLowerCase(), v]),
  );
  try {
    const body = Buffer.from(input.body_base64, "base64");
    const event = verifyDelivery(headers, body, input.jwks, { hmacSecret: input.hmac_secret });
    console.log(`verified ${event.session_id} ${event.status}`);
  } catch (err) {
    console.log(`refused: ${err.message}`);
    process.exitCode = 1;
  }
}
