"""The browser environment server: runs INSIDE the sandbox, next to Chromium.

    python browser_server.py --port 9300 --chromium /usr/bin/chromium --width 1280 --height 720

Self-contained on purpose (stdlib + Playwright only): the host copies this one file into the
sandbox. It serves a small HTTP JSON API on 127.0.0.1 (the host reaches it through the
service's port forwarding):

- ``GET /health`` -> ``{"ok": true, "browser_version", "instance"}`` (``--instance``)
- ``POST /reset {"url", "marks"?, "axtree"?, "som"?}`` -> ``{"observation"}`` (one fresh tab at url)
- ``POST /step {"action", "marks"?, "axtree"?}`` -> ``{"observation", "ok", "error", "done",
  "answer"}``; an action that fails at runtime is ``ok: false``; a malformed one is HTTP 400
- ``POST /observe {"marks"?, "axtree"?}`` -> ``{"observation"}``
- ``POST /evaluate {"expression"}`` -> ``{"value"}``
- ``POST /close`` -> stops the browser and exits

HTTP requests arrive on threads; all browser work runs on the main thread (Playwright's sync
API is bound to the thread that started it), one request at a time.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import json
import math
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
MAX_AXTREE_CHARS = 20_000
MAX_MARKS = 300
MAX_BODY = 1 << 20
TOKEN_HEADER = "X-Orchard-Browser"
"""Header carrying the ``--instance`` token on every POST."""
NAV_TIMEOUT_MS = 30_000
SETTLE_LOAD_MS = 5_000
SETTLE_IDLE_MS = 1_000
SCREENSHOT_MS = 10_000
SCREENSHOT_ATTEMPTS = 3
NEW_TAB_MS = 5_000
_OPENS_NEW_WINDOW_JS = """([x, y]) => {
  const link = document.elementFromPoint(x, y)?.closest("a[href]");
  const target = link ? (link.target || document.querySelector("base[target]")?.target) : "";
  return (target || "").toLowerCase() === "_blank";
}"""
"""Whether a left click at (x, y) follows a link into a new tab (target=_blank; a named
target opens one only the first time, and the settle delay covers that)."""
_TRANSIENT_SCREENSHOT_ERRORS = (
    "Timeout",
    "Unable to capture screenshot",
    "Not attached to an active page",
)
REQUEST_TIMEOUT_S = 120.0

KINDS = {
    "click": (("x", "y"), ("button", "double")),
    "type": (("text",), ("submit",)),
    "press_keys": (("keys",), ()),
    "scroll": (("direction",), ("amount", "x", "y")),
    "wait": ((), ("seconds",)),
    "goto_url": (("url",), ()),
    "go_back": ((), ()),
    "drag": (("x", "y", "x2", "y2"), ()),
    "hover": (("x", "y"), ()),
    "new_tab": ((), ("url",)),
    "switch_tab": (("index",), ()),
    "close_tab": ((), ("index",)),
    "done": ((), ("answer",)),
}
NUMBERS = {"x", "y", "x2", "y2", "amount", "seconds"}
STRINGS = {"text", "url", "answer", "button", "direction"}
CHOICES = {"button": ("left", "right", "middle"), "direction": ("up", "down", "left", "right")}


class BadRequest(Exception):
    """A malformed request: answered with HTTP 400."""


class ActionFailed(Exception):
    """A well-formed action that could not be carried out: ``ok: false``."""


def _argument_problem(name: str, value: Any) -> str | None:
    """What is wrong with one action argument's type, or None."""
    if name in NUMBERS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "must be a number"
        if not math.isfinite(value) or value < 0:
            return "must be a finite non-negative number"
    elif name in STRINGS and not isinstance(value, str):
        return "must be a string"
    elif name in ("double", "submit") and not isinstance(value, bool):
        return "must be a boolean"
    elif name == "index" and (isinstance(value, bool) or not isinstance(value, int)):
        return "must be an integer"
    elif name == "keys" and (
        not isinstance(value, list) or not value or not all(isinstance(k, str) and k for k in value)
    ):
        return "must be a non-empty list of key names"
    return None


def _check_argument(kind: str, name: str, value: Any) -> None:
    problem = _argument_problem(name, value)
    if problem is not None:
        raise BadRequest(f"{kind}: {name!r} {problem}")
    if name in CHOICES and value not in CHOICES[name]:
        raise BadRequest(f"{kind}: {name!r} must be one of {list(CHOICES[name])}")


