// A complete agent host in TypeScript: the loop a host runs against
// psych-sidecar, with a scripted model standing in for the LLM, so it needs no
// network and no API key (model.ts).
//
//   PSYCH_SIDECAR_ADDRESS=unix:///path/to/sidecar.sock npm start
//
// The sidecar must allow the project's MCP fixture server as the stdio command
// "fixture" and @modelcontextprotocol/server-everything as "everything"
// (examples/sidecar.toml; examples/README.md shows how to start one). The host
// publishes a Spec, connects both servers deferred (their tools stay out of the
// prompt, behind the meta tools), creates a Run and plays three user turns.
// Per turn: AppendRecords (the user message), ResolveTurn, then per model call
// AssemblePrompt → the model decides, answering as a thinking model on
// Anthropic's Messages API does → RecordUsage → AppendRecords (the assistant
// message, from the response with anthropicRecord, its thinking kept byte for
// byte) → DispatchToolCall for each tool call, until the model answers without
// tools. Then the host itself reads the elided result back
// (ReadToolOutput) and decodes the ErrorInfo of a deliberate mistake.

import { Code } from "@connectrpc/connect";
import {
  ErrorReason,
  SidecarError,
  type SidecarClient,
  anthropicRecord,
  connect,
  requestBody,
} from "@psych-sidecar/client";
import { ConnectionState } from "@psych-sidecar/client/proto/psych/sidecar/v1/connection_pb";
import { Provider, type ToolCall } from "@psych-sidecar/client/proto/psych/sidecar/v1/content_pb";
import { AnthropicThinking } from "@psych-sidecar/client/proto/psych/sidecar/v1/spec_pb";
import { DispatchDisposition } from "@psych-sidecar/client/proto/psych/sidecar/v1/tool_service_pb";
import { PromptZone } from "@psych-sidecar/client/proto/psych/sidecar/v1/turn_pb";
import type { AssemblePromptResponse } from "@psych-sidecar/client/proto/psych/sidecar/v1/turn_service_pb";

import { THINKING_BLOCK, contentText, decide, messagesResponse } from "./model.js";

const TENANT = "example-ts";
const SPEC_NAME = "example-ts-host";
const SPEC_VERSION = 3n;
const SERVER = "fixture";
/** A third-party Node MCP server, pinned in tests/mcp-peers/package.json. */
const EVERYTHING = "everything";
const MODEL = "scripted-model";
const MEMORY_TAIL = "Memory: the user likes short answers.";

/** What the user says, one turn each. */
const USER_TURNS = [
  "Fetch the fixture server's 20000-character report and tell me how long it is.",
  "What comes right after the part of the report you can still see?",
  "Thanks, that is all.",
];

class Host {
  private runId = "";
  private calls = 0;
  /** Thinking blocks appended, each to be sent back in every later body. */
  private thinking = 0;
  private readonly shownElided = new Set<string>();

  constructor(private readonly sidecar: SidecarClient) {}

  /** Publishes the Spec, connects the MCP server and creates the Run. */
  async setUp(): Promise<void> {
    // Thresholds this small elide the 20000-character result (5000 estimated
    // tokens) from every turn after the one that asked for it. Publishing the
    // same content again succeeds, so the example can run twice.
    try {
      await this.sidecar.specs.publishSpec({
        spec: {
          name: SPEC_NAME,
          version: SPEC_VERSION,
          instructions: "You answer questions using the tools of the fixture server.",
          thresholds: { perResultTokens: 1000n, perBatchTokens: 4000n, previewHeadChars: 200, previewTailChars: 100 },
          grants: [
            { serverPattern: SERVER, toolPattern: "*" },
            { serverPattern: EVERYTHING, toolPattern: "*" },
          ],
          // The Anthropic body asks for adaptive thinking, as Claude's current models run agents.
          reasoning: { anthropicThinking: AnthropicThinking.ADAPTIVE },
        },
      });
    } catch (error) {
      if (error instanceof SidecarError && error.reason === ErrorReason.SPEC_VERSION_EXISTS) {
        throw new Error(`${SPEC_NAME} v${SPEC_VERSION} was published with other content: bump the version (${error.message})`);
      }
      throw error;
    }
    console.log(`published spec ${SPEC_NAME} v${SPEC_VERSION}: results of 1000 estimated tokens or more are elided on later turns`);

    await this.connectStdio(SERVER, "fixture", ["--tools", "0"], "The project's MCP test server.");
    await this.connectStdio(EVERYTHING, "everything", [], "The MCP reference server: a bit of everything.");

    const { run } = await this.sidecar.runs.createRun({ tenant: TENANT, specName: SPEC_NAME, specVersion: SPEC_VERSION });
    this.runId = run!.runId;
    console.log(`created run ${this.runId}`);
    const { toolNames } = await this.sidecar.tools.listServerTools({ runId: this.runId, server: EVERYTHING, pageSize: 100 });
    console.log(`${EVERYTHING} offers the run ${toolNames.length} tools: ${toolNames.slice(0, 4).join(", ")}, …`);
  }

