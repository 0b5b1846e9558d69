"""The grade's words when a test run gives no results (pure; no sandbox)."""

from __future__ import annotations

import pytest

from orchard_swe.grading import TAIL_CHARS, TAIL_LINES, no_results_error, output_tail

pytestmark = pytest.mark.fast


def test_a_command_not_found_names_the_command_the_exit_code_and_the_shell_message():
    error = no_results_error("python -m pytest tests", 127, "sh: 1: python: not found\n")
    assert error == (
        "the test command failed (exit 127, command not found) and reported no test results: "
        "python -m pytest tests; its output ends:\nsh: 1: python: not found"
    )


@pytest.mark.parametrize(
    ("code", "meaning"),
    [
        (1, "(exit 1) and"),
        (126, "(exit 126, not executable)"),
        (137, "(exit 137, killed by signal 9)"),
    ],
)
def test_other_exit_codes_are_named(code, meaning):
    assert meaning in no_results_error("make test", code, "boom")


def test_a_clean_exit_without_results_keeps_the_old_words():
    error = no_results_error("echo hi", 0, "hi\n")
    assert error.startswith("the test log holds no test results (the test command exited 0)")
    assert error.endswith("its output ends:\nhi")


def test_no_exit_code_gives_the_job_error_and_silence_is_said():
    error = no_results_error("pytest", None, "", "the sandbox went away")
    assert "ended without an exit code (the sandbox went away)" in error
    assert error.endswith("; it printed nothing")


def test_the_tail_is_bounded_in_lines_and_in_characters():
    log = "".join(f"line {i}\n" for i in range(1000))
    assert output_tail(log).splitlines() == [f"line {i}" for i in range(980, 1000)]
    assert TAIL_LINES == 20
    wide = "\n".join("x" * 500 for _ in range(30))
    tail = output_tail(wide)
    assert len(tail) == TAIL_CHARS and tail.startswith("...")
    error = no_results_error("pytest " + "-k a " * 500, 2, wide)
    assert len(error) < TAIL_CHARS + 700  # the command is shortened too


def test_the_tail_of_an_empty_output_is_empty():
    assert output_tail("") == "" and output_tail("\n\n") == ""
