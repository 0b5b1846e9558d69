"""The action model: round trips, validation errors a model can act on, tool specs."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchard_gui.actions import (
    ACTION_KINDS,
    MAX_COORD,
    Action,
    ActionError,
    action_from_tool_call,
    action_tools,
)

pytestmark = pytest.mark.fast

coord = st.one_of(
    st.integers(0, int(MAX_COORD)), st.floats(0, MAX_COORD, allow_nan=False, allow_infinity=False)
)
text = st.text(max_size=50)
key = st.text(min_size=1, max_size=10)
url = st.sampled_from(["http://127.0.0.1:8000/", "https://example.org/a?b=1", "about:blank"])
index = st.integers(0, 20)


def opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


def action_dicts() -> st.SearchStrategy[dict[str, Any]]:
    def build(kind: str, **args: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries({"action": st.just(kind), **args}).map(
            lambda d: {k: v for k, v in d.items() if v is not None}
        )

    return st.one_of(
        build(
            "click",
            x=coord,
            y=coord,
            button=opt(st.sampled_from(["left", "right", "middle"])),
            double=opt(st.booleans()),
        ),
        build("type", text=st.text(min_size=1, max_size=50), submit=opt(st.booleans())),
        build("press_keys", keys=st.lists(key, min_size=1, max_size=4)),
        build(
            "scroll",
            direction=st.sampled_from(["up", "down", "left", "right"]),
            amount=opt(st.integers(1, 5000)),
        ),
        build("scroll", direction=st.just("down"), x=coord, y=coord),
        build("wait", seconds=opt(st.floats(0, 30))),
        build("goto_url", url=url),
        build("go_back"),
        build("drag", x=coord, y=coord, x2=coord, y2=coord),
        build("hover", x=coord, y=coord),
        build("new_tab", url=opt(url)),
        build("switch_tab", index=index),
        build("close_tab", index=opt(index)),
        build("done", answer=opt(text)),
    )


@given(action_dicts())
def test_round_trip(data: dict[str, Any]) -> None:
    action = Action.from_dict(data)
    assert action.kind == data["action"]
    assert action.to_dict() == data
    assert Action.from_dict(action.to_dict()) == action
    # and through JSON, as it travels to the sandbox
    assert Action.from_dict(json.loads(json.dumps(action.to_dict()))) == action


def test_every_kind_is_covered_and_offered_as_a_tool() -> None:
    tools = action_tools()
    assert [t["function"]["name"] for t in tools] == list(ACTION_KINDS)
    for tool in tools:
        assert tool["type"] == "function"
        params = tool["function"]["parameters"]
        assert params["type"] == "object"
        assert set(params["required"]) <= set(params["properties"])
        assert tool["function"]["description"]
    json.dumps(tools)  # serialisable as sent to an OpenAI-compatible endpoint
    assert [t["function"]["name"] for t in action_tools(["click", "done"])] == ["click", "done"]
    with pytest.raises(ValueError, match="unknown action kinds"):
        action_tools(["fly"])


def test_tool_arguments_match_the_action_json() -> None:
    for tool in action_tools():
        kind = tool["function"]["name"]
        params = tool["function"]["parameters"]
        sample = {
            "x": 1,
            "y": 2,
            "x2": 3,
            "y2": 4,
            "text": "hi",
            "keys": ["Enter"],
            "direction": "down",
            "url": "http://127.0.0.1/",
            "index": 0,
        }
        args = {name: sample[name] for name in params["required"]}
        assert action_from_tool_call(kind, json.dumps(args)).kind == kind


def test_tool_call_parsing() -> None:
    assert action_from_tool_call("click", '{"x": 5, "y": 6}') == Action.make("click", x=5, y=6)
    assert action_from_tool_call("go_back", "") == Action(kind="go_back")
    assert action_from_tool_call("done", {"answer": "42"}).answer == "42"
    with pytest.raises(ActionError, match="not valid JSON"):
        action_from_tool_call("click", "{x: 5")
    with pytest.raises(ActionError, match="JSON object"):
        action_from_tool_call("click", "[1, 2]")
    with pytest.raises(ActionError, match="unknown action 'fly'"):
        action_from_tool_call("fly", "{}")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "unknown action None"),
        ({"action": "teleport"}, "must be one of"),
        ({"action": "click", "x": 1}, r"missing required argument\(s\) \['y'\]"),
        ({"action": "click", "x": "10", "y": 5}, "'x' must be a number"),
        ({"action": "click", "x": True, "y": 5}, "'x' must be a number"),
        ({"action": "click", "x": -1, "y": 5}, "finite number in 0..10000"),
        ({"action": "click", "x": math.nan, "y": 5}, "finite number"),
        ({"action": "click", "x": math.inf, "y": 5}, "finite number"),
        ({"action": "click", "x": 1e9, "y": 5}, "0..10000"),
        ({"action": "click", "x": 1, "y": 5, "button": "side"}, "'button' must be one of"),
        ({"action": "click", "x": 1, "y": 5, "double": "yes"}, "true or false"),
        ({"action": "click", "x": 1, "y": 5, "text": "a"}, r"unexpected argument\(s\) \['text'\]"),
        ({"action": "type", "text": 5}, "'text' must be a string"),
        ({"action": "type", "text": ""}, "must not be empty"),
        ({"action": "type", "text": "x" * 10_001}, "too long"),
        ({"action": "press_keys", "keys": []}, "non-empty list"),
        ({"action": "press_keys", "keys": "Enter"}, "non-empty list"),
        ({"action": "press_keys", "keys": ["Control", ""]}, "key name"),
        ({"action": "press_keys", "keys": ["a"] * 9}, "at most 8 keys"),
        ({"action": "scroll", "direction": "sideways"}, "'direction' must be one of"),
        ({"action": "scroll", "direction": "down", "amount": 0}, "more than 0"),
        ({"action": "scroll", "direction": "down", "x": 5}, "both 'x' and 'y'"),
        ({"action": "wait", "seconds": 31}, "at most 30"),
        ({"action": "wait", "seconds": -1}, "at least 0"),
        ({"action": "goto_url", "url": ""}, "non-empty string"),
        ({"action": "goto_url", "url": "example.org"}, "with a scheme"),
        ({"action": "goto_url", "url": "javascript:alert(1)"}, "javascript: URLs"),
        ({"action": "go_back", "x": 1}, "it takes no arguments"),
        ({"action": "drag", "x": 1, "y": 2, "x2": 3}, r"\['y2'\]"),
        ({"action": "switch_tab", "index": -1}, "tab index"),
        ({"action": "switch_tab", "index": 1.5}, "tab index"),
        ({"action": "close_tab", "index": True}, "tab index"),
        ({"action": "done", "answer": 42}, "'answer' must be a string"),
    ],
)
def test_bad_input(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ActionError, match=message):
        Action.from_dict(data)


def test_not_a_mapping() -> None:
    with pytest.raises(ActionError, match="JSON object"):
        Action.from_dict(["click"])  # type: ignore[arg-type]


def test_error_is_a_value_error_and_actions_are_frozen() -> None:
    assert issubclass(ActionError, ValueError)
    action = Action.make("hover", x=1, y=2)
    with pytest.raises(AttributeError):
        action.x = 5  # type: ignore[misc]
    assert str(action) == "hover(x=1, y=2)"
    assert Action.make("press_keys", keys=["Control", "a"]).to_dict()["keys"] == ["Control", "a"]
