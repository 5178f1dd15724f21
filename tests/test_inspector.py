"""The Run inspector at /ui, in a real browser (Debian's chromium through chromium-driver and
Selenium), against the real sidecar on both databases.

A scripted Run is loaded once per module: two turns, four model calls each followed by
RecordUsage, an elided result, a result holding `<script>`, an MCP server (the fixture
server, deferred) connected mid-Run, a deferred call through `mcp_call_tool` that adds a
tool to that server (a second catalogue version). The browser then checks what each view
shows; screenshots of each view go to the test's tmp_path (and, with
PSYCH_UPDATE_DOCS_SCREENSHOTS=1, the timeline's to docs/inspector-timeline.png).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait
from starlette.applications import Starlette

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    content_pb2,
    run_pb2,
    spec_pb2,
    usage_service_pb2,
    usage_service_pb2_grpc,
)
from psych_sidecar.admin import ui
from psych_sidecar.admin.ui import CONTENT_SECURITY_POLICY
from tests.support.connections import fixture_commands, listed, put_http, put_stdio
from tests.support.polling import wait_for
from tests.support.processes import free_port
from tests.support.prompts import append, assemble, assistant, dispatch, run_with, thresholds
from tests.support.requests import user
from tests.support.sidecar import RunningSidecar, Stubs

# The first browser test may wait for apt-get to install chromium (a minute or two).
pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).parent.parent
URL_SECRET = "url-secret-4f1c"
HEADER_SECRET = "header-secret-9a2e"
DOCS_SCREENSHOT = ROOT / "docs" / "inspector-timeline.png"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCRIPT = "<script>alert('owned')</script><b>not bold</b> & \"quoted\""
REPORT = "\n".join(
    f"line {n}: needle found in section {n}" if n % 10 == 0 else f"line {n}: revenue {n * 37}"
    for n in range(1, 121)
)


# One transport is enough: the pages sit behind the admin listener, not the gRPC one.
SIDECAR_TRANSPORTS = ["unix"]


# The admin listener on a free loopback port, and the fixture MCP server allowed.
SIDECAR_OVERRIDES: dict[str, Any] = {
    "admin_listen": ["127.0.0.1:0"],
    "mcp_commands": fixture_commands(),
}


@dataclass
class ScriptedRun:
    base_url: str
    tenant: str
    run_id: str
    other_run_id: str
    report_handle: str
    script_handle: str
    calls: int
    usages: int


def _tool_result(call_id: str, tool: str, text: str) -> run_pb2.Record:
    return run_pb2.Record(
        tool_result=run_pb2.ToolResult(
            call_id=call_id, tool=tool, content=[content_pb2.ContentPart(text=text)]
        )
    )


@pytest.fixture(scope="module")
def scripted(stubs: Stubs, grpc_server: RunningSidecar, grpc_channel: grpc.Channel) -> ScriptedRun:
    """The Run every browser test looks at (see the module's docstring)."""
    usage = usage_service_pb2_grpc.UsageServiceStub(grpc_channel)
    usages = 0

    def record_usage(**tokens: int) -> None:
        nonlocal usages
        request = usage_service_pb2.RecordUsageRequest(run_id=run_id, model="claude-test")
        for name, value in tokens.items():
            setattr(request, name, value)
        usage.RecordUsage(request)
        usages += 1

    tenant = "acme"
    run_id = run_with(
        stubs,
        "inspected-agent",
        tenant=tenant,
        instructions="You help customers with their reports.",
        thresholds=thresholds(
            per_result_tokens=400,
            per_batch_tokens=500,
            preview_head_chars=100,
            preview_tail_chars=50,
        ),
        grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")],
    )
    other_run_id = run_with(stubs, "other-agent", tenant="globex")
    append(stubs, run_id, user("Find the quarterly numbers."))
    assemble(stubs, run_id)
    record_usage(input_tokens=900, cache_write_tokens=800, output_tokens=40)
    appended = append(
        stubs,
        run_id,
        assistant("", ("c1", "search_files", "{}"), ("c2", "fetch_page", "{}")),
        _tool_result("c1", "search_files", REPORT),
        _tool_result("c2", "fetch_page", SCRIPT),
    )
    report_handle, script_handle = appended[1].handle, appended[2].handle
    assemble(stubs, run_id)
    record_usage(input_tokens=300, cache_read_tokens=800, cache_write_tokens=900, output_tokens=30)

    # A server connected mid-Run (deferred: its tools sit behind the meta tools).
    put_stdio(stubs, tenant, "docs", preload=False, description="Company documents.")
    wait_for(
        lambda: (
            listed(stubs, tenant)["docs"].catalog_version >= 1
            and listed(stubs, tenant)["docs"].state == connection_pb2.CONNECTION_STATE_CONNECTED
        ),
        "the docs server to connect",
    )
    append(stubs, run_id, assistant("Revenue grew."), user("Now check the docs server."))
    assemble(stubs, run_id)
    record_usage(input_tokens=1500, cache_write_tokens=1400, output_tokens=50)

    # A deferred call: add a tool to the docs server, which lists a second catalogue version.
    arguments = {
        "server": "docs",
        "tool": "add_tool",
        "input": {"name": "lookup", "description": "Looks a document up.", "notify": False},
    }
    append(stubs, run_id, assistant("", ("c3", "mcp_call_tool", json.dumps(arguments))))
    outcome = dispatch(stubs, run_id, "c3", "mcp_call_tool", arguments)
    assert not outcome.outcome.is_error, outcome
    assert b"added lookup" in outcome.outcome.result_json, outcome
    stubs.connections.RefreshCatalog(
        connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="docs")
    )
    wait_for(lambda: listed(stubs, tenant)["docs"].catalog_version >= 2, "the second catalogue")
    assemble(stubs, run_id)
    record_usage(input_tokens=200, cache_read_tokens=1400, output_tokens=20)

    # Another tenant's server that never answers: unreachable, with a last error. Its URL and
    # headers carry secrets the page must not show.
    put_http(
        stubs,
        "globex",
        "down",
        f"http://127.0.0.1:{free_port()}/mcp?token={URL_SECRET}",
        headers={"Authorization": f"Bearer {HEADER_SECRET}"},
    )
    wait_for(
        lambda: (
            listed(stubs, "globex")["down"].state == connection_pb2.CONNECTION_STATE_UNREACHABLE
        ),
        "the unreachable server's state",
    )

    admin = grpc_server.sidecar.admin
    assert admin is not None
    [base_url] = admin.bound
    return ScriptedRun(
        base_url, tenant, run_id, other_run_id, report_handle, script_handle, 4, usages
    )