  /** Connects an MCP server over stdio, by the name of a command the sidecar allows. */
  private async connectStdio(name: string, command: string, args: string[], description: string): Promise<void> {
    const { connection } = await this.sidecar.connections.putConnection({
      connection: {
        tenant: TENANT,
        name,
        transport: { case: "stdio", value: { command, args } },
        preload: false,
        description,
      },
    });
    if (connection?.state !== ConnectionState.CONNECTED) {
      throw new Error(`${name} did not connect: ${connection?.state} ${connection?.lastError}`);
    }
    console.log(
      `connected MCP server ${name} over stdio: ${ConnectionState[connection.state]}, ` +
        `catalogue version ${connection.catalogVersion}, deferred`,
    );
  }

  /** The host reads the elided result back itself, by its handle, as a UI showing it in full would. */
  async readBack(): Promise<void> {
    const [handle] = this.shownElided;
    const read = await this.sidecar.tools.readToolOutput({ runId: this.runId, handle, offset: 19_950n, limit: 100n });
    console.log(
      `host read-back: ReadToolOutput ${handle} offset 19950 -> ${[...read.text].length} characters ` +
        `of ${read.totalLength}, next offset ${read.nextOffset}`,
    );
  }

  /** A deliberate mistake, to show the one google.rpc.ErrorInfo every error carries. */
  async deliberateError(): Promise<void> {
    const [handle] = this.shownElided;
    try {
      await this.sidecar.tools.readToolOutput({ runId: this.runId, handle, grep: "(" });
      throw new Error("an invalid grep pattern was accepted");
    } catch (error) {
      if (!(error instanceof SidecarError) || error.reason !== ErrorReason.PATTERN_INVALID) throw error;
      console.log(
        `deliberate error: ReadToolOutput grep "(" -> ${Code[error.code]} ${error.reasonName} ` +
          `${JSON.stringify(error.metadata)}: ${error.cause.rawMessage}`,
      );
    }
  }

  /** Plays one user turn to the model's final answer. */
  async turn(turn: number, text: string): Promise<void> {
    console.log(`\n== turn ${turn}\nuser: ${text}`);
    await this.sidecar.appendRecords({
      runId: this.runId,
      requestId: `turn-${turn}-user`,
      records: [{ kind: { case: "userMessage", value: { content: [{ kind: { case: "text", value: text } }] } } }],
    });
    const { surface } = await this.sidecar.turns.resolveTurn({ runId: this.runId });
    console.log(`tools this turn: ${(surface?.tools ?? []).map((tool) => tool.name).join(", ")}`);
    for (const line of surface?.servers ?? []) console.log(`server line: ${line.text}`);

    for (let step = 1; ; step++) {
      const assembled = await this.sidecar.turns.assemblePrompt({
        runId: this.runId,
        dynamicTail: MEMORY_TAIL,
        model: MODEL,
        maxTokens: 1024,
      });
      this.show(`${turn}.${step}`, assembled);
      // The body a host sends as it is: the thinking of every earlier step is back in it.
      const body = new TextDecoder().decode(requestBody(assembled, Provider.ANTHROPIC));
      const kept = body.split(THINKING_BLOCK).length - 1;
      if (kept !== this.thinking) {
        throw new Error(`the Anthropic body carries ${kept} of the ${this.thinking} thinking blocks appended`);
      }

      const decision = decide(assembled);
      // The provider reports usage with its answer; the host records it as reported.
      await this.sidecar.usage.recordUsage({
        runId: this.runId,
        requestId: `turn-${turn}-step-${step}`,
        model: MODEL,
        inputTokens: decision.inputTokens,
        outputTokens: decision.outputTokens,
      });
      // The response as a thinking model sends it, and the record to append: its thinking
      // block as a provider block, byte for byte, its tool_use blocks as tool calls.
      const ids = decision.calls.map(() => `call_${++this.calls}`);
      const record = anthropicRecord(messagesResponse(decision, ids));
      await this.sidecar.appendRecords({ runId: this.runId, requestId: `turn-${turn}-step-${step}`, records: [record] });
      this.thinking++;
      const calls = record.kind.case === "assistantMessage" ? record.kind.value.toolCalls : [];
      if (calls.length === 0) {
        console.log(`assistant: ${decision.text}`);
        return;
      }
      for (const call of calls) await this.dispatch(call);
    }
  }

