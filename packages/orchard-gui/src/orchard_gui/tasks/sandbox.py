"""Put the offline sites into a sandbox and run their server there (port 8000)."""

from __future__ import annotations

import asyncio
import time
from importlib import resources
from typing import Any

from orchard_env_client import AsyncSandbox
from orchard_env_client.errors import OrchardError
from orchard_gui.tasks.local import SITE_PORT
from orchard_gui.tasks.miniwob import miniwob_html_dir
from orchard_gui.tasks.schema import TaskError

__all__ = ["SITE_ROOT", "prepare_sandbox", "reset_site_state", "site_running", "site_state"]

SITE_ROOT = "/tmp/orchard-gui/sites"
"""Where the site server, its data and the MiniWoB++ pages go inside the sandbox."""
SERVER_TIMEOUT_S = 86_400
"""The background server job's kill timer (the service's maximum)."""


async def site_running(sandbox: AsyncSandbox, *, port: int = SITE_PORT) -> bool:
    """Whether the site server answers inside the sandbox."""
    try:
        response = await sandbox.port_request(port, "GET", "__health", timeout=10)
    except OrchardError:  # nothing listens on the port (502) and the like
        return False
    return response.status_code == 200


async def prepare_sandbox(
    sandbox: AsyncSandbox,
    *,
    python: str = "python3",
    port: int = SITE_PORT,
    startup_timeout: float = 30.0,
) -> None:
    """Make the offline sites answer on ``127.0.0.1:<port>`` inside the sandbox (idempotent).

    Uploads ``site_server.py``, ``data.json`` and the ``miniwob`` package's ``html/`` pages to
    ``SITE_ROOT`` and starts the server in the background with ``python`` (stdlib only),
    then waits until ``/__health`` answers. Does nothing if the server already answers.
    """
    if await site_running(sandbox, port=port):
        return
    site_dir = resources.files("orchard_gui.tasks").joinpath("site")
    for name in ("site_server.py", "data.json"):
        await sandbox.upload_content(f"{SITE_ROOT}/{name}", site_dir.joinpath(name).read_bytes())
    await sandbox.upload_dir(miniwob_html_dir(), f"{SITE_ROOT}/miniwob")
    job = await sandbox.start(
        [python, f"{SITE_ROOT}/site_server.py", "--port", str(port), "--root", SITE_ROOT],
        timeout=SERVER_TIMEOUT_S,
    )
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if await site_running(sandbox, port=port):
            return
        if await job.status() in ("succeeded", "failed"):
            done = await job.refresh()
            raise TaskError(
                f"the site server exited (code {done.exit_code}) before answering on port "
                f"{port}: {(done.stderr or done.stdout or '').strip()[-2000:]}"
            )
        await asyncio.sleep(0.2)
    await job.cancel()
    raise TaskError(f"the site server did not answer on port {port} within {startup_timeout} s")


async def reset_site_state(sandbox: AsyncSandbox, *, port: int = SITE_PORT) -> None:
    """Forget the sites' recorded state (form submissions, cart, orders): a new episode."""
    response = await sandbox.port_request(port, "POST", "__reset", timeout=10)
    if response.status_code != 200:
        raise TaskError(f"site server /__reset answered {response.status_code}: {response.text}")


async def site_state(sandbox: AsyncSandbox, *, port: int = SITE_PORT) -> dict[str, Any]:
    """What the sites recorded (``GET /__state``)."""
    response = await sandbox.port_request(port, "GET", "__state", timeout=10)
    if response.status_code != 200:
        raise TaskError(f"site server /__state answered {response.status_code}: {response.text}")
    state: dict[str, Any] = response.json()
    return state
