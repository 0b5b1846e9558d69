"""Service bridges' pure rules: what a create may ask for, and where a request goes."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from orchard_env_server.bridges import upstream_url, validate_bridges
from orchard_env_server.errors import ApiError


def _code(
    raw: dict[str, str], allowed: Collection[str] = (), reserved: Collection[int] = ()
) -> str:
    with pytest.raises(ApiError) as caught:
        validate_bridges(raw, allowed, reserved)
    assert caught.value.status == 400
    return caught.value.code


def test_ports_are_spelled_canonically_and_urls_kept():
    got = validate_bridges({"04000": "https://api.example/v1/"}, [], set())
    assert got == {"4000": "https://api.example/v1/"}


@pytest.mark.parametrize(
    "raw",
    [
        {"0": "http://h"},
        {"65536": "http://h"},
        {"+80": "http://h"},
        {"\uff18\uff10": "http://h"},  # fullwidth digits
        {"80": "file:///etc/passwd"},
        {"80": "http://"},
        {"80": "http://h:99999/"},
        {"80": "http://h/v1/../admin"},
        {"80": "http://h/#frag"},
        {"80": "http://h/" + "a" * 2048},
        {"80": "http://h", "080": "http://h"},
    ],
)
def test_malformed_bridges_are_invalid(raw):
    assert _code(raw) == "invalid_bridge"


def test_reserved_ports_and_disallowed_upstreams_have_codes_of_their_own():
    assert _code({"7000": "http://h"}, reserved={7000}) == "bridge_port_reserved"
    allowed = ["http://models:8080/v1"]
    assert validate_bridges({"1": "http://models:8080/v1/chat"}, allowed, set())
    assert validate_bridges({"1": "http://MODELS:8080/v1"}, allowed, set())
    for url in (
        "http://models:8080/v10",
        "https://models:8080/v1",
        "http://models:8081/v1",
        "http://models/v1",
        "http://models:8080/",
    ):
        assert _code({"1": url}, allowed) == "bridge_upstream_not_allowed", url


@pytest.mark.parametrize(
    ("upstream", "target", "url"),
    [
        ("http://h:1/v1", "/chat?x=1&y=%20", "http://h:1/v1/chat?x=1&y=%20"),
        ("http://h:1/v1/", "/chat", "http://h:1/v1/chat"),
        ("http://h:1", "/", "http://h:1/"),
        ("http://h:1/v1", "/a%2Fb", "http://h:1/v1/a%2Fb"),
    ],
)
def test_a_request_goes_under_the_upstreams_path(upstream, target, url):
    assert upstream_url(upstream, target) == url


@pytest.mark.parametrize("target", ["/../x", "/a/%2e%2E/b", "/.", "*", "http://other/x"])
def test_targets_that_climb_or_go_elsewhere_are_refused(target):
    with pytest.raises(ValueError):
        upstream_url("http://h/v1", target)
