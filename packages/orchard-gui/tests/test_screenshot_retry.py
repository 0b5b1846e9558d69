"""The browser server's screenshot retry policy (pure logic: a page that fails on cue)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Error as PlaywrightError

from orchard_gui.browser_server import SCREENSHOT_ATTEMPTS, BrowserEnv

pytestmark = pytest.mark.fast


class FlakyPage:
    """Raises the given errors from ``screenshot`` one after the other, then answers."""

    def __init__(self, *errors: str) -> None:
        self.errors = list(errors)
        self.settled = 0

    def screenshot(self, **_: Any) -> bytes:
        if self.errors:
            raise PlaywrightError(self.errors.pop(0))
        return b"png"

    def wait_for_load_state(self, *_: Any, **__: Any) -> None:
        self.settled += 1


@pytest.mark.parametrize(
    "error",
    [
        "Timeout 10000ms exceeded.",
        "Protocol error (Page.captureScreenshot): Unable to capture screenshot",
        "Page.captureScreenshot: Not attached to an active page",
    ],
)
def test_a_transient_capture_error_is_retried_after_the_page_settles(error: str) -> None:
    page = FlakyPage(error)
    assert BrowserEnv._screenshot(page) == b"png"  # type: ignore[arg-type]
    assert page.settled == 1


def test_other_errors_and_the_last_attempt_are_raised() -> None:
    with pytest.raises(PlaywrightError, match="Target page, context or browser has been closed"):
        BrowserEnv._screenshot(FlakyPage("Target page, context or browser has been closed"))  # type: ignore[arg-type]
    always = FlakyPage(*["Unable to capture screenshot"] * SCREENSHOT_ATTEMPTS)
    with pytest.raises(PlaywrightError, match="Unable to capture"):
        BrowserEnv._screenshot(always)  # type: ignore[arg-type]
