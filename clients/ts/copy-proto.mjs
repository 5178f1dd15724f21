// Copies the generated contract (generated/ts: psych.sidecar.v1, google.rpc's ErrorInfo,
// grpc.health.v1) into src/proto/, so the package compiles and ships it: the npm tarball
// needs nothing but its registry dependencies. src/proto/ is not committed.
import { cpSync, rmSync } from "node:fs";

const from = new URL("../../generated/ts/", import.meta.url);
const to = new URL("src/proto/", import.meta.url);
rmSync(to, { recursive: true, force: true });
for (const dir of ["google", "grpc", "psych"]) {
  cpSync(new URL(dir, from), new URL(dir, to), { recursive: true });
}
