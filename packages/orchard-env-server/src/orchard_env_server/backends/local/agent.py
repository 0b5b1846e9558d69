"""The one shared agent process that serves every local sandbox (multi mode)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from orchard_env_agent.build import build_id

from ..base import BackendError
from .processes import is_alive, kill_and_wait, start_time

log = logging.getLogger("orchard_env_server")


class LocalAgent:
    """Starts, adopts and talks to the multi-sandbox agent; its admin API lives here."""

    def __init__(self, state_dir: Path, max_output_bytes: int, max_upload_bytes: int) -> None:
        self._state_file = state_dir / "agent.json"
        self._log_file = state_dir / "agent.log"
        self._state_dir = state_dir
        self._max_output = max_output_bytes
        self._max_upload = max_upload_bytes
        self.pid: int | None = None
        self._started: int | None = None
        self.base_url = ""
        self._admin_token = ""
        self.stale: str | None = None  # why the adopted agent is not of the installed code
        self._http: aiohttp.ClientSession | None = None

    async def ensure(self) -> bool:
        """Adopt a live agent from an earlier run, or start one. True when newly started."""
        self.stale = None
        if self.pid is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)  # reap a dead agent we started ourselves
        if await self._adopt():
            return False
        await self._spawn()
        return True

    async def registered_ids(self) -> set[str]:
        listing = await self.admin("GET", "/_admin/sandboxes")
        return {item["sandbox_id"] for item in listing["sandboxes"]}

    def alive(self) -> bool:
        return is_alive(self.pid, self._started)

    async def _adopt(self) -> bool:
        try:
            state = json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return False
        pid, started = state.get("pid"), state.get("start_time")
        if not is_alive(pid, started):
            return False
        self.pid, self._started = pid, started
        self.base_url, self._admin_token = state["base_url"], state["admin_token"]
        try:
            await self.admin("GET", "/_admin/sandboxes")
            health = await self.admin("GET", "/health")
        except BackendError:
            return False
        running, theirs = health.get("build"), build_id()
        if running != theirs:
            # Started from code since replaced (an upgrade): replace it unless that would
            # kill commands still running in it. Sandboxes live on in their holders either
            # way; a fresh agent has them registered again.
            busy = int(health.get("jobs_running") or 0)
            if busy == 0:
                log.warning(
                    "replacing local agent pid %s: it runs older code (build %s, installed %s)",
                    pid,
                    running,
                    theirs,
                )
                await self.stop()
                return False
            self.stale = (
                f"the local agent (pid {pid}) runs code from before an upgrade (build "
                f"{running}, installed {theirs}); kept while commands run in it ({busy} now): "
                "restart the orchestrator once they are done to replace it"
            )
            log.warning("%s", self.stale)
        log.info("adopted local agent pid %s at %s", pid, self.base_url)
        return True

    async def _spawn(self) -> None:
        token = secrets.token_urlsafe(32)
        token_file = self._state_dir / "agent.admin-token"
        port_file = self._state_dir / "agent.port"
        port_file.unlink(missing_ok=True)
        token_file.write_text(token)
        token_file.chmod(0o600)
        argv = [
            sys.executable,
            "-m",
            "orchard_env_agent",
            "--multi",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--admin-token-file",
            str(token_file),
            "--max-output-bytes",
            str(self._max_output),
            "--max-upload-bytes",
            str(self._max_upload),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_ENV_")}
        with open(self._log_file, "ab") as logf:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,
                env=env,
            )
        proc.returncode = 0  # reaped by pid in stop(); see bubblewrap.start_holder
        started = start_time(proc.pid)
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists():
                if os.waitpid(proc.pid, os.WNOHANG) != (0, 0) or time.monotonic() > deadline:
                    tail = self._log_file.read_text(errors="replace")[-2000:]
                    raise BackendError(f"local agent did not start: {tail.strip()}")
                await asyncio.sleep(0.01)
        except BaseException:
            # Not yet recorded as ours, so nothing else would ever stop it: a start that
            # timed out, or one cancelled by a shutdown while a dead agent was replaced.
            kill_and_wait(proc.pid, started)
            raise
        self.pid, self._started = proc.pid, started
        self.base_url = f"http://127.0.0.1:{int(port_file.read_text())}"
        self._admin_token = token
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "pid": self.pid,
                    "start_time": self._started,
                    "base_url": self.base_url,
                    "admin_token": token,
                }
            )
        )
        tmp.chmod(0o600)
        tmp.replace(self._state_file)
        log.info("started local agent pid %s at %s", self.pid, self.base_url)

    def _session(self) -> aiohttp.ClientSession:
        # aiohttp, like the command hop (agent_client.py): a burst of creates registers
        # hundreds of sandboxes at once, and httpx's pool grew quadratically in the queue
        # (docs/performance.md, round two). Requests queue for a connection without limit;
        # connecting and each read have 30 s.
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=32, use_dns_cache=False),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=30),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._http

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {self._admin_token}"}
        try:
            async with self._session().request(
                method, self.base_url + path, json=body, headers=headers
            ) as response:
                data = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackendError(f"local agent unreachable: {exc!r}") from exc
        if response.status == 404 and method == "DELETE":
            return None
        if response.status >= 400:
            text = data[:500].decode(errors="replace")
            raise BackendError(f"local agent refused {method} {path}: {text}")
        return json.loads(data) if data else None

    async def stop(self) -> None:
        """Stop the agent process (its sandboxes deleted first, or registered again with
        the next agent: their holders do not depend on it)."""
        if self.pid is not None:
            await asyncio.to_thread(kill_and_wait, self.pid, self._started)
        for name in ("agent.json", "agent.admin-token", "agent.port"):
            (self._state_dir / name).unlink(missing_ok=True)

    async def aclose(self) -> None:
        if self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.close()
