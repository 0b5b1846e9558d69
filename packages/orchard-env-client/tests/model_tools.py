"""Tool specs of the harnesses the scripted-model and proxy tests imitate."""

from __future__ import annotations

EXEC_TOOL = {
    "type": "function",
    "function": {
        "name": "exec",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
CODEX_SHELL = {
    "type": "function",
    "name": "shell",
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
            "timeout_ms": {"type": "number"},
        },
        "required": ["command"],
    },
}
