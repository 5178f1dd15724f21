// The TypeScript runner's scenario engine: scenario shape, variables,
// $repeat, matching and captures, exactly as tests/contract/README.md
// defines them (engine-cases.json pins the rules, and the Python and Go
// runners pass the same cases). Nothing here speaks gRPC: the runner hands in
// a function that makes one call.

import { randomBytes } from "node:crypto";
import { readFileSync, readdirSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: Json };

/** An absent value in the actual JSON (proto3 JSON omits default values). */
export const MISSING: unique symbol = Symbol("missing");
export type Actual = Json | typeof MISSING;

export const CONTRACT_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const ERROR_DOMAIN = "psych.sidecar.v1";
export const CALL_TIMEOUT_MS = 10_000;

const SCENARIO_KEYS = ["name", "rpc", "description", "steps"];
const STEP_KEYS = ["call", "request", "response", "error", "capture"];
const ERROR_KEYS = ["code", "reason", "metadata"];
const VARIABLE_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const REFERENCE = /^\$\{([A-Za-z_][A-Za-z0-9_]*)\}/;
const INDEX = /^[0-9]+$/;

/** A scenario does not hold, or cannot be run as written. */
export class ScenarioError extends Error {}

/** One detail of a failed call's status: an ErrorInfo, or null for another type. */
export interface ErrorDetail {
  reason: string;
  domain: string;
  metadata: { [key: string]: string };
}

/** What one call answered: a response as proto3 JSON, or a status code name and details. */
export interface Outcome {
  response?: JsonObject;
  code: string;
  message: string;
  details: (ErrorDetail | null)[];
}

export type Invoke = (call: string, request: JsonObject) => Promise<Outcome>;

export interface Scenario {
  name: string;
  rpc: string;
  description: string;
  steps: JsonObject[];
}

export function scenarioFiles(): string[] {
  const directory = join(CONTRACT_DIR, "scenarios");
  return readdirSync(directory)
    .filter((name) => name.endsWith(".json"))
    .sort()
    .map((name) => join(directory, name));
}

