/**
 * `genhook serve` from this checkout as a real subprocess on loopback, in a temporary data
 * directory, with the test engines of tests/support (a fake image model that fakes only the
 * model itself). The Python comes from $GENHOOK_PYTHON (the Makefile sets it to its venv).
 */

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, openSync, closeSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(fileURLToPath(import.meta.url), "../../../../..");

export interface Service {
  baseUrl: string;
  apiKey: string;
  accountId: string;
  signingSecret: string;
  dataDir: string;
  env: NodeJS.ProcessEnv;
  log(): string;
  /** Runs a `genhook` CLI command against the service's data directory. */
  cli(...args: string[]): Promise<string>;
  stop(): Promise<void>;
}

export function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => done(typeof address === "object" && address ? address.port : 0));
    });
  });
}

function python(): string {
  return process.env["GENHOOK_PYTHON"] || "python3";
}

function exited(child: ChildProcess, ms: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true);
  return new Promise((done) => {
    const timer = setTimeout(() => done(false), ms);
    child.once("exit", () => {
      clearTimeout(timer);
      done(true);
    });
  });
}

export async function startService(extraEnv: Record<string, string> = {}): Promise<Service> {
  const tmp = mkdtempSync(join(tmpdir(), "genhook-ts-"));
  const dataDir = join(tmp, "data");
  const port = await freePort();
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    GENHOOK_DATA_DIR: dataDir,
    GENHOOK_PORT: String(port),
    GENHOOK_HOST: "127.0.0.1",
    GENHOOK_WORKERS: "1",
    GENHOOK_EXTRA_ENGINES: '["tests.support.engines:register"]',
    GENHOOK_WEBHOOK_ALLOW_PRIVATE_TARGETS: "true",
    GENHOOK_WEBHOOK_RETRY_BASE_SECONDS: "0.2",
    GENHOOK_WORKER_POLL_SECONDS: "0.05",
    GENHOOK_SHUTDOWN_GRACE_SECONDS: "10",
    PYTHONPATH: [join(ROOT, "src"), ROOT, process.env["PYTHONPATH"]].filter(Boolean).join(":"),
    ...extraEnv,
  };
  const logPath = join(tmp, "service.log");
  const out = openSync(logPath, "w");
  // A process group of its own, so stop() reaches every process the service started.
  const child = spawn(python(), ["-m", "genhook.cli", "serve"], { env, cwd: tmp, stdio: ["ignore", out, out], detached: true });
  closeSync(out);
  const log = (): string => readFileSync(logPath, "utf8");
  const baseUrl = `http://127.0.0.1:${port}`;
  const stop = async (): Promise<void> => {
    if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) {
      process.kill(-child.pid, "SIGTERM");
      if (!(await exited(child, 30_000))) {
        process.kill(-child.pid, "SIGKILL");
        await exited(child, 5_000);
      }
    }
    try {
      // Children that outlived the supervisor (none should) go with the group.
      if (child.pid !== undefined) process.kill(-child.pid, "SIGKILL");
    } catch {
      // The group is already gone.
    }
    rmSync(tmp, { recursive: true, force: true });
  };
  const deadline = Date.now() + 90_000;
  for (;;) {
    if (child.exitCode !== null) {
      const text = log();
      await stop();
      throw new Error(`genhook serve exited:\n${text}`);
    }
    try {
      if ((await fetch(`${baseUrl}/readyz`, { signal: AbortSignal.timeout(1000) })).status === 200) break;
    } catch {
      // Not listening yet.
    }
    if (Date.now() > deadline) {
      const text = log();
      await stop();
      throw new Error(`genhook serve did not become ready:\n${text}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  const credentials = JSON.parse(readFileSync(join(dataDir, "credentials.json"), "utf8")) as Record<string, string>;
  const cli = (...args: string[]): Promise<string> =>
    new Promise((done, fail) => {
      const run = spawn(python(), ["-m", "genhook.cli", ...args], { env, cwd: tmp });
      let stdout = "";
      let stderr = "";
      run.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
      run.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
      run.on("exit", (code) => (code === 0 ? done(stdout) : fail(new Error(`genhook ${args.join(" ")}: ${code}\n${stdout}${stderr}`))));
    });
  return {
    baseUrl,
    apiKey: credentials["api_key"] ?? "",
    accountId: credentials["account_id"] ?? "",
    signingSecret: credentials["signing_secret"] ?? "",
    dataDir,
    env,
    log,
    cli,
    stop,
  };
}
