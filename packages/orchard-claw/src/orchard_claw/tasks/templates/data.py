"""Data-lookup templates: a month's sales summary; an inventory reorder list (CSV + JSON)."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from orchard_claw.tasks.checkers import Checks, FinalState, register_checker
from orchard_claw.tasks.schema import CheckResult, ClawTask
from orchard_claw.tasks.templates.common import (
    jdump,
    money,
    parse_money,
    register_template,
    write_file,
)

REGIONS = ("North", "South", "East", "West", "Central")
PRODUCTS = {
    "Trail Shoe": 89.0,
    "Rain Jacket": 129.5,
    "Wool Socks": 12.75,
    "Day Pack": 64.0,
    "Headlamp": 34.9,
    "Water Bottle": 18.25,
    "Fleece": 74.0,
}


def _close(a: Any, b: float) -> bool:
    value = parse_money(str(a)) if not isinstance(a, int | float) else float(a)
    return value is not None and abs(value - b) < 0.005


@register_template("sales_summary", "data_lookup", "one month's revenue by region, top product")
def sales_summary(rng: random.Random, task_id: str) -> ClawTask:
    """Order lines over three months; the summary of one month with exact figures."""
    year = 2024
    months = sorted(rng.sample(range(1, 12), 3))
    target = rng.choice(months)
    regions = rng.sample(REGIONS, 4)
    products = rng.sample(sorted(PRODUCTS), 5)
    rows: list[dict[str, Any]] = []
    for n in range(rng.randint(36, 48)):
        month = months[n % 3]
        product = rng.choice(products)
        price = PRODUCTS[product] * rng.choice((1.0, 1.0, 0.9))  # some lines discounted
        rows.append(
            {
                "order_id": f"SO-{5000 + n}",
                "date": dt.date(year, month, rng.randint(1, 28)).isoformat(),
                "region": rng.choice(regions),
                "product": product,
                "units": rng.randint(1, 12),
                "unit_price": money(price),
            }
        )
    rows.sort(key=lambda r: (r["date"], r["order_id"]))
    mine = [r for r in rows if int(r["date"][5:7]) == target]
    revenue: dict[str, float] = {}
    units: dict[str, int] = {}
    for r in mine:
        line = r["units"] * float(r["unit_price"])
        revenue[r["region"]] = revenue.get(r["region"], 0.0) + line
        units[r["product"]] = units.get(r["product"], 0) + r["units"]
    top = max(sorted(units), key=lambda p: units[p])
    summary: dict[str, Any] = {
        "month": f"{year}-{target:02d}",
        "orders": len(mine),
        "total_revenue": round(sum(revenue.values()), 2),
        "revenue_by_region": {k: round(v, 2) for k, v in sorted(revenue.items())},
        "top_product": top,
        "top_product_units": units[top],
    }
    header = "order_id,date,region,product,units,unit_price\n"
    csv_text = header + "".join(
        f"{r['order_id']},{r['date']},{r['region']},{r['product']},{r['units']},{r['unit_price']}\n"
        for r in rows
    )
    month_name = dt.date(year, target, 1).strftime("%B %Y")
    note = (
        f"# {month_name} sales\n\nWe took {len(mine)} orders for "
        f"{money(summary['total_revenue'])} in total. Best seller: {top} "
        f"({units[top]} units).\n"
    )
    script = write_file("/workspace/report/summary.json", jdump(summary)) + write_file(
        "/workspace/report/summary.md", note
    )
    return ClawTask(
        id=task_id,
        kind="data_lookup",
        instruction=(
            f"Using /workspace/data/sales.csv, summarise {month_name}. Write "
            "/workspace/report/summary.json with keys month (YYYY-MM), orders (number of "
            "order lines that month), total_revenue (sum of units x unit_price, rounded to "
            "cents), revenue_by_region (region -> revenue), top_product (most units sold) and "
            "top_product_units. Also write report/summary.md, a short note for my boss that "
            "quotes the total revenue and the top product."
        ),
        files={"data/sales.csv": csv_text},
        checker="sales_summary",
        expect=summary,
        reference=script,
        rubric="The note is brief, readable and its numbers match the JSON exactly.",
    )


@register_checker("sales_summary")
def check_sales(task: ClawTask, state: FinalState) -> CheckResult:
    """Every figure of summary.json exact; the note quotes the total and the top product."""
    checks = Checks()
    want = task.expect
    got = state.json("report/summary.json")
    if not checks.add(isinstance(got, dict), "report/summary.json is a JSON object"):
        return checks.result()
    assert isinstance(got, dict)
    checks.add(got.get("month") == want["month"], f"month is {want['month']}")
    checks.add(str(got.get("orders")) == str(want["orders"]), f"orders is {want['orders']}")
    checks.add(
        _close(got.get("total_revenue"), want["total_revenue"]),
        f"total_revenue is {want['total_revenue']:.2f}",
    )
    by_region = got.get("revenue_by_region")
    by_region = by_region if isinstance(by_region, dict) else {}
    checks.add(set(by_region) == set(want["revenue_by_region"]), "the regions are those sold in")
    for region, value in want["revenue_by_region"].items():
        checks.add(_close(by_region.get(region), value), f"{region} revenue is {value:.2f}")
    checks.add(got.get("top_product") == want["top_product"], f"top product {want['top_product']}")
    checks.add(
        str(got.get("top_product_units")) == str(want["top_product_units"]),
        f"top product units {want['top_product_units']}",
    )
    note = state.text("report/summary.md") or ""
    total = want["total_revenue"]
    checks.add(
        f"{total:.2f}" in note or f"{total:,.2f}" in note, "the note quotes the total revenue"
    )
    checks.add(want["top_product"] in note, "the note names the top product")
    return checks.result()


ITEMS = (
    "USB-C cable",
    "Label tape",
    "Printer toner",
    "A4 paper",
    "Sticky notes",
    "Stapler",
    "Whiteboard marker",
    "Mouse",
    "Keyboard",
    "HDMI adapter",
    "Desk lamp",
    "Notebook",
)
SUPPLIERS = ("Acme Office", "PaperCo", "TechParts", "Bright Supplies")


@register_template("inventory_reorder", "data_lookup", "reorder list from stock, orders, suppliers")
def inventory_reorder(rng: random.Random, task_id: str) -> ClawTask:
    """Stock levels, open orders and suppliers joined into a reorder list by a stated rule."""
    suppliers = [
        {
            "id": f"S{n + 1}",
            "name": name,
            "email": f"orders@{name.split()[0].lower()}.test",
            "lead_time_days": rng.randint(2, 14),
        }
        for n, name in enumerate(rng.sample(SUPPLIERS, 3))
    ]
    stock: list[dict[str, Any]] = []
    for n, name in enumerate(rng.sample(ITEMS, 10)):
        level = rng.randint(5, 40)
        low = n < 2  # at least two items run low whatever is on order
        stock.append(
            {
                "sku": f"SKU-{100 + n * 7}",
                "name": name,
                "on_hand": rng.randint(0, level // 3 if low else level + 10),
                "reorder_level": level,
                "supplier_id": rng.choice(suppliers)["id"],
            }
        )
    on_order = {s["sku"]: rng.randint(1, 20) for s in rng.sample(stock[2:], 4)}
    email = {s["id"]: s["email"] for s in suppliers}
    reorder: list[list[Any]] = []
    for s in sorted(stock, key=lambda s: s["sku"]):
        have = s["on_hand"] + on_order.get(s["sku"], 0)
        if have < s["reorder_level"]:
            reorder.append(
                [s["sku"], s["name"], 2 * s["reorder_level"] - have, email[s["supplier_id"]]]
            )
    files = {
        "data/inventory.csv": "sku,name,on_hand,reorder_level,supplier_id\n"
        + "".join(
            f"{s['sku']},{s['name']},{s['on_hand']},{s['reorder_level']},{s['supplier_id']}\n"
            for s in stock
        ),
        "data/open_orders.csv": "sku,quantity\n"
        + "".join(f"{k},{v}\n" for k, v in on_order.items()),
        "data/suppliers.json": jdump(suppliers),
    }
    total = sum(r[2] for r in reorder)
    script = write_file(
        "/workspace/reorder.csv",
        "sku,name,quantity,supplier_email\n"
        + "".join(",".join(map(str, r)) + "\n" for r in reorder),
    ) + write_file(
        "/workspace/reorder.md", f"{len(reorder)} items to reorder, {total} units in total.\n"
    )
    return ClawTask(
        id=task_id,
        kind="data_lookup",
        instruction=(
            "Work out what we need to reorder from /workspace/data. An item needs reordering "
            "when on_hand plus the quantity already on order (data/open_orders.csv) is below "
            "its reorder_level; order enough to reach twice the reorder level "
            "(2 x reorder_level - on_hand - on order). Write /workspace/reorder.csv with the "
            "header sku,name,quantity,supplier_email (the supplier's email from "
            "data/suppliers.json), sorted by sku, and /workspace/reorder.md saying how many "
            "items and how many units in total."
        ),
        files=files,
        checker="inventory_reorder",
        expect={"rows": reorder, "total": total},
        reference=script,
    )


@register_checker("inventory_reorder")
def check_reorder(task: ClawTask, state: FinalState) -> CheckResult:
    """reorder.csv exactly the expected rows in order; the note gives count and units."""
    checks = Checks()
    rows = state.csv_rows("reorder.csv")
    if not checks.add(rows is not None, "reorder.csv is a CSV with a header"):
        return checks.result()
    assert rows is not None
    want = task.expect["rows"]
    got = [[r.get("sku"), r.get("name"), r.get("quantity"), r.get("supplier_email")] for r in rows]
    checks.add(len(got) == len(want), f"{len(want)} items to reorder")
    for i, row in enumerate(want):
        checks.add(
            i < len(got) and got[i] == [row[0], row[1], str(row[2]), row[3]],
            f"row {i + 1} is {','.join(map(str, row))}",
        )
    note = state.text("reorder.md") or ""
    checks.add(
        str(len(want)) in note and str(task.expect["total"]) in note,
        f"reorder.md says {len(want)} items, {task.expect['total']} units",
    )
    return checks.result()
