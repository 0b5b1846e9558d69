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

# Environment variables: a name is not empty and holds no "=" nor NUL, a value no NUL
# (what exec(2) can take); no other keys (the schema says so, for clients and fuzzers).
EnvVars = Annotated[
    dict[
        Annotated[str, StringConstraints(pattern=r"^[^=\x00]+$")],
        # Declared here, checked with a clearer message by the models' _reject_nul.
        Annotated[str, Field(json_schema_extra={"pattern": "^[^\\x00]*$"})],
    ],
    Field(json_schema_extra={"additionalProperties": False}),
]

# A service bridge's sandbox port, 1..65535, as a JSON key.
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
BridgePort = Annotated[str, StringConstraints(pattern=rf"^{_PORT}$")]
# A percent escape that cannot decode to ".", "/", "\" or "%" (so no dot segment either).
_ESCAPE = r"%([0-13-46-9A-Fa-f][0-9A-Fa-f]|2[0-46-9A-Da-d]|5[0-9ABD-Fabd-f])"
_URL_CHAR = rf"([A-Za-z0-9_~!$&'()*+,;=:@-]|{_ESCAPE})"  # of a path, besides "."
_PATH_SEGMENT = rf"({_URL_CHAR}|[.]{_URL_CHAR}|[.][.]({_URL_CHAR}|[.]))({_URL_CHAR}|[.])*"
_H16 = "[0-9A-Fa-f]{1,4}"
_IPV6 = (  # RFC 4291 text forms, without an embedded IPv4 part or a zone
    rf"(({_H16}:){{7}}{_H16}|({_H16}:){{1,7}}:|({_H16}:){{1,6}}:{_H16}"
    rf"|({_H16}:){{1,5}}(:{_H16}){{1,2}}|({_H16}:){{1,4}}(:{_H16}){{1,3}}"
    rf"|({_H16}:){{1,3}}(:{_H16}){{1,4}}|({_H16}:){{1,2}}(:{_H16}){{1,5}}"
    rf"|{_H16}:(:{_H16}){{1,6}}|:((:{_H16}){{1,7}}|:))"
)
_HOST = rf"([A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?|\[{_IPV6}\])"
# Its upstream: an http(s) URL without credentials, query, fragment or climbing segments
# (``bridges.py`` checks the same, and what the schema cannot say: allowed prefixes).
BridgeUpstream = Annotated[
    str,
    StringConstraints(
        max_length=2048,
        pattern=rf"^[Hh][Tt][Tt][Pp][Ss]?://{_HOST}(:{_PORT})?(/({_PATH_SEGMENT})?)*$",
    ),
]


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
    env: EnvVars | None = None
    workdir: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = None
    labels: dict[str, str] | None = None
    ttl_seconds: Annotated[float, Field(gt=0)] | None = None
    idle_timeout_seconds: Annotated[float, Field(gt=0)] | None = None
    # Service bridges: sandbox port (a string, JSON keys are) → upstream URL (see bridges.py).
    bridges: (
        Annotated[
            dict[BridgePort, BridgeUpstream],
            Field(max_length=16, json_schema_extra={"additionalProperties": False}),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _reject_nul(self) -> CreateSandboxRequest:
        if self.env:
            _no_nul(list(self.env.values()), "env")
        return self


class Sandbox(BaseModel):
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
    sandboxes: list[Sandbox]


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
    env: EnvVars | None = None
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


class Job(BaseModel):
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


class FileInfo(BaseModel):
    name: str
    type: Literal["file", "directory", "symlink"]
    size: int
    modified: float


class FileList(BaseModel):
    path: str
    files: list[FileInfo]


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
