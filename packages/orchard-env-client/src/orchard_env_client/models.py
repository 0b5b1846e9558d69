"""Wire models of the REST contract (``shared/API.md``): the one client-side definition.

Every model is an attrs class with ``to_json()`` and ``from_json()``:

* ``from_json`` ignores response fields it does not know, so a newer server with extra
  fields does not break an older client;
* request models omit ``None`` fields from ``to_json`` ("use the server default"),
  because the server rejects unknown fields but accepts missing optional ones.

``REQUEST_MODELS`` and ``RESPONSE_MODELS`` name every model by its schema name so a test
can compare field names against the server's OpenAPI document (``attrs.fields``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar

import attrs

__all__ = [
    "REQUEST_MODELS",
    "RESPONSE_MODELS",
    "ApplyPatchRequest",
    "CreateSandboxRequest",
    "DeleteResult",
    "ExecEvent",
    "ExecRequest",
    "FileInfo",
    "FileList",
    "Health",
    "Job",
    "JobStatus",
    "PatchResult",
    "Sandbox",
    "SandboxStatus",
    "Usage",
    "WriteFileRequest",
    "WriteFileResult",
]

SandboxStatus = Literal["pending", "ready", "failed", "terminated"]
JobStatus = Literal["queued", "running", "succeeded", "failed"]

_M = TypeVar("_M", bound="_Model")

# attrs field metadata key: the nested model class (a dict -> model, a list -> list of models)
_NESTED = "orchard_nested"


def _nested(cls: type[_Model], default: Any = None) -> Any:
    return attrs.field(default=default, metadata={_NESTED: cls})


def _encode(value: Any) -> Any:
    if isinstance(value, _Model):
        return value.to_json()
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


class _Model:
    """Shared JSON conversion for the attrs models below."""

    _omit_none: ClassVar[bool] = False  # True for request bodies

    def to_json(self) -> dict[str, Any]:
        """This model as a JSON-ready dict (requests leave out ``None`` fields)."""
        out: dict[str, Any] = {}
        for field in attrs.fields(type(self)):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if value is None and self._omit_none:
                continue
            out[field.name] = _encode(value)
        return out

    @classmethod
    def from_json(cls: type[_M], data: Mapping[str, Any]) -> _M:
        """Build the model from a decoded JSON object, ignoring unknown fields."""
        kwargs: dict[str, Any] = {}
        for field in attrs.fields(cls):  # type: ignore[arg-type]
            if field.name not in data:
                continue
            value = data[field.name]
            nested = field.metadata.get(_NESTED)
            if nested is not None and value is not None:
                if isinstance(value, list):
                    value = [nested.from_json(v) for v in value]
                else:
                    value = nested.from_json(value)
            kwargs[field.name] = value
        return cls(**kwargs)


# ---------------------------------------------------------------- requests


@attrs.define(kw_only=True)
class CreateSandboxRequest(_Model):
    """Body of ``POST /sandboxes``."""

    _omit_none: ClassVar[bool] = True

    image: str
    block_network: bool = True
    sandbox_id: str | None = None
    cpu: str | None = None
    memory: str | None = None
    timeout: float | None = None
    env: dict[str, str] | None = None
    workdir: str | None = None
    labels: dict[str, str] | None = None
    ttl_seconds: float | None = None
    idle_timeout_seconds: float | None = None
    bridges: dict[str, str] | None = None  # sandbox port → upstream URL (service bridges)


@attrs.define(kw_only=True)
class ExecRequest(_Model):
    """Body of ``POST /sandboxes/{id}/exec`` and ``/exec/stream``."""

    _omit_none: ClassVar[bool] = True

    command: str | list[str]
    timeout_seconds: float | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    login_shell: bool = False
    wait: bool = False
    stdin: str | None = None


@attrs.define(kw_only=True)
class ApplyPatchRequest(_Model):
    """Body of ``POST /sandboxes/{id}/apply_patch``."""

    _omit_none: ClassVar[bool] = True

    patch: str
    timeout_seconds: float | None = None


@attrs.define(kw_only=True)
class WriteFileRequest(_Model):
    """Body of ``POST /sandboxes/{id}/files`` (``content`` is base64)."""

    _omit_none: ClassVar[bool] = True

    path: str
    content: str


# ---------------------------------------------------------------- responses


@attrs.define(kw_only=True)
class Sandbox(_Model):
    """The sandbox object the server answers with (status, limits, lifetime)."""

    sandbox_id: str
    image: str = ""
    status: str = "pending"
    block_network: bool = True
    cpu: str | None = None
    memory: str | None = None
    timeout: float | None = None
    created_at: float | None = None
    labels: dict[str, str] = attrs.field(factory=dict)
    ttl_seconds: float | None = None
    idle_timeout_seconds: float | None = None
    expires_at: float | None = None
    error: str | None = None
    # Service bridges: ``http://127.0.0.1:<port>`` inside reaches the upstream URL.
    bridges: dict[str, str] = attrs.field(factory=dict)


@attrs.define(kw_only=True)
class DeleteResult(_Model):
    """Answer of ``DELETE /sandboxes/{id}``."""

    status: str
    sandbox_id: str


@attrs.define(kw_only=True)
class Usage(_Model):
    """Resources a job used, where the backend can measure them."""

    cpu_user_s: float | None = None
    cpu_system_s: float | None = None
    max_rss_bytes: int | None = None


@attrs.define(kw_only=True)
class Job(_Model):
    """A command's state and result (``GET /jobs/{id}``); ``queued`` answers fill only two fields."""

    job_id: str
    sandbox_id: str | None = None
    command: str | list[str] | None = None
    status: str = "queued"
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    created_at: float | None = None
    started_at: float | None = None
    completed_at: float | None = None
    error: str | None = None
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    usage: Usage | None = _nested(Usage)  # noqa: RUF009

    @property
    def done(self) -> bool:
        """True once the job has ended (``succeeded`` or ``failed``)."""
        return self.status in ("succeeded", "failed")

    @property
    def succeeded(self) -> bool:
        """True when the command exited 0 without timing out."""
        return self.status == "succeeded"


