"""The browser environment end to end: a real service, a real sandbox, real Chromium.

Per backend (local: the ``host`` image, whose Playwright is shipped in; docker: the
``orchard-test/browser`` image, which has it in /opt/venv), one sandbox serves a small test
site on its own 127.0.0.1:8000 and one ``BrowserSession`` drives Chromium through every
action kind. The sandbox has no network: page server, browser and browser server all live
on its loopback, reached from here only through the service's port forwarding.
"""

from __future__ import annotations

import asyncio
import io
import statistics
import subprocess
import tarfile
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from PIL import Image

from orchard_env_client import AsyncSandbox, AsyncSandboxClient
from orchard_env_client.errors import OrchardError
from orchard_gui.actions import ActionError
from orchard_gui.browser import (
    BrowserError,
    BrowserProvisionError,
    BrowserRequestError,
    BrowserSession,
    BrowserStartError,
    Observation,
)
from orchard_gui.browser_provision import bundle_path
from orchard_testing import RunningServer, require_backend, selected_backends

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

BROWSER_IMAGES = {"local": "host", "docker": "orchard-test/browser"}
SITE = "http://127.0.0.1:8000"

INDEX = """<!doctype html>
<html><head><title>Test page</title>
<style>body { margin: 0; font: 16px sans-serif } .abs { position: absolute }</style></head>
<body>
<button id="btn" class="abs" style="left:20px;top:20px;width:120px;height:40px"
  onclick="this.dataset.n = (+this.dataset.n || 0) + 1; this.textContent = 'Clicked ' + this.dataset.n"
  >Press me</button>
<input id="name" class="abs" style="left:20px;top:80px;width:200px;height:30px"
  placeholder="Your name">
<a id="newtab" class="abs" href="other.html" target="_blank" style="left:20px;top:130px">Open other</a>
<a id="same" class="abs" href="other.html" style="left:200px;top:130px">Go other</a>
<div id="hover" class="abs" style="left:20px;top:170px;width:100px;height:40px;background:#eee"
  onmouseenter="this.textContent = 'hovered'">hover me</div>
<div id="drag" class="abs" style="left:20px;top:230px;width:300px;height:60px;background:#ddf"></div>
<div id="long" class="abs" style="left:0;top:320px;width:100%;height:3000px;background:#f8f8f8">long</div>
<script>
  window.keys = [];
  document.addEventListener('keydown', (e) => keys.push((e.ctrlKey ? 'C-' : '') + e.key));
  window.drag = [];
  document.getElementById('drag').addEventListener('mousedown',
    (e) => drag.push(['down', e.clientX, e.clientY]));
  document.addEventListener('mouseup', (e) => drag.push(['up', e.clientX, e.clientY]));
</script>
</body></html>
"""
OTHER = "<!doctype html><title>Other</title><h1>Other page</h1>"


def _backends() -> list[str]:
    return [b for b in selected_backends() if b in BROWSER_IMAGES]


@pytest.fixture(scope="module", params=_backends())
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    backend = str(request.param)
    require_backend(backend)
    if backend == "docker":
        image = BROWSER_IMAGES["docker"]
        found = subprocess.run(["docker", "image", "inspect", image], capture_output=True)
        if found.returncode != 0:
            raise RuntimeError(f"{image} is missing: build it with infra/images/build")
    srv = RunningServer(backend=backend, state_dir=tmp_path_factory.mktemp("gui-state") / "s")
    srv.start()
    yield srv
    srv.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox(service: RunningServer) -> AsyncIterator[AsyncSandbox]:
    async with AsyncSandboxClient(base_url=service.url) as client:
        box = await client.create_sandbox(BROWSER_IMAGES[service.backend], memory="2Gi")
        try:
            await box.upload_content("/tmp/site/index.html", INDEX)
            await box.upload_content("/tmp/site/other.html", OTHER)
            await box.start(
                [
                    "python3",
                    "-m",
                    "http.server",
                    "8000",
                    "--bind",
                    "127.0.0.1",
                    "--directory",
                    "/tmp/site",
                ],
                timeout=3600,
            )
            yield box
        finally:
            await box.delete()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser(sandbox: AsyncSandbox) -> AsyncIterator[BrowserSession]:
    started = time.monotonic()
    session = await BrowserSession.start(sandbox)
    first = await _reset(session)
    print(
        f"\n[{sandbox.sandbox_id}] start {session.timings['total']:.2f} s "
        f"(provision {session.timings['provision']:.2f} s: bundle build "
        f"{session.timings['provision_bundle_build']:.2f} s, upload "
        f"{session.timings['provision_upload']:.2f} s; server {session.timings['server_start']:.2f} s), "
        f"start -> first screenshot {time.monotonic() - started:.2f} s, shipped={session.runtime.shipped}"
    )
    assert first.title == "Test page"
    async with session:
        yield session