function require(condition: boolean, message: string): asserts condition {
  if (!condition) throw new ScenarioError(message);
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function requireKeys(object: JsonObject, required: string[], allowed: string[], where: string) {
  const unknown = Object.keys(object).filter((key) => !allowed.includes(key));
  require(unknown.length === 0, `${where}: unknown keys ${JSON.stringify(unknown.sort())}`);
  const missing = required.filter((key) => !(key in object));
  require(missing.length === 0, `${where}: missing keys ${JSON.stringify(missing)}`);
}

/** Reads one scenario and checks its shape; a key this engine does not know fails it. */
export function loadScenario(path: string): Scenario {
  const file = basename(path);
  const scenario: Json = JSON.parse(readFileSync(path, "utf-8"));
  require(isObject(scenario), `${file}: not a JSON object`);
  requireKeys(scenario, SCENARIO_KEYS, SCENARIO_KEYS, file);
  require(scenario.name === file.replace(/\.json$/, ""), `${file}: name is not the file name`);
  require(typeof scenario.rpc === "string", `${file}: rpc is not a string`);
  require(typeof scenario.description === "string", `${file}: description`);
  const steps = scenario.steps;
  require(Array.isArray(steps) && steps.length > 0, `${file}: steps must be a non-empty list`);
  steps.forEach((step, index) => {
    const where = `${file} step ${index + 1}`;
    require(isObject(step), `${where}: not an object`);
    requireKeys(step, ["call", "request"], STEP_KEYS, where);
    require(typeof step.call === "string", `${where}: call is not a string`);
    require(isObject(step.request), `${where}: request is not an object`);
    require("response" in step !== "error" in step, `${where}: needs one of response, error`);
    if ("response" in step) require(isObject(step.response), `${where}: response is not an object`);
    if ("error" in step) {
      const error = step.error;
      require(isObject(error), `${where}: error is not an object`);
      requireKeys(error, ["code", "reason"], ERROR_KEYS, where);
      require(typeof error.code === "string", `${where}: error.code is not a string`);
      require(typeof error.reason === "string", `${where}: error.reason is not a string`);
      require(!("metadata" in error) || isObject(error.metadata), `${where}: error.metadata not object`);
    }
    if ("capture" in step) {
      require("response" in step, `${where}: capture needs a response`);
      const captures = step.capture;
      require(isObject(captures), `${where}: capture is not an object`);
      for (const [name, capturePath] of Object.entries(captures)) {
        require(VARIABLE_NAME.test(name), `${where}: variable name ${JSON.stringify(name)}`);
        require(typeof capturePath === "string", `${where}: capture path of ${name}`);
      }
    }
  });
  return scenario as unknown as Scenario;
}

/** Runs every step in order; throws ScenarioError at the first that does not hold. */
export async function runScenario(scenario: Scenario, invoke: Invoke): Promise<void> {
  const variables: { [name: string]: string } = { unique: randomBytes(6).toString("hex") };
  // scripts/test-contract starts the OAuth test server of the sign-in scenarios.
  const oauthUrl = process.env.PSYCH_CONTRACT_OAUTH_MCP_URL;
  if (oauthUrl) variables.oauth_mcp_url = oauthUrl;
  for (const [index, step] of scenario.steps.entries()) {
    const where = `step ${index + 1} (${step.call})`;
    try {
      const outcome = await invoke(step.call as string, expand(step.request, variables) as JsonObject);
      if ("error" in step) {
        checkError(expand(step.error, variables) as JsonObject, outcome);
        continue;
      }
      checkResponse(expand(step.response, variables) as JsonObject, outcome);
      for (const [name, capturePath] of Object.entries((step.capture ?? {}) as JsonObject)) {
        require(!(name in variables), `variable ${name} is already defined`);
        variables[name] = capture(outcome.response as JsonObject, capturePath as string);
      }
    } catch (error) {
      if (error instanceof ScenarioError) {
        throw new ScenarioError(`${scenario.name}: ${where}: ${error.message}`);
      }
      throw error;
    }
  }
}

function checkResponse(expected: JsonObject, outcome: Outcome) {
  if (outcome.response === undefined) {
    throw new ScenarioError(
      `expected a response, got ${outcome.code}: ${outcome.message} ${JSON.stringify(outcome.details)}`,
    );
  }
  const problem = mismatch(expected, outcome.response);
  if (problem !== null) {
    throw new ScenarioError(`${problem}; the response: ${JSON.stringify(outcome.response).slice(0, 2000)}`);
  }
}

function checkError(expected: JsonObject, outcome: Outcome) {
  if (outcome.response !== undefined) {
    throw new ScenarioError(
      `expected ${expected.code} / ${expected.reason}, got a response ${JSON.stringify(outcome.response).slice(0, 2000)}`,
    );
  }
  const got = `${outcome.code} ${JSON.stringify(outcome.message)} with details ${JSON.stringify(outcome.details)}`;
  require(outcome.code === expected.code, `expected status ${expected.code}, got ${got}`);
  const info = outcome.details[0];
  require(outcome.details.length === 1 && info != null, `expected exactly one detail, an ErrorInfo; got ${got}`);
  require(info.domain === ERROR_DOMAIN, `expected ErrorInfo domain ${ERROR_DOMAIN}, got ${got}`);
  require(info.reason === expected.reason, `expected reason ${expected.reason}, got ${got}`);
  const problem = mismatch(expected.metadata ?? {}, info.metadata, "metadata");
  if (problem !== null) throw new ScenarioError(`${problem}; got ${got}`);
}

/** Replaces each ${name} by the variable's value; a malformed or unknown reference fails. */
export function substitute(text: string, variables: { [name: string]: string }): string {
  let out = "";
  let position = 0;
  for (;;) {
    const start = text.indexOf("${", position);
    if (start < 0) return out + text.slice(position);
    const reference = REFERENCE.exec(text.slice(start));
    require(reference !== null, `malformed variable reference in ${JSON.stringify(text.slice(0, 200))}`);
    const name = reference[1];
    require(Object.hasOwn(variables, name), `undefined variable \${${name}}`);
    out += text.slice(position, start) + variables[name];
    position = start + reference[0].length;
  }
}

/** Variables in every string (not in keys), and each {"$repeat": [text, count]}. */
export function expand(value: Json, variables: { [name: string]: string }): Json {
  if (typeof value === "string") return substitute(value, variables);
  if (Array.isArray(value)) return value.map((item) => expand(item, variables));
  if (isObject(value)) {
    if ("$repeat" in value) return repeat(value, variables);
    return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, expand(item, variables)]));
  }
  return value;
}

