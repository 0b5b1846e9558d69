"""Request and response bodies of the public REST contract (``shared/API.md``).

The client SDK defines the same models with attrs; ``tests/test_schema_parity.py``
compares the two field by field so they cannot drift apart.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

SandboxId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9-]{1,40}$")]
SandboxStatus = Literal["pending", "ready", "failed", "terminated"]
JobStatus = Literal["queued", "running", "succeeded", "failed"]


class _Strict(BaseModel):
    """Unknown fields are rejected (422), never silently ignored; nor is a value of the
    wrong JSON type coerced (``0`` or ``"no"`` is not a boolean, ``"5"`` not a number)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class CreateSandboxRequest(_Strict):
    image: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    block_network: bool | None = True
    sandbox_id: SandboxId | None = None
    cpu: Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+)?m?$")] | None = None
    memory: (
        Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?|[kmgtpe])?$")]
        | None
    ) = None
    timeout: Annotated[float, Field(gt=0, le=86400)] | None = 3600
    env: dict[str, str] | None = None
    workdir: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = None
    labels: dict[str, str] | None = None
    ttl_seconds: Annotated[float, Field(gt=0)] | None = None
    idle_timeout_seconds: Annotated[float, Field(gt=0)] | None = None
    # Service bridges: sandbox port (a string, JSON keys are) → upstream URL (see bridges.py).
    bridges: dict[str, str] | None = None


class SandboxInfo(BaseModel):
    sandbox_id: str
    image: str
    status: SandboxStatus
    block_network: bool
    cpu: str | None
    memory: str | None
    timeout: float
    created_at: float
    labels: dict[str, str]
    ttl_seconds: float | None
    idle_timeout_seconds: float | None
    expires_at: float | None
    error: str | None
    bridges: dict[str, str] = {}


class SandboxList(BaseModel):
    sandboxes: list[SandboxInfo]


class DeleteResult(BaseModel):
    status: Literal["deleted"]
    sandbox_id: str


def _no_nul(value: object, what: str) -> None:
    texts = [value] if isinstance(value, str) else list(value or [])  # type: ignore[call-overload]
    if any("\x00" in t for t in texts):
        raise ValueError(f"{what} must not contain NUL bytes")


# Declared in the schema (so clients and fuzzers know it) and checked by _reject_nul below,
# which names the field in its error.
_NO_NUL_SCHEMA = {"pattern": "^[^\\x00]*$"}
_NoNul = Annotated[str, Field(json_schema_extra=_NO_NUL_SCHEMA)]


class ExecRequest(_Strict):
    command: (
        Annotated[str, StringConstraints(min_length=1), Field(json_schema_extra=_NO_NUL_SCHEMA)]
        | Annotated[list[_NoNul], Field(min_length=1)]
    )
    timeout_seconds: Annotated[float, Field(gt=0, le=86400)] | None = 300
    cwd: _NoNul | None = None
    env: (
        Annotated[dict[str, _NoNul], Field(json_schema_extra={"propertyNames": _NO_NUL_SCHEMA})]
        | None
    ) = None
    login_shell: bool | None = False
    wait: bool | None = False
    stdin: str | None = None

    @model_validator(mode="after")
    def _reject_nul(self) -> ExecRequest:
        # A process can take no NUL in argv, env or cwd; say so instead of failing later.
        _no_nul(self.command, "command")
        _no_nul(self.cwd, "cwd")
        if self.env:
            _no_nul(list(self.env) + list(self.env.values()), "env")
        return self


class Usage(BaseModel):
    cpu_user_s: float | None = None
    cpu_system_s: float | None = None
    max_rss_bytes: int | None = None


class JobInfo(BaseModel):
    job_id: str
    sandbox_id: str
    command: str | list[str]
    status: JobStatus
    stdout: str
    stderr: str
    exit_code: int | None
    created_at: float
    started_at: float | None
    completed_at: float | None
    error: str | None
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    usage: Usage | None = None


class JobQueued(BaseModel):
    job_id: str
    status: Literal["queued"]


class ApplyPatchRequest(_Strict):
    patch: str
    timeout_seconds: Annotated[float, Field(gt=0, le=3600)] | None = 30


class PatchResult(BaseModel):
    success: bool
    stdout: str
    stderr: str
    exit_code: int | None
    method: str | None = None


# What the agent's ``base64.b64decode(validate=True)`` takes: the standard alphabet, padded.
Base64 = Annotated[
    str,
    StringConstraints(pattern=r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"),
]


class WriteFileRequest(_Strict):
    path: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    content: Base64


class WriteFileResult(BaseModel):
    success: bool
    path: str
    size: int


class FileContent(BaseModel):
    path: str
    content: str
    size: int


class FileEntry(BaseModel):
    name: str
    type: Literal["file", "directory", "symlink"]
    size: int
    modified: float


class FileList(BaseModel):
    path: str
    files: list[FileEntry]


class ErrorBody(BaseModel):
    detail: str
    code: str


class Health(BaseModel):
    status: str
    backend: str
    version: str
    isolation: str | None = None
    # What that isolation consists of, one fact a line (the local backend says this).
    isolation_details: list[str] = []
    warnings: list[str] = []
