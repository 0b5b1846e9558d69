"""File-organisation templates: receipts by month with an index; de-duplicating downloads."""

from __future__ import annotations

import datetime as dt
import random
import shlex

from orchard_claw.tasks.checkers import Checks, FinalState, register_checker
from orchard_claw.tasks.schema import CheckResult, ClawTask
from orchard_claw.tasks.templates.common import money, parse_money, register_template, write_file

VENDORS = (
    "Green Grocer",
    "Corner Pharmacy",
    "City Books",
    "Hardware Hub",
    "Blue Bottle Cafe",
    "Metro Fuel",
    "Office Depot",
    "Pet Palace",
    "Bike Repair Co",
    "Noodle Bar",
)
ITEMS = (
    "apples",
    "bread",
    "coffee",
    "batteries",
    "notebook",
    "tape",
    "dog food",
    "soap",
    "inner tube",
    "ramen",
    "pens",
    "milk",
    "light bulb",
    "shampoo",
)


def _receipt(vendor: str, day: dt.date, items: list[tuple[str, float]], style: int) -> str:
    date = day.isoformat() if style == 0 else day.strftime("%d %b %Y")
    lines = [vendor.upper(), f"Date: {date}", "Items:"]
    lines += [f"  {name:<14}{money(price):>8}" for name, price in items]
    total = round(sum(p for _, p in items), 2)
    lines += [f"Total: {money(total)}", "Thank you for shopping with us!"]
    return "\n".join(lines) + "\n"


@register_template(
    "receipts_by_month", "file_organisation", "sort receipts into YYYY-MM folders, write index.csv"
)
def receipts_by_month(rng: random.Random, task_id: str) -> ClawTask:
    """Receipt text files (dates in two formats) to sort by month, with an index of totals."""
    year = rng.choice((2023, 2024))
    months = sorted(rng.sample(range(1, 13), rng.randint(3, 4)))
    files: dict[str, str] = {}
    placement: dict[str, str] = {}
    totals: dict[str, list[float]] = {}
    for n in range(rng.randint(9, 13)):
        month = months[n % len(months)] if n < len(months) else rng.choice(months)
        day = dt.date(year, month, rng.randint(1, 28))
        items = [(rng.choice(ITEMS), rng.randint(80, 4500) / 100) for _ in range(rng.randint(1, 4))]
        name = f"scan_{rng.randint(1000, 9999)}_{n:02d}.txt"
        files[f"receipts/{name}"] = _receipt(rng.choice(VENDORS), day, items, rng.randint(0, 1))
        key = f"{year}-{month:02d}"
        placement[name] = key
        totals.setdefault(key, []).append(round(sum(p for _, p in items), 2))
    index = [[m, len(v), money(sum(v))] for m, v in sorted(totals.items())]
    files["receipts/NOTE.md"] = "Scanned with the phone app. Sort these out before tax time!\n"
    script = "cd /workspace/receipts\n"
    script += "".join(
        f"mkdir -p {m} && mv {shlex.quote(n)} {m}/\n" for n, m in sorted(placement.items())
    )
    csv_text = "month,count,total\n" + "".join(f"{m},{c},{t}\n" for m, c, t in index)
    script += write_file("index.csv", csv_text)
    return ClawTask(
        id=task_id,
        kind="file_organisation",
        instruction=(
            "My scanned receipts are in /workspace/receipts. Sort them into one folder per "
            "month named YYYY-MM (for example receipts/2024-03/), keeping the file names and "
            "contents unchanged (the month is the receipt's Date line). Leave NOTE.md where it "
            "is. Then write receipts/index.csv with the header month,count,total and one row "
            "per month in date order: the number of receipts and the sum of their totals with "
            "two decimals."
        ),
        files=files,
        checker="receipts_by_month",
        expect={"placement": placement, "index": index},
        reference=script,
        rubric="Every receipt is in its month's folder, untouched; the index sums are exact.",
    )


@register_checker("receipts_by_month")
def check_receipts(task: ClawTask, state: FinalState) -> CheckResult:
    """Each receipt in its month folder with its original content; the index exact."""
    checks = Checks()
    placement: dict[str, str] = task.expect["placement"]
    for name, month in sorted(placement.items()):
        moved = state.text(f"receipts/{month}/{name}")
        checks.add(
            moved == task.files[f"receipts/{name}"], f"{name} is in receipts/{month}/ unchanged"
        )
    left = [p for p in state.files("receipts") if p.count("/") == 1 and p.endswith(".txt")]
    checks.add(not left, f"no receipt left at the top of receipts/ ({left})")
    checks.add(state.exists("receipts/NOTE.md"), "NOTE.md stays in receipts/")
    rows = state.csv_rows("receipts/index.csv")
    if not checks.add(rows is not None, "receipts/index.csv is a CSV with a header"):
        return checks.result()
    assert rows is not None
    expected = task.expect["index"]
    checks.add(len(rows) == len(expected), f"index has {len(expected)} rows")
    for i, (month, count, total) in enumerate(expected):
        row = rows[i] if i < len(rows) else {}
        got = parse_money(row.get("total", ""))
        checks.add(
            row.get("month") == month
            and row.get("count") == str(count)
            and got is not None
            and abs(got - float(total)) < 0.005,
            f"index row {i + 1} is {month},{count},{total} (got {row or 'nothing'})",
        )
    return checks.result()


