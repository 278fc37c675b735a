import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, lstatSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

// build/test/pack.test.js -> the package's directory
const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

test("npm pack makes a tarball that installs as a copy and imports", () => {
  const scratch = mkdtempSync(join(tmpdir(), "genhook-pack-"));
  try {
    const npm = (args: string[], cwd: string): string =>
      execFileSync("npm", [...args, "--no-audit", "--no-fund"], { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    // prepack builds dist/ first, so a fresh clone's `npm pack` is enough.
    const name = npm(["pack", "--pack-destination", scratch, "--silent"], PACKAGE).trim().split("\n").pop()!;
    const tarball = join(scratch, name);
    assert.ok(existsSync(tarball), `npm pack printed ${name}`);

    const project = join(scratch, "project");
    mkdirSync(project);
    writeFileSync(join(project, "package.json"), JSON.stringify({ name: "user-project", private: true, type: "module" }));
    npm(["install", "--offline", tarball], project);
    const installed = join(project, "node_modules", "@genhook", "sdk");
    // A copy of the package, not a link back into the clone.
    assert.equal(lstatSync(installed).isSymbolicLink(), false);
    assert.ok(existsSync(join(installed, "README.md")) && existsSync(join(installed, "dist", "index.d.ts")));

    const script = [
      'import { GenhookClient, WebhookVerifier, expressWebhook, fetchHandler } from "@genhook/sdk";',
      'const client = new GenhookClient({ apiKey: "k", baseUrl: "http://127.0.0.1:9" });',
      'const verifier = new WebhookVerifier({ hmacSecret: "s" });',
      "console.log([typeof client.submit, typeof verifier.verify, typeof expressWebhook(verifier), typeof fetchHandler(verifier, () => undefined)].join(\" \"));",
    ].join("\n");
    const printed = execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: project, encoding: "utf8" });
    assert.equal(printed.trim(), "function function function function");
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
});
