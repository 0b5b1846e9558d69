"""Tool-chain templates over the in-sandbox records API: assign tickets by the on-call
roster; sync contacts from a CRM export; weather lookups that post trip reminders."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from orchard_claw.tasks.checkers import Checks, FinalState, register_checker
from orchard_claw.tasks.schema import CheckResult, ClawTask, Service
from orchard_claw.tasks.templates.common import (
    FIRST_NAMES,
    http_calls,
    jdump,
    register_template,
    write_file,
)

PORT = 8765


def api_docs(port: int, collections: dict[str, list[str]]) -> str:
    """What the agent reads about the service (``/workspace/API.md``)."""
    lines = [
        f"# Local API at http://127.0.0.1:{port}",
        "",
        "JSON in, JSON out. Collections and their fields:",
        "",
        *[f"- `/{name}`: {', '.join(fields)}" for name, fields in collections.items()],
        "",
        "- `GET /<collection>` lists records; `?field=value` filters (exact match).",
        "- `GET /<collection>/<id>` one record; `PATCH` updates the given fields; `PUT` "
        "replaces; `DELETE` removes.",
        "- `POST /<collection>` with a JSON object creates a record (the id is assigned).",
    ]
    return "\n".join(lines) + "\n"


def _service(name: str, collections: dict[str, list[dict[str, Any]]]) -> Service:
    fields = {c: sorted({k for r in recs for k in r}) or ["id"] for c, recs in collections.items()}
    if "reminders" in fields:
        fields["reminders"] = ["id", "date", "city", "text"]
    return Service(name=name, port=PORT, collections=collections, docs=api_docs(PORT, fields))


def _records(state: FinalState, collection: str) -> list[dict[str, Any]] | None:
    if state.service is None:
        return None
    records = state.service.get(collection)
    return records if isinstance(records, list) else None


COMPONENTS = ("billing", "search", "auth", "mobile", "payments")
TICKET_TITLES = (
    "Login page slow",
    "Outage in EU region",
    "Wrong totals on invoice",
    "Crash when uploading photo",
    "Data loss after sync",
    "Typo in settings",
    "Password reset mail missing",
    "Timeout on export",
    "Dark mode colours off",
    "Search returns duplicates",
    "Refund stuck in pending",
    "Push notifications late",
)


@register_template(
    "tickets_oncall", "tool_chain", "assign open tickets via the API by on-call roster"
)
def tickets_oncall(rng: random.Random, task_id: str) -> ClawTask:
    """Open tickets to assign by component and roster, with priorities raised by keyword."""
    components = rng.sample(COMPONENTS, 4)
    roster = dict(zip(components, rng.sample(FIRST_NAMES, 4), strict=True))
    tickets: list[dict[str, Any]] = []
    for n, title in enumerate(rng.sample(TICKET_TITLES, 10)):
        status = "closed" if n % 5 == 4 else "open"
        assignee = rng.choice(FIRST_NAMES) if n % 4 == 3 else None
        tickets.append(
            {
                "id": 40 + n * 3,
                "title": title,
                "component": rng.choice(components),
                "status": status,
                "priority": rng.choice(("low", "normal")),
                "assignee": assignee,
            }
        )
    final = {t["id"]: dict(t) for t in tickets}
    calls = []
    assigned: dict[str, str] = {}
    for t in tickets:
        if t["status"] == "open" and t["assignee"] is None:
            change: dict[str, Any] = {"assignee": roster[t["component"]]}
            if any(w in t["title"].lower() for w in ("outage", "data loss")):
                change["priority"] = "high"
            final[t["id"]].update(change)
            calls.append(("PATCH", f"/tickets/{t['id']}", change))
            assigned[str(t["id"])] = roster[t["component"]]
    roster_md = "# On-call this week\n\n| component | on call |\n|---|---|\n" + "".join(
        f"| {c} | {p} |\n" for c, p in roster.items()
    )
    script = http_calls(PORT, calls) + write_file(
        "/workspace/notes/assigned.md", "".join(f"- #{i} {p}\n" for i, p in assigned.items())
    )
    return ClawTask(
        id=task_id,
        kind="tool_chain",
        instruction=(
            "Our ticket tracker's API runs at http://127.0.0.1:8765 (see /workspace/API.md). "
            "Assign every open ticket that has no assignee to the person on call for its "
            'component (/workspace/notes/oncall.md), and set priority "high" on those of them '
            "whose title mentions an outage or data loss. Leave other tickets alone. Then write "
            "/workspace/notes/assigned.md with one line per ticket you assigned: '- #<id> <name>'."
        ),
        files={"notes/oncall.md": roster_md},
        service=_service("tickets", {"tickets": tickets}),
        checker="tickets_oncall",
        expect={"tickets": list(final.values()), "assigned": assigned},
        reference=script,
    )


@register_checker("tickets_oncall")
def check_tickets(task: ClawTask, state: FinalState) -> CheckResult:
    """Every ticket in its expected final state; the note lists the assignments."""
    checks = Checks()
    got = _records(state, "tickets")
    if not checks.add(got is not None, "the ticket service answers"):
        return checks.result()
    assert got is not None
    by_id = {t.get("id"): t for t in got}
    for want in task.expect["tickets"]:
        have = by_id.get(want["id"], {})
        checks.add(
            all(have.get(k) == want[k] for k in ("status", "assignee", "priority", "title")),
            f"ticket {want['id']}: {want['status']}, {want['assignee']}, {want['priority']}",
        )
    checks.add(len(got) == len(task.expect["tickets"]), "no ticket created or deleted")
    note = state.text("notes/assigned.md") or ""
    lines = note.splitlines()
    for tid, person in sorted(task.expect["assigned"].items()):
        checks.add(
            any(f"#{tid}" in ln and person in ln for ln in lines), f"assigned.md: #{tid} {person}"
        )
    return checks.result()


COMPANIES = ("Globex", "Initech", "Umbrella", "Hooli", "Vandelay", "Soylent")


def _phone(rng: random.Random) -> str:
    return f"+1-555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}"


@register_template("contacts_sync", "tool_chain", "sync a CRM export into the contacts API")
def contacts_sync(rng: random.Random, task_id: str) -> ClawTask:
    """A CRM export to merge into the contacts service: new, changed (one in other case), same."""
    people = rng.sample(FIRST_NAMES, 13)
    contacts: list[dict[str, Any]] = []
    for n, first in enumerate(people[:10]):
        contacts.append(
            {
                "id": n + 1,
                "name": f"{first} {rng.choice('KLMNPRST')}.",
                "email": f"{first.lower()}@{rng.choice(COMPANIES).lower()}.test",
                "phone": _phone(rng),
                "company": rng.choice(COMPANIES),
            }
        )
    export: list[dict[str, Any]] = []
    same, changed = contacts[:3], contacts[3:6]
    for c in same:
        export.append({k: c[k] for k in ("name", "email", "phone", "company")})
    updated: list[str] = []
    for i, c in enumerate(changed):
        email = c["email"].upper() if i == 0 else c["email"]  # matches case-insensitively
        export.append(dict(name=c["name"], email=email, phone=_phone(rng), company=c["company"]))
        updated.append(c["email"])
    created: list[str] = []
    for first in people[10:]:
        row = {
            "name": f"{first} Q.",
            "email": f"{first.lower()}@newco.test",
            "phone": _phone(rng),
            "company": "NewCo",
        }
        export.append(row)
        created.append(row["email"])
    rng.shuffle(export)
    final = {c["email"]: dict(c) for c in contacts}
    calls: list[tuple[str, str, Any]] = []
    for row in export:
        key = row["email"].lower()
        if key in final:
            if final[key]["phone"] != row["phone"]:
                final[key]["phone"] = row["phone"]
                calls.append(("PATCH", f"/contacts/{final[key]['id']}", {"phone": row["phone"]}))
        else:
            final[key] = dict(row)
            calls.append(("POST", "/contacts", row))
    report = {"created": sorted(created), "updated": sorted(updated)}
    csv_text = "name,email,phone,company\n" + "".join(
        f"{r['name']},{r['email']},{r['phone']},{r['company']}\n" for r in export
    )
    script = http_calls(PORT, calls) + write_file("/workspace/data/sync_report.json", jdump(report))
    return ClawTask(
        id=task_id,
        kind="tool_chain",
        instruction=(
            "Sync /workspace/data/crm_export.csv into our contacts service at "
            "http://127.0.0.1:8765 (see /workspace/API.md). Contacts match by email, ignoring "
            "case. Create the contacts that are missing, update the phone number of those "
            "whose phone differs, and create no duplicates. Then write "
            '/workspace/data/sync_report.json as {"created": [...], "updated": [...]} with '
            "the emails (lower case, sorted) of the contacts you created and updated."
        ),
        files={"data/crm_export.csv": csv_text},
        service=_service("contacts", {"contacts": contacts}),
        checker="contacts_sync",
        expect={"contacts": sorted(final.values(), key=lambda c: c["email"]), "report": report},
        reference=script,
    )


@register_checker("contacts_sync")
def check_contacts(task: ClawTask, state: FinalState) -> CheckResult:
    """The service holds each expected contact once with the right phone; the report exact."""
    checks = Checks()
    got = _records(state, "contacts")
    if not checks.add(got is not None, "the contacts service answers"):
        return checks.result()
    assert got is not None
    for want in task.expect["contacts"]:
        same = [c for c in got if str(c.get("email", "")).lower() == want["email"]]
        checks.add(
            len(same) == 1 and same[0].get("phone") == want["phone"],
            f"{want['email']} once, phone {want['phone']}",
        )
    checks.add(len(got) == len(task.expect["contacts"]), f"{len(task.expect['contacts'])} contacts")
    report = state.json("data/sync_report.json")
    ok = isinstance(report, dict) and all(
        sorted(str(e).lower() for e in report.get(k) or []) == v
        for k, v in task.expect["report"].items()
    )
    checks.add(ok, f"sync_report.json is {task.expect['report']}")
    return checks.result()


CITIES = ("Oslo", "Lisbon", "Munich", "Krakow", "Dublin", "Vienna", "Seville")
CONDITIONS = {"sunny": 0.0, "cloudy": 0.5, "showers": 6.0, "rain": 14.0, "snow": 8.0}


@register_template("weather_reminders", "tool_chain", "forecast per trip via API, post reminders")
def weather_reminders(rng: random.Random, task_id: str) -> ClawTask:
    """Trips to look up in the weather API; reminders posted back by precipitation and cold."""
    cities = rng.sample(CITIES, 5)
    start = dt.date(2024, 10, 1) + dt.timedelta(days=rng.randint(0, 60))
    forecasts: list[dict[str, Any]] = []
    for city in cities:
        for d in range(7):
            condition = rng.choice(sorted(CONDITIONS))
            high = rng.randint(-2, 6) if condition == "snow" else rng.randint(3, 24)
            precip = round(CONDITIONS[condition] * rng.uniform(0.5, 1.5), 1)
            forecasts.append(
                {
                    "id": len(forecasts) + 1,
                    "city": city,
                    "date": (start + dt.timedelta(days=d)).isoformat(),
                    "condition": condition,
                    "precip_mm": precip,
                    "high_c": high,
                }
            )
    trips = [
        {
            "city": c,
            "date": (start + dt.timedelta(days=rng.randint(0, 6))).isoformat(),
            "purpose": rng.choice(("client visit", "conference", "team offsite", "workshop")),
        }
        for c in cities[:4]
    ]
    # force one wet, one cold and one fine trip so every rule is exercised
    looks = {(f["city"], f["date"]): f for f in forecasts}
    for trip, (cond, precip, high) in zip(
        trips, (("rain", 12.4, 14), ("sunny", 0.0, 4), ("cloudy", 0.3, 17)), strict=False
    ):
        looks[(trip["city"], trip["date"])].update(condition=cond, precip_mm=precip, high_c=high)
    reminders: list[dict[str, Any]] = []
    for trip in trips:
        f = looks[(trip["city"], trip["date"])]
        if f["precip_mm"] >= 5:
            reminders.append(
                {"date": trip["date"], "city": trip["city"], "text": "Pack an umbrella"}
            )
        if f["high_c"] <= 8:
            reminders.append(
                {"date": trip["date"], "city": trip["city"], "text": "Pack a warm coat"}
            )
    table = "| city | date | condition | high |\n|---|---|---|---|\n" + "".join(
        f"| {t['city']} | {t['date']} | {looks[(t['city'], t['date'])]['condition']} | "
        f"{looks[(t['city'], t['date'])]['high_c']} |\n"
        for t in trips
    )
    script = http_calls(PORT, [("POST", "/reminders", r) for r in reminders])
    script += write_file("/workspace/trips_weather.md", table)
    return ClawTask(
        id=task_id,
        kind="tool_chain",
        instruction=(
            "For each trip in /workspace/trips.json, look up that day's forecast for the city "
            "in the weather API at http://127.0.0.1:8765 (see /workspace/API.md). Post a "
            'reminder (POST /reminders with date, city, text) "Pack an umbrella" when '
            'precip_mm is 5 or more, and "Pack a warm coat" when high_c is 8 or less. Then '
            "write /workspace/trips_weather.md: a table with one row per trip giving city, "
            "date, condition and high."
        ),
        files={"trips.json": jdump(trips)},
        service=_service("weather", {"forecasts": forecasts, "reminders": []}),
        checker="weather_reminders",
        expect={
            "reminders": reminders,
            "rows": [
                [t["city"], t["date"], looks[(t["city"], t["date"])]["condition"]] for t in trips
            ],
        },
        reference=script,
    )


@register_checker("weather_reminders")
def check_weather(task: ClawTask, state: FinalState) -> CheckResult:
    """Exactly the expected reminders were posted; the table has each trip's condition."""
    checks = Checks()
    got = _records(state, "reminders")
    if not checks.add(got is not None, "the weather service answers"):
        return checks.result()
    assert got is not None

    def kind(text: Any) -> str:
        low = str(text).lower()
        return "umbrella" if "umbrella" in low else "coat" if "coat" in low else low

    have = sorted((str(r.get("date")), str(r.get("city")), kind(r.get("text"))) for r in got)
    want = sorted((r["date"], r["city"], kind(r["text"])) for r in task.expect["reminders"])
    for item in want:
        checks.add(have.count(item) == 1, f"one reminder {item}")
    checks.add(len(have) == len(want), f"{len(want)} reminders in all")
    lines = (state.text("trips_weather.md") or "").splitlines()
    for city, date, condition in task.expect["rows"]:
        checks.add(
            any(city in ln and date in ln and condition in ln for ln in lines),
            f"the table has {city} {date} {condition}",
        )
    return checks.result()
