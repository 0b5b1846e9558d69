"""The local sites' tasks and their checkers (pure functions of the site state and the answer).

Three sites, served inside the sandbox by ``site/site_server.py`` (content in
``site/data.json``): the *Riverlands Gazetteer* (search -> results -> town page; the task asks
for one fact, the answer is checked against the data), *Northbank Community Gardens* (a
validated form; the one accepted submission must equal the expected record) and *Greenhand
Garden Supply* (catalogue -> product -> cart -> checkout; the one order placed must have the
expected items, name, address and shipping). Three tasks per site, each with near-duplicate
distractors (``Varnholm`` / ``Varnholm Ferry``, ``Copper Watering Can`` / ``... (Large)``).

Each task's ``extra`` holds ``checker`` (``"answer"``, ``"form"`` or ``"order"``),
``expected`` (what the checker compares) and ``plan`` (the scripted oracle's abstract steps,
see ``oracle.py``).
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

from orchard_gui.tasks.schema import TaskError, WebTask

__all__ = [
    "SITE_BASE",
    "SITE_PORT",
    "check_answer",
    "check_form",
    "check_order",
    "local_tasks",
    "score_local",
    "site_data",
]

SITE_PORT = 8000
"""The port of the offline site server inside the sandbox."""
SITE_BASE = f"http://127.0.0.1:{SITE_PORT}"
"""The site server's address as the browser inside the sandbox sees it."""


