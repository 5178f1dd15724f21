// Runs the README's TypeScript snippet (readme.ts, compiled to dist/readme.js)
// as a newcomer would, beside a sidecar started on scripts/serve's defaults
// (psych-sidecar-data/sidecar.sock under the working directory), with
// PSYCH_SIDECAR_ADDRESS naming that socket. The snippet waits for SERVING itself.

import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const snippet = join(dirname(fileURLToPath(import.meta.url)), "readme.js");

test("the README's TypeScript snippet runs against a sidecar", async () => {
  const bin = process.env.PSYCH_SIDECAR_BIN || "psych-sidecar";
  const dir = mkdtempSync(join(tmpdir(), "psreadme"));
  const env = Object.fromEntries(
    Object.entries(process.env).filter(
      ([name]) => !name.startsWith("PSYCH_SIDECAR_") || name === "PSYCH_SIDECAR_BIN",
    ),
  );
  const sidecar = spawn(bin, ["serve"], { cwd: dir, env, stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  sidecar.stderr?.on("data", (chunk: Buffer) => (log += chunk.toString()));
  const exited = new Promise((resolve) => sidecar.on("exit", resolve));
  try {
    const { stdout } = await promisify(execFile)(process.execPath, [snippet], {
      cwd: dir,
      env: { ...process.env, PSYCH_SIDECAR_ADDRESS: `unix:${join(dir, "psych-sidecar-data", "sidecar.sock")}` },
      timeout: 60_000,
    });
    assert.match(stdout, /^appended at sequence 1n$/m);
    assert.match(stdout, /^NotFound RUN_NOT_FOUND run_missing$/m);
  } catch (error) {
    console.error(`sidecar log:\n${log}`);
    throw error;
  } finally {
    sidecar.kill("SIGTERM");
    await exited;
    rmSync(dir, { recursive: true, force: true });
  }
});