async def _reset(browser: BrowserSession, **kw: bool) -> Observation:
    # The page server starts in the background with the sandbox: give it a moment.
    deadline = time.monotonic() + 20
    while True:
        try:
            return await browser.reset(f"{SITE}/index.html", **kw)
        except BrowserError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


def _png_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "PNG"
        return img.size


async def test_reset_observation(browser: BrowserSession) -> None:
    obs = await _reset(browser, axtree=True)
    assert obs.url == f"{SITE}/index.html"
    assert obs.title == "Test page"
    assert obs.viewport == (1280, 720)
    assert obs.tabs == [{"index": 0, "url": obs.url, "title": "Test page", "active": True}]
    assert _png_size(obs.screenshot) == (1280, 720)
    assert obs.screenshot_som is not None and _png_size(obs.screenshot_som) == (1280, 720)
    assert obs.screenshot_som != obs.screenshot  # the boxes are drawn on the copy only
    assert obs.marks is not None
    (button,) = [m for m in obs.marks if m.name == "Press me"]
    assert (button.tag, button.role) == ("button", "button")
    assert button.x <= 80 <= button.x + button.width and button.y <= 40 <= button.y + button.height
    assert button.center == pytest.approx((80, 40), abs=1)
    names = {m.name for m in obs.marks}
    assert {"Your name", "Open other", "Go other"} <= names
    assert [m.id for m in obs.marks] == list(range(1, len(obs.marks) + 1))
    assert obs.axtree is not None and 'button "Press me"' in obs.axtree
    # the overlay is gone again: the page itself is unchanged
    assert await browser.evaluate("document.getElementById('__orchard_som_overlay__')") is None
    plain = await browser.observe(marks=False)
    assert plain.marks is None and plain.screenshot_som is None and plain.axtree is None


async def test_click_changes_state(browser: BrowserSession) -> None:
    obs = await _reset(browser)
    button = next(m for m in obs.marks or [] if m.name == "Press me")
    result = await browser.step({"action": "click", "x": button.center[0], "y": button.center[1]})
    assert result.ok and result.error is None and not result.done
    assert await browser.evaluate("document.getElementById('btn').textContent") == "Clicked 1"
    result = await browser.step({"action": "click", "x": 80, "y": 40, "double": True})
    assert await browser.evaluate("document.getElementById('btn').textContent") == "Clicked 3"
    assert any(m.name == "Clicked 3" for m in result.observation.marks or [])


async def test_type_and_press_keys(browser: BrowserSession) -> None:
    await _reset(browser)
    await browser.step({"action": "click", "x": 120, "y": 95})
    result = await browser.step({"action": "type", "text": "hello world"})
    assert result.ok
    assert await browser.evaluate("document.getElementById('name').value") == "hello world"
    await browser.step({"action": "press_keys", "keys": ["Control", "a"]})
    await browser.step({"action": "type", "text": "bye", "submit": True})
    assert await browser.evaluate("document.getElementById('name').value") == "bye"
    keys = await browser.evaluate("window.keys")
    assert "C-a" in keys and keys[-1] == "Enter"
    result = await browser.step({"action": "press_keys", "keys": ["NoSuchKey"]})
    assert not result.ok and "NoSuchKey" in (result.error or "")


async def test_scroll(browser: BrowserSession) -> None:
    await _reset(browser)
    await browser.step({"action": "scroll", "direction": "down", "amount": 600})
    assert await browser.evaluate("window.scrollY") == pytest.approx(600, abs=5)
    await browser.step({"action": "scroll", "direction": "up", "x": 600, "y": 400})
    assert await browser.evaluate("window.scrollY") == pytest.approx(200, abs=5)


