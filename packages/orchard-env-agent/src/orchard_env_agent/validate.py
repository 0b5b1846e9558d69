"""Small request-body validation: exact field sets and types, 422 on anything else."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import invalid

Check = Callable[[Any], bool]


def is_str(v: Any) -> bool:
    return isinstance(v, str)


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and v >= 0


def is_str_map(v: Any) -> bool:
    return isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items()
    )


def is_env(v: Any) -> bool:
    """Environment variables exec(2) can take: names not empty, without "=" or NUL."""
    return is_str_map(v) and all(
        k and "=" not in k and "\x00" not in k and "\x00" not in x for k, x in v.items()
    )


def is_command(v: Any) -> bool:
    if isinstance(v, str):
        return bool(v)
    return isinstance(v, list) and bool(v) and all(isinstance(x, str) for x in v)


_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}\.[0-9a-f]{16}")


def is_job_suffix(v: Any) -> bool:
    return isinstance(v, str) and _JOB_ID.fullmatch(v) is not None


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"body is not valid JSON: {exc}") from None


@dataclass(frozen=True)
class BodySchema:
    """A request body: its fields (name → check, description) and which are required."""

    fields: dict[str, tuple[Check, str]]
    required: frozenset[str]


def check_body(raw: bytes, schema: BodySchema) -> dict[str, Any]:
    """The body's fields, checked; null means "use the default" (dropped)."""
    fields = schema.fields
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise invalid("body must be a JSON object")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise invalid(f"unknown field(s): {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for name, value in body.items():
        if value is None:
            continue
        check, desc = fields[name]
        if not check(value):
            raise invalid(f"field {name!r} must be {desc}")
        out[name] = value
    missing = sorted(schema.required - set(out))
    if missing:
        raise invalid(f"missing required field(s): {', '.join(missing)}")
    return out


EXEC_BODY = BodySchema(
    {
        "command": (is_command, "a non-empty string or a non-empty list of strings"),
        "timeout_seconds": (is_number, "a non-negative number"),
        "cwd": (is_str, "a string"),
        "env": (is_env, "an object of strings, names without '=' or NUL"),
        "login_shell": (is_bool, "a boolean"),
        "wait": (is_bool, "a boolean"),
        "stdin": (is_str, "a string"),
        # Chosen by the orchestrator, so that it knows a job's id before the agent answers
        # and can report the job failed if the agent dies meanwhile (see jobs.JobStore.new).
        "job_id": (is_job_suffix, "a job id: <sandbox id>.<16 hex digits>"),
    },
    frozenset({"command"}),
)

PATCH_BODY = BodySchema(
    {"patch": (is_str, "a string"), "timeout_seconds": (is_number, "a non-negative number")},
    frozenset({"patch"}),
)

FILE_BODY = BodySchema(
    {"path": (is_str, "a string"), "content": (is_str, "a base64 string")},
    frozenset({"path", "content"}),
)


def is_cgroup_procs(v: Any) -> bool:
    return isinstance(v, list) and all(
        is_str(p)
        and p.startswith("/sys/fs/cgroup/")
        and p.endswith("/cgroup.procs")
        and "/../" not in p
        for p in v
    )


def is_mounts(v: Any) -> bool:
    if not isinstance(v, list):
        return False
    for m in v:
        if not isinstance(m, dict) or set(m) - {"path", "host_path", "writable"}:
            return False
        if not is_str(m.get("path")) or not is_str(m.get("host_path")):
            return False
        if "writable" in m and not is_bool(m["writable"]):
            return False
    return True


REGISTER_BODY = BodySchema(
    {
        "sandbox_id": (
            lambda v: is_str(v) and bool(v) and "." not in v,
            "a non-empty string without '.'",
        ),
        "token": (lambda v: is_str(v) and bool(v), "a non-empty string"),
        "env": (is_env, "an object of strings, names without '=' or NUL"),
        "workdir": (is_str, "a string"),
        "holder_pid": (lambda v: is_int(v) and v > 0, "a positive integer"),
        "mounts": (is_mounts, "a list of {path, host_path, writable}"),
        "cgroup_procs": (is_cgroup_procs, "a list of absolute paths to cgroup.procs files"),
        "owner": (
            lambda v: isinstance(v, list) and len(v) == 2 and all(is_int(i) and i >= 0 for i in v),
            "[uid, gid]: the host ids the sandbox's root is",
        ),
        "user": (
            lambda v: (
                isinstance(v, list) and len(v) == 2 and all(is_int(i) and 0 <= i < 65536 for i in v)
            ),
            "[uid, gid]: who commands run as inside the sandbox (its image's User)",
        ),
    },
    frozenset({"sandbox_id", "token"}),
)
