"""The public SDK's terminal protocol: how its frames are read (no processes)."""

from __future__ import annotations

import json
import signal

import pytest

from orchard_env_agent.pty_json import init_frame, signal_number
from orchard_env_agent.terminal import window

pytestmark = pytest.mark.fast


def test_only_a_json_init_text_frame_selects_the_protocol():
    init = {"type": "init", "cmd": ["bash"]}
    assert init_frame({"type": "websocket.receive", "text": json.dumps(init)}) == init
    assert init_frame({"type": "websocket.receive", "text": '{"type": "resize"}'}) is None
    assert init_frame({"type": "websocket.receive", "text": "echo hi\n"}) is None
    assert init_frame({"type": "websocket.receive", "text": "[1]"}) is None
    assert init_frame({"type": "websocket.receive", "bytes": json.dumps(init).encode()}) is None


@pytest.mark.parametrize(
    ("name", "number"),
    [
        ("TERM", signal.SIGTERM),
        ("KILL", signal.SIGKILL),
        ("INT", signal.SIGINT),
        ("HUP", signal.SIGHUP),
        ("QUIT", signal.SIGQUIT),
        ("sigusr1", signal.SIGUSR1),
        ("9", signal.SIGKILL),
        (15, signal.SIGTERM),
        ("NOPE", signal.SIGTERM),
        (None, signal.SIGTERM),
        (99999, signal.SIGTERM),
        (True, signal.SIGTERM),
    ],
)
def test_signal_names_as_the_public_agent_reads_them_and_more(name, number):
    assert signal_number(name) == number


def test_window_sizes_fall_back_and_are_bounded():
    assert window(None, 24) == 24 and window("", 80) == 80 and window("x", 80) == 80
    assert window(50, 24) == 50 and window("200", 80) == 200 and window(30.0, 24) == 30
    assert window(0, 24) == 1 and window(10**6, 24) == 10000 and window([1], 24) == 24
