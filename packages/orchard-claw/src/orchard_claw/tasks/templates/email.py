"""Email templates: triage with meeting replies; an invoice digest for accounting.

Mailbox layout: one JSON file a message, ``mail/inbox/<id>.json`` with ``id``, ``from``,
``to``, ``date``, ``subject``, ``body``, ``labels``; the agent writes ``mail/drafts/*.json``
or ``mail/outbox/*.json`` as ``{"to", "subject", "body", "in_reply_to"?}``.
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
    jdump,
    parse_money,
    register_template,
    write_file,
)

ME = "sam@acme.test"
FILLER = (
    ("Lunch on Friday?", "A few of us are going to the noodle place on Friday. Coming?"),
    ("Weekly metrics", "The weekly metrics dashboard has been refreshed. No action needed."),
    ("Your parcel is on its way", "Your order #{n} has shipped and should arrive in 2-3 days."),
    ("Team photo", "Photos from the offsite are in the shared drive, enjoy!"),
    ("Newsletter: spring deals", "Urgent savings inside! Up to 40% off garden furniture."),
    ("Re: slides", "Thanks, the slides look good to me."),
    ("Parking garage closed", "The garage is closed for cleaning on Saturday."),
)
MEETING_ASKS = (
    "Could we meet for half an hour this week to go over the {topic}?",
    "Would you have time for a short call about the {topic}? Let me know what works.",
    "Can we set up a meeting to discuss the {topic}? I have a few questions.",
)
URGENT_SUBJECTS = ("URGENT: {topic} numbers wrong", "Urgent - {topic} sign-off needed today")
TOPICS = ("Q3 roadmap", "vendor contract", "budget review", "hiring plan", "launch checklist")


def _message(mid: str, sender: str, subject: str, body: str, when: dt.datetime) -> dict[str, Any]:
    return {
        "id": mid,
        "from": sender,
        "to": ME,
        "date": when.isoformat(timespec="minutes"),
        "subject": subject,
        "body": body,
        "labels": [],
    }


def _drafts(state: FinalState, folder: str) -> list[dict[str, Any]]:
    found = []
    for rel in state.files(folder):
        data = state.json(rel)
        if isinstance(data, dict):
            found.append(data)
    return found


@register_template("inbox_triage", "email", "label urgent mail, draft replies to meeting asks")
def inbox_triage(rng: random.Random, task_id: str) -> ClawTask:
    """An inbox with urgent mail (by sender or subject) and two meeting requests to answer."""
    names = rng.sample(FIRST_NAMES, 7)
    manager = names[0]
    start = dt.datetime(2024, 5, 13, 8, 0)
    messages: list[dict[str, Any]] = []
    urgent: list[str] = []
    meeting: dict[str, str] = {}

    def add(sender: str, subject: str, body: str) -> str:
        mid = f"m{len(messages) + 101:03d}"
        when = start + dt.timedelta(minutes=37 * len(messages) + rng.randint(0, 30))
        messages.append(_message(mid, sender, subject, body, when))
        return mid

    for title, body in rng.sample(FILLER, 5):
        add(f"{rng.choice(names[3:]).lower()}@acme.test", title, body.format(n=rng.randint(1, 999)))
    urgent.append(
        add(f"{manager.lower()}@acme.test", "Board deck", "Please send me the board deck by 3pm.")
    )
    topic = rng.choice(TOPICS)
    urgent.append(
        add(
            f"{names[3].lower()}@acme.test",
            rng.choice(URGENT_SUBJECTS).format(topic=topic),
            "The totals in the sheet do not add up, can you check?",
        )
    )
    for person in names[1:3]:
        subject = f"{rng.choice(TOPICS).capitalize()}"
        ask = rng.choice(MEETING_ASKS).format(topic=subject.lower())
        mid = add(f"{person.lower()}@acme.test", subject, f"Hi Sam,\n\n{ask}\n\nThanks,\n{person}")
        meeting[mid] = f"{person.lower()}@acme.test"
    rng.shuffle(messages)
    slots = sorted(rng.sample(["09:30", "10:00", "11:30", "13:00", "14:30", "15:30", "16:00"], 3))
    day = rng.choice(("Wednesday 15 May", "Thursday 16 May"))
    files = {f"mail/inbox/{m['id']}.json": jdump(m) for m in messages}
    files["notes/availability.md"] = "# My free slots this week\n\n" + "".join(
        f"- {day}, {s} (30 min)\n" for s in slots
    )
    script = "cd /workspace/mail/inbox\n"
    for mid in urgent:
        labelled = dict(next(m for m in messages if m["id"] == mid), labels=["urgent"])
        script += write_file(f"{mid}.json", jdump(labelled))
    by_id = {m["id"]: m for m in messages}
    for i, (mid, sender) in enumerate(sorted(meeting.items())):
        first = sender.split("@")[0].capitalize()
        draft = {
            "to": sender,
            "subject": f"Re: {by_id[mid]['subject']}",
            "in_reply_to": mid,
            "body": f"Hi {first},\n\nSure - does {day} at {slots[i]} work for you?\n\nBest,\nSam",
        }
        script += write_file(f"/workspace/mail/drafts/reply-{mid}.json", jdump(draft))
    return ClawTask(
        id=task_id,
        kind="email",
        instruction=(
            f"Triage my inbox (/workspace/mail/inbox, one JSON file per message). Add the "
            f'label "urgent" to every message from my manager {manager} '
            f"({manager.lower()}@acme.test) or with 'urgent' in the subject, and to no other. "
            "Then draft a reply to each message that asks me for a meeting or call: save each "
            'draft as a JSON file in /workspace/mail/drafts with to, subject ("Re: " + the '
            "original subject), in_reply_to (the message id) and body, proposing one of my free "
            "slots from /workspace/notes/availability.md (day and time). Don't draft anything else."
        ),
        files=files,
        checker="inbox_triage",
        expect={"urgent": sorted(urgent), "meeting": meeting, "slots": slots, "day": day},
        reference=script,
        rubric=(
            "Replies are short and polite, greet the sender by name, and propose exactly one of "
            "the listed free slots; nothing is promised that the notes do not support."
        ),
    )


@register_checker("inbox_triage")
def check_triage(task: ClawTask, state: FinalState) -> CheckResult:
    """Urgent labels exactly on the urgent set; one proper draft per meeting request."""
    checks = Checks()
    urgent = set(task.expect["urgent"])
    for rel in sorted(task.files):
        if not rel.startswith("mail/inbox/"):
            continue
        msg = state.json(rel)
        if not checks.add(isinstance(msg, dict), f"{rel} is still a JSON message"):
            continue
        mid = rel.rsplit("/", 1)[-1].removesuffix(".json")
        labels = msg.get("labels") or []
        want = mid in urgent
        checks.add(
            ("urgent" in labels) == want, f"{mid} is {'' if want else 'not '}labelled urgent"
        )
    drafts = _drafts(state, "mail/drafts")
    meeting: dict[str, str] = task.expect["meeting"]
    checks.add(len(drafts) == len(meeting), f"exactly {len(meeting)} drafts")
    day = task.expect["day"]
    for mid, sender in sorted(meeting.items()):
        draft = next((d for d in drafts if d.get("in_reply_to") == mid), None)
        if not checks.add(draft is not None, f"a draft replies to {mid}"):
            continue
        assert draft is not None
        subject = str(draft.get("subject", ""))
        body = str(draft.get("body", ""))
        checks.add(draft.get("to") == sender, f"the reply to {mid} goes to {sender}")
        checks.add(subject.lower().startswith("re:"), f"the reply to {mid} has a Re: subject")
        slot_ok = any(s in body for s in task.expect["slots"])
        day_ok = day.split()[0] in body or day.split(" ", 1)[1] in body
        checks.add(slot_ok and day_ok, f"the reply to {mid} proposes a free slot on {day}")
    return checks.result()


INVOICE_VENDORS = (
    "Northwind Supplies",
    "Contoso Cleaning",
    "Fabrikam IT",
    "Litware Print",
    "Tailspin Travel",
    "Adatum Catering",
)


def _amount(value: float) -> str:
    return f"{value:,.2f}"


@register_template("invoice_digest", "email", "collect invoices from mail, email accounting")
def invoice_digest(rng: random.Random, task_id: str) -> ClawTask:
    """Invoices (with a reminder repeating one, and a quote as a trap) to total for accounting."""
    accounting = "accounting@acme.test"
    vendors = rng.sample(INVOICE_VENDORS, 4)
    start = dt.datetime(2024, 6, 3, 9, 0)
    messages: list[dict[str, Any]] = []
    invoices: dict[str, float] = {}
    invoice_msgs: list[str] = []

    def add(sender: str, subject: str, body: str) -> str:
        mid = f"m{len(messages) + 201:03d}"
        when = start + dt.timedelta(hours=3 * len(messages), minutes=rng.randint(0, 59))
        messages.append(_message(mid, sender, subject, body, when))
        return mid

    for vendor in vendors[:3]:
        number = f"INV-2024-{rng.randint(100, 9999):04d}"
        amount = rng.randint(12000, 480000) / 100
        invoices[number] = amount
        domain = vendor.split()[0].lower()
        body = (
            f"Dear customer,\n\nplease find attached invoice {number} for our services in May.\n"
            f"Amount due: EUR {_amount(amount)}\nPayment terms: 30 days.\n\n{vendor}"
        )
        invoice_msgs.append(add(f"billing@{domain}.test", f"Invoice {number}", body))
    reminder_of = rng.choice(sorted(invoices))
    invoice_msgs.append(
        add(
            "billing@" + vendors[0].split()[0].lower() + ".test",
            f"Reminder: {reminder_of}",
            f"Friendly reminder that invoice {reminder_of} (EUR {_amount(invoices[reminder_of])}) "
            "is still open.",
        )
    )
    quote = f"Q-{rng.randint(1000, 9999)}"
    add(
        f"sales@{vendors[3].split()[0].lower()}.test",
        f"Quote {quote}",
        f"Here is quote {quote}: EUR {_amount(rng.randint(5000, 90000) / 100)}. Not an invoice.",
    )
    for title, body in rng.sample(FILLER, 4):
        add(
            f"{rng.choice(FIRST_NAMES).lower()}@acme.test",
            title,
            body.format(n=rng.randint(1, 999)),
        )
    rng.shuffle(messages)
    total = round(sum(invoices.values()), 2)
    files = {f"mail/inbox/{m['id']}.json": jdump(m) for m in messages}
    script = "cd /workspace/mail/inbox\n"
    for m in messages:
        if m["id"] in invoice_msgs:
            script += write_file(f"{m['id']}.json", jdump(dict(m, labels=["invoice"])))
    lines = "".join(f"- {n}: EUR {_amount(a)}\n" for n, a in sorted(invoices.items()))
    mail = {
        "to": accounting,
        "subject": "Open invoices",
        "body": f"Hi,\n\nthese invoices arrived:\n{lines}\nTotal: EUR {_amount(total)}\n\nSam",
    }
    script += write_file("/workspace/mail/outbox/invoices.json", jdump(mail))
    return ClawTask(
        id=task_id,
        kind="email",
        instruction=(
            "Go through my inbox (/workspace/mail/inbox, one JSON file per message) and add "
            'the label "invoice" to every message about an invoice (reminders too, quotes '
            f"are not invoices). Then write an email to {accounting} as a JSON file in "
            "/workspace/mail/outbox with to, subject and body: the body lists each distinct "
            "invoice number with its amount, and the total of all of them (count a reminded "
            "invoice once)."
        ),
        files=files,
        checker="invoice_digest",
        expect={
            "invoices": {n: f"{a:.2f}" for n, a in invoices.items()},
            "labelled": sorted(invoice_msgs),
            "total": f"{total:.2f}",
            "quote": quote,
            "to": accounting,
        },
        reference=script,
    )


def _amounts_in(text: str) -> list[float]:
    found = [parse_money(m) for m in re.findall(r"\d[\d,]*\.\d\d", text)]
    return [v for v in found if v is not None]


@register_checker("invoice_digest")
def check_invoices(task: ClawTask, state: FinalState) -> CheckResult:
    """Invoice labels exact; an outbox mail to accounting with each invoice and the total."""
    checks = Checks()
    labelled = set(task.expect["labelled"])
    for rel in sorted(p for p in task.files if p.startswith("mail/inbox/")):
        mid = rel.rsplit("/", 1)[-1].removesuffix(".json")
        msg = state.json(rel)
        labels = (msg.get("labels") or []) if isinstance(msg, dict) else []
        want = mid in labelled
        checks.add(
            ("invoice" in labels) == want, f"{mid} is {'' if want else 'not '}labelled invoice"
        )
    mails = [m for m in _drafts(state, "mail/outbox") if m.get("to") == task.expect["to"]]
    if not checks.add(len(mails) == 1, f"one mail to {task.expect['to']} in mail/outbox"):
        return checks.result()
    body = str(mails[0].get("body", ""))
    amounts = _amounts_in(body)
    for number, amount in sorted(task.expect["invoices"].items()):
        checks.add(
            number in body and any(abs(a - float(amount)) < 0.005 for a in amounts),
            f"the mail lists {number} with {amount}",
        )
    total = float(task.expect["total"])
    checks.add(
        any(abs(a - total) < 0.005 for a in amounts), f"the mail gives the total {total:.2f}"
    )
    checks.add(task.expect["quote"] not in body, "the quote is not listed as an invoice")
    return checks.result()
