"""The Temporal Web UI, checked in a real headless browser (run it as ``scripts/webui-check``).

Starts ``durable-sse dev`` on embedded defaults (its dev server registers ``SseStreamState``)
with two streams: ``ticks`` on the demo source, which reads, and ``moved``, whose URL answers
404, which parks. Once Temporal's visibility lists them as ``reading`` and ``parked``, it
opens the Web UI's list of streams (``WorkflowType="StreamWorkflow"``) with the
``SseStreamState`` column shown, checks both rows and their states, then the list of parked
streams only, and saves a screenshot of each under ``docs/``. Any failure is one line on
stderr and exit code 1; everything it started is stopped whatever happens.

The column is switched on the way the UI itself stores a user's column choice (the
``namespace-workflow-table-columns`` entry of the browser's localStorage), set before the
page loads: clicking through the column picker would tie the check to the picker's markup.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from temporalio.client import Client

from durable_sse.contracts import STREAM_STATE_ATTRIBUTE, stream_workflow_id
from durable_sse.ops.control import PARKED_QUERY, STREAMS_QUERY, web_ui_links
from durable_sse.ops.dev import DEMO_SOURCE_PORT, free_port

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NAMESPACE = "default"
READING, PARKED = "ticks", "moved"
STREAMS_TOML = f"""\
[[stream]]
name = "{READING}"
url = "http://127.0.0.1:{DEMO_SOURCE_PORT}/streams/{READING}"
id_order = "numeric"

[[stream]]
name = "{PARKED}"
url = "http://127.0.0.1:{DEMO_SOURCE_PORT}/old-path/{PARKED}"   # the source answers 404
"""
COLUMNS = [
    {"label": "Status", "pinned": True},
    {"label": "Workflow ID", "pinned": True},
    {"label": STREAM_STATE_ATTRIBUTE, "pinned": False},
    {"label": "Type", "pinned": False},
    {"label": "Start", "pinned": False},
]
"""The list's columns, in the UI's own format for its localStorage entry."""
COLUMNS_KEY = "namespace-workflow-table-columns"
STARTUP_LIMIT = 120.0
STATE_LIMIT = 90.0
PAGE_LIMIT_MS = 30_000
VIEWPORT = {"width": 1280, "height": 560}


class CheckFailed(Exception):
    """What the one line on stderr says."""


class Stack:
    """``durable-sse dev`` in its own process group, its state under a temporary folder."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.output = state_dir / "dev.out"
        self.process: subprocess.Popen[bytes] | None = None
        self.temporal_address = ""
        self.ui = ""

    def start(self) -> None:
        config = self.state_dir / "streams.toml"
        config.write_text(STREAMS_TOML)
        temporal_port = free_port(0)
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("TEMPORAL_") and key not in ("REDIS_URL", "DATABASE_URL")
        }
        with self.output.open("wb") as output:
            self.process = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "durable-sse"),
                    "dev",
                    "--dir",
                    str(self.state_dir),
                    "--config",
                    str(config),
                    "--temporal-port",
                    str(temporal_port),
                    "--ui-port",
                    str(free_port(0)),
                    "--source-port",
                    str(free_port(0)),
                ],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + STARTUP_LIMIT
        while True:
            text = self.output.read_text(errors="replace")
            found = re.search(r"^Temporal Web UI: (http://\S+)$", text, re.MULTILINE)
            if found:
                self.ui = found.group(1)
                break
            if self.process.poll() is not None:
                raise CheckFailed(f"durable-sse dev exited with code {self.process.returncode}")
            if time.monotonic() > deadline:
                raise CheckFailed(f"durable-sse dev printed no Web UI in {STARTUP_LIMIT:.0f} s")
            time.sleep(0.2)
        # dev takes the port it is given unless it was taken meanwhile; its pid file says
        # which server it started, the summary it prints does not name the gRPC port.
        self.temporal_address = f"127.0.0.1:{temporal_port}"

    def stop(self) -> None:
        """SIGTERM to dev, which stops its worker, source and child servers in order; the
        servers it recorded in pid files are killed only if dev could not stop them."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid_file in self.state_dir.glob("*.pid"):
            with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.output.read_text(errors="replace")[-4000:]
        return ""


async def listed(client: Client, query: str) -> set[str]:
    return {execution.id async for execution in client.list_workflows(query)}


async def wait_for_states(client: Client) -> None:
    """Until Temporal's visibility has ``reading`` and ``parked`` for the two streams."""
    wanted = {READING: "reading", PARKED: "parked"}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STATE_LIMIT
    while True:
        missing = []
        for name, state in wanted.items():
            query = f'{STREAMS_QUERY} AND {STREAM_STATE_ATTRIBUTE}="{state}"'
            if stream_workflow_id(name) not in await listed(client, query):
                missing.append(f"{stream_workflow_id(name)}={state}")
        if not missing:
            return
        if loop.time() > deadline:
            raise CheckFailed(
                f"Temporal never listed {', '.join(missing)} in {STATE_LIMIT:.0f} s "
                f"({STREAM_STATE_ATTRIBUTE} not upserted?)"
            )
        await asyncio.sleep(0.5)


