"""Every offline task, solved by the scripted oracle through a real browser in a real sandbox.

Per backend (local: the ``host`` image; docker: ``orchard-test/browser``), one sandbox (no
network) runs the offline site server (``prepare_sandbox``) and
Chromium (``BrowserSession``); the tasks run in sequence. For each task: the untouched start
state scores 0, the oracle (which sees only the instruction, the URL, the marks and its own
history) finishes with ``done``, and the episode's reward is 1.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from orchard_env_client import AsyncSandbox, AsyncSandboxClient
from orchard_gui.browser import BrowserSession
from orchard_gui.tasks import (
    SITE_PORT,
    WebTask,
    episode_for,
    load_tasks,
    oracle_action,
    prepare_sandbox,
    site_state,
)
from orchard_testing import RunningServer, require_backend, selected_backends

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

OFFLINE = load_tasks("offline")
MAX_STEPS = 30
TIMINGS: dict[str, float] = {}
IMAGES = {"local": "host", "docker": "orchard-test/browser"}


@pytest.fixture(scope="module", params=[b for b in selected_backends() if b in IMAGES])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    backend = str(request.param)
    require_backend(backend)
    TIMINGS.clear()
    srv = RunningServer(backend=backend, state_dir=tmp_path_factory.mktemp("tasks-state") / "s")
    srv.start()
    yield srv
    srv.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox(service: RunningServer) -> AsyncIterator[AsyncSandbox]:
    async with AsyncSandboxClient(base_url=service.url) as client:
        box = await client.create_sandbox(IMAGES[service.backend], memory="2Gi")
        try:
            yield box
        finally:
            await box.delete()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser(sandbox: AsyncSandbox) -> AsyncIterator[BrowserSession]:
    started = time.monotonic()
    await prepare_sandbox(sandbox)
    TIMINGS["prepare_sandbox"] = time.monotonic() - started
    session = await BrowserSession.start(sandbox)
    async with session:
        yield session
    if TIMINGS:
        print(
            f"\n[{sandbox.sandbox_id}] timings (s): "
            + ", ".join(f"{k}={v:.2f}" for k, v in TIMINGS.items())
        )


SERVERS_RUNNING = """
import glob
found = 0
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        found += b"site_" b"server.py" in open(path, "rb").read()  # not this cmdline
    except OSError:
        pass
print(found)
"""


async def test_prepare_is_idempotent_and_serves(
    sandbox: AsyncSandbox, browser: BrowserSession
) -> None:
    await prepare_sandbox(sandbox)  # already running: only a health check, no second server
    count = await sandbox.exec(["python3", "-c", SERVERS_RUNNING])
    assert count.stdout.strip() == "1", count
    page = await sandbox.port_request(SITE_PORT, "GET", "miniwob/miniwob/click-button.html")
    assert page.status_code == 200 and "genProblem" in page.text
    assert (await sandbox.port_request(SITE_PORT, "GET", "sites/nope")).status_code == 404
    assert set(await site_state(sandbox)) == {"gazetteer", "garden", "shop"}


@pytest.mark.parametrize("task", OFFLINE, ids=[t.task_id for t in OFFLINE])
async def test_oracle_solves_offline_task(
    task: WebTask, sandbox: AsyncSandbox, browser: BrowserSession
) -> None:
    started = time.monotonic()
    episode = episode_for(task)
    instruction, observation = await episode.start(sandbox, browser)
    assert instruction
    assert observation.marks, f"{task.task_id}: no marks on the start page"
    # Nothing done yet: the untouched state must not score.
    assert await episode.reward(sandbox, browser, None) == 0.0

    instruction, observation = await episode.start(sandbox, browser)  # a fresh episode
    history: list[dict[str, object]] = []
    answer = None
    for _ in range(MAX_STEPS):
        action = oracle_action(task, instruction, observation.url, observation.marks, history)
        result = await browser.step(action)
        assert result.ok, f"{task.task_id}: {action} failed: {result.error}"
        history.append(action)
        observation = result.observation
        if result.done:
            answer = result.answer
            break
    else:
        pytest.fail(f"{task.task_id}: the oracle did not finish in {MAX_STEPS} steps")
    reward = await episode.reward(sandbox, browser, answer)
    TIMINGS[task.task_id] = time.monotonic() - started
    assert reward == 1.0, f"{task.task_id}: reward {reward}, info {episode.info}, history {history}"


async def test_miniwob_first_end_counts(sandbox: AsyncSandbox, browser: BrowserSession) -> None:
    """A wrong click ends the episode at raw -1 (reward 0); a right click afterwards (which
    lands on MiniWoB's START cover and begins an unseeded episode) does not change it."""
    task = load_tasks("miniwob:click-tab@14")[0]
    episode = episode_for(task)
    instruction, observation = await episode.start(sandbox, browser)
    right = oracle_action(task, instruction, observation.url, observation.marks, [])
    tabs = [m for m in observation.marks or [] if m.role == "tab"]
    wrong = next(m for m in tabs if abs(m.center[0] - right["x"]) > 5)
    await browser.step({"action": "click", "x": wrong.center[0], "y": wrong.center[1]})
    await browser.step(right)
    assert await episode.reward(sandbox, browser, None) == 0.0
    assert episode.info["result"]["raw"] == -1
    # The same seed gives the same problem again.
    again, _ = await episode_for(task).start(sandbox, browser)
    assert again == instruction
