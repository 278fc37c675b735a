/** The client and verifier against a live genhook (`genhook serve` from this checkout). */

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server } from "node:http";
import { after, before, describe, test } from "node:test";

import {
  Conflict,
  Forbidden,
  GenhookClient,
  InvalidRequest,
  NotFound,
  raiseForFailure,
  readRawBody,
  TaskFailed,
  Unauthorized,
  WaitTimeout,
  WebhookVerifier,
  type Prediction,
  type TaskEvent,
  type WebhookEvent,
} from "../src/index.js";
import { startService, type Service } from "./service.js";

const MODEL = "test/fake-edit";
// A 1x1 PNG.
const PNG = Buffer.from(
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC",
  "base64",
);

interface Received {
  headers: IncomingMessage["headers"];
  body: Uint8Array;
}

describe("against a live service", () => {
  let service: Service;
  let client: GenhookClient;
  let receiver: Server;
  let hookUrl: string;
  const received: Received[] = [];
  const waiting: ((r: Received) => void)[] = [];

  before(async () => {
    service = await startService();
    client = new GenhookClient({ baseUrl: service.baseUrl, apiKey: service.apiKey });
    receiver = createServer((req, res) => {
      void readRawBody(req).then((body) => {
        const entry = { headers: req.headers, body };
        const next = waiting.shift();
        if (next) next(entry);
        else received.push(entry);
        res.writeHead(200).end();
      });
    });
    await new Promise<void>((r) => receiver.listen(0, "127.0.0.1", r));
    const address = receiver.address();
    hookUrl = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}/hook`;
  });

  after(async () => {
    await new Promise<void>((r) => receiver.close(() => r()));
    await service?.stop();
  });

  /** The first delivery of this task: at-least-once delivery may repeat an earlier one. */
  async function deliveryOf(taskId: string): Promise<Received> {
    for (;;) {
      const entry = received.shift() ?? (await new Promise<Received>((resolve) => waiting.push(resolve)));
      const body = JSON.parse(Buffer.from(entry.body).toString()) as { session_id?: string };
      if (body.session_id === taskId) return entry;
    }
  }

  const edit = (prompt: string, options: Parameters<GenhookClient["edit"]>[2] = {}) =>
    client.edit(prompt, PNG, { model: MODEL, size: "1024*1024", ...options });

  test("models and one model; an unknown one is NotFound", async () => {
    const models = await client.models();
    assert.ok(models.some((m) => m.id === MODEL));
    const model = await client.model(MODEL);
    assert.equal(model.kind, "image");
    assert.ok(model.submit_paths.includes("/api/v1/model/generateImage"));
    await assert.rejects(client.model("no/such-model"), NotFound);
  });

  test("a wrong key is Unauthorized; a bad request is InvalidRequest with field errors", async () => {
    const stranger = new GenhookClient({ baseUrl: service.baseUrl, apiKey: "gh_wrong" });
    await assert.rejects(stranger.result("x"), Unauthorized);
    await assert.rejects(client.submit(MODEL, { prompt: "x", images: [] }), (error: unknown) => {
      assert.ok(error instanceof InvalidRequest);
      assert.equal(error.statusCode, 400);
      assert.ok(error.fieldErrors.some((f) => f.field.startsWith("images")), JSON.stringify(error.fieldErrors));
      return true;
    });
    await assert.rejects(client.result("no-such-task"), NotFound);
  });

  test("submit, then wait with Prefer: wait and by polling", async () => {
    const task = await edit("plain");
    assert.equal(task.model, MODEL);
    const done = await client.wait(task.id, { timeoutMs: 60_000 });
    assert.equal(done.status, "completed");
    assert.equal(done.outputs?.length, 1);
    assert.equal(raiseForFailure(done), done);
    const polled = await client.wait((await edit("plain")).id, { mode: "poll", pollIntervalMs: 100, timeoutMs: 60_000 });
    assert.equal(polled.status, "completed");
    const held = await edit("plain", { wait: 30 });
    assert.equal(held.status, "completed", "Prefer: wait on submit answers once the task ended");
  });

  test("a failed task is returned by wait and thrown by raiseForFailure", async () => {
    const done = await client.wait((await edit("fail")).id, { timeoutMs: 60_000 });
    assert.equal(done.status, "failed");
    assert.throws(() => raiseForFailure(done), TaskFailed);
  });

  test("wait gives up with WaitTimeout carrying the last answer", async () => {
    const task = await edit("wait=20");
    await assert.rejects(client.wait(task.id, { timeoutMs: 1_500 }), (error: unknown) => {
      assert.ok(error instanceof WaitTimeout);
      assert.equal(error.last.id, task.id);
      return true;
    });
    const canceled = await client.cancel(task.id);
    assert.equal(canceled.status, "canceled");
    await assert.rejects(client.cancel(task.id), Conflict);
  });

  test("priority: sent in the body, shown when not normal, refused above the key's bound", async () => {
    const high = await edit("plain", { priority: "high" });
    assert.equal(high.priority, "high");
    const plain = await edit("plain");
    assert.equal(plain.priority, undefined, "a normal task's answer keeps its shape");
    await assert.rejects(edit("plain", { priority: "urgent" as "high" }), (error: unknown) => {
      assert.ok(error instanceof InvalidRequest);
      assert.deepEqual(error.fieldErrors.map((f) => f.field), ["priority"]);
      return true;
    });
    const created = JSON.parse(await service.cli("keys", "create", service.accountId, "--max-priority", "normal", "--json")) as {
      api_key: string;
    };
    const bounded = new GenhookClient({ baseUrl: service.baseUrl, apiKey: created.api_key });
    const boundedEdit = (priority: "high" | "low") =>
      bounded.edit("plain", PNG, { model: MODEL, size: "1024*1024", priority });
    await assert.rejects(boundedEdit("high"), (error: unknown) => {
      assert.ok(error instanceof Forbidden);
      assert.equal(error.statusCode, 403);
      assert.deepEqual(error.fieldErrors.map((f) => f.field), ["priority"]);
      return true;
    });
    assert.equal((await boundedEdit("low")).priority, "low");
  });

  test("idempotency keys: a repeat is the same task, a different body with the key a Conflict", async () => {
    const key = `order-${Date.now()}`;
    const first = await edit("plain", { idempotencyKey: key });
    const again = await edit("plain", { idempotencyKey: key });
    assert.equal(again.id, first.id);
    await assert.rejects(edit("other prompt", { idempotencyKey: key }), Conflict);
  });

  test("the event stream ends after the terminal event and resumes with Last-Event-ID", async () => {
    const task = await edit("steps=3 sleep=0.9");
    const events: TaskEvent[] = [];
    for await (const event of client.events(task.id)) events.push(event);
    const last = events.at(-1);
    assert.equal(last?.prediction.status, "completed");
    assert.ok(events.length >= 2, events.map((e) => e.event).join(","));
    const first = events[0];
    assert.ok(first);
    const resumed: TaskEvent[] = [];
    for await (const event of client.events(task.id, { lastEventId: first.id })) resumed.push(event);
    assert.ok(!resumed.some((e) => e.id === first.id), "an event before Last-Event-ID is not sent again");
    assert.equal(resumed.at(-1)?.prediction.status, "completed");
  });

  test("listing pages with a cursor", async () => {
    const page = await client.tasks({ limit: 2 });
    assert.equal(page.items.length, 2);
    assert.ok(page.next_cursor);
    const next = await client.tasks({ limit: 2, cursor: page.next_cursor });
    assert.ok(next.items.every((item) => !page.items.some((seen) => seen.id === item.id)));
    const failed = await client.tasks({ status: ["failed"] });
    assert.ok(failed.items.length >= 1 && failed.items.every((p: Prediction) => p.status === "failed"));
    let all = 0;
    for await (const _ of client.allTasks({ model: MODEL })) all++;
    assert.ok(all >= page.items.length + next.items.length);
    await assert.rejects(client.tasks({ limit: 1000 }), InvalidRequest);
  });

  test("a webhook verifies with the service's JWKS (Ed25519) and, HMAC-only, with the secret", async () => {
    const task = await edit("plain", { webhook_url: hookUrl });
    const delivery = await deliveryOf(task.id);
    const ed25519 = new WebhookVerifier({ jwksUrl: `${service.baseUrl}/api/v1/webhooks/jwks.json` });
    const event: WebhookEvent = await ed25519.verify(delivery.headers, delivery.body);
    assert.equal(event.sessionId, task.id);
    assert.equal(event.scheme, "ed25519");
    assert.ok(event.ok);
    assert.equal(event.payload.outputs?.length, 1);
    const hmac = new WebhookVerifier({ hmacSecret: service.signingSecret });
    assert.equal((await hmac.verify(delivery.headers, delivery.body)).scheme, "hmac");
    const keys = (ed25519.keys as { maxAge?: number }).maxAge;
    assert.equal(keys, 300_000, "the lifetime the service states in Cache-Control is the one kept");
    const tampered = Buffer.from(Buffer.from(delivery.body).toString().replace(task.id, "x" + task.id.slice(1)));
    await assert.rejects(ed25519.verify(delivery.headers, tampered), /bad_signature/);
  });

  test("Standard Webhooks headers (v1a) from an account that asked for them", async () => {
    const account = JSON.parse(await service.cli("accounts", "create", `ts-${Date.now()}`, "--json")) as Record<string, string>;
    await service.cli("accounts", "standard-webhooks", account["account_id"] ?? "", "on");
    const other = new GenhookClient({ baseUrl: service.baseUrl, apiKey: account["api_key"] ?? "" });
    const task = await other.edit("plain", PNG, { model: MODEL, size: "1024*1024", webhook_url: hookUrl });
    const delivery = await deliveryOf(task.id);
    // Only the Standard Webhooks family (and the key id) left: the verifier takes that path.
    const headers = Object.fromEntries(
      Object.entries(delivery.headers).filter(([name]) => !name.startsWith("x-service-") || name === "x-service-webhook-key-id"),
    );
    assert.ok(headers["webhook-signature"], JSON.stringify(delivery.headers));
    const verifier = new WebhookVerifier({ jwksUrl: `${service.baseUrl}/api/v1/webhooks/jwks.json` });
    const event = await verifier.verify(headers, delivery.body);
    assert.equal(event.sessionId, task.id);
    assert.equal(event.scheme, "ed25519");
  });
});
