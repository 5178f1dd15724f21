// The TypeScript engine against engine-cases.json, the rules every runner's
// engine must follow.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import {
  type Json,
  type JsonObject,
  CONTRACT_DIR,
  MISSING,
  ScenarioError,
  capture,
  expand,
  mismatch,
} from "./engine.js";

interface Cases {
  match: { name: string; expected: Json; actual?: Json; vars?: { [k: string]: string }; ok: boolean }[];
  expand: { name: string; template: Json; vars?: { [k: string]: string }; result?: Json; error?: boolean }[];
  capture: { name: string; response: JsonObject; path: string; value?: string; error?: boolean }[];
}

const cases: Cases = JSON.parse(readFileSync(join(CONTRACT_DIR, "engine-cases.json"), "utf-8"));

test("match", async (t) => {
  assert.ok(cases.match.length > 0);
  for (const c of cases.match) {
    await t.test(c.name, () => {
      let problem: string | null;
      try {
        problem = mismatch(expand(c.expected, c.vars ?? {}), "actual" in c ? (c.actual as Json) : MISSING);
      } catch (error) {
        if (!(error instanceof ScenarioError)) throw error;
        problem = error.message;
      }
      assert.equal(problem === null, c.ok, problem ?? "matched");
    });
  }
});

test("expand", async (t) => {
  assert.ok(cases.expand.length > 0);
  for (const c of cases.expand) {
    await t.test(c.name, () => {
      if (c.error) {
        assert.throws(() => expand(c.template, c.vars ?? {}), ScenarioError);
      } else {
        assert.deepEqual(expand(c.template, c.vars ?? {}), c.result);
      }
    });
  }
});

test("capture", async (t) => {
  assert.ok(cases.capture.length > 0);
  for (const c of cases.capture) {
    await t.test(c.name, () => {
      if (c.error) {
        assert.throws(() => capture(c.response, c.path), ScenarioError);
      } else {
        assert.equal(capture(c.response, c.path), c.value);
      }
    });
  }
});
