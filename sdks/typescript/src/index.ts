/** genhook for TypeScript: the API client and the webhook verifier, on platform APIs only. */

export * from "./client.js";
export * from "./errors.js";
export * from "./event.js";
export { parseJwks, RemoteKeys, StaticKeys, statedMaxAge, type KeySource, type RemoteKeysOptions } from "./jwks.js";
export * from "./models.js";
export * from "./receivers.js";
export { SSEDecoder } from "./sse.js";
export * from "./verifier.js";