def validate_action(action: Any) -> dict[str, Any]:
    """The checks the server needs (the host validates fully before sending)."""
    if not isinstance(action, dict):
        raise BadRequest("'action' must be a JSON object")
    kind = action.get("action")
    if kind not in KINDS:
        raise BadRequest(f"unknown action {kind!r}; known: {sorted(KINDS)}")
    required, optional = KINDS[kind]
    extra = sorted(k for k in action if k not in {"action", *required, *optional})
    if extra:
        raise BadRequest(f"{kind}: unexpected argument(s) {extra}")
    for name in required:
        if action.get(name) is None:
            raise BadRequest(f"{kind}: missing required argument {name!r}")
    for name, value in action.items():
        if name != "action" and value is not None:
            _check_argument(kind, name, value)
    return action


# Collects the visible interactive elements in the viewport: [{id, tag, role, name, x, y,
# width, height}], numbered in document order. An element counts as visible when one of a
# few points of its box hits it (or its descendants) in elementFromPoint: covered elements
# are left out.
MARKS_JS = r"""
(maxMarks) => {
  const SELECTOR = [
    'a[href]', 'button', 'input:not([type=hidden])', 'select', 'textarea', 'summary',
    '[role=button]', '[role=link]', '[role=checkbox]', '[role=radio]', '[role=tab]',
    '[role=menuitem]', '[role=option]', '[role=switch]', '[role=textbox]', '[role=combobox]',
    '[role=slider]', '[role=treeitem]', '[role=searchbox]', '[role=spinbutton]',
    '[onclick]', '[contenteditable=""]', '[contenteditable=true]', '[tabindex]:not([tabindex="-1"])',
  ].join(',');
  const vw = window.innerWidth, vh = window.innerHeight;
  const implicitRole = (el) => {
    const tag = el.tagName.toLowerCase();
    if (tag === 'a') return 'link';
    if (tag === 'button' || tag === 'summary') return 'button';
    if (tag === 'select') return el.multiple ? 'listbox' : 'combobox';
    if (tag === 'textarea') return 'textbox';
    if (tag === 'input') {
      const t = (el.getAttribute('type') || 'text').toLowerCase();
      if (['button', 'submit', 'reset', 'image'].includes(t)) return 'button';
      if (t === 'checkbox' || t === 'radio') return t;
      if (t === 'range') return 'slider';
      if (t === 'number') return 'spinbutton';
      if (t === 'search') return 'searchbox';
      return 'textbox';
    }
    if (el.isContentEditable) return 'textbox';
    return 'generic';
  };
  const clean = (s) => (s || '').replace(/\s+/g, ' ').trim().slice(0, 100);
  const nameOf = (el) => {
    const aria = el.getAttribute('aria-label');
    if (aria) return clean(aria);
    const by = el.getAttribute('aria-labelledby');
    if (by) {
      const t = by.split(/\s+/).map((i) => document.getElementById(i))
        .filter(Boolean).map((e) => e.innerText || e.textContent).join(' ');
      if (clean(t)) return clean(t);
    }
    if (el.labels && el.labels.length) {
      const t = Array.from(el.labels).map((l) => l.innerText || l.textContent).join(' ');
      if (clean(t)) return clean(t);
    }
    const tag = el.tagName.toLowerCase();
    if (tag === 'input' && ['button', 'submit', 'reset'].includes((el.type || '').toLowerCase()))
      return clean(el.value);
    for (const attr of ['alt', 'title', 'placeholder']) {
      const v = el.getAttribute(attr);
      if (v) return clean(v);
    }
    if (tag === 'select') {
      const o = el.selectedOptions && el.selectedOptions[0];
      return clean(o ? o.textContent : '');
    }
    if (tag === 'input' || tag === 'textarea') return clean(el.value);
    const t = clean(el.innerText || el.textContent);
    if (t) return t;
    const img = el.querySelector('img[alt]');
    return img ? clean(img.getAttribute('alt')) : '';
  };
  const hits = (el, x, y) => {
    if (x < 0 || y < 0 || x >= vw || y >= vh) return false;
    const h = document.elementFromPoint(x, y);
    return !!h && (h === el || el.contains(h) || (h.tagName === 'LABEL' && h.control === el));
  };
  const out = [];
  for (const el of document.querySelectorAll(SELECTOR)) {
    if (out.length >= maxMarks) break;
    if (el.disabled) continue;
    const style = getComputedStyle(el);
    if (style.visibility === 'hidden' || style.display === 'none' || Number(style.opacity) === 0)
      continue;
    const r = el.getBoundingClientRect();
    if (r.width < 2 || r.height < 2) continue;
    const left = Math.max(0, r.left), top = Math.max(0, r.top);
    const right = Math.min(vw, r.right), bottom = Math.min(vh, r.bottom);
    if (right - left < 2 || bottom - top < 2) continue;
    const cx = (left + right) / 2, cy = (top + bottom) / 2;
    const points = [[cx, cy], [left + 2, top + 2], [right - 2, top + 2],
                    [left + 2, bottom - 2], [right - 2, bottom - 2]];
    if (!points.some(([x, y]) => hits(el, x, y))) continue;
    out.push({
      id: out.length + 1,
      tag: el.tagName.toLowerCase(),
      role: el.getAttribute('role') || implicitRole(el),
      name: nameOf(el),
      x: Math.round(left * 10) / 10, y: Math.round(top * 10) / 10,
      width: Math.round((right - left) * 10) / 10, height: Math.round((bottom - top) * 10) / 10,
    });
  }
  return out;
}
"""

