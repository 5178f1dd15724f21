// Runs the README's TypeScript snippet (readme.ts, compiled to dist/readme.js)
// as a newcomer would, beside a sidecar started on scripts/serve's defaults
// (psych-sidecar-data/sidecar.sock under the working directory), with
// PSYCH_SIDECAR_ADDRESS naming that socket, once the socket is there (as a
// newcomer runs it once scripts/serve says SERVING). The snippet waits for
// SERVING itself. A wrong socket path fails at once, naming it.

import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
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
  const socket = join(dir, "psych-sidecar-data", "sidecar.sock");
  try {
    for (const until = Date.now() + 60_000; !existsSync(socket) && Date.now() < until; ) await sleep(50);
    const { stdout } = await promisify(execFile)(process.execPath, [snippet], {
      cwd: dir,
      env: { ...process.env, PSYCH_SIDECAR_ADDRESS: `unix:${socket}` },
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

// Before: 20 s of retries, then "sidecar at … not SERVING", the cause never named.
test("the README's TypeScript snippet names a missing socket at once", async () => {
  const dir = mkdtempSync(join(tmpdir(), "psreadme"));
  try {
    for (const address of ["unix:psych-sidecar-data/sidecar.sock", `unix://${join(dir, "nobody.sock")}`]) {
      const failed = await promisify(execFile)(process.execPath, [snippet], {
        cwd: dir,
        env: { ...process.env, PSYCH_SIDECAR_ADDRESS: address },
        timeout: 60_000,
      }).then(
        () => "",
        (error: { stderr: string }) => error.stderr,
      );
      const socket = address.replace(/^unix:(\/\/)?/, "");
      assert.ok(
        failed.includes(`no socket at ${socket} (PSYCH_SIDECAR_ADDRESS=${address}): is scripts/serve running?`),
        failed,
      );
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