@attrs.define(kw_only=True)
class ExecEvent(_Model):
    """One NDJSON event of ``/exec/stream``: output (``stdout``/``stderr``) or the final ``exit``."""

    type: str
    data: str | None = None
    job: Job | None = None  # set on the ``exit`` event

    def to_json(self) -> dict[str, Any]:
        """The wire form: ``{"type", "data"}`` or ``{"type": "exit", **job}``."""
        if self.job is not None:
            return {"type": self.type, **self.job.to_json()}
        return {"type": self.type, "data": self.data}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExecEvent:
        """Parse one event; an ``exit`` event carries the job object inline."""
        kind = str(data.get("type", ""))
        if kind == "exit":
            return cls(type=kind, job=Job.from_json({k: v for k, v in data.items() if k != "type"}))
        return cls(type=kind, data=data.get("data"))


@attrs.define(kw_only=True)
class PatchResult(_Model):
    """Answer of ``apply_patch``."""

    success: bool
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    method: str | None = None  # ext: which attempt applied it (git, git-3way, patch-fuzz)


@attrs.define(kw_only=True)
class WriteFileResult(_Model):
    """Answer of ``POST /sandboxes/{id}/files``."""

    success: bool
    path: str
    size: int


@attrs.define(kw_only=True)
class FileInfo(_Model):
    """One entry of a directory listing."""

    name: str
    type: str
    size: int = 0
    modified: float | None = None


@attrs.define(kw_only=True)
class FileList(_Model):
    """Answer of ``GET /sandboxes/{id}/files/list``."""

    path: str
    files: list[FileInfo] = _nested(FileInfo, default=attrs.Factory(list))  # noqa: RUF009


@attrs.define(kw_only=True)
class Health(_Model):
    """Answer of ``GET /health``."""

    status: str
    backend: str | None = None
    version: str | None = None
    isolation: str | None = None  # ext: e.g. "bubblewrap", "none"
    isolation_details: list[str] = attrs.Factory(list)  # ext: what that isolation consists of
    warnings: list[str] = attrs.Factory(list)


REQUEST_MODELS: dict[str, type[_Model]] = {
    "CreateSandboxRequest": CreateSandboxRequest,
    "ExecRequest": ExecRequest,
    "ApplyPatchRequest": ApplyPatchRequest,
    "WriteFileRequest": WriteFileRequest,
}
"""Request bodies by schema name; compare ``attrs.fields`` names with the server's OpenAPI."""

RESPONSE_MODELS: dict[str, type[_Model]] = {
    "Sandbox": Sandbox,
    "DeleteResult": DeleteResult,
    "Usage": Usage,
    "Job": Job,
    "ExecEvent": ExecEvent,
    "PatchResult": PatchResult,
    "WriteFileResult": WriteFileResult,
    "FileInfo": FileInfo,
    "FileList": FileList,
    "Health": Health,
}
"""Response bodies by name (the server's schema names are the same)."""
