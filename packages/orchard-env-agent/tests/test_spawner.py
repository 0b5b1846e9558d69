"""The per-sandbox command spawner (``orchard-enter --serve``) with a real bubblewrap holder:
started at registration, one spawner serves every command; a dead spawner fails its commands clearly and is
replaced; oversized requests fall back; a kill is never lost (not to a child that has no
session yet, nor to a full socket); it goes with its sandbox and with the agent."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from agent_harness import Agent, boxed_sandbox, start_agent, start_holder, stop_agent

from orchard_env_agent import enter
from orchard_env_agent.spawner import RemoteCommand, Spawner

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not shutil.which("bwrap") or os.geteuid() != 0, reason="needs bwrap and root"
    ),
]


def spawners_of(agent_pid: int) -> list[int]:
    """The pids of the spawner processes the agent ``agent_pid`` started."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == agent_pid and b"--serve" in argv:
            found.append(int(entry))
    return found


def wait_until(predicate: object, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_one_spawner_runs_every_command_of_a_sandbox(boxed: Agent) -> None:
    # started when the sandbox is registered, so the first command finds it ready
    assert wait_until(lambda: len(spawners_of(boxed.proc.pid)) == 1)
    first = boxed.exec("echo out; echo err >&2; exit 3")
    assert (first["stdout"], first["stderr"], first["exit_code"]) == ("out\n", "err\n", 3)
    assert first["usage"]["max_rss_bytes"] > 0
    spawners = spawners_of(boxed.proc.pid)
    assert len(spawners) == 1
    assert boxed.exec("cat", stdin="fed through a pipe")["stdout"] == "fed through a pipe"
    assert boxed.exec(["no-such-binary"])["exit_code"] == 127
    killed = boxed.exec("kill -9 $$")
    assert killed["status"] == "failed" and killed["error"] == "killed by signal 9"
    assert int(boxed.exec("echo $$")["stdout"]) < 100  # inside the sandbox's pid namespace
    assert spawners_of(boxed.proc.pid) == spawners


def test_a_timeout_kills_the_command_group_the_spawner_started(boxed: Agent) -> None:
    started = time.monotonic()
    job = boxed.exec("sleep 31 & sleep 32", timeout_seconds=0.5)
    assert job["timed_out"] is True and job["exit_code"] is None
    assert time.monotonic() - started < 10
    left = boxed.exec("pgrep -c -f 'sleep 3[12]' || true")["stdout"].strip()
    assert left in ("", "0")  # both, the background one too


def test_a_killed_spawner_fails_its_commands_clearly_and_is_replaced(boxed: Agent) -> None:
    h = boxed.headers()
    running = boxed.client.post("/exec", json={"command": "sleep 30"}, headers=h).json()
    assert wait_until(lambda: len(spawners_of(boxed.proc.pid)) == 1)
    (spawner,) = spawners_of(boxed.proc.pid)
    os.kill(spawner, signal.SIGKILL)
    job = boxed.client.get(
        f"/jobs/{running['job_id']}/wait", params={"timeout": 10}, headers=h
    ).json()
    assert job["status"] == "failed"
    assert "spawner exited" in job["error"] and "exit status is lost" in job["error"]
    again = boxed.exec("echo again")
    assert again["stdout"] == "again\n"
    assert wait_until(lambda: spawners_of(boxed.proc.pid) not in ([], [spawner]))


def test_a_request_too_big_for_the_spawner_runs_the_one_shot_way(boxed: Agent) -> None:
    chunk = "x" * 100_000  # one argument's limit is 128 KiB; three exceed the 256 KiB request
    job = boxed.exec(["sh", "-c", 'echo "$# ${#1}"', "sh", chunk, chunk, chunk])
    assert job["stdout"] == "3 100000\n", job
    assert boxed.exec("echo small")["stdout"] == "small\n"


def test_the_spawner_goes_with_its_sandbox(multi: Agent, tmp_path: Path) -> None:
    with boxed_sandbox(multi, tmp_path, "short-lived") as agent:
        assert agent.exec("true")["exit_code"] == 0
        assert len(spawners_of(multi.proc.pid)) == 1
    assert wait_until(lambda: spawners_of(multi.proc.pid) == [])


def test_the_spawner_goes_with_the_agent(tmp_path: Path) -> None:
    own = start_agent(tmp_path / "agent", multi=True)
    try:
        with boxed_sandbox(own, tmp_path) as agent:
            assert agent.exec("true")["exit_code"] == 0
            (spawner,) = spawners_of(own.proc.pid)
            own.proc.kill()
            own.proc.wait()
            assert wait_until(lambda: not os.path.exists(f"/proc/{spawner}"))
    finally:
        if own.proc.poll() is None:
            stop_agent(own)
        else:
            own.client.close()


@pytest.fixture
async def own_spawner(tmp_path: Path) -> AsyncIterator[Spawner]:
    """A spawner of this test's own (in this process) in a bubblewrap holder."""
    ws = tmp_path / "ws"
    ws.mkdir()
    holder, holder_pid = start_holder(ws)
    helper = enter.helper()
    assert helper is not None
    ctx = SimpleNamespace(holder_pid=holder_pid, cgroup_procs=[], user=None)
    try:
        spawner = Spawner.start(helper, ctx)  # type: ignore[arg-type]
        yield spawner
        spawner.close()
    finally:
        os.kill(holder_pid, signal.SIGKILL)  # the namespace's pid 1: all inside go with it
        holder.kill()
        holder.wait()


def spawn(spawner: Spawner, *argv: str) -> RemoteCommand | None:
    return spawner.spawn(argv, cwd="/", env={}, stdin=None, on_stdout=len, on_stderr=len)


async def test_a_kill_sent_with_the_spawn_request_still_kills_the_command(
    own_spawner: Spawner,
) -> None:
    # The kill can reach the spawner before the forked child has made its own session
    # (a cancel right after the start): it must still end the command, every time.
    for _ in range(40):
        command = spawn(own_spawner, "sleep", "30")
        assert command is not None
        command.kill_group()
        info = await asyncio.wait_for(command.exited, 10)
        assert info.signal == signal.SIGKILL, info


async def test_a_kill_that_finds_the_socket_full_is_sent_once_it_drains(
    own_spawner: Spawner,
) -> None:
    sleeper = spawn(own_spawner, "sleep", "30")
    assert sleeper is not None
    await asyncio.sleep(0.2)  # started, so the spawner's pid is the only one to stop
    os.kill(own_spawner.pid, signal.SIGSTOP)
    try:
        fillers = []
        while (filler := spawn(own_spawner, "true")) is not None:
            fillers.append(filler)
        assert fillers  # the socket is full now: the kill has to wait
        sleeper.kill_group()
    finally:
        os.kill(own_spawner.pid, signal.SIGCONT)
    info = await asyncio.wait_for(sleeper.exited, 10)
    assert info.signal == signal.SIGKILL, info
    done = await asyncio.wait_for(asyncio.gather(*(f.exited for f in fillers)), 30)
    assert {d.returncode for d in done} == {0}
