"""Task loading, the local sites' checkers and the oracle's plans (pure logic), plus the site
server run on the host and driven over plain HTTP (correct end states score 1, others 0)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard_gui.browser import Mark
from orchard_gui.tasks import (
    CURATED,
    OracleError,
    TaskError,
    WebTask,
    episode_for,
    load_tasks,
    local_tasks,
    miniwob_names,
    oracle_action,
)
from orchard_gui.tasks.episodes import LocalSiteEpisode, MiniWoBEpisode, OnlineEpisode
from orchard_gui.tasks.local import check_answer, check_form, check_order, score_local
from orchard_gui.tasks.miniwob import miniwob_html_dir

fast = pytest.mark.fast

# Records in the published shapes (values shortened).
WEBVOYAGER = [
    {
        "web_name": "Allrecipes",
        "id": "Allrecipes--0",
        "ques": "Provide a recipe for vegetarian lasagna with more than 100 reviews.",
        "web": "https://www.allrecipes.com/",
    },
    {
        "web_name": "Allrecipes",
        "id": "Allrecipes--1",
        "ques": "Find a vegan brownie recipe with at least 4.5 stars.",
        "web": "https://www.allrecipes.com/",
    },
    {
        "web_name": "GitHub",
        "id": "GitHub--3",
        "ques": "Find the latest release of a popular Python web framework.",
        "web": "https://github.com/",
    },
]
WEBVOYAGER_ANSWERS = {
    "Allrecipes": {
        "notice": "",
        "answers": [
            {"id": 0, "type": "possible", "ans": "Vegetarian Four Cheese Lasagna"},
            {"id": 1, "type": "golden", "ans": "Fudgy Vegan Brownies"},
        ],
    },
    "GitHub": {"answers": []},
}
DEEPSHOP = [
    {
        "web_name": "Amazon",
        "id": "Amazon--14",
        "ques": "Find the new surge protector on Amazon with 6 to 8 outlets under 25 dollars with customer reviews above 4+ stars.",
        "web": "https://www.amazon.com/?language=en_US&currency=USD",
        "attribute": "New surge protector with 6 to 8 outlets under 25 dollars",
        "filter": "Surge protector with customer reviews above 4+ stars",
        "sort": "None",
        "category": "Electronics",
        "difficulty": "easy",
    },
    {
        "web_name": "Amazon",
        "id": "Amazon--300",
        "ques": "Locate a green Xbox Wireless controller rated 4.5+ stars, cheapest with free shipping.",
        "web": "https://www.amazon.com/?language=en_US&currency=USD",
        "attribute": "Green Xbox Wireless controller",
        "filter": "rated above 4.5 stars",
        "sort": "sorted by lowest price",
        "category": "Electronics",
        "difficulty": "medium",
    },
]
MIND2WEB = [
    {
        "task_id": "ade4c09ad3fdb1607209750924cd232f",
        "confirmed_task": "Compare the prices of the two cheapest flights from NYC to LA next Friday.",
        "website": "https://www.kayak.com/",
        "reference_length": 9,
        "level": "medium",
    },
    {
        "task_id": "1b6a5e4c2f0b0f3a9d8e7c6b5a4f3e2d",
        "confirmed_task": "Find the opening hours of the nearest library.",
        "website": "https://www.nypl.org/",
        "reference_length": 4,
        "level": "easy",
    },
]


def _jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ------------------------------------------------------------------ loaders


@fast
def test_offline_sets() -> None:
    offline = load_tasks("offline")
    assert len(offline) == len(local_tasks()) + len(CURATED) == 16
    assert len({t.task_id for t in offline}) == len(offline)
    assert all(t.offline and t.start_url.startswith("http://127.0.0.1:8000/") for t in offline)
    assert {t.source for t in offline} == {"local", "miniwob"}
    assert all(t.instruction for t in offline if t.source == "local")
    assert all(t.instruction == "" for t in offline if t.source == "miniwob")
    assert [t.website for t in load_tasks("local:shop")] == ["shop"] * 3
    assert len(load_tasks("miniwob")) == len(CURATED)
    assert len(miniwob_names()) == 130


@fast
def test_miniwob_specs() -> None:
    tasks = load_tasks("miniwob:click-button@3,enter-text*2,focus-text@5*2")
    assert [t.task_id for t in tasks] == [
        "miniwob-click-button-s3",
        "miniwob-enter-text-s0",
        "miniwob-enter-text-s1",
        "miniwob-focus-text-s5",
        "miniwob-focus-text-s6",
    ]
    assert tasks[0].extra == {"miniwob_task": "click-button", "seed": 3}
    assert tasks[0].start_url == "http://127.0.0.1:8000/miniwob/miniwob/click-button.html"
    with pytest.raises(TaskError, match="no MiniWoB"):
        load_tasks("miniwob:click-buton")
    with pytest.raises(TaskError, match="NAME"):
        load_tasks("miniwob:click-button@x")
    with pytest.raises(TaskError, match="no local site"):
        load_tasks("local:bank")


@fast
def test_webvoyager_with_answers(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "WebVoyager_data.jsonl", WEBVOYAGER)
    answers = tmp_path / "reference_answer.json"
    answers.write_text(json.dumps(WEBVOYAGER_ANSWERS))
    tasks = load_tasks(path, answers=answers)
    assert [t.task_id for t in tasks] == ["Allrecipes--0", "Allrecipes--1", "GitHub--3"]
    first = tasks[0]
    assert first.source == "webvoyager" and first.website == "Allrecipes"
    assert first.start_url == "https://www.allrecipes.com/" and not first.offline
    assert first.instruction.startswith("Provide a recipe")
    assert first.reference_answer == "Vegetarian Four Cheese Lasagna"
    assert first.extra["answer_type"] == "possible"
    assert tasks[1].extra["answer_type"] == "golden"
    assert tasks[2].reference_answer is None
    assert load_tasks(str(path))[0].reference_answer is None
    assert isinstance(episode_for(first), OnlineEpisode)


@fast
def test_deepshop_jsonl_and_json(tmp_path: Path) -> None:
    for path in (_jsonl(tmp_path / "deepshop.jsonl", DEEPSHOP), tmp_path / "deepshop.json"):
        if path.suffix == ".json":
            path.write_text(json.dumps(DEEPSHOP, indent=2))
        tasks = load_tasks(path)
        assert [t.source for t in tasks] == ["deepshop", "deepshop"]
        assert [t.level for t in tasks] == ["easy", "medium"]
        assert tasks[0].website == "Amazon" and tasks[0].extra["category"] == "Electronics"
        assert tasks[1].extra["sort"] == "sorted by lowest price"


@fast
def test_online_mind2web(tmp_path: Path) -> None:
    path = tmp_path / "Online_Mind2Web.json"
    path.write_text(json.dumps(MIND2WEB))
    tasks = load_tasks(path)
    assert tasks[0].task_id == MIND2WEB[0]["task_id"]
    assert tasks[0].instruction.startswith("Compare the prices")
    assert tasks[0].start_url == "https://www.kayak.com/" and tasks[0].website == "www.kayak.com"
    assert tasks[0].level == "medium" and tasks[0].extra["reference_length"] == 9
    assert tasks[0].source == "online-mind2web"


@fast
def test_webtask_roundtrip(tmp_path: Path) -> None:
    originals = load_tasks("offline")
    path = _jsonl(tmp_path / "tasks.jsonl", [t.to_dict() for t in originals])
    assert load_tasks(path) == originals
    assert WebTask.from_dict(originals[0].to_dict()) == originals[0]
    with pytest.raises(TaskError, match="unknown field"):
        WebTask.from_dict({**originals[0].to_dict(), "instuction": "x"})


@fast
def test_bad_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="neither a task set"):
        load_tasks(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TaskError, match="empty"):
        load_tasks(empty)
    unknown = _jsonl(tmp_path / "unknown.jsonl", [{"question": "x", "url": "y"}])
    with pytest.raises(TaskError, match="unknown task record shape"):
        load_tasks(unknown)
    mixed = _jsonl(tmp_path / "mixed.jsonl", [WEBVOYAGER[0], MIND2WEB[0]])
    with pytest.raises(TaskError, match="record 2"):
        load_tasks(mixed)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(WEBVOYAGER[0]) + "\n{not json\n")
    with pytest.raises(TaskError, match="line 2"):
        load_tasks(broken)
    dup = _jsonl(tmp_path / "dup.jsonl", [WEBVOYAGER[0], WEBVOYAGER[0]])
    with pytest.raises(TaskError, match="duplicate task id"):
        load_tasks(dup)
    blank = _jsonl(tmp_path / "blank.jsonl", [{**WEBVOYAGER[0], "ques": " "}])
    with pytest.raises(TaskError, match="'ques'"):
        load_tasks(blank)
    mind = tmp_path / "m.json"
    mind.write_text(json.dumps(MIND2WEB))
    with pytest.raises(TaskError, match="WebVoyager files only"):
        load_tasks(mind, answers=mind)


# ------------------------------------------------------------------ checkers


@fast
def test_check_answer() -> None:
    assert check_answer(48210, "The population is 48,210.") == 1.0
    assert check_answer(48210, "48210") == 1.0
    assert check_answer(48210, "3,120") == 0.0
    assert check_answer(1304, "Founded in 1304") == 1.0
    assert check_answer("Orla Fenwick", "the mayor is orla  FENWICK") == 1.0
    assert check_answer("Orla Fenwick", "Tobias Quill") == 0.0
    assert check_answer("Orla Fenwick", None) == 0.0
    assert check_answer("Orla Fenwick", "Orla Fenwick " + "x" * 300) == 0.0


@fast
def test_check_form_and_order() -> None:
    expected = {
        "full_name": "Mira Okafor",
        "email": "m@x.org",
        "plot": "Medium",
        "watering": "Evening",
        "agree": True,
    }
    state: dict[str, Any] = {"garden": {"submissions": []}}
    assert check_form(expected, state) == 0.0
    state["garden"]["submissions"] = [{**expected, "full_name": " mira okafor "}]
    assert check_form(expected, state) == 1.0
    state["garden"]["submissions"] = [{**expected, "plot": "Large"}]
    assert check_form(expected, state) == 0.0
    state["garden"]["submissions"] = [expected, expected]
    assert check_form(expected, state) == 0.0

    order = {
        "items": {"trowel-ash": 1, "tray-seed": 1},
        "name": "Ada Moss",
        "address": "9 Hill Street",
        "city": "Norcombe",
        "shipping": "Standard",
    }
    shop: dict[str, Any] = {"shop": {"orders": []}}
    assert check_order(order, shop) == 0.0
    shop["shop"]["orders"] = [{**order, "total_cents": 2540}]
    assert check_order(order, shop) == 1.0
    shop["shop"]["orders"] = [{**order, "items": {"trowel-ash": 1}}]
    assert check_order(order, shop) == 0.0
    shop["shop"]["orders"] = [{**order, "shipping": "Express"}]
    assert check_order(order, shop) == 0.0


# ------------------------------------------------------------------ oracle


def _mark(i: int, role: str, name: str, y: float = 0.0) -> Mark:
    return Mark(id=i, tag="x", role=role, name=name, x=10.0, y=y, width=100.0, height=20.0)


@fast
def test_oracle_local_plan() -> None:
    task = next(t for t in local_tasks() if t.task_id == "local-gazetteer-population")
    home = [_mark(1, "link", "Home"), _mark(2, "searchbox", "Search towns", y=100)]
    act = oracle_action(task, task.instruction, task.start_url, home, [])
    assert act == {"action": "click", "x": 60.0, "y": 110.0}
    act = oracle_action(task, task.instruction, task.start_url, home, [act])
    assert act == {"action": "type", "text": "Varnholm", "submit": True}
    results = [_mark(1, "link", "Varnholm Ferry", y=50), _mark(2, "link", "Varnholm", y=80)]
    act = oracle_action(task, task.instruction, "", results, [{}, {}])
    assert act["y"] == 90.0
    page = [_mark(1, "generic", "Region Upper Vale"), _mark(2, "generic", "Population 48,210")]
    act = oracle_action(task, task.instruction, "", page, [{}, {}, {}])
    assert act == {"action": "done", "answer": "48,210"}
    assert check_answer(48210, act["answer"]) == 1.0
    with pytest.raises(OracleError, match="no mark"):
        oracle_action(task, task.instruction, "", [_mark(1, "link", "Home")], [{}, {}])


@fast
def test_oracle_miniwob_plans() -> None:
    task = load_tasks("miniwob:click-checkboxes")[0]
    marks = [
        _mark(1, "checkbox", "ab"),
        _mark(2, "checkbox", "cd", 30),
        _mark(3, "button", "Submit", 60),
    ]
    said = "Select cd and click Submit."
    assert oracle_action(task, said, "", marks, [])["y"] == 40.0
    assert oracle_action(task, said, "", marks, [{}])["y"] == 70.0
    assert oracle_action(task, said, "", marks, [{}, {}]) == {"action": "done"}
    assert oracle_action(task, "Select nothing and click Submit.", "", marks, [])["y"] == 70.0
    login = load_tasks("miniwob:login-user")[0]
    said = 'Enter the username "kasey" and the password "x7" into the text fields and press login.'
    boxes = [
        _mark(2, "textbox", "", 50),
        _mark(1, "textbox", "", 10),
        _mark(3, "button", "Login", 90),
    ]
    steps = []
    for _ in range(6):
        steps.append(oracle_action(login, said, "", boxes, steps))
    assert [s.get("y") or s.get("text") for s in steps[:5]] == [20.0, "kasey", 60.0, "x7", 100.0]
    assert steps[5] == {"action": "done"}
    with pytest.raises(OracleError, match="cannot parse"):
        oracle_action(login, "Do something else.", "", boxes, [])
    other = load_tasks("miniwob:book-flight")[0]
    with pytest.raises(OracleError, match="no scripted plan"):
        oracle_action(other, "Book a flight.", "", boxes, [])


@fast
def test_episode_kinds() -> None:
    kinds = {type(episode_for(t)) for t in load_tasks("offline")}
    assert kinds == {LocalSiteEpisode, MiniWoBEpisode}


# ------------------------------------------------------------------ the site server over HTTP


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    root = tmp_path_factory.mktemp("site")
    src = Path(__file__).parents[1] / "src" / "orchard_gui" / "tasks" / "site"
    for name in ("site_server.py", "data.json"):
        (root / name).write_bytes((src / name).read_bytes())
    (root / "miniwob").symlink_to(miniwob_html_dir())
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(root / "site_server.py"), "--port", str(port), "--root", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                if client.get("/__health").status_code == 200:
                    break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


def _state(site: httpx.Client) -> dict[str, Any]:
    state: dict[str, Any] = site.get("/__state").json()
    return state


def _solve_over_http(site: httpx.Client, task: WebTask) -> str | None:
    """Reach the task's correct end state with plain HTTP requests; returns the answer."""
    expected = task.extra["expected"]
    if task.extra["checker"] == "answer":
        return str(expected)
    if task.extra["checker"] == "form":
        form = {k: v for k, v in expected.items() if k != "agree"} | {"agree": "yes"}
        assert site.post("/sites/garden/apply", data=form).status_code == 303
        return None
    for sku, qty in expected["items"].items():
        assert site.post("/sites/shop/cart/add", data={"sku": sku, "qty": qty}).status_code == 303
    fields = {k: expected[k] for k in ("name", "address", "city", "shipping")}
    response = site.post("/sites/shop/checkout", data=fields)
    assert response.status_code == 303 and "/sites/shop/order/" in response.headers["location"]
    return None


