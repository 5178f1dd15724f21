"""Programmatic tool calling: who may call the tools of the bodies AssemblePrompt builds.

Anthropic and OpenAI (Responses API) each run code the model writes in a sandbox of their own,
and that code may call the application's tools; each such call comes back to the host as an
ordinary tool call (Anthropic: a `tool_use` block with a `caller`; OpenAI: a `function_call`
item with a `caller`), which the host dispatches through DispatchToolCall as any other. The
request says which tools the code may call, in each tool's `allowed_callers`, and carries the
sandbox tool itself:

- Anthropic: `allowed_callers` of "direct" and/or the code execution tool's type; the code
  execution tool (`{"type": "code_execution_20260120", "name": "code_execution"}`) among the
  tools. Programmatic calling needs `code_execution_20260120` or later (the Messages API's
  programmatic tool calling guide); the SDK's types list the versions accepted.
- OpenAI Responses: `allowed_callers` of "direct" and/or "programmatic"; the hosted
  `{"type": "programmatic_tool_calling"}` tool among the tools (the Responses API's
  programmatic tool calling guide).

Chat Completions and Gemini have no equivalent: their bodies are left as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from psych_sidecar.domain.errors import field_invalid

# The Anthropic code execution tools whose sandbox may call the application's tools.
ANTHROPIC_CODE_EXECUTION_TOOLS = ("code_execution_20260120", "code_execution_20260521")
DEFAULT_ANTHROPIC_CODE_EXECUTION_TOOL = ANTHROPIC_CODE_EXECUTION_TOOLS[0]
# The name Anthropic's code execution tool always has.
ANTHROPIC_CODE_EXECUTION_NAME = "code_execution"
OPENAI_PROGRAMMATIC_TOOL = "programmatic_tool_calling"


class ToolCallers(StrEnum):
    MODEL_AND_CODE = "model_and_code"
    CODE_ONLY = "code_only"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgrammaticCalling:
    """Who may call the tools; `callers` None: the model directly (off)."""

    callers: ToolCallers | None = None
    anthropic_code_execution_tool: str = ""

    @property
    def enabled(self) -> bool:
        return self.callers is not None

    @property
    def anthropic_tool_type(self) -> str:
        return self.anthropic_code_execution_tool or DEFAULT_ANTHROPIC_CODE_EXECUTION_TOOL

    def anthropic_sandbox_tool(self) -> dict[str, Any]:
        return {"type": self.anthropic_tool_type, "name": ANTHROPIC_CODE_EXECUTION_NAME}

    def anthropic_allowed_callers(self) -> list[str]:
        if self.callers is ToolCallers.CODE_ONLY:
            return [self.anthropic_tool_type]
        return ["direct", self.anthropic_tool_type]

    def openai_sandbox_tool(self) -> dict[str, Any]:
        return {"type": OPENAI_PROGRAMMATIC_TOOL}

    def openai_allowed_callers(self) -> list[str]:
        if self.callers is ToolCallers.CODE_ONLY:
            return ["programmatic"]
        return ["direct", "programmatic"]

    def content(self) -> dict[str, Any]:
        """The fields set, for the Spec's stored JSON."""
        content: dict[str, Any] = {}
        if self.callers is not None:
            content["callers"] = self.callers.value
        if self.anthropic_code_execution_tool:
            content["anthropic_code_execution_tool"] = self.anthropic_code_execution_tool
        return content

    @classmethod
    def from_content(cls, data: dict[str, Any]) -> ProgrammaticCalling:
        callers = data.get("callers")
        return cls(
            callers=None if callers is None else ToolCallers(callers),
            anthropic_code_execution_tool=data.get("anthropic_code_execution_tool", ""),
        )


def validate_programmatic_calling(settings: ProgrammaticCalling, field_path: str) -> None:
    """Refuse settings no request could carry (at publish)."""
    tool = settings.anthropic_code_execution_tool
    if tool and tool not in ANTHROPIC_CODE_EXECUTION_TOOLS:
        raise field_invalid(
            f"{field_path}.anthropic_code_execution_tool",
            f"must be one of {', '.join(ANTHROPIC_CODE_EXECUTION_TOOLS)} (the code execution "
            "tools whose sandbox can call tools)",
        )
    if tool and settings.callers is None:
        raise field_invalid(
            f"{field_path}.anthropic_code_execution_tool", "applies only when callers is set"
        )