def _install_chromium() -> None:
    if os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER):
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.fail("chromium and chromium-driver are missing and cannot be installed here")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"],
        check=True,
        env=env,
        timeout=900,
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """Headless Debian chromium driven through chromium-driver; installed when missing."""
    _install_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # the suite runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _log(driver: webdriver.Chrome, kind: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = driver.get_log(kind)  # type: ignore[no-untyped-call]
    return entries


def _screenshot(driver: webdriver.Chrome, path: Path) -> None:
    # The whole page, not just the window.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, max(1000, min(int(height) + 40, 4000)))
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)


def _wait_for_url(driver: webdriver.Chrome, fragment: str) -> None:
    """A click that submits a form or follows a link returns before the next page loads."""
    WebDriverWait(driver, 30).until(expected_conditions.url_contains(fragment))


def _get(url: str) -> tuple[int, dict[str, str], str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read().decode()


def _result_url(scripted: ScriptedRun, handle: str, **query: str) -> str:
    url = f"{scripted.base_url}/ui/runs/{scripted.run_id}/results/{handle}"
    return url + ("?" + urllib.parse.urlencode(query) if query else "")


# Without a browser: headers, status codes, escaping in the HTML itself.


def test_every_page_is_sent_with_a_strict_content_security_policy(
    scripted: ScriptedRun,
) -> None:
    for path in (
        "/ui",
        f"/ui/runs/{scripted.run_id}",
        f"/ui/runs/{scripted.run_id}/results/{scripted.report_handle}",
        f"/ui/connections?tenant={scripted.tenant}",
        "/ui/runs/run_nope",
    ):
        status, headers, body = _get(scripted.base_url + path)
        assert status in (200, 404), path
        assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert "script-src" not in CONTENT_SECURITY_POLICY  # default-src 'none' covers it
        assert headers["x-content-type-options"] == "nosniff"
        assert "<script" not in body.lower(), path


def test_a_stored_script_arrives_escaped_in_the_html(scripted: ScriptedRun) -> None:
    status, _, body = _get(_result_url(scripted, scripted.script_handle))
    assert status == 200
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;&lt;b&gt;not bold&lt;/b&gt;" in body
    assert "&amp; &#34;quoted&#34;" in body


def test_unknown_runs_and_handles_and_bad_input_get_typed_answers(
    scripted: ScriptedRun,
) -> None:
    assert _get(scripted.base_url + "/ui/runs/run_nope")[0] == 404
    status, _, body = _get(_result_url(scripted, "h_nope"))
    assert status == 404
    assert "INVALID_DEFERRED_HANDLE" in body
    # A handle of another Run is not readable through this one.
    status, _, _ = _get(
        f"{scripted.base_url}/ui/runs/{scripted.other_run_id}/results/{scripted.report_handle}"
    )
    assert status == 404
    status, _, body = _get(_result_url(scripted, scripted.report_handle, grep="(unclosed"))
    assert status == 400
    assert "PATTERN_INVALID" in body
    assert _get(_result_url(scripted, scripted.report_handle, offset="-1"))[0] == 400
    assert _get(scripted.base_url + "/ui/connections")[0] == 400


def test_connections_show_the_tools_a_listing_left_out(scripted: ScriptedRun, stubs: Stubs) -> None:
    tenant = "initech"
    put = put_stdio(stubs, tenant, "broken", args=["--tools", "0", "--invalid-tools", "one"])
    assert put.rejected_tool_count == 1
    status, _, body = _get(f"{scripted.base_url}/ui/connections?tenant={tenant}")
    assert status == 200
    assert "1 listed tool with invalid definitions" in body
    assert "<code>bad_schema</code>: not a valid MCP tool: inputSchema.type: Field required" in body
    assert '<td class="num rejected-count">1</td>' in body


def test_the_timeline_shows_each_compaction_before_the_call_it_shaped(
    scripted: ScriptedRun, stubs: Stubs
) -> None:
    """A Run compacted twice: each compaction is a row of the timeline's table, with the
    turns and records it covered and its summary's size, placed before the first call
    assembled with it (the page fetched as a browser would, without one)."""
    policy = spec_pb2.CompactionPolicy(trigger_tokens=100_000, keep_recent_turns=1)
    run_id = run_with(stubs, "compacted-agent", tenant=scripted.tenant, compaction=policy)
    for turn in range(1, 6):
        append(stubs, run_id, user(f"Question {turn}."), assistant(f"Answer {turn}."))
    append(stubs, run_id, user("Question 6."))
    assemble(stubs, run_id)
    append(stubs, run_id, _compaction("S" * 1_200, 1, 6))
    assemble(stubs, run_id)
    append(stubs, run_id, _compaction("T" * 2_500, 7, 8))
    assemble(stubs, run_id)
    status, _, body = _get(f"{scripted.base_url}/ui/runs/{run_id}")
    assert status == 200
    table = body.split('<table id="calls"', 1)[1].split("</table>", 1)[0]
    rows = [row.split(">", 1)[0] for row in table.split("<tr")[2:]]
    assert [row.split('"')[1].split()[0] for row in rows] == [
        "call-row",
        "compaction-row",
        "call-row",
        "compaction-row",
        "call-row",
    ]
    first, second = table.split('class="compaction-row"')[1:]
    assert 'data-sequence="12"' in first
    assert '<span class="covered-turns">1 to 3</span>' in first
    assert '<span class="covered-records">1 to 6</span>' in first
    assert '<span class="summary-size">1,200 characters</span>' in first
    assert '<span class="covered-turns">4 to 4</span>' in second
    assert 'data-sequence="13"' in second
    assert '<span class="covered-records">7 to 8</span>' in second
    assert '<span class="summary-size">2,500 characters</span>' in second
    assert '<dd id="compaction-count">2</dd>' in body


def _compaction(summary: str, first: int, last: int) -> run_pb2.Record:
    return run_pb2.Record(
        compaction=run_pb2.Compaction(
            summary=[content_pb2.ContentPart(text=summary)],
            first_sequence=first,
            last_sequence=last,
        )
    )


def test_the_pages_are_read_only(scripted: ScriptedRun) -> None:
    request = urllib.request.Request(
        f"{scripted.base_url}/ui/runs/{scripted.run_id}", data=b"x", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    with refused.value:
        assert refused.value.code == 405


async def _asgi_get(app: Starlette, path: str, client: tuple[str, int] | None) -> int:
    """One GET straight into the ASGI app (no socket), from the given client address."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": client,
        "server": ("127.0.0.1", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await app(scope, receive, send)
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start"))


def test_only_clients_on_this_machine_get_the_pages_unless_the_operator_allows_more(
    scripted: ScriptedRun, grpc_server: RunningSidecar
) -> None:
    sidecar = grpc_server.sidecar
    inspector = sidecar.graph.inspector

    def status(allow_remote: bool, client: tuple[str, int] | None, path: str = "/ui") -> int:
        app = Starlette(routes=ui.admin_routes(inspector, _blocking, allow_remote))
        return asyncio.run(_asgi_get(app, path, client))

    run_path = f"/ui/runs/{scripted.run_id}"
    assert status(False, ("127.0.0.1", 5000)) == 200
    assert status(False, ("::1", 5000), run_path) == 200
    assert status(False, ("::ffff:127.0.0.1", 5000)) == 200
    assert status(False, None) == 200  # a Unix-socket client
    assert status(False, ("10.1.2.3", 5000)) == 403
    assert status(False, ("10.1.2.3", 5000), run_path) == 403
    assert status(False, ("10.1.2.3", 5000), "/ui/static/inspector.css") == 403
    assert status(False, ("::ffff:10.1.2.3", 5000)) == 403
    assert status(True, ("10.1.2.3", 5000), run_path) == 200


async def _blocking(function: Callable[..., Any], *args: Any) -> Any:
    # Off the loop, as the sidecar's storage threads run it (storage refuses the loop).
    return await asyncio.to_thread(function, *args)


# In the browser.


def test_the_runs_list_shows_each_run_and_filters_by_tenant(
    scripted: ScriptedRun, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    browser.get(scripted.base_url + "/ui")
    rows = browser.find_elements(By.CSS_SELECTOR, "#runs tr.run")
    texts = [row.text for row in rows]
    assert any(scripted.run_id in t and "acme" in t and "inspected-agent v1" in t for t in texts)
    assert any(scripted.other_run_id in t for t in texts)
    mine = next(row for row in rows if scripted.run_id in row.text)
    assert mine.find_elements(By.TAG_NAME, "td")[4].text == "8"  # records
    _screenshot(browser, tmp_path / "runs.png")

    browser.find_element(By.CSS_SELECTOR, "#tenant option[value='acme']").click()
    browser.find_element(By.CSS_SELECTOR, "form.filter button").click()
    _wait_for_url(browser, "tenant=acme")
    assert browser.current_url.endswith("/ui?tenant=acme")
    texts = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#runs tr.run")]
    assert texts
    assert all("acme" in t for t in texts)
    assert not any(scripted.other_run_id in t for t in texts)
    _screenshot(browser, tmp_path / "runs-acme.png")


def test_the_timeline_has_one_bar_per_model_call_with_usage_and_turns(
    scripted: ScriptedRun, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    browser.get(f"{scripted.base_url}/ui/runs/{scripted.run_id}")
    bars = browser.find_elements(By.CSS_SELECTOR, "#timeline-chart g.call")
    assert [bar.get_attribute("data-call") for bar in bars] == ["1", "2", "3", "4"]
    for bar in bars:
        assert len(bar.find_elements(By.CSS_SELECTOR, "rect.zone")) == 4
        assert bar.find_elements(By.CSS_SELECTOR, "rect.usage")  # every call had usage
    assert len(browser.find_elements(By.CSS_SELECTOR, "#timeline-chart .turn-boundary")) == 2
    share = browser.find_element(By.CSS_SELECTOR, "#timeline-chart polyline.cache-share")
    assert len((share.get_attribute("points") or "").split()) == scripted.usages
    rows = browser.find_elements(By.CSS_SELECTOR, "#calls tr.call-row")
    assert len(rows) == scripted.calls
    assert "1,400" in rows[3].text  # the fourth call's provider-reported cache read
    section = browser.find_element(By.ID, "timeline")
    section.screenshot(str(tmp_path / "timeline.png"))
    if os.environ.get("PSYCH_UPDATE_DOCS_SCREENSHOTS"):
        section.screenshot(str(DOCS_SCREENSHOT))
    _screenshot(browser, tmp_path / "run.png")


def test_the_explainer_names_the_connection_added_as_the_reason_for_the_miss(
    scripted: ScriptedRun, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    browser.get(f"{scripted.base_url}/ui/runs/{scripted.run_id}")
    missed = {
        row.get_attribute("data-call"): row
        for row in browser.find_elements(By.CSS_SELECTOR, "#miss-table tr.miss-row")
    }
    assert "1" not in missed  # a cold start
    assert "2" not in missed  # an append: the cached prefix held
    third = missed["3"]
    assert "static system" in third.text
    added = third.find_elements(By.CSS_SELECTOR, "li.reason[data-cause='connection_added']")
    assert [reason.text.split(" (")[0] for reason in added] == ["connection docs added"]
    # The same call also elided turn 1's report at the start of turn 2.
    assert third.find_elements(By.CSS_SELECTOR, "li.reason[data-cause='elision']")
    bar = browser.find_element(By.CSS_SELECTOR, "#timeline-chart g.call[data-call='3']")
    assert bar.get_attribute("data-missed") == "true"
    browser.find_element(By.ID, "misses").screenshot(str(tmp_path / "misses.png"))


def test_tool_results_per_turn_show_size_elision_and_handle(
    scripted: ScriptedRun, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    browser.get(f"{scripted.base_url}/ui/runs/{scripted.run_id}")
    rows = {
        row.get_attribute("data-sequence"): row.text
        for row in browser.find_elements(By.CSS_SELECTOR, "#results tr.result")
    }
    report = rows["3"]
    assert "search_files" in report
    assert f"{len(REPORT.encode()):,}" in report
    assert "elided per-result threshold" in report
    assert scripted.report_handle in report
    assert "in full" in rows["4"]  # the script result was small
    deferred = next(text for text in rows.values() if "docs · add_tool" in text)
    assert "current turn" in deferred
    browser.find_element(By.ID, "results").screenshot(str(tmp_path / "results.png"))


def test_the_reader_panel_greps_a_stored_result(
    scripted: ScriptedRun, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    browser.get(f"{scripted.base_url}/ui/runs/{scripted.run_id}")
    link = browser.find_element(By.CSS_SELECTOR, "tr.result[data-sequence='3'] a.read")
    link.click()
    _wait_for_url(browser, scripted.report_handle)
    assert browser.find_element(By.ID, "output").text.startswith("line 1: revenue 37")
    grep = browser.find_element(By.ID, "grep")
    grep.send_keys("needle")
    browser.find_element(By.ID, "read").click()
    _wait_for_url(browser, "grep=needle")
    matches = browser.find_elements(By.CSS_SELECTOR, "#matches tr.match")
    expected = [line for line in REPORT.split("\n") if "needle" in line]
    assert [m.find_elements(By.TAG_NAME, "td")[2].text for m in matches] == expected
    assert [m.find_elements(By.TAG_NAME, "td")[0].text for m in matches][:2] == ["10", "20"]
    _screenshot(browser, tmp_path / "reader-grep.png")

    # offset and limit, as ReadToolOutput counts them: characters of the text rendering.
    browser.get(_result_url(scripted, scripted.report_handle, offset="8", limit="10"))
    assert browser.find_element(By.ID, "output").text == REPORT[8:18]
    assert browser.find_element(By.ID, "next-offset").text == "18"


def test_a_result_holding_a_script_is_shown_as_text(
    scripted: ScriptedRun, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    browser.get(_result_url(scripted, scripted.script_handle))
    assert browser.find_element(By.ID, "output").text == SCRIPT
    assert browser.find_elements(By.TAG_NAME, "script") == []
    assert browser.find_elements(By.CSS_SELECTOR, "#output b") == []
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - reading it is what raises
    _screenshot(browser, tmp_path / "reader-script.png")


def test_connections_show_state_last_error_and_catalogue_diffs(
    scripted: ScriptedRun, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    browser.get(f"{scripted.base_url}/ui/runs/{scripted.run_id}")
    browser.find_element(By.ID, "connections-link").click()
    _wait_for_url(browser, "/ui/connections")
    docs = browser.find_element(By.CSS_SELECTOR, "article.connection[data-name='docs']")
    assert "connected" in docs.find_element(By.CSS_SELECTOR, "h2").text
    assert docs.find_element(By.CSS_SELECTOR, ".last-error").text == "none"
    versions = {
        v.get_attribute("data-version"): v
        for v in docs.find_elements(By.CSS_SELECTOR, "tr.version")
    }
    assert versions["2"].find_element(By.CSS_SELECTOR, ".added").text == "lookup"
    assert "echo" in versions["1"].find_element(By.CSS_SELECTOR, ".added").text
    # Secrets and launch details never reach the page.
    assert "fixture_server.py" not in browser.page_source
    _screenshot(browser, tmp_path / "connections.png")

    browser.get(f"{scripted.base_url}/ui/connections?tenant=globex")
    down = browser.find_element(By.CSS_SELECTOR, "article.connection[data-name='down']")
    assert "unreachable" in down.find_element(By.CSS_SELECTOR, "h2").text
    assert down.find_element(By.CSS_SELECTOR, ".last-error").text not in ("", "none")
    assert "Never listed." in down.text
    assert URL_SECRET not in browser.page_source
    assert HEADER_SECRET not in browser.page_source
    _screenshot(browser, tmp_path / "connections-unreachable.png")


def test_no_request_leaves_the_admin_listener_and_nothing_breaks_the_policy(
    scripted: ScriptedRun, browser: webdriver.Chrome
) -> None:
    _log(browser, "performance")  # drop what earlier tests caused
    _log(browser, "browser")
    for url in (
        scripted.base_url + "/ui",
        f"{scripted.base_url}/ui/runs/{scripted.run_id}",
        _result_url(scripted, scripted.script_handle),
        f"{scripted.base_url}/ui/connections?tenant={scripted.tenant}",
    ):
        browser.get(url)
    requested = []
    for entry in _log(browser, "performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requested.append(message["params"]["request"]["url"])
    assert requested
    assert all(url.startswith(scripted.base_url + "/ui") for url in requested), requested
    assert any(url.endswith("/ui/static/inspector.css") for url in requested)
    problems = [e["message"] for e in _log(browser, "browser") if e["level"] == "SEVERE"]
    assert problems == []