@functools.cache
def site_data() -> dict[str, Any]:
    """The sites' content (``site/data.json``), as the server inside the sandbox reads it."""
    text = resources.files("orchard_gui.tasks").joinpath("site/data.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _town(slug: str) -> dict[str, Any]:
    for town in site_data()["gazetteer"]["towns"]:
        if town["slug"] == slug:
            return dict(town)
    raise KeyError(slug)


def _product_name(sku: str) -> str:
    for product in site_data()["shop"]["products"]:
        if product["sku"] == sku:
            return str(product["name"])
    raise KeyError(sku)


# (task suffix, town slug, field shown on the page, data key, question)
_GAZETTEER = [
    (
        "population",
        "varnholm",
        "Population",
        "population",
        "What is the population of Varnholm? Answer with the number.",
    ),
    (
        "founded",
        "estmere",
        "Founded",
        "founded",
        "In what year was Estmere founded? Answer with the year.",
    ),
    (
        "mayor",
        "dunmarrow",
        "Mayor",
        "mayor",
        "Who is the mayor of Dunmarrow? Answer with the full name.",
    ),
]

_GARDEN: list[dict[str, Any]] = [
    {
        "full_name": "Mira Okafor",
        "email": "mira.okafor@example.org",
        "plot": "Medium",
        "watering": "Evening",
    },
    {
        "full_name": "Jonas Whitlow",
        "email": "j.whitlow@example.net",
        "plot": "Small",
        "watering": "Morning",
    },
    {
        "full_name": "Priya Castellan",
        "email": "priya@castellan.example",
        "plot": "Large",
        "watering": "Evening",
    },
]

_SHOP: list[dict[str, Any]] = [
    {
        "items": {"can-copper": 1},
        "name": "Lena Brandt",
        "address": "12 Mill Lane",
        "city": "Eastwick",
        "shipping": "Standard",
    },
    {
        "items": {"apron-linen": 2},
        "name": "Tomas Reyes",
        "address": "4 Harbour Road",
        "city": "Saltby",
        "shipping": "Express",
    },
    {
        "items": {"trowel-ash": 1, "tray-seed": 1},
        "name": "Ada Moss",
        "address": "9 Hill Street",
        "city": "Norcombe",
        "shipping": "Standard",
    },
]

_NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


def _gazetteer_tasks() -> list[WebTask]:
    title = site_data()["gazetteer"]["title"]
    tasks = []
    for suffix, slug, label, key, question in _GAZETTEER:
        town = _town(slug)
        tasks.append(
            WebTask(
                task_id=f"local-gazetteer-{suffix}",
                instruction=f"Using the {title}, answer: {question}",
                start_url=f"{SITE_BASE}/sites/gazetteer/",
                source="local",
                website="gazetteer",
                reference_answer=str(town[key]),
                level="easy",
                offline=True,
                extra={
                    "checker": "answer",
                    "expected": town[key],
                    "plan": [
                        {"op": "click", "role": "searchbox", "name": "Search towns"},
                        {"op": "type", "text": town["name"], "submit": True},
                        {"op": "click", "role": "link", "name": town["name"]},
                        {"op": "answer_from_mark", "prefix": label},
                    ],
                },
            )
        )
    return tasks


def _garden_tasks() -> list[WebTask]:
    title = site_data()["garden"]["title"]
    tasks = []
    for i, record in enumerate(_GARDEN, start=1):
        instruction = (
            f"On the {title} website, apply for a garden plot for {record['full_name']} "
            f"(email {record['email']}): a {record['plot'].lower()} plot with the "
            f"{record['watering'].lower()} watering slot. Accept the garden rules and submit "
            "the application."
        )
        plan: list[dict[str, Any]] = [
            {"op": "click", "role": "textbox", "name": "Full name"},
            {"op": "type", "text": record["full_name"]},
            {"op": "click", "role": "textbox", "name": "Email"},
            {"op": "type", "text": record["email"]},
            {"op": "click", "role": "radio", "name": record["plot"]},
            {"op": "click", "role": "radio", "name": record["watering"]},
            {"op": "click", "role": "checkbox", "name": "I agree to the garden rules"},
            {"op": "click", "role": "button", "name": "Submit application"},
            {"op": "done"},
        ]
        tasks.append(
            WebTask(
                task_id=f"local-garden-{i}",
                instruction=instruction,
                start_url=f"{SITE_BASE}/sites/garden/",
                source="local",
                website="garden",
                level="easy",
                offline=True,
                extra={"checker": "form", "expected": {**record, "agree": True}, "plan": plan},
            )
        )
    return tasks


def _shop_tasks() -> list[WebTask]:
    title = site_data()["shop"]["title"]
    tasks = []
    for i, order in enumerate(_SHOP, start=1):
        items: dict[str, int] = order["items"]
        wanted = " and ".join(
            f"{_NUMBER_WORDS[qty]} {_product_name(sku)}{'s' if qty > 1 else ''}"
            for sku, qty in items.items()
        )
        instruction = (
            f"On {title}, buy {wanted} with {order['shipping'].lower()} shipping, delivered to "
            f"{order['name']}, {order['address']}, {order['city']}. Place the order."
        )
        plan: list[dict[str, Any]] = []
        for n, (sku, qty) in enumerate(items.items()):
            if n:
                plan.append({"op": "click", "role": "link", "name": "Continue shopping"})
            plan.append({"op": "click", "role": "link", "name": _product_name(sku)})
            if qty != 1:
                plan += [
                    {"op": "click", "role": "spinbutton", "name": "Quantity"},
                    {"op": "keys", "keys": ["Control", "a"]},
                    {"op": "type", "text": str(qty)},
                ]
            plan.append({"op": "click", "role": "button", "name": "Add to cart"})
        plan += [
            {"op": "click", "role": "link", "name": "Proceed to checkout"},
            {"op": "click", "role": "textbox", "name": "Full name"},
            {"op": "type", "text": order["name"]},
            {"op": "click", "role": "textbox", "name": "Street address"},
            {"op": "type", "text": order["address"]},
            {"op": "click", "role": "textbox", "name": "City"},
            {"op": "type", "text": order["city"]},
            {"op": "click", "role": "radio", "name": f"{order['shipping']} shipping"},
            {"op": "click", "role": "button", "name": "Place order"},
            {"op": "done"},
        ]
        tasks.append(
            WebTask(
                task_id=f"local-shop-{i}",
                instruction=instruction,
                start_url=f"{SITE_BASE}/sites/shop/",
                source="local",
                website="shop",
                level="medium",
                offline=True,
                extra={"checker": "order", "expected": order, "plan": plan},
            )
        )
    return tasks


def local_tasks(site: str | None = None) -> list[WebTask]:
    """The local sites' tasks (all nine, or one site's: ``gazetteer``, ``garden``, ``shop``)."""
    tasks = _gazetteer_tasks() + _garden_tasks() + _shop_tasks()
    if site is None:
        return tasks
    chosen = [t for t in tasks if t.website == site]
    if not chosen:
        raise TaskError(f"no local site {site!r}; known: gazetteer, garden, shop")
    return chosen


# ------------------------------------------------------------------ checkers


def _norm(text: Any) -> str:
    return re.sub(r"\s+", " ", str(text)).strip().casefold()


def check_answer(expected: Any, answer: str | None) -> float:
    """1.0 if the answer states the expected value, else 0.0.

    Numbers: some number in the answer (thousands separators allowed) equals the expected
    one. Text: the expected text occurs in the answer (case and spacing ignored). An answer
    longer than 200 characters scores 0: listing every candidate is not an answer.
    """
    if not answer or len(answer) > 200:
        return 0.0
    if isinstance(expected, int | float) and not isinstance(expected, bool):
        numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", answer)
        values = []
        for n in numbers:
            try:
                values.append(float(n.replace(",", "")))
            except ValueError:
                continue
        return 1.0 if float(expected) in values else 0.0
    return 1.0 if _norm(expected) in _norm(answer) else 0.0


def check_form(expected: dict[str, Any], state: dict[str, Any]) -> float:
    """1.0 if exactly one application was accepted and it equals ``expected`` (text fields
    compared ignoring case and surrounding spaces), else 0.0."""
    submissions = state.get("garden", {}).get("submissions", [])
    if len(submissions) != 1:
        return 0.0
    got = submissions[0]
    same = all(
        (_norm(got.get(k)) == _norm(v)) if isinstance(v, str) else got.get(k) == v
        for k, v in expected.items()
    )
    return 1.0 if same else 0.0


def check_order(expected: dict[str, Any], state: dict[str, Any]) -> float:
    """1.0 if exactly one order was placed with exactly the expected items and quantities,
    name, address, city and shipping (text ignoring case and spacing), else 0.0."""
    orders = state.get("shop", {}).get("orders", [])
    if len(orders) != 1:
        return 0.0
    got = orders[0]
    if dict(got.get("items", {})) != dict(expected["items"]):
        return 0.0
    fields = ("name", "address", "city", "shipping")
    return 1.0 if all(_norm(got.get(k, "")) == _norm(expected[k]) for k in fields) else 0.0


def score_local(task: WebTask, state: dict[str, Any], answer: str | None) -> float:
    """The reward of a local-site task from the site server's ``/__state`` and the answer."""
    checker = task.extra.get("checker")
    expected = task.extra.get("expected")
    if checker == "answer":
        return check_answer(expected, answer)
    if checker == "form" and isinstance(expected, dict):
        return check_form(expected, state)
    if checker == "order" and isinstance(expected, dict):
        return check_order(expected, state)
    raise TaskError(f"task {task.task_id}: unknown checker {checker!r} (or no expectation)")
