"""Text-form actions: what a model without function tools writes, parsed safely."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchard_gui.actions import Action, ActionError
from orchard_gui.text_actions import format_action, parse_text_action

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Thought: the button.\nAction: click(412, 88)", {"action": "click", "x": 412, "y": 88}),
        (
            'Action: `click(1.5, 2, button="right")`',
            {"action": "click", "x": 1.5, "y": 2, "button": "right"},
        ),
        (
            'Action: type("blue shoes", submit=true)',
            {"action": "type", "text": "blue shoes", "submit": True},
        ),
        ('Action: press_keys("Control", "a")', {"action": "press_keys", "keys": ["Control", "a"]}),
        (
            'Action: press_keys(["Control", "a"])',
            {"action": "press_keys", "keys": ["Control", "a"]},
        ),
        ('action: scroll("down", 600)', {"action": "scroll", "direction": "down", "amount": 600}),
        (
            'Action: goto_url("http://127.0.0.1:8000/")',
            {"action": "goto_url", "url": "http://127.0.0.1:8000/"},
        ),
        ("Action: go_back()", {"action": "go_back"}),
        ("Action: drag(1, 2, 3, 4)", {"action": "drag", "x": 1, "y": 2, "x2": 3, "y2": 4}),
        ('Action: done("48,210")', {"action": "done", "answer": "48,210"}),
        ("Action: done()", {"action": "done"}),
        ("I think so.\nclick(5, 6)", {"action": "click", "x": 5, "y": 6}),
        ('```json\n{"action": "hover", "x": 3, "y": 4}\n```', {"action": "hover", "x": 3, "y": 4}),
        ("Action: click(1, 1)\nAction: click(2, 2)", {"action": "click", "x": 2, "y": 2}),
        ("**Action:** click(7, 8)", {"action": "click", "x": 7, "y": 8}),
        ("> Action: `click(7, 8)`.", {"action": "click", "x": 7, "y": 8}),
        ('Action: type("a**b_")', {"action": "type", "text": "a**b_"}),
    ],
)
def test_text_actions_parse(text: str, expected: dict) -> None:
    assert parse_text_action(text) == Action.from_dict(expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("I will click the button.", "no action found"),
        ("Action: click(__import__('os').system('x'), 1)", "not a literal"),
        ("Action: launch(1)", "unknown action"),
        ("Action: click(1, 2, 3)", "at most 2 positional"),
        ("Action: click(1,", "could not read"),
        ("Action: click(x=1)", "missing required"),
        ("Action: click(**{'x': 1})", r"\*\*arguments"),
        ("Action: click(x=1, y=2, x=3)", "given twice"),
        ("Action: click(" + "+".join(["1"] * 30000) + ", 1)", "characters long"),
        ("Action: click(" + "+".join(["1"] * 5000) + ", 1)", "could not read|not a literal"),
    ],
)
def test_bad_text_actions_say_what_to_do(text: str, message: str) -> None:
    with pytest.raises(ActionError, match=message):
        parse_text_action(text)


_ACTIONS = st.one_of(
    st.builds(
        lambda x, y: Action.make("click", x=x, y=y), st.integers(0, 4000), st.integers(0, 4000)
    ),
    st.builds(
        lambda t, s: Action.make("type", text=t, submit=s),
        st.text(min_size=1, max_size=40),
        st.booleans(),
    ),
    st.builds(
        lambda k: Action.make("press_keys", keys=k),
        st.lists(st.sampled_from(["Control", "a", "Enter", "Shift"]), min_size=1, max_size=3),
    ),
    st.builds(
        lambda d, a: Action.make("scroll", direction=d, amount=a),
        st.sampled_from(["up", "down"]),
        st.integers(1, 2000),
    ),
    st.builds(lambda a: Action.make("done", answer=a), st.text(max_size=40)),
    st.builds(lambda i: Action.make("switch_tab", index=i), st.integers(0, 9)),
)


@given(_ACTIONS)
def test_format_action_reads_back(action: Action) -> None:
    assert parse_text_action(f"Thought: go.\nAction: {format_action(action)}") == action