  /** Prints the prompt's per-zone sizes, and each elided result the first time the prompt shows it. */
  private show(label: string, assembled: AssemblePromptResponse): void {
    const zones = assembled.zones.map((zone) => `${PromptZone[zone.zone].toLowerCase()} ${zone.byteLength}`);
    const total = assembled.zones.reduce((sum, zone) => sum + zone.byteLength, 0n);
    console.log(`prompt ${label} zone bytes: ${zones.join(" | ")} (total ${total})`);
    for (const message of assembled.prompt?.history ?? []) {
      for (const part of message.parts) {
        if (part.kind.case !== "toolResult") continue;
        const result = part.kind.value;
        if (!result.elided || this.shownElided.has(result.handle)) continue;
        this.shownElided.add(result.handle);
        console.log(
          `elided result: ${result.callId} is shown as a ${[...contentText(result.content)].length}-character ` +
            `preview with handle ${result.handle}`,
        );
      }
    }
  }

  /**
   * Hands one tool call to the sidecar, which runs it (a meta tool, an MCP
   * tool, read_tool_output) and appends its result to the Run's log.
   */
  private async dispatch(call: Omit<ToolCall, "$typeName">): Promise<void> {
    const dispatched = await this.sidecar.tools.dispatchToolCall({ runId: this.runId, call });
    if (dispatched.disposition !== DispatchDisposition.EXECUTED || dispatched.outcome === undefined) {
      // A host-local tool: this host has none.
      throw new Error(`${call.name} is not the sidecar's, and this host has no tool of that name`);
    }
    const outcome = dispatched.outcome;
    const result = JSON.parse(new TextDecoder().decode(outcome.resultJson)) as { content: { text?: string }[] };
    const text = result.content.map((block) => block.text ?? "").join("");
    const characters = [...text].length;
    if (call.name === "mcp_call_tool") {
      console.log(
        `deferred call: ${call.name} ${call.argumentsJson} -> ${characters} characters, is_error ${outcome.isError}, ` +
          `stored as sequence ${outcome.sequence} with handle ${outcome.handle}`,
      );
    } else if (call.name === "read_tool_output") {
      console.log(`read-back: ${call.name} ${call.argumentsJson} -> ${JSON.stringify(text)}`);
    } else {
      console.log(`tool call: ${call.name} ${call.argumentsJson} -> ${characters} characters`);
    }
    if (outcome.isError) throw new Error(`${call.name} failed: ${text}`);
  }

  /** Prints the Run's usage, as the provider reported it. */
  async report(): Promise<void> {
    const { totals } = await this.sidecar.usage.getRunUsage({ runId: this.runId });
    console.log(
      `\nusage: ${totals?.modelCalls} model calls, ${totals?.inputTokens} input and ${totals?.outputTokens} output tokens`,
    );
    console.log(
      `thinking: ${this.thinking} thinking blocks appended, each sent back byte for byte in every later Anthropic body`,
    );
  }
}

const address = process.env.PSYCH_SIDECAR_ADDRESS;
if (!address) {
  console.error("set PSYCH_SIDECAR_ADDRESS to the sidecar's address, e.g. unix:///tmp/sidecar.sock");
  process.exit(1);
}
const sidecar = await connect(address, { readyTimeoutMs: 30_000 });
try {
  const host = new Host(sidecar);
  await host.setUp();
  for (const [index, text] of USER_TURNS.entries()) await host.turn(index + 1, text);
  await host.readBack();
  await host.deliberateError();
  await host.report();
} finally {
  sidecar.close();
}