async def test_goto_url_and_go_back(browser: BrowserSession) -> None:
    await _reset(browser)
    result = await browser.step({"action": "go_back"})  # the fresh tab has no history
    assert not result.ok and "no previous page" in (result.error or "")
    assert result.observation.url == f"{SITE}/index.html"
    result = await browser.step({"action": "goto_url", "url": f"{SITE}/other.html"})
    assert result.ok and result.observation.title == "Other"
    result = await browser.step({"action": "go_back"})
    assert result.ok and result.observation.url == f"{SITE}/index.html"
    # a link in the same tab, then back again
    result = await browser.step({"action": "click", "x": 220, "y": 140})
    assert result.observation.title == "Other" and len(result.observation.tabs) == 1
    result = await browser.step({"action": "go_back"})
    assert result.observation.title == "Test page"
    # a navigation that fails is ok=False with the reason, and still an observation
    result = await browser.step({"action": "goto_url", "url": "http://127.0.0.1:9/"})
    assert not result.ok and "could not open http://127.0.0.1:9/" in (result.error or "")
    assert _png_size(result.observation.screenshot) == (1280, 720)


async def test_tabs(browser: BrowserSession) -> None:
    await _reset(browser)
    # target=_blank: the new tab becomes the active one
    result = await browser.step({"action": "click", "x": 40, "y": 140})
    obs = result.observation
    assert [t["active"] for t in obs.tabs] == [False, True]
    assert obs.title == "Other" and obs.tabs[1]["title"] == "Other"
    obs = (await browser.step({"action": "switch_tab", "index": 0})).observation
    assert obs.title == "Test page" and obs.tabs[0]["active"]
    obs = (await browser.step({"action": "close_tab", "index": 1})).observation
    assert len(obs.tabs) == 1 and obs.title == "Test page"
    obs = (await browser.step({"action": "new_tab", "url": f"{SITE}/other.html"})).observation
    assert len(obs.tabs) == 2 and obs.tabs[1]["active"] and obs.title == "Other"
    obs = (await browser.step({"action": "close_tab"})).observation
    assert len(obs.tabs) == 1 and obs.title == "Test page"
    result = await browser.step({"action": "switch_tab", "index": 5})
    assert not result.ok and "no tab 5" in (result.error or "")
    result = await browser.step({"action": "close_tab"})
    assert not result.ok and "only tab" in (result.error or "")
    # reset closes extra tabs
    await browser.step({"action": "new_tab"})
    assert len((await _reset(browser)).tabs) == 1


async def test_hover_and_drag(browser: BrowserSession) -> None:
    await _reset(browser)
    assert (await browser.step({"action": "hover", "x": 60, "y": 190})).ok
    assert await browser.evaluate("document.getElementById('hover').textContent") == "hovered"
    result = await browser.step({"action": "drag", "x": 40, "y": 260, "x2": 250, "y2": 270})
    assert result.ok
    assert await browser.evaluate("window.drag") == [["down", 40, 260], ["up", 250, 270]]


async def test_wait_and_done(browser: BrowserSession) -> None:
    await _reset(browser)
    started = time.monotonic()
    assert (await browser.step({"action": "wait", "seconds": 0.5})).ok
    assert time.monotonic() - started >= 0.5
    result = await browser.step({"action": "done", "answer": "forty-two"})
    assert result.done and result.ok and result.answer == "forty-two"
    result = await browser.step({"action": "done"})
    assert result.done and result.answer is None


async def test_bad_requests_are_clear_errors(browser: BrowserSession) -> None:
    with pytest.raises(ActionError, match=r"missing required argument\(s\) \['x', 'y'\]"):
        await browser.step({"action": "click"})
    # what the server itself says to a malformed action (HTTP 400), bypassing the host check
    with pytest.raises(BrowserRequestError, match="'x' must be a number"):
        await browser._post("step", {"action": {"action": "click", "x": "a", "y": 1}})
    response = await browser.sandbox.port_request(
        browser.port, "POST", "step", json={"action": {"action": "fly"}}, headers=browser._headers
    )
    assert response.status_code == 400 and "unknown action 'fly'" in response.json()["error"]