function repeat(value: JsonObject, variables: { [name: string]: string }): string {
  const args = value.$repeat;
  require(
    Object.keys(value).length === 1 &&
      Array.isArray(args) &&
      args.length === 2 &&
      typeof args[0] === "string" &&
      isCount(args[1]),
    `$repeat takes ["text", count >= 0] and nothing beside it: ${show(value)}`,
  );
  return substitute(args[0] as string, variables).repeat(args[1] as number);
}

/** Why actual does not match expected, or null when it does (README.md, Matching). */
export function mismatch(expected: Json, actual: Actual, path = ""): string | null {
  const where = path || "<response>";
  if (isObject(expected) && Object.keys(expected).some((key) => key.startsWith("$"))) {
    return matcherMismatch(expected, actual, where);
  }
  if (actual === MISSING) return `${where}: missing, expected ${show(expected)}`;
  if (isObject(expected)) {
    if (!isObject(actual)) return `${where}: expected an object, got ${show(actual)}`;
    for (const [key, item] of Object.entries(expected)) {
      const found = Object.hasOwn(actual, key) ? actual[key] : MISSING;
      const problem = mismatch(item, found, path ? `${path}.${key}` : key);
      if (problem !== null) return problem;
    }
    return null;
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) {
      return `${where}: expected a list of ${expected.length}, got ${show(actual)}`;
    }
    for (const [index, item] of expected.entries()) {
      const problem = mismatch(item, actual[index], path ? `${path}.${index}` : `${index}`);
      if (problem !== null) return problem;
    }
    return null;
  }
  // Literals: strings, numbers (by value), true, false and null compare with ===.
  if (expected === actual) return null;
  return `${where}: expected ${show(expected)}, got ${show(actual)}`;
}

function matcherMismatch(expected: JsonObject, actual: Actual, where: string): string | null {
  const entries = Object.entries(expected);
  if (entries.length !== 1) {
    return `${where}: a matcher must be the only key of its object: ${show(expected)}`;
  }
  const [[name, argument]] = entries;
  if (name === "$present" && argument === true) {
    return actual !== MISSING ? null : `${where}: missing, expected present`;
  }
  if (name === "$absent" && argument === true) {
    return actual === MISSING ? null : `${where}: expected absent, got ${show(actual)}`;
  }
  if (name === "$len" && isCount(argument)) {
    const length = actual === MISSING ? 0 : Array.isArray(actual) ? actual.length : null;
    return length === argument ? null : `${where}: expected a list of ${argument}, got ${show(actual)}`;
  }
  return `${where}: unknown matcher ${show(expected)}`;
}

/** The string at a dotted path of the response; a decimal segment indexes a list. */
export function capture(response: JsonObject, path: string): string {
  let value: Json = response;
  for (const segment of path.split(".")) {
    if (Array.isArray(value) && INDEX.test(segment) && Number(segment) < value.length) {
      value = value[Number(segment)];
    } else if (isObject(value) && Object.hasOwn(value, segment)) {
      value = value[segment];
    } else {
      throw new ScenarioError(`capture ${JSON.stringify(path)}: nothing at ${JSON.stringify(segment)}`);
    }
  }
  if (typeof value !== "string") {
    throw new ScenarioError(`capture ${JSON.stringify(path)}: ${show(value)} is not a string`);
  }
  return value;
}

function isCount(value: Json): value is number {
  return typeof value === "number" && Number.isInteger(value) && value >= 0;
}

function show(value: Actual): string {
  return value === MISSING ? "<missing>" : JSON.stringify(value).slice(0, 200);
}
