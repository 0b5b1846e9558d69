"""Commands: results, environment, timeouts, cancel, streaming and background jobs."""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest

from orchard_env_client import AsyncSandboxClient, JobNotFound, SandboxClient
from orchard_testing import agent_pid

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(server):
    with SandboxClient(base_url=server.url) as c:
        yield c


@pytest.fixture(scope="module")
def sandbox(client, image):
    sbx = client.create_sandbox(image, env={"SANDBOX_VAR": "from-create"})
    yield sbx
    sbx.delete()


def test_a_command_reports_exit_code_and_both_streams(sandbox):
    job = sandbox.exec("echo out; echo err >&2; exit 3")
    assert (job.exit_code, job.stdout, job.stderr) == (3, "out\n", "err\n")
    assert job.status == "failed" and not job.succeeded and not job.timed_out


def test_a_successful_command_succeeds(sandbox):
    job = sandbox.exec("true")
    assert job.succeeded and job.exit_code == 0 and job.status == "succeeded"


def test_an_argv_list_runs_without_a_shell(sandbox):
    job = sandbox.exec(["printf", "%s|", "a b", "$HOME"])
    assert job.stdout == "a b|$HOME|"


def test_cwd_and_env_apply_per_call_over_sandbox_env(sandbox):
    sandbox.exec("mkdir -p /workspace/sub")
    job = sandbox.exec(
        "pwd; echo $SANDBOX_VAR $CALL_VAR", cwd="/workspace/sub", env={"CALL_VAR": "per-call"}
    )
    assert job.stdout == "/workspace/sub\nfrom-create per-call\n"


def test_stdin_is_fed_then_closed(sandbox):
    job = sandbox.exec("wc -c; cat", stdin="hello")
    assert job.stdout.startswith("5")


def test_unicode_round_trips_and_invalid_utf8_is_replaced(sandbox):
    job = sandbox.exec("echo 'héllo ✓ 日本'; printf '\\xff\\xfe\\x00tail'")
    assert "héllo ✓ 日本" in job.stdout
    assert "tail" in job.stdout and "\ufffd" in job.stdout


def test_timeout_kills_the_whole_group_and_keeps_partial_output(sandbox):
    started = time.monotonic()
    job = sandbox.exec("echo before; (sleep 30; echo child) & sleep 30", timeout=1)
    assert time.monotonic() - started < 10
    assert job.timed_out and job.status == "failed" and job.exit_code is None
    assert job.stdout == "before\n"
    assert "sleep 30" not in sandbox.exec("ps -eo args").stdout


def test_output_beyond_the_cap_keeps_head_and_tail(sandbox):
    job = sandbox.exec("echo HEAD; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo TAIL")
    assert job.stdout_truncated and not job.stderr_truncated
    assert job.stdout.startswith("HEAD") and job.stdout.rstrip().endswith("TAIL")
    assert len(job.stdout) < 1_200_000


def test_a_hundred_megabytes_of_output_keep_head_and_tail_in_bounded_memory(server, sandbox):
    processes = {
        "orchestrator": psutil.Process(server.proc.pid),
        "agent": psutil.Process(agent_pid(server, sandbox.sandbox_id)),
    }
    before = {name: p.memory_info().rss for name, p in processes.items()}
    job = sandbox.exec(
        "echo FIRST; head -c 100000000 /dev/zero | tr '\\0' y; echo; echo LAST; "
        "head -c 100000000 /dev/zero | tr '\\0' e >&2",
        timeout=120,
    )
    assert job.exit_code == 0 and job.stdout_truncated and job.stderr_truncated
    assert job.stdout.startswith("FIRST\nyyy") and job.stdout.endswith("yyy\nLAST\n")
    assert len(job.stdout) < 1_200_000 and len(job.stderr) < 1_200_000
    grown = {name: p.memory_info().rss - before[name] for name, p in processes.items()}
    assert all(g < 64 << 20 for g in grown.values()), grown  # 200 MB went through


def test_usage_is_measured(sandbox):
    job = sandbox.exec("python3 -c 'x = bytearray(30_000_000); sum(range(2_000_000))'")
    assert job.usage is not None
    assert job.usage.max_rss_bytes and job.usage.max_rss_bytes > 25_000_000
    assert job.usage.cpu_user_s is not None


def test_a_background_job_can_be_waited_for(sandbox):
    job = sandbox.start("sleep 0.3; echo done")
    assert job.status() in ("queued", "running")
    result = job.wait(timeout=30)
    assert result.stdout == "done\n" and result.succeeded


def test_cancel_kills_a_running_job(sandbox):
    job = sandbox.start("echo started; sleep 60")
    time.sleep(0.3)
    job.cancel()
    result = job.wait(timeout=10)
    assert result.status == "failed" and result.exit_code is None
    assert result.stdout == "started\n"


def test_streaming_delivers_output_in_order_then_exit(sandbox):
    events = list(sandbox.exec_stream("for i in 1 2 3; do echo $i; sleep 0.05; done; echo e >&2"))
    out = "".join(e.data for e in events if e.type == "stdout")
    assert out == "1\n2\n3\n"
    assert events[-1].type == "exit" and events[-1].job.exit_code == 0
    assert any(e.type == "stderr" for e in events)


def test_concurrent_commands_run_in_parallel(sandbox):
    jobs = [sandbox.start("sleep 1") for _ in range(5)]
    started = time.monotonic()
    for j in jobs:
        assert j.wait(timeout=30).succeeded
    assert time.monotonic() - started < 4


async def test_the_async_client_runs_the_same_commands(server, image):
    async with AsyncSandboxClient(base_url=server.url) as client:
        sandbox = await client.create_sandbox(image)
        job = await sandbox.exec("echo async; exit 4")
        assert (job.stdout, job.exit_code) == ("async\n", 4)
        chunks = [e async for e in sandbox.exec_stream("echo streamed")]
        assert chunks[-1].type == "exit"
        await sandbox.delete()


async def test_a_background_job_whose_result_the_agent_dropped_answers_job_evicted(server, image):
    """Never asked about until its agent kept newer results instead: a 404 that says so,
    not a job `lost` to an agent restart that never happened."""
    from orchard_env_agent.jobs import MAX_FINISHED

    async with AsyncSandboxClient(base_url=server.url) as client:
        sandbox = await client.create_sandbox(image)
        try:
            forgotten = await sandbox.start(["true"])
            await asyncio.sleep(0.5)  # it finishes before the jobs that push it out
            lanes = 8
            for _ in range(MAX_FINISHED // lanes + 1):
                await asyncio.gather(*(sandbox.exec(["true"]) for _ in range(lanes)))
            with pytest.raises(JobNotFound) as raised:
                await forgotten.refresh()
            assert raised.value.code == "job_evicted", raised.value
            assert "finished" in str(raised.value)
        finally:
            await sandbox.delete()
