"""Agent settings, from the command line and the environment."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 0
    multi: bool = False
    admin_token: str = ""
    max_output_bytes: int = 1 << 20
    max_upload_bytes: int = 1 << 30
    port_file: str | None = None
    uds: str | None = None
    sandbox_id: str = "local"
    token: str = ""


def _read_secret(path: str | None) -> str:
    if not path:
        return ""
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip()


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(prog="orchard-env-agent")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--multi", action="store_true")
    p.add_argument("--admin-token-file")
    p.add_argument("--max-output-bytes", type=int, default=1 << 20)
    p.add_argument("--max-upload-bytes", type=int, default=1 << 30)
    p.add_argument("--port-file")
    p.add_argument("--uds", help="listen on this unix socket instead of TCP")
    p.add_argument("--token-file", help="single mode: the sandbox's token (or the env vars)")
    a = p.parse_args(argv)
    admin = _read_secret(a.admin_token_file) or os.environ.get("ORCHARD_AGENT_ADMIN_TOKEN", "")
    token = (
        _read_secret(a.token_file)
        or os.environ.get("ORCHARD_AGENT_TOKEN", "")
        or _read_secret(os.environ.get("ORCHARD_AGENT_TOKEN_FILE"))
    )
    if a.multi and not admin:
        p.error("--multi needs an admin token (--admin-token-file or ORCHARD_AGENT_ADMIN_TOKEN)")
    if not a.multi and not token:
        p.error("single mode needs --token-file, ORCHARD_AGENT_TOKEN or ORCHARD_AGENT_TOKEN_FILE")
    return Settings(
        host=a.host,
        port=a.port,
        multi=a.multi,
        admin_token=admin,
        max_output_bytes=max(64, a.max_output_bytes),
        max_upload_bytes=a.max_upload_bytes,
        port_file=a.port_file,
        uds=a.uds,
        sandbox_id=os.environ.get("ORCHARD_SANDBOX_ID", "local"),
        token=token,
    )