OVERLAY_ID = "__orchard_som_overlay__"

# Draws numbered boxes over the marks in a fixed, click-through layer on top of everything.
OVERLAY_JS = r"""
([marks, id]) => {
  const colors = ['#e6194b', '#3cb44b', '#4363d8', '#f58231', '#911eb4', '#008080',
                  '#9a6324', '#800000', '#000075', '#f032e6'];
  const layer = document.createElement('div');
  layer.id = id;
  layer.style.cssText = 'position:fixed;left:0;top:0;width:100vw;height:100vh;' +
    'pointer-events:none;z-index:2147483647;margin:0;padding:0;border:0;';
  for (const m of marks) {
    const c = colors[m.id % colors.length];
    const box = document.createElement('div');
    box.style.cssText = `position:absolute;left:${m.x}px;top:${m.y}px;width:${m.width}px;` +
      `height:${m.height}px;outline:2px solid ${c};outline-offset:-1px;box-sizing:border-box;`;
    const label = document.createElement('div');
    label.textContent = String(m.id);
    const above = m.y >= 14;
    label.style.cssText = `position:absolute;left:${m.x}px;top:${above ? m.y - 14 : m.y}px;` +
      `background:${c};color:#fff;font:bold 11px/14px monospace;padding:0 3px;` +
      'border-radius:2px;white-space:nowrap;';
    layer.appendChild(box);
    layer.appendChild(label);
  }
  (document.body || document.documentElement).appendChild(layer);
}
"""

REMOVE_OVERLAY_JS = "(id) => { const e = document.getElementById(id); if (e) e.remove(); }"