async def test_only_the_host_can_drive_the_browser_server(browser: BrowserSession) -> None:
    """A page in the browser can POST to the sandbox's 127.0.0.1 too, but not with the run's
    token header (that needs a CORS preflight) or, as a simple request, a JSON body."""
    body = {"action": {"action": "go_back"}}
    without = await browser.sandbox.port_request(browser.port, "POST", "close", json=body)
    assert without.status_code == 403 and "X-Orchard-Browser" in without.json()["error"]
    wrong = await browser.sandbox.port_request(
        browser.port, "POST", "close", json=body, headers={"X-Orchard-Browser": "guess"}
    )
    assert wrong.status_code == 403
    as_text = await browser.sandbox.port_request(
        browser.port,
        "POST",
        "close",
        content=b"{}",
        headers={**browser._headers, "Content-Type": "text/plain"},
    )
    assert as_text.status_code == 403
    preflight = await browser.sandbox.port_request(browser.port, "OPTIONS", "step")
    assert "access-control-allow-origin" not in preflight.headers
    # a page's own attempt, from inside Chromium: refused, and the browser still answers
    await _reset(browser)
    status = await browser.evaluate(
        "fetch('http://127.0.0.1:9300/close', {method: 'POST', body: '{}',"
        " headers: {'Content-Type': 'text/plain'}}).then(r => r.status, e => 'blocked')"
    )
    assert status in (403, "blocked")
    assert (await browser.observe()).url
    with pytest.raises(BrowserRequestError, match="SyntaxError"):
        await browser.evaluate("nope(")
    assert await browser.evaluate("({a: [1, 'b', null]})") == {"a": [1, "b", None]}


async def test_click_latency(browser: BrowserSession) -> None:
    await _reset(browser)
    latencies = []
    for _ in range(10):
        started = time.monotonic()
        await browser.step({"action": "click", "x": 80, "y": 40})
        latencies.append(time.monotonic() - started)
    p50 = statistics.median(latencies)
    print(f"\nclick step latency: p50 {p50 * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms")


async def test_second_session_and_close(sandbox: AsyncSandbox, browser: BrowserSession) -> None:
    # The same sandbox again, on another port: nothing is shipped twice; close() ends it.
    session = await BrowserSession.start(sandbox, port=9301, viewport=(800, 600))
    assert session.runtime.timings["bundle_build"] == 0
    obs = await session.reset(f"{SITE}/other.html")
    assert _png_size(obs.screenshot) == (800, 600)
    await session.close()
    assert (await session.job.refresh()).done
    with pytest.raises(OrchardError):
        await sandbox.port_request(9301, "GET", "health")
    with pytest.raises(BrowserError, match="closed"):
        await session.observe()
    await session.close()  # idempotent
    assert (await browser.observe(marks=False)).title  # the first session is unaffected


async def test_start_timeout_carries_stderr(sandbox: AsyncSandbox) -> None:
    # A port already taken by the page server: the browser server cannot bind and exits.
    with pytest.raises(BrowserStartError, match=r"exited \(failed, exit code 1\)") as info:
        await BrowserSession.start(sandbox, port=8000, startup_timeout=30)
    assert "cannot listen on 127.0.0.1:8000" in str(info.value)


async def test_bundle_is_cached() -> None:
    first, key, _ = bundle_path(with_node=False)
    again, key2, built = bundle_path(with_node=False)
    assert (first, key) == (again, key2) and built == 0.0
    assert "playwright-" in key and key.endswith("_nonode")
    with tarfile.open(first) as tar:
        names = set(tar.getnames())
    assert "playwright/__init__.py" in names and "playwright/driver/package/cli.js" in names
    assert "playwright/driver/node" not in names
    assert any(n.startswith("greenlet/") for n in names)


@pytest.mark.on_backends("docker")  # the local backend's host image has Chromium
@pytest.mark.parametrize("image", ["orchard-test/debian"])
async def test_image_without_chromium_is_refused(image: str, service: RunningServer) -> None:
    async with AsyncSandboxClient(base_url=service.url) as client:
        box = await client.create_sandbox(image)
        async with box:
            with pytest.raises(BrowserProvisionError, match="apt-get install chromium"):
                await BrowserSession.start(box)
