"""What the sidecar's patches of the MCP SDK rely on: `leave_results_to_the_sidecar` in
mcp/session.py, which switches off the SDK's own output-schema check of tool results, since
the sidecar judges them itself; and `assume_complete_tool_results`, which gives a 2026-07-28
tools/call result without `resultType` its default before the SDK's wire check refuses it.
The SDK offers no switch for either; these tests fail when it
changes what the patch replaces (the method, its signature, its call sites) or gains an
option that could replace the patch, and show on the fixture server over stdio that the patch
is what decides. The sidecar's own judgement of such a result end to end is in
test_fault_matrix.py (`test_a_result_that_breaks_its_output_schema_is_the_servers_tool_error`).
"""

from __future__ import annotations

import dataclasses
import inspect

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientSession

from psych_sidecar.mcp.session import leave_results_to_the_sidecar
from tests.support.connections import fixture_commands


def test_the_raw_result_still_passes_the_dispatcher_before_the_wire_check() -> None:
    source = inspect.getsource(ClientSession.send_request)
    sent = source.index("raw = await self._dispatcher.send_raw_request(")
    assert sent < source.index("_methods.validate_server_result(method, version, raw)")


def test_the_replaced_method_keeps_its_signature() -> None:
    method = ClientSession.validate_tool_result
    assert inspect.iscoroutinefunction(method)
    assert list(inspect.signature(method).parameters) == ["self", "name", "result"]


def test_every_tools_call_path_still_asks_the_replaced_method() -> None:
    # A new call site, or a renamed one, would judge results without asking the patch.
    assert "await self.validate_tool_result(name, result)" in inspect.getsource(
        ClientSession.call_tool
    )
    assert "await self.session.validate_tool_result(name, final)" in inspect.getsource(
        Client.call_tool
    )


def test_the_sdk_still_offers_no_switch_of_its_own() -> None:
    """Should `Client` or `ClientSession` take an option about validating results, the patch
    could give way to it."""
    options = [
        *inspect.signature(ClientSession.__init__).parameters,
        *(field.name for field in dataclasses.fields(Client)),
    ]
    assert [name for name in options if "valid" in name or "schema" in name] == []


def test_on_a_real_server_the_patch_is_what_leaves_the_result_to_the_sidecar() -> None:
    argv = fixture_commands()["fixture"]["argv"]
    server = StdioServerParameters(
        command=argv[0], args=[*argv[1:], "--tools", "0", "--output-schema-faults"]
    )

    async def main() -> None:
        async with Client(server, cache=None) as client:
            await client.list_tools()
            # The SDK's own check: a result that breaks its schema is an exception.
            with pytest.raises(RuntimeError, match="Invalid structured content"):
                await client.call_tool("wrong_structured", {})
            leave_results_to_the_sidecar(client.session)
            result = await client.call_tool("wrong_structured", {})
            # Now the result is the server's, as sent, for the sidecar to judge.
            assert result.structured_content == {"y": 1}

    anyio.run(main)