class BrowserEnv:
    """Chromium and its tabs; every method runs on the thread that created it."""

    def __init__(self, chromium: str, width: int, height: int) -> None:
        self.width = width
        self.height = height
        self.playwright: Playwright = sync_playwright().start()
        self.browser: Browser = self.playwright.chromium.launch(
            executable_path=chromium, headless=True, args=CHROMIUM_ARGS
        )
        self.version = self.browser.version
        self.context: BrowserContext = self._new_context()
        self.pages: list[Page] = []
        self.active = 0
        self._track(self.context.new_page())

    # ------------------------------------------------------------ tabs

    def _new_context(self) -> BrowserContext:
        context = self.browser.new_context(
            viewport={"width": self.width, "height": self.height}, device_scale_factor=1
        )
        context.set_default_navigation_timeout(NAV_TIMEOUT_MS)
        context.set_default_timeout(10_000)
        context.on("page", self._on_page)
        return context

    def _on_page(self, page: Page) -> None:
        # Pages the page opens itself (target=_blank, window.open) become the active tab.
        self._track(page)

    def _track(self, page: Page) -> None:
        """Make ``page`` the active tab (adding it to the tabs once)."""
        if page not in self.pages:
            self.pages.append(page)
            page.on("close", self._on_close)
        self.active = self.pages.index(page)

    def _on_close(self, page: Page) -> None:
        if page in self.pages:
            index = self.pages.index(page)
            self.pages.remove(page)
            if self.active >= index and self.active > 0:
                self.active -= 1

    @property
    def page(self) -> Page:
        if not self.pages:  # the page closed its last tab itself: give the agent a blank one
            self._track(self.context.new_page())
        self.active = min(self.active, len(self.pages) - 1)
        return self.pages[self.active]

    # ------------------------------------------------------------ requests

    def reset(self, url: str) -> None:
        """A fresh context (no cookies, storage or history) with one tab at ``url``."""
        old = self.context
        self.pages = []
        self.active = 0
        self.context = self._new_context()
        self._track(self.context.new_page())
        with contextlib.suppress(PlaywrightError):
            old.close()
        try:
            self.page.goto(url, wait_until="load")
        except PlaywrightError as exc:
            raise ActionFailed(f"could not open {url}: {first_line(exc)}") from None
        self.settle()

    def step(self, action: dict[str, Any]) -> None:
        """Carry out one validated action on the active tab (ActionFailed if it cannot)."""
        kind = action["action"]
        handler = getattr(self, f"_act_{kind}", None)
        if handler is None:  # validate_action lets only known kinds through
            raise BadRequest(f"unknown action {kind!r}")
        handler(self.page, action)

    def _act_click(self, page: Page, action: dict[str, Any]) -> None:
        self._click(page, action)

    def _act_type(self, page: Page, action: dict[str, Any]) -> None:
        if action["text"]:
            page.keyboard.type(action["text"])
        if action.get("submit"):
            page.keyboard.press("Enter")

    def _act_press_keys(self, page: Page, action: dict[str, Any]) -> None:
        self._chord(page, action["keys"])

    def _act_scroll(self, page: Page, action: dict[str, Any]) -> None:
        amount = action.get("amount") or 400
        if action.get("x") is not None and action.get("y") is not None:
            page.mouse.move(action["x"], action["y"])
        else:
            page.mouse.move(self.width / 2, self.height / 2)
        dx, dy = {
            "up": (0, -amount),
            "down": (0, amount),
            "left": (-amount, 0),
            "right": (amount, 0),
        }[action["direction"]]
        page.mouse.wheel(dx, dy)

    def _act_wait(self, page: Page, action: dict[str, Any]) -> None:
        seconds = action.get("seconds")
        page.wait_for_timeout(1000 * min(30.0, 1.0 if seconds is None else seconds))

    def _act_goto_url(self, page: Page, action: dict[str, Any]) -> None:
        self._goto(page, action["url"])

    def _act_go_back(self, page: Page, action: dict[str, Any]) -> None:
        before = page.url
        try:
            response = page.go_back(wait_until="load")
        except PlaywrightError as exc:
            raise ActionFailed(f"go_back failed: {first_line(exc)}") from None
        if page.url == "about:blank" and before != "about:blank":
            # the tab's initial blank page is no page to return to: stay where we were
            with contextlib.suppress(PlaywrightError):
                page.go_forward(wait_until="load")
            raise ActionFailed("go_back: there is no previous page in this tab's history")
        if response is None and page.url == before:
            raise ActionFailed("go_back: there is no previous page in this tab's history")

    def _act_drag(self, page: Page, action: dict[str, Any]) -> None:
        page.mouse.move(action["x"], action["y"])
        page.mouse.down()
        page.mouse.move(action["x2"], action["y2"], steps=12)
        page.mouse.up()

    def _act_hover(self, page: Page, action: dict[str, Any]) -> None:
        page.mouse.move(action["x"], action["y"])

    def _act_new_tab(self, page: Page, action: dict[str, Any]) -> None:
        tab = self.context.new_page()
        self._track(tab)
        if action.get("url"):
            self._goto(tab, action["url"])

    def _tab_index(self, kind: str, index: int) -> int:
        if not 0 <= index < len(self.pages):
            raise ActionFailed(f"{kind}: no tab {index} (open tabs: 0..{len(self.pages) - 1})")
        return index

    def _act_switch_tab(self, page: Page, action: dict[str, Any]) -> None:
        self.active = self._tab_index("switch_tab", action["index"])
        self.pages[self.active].bring_to_front()

    def _act_close_tab(self, page: Page, action: dict[str, Any]) -> None:
        requested = self.active if action.get("index") is None else action["index"]
        index = self._tab_index("close_tab", requested)
        if len(self.pages) == 1:
            raise ActionFailed("close_tab: this is the only tab; it cannot be closed")
        self.pages[index].close()  # _on_close updates pages and active
        self.page.bring_to_front()

    def _act_done(self, page: Page, action: dict[str, Any]) -> None:
        pass  # the answer travels in the step's result

    def _click(self, page: Page, action: dict[str, Any]) -> None:
        """A mouse click; on a link that opens a new window, wait for its tab to exist, so
        the observation shows it however slowly the browser reports it."""
        x, y = action["x"], action["y"]
        button: Literal["left", "middle", "right"] = action.get("button") or "left"
        click_count = 2 if action.get("double") else 1
        opens_tab = False
        if button == "left":
            with contextlib.suppress(PlaywrightError):
                opens_tab = bool(page.evaluate(_OPENS_NEW_WINDOW_JS, [x, y]))
        if not opens_tab:
            page.mouse.click(x, y, button=button, click_count=click_count)
            return
        try:
            with self.context.expect_page(timeout=NEW_TAB_MS):
                page.mouse.click(x, y, button=button, click_count=click_count)
        except PlaywrightTimeoutError:
            pass  # the page stopped the link itself (preventDefault): no tab to wait for

    @staticmethod
    def _goto(page: Page, url: str) -> None:
        try:
            page.goto(url, wait_until="load")
        except PlaywrightError as exc:
            raise ActionFailed(f"could not open {url}: {first_line(exc)}") from None

    @staticmethod
    def _chord(page: Page, keys: list[str]) -> None:
        held: list[str] = []
        try:
            for key in keys[:-1]:
                page.keyboard.down(key)
                held.append(key)
            page.keyboard.press(keys[-1])
        except PlaywrightError as exc:
            raise ActionFailed(f"press_keys: {first_line(exc)}") from None
        finally:
            for key in reversed(held):
                with contextlib.suppress(PlaywrightError):
                    page.keyboard.up(key)

    def settle(self) -> None:
        """Let a navigation or re-render that the last action started finish (capped)."""
        page = self.page
        page.wait_for_timeout(60)  # a navigation started by a click begins asynchronously
        page = self.page  # the click may have opened a tab
        with contextlib.suppress(PlaywrightError):
            page.wait_for_load_state("load", timeout=SETTLE_LOAD_MS)
        with contextlib.suppress(PlaywrightError):
            page.wait_for_load_state("networkidle", timeout=SETTLE_IDLE_MS)

    def evaluate(self, expression: str) -> Any:
        return self.page.evaluate(expression)

    @staticmethod
    def _screenshot(page: Page) -> bytes:
        """A PNG of the viewport, retried after the page settles: under load a capture that
        races a navigation's commit times out, Chromium answers "Unable to capture
        screenshot" while the new document has not painted yet, or "Not attached to an
        active page" while a navigation swaps the page's renderer."""
        for attempt in range(SCREENSHOT_ATTEMPTS):
            try:
                return page.screenshot(type="png", timeout=SCREENSHOT_MS)
            except PlaywrightError as exc:
                transient = any(sign in str(exc) for sign in _TRANSIENT_SCREENSHOT_ERRORS)
                if attempt == SCREENSHOT_ATTEMPTS - 1 or not transient:
                    raise
                print(f"browser_server: screenshot retried: {first_line(exc)}", file=sys.stderr)
                with contextlib.suppress(PlaywrightError):
                    page.wait_for_load_state("load", timeout=SETTLE_LOAD_MS)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ observation

    def observe(self, marks: bool, axtree: bool, som: bool) -> dict[str, Any]:
        page = self.page
        tabs = []
        for index, tab in enumerate(self.pages):
            tabs.append(
                {
                    "index": index,
                    "url": tab.url,
                    "title": safe_title(tab),
                    "active": index == self.active,
                }
            )
        viewport = page.viewport_size or {"width": self.width, "height": self.height}
        screenshot = self._screenshot(page)
        obs: dict[str, Any] = {
            "url": page.url,
            "title": safe_title(page),
            "viewport": {"width": viewport["width"], "height": viewport["height"]},
            "tabs": tabs,
            "screenshot": base64.b64encode(screenshot).decode(),
            "axtree": None,
            "marks": None,
            "screenshot_som": None,
        }
        if marks:
            found = self._marks(page)
            obs["marks"] = found
            if som:  # a second screenshot with the boxes drawn: only when asked for
                obs["screenshot_som"] = base64.b64encode(self._som(page, found)).decode()
        if axtree:
            obs["axtree"] = self._axtree(page)
        return obs

    @staticmethod
    def _marks(page: Page) -> list[dict[str, Any]]:
        try:
            found = page.evaluate(MARKS_JS, MAX_MARKS)
        except PlaywrightError as exc:
            print(f"browser_server: marks failed: {first_line(exc)}", file=sys.stderr)
            return []
        return list(found or [])

    @staticmethod
    def _som(page: Page, marks: list[dict[str, Any]]) -> bytes:
        try:
            page.evaluate(OVERLAY_JS, [marks, OVERLAY_ID])
            return page.screenshot(type="png", timeout=15_000)
        finally:
            with contextlib.suppress(PlaywrightError):
                page.evaluate(REMOVE_OVERLAY_JS, OVERLAY_ID)

    @staticmethod
    def _axtree(page: Page) -> str:
        try:
            text = page.aria_snapshot(timeout=10_000)
        except PlaywrightError as exc:
            return f"(accessibility tree unavailable: {first_line(exc)})"
        if len(text) > MAX_AXTREE_CHARS:
            text = text[:MAX_AXTREE_CHARS] + f"\n... (truncated at {MAX_AXTREE_CHARS} characters)"
        return text

    def close(self) -> None:
        for closer in (self.context.close, self.browser.close, self.playwright.stop):
            with contextlib.suppress(Exception):
                closer()


