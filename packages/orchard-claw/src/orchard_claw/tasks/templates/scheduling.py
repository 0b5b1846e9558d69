"""Scheduling templates: the earliest common slot for three people; booking meeting rooms.

Calendars are JSON (``calendar/<person>.json``: owner, email, working_hours, events with
local ISO times); invites are iCalendar (``calendar/invite.ics``); room bookings are CSV.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from typing import Any

from orchard_claw.tasks.checkers import Checks, FinalState, register_checker
from orchard_claw.tasks.schema import CheckResult, ClawTask
from orchard_claw.tasks.templates.common import (
    FIRST_NAMES,
    first_solvable,
    jdump,
    register_template,
    write_file,
)

STEP = dt.timedelta(minutes=15)
TITLES = ("Project sync", "Budget planning", "Design review", "Retro", "Customer prep")


def _t(day: dt.date, hhmm: str) -> dt.datetime:
    return dt.datetime.combine(day, dt.time.fromisoformat(hhmm))


def _busy(events: list[dict[str, str]]) -> list[tuple[dt.datetime, dt.datetime]]:
    return [
        (dt.datetime.fromisoformat(e["start"]), dt.datetime.fromisoformat(e["end"])) for e in events
    ]


def _fits(start: dt.datetime, end: dt.datetime, calendars: list[dict[str, Any]]) -> list[str]:
    """Why ``start..end`` does not fit (empty: it fits everyone's hours and events)."""
    why = []
    for cal in calendars:
        hours = cal["working_hours"]
        if start < _t(start.date(), hours["start"]) or end > _t(start.date(), hours["end"]):
            why.append(f"outside {cal['owner']}'s working hours")
        for b0, b1 in _busy(cal["events"]):
            if start < b1 and b0 < end:
                why.append(f"clashes with {cal['owner']}'s event at {b0:%H:%M}")
    return why


def _earliest(
    days: list[dt.date], minutes: int, calendars: list[dict[str, Any]]
) -> dt.datetime | None:
    length = dt.timedelta(minutes=minutes)
    for day in days:
        t = _t(day, "07:00")
        while t < _t(day, "19:00"):
            if not _fits(t, t + length, calendars):
                return t
            t += STEP
    return None


@register_template("find_slot", "scheduling", "earliest common slot for three, write the invite")
def find_slot(rng: random.Random, task_id: str) -> ClawTask:
    """Three calendars with different working hours; the earliest common slot over two days."""
    return first_solvable(_find_slot_attempt, rng, task_id)


def _find_slot_attempt(rng: random.Random, task_id: str) -> ClawTask | None:
    monday = dt.date(2024, 5, 13) + dt.timedelta(weeks=rng.randint(0, 6))
    days = [monday + dt.timedelta(days=d) for d in sorted(rng.sample(range(5), 2))]
    minutes = rng.choice((30, 45, 60))
    people = ["Sam", *rng.sample(FIRST_NAMES, 2)]
    calendars: list[dict[str, Any]] = []
    for person in people:
        events: list[dict[str, str]] = []
        for day in days:
            for _ in range(rng.randint(3, 5)):
                start = _t(day, "08:00") + STEP * rng.randint(0, 36)
                end = start + STEP * rng.choice((2, 3, 4, 6))
                events.append(
                    {
                        "title": rng.choice((*TITLES[:4], "Focus time", "1:1", "Lunch")),
                        "start": start.isoformat(timespec="minutes"),
                        "end": end.isoformat(timespec="minutes"),
                    }
                )
        events.sort(key=lambda e: e["start"])
        hours = {
            "start": rng.choice(("08:00", "08:30", "09:00", "10:00")),
            "end": rng.choice(("15:30", "16:00", "17:00", "18:00")),
        }
        calendars.append(
            {
                "owner": person,
                "email": f"{person.lower()}@acme.test",
                "working_hours": hours,
                "events": events,
            }
        )
    best = _earliest(days, minutes, calendars)
    latest_open = max(_t(days[0], c["working_hours"]["start"]) for c in calendars)
    if best is None or best <= latest_open + STEP:
        return None  # no slot, or the first minute of the day: too easy
    title = rng.choice(TITLES)
    end = best + dt.timedelta(minutes=minutes)
    files = {f"calendar/{c['owner'].lower()}.json": jdump(c) for c in calendars}
    ics = "\n".join(
        [
            "BEGIN:VCALENDAR",
            "VERSION:2.0",
            "PRODID:-//orchard-claw//reference//EN",
            "BEGIN:VEVENT",
            f"UID:{task_id}@acme.test",
            f"DTSTART:{best:%Y%m%dT%H%M%S}",
            f"DTEND:{end:%Y%m%dT%H%M%S}",
            f"SUMMARY:{title}",
            *[f"ATTENDEE;CN={c['owner']}:mailto:{c['email']}" for c in calendars[1:]],
            "END:VEVENT",
            "END:VCALENDAR",
        ]
    )
    mine = dict(calendars[0])
    mine["events"] = sorted(
        [
            *calendars[0]["events"],
            {
                "title": title,
                "start": best.isoformat(timespec="minutes"),
                "end": end.isoformat(timespec="minutes"),
            },
        ],
        key=lambda e: e["start"],
    )
    script = write_file("/workspace/calendar/invite.ics", ics) + write_file(
        "/workspace/calendar/sam.json", jdump(mine)
    )
    a, b = people[1], people[2]
    return ClawTask(
        id=task_id,
        kind="scheduling",
        instruction=(
            f"Find the earliest {minutes}-minute slot on {days[0]:%A %d %B %Y} or "
            f"{days[1]:%A %d %B} when {a}, {b} and I are all free and within each person's "
            "working hours (calendars in /workspace/calendar, one JSON file per person; "
            "starts on the quarter hour). Write the invite as /workspace/calendar/invite.ics "
            f'(an iCalendar VEVENT with DTSTART, DTEND, SUMMARY "{title}" and an ATTENDEE '
            f"line with the email of {a} and of {b}) and add the meeting to my calendar, "
            "calendar/sam.json."
        ),
        files=files,
        checker="find_slot",
        expect={
            "start": best.isoformat(timespec="minutes"),
            "minutes": minutes,
            "title": title,
            "attendees": [c["email"] for c in calendars[1:]],
        },
        reference=script,
        rubric="The invite is a valid iCalendar event at the earliest slot everyone can make.",
    )


def _ics_time(ics: str, field: str) -> dt.datetime | None:
    match = re.search(rf"^{field}[^:\n]*:(\d{{8}}T\d{{4}}(\d\d)?)Z?\s*$", ics, re.MULTILINE)
    if not match:
        return None
    raw = match.group(1)
    return dt.datetime.strptime(raw[:13], "%Y%m%dT%H%M")


@register_checker("find_slot")
def check_slot(task: ClawTask, state: FinalState) -> CheckResult:
    """A valid invite (fits everyone), at the earliest slot, on Sam's calendar too."""
    checks = Checks()
    calendars = [json_of(task, p) for p in sorted(task.files) if p.startswith("calendar/")]
    ics = state.text("calendar/invite.ics")
    if not checks.add(ics is not None and "BEGIN:VEVENT" in ics, "calendar/invite.ics is a VEVENT"):
        return checks.result()
    assert ics is not None
    start, end = _ics_time(ics, "DTSTART"), _ics_time(ics, "DTEND")
    if not checks.add(start is not None and end is not None, "the invite has DTSTART and DTEND"):
        return checks.result()
    assert start is not None and end is not None
    minutes = task.expect["minutes"]
    checks.add(end - start == dt.timedelta(minutes=minutes), f"the meeting lasts {minutes} min")
    why = _fits(start, end, calendars)
    checks.add(not why, f"the slot fits everyone ({'; '.join(why) or 'it does'})")
    expected = dt.datetime.fromisoformat(task.expect["start"])
    checks.add(start == expected, f"it is the earliest slot, {expected:%a %H:%M}")
    checks.add(task.expect["title"] in ics, f"SUMMARY is {task.expect['title']!r}")
    attendees = [line for line in ics.splitlines() if line.startswith("ATTENDEE")]
    for email in task.expect["attendees"]:
        checks.add(any(email in line for line in attendees), f"{email} is an ATTENDEE")
    mine = state.json("calendar/sam.json")
    events = mine.get("events") if isinstance(mine, dict) else None
    original = json_of(task, "calendar/sam.json")["events"]
    ok = isinstance(events, list) and all(e in events for e in original)
    checks.add(ok, "sam.json keeps its events")
    added = [
        e
        for e in (events or [])
        if isinstance(e, dict)
        and e not in original
        and _same_time(e.get("start"), start)
        and _same_time(e.get("end"), end)
    ]
    checks.add(len(added) == 1, "sam.json has the new meeting")
    return checks.result()


def _same_time(value: Any, when: dt.datetime) -> bool:
    try:
        return dt.datetime.fromisoformat(str(value)).replace(tzinfo=None) == when
    except ValueError:
        return False


def json_of(task: ClawTask, rel: str) -> Any:
    """A seeded JSON file of ``task``, parsed."""
    import json

    return json.loads(task.files[rel])


ROOM_NAMES = ("Aspen", "Birch", "Cedar", "Douglas", "Elm", "Fir", "Ginkgo", "Hazel")


def _room_for(
    request: dict[str, Any], rooms: list[dict[str, Any]], bookings: list[list[str]]
) -> str | None:
    fitting = [
        r
        for r in rooms
        if r["capacity"] >= request["people"]
        and set(request["needs"]) <= set(r["features"])
        and not any(
            b[0] == r["name"]
            and b[1] == request["date"]
            and request["start"] < b[3]
            and b[2] < request["end"]
            for b in bookings
        )
    ]
    fitting.sort(key=lambda r: (r["capacity"], r["name"]))
    return fitting[0]["name"] if fitting else None


@register_template("book_room", "scheduling", "book the smallest free fitting rooms")
def book_room(rng: random.Random, task_id: str) -> ClawTask:
    """Rooms, existing bookings and three requests, booked in order by a stated rule."""
    return first_solvable(_book_room_attempt, rng, task_id)


def _book_room_attempt(rng: random.Random, task_id: str) -> ClawTask | None:
    day = (dt.date(2024, 9, 2) + dt.timedelta(days=rng.randint(0, 20))).isoformat()
    rooms: list[dict[str, Any]] = [
        {
            "name": name,
            "capacity": rng.choice((4, 6, 8, 10, 14)),
            "floor": rng.randint(1, 4),
            "features": sorted(rng.sample(("projector", "whiteboard", "video"), rng.randint(0, 2))),
        }
        for name in rng.sample(ROOM_NAMES, 6)
    ]
    hours = [f"{h:02d}:{m:02d}" for h in range(8, 18) for m in (0, 30)]
    bookings: list[list[str]] = []
    for _ in range(rng.randint(8, 12)):
        i = rng.randrange(len(hours) - 4)
        row = [
            rng.choice(rooms)["name"],
            day,
            hours[i],
            hours[i + rng.randint(1, 4)],
            rng.choice(FIRST_NAMES).lower(),
        ]
        if not any(b[0] == row[0] and row[2] < b[3] and b[2] < row[3] for b in bookings):
            bookings.append(row)
    requests: list[dict[str, Any]] = []
    for title in rng.sample(TITLES, 3):
        i = rng.randrange(len(hours) - 3)
        requests.append(
            {
                "title": title,
                "people": rng.randint(3, 9),
                "date": day,
                "start": hours[i],
                "end": hours[i + rng.randint(1, 3)],
                "needs": sorted(
                    rng.sample(("projector", "whiteboard", "video"), rng.randint(0, 1))
                ),
            }
        )
    booked = [list(b) for b in bookings]
    chosen = []
    tricky = False
    for req in requests:
        room = _room_for(req, rooms, booked)
        if room is None:
            return None
        tricky |= room != _room_for(req, rooms, [])
        chosen.append(room)
        booked.append([room, day, req["start"], req["end"], "sam"])
    if not tricky:
        return None  # make at least one request's first choice busy
    header = "room,date,start,end,organiser\n"
    files = {
        "rooms/rooms.json": jdump(rooms),
        "rooms/bookings.csv": header + "".join(",".join(b) + "\n" for b in bookings),
        "rooms/requests.md": "# Rooms I need\n\n"
        + "".join(
            f"{n}. {r['title']}: {r['people']} people, {r['date']} {r['start']}-{r['end']}"
            + (f", needs a {r['needs'][0]}" if r["needs"] else "")
            + "\n"
            for n, r in enumerate(requests, start=1)
        ),
    }
    new_rows = booked[len(bookings) :]
    script = write_file(
        "/workspace/rooms/bookings.csv", header + "".join(",".join(b) + "\n" for b in booked)
    ) + write_file(
        "/workspace/rooms/confirmations.md",
        "".join(f"- {r['title']}: {room}\n" for r, room in zip(requests, chosen, strict=True)),
    )
    return ClawTask(
        id=task_id,
        kind="scheduling",
        instruction=(
            "Book rooms for the meetings in /workspace/rooms/requests.md, in the order listed. "
            "For each, take the smallest room (by capacity; ties by name) in rooms/rooms.json "
            "that seats everyone, has any feature asked for, and is free at that time given "
            "rooms/bookings.csv (including the bookings you just made). Book it by appending a "
            "row to rooms/bookings.csv with organiser sam, and write rooms/confirmations.md "
            "with one line per meeting: '- <title>: <room>'."
        ),
        files=files,
        checker="book_room",
        expect={
            "rows": new_rows,
            "rooms": {r["title"]: c for r, c in zip(requests, chosen, strict=True)},
        },
        reference=script,
    )


@register_checker("book_room")
def check_rooms(task: ClawTask, state: FinalState) -> CheckResult:
    """Old bookings kept, exactly the expected rows added, confirmations name the rooms."""
    checks = Checks()
    rows = state.csv_rows("rooms/bookings.csv")
    if not checks.add(rows is not None, "rooms/bookings.csv is a CSV with its header"):
        return checks.result()
    assert rows is not None
    keys = ("room", "date", "start", "end", "organiser")
    got = [[r.get(k, "") for k in keys] for r in rows]
    seeded = [line.split(",") for line in task.files["rooms/bookings.csv"].splitlines()[1:]]
    checks.add(all(b in got for b in seeded), "the existing bookings are kept")
    added = [b for b in got if b not in seeded]
    for row in task.expect["rows"]:
        checks.add(row in added, f"booked {row[0]} {row[2]}-{row[3]}")
    checks.add(len(added) == len(task.expect["rows"]), "no other booking was added")
    text = state.text("rooms/confirmations.md") or ""
    for title, room in sorted(task.expect["rooms"].items()):
        line = next((ln for ln in text.splitlines() if title in ln), "")
        checks.add(room in line, f"the confirmation says {title}: {room}")
    return checks.result()
