"""mini-swe-agent v2, unmodified, acting in an Orchard sandbox.

:class:`OrchardEnvironment` implements mini's ``Environment`` protocol over a sync
:class:`orchard_env_client.Sandbox`; mini's config can name it
(``environment_class: orchard_swe.harness.mini.OrchardEnvironment`` with ``base_url``,
``sandbox_id``, ``cwd``, ``timeout``, ``env``). :func:`run_mini_agent` runs mini's own
``DefaultAgent`` with mini's shipped SWE-bench config and mini's own litellm model class
pointed at an OpenAI-compatible ``base_url``, keeps the ``.traj.json`` mini writes and
converts it with :func:`orchard_swe.trajectory.from_mini_traj`.

Importing this module imports mini-swe-agent and litellm (slow: litellm alone takes
seconds). Before that it sets, unless already set, ``LITELLM_LOCAL_MODEL_COST_MAP=True``
(litellm would otherwise fetch its price list from the internet, with retries) and
``MSWEA_SILENT_STARTUP=1`` (no banner); after, ``litellm.suppress_debug_info = True``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import time
import traceback
import uuid
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

import litellm
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_from_spec
from minisweagent.exceptions import Submitted
from minisweagent.models import get_model
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel

from orchard_env_client import OrchardError, Sandbox, SandboxClient
from orchard_env_client.llm import INSTANCE_ID_HEADER, ModelConfig

from ..trajectory import Trajectory, error_status, from_mini_traj
from . import PatchError, base_commit_command, decode_patch, final_patch_command

__all__ = [
    "DEFAULT_MINI_CONFIG",
    "SUBMIT_SENTINEL",
    "OrchardEnvironment",
    "OrchardEnvironmentConfig",
    "build_mini_config",
    "compute_final_patch_sync",
    "run_mini_agent",
]

DEFAULT_MINI_CONFIG: Final = "swebench_backticks.yaml"
"""mini's shipped text-based SWE-bench config (``config/benchmarks/``): one fenced
``mswea_bash_command`` block per reply. ``"swebench.yaml"`` is its tool-calling sibling."""

SUBMIT_SENTINEL: Final = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""First output line with which a command submits (mini's convention)."""

# litellm prints a "Provider List" banner whenever it cannot price a model, i.e. on every
# call to a local model (mini's cost tracking then ignores the error, as configured).
litellm.suppress_debug_info = True

_MINI_TESTBED: Final = "/testbed"
_API_KEY_PLACEHOLDER: Final = "no-key"
_REDACTED: Final = "<redacted>"


class OrchardEnvironmentConfig(BaseModel):
    """The settings of :class:`OrchardEnvironment` (all serialisable; no credentials)."""

    base_url: str = ""
    """Orchard Env server URL; empty falls back to ``$ORCHARD_ENV_URL``."""
    sandbox_id: str = ""
    """The sandbox to act in (it must exist and be ready)."""
    cwd: str = ""
    """Working directory of commands; empty means the sandbox's default."""
    timeout: int = 60
    """Default command timeout in seconds."""
    env: dict[str, str] = {}
    """Environment variables set for every command."""


