"""Connecting to an agent's unix socket without following what a sandbox put in its place.

A Docker sandbox's agent socket lies in a directory the sandbox shares and may write: code
inside can replace the socket with a symlink to a host socket (the Docker engine's, say),
and a plain ``connect()`` would follow it with the orchestrator's rights. Here the last
component is opened ``O_PATH | O_NOFOLLOW``, checked to be a socket, and connected to
through ``/proc/self/fd/N``, which names exactly the inode that was checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import Any

import aiohttp
from aiohttp.client_exceptions import UnixClientConnectorError


@contextlib.contextmanager
def pinned_socket(path: str) -> Iterator[str]:
    """A path to connect to that reaches the socket at ``path`` and nothing else.

    OSError when ``path`` is missing, or is a symlink or anything else but a socket.
    """
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError(errno.ENOTSOCK, f"{path} is not a unix socket (replaced from inside?)")
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


class PinnedUnixConnector(aiohttp.UnixConnector):
    """``aiohttp.UnixConnector`` connecting through ``pinned_socket`` every time."""

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        try:
            with pinned_socket(self.path) as pinned:
                async with asyncio.timeout(timeout.sock_connect):
                    _, protocol = await self._loop.create_unix_connection(self._factory, pinned)
        except OSError as exc:
            if isinstance(exc, TimeoutError):
                raise
            raise UnixClientConnectorError(self.path, req.connection_key, exc) from exc
        return protocol