CATEGORIES = {
    "documents": (".pdf", ".docx", ".txt", ".md"),
    "images": (".jpg", ".png"),
    "data": (".csv", ".json"),
    "archives": (".zip", ".tar.gz"),
}
STEMS = (
    "tax-return-2023",
    "holiday-photo",
    "budget",
    "lease-agreement",
    "cv-draft",
    "team-offsite",
    "invoice-march",
    "screenshot",
    "backup",
    "meeting-notes",
    "flight-ticket",
    "recipes",
    "expenses",
    "logo",
)


def _category(name: str) -> str:
    return next(c for c, exts in CATEGORIES.items() if name.endswith(exts))


@register_template(
    "dedupe_downloads", "file_organisation", "delete duplicate downloads, file by type, log"
)
def dedupe_downloads(rng: random.Random, task_id: str) -> ClawTask:
    """Downloads with exact duplicates (and one same-name different-content trap) to clean."""
    exts = [e for group in CATEGORIES.values() for e in group]
    stems = rng.sample(STEMS, rng.randint(8, 10))
    originals = {f"{s}{rng.choice(exts)}": f"{s} | {rng.getrandbits(64):016x}\n" for s in stems}
    files = {f"downloads/{n}": c for n, c in originals.items()}
    deleted: list[str] = []
    for name in rng.sample(sorted(originals), 4):
        stem, _dot, ext = name.partition(".")
        copy = rng.choice((f"{stem} (1).{ext}", f"Copy of {name}", f"{stem}-copy.{ext}"))
        files[f"downloads/{copy}"] = originals[name]
        deleted.append(copy)
    trap_source = rng.choice(sorted(set(originals)))
    stem, _, ext = trap_source.partition(".")
    trap = f"{stem} (2).{ext}"  # looks like a copy, but its content differs: keep it
    files[f"downloads/{trap}"] = f"{stem} (revised) | {rng.getrandbits(64):016x}\n"
    kept = {n: _category(n) for n in [*originals, trap]}
    script = "cd /workspace/downloads\n"
    script += "".join(f"rm -- {shlex.quote(n)}\n" for n in sorted(deleted))
    script += "".join(
        f"mkdir -p {c} && mv -- {shlex.quote(n)} {c}/\n" for n, c in sorted(kept.items())
    )
    script += write_file("cleanup.log", "".join(f"{n}\n" for n in sorted(deleted)))
    return ClawTask(
        id=task_id,
        kind="file_organisation",
        instruction=(
            "Please clean up /workspace/downloads. Delete exact duplicates (files with the "
            "same content), keeping the copy with the shortest name. Then move every remaining "
            "file into a subfolder by type: documents (.pdf .docx .txt .md), images (.jpg "
            ".png), data (.csv .json), archives (.zip .tar.gz). Finally write "
            "downloads/cleanup.log listing the name of each file you deleted, one per line."
        ),
        files=files,
        checker="dedupe_downloads",
        expect={"kept": kept, "deleted": sorted(deleted)},
        reference=script,
    )


@register_checker("dedupe_downloads")
def check_dedupe(task: ClawTask, state: FinalState) -> CheckResult:
    """Kept files in their category with original content; copies gone; log exact."""
    checks = Checks()
    for name, category in sorted(task.expect["kept"].items()):
        checks.add(
            state.text(f"downloads/{category}/{name}") == task.files[f"downloads/{name}"],
            f"{name} is in downloads/{category}/ unchanged",
        )
    present = {p.rsplit("/", 1)[-1] for p in state.files("downloads")}
    for name in task.expect["deleted"]:
        checks.add(name not in present, f"the duplicate {name} is deleted")
    expected_count = len(task.expect["kept"]) + 1
    checks.add(
        len(state.files("downloads")) == expected_count,
        f"downloads/ holds exactly the {expected_count - 1} kept files and cleanup.log",
    )
    log = state.text("downloads/cleanup.log")
    logged = sorted(line.strip() for line in (log or "").splitlines() if line.strip())
    checks.add(logged == task.expect["deleted"], f"cleanup.log lists {task.expect['deleted']}")
    return checks.result()
