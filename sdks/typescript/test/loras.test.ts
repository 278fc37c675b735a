import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { GenhookClient, lora, loraOptions, type ModelInfo } from "../src/index.js";

test("lora() reads NAME, NAME:SCALE and URLs, and refuses a scale that is not a number", () => {
  assert.deepEqual(lora("film:0.8"), { name: "film", scale: 0.8 });
  assert.deepEqual(lora("noir"), { name: "noir" });
  assert.deepEqual(lora("ink:-0.5"), { name: "ink", scale: -0.5 });
  assert.deepEqual(lora("https://cdn.example/a.safetensors"), { url: "https://cdn.example/a.safetensors" });
  assert.deepEqual(lora({ name: "oil", scale: 1 }), { name: "oil", scale: 1 });
  assert.throws(() => lora("film:strong"), /must be a number/);
  assert.throws(() => lora("film:"), /must be a number/);
});

test("loraOptions() lists a model's adapters from its catalogue entry", () => {
  const base = { id: "m", kind: "image", description: "", submit_paths: [], request_schema: {}, pricing: {}, deadline_seconds: 60 };
  const option = { name: "film", description: "grainy", scale: 1, price_usd: "0.002" };
  assert.deepEqual(loraOptions({ ...base, choices: { loras: [option] } } as ModelInfo), [option]);
  assert.deepEqual(loraOptions(base as ModelInfo), []);
});

test("submit() sends NAME:SCALE strings as the request's adapter objects", async () => {
  let seen: unknown;
  const server = createServer((req, res) => {
    let text = "";
    req.on("data", (chunk) => (text += chunk));
    req.on("end", () => {
      seen = JSON.parse(text);
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ id: "task_1", status: "created" }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const port = (server.address() as AddressInfo).port;
    const client = new GenhookClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: "ghk_test" });
    await client.submit("local/sdxl", { prompt: "a cat", loras: ["film:0.8", "noir"] });
    assert.deepEqual((seen as { loras: unknown }).loras, [{ name: "film", scale: 0.8 }, { name: "noir" }]);
  } finally {
    server.close();
  }
});