def safe_title(page: Page) -> str:
    try:
        return page.title()
    except PlaywrightError:  # mid-navigation
        return ""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # Playwright errors carry a long "Call log:"; the first lines say what happened, its
    # last line where a wait was stuck.
    head, _, log = text.partition("\nCall log:")
    last = [line.strip() for line in log.strip().splitlines() if line.strip()][-1:]
    return (head.strip()[:500] + (f" (last: {last[0][:200]})" if last else "")).strip()


class Worker:
    """Runs submitted calls one at a time on the thread that calls ``run``."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[tuple[Any, tuple[Any, ...], concurrent.futures.Future[Any]] | None]
        self.jobs = queue.Queue()

    def submit(self, fn: Any, *args: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.jobs.put((fn, args, future))
        return future.result(timeout=REQUEST_TIMEOUT_S)

    def stop(self) -> None:
        self.jobs.put(None)

    def run(self) -> None:
        while True:
            item = self.jobs.get()
            if item is None:
                return
            fn, args, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)


class _Routes:
    """The POST routes: each takes the request's JSON body and returns the JSON answer."""

    def __init__(self, env: BrowserEnv) -> None:
        self.env = env

    def table(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {
            "/reset": self.reset,
            "/step": self.step,
            "/observe": self.observe,
            "/evaluate": self.evaluate,
        }

    def _observation(self, body: dict[str, Any]) -> dict[str, Any]:
        marks = flag(body, "marks", True)
        return self.env.observe(marks, flag(body, "axtree", False), flag(body, "som", marks))

    def reset(self, body: dict[str, Any]) -> dict[str, Any]:
        url = body.get("url")
        if not isinstance(url, str) or not url:
            raise BadRequest("'url' must be a non-empty string")
        self.env.reset(url)
        return {"observation": self._observation(body)}

    def step(self, body: dict[str, Any]) -> dict[str, Any]:
        action = validate_action(body.get("action"))
        ok, error = True, None
        try:
            self.env.step(action)
        except ActionFailed as exc:
            ok, error = False, str(exc)
        except PlaywrightError as exc:
            ok, error = False, f"{action['action']}: {first_line(exc)}"
        if action["action"] not in ("wait", "done"):
            self.env.settle()
        done = action["action"] == "done"
        return {
            "observation": self._observation(body),
            "ok": ok,
            "error": error,
            "done": done,
            "answer": action.get("answer") if done else None,
        }

    def observe(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"observation": self._observation(body)}

    def evaluate(self, body: dict[str, Any]) -> dict[str, Any]:
        expression = body.get("expression")
        if not isinstance(expression, str) or not expression.strip():
            raise BadRequest("'expression' must be a non-empty string")
        try:
            value = self.env.evaluate(expression)
        except PlaywrightError as exc:
            raise BadRequest(f"evaluate: {first_line(exc)}") from None
        json.dumps(value)  # a value JSON cannot carry is a server error, said now
        return {"value": value}


class _Handler(BaseHTTPRequestHandler):
    """The browser server's HTTP handler; :func:`make_handler` binds it to one browser."""

    protocol_version = "HTTP/1.1"
    env: BrowserEnv
    worker: Worker
    server_ref: list[ThreadingHTTPServer]
    instance: str
    routes: dict[str, Callable[[dict[str, Any]], dict[str, Any]]]

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would flood the job's stderr

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.split("?")[0].rstrip("/") == "/health":
            self._send(
                200, {"ok": True, "browser_version": self.env.version, "instance": self.instance}
            )
        else:
            self._send(404, {"error": f"no route GET {self.path}"})

    def _body(self) -> dict[str, Any] | None:
        """The host's JSON body, or None once a refusal has been sent."""
        # Pages in this browser can POST to 127.0.0.1 too: only a request carrying this
        # run's token as a custom header (which a page cannot send without a CORS
        # preflight, never granted here) and a JSON body is the host's.
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if self.headers.get(TOKEN_HEADER) != self.instance or content_type != "application/json":
            self._send(403, {"error": f"POST needs the {TOKEN_HEADER} header and a JSON body"})
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise BadRequest(f"request body too large ({length} bytes)")
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw.strip() else {}
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
        except (ValueError, BadRequest) as exc:
            self._send(400, {"error": f"bad request body: {exc}"})
            return None
        return body

    def _call(
        self, path: str, route: Callable[[dict[str, Any]], dict[str, Any]], body: dict[str, Any]
    ) -> None:
        try:
            result = self.worker.submit(route, body)
        except BadRequest as exc:
            self._send(400, {"error": str(exc)})
        except ActionFailed as exc:
            self._send(422, {"error": str(exc)})
        except concurrent.futures.TimeoutError:
            self._send(
                504, {"error": f"{path}: the browser did not answer in {REQUEST_TIMEOUT_S:g} s"}
            )
        except Exception as exc:
            traceback.print_exc()
            self._send(500, {"error": f"{path}: {type(exc).__name__}: {first_line(exc)}"})
        else:
            self._send(200, result)

    def do_POST(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        body = self._body()
        if body is None:
            return
        if path == "/close":
            self._send(200, {"ok": True})
            self.worker.stop()
            threading.Thread(target=self.server_ref[0].shutdown, daemon=True).start()
            return
        route = self.routes.get(path)
        if route is None:
            self._send(404, {"error": f"no route POST {self.path}"})
            return
        self._call(path, route, body)


def make_handler(
    env: BrowserEnv, worker: Worker, server_ref: list[ThreadingHTTPServer], instance: str
) -> type:
    """The handler class of one browser server (its browser, worker thread and token)."""
    bound = {
        "env": env,
        "worker": worker,
        "server_ref": server_ref,
        "instance": instance,
        "routes": _Routes(env).table(),
    }
    return type("Handler", (_Handler,), bound)


def flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadRequest(f"{name!r} must be true or false")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Browser environment server (runs in the sandbox)")
    parser.add_argument("--port", type=int, default=9300)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--instance", default="", help="echoed by /health: which start answers")
    args = parser.parse_args(argv)

    started = time.monotonic()
    try:  # bind first: a taken port fails fast, before Chromium starts
        server = ThreadingHTTPServer((args.host, args.port), BaseHTTPRequestHandler)
    except OSError as exc:
        print(f"browser_server: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    env = BrowserEnv(args.chromium, args.width, args.height)
    worker = Worker()
    server.RequestHandlerClass = make_handler(env, worker, [server], args.instance)
    server.daemon_threads = True
    print(
        f"browser_server: Chromium {env.version} up in {time.monotonic() - started:.2f} s; "
        f"listening on {args.host}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        worker.run()
    except KeyboardInterrupt:
        pass
    finally:
        env.close()
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