@pytest.mark.integration
@pytest.mark.parametrize("task", local_tasks(), ids=lambda t: t.task_id)
def test_local_checker_end_states(site: httpx.Client, task: WebTask) -> None:
    site.post("/__reset")
    assert score_local(task, _state(site), None) == 0.0  # untouched
    answer = _solve_over_http(site, task)
    assert score_local(task, _state(site), answer) == 1.0
    if task.extra["checker"] != "answer":
        _solve_over_http(site, task)  # doing it twice (a second application/order) is wrong
        assert score_local(task, _state(site), answer) == 0.0


@pytest.mark.integration
def test_site_validation_and_pages(site: httpx.Client) -> None:
    site.post("/__reset")
    bad = site.post("/sites/garden/apply", data={"full_name": "A", "email": "nope"})
    assert bad.status_code == 200 and "Enter a valid email address." in bad.text
    assert "You must agree to the garden rules." in bad.text
    assert _state(site)["garden"] == {"submissions": [], "rejected": 1}
    site.post("/sites/shop/cart/add", data={"sku": "can-zinc", "qty": "1"})
    bad = site.post("/sites/shop/checkout", data={"name": "A"})
    assert "City is required." in bad.text and _state(site)["shop"]["orders"] == []
    q = urllib.parse.urlencode({"q": "varnholm"})
    results = site.get(f"/sites/gazetteer/search?{q}").text
    assert ">Varnholm</a>" in results and ">Varnholm Ferry</a>" in results
    town = site.get("/sites/gazetteer/town/varnholm").text
    assert "<th>Population</th><td>48,210</td>" in town
    assert site.get("/miniwob/miniwob/click-button.html").status_code == 200
    assert site.get("/miniwob/../site_server.py").status_code == 404
    assert site.get("/sites/shop/product/nope").status_code == 404