TABLE_SCRIPT = """
() => {
  const headers = [...document.querySelectorAll('table thead th')]
    .map((th) => th.innerText.trim());
  const rows = [...document.querySelectorAll('table tbody tr')]
    .map((tr) => [...tr.querySelectorAll('td')].map((td) => td.innerText.trim()));
  return { headers, rows };
}
"""


def state_cells(table: dict) -> dict[str, str]:
    """Workflow id → its SseStreamState cell, from the headers and rows of the page's table."""
    headers = table["headers"]
    if STREAM_STATE_ATTRIBUTE not in headers or "Workflow ID" not in headers:
        return {}
    state_at, id_at = headers.index(STREAM_STATE_ATTRIBUTE), headers.index("Workflow ID")
    return {row[id_at]: row[state_at] for row in table["rows"] if len(row) == len(headers)}


async def until_table(page, expected: dict[str, str], what: str) -> None:
    """Until the list shows exactly ``expected`` (workflow id → SseStreamState), polling the
    rendered table rather than waiting for the network to go quiet (the UI may refresh)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PAGE_LIMIT_MS / 1000
    while True:
        table = await page.evaluate(TABLE_SCRIPT)
        cells = state_cells(table)
        if cells == expected:
            return
        if loop.time() > deadline:
            if STREAM_STATE_ATTRIBUTE not in table["headers"]:
                raise CheckFailed(
                    f"the {what} list has columns {table['headers']}, "
                    f"no {STREAM_STATE_ATTRIBUTE} ({page.url})"
                )
            raise CheckFailed(
                f"the {what} list shows {STREAM_STATE_ATTRIBUTE} {cells}, not {expected} "
                f"({page.url})"
            )
        await asyncio.sleep(0.25)


async def check_ui(ui: str, chromium: str) -> None:
    from playwright.async_api import async_playwright

    links = web_ui_links(ui, NAMESPACE)
    reading_id, parked_id = stream_workflow_id(READING), stream_workflow_id(PARKED)
    columns = json.dumps({NAMESPACE: COLUMNS})
    seed = f"localStorage.setItem({json.dumps(COLUMNS_KEY)}, {json.dumps(columns)});"
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium, headless=True)
        try:
            context = await browser.new_context(viewport=VIEWPORT, color_scheme="light")
            await context.add_init_script(seed)
            page = await context.new_page()
            page.set_default_timeout(PAGE_LIMIT_MS)

            await page.goto(links["streams"])
            await until_table(page, {reading_id: "reading", parked_id: "parked"}, "streams")
            await page.screenshot(path=str(DOCS / "webui-streams.png"))

            await page.goto(links["parked streams"])
            await until_table(page, {parked_id: "parked"}, "parked-streams")
            await page.screenshot(path=str(DOCS / "webui-parked.png"))
        finally:
            await browser.close()


async def run(chromium: str, stack: Stack, phases: dict[str, float]) -> None:
    """The check; ``phases`` gets the seconds each step took (the CI cost, step by step)."""
    mark = time.monotonic()

    def done(phase: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[phase], mark = now - mark, now

    await asyncio.to_thread(stack.start)
    done("stack up")
    try:
        client = await Client.connect(stack.temporal_address, namespace=NAMESPACE)
    except Exception as error:
        raise CheckFailed(f"cannot reach the dev server at {stack.temporal_address}") from error
    await wait_for_states(client)
    done("states listed")
    await check_ui(stack.ui, chromium)
    done("browser")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the stack
    state_dir = Path(tempfile.mkdtemp(prefix="durable-sse-webui-"))
    stack = Stack(state_dir)
    phases: dict[str, float] = {}
    failure = None
    try:
        asyncio.run(run(args.chromium, stack, phases))
    except CheckFailed as error:
        failure = str(error)
    except KeyboardInterrupt:
        failure = "interrupted"
    except Exception as error:
        first = (str(error).strip().splitlines() or [""])[0]
        failure = f"{type(error).__name__}: {first}"
        (state_dir / "webui-check.log").write_text(traceback.format_exc())
    finally:
        stopping = time.monotonic()
        stack.stop()
        phases["stop"] = time.monotonic() - stopping
    if failure is not None:
        (state_dir / "dev.tail").write_text(stack.tail())
        print(f"webui-check: {failure} (logs in {state_dir})", file=sys.stderr)
        return 1
    shutil.rmtree(state_dir, ignore_errors=True)
    spent = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in phases.items())
    print(
        f"webui-check: the Web UI lists {stream_workflow_id(READING)} reading and "
        f"{stream_workflow_id(PARKED)} parked, and only the parked one under "
        f"{PARKED_QUERY}; screenshots in docs/ ({spent})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
