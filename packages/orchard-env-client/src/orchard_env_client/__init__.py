"""Orchard Env client: create sandboxes, run commands, move files (sync and async).

``AsyncSandboxClient`` is the implementation; ``SandboxClient`` (with its ``Sandbox`` and
``JobHandle``) is derived from it. ``SandboxInfo`` is the wire model of a sandbox
(``models.Sandbox``; the name ``Sandbox`` here is the sync handle); ``Job`` is the result
of a command.
"""

from importlib.metadata import PackageNotFoundError, version

from . import models
from ._client import AsyncSandboxClient
from ._http import RetryPolicy, pooled_transport
from ._sandbox import AsyncJobHandle, AsyncSandbox
from .errors import (
    AuthError,
    BadRequest,
    Conflict,
    ConnectionFailed,
    JobNotFound,
    NotFound,
    OrchardError,
    Overloaded,
    PathNotFound,
    PayloadTooLarge,
    QuotaExceeded,
    SandboxFailed,
    SandboxNotFound,
    SandboxNotReady,
    SandboxTimeout,
    ServerError,
    ValidationError,
)
from .models import ExecEvent, FileInfo, Health, Job, PatchResult, Usage
from .models import Sandbox as SandboxInfo
from .sync import JobHandle, Sandbox, SandboxClient

try:
    __version__ = version("orchard-env-client")
except PackageNotFoundError:  # running from a source tree without metadata
    __version__ = "0.0.0"

AsyncJob = AsyncJobHandle
"""The earlier name of :class:`AsyncJobHandle` (the async twin of ``JobHandle``)."""

__all__ = [
    "AsyncJob",
    "AsyncJobHandle",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "AuthError",
    "BadRequest",
    "Conflict",
    "ConnectionFailed",
    "ExecEvent",
    "FileInfo",
    "Health",
    "Job",
    "JobHandle",
    "JobNotFound",
    "NotFound",
    "OrchardError",
    "Overloaded",
    "PatchResult",
    "PathNotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "RetryPolicy",
    "Sandbox",
    "SandboxClient",
    "SandboxFailed",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxNotReady",
    "SandboxTimeout",
    "ServerError",
    "Usage",
    "ValidationError",
    "__version__",
    "models",
    "pooled_transport",
]