class OrchardEnvironment:
    """mini-swe-agent's ``Environment`` protocol over an Orchard sandbox (sync client).

    Either pass ``sandbox`` (an existing :class:`orchard_env_client.Sandbox` handle) or
    give ``sandbox_id`` (and ``base_url``) so the environment connects by itself; then
    ``api_key`` (else ``$ORCHARD_ENV_API_KEY``) authenticates, and :meth:`close` closes
    the client it opened. Commands run under ``bash -c`` with stderr merged into stdout,
    like mini's local and docker environments; the submit sentinel raises mini's
    ``Submitted`` exactly as they do.
    """

    def __init__(
        self,
        *,
        sandbox: Sandbox | None = None,
        api_key: str | None = None,
        config_class: type[OrchardEnvironmentConfig] = OrchardEnvironmentConfig,
        **kwargs: Any,
    ) -> None:
        self.config = config_class(**kwargs)
        self._client: SandboxClient | None = None
        self._uname: dict[str, str] | None = None
        if sandbox is None:
            if not self.config.sandbox_id:
                raise ValueError("OrchardEnvironment needs a sandbox or a sandbox_id")
            client = SandboxClient(
                self.config.base_url or None, api_key=api_key, auto_cleanup=False
            )
            try:
                sandbox = client.get_sandbox(self.config.sandbox_id)
            except BaseException:
                client.close()
                raise
            self._client = client
            self._finalizer = weakref.finalize(self, client.close)
        elif not self.config.sandbox_id:
            self.config.sandbox_id = sandbox.sandbox_id
        self.sandbox: Sandbox = sandbox

    def close(self) -> None:
        """Close the client this environment opened (a passed-in sandbox is left alone)."""
        if self._client is not None:
            self._finalizer()
            self._client = None

    def __enter__(self) -> OrchardEnvironment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def execute(
        self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None
    ) -> dict[str, Any]:
        """Run ``action["command"]``; returns ``output``, ``returncode``, ``exception_info``.

        A timeout or a failure to run gives ``returncode`` -1 and an ``exception_info``
        (as in mini's own environments); raises ``Submitted`` when the output's first line
        is the submit sentinel and the command succeeded.
        """
        command = str(action.get("command", ""))
        workdir = cwd or self.config.cwd or None
        limit = timeout or self.config.timeout
        try:
            job = self.sandbox.exec(
                "exec 2>&1\n" + command, timeout=limit, cwd=workdir, env=self.config.env or None
            )
            text = job.stdout + job.stderr
            extra: dict[str, Any] = {}
            if job.stdout_truncated or job.stderr_truncated:
                extra["output_truncated"] = True
            if job.timed_out:
                message = f"Command '{command}' timed out after {limit} seconds"
                output: dict[str, Any] = {
                    "output": text,
                    "returncode": -1,
                    "exception_info": f"An error occurred while executing the command: {message}",
                    "extra": {"exception_type": "TimeoutExpired", "exception": message, **extra},
                }
            elif job.exit_code is None:
                message = job.error or f"the job ended {job.status} without an exit code"
                output = {
                    "output": text,
                    "returncode": -1,
                    "exception_info": f"An error occurred while executing the command: {message}",
                    "extra": {"exception_type": "SandboxJobError", "exception": message, **extra},
                }
            else:
                output = {"output": text, "returncode": job.exit_code, "exception_info": ""}
                if extra:
                    output["extra"] = extra
        except Exception as exc:  # a lost sandbox must reach the model as an observation
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {exc}",
                "extra": {"exception_type": type(exc).__name__, "exception": str(exc)},
            }
        self._check_finished(output)
        return output

    def _check_finished(self, output: Mapping[str, Any]) -> None:
        lines = str(output.get("output", "")).lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_SENTINEL and output.get("returncode") == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def _uname_vars(self) -> dict[str, str]:
        """``system``/``node``/``release``/``version``/``machine`` of the sandbox (cached)."""
        if self._uname is None:
            self._uname = {}
            try:
                job = self.sandbox.exec(
                    "uname -s; uname -n; uname -r; uname -v; uname -m", timeout=30
                )
                values = job.stdout.splitlines()
                if job.exit_code == 0 and len(values) == 5:
                    keys = ("system", "node", "release", "version", "machine")
                    self._uname = dict(zip(keys, values, strict=True))
            except OrchardError:
                pass
        return self._uname

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config's fields, the sandbox's ``uname`` fields, then ``kwargs``."""
        merged: dict[str, Any] = recursive_merge(
            self.config.model_dump(), self._uname_vars(), kwargs
        )
        return merged

    def serialize(self) -> dict[str, Any]:
        """The environment's part of mini's trajectory file."""
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                }
            }
        }


# ---------------------------------------------------------------- running mini


def compute_final_patch_sync(
    sandbox: Sandbox, repo_dir: str, base_commit: str | None = None, timeout: float = 300
) -> str:
    """Like :func:`orchard_swe.harness.tools.compute_final_patch`, for a sync sandbox."""
    out = f"/tmp/.orchard-patch-{uuid.uuid4().hex}.diff"
    try:
        job = sandbox.exec(final_patch_command(repo_dir, out, base_commit), timeout=timeout)
        if job.exit_code != 0:
            detail = (job.stderr or job.stdout or job.error or "").strip()
            raise PatchError(f"git diff in {repo_dir} failed (exit {job.exit_code}): {detail}")
        return decode_patch(sandbox.download_content(out))
    finally:
        with contextlib.suppress(OrchardError):
            sandbox.exec(["rm", "-f", out], timeout=60)


def _uses_text_actions(config: Mapping[str, Any]) -> bool:
    model_cfg = config.get("model") or {}
    agent_cfg = config.get("agent") or {}
    templates = f"{agent_cfg.get('system_template', '')}{agent_cfg.get('instance_template', '')}"
    return "action_regex" in model_cfg or "mswea_bash_command" in templates


def build_mini_config(
    *,
    model: ModelConfig,
    instance_id: str,
    repo_dir: str = "/workspace/repo",
    step_limit: int = 30,
    cost_limit: float = 3.0,
    time_limit_s: float = 0,
    mini_config: str | Path | Mapping[str, Any] = DEFAULT_MINI_CONFIG,
    max_consecutive_format_errors: int | None = None,
    command_timeout: int | None = None,
    output_path: Path | None = None,
    litellm_model_registry: Path | None = None,
) -> dict[str, Any]:
    """mini's config for one run: its shipped SWE-bench config, pointed at our model.

    From mini's config (a name or path mini's ``get_config_from_spec`` resolves, or a dict)
    come the agent templates, the environment's ``env``/``timeout`` and the model's
    observation / format-error templates (and ``action_regex``). Changed: the limits, the
    trajectory path, ``/testbed`` in the templates (mini's SWE-bench images keep the repo
    there) replaced by ``repo_dir``, the environment (``cwd=repo_dir``; docker-only keys
    dropped), and the model: ``openai/<model>`` on ``model.base_url`` via mini's
    ``litellm_textbased`` class for text-based configs or ``litellm`` for tool-calling
    ones, ``cost_tracking: ignore_errors``. The API key is not put in the config (see
    :func:`run_mini_agent`).
    """
    if isinstance(mini_config, Mapping):
        base: dict[str, Any] = copy.deepcopy(dict(mini_config))
    else:
        base = get_config_from_spec(mini_config)
    text_actions = _uses_text_actions(base)

    agent_cfg = dict(base.get("agent") or {})
    if repo_dir != _MINI_TESTBED:
        for key in ("system_template", "instance_template"):
            if isinstance(agent_cfg.get(key), str):
                agent_cfg[key] = agent_cfg[key].replace(_MINI_TESTBED, repo_dir)
    agent_cfg["step_limit"] = step_limit
    agent_cfg["cost_limit"] = cost_limit
    if time_limit_s:
        agent_cfg["wall_time_limit_seconds"] = int(time_limit_s)
    if max_consecutive_format_errors is not None:
        agent_cfg["max_consecutive_format_errors"] = max_consecutive_format_errors
    agent_cfg["output_path"] = output_path

    env_src = base.get("environment") or {}
    env_cfg: dict[str, Any] = {
        "cwd": repo_dir,
        "timeout": int(command_timeout or env_src.get("timeout") or 60),
        "env": {str(k): str(v) for k, v in (env_src.get("env") or {}).items()},
    }

    model_cfg = dict(base.get("model") or {})
    model_kwargs = dict(model_cfg.get("model_kwargs") or {})
    if text_actions:
        model_kwargs.pop("parallel_tool_calls", None)
    model_kwargs.update(
        api_base=model.base_url,
        temperature=model.temperature,
        timeout=model.timeout_s,
        extra_headers={INSTANCE_ID_HEADER: instance_id},
    )
    if model.max_tokens is not None:
        model_kwargs["max_tokens"] = model.max_tokens
    if model.extra_body:
        model_kwargs["extra_body"] = dict(model.extra_body)
    model_cfg.update(
        model_name=f"openai/{model.model}",
        model_class="litellm_textbased" if text_actions else "litellm",
        model_kwargs=model_kwargs,
        cost_tracking="ignore_errors",
    )
    if litellm_model_registry is not None:
        model_cfg["litellm_model_registry"] = str(litellm_model_registry)
    return {"agent": agent_cfg, "environment": env_cfg, "model": model_cfg}


def _write_price_registry(path: Path, model: ModelConfig) -> Path:
    """A litellm model registry giving ``openai/<model>`` our prices (per token)."""
    entry = {
        "input_cost_per_token": model.price_per_1k_prompt / 1000.0,
        "output_cost_per_token": model.price_per_1k_completion / 1000.0,
        "litellm_provider": "openai",
        "mode": "chat",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({f"openai/{model.model}": entry, model.model: entry}, indent=2))
    return path


def _redact(value: Any, secret: str) -> Any:
    if isinstance(value, str):
        return value.replace(secret, _REDACTED)
    if isinstance(value, list):
        return [_redact(v, secret) for v in value]
    if isinstance(value, dict):
        return {k: _redact(v, secret) for k, v in value.items()}
    return value


def _safe_name(instance_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", instance_id) or "instance"


def run_mini_agent(
    sandbox: Sandbox,
    problem_statement: str,
    *,
    model: ModelConfig,
    instance_id: str,
    traj_dir: Path,
    repo_dir: str = "/workspace/repo",
    step_limit: int = 30,
    cost_limit: float = 3.0,
    attempt: int = 0,
    mini_config: str | Path | Mapping[str, Any] = DEFAULT_MINI_CONFIG,
    time_limit_s: float = 0,
    max_consecutive_format_errors: int | None = None,
    command_timeout: int | None = None,
) -> Trajectory:
    """Solve one task with mini-swe-agent's own ``DefaultAgent`` (blocking; use a thread).

    The config is :func:`build_mini_config`'s. mini writes its trajectory to
    ``traj_dir/<instance_id>.attempt<N>.traj.json`` (after every step, as it always
    does); it is converted with :func:`~orchard_swe.trajectory.from_mini_traj`, and the
    returned ``final_patch`` is the sandbox diff (``git add -A``, index vs the starting
    commit), like the tools harness; mini's own submission stays in
    ``metadata.extra["mini"]["submission"]``. mini's ``step_limit`` counts model calls,
    and mini ends an episode after ``max_consecutive_format_errors`` (mini's default: 3)
    unparseable replies in a row (``exit_status`` ``format_error``).

    API key: with ``api_key_env="OPENAI_API_KEY"`` litellm reads the key from the
    environment itself and it never reaches a file; a key from another variable is passed
    in mini's ``model_kwargs`` and redacted from the trajectory file after the run (a
    crash mid-run can leave it there). Without a key a placeholder is sent.
    """
    traj_dir = Path(traj_dir)
    traj_dir.mkdir(parents=True, exist_ok=True)
    traj_path = traj_dir / f"{_safe_name(instance_id)}.attempt{attempt}.traj.json"
    traj_path.unlink(missing_ok=True)
    registry = None
    if model.price_per_1k_prompt or model.price_per_1k_completion:
        registry = _write_price_registry(traj_dir / "litellm_model_registry.json", model)
    config = build_mini_config(
        model=model,
        instance_id=instance_id,
        repo_dir=repo_dir,
        step_limit=step_limit,
        cost_limit=cost_limit,
        time_limit_s=time_limit_s,
        mini_config=mini_config,
        max_consecutive_format_errors=max_consecutive_format_errors,
        command_timeout=command_timeout,
        output_path=traj_path,
        litellm_model_registry=registry,
    )
    key = model.api_key()
    secret: str | None = None
    if key is None:
        config["model"]["model_kwargs"]["api_key"] = _API_KEY_PLACEHOLDER
    elif model.api_key_env != "OPENAI_API_KEY":
        config["model"]["model_kwargs"]["api_key"] = secret = key

    started_at = time.time()
    t0 = time.monotonic()
    extra: dict[str, Any] = {"repo_dir": repo_dir, "mini_traj_path": str(traj_path)}
    base_commit: str | None = None
    run_info: dict[str, Any] = {}
    env = OrchardEnvironment(sandbox=sandbox, **config["environment"])
    mini_model = get_model(config=config["model"])
    agent = DefaultAgent(mini_model, env, **config["agent"])
    try:
        base_commit = sandbox.exec(base_commit_command(repo_dir), timeout=60).stdout.strip() or None
        extra["base_commit"] = base_commit
        result = agent.run(problem_statement)
        run_info = {
            "exit_status": result.get("exit_status", ""),
            "submission": result.get("submission", ""),
        }
    except Exception as exc:
        run_info = {
            "exit_status": type(exc).__name__,
            "submission": "",
            "exception_str": str(exc),
            "traceback": traceback.format_exc(),
        }
    finally:
        agent.save(traj_path, {"info": run_info, "instance_id": instance_id})
        if secret:
            data = json.loads(traj_path.read_text(encoding="utf-8"))
            traj_path.write_text(json.dumps(_redact(data, secret), indent=2), encoding="utf-8")

    traj = from_mini_traj(traj_path, instance_id=instance_id, attempt=attempt, model=model.model)
    meta = traj.metadata
    try:
        meta.final_output = compute_final_patch_sync(sandbox, repo_dir, base_commit)
    except (PatchError, OrchardError) as exc:
        meta.final_output = ""
        extra["patch_error"] = str(exc)
        meta.error = meta.error or f"final patch: {exc}"
    if "\ufffd" in meta.final_output:
        extra["patch_lossy_decode"] = True
    if meta.cost == 0.0 and (meta.prompt_tokens or meta.completion_tokens):
        meta.cost = model.cost(meta.prompt_tokens, meta.completion_tokens)
    meta.started_at = started_at
    meta.finished_at = time.time()
    meta.duration_s = time.monotonic() - t0
    if not meta.exit_status:
        meta.exit_status = error_status("mini ended without an exit status")
    meta.extra.update(extra)
    meta.extra["mini_config"] = (
        str(mini_config) if not isinstance(mini_config, Mapping) else "(dict)"
    )
    return traj
