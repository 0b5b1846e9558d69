"""The offline site server: runs INSIDE the sandbox (stdlib only), next to the browser.

    python3 site_server.py --port 8000 --root DIR

``DIR`` holds this file, ``data.json`` (the sites' content) and ``miniwob/`` (the MiniWoB++
pages of the ``miniwob`` package). Served on 127.0.0.1:

- ``/miniwob/...``            MiniWoB++ pages, static
- ``/sites/gazetteer/...``    a search site: search box -> results -> town pages
- ``/sites/garden/...``       a form with server-side validation -> confirmation
- ``/sites/shop/...``         catalogue -> product -> cart -> checkout -> order placed
- ``GET /__state``            what the sites recorded (form submissions, cart, orders, searches)
- ``POST /__reset``           forget all of it (a new episode)
- ``GET /__health``           ``{"ok": true}``

Pages are plain HTML forms and links (no JavaScript), so every control is a real link,
button or labelled input. State lives in memory for the life of the process: one sandbox,
one user, episodes in sequence.
"""

from __future__ import annotations

import argparse
import html
import json
import mimetypes
import os
import re
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
MAX_BODY = 1 << 16

STYLE = """
body { font-family: sans-serif; margin: 0; background: #f6f7f4; color: #222; }
header { background: #2f5d3a; color: white; padding: 14px 24px; }
header a { color: white; margin-right: 18px; font-size: 18px; }
main { padding: 20px 24px; max-width: 900px; }
input[type=text], input[type=email], input[type=search], input[type=number], textarea {
  font-size: 16px; padding: 6px 8px; width: 320px; }
button { font-size: 16px; padding: 8px 16px; margin: 6px 0; cursor: pointer; }
label { font-size: 16px; }
.field { margin: 12px 0; }
.error { color: #a40000; font-weight: bold; }
table.facts { border-collapse: collapse; margin-top: 10px; }
table.facts th, table.facts td { border: 1px solid #bbb; padding: 6px 12px; text-align: left; }
ul.results li, ul.products li { margin: 8px 0; font-size: 17px; }
"""


class State:
    """What the sites record during an episode (one user per sandbox)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.searches: list[str] = []
        self.submissions: list[dict[str, Any]] = []
        self.rejected: int = 0
        self.cart: dict[str, int] = {}
        self.orders: list[dict[str, Any]] = []

    def to_dict(self) -> dict[str, Any]:
        return {
            "gazetteer": {"searches": list(self.searches)},
            "garden": {"submissions": list(self.submissions), "rejected": self.rejected},
            "shop": {"cart": dict(self.cart), "orders": list(self.orders)},
        }


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def page(title: str, site_title: str, nav: list[tuple[str, str]], body: str) -> str:
    links = "".join(f'<a href="{esc(href)}">{esc(text)}</a>' for text, href in nav)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<header><strong style='margin-right:24px'>{esc(site_title)}</strong>{links}</header>"
        f"<main>{body}</main></body></html>"
    )


def money(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


_Done = Callable[[str, str], tuple[int, str]]
"""A shop page's renderer: (heading, body HTML) -> (status, page)."""


class Sites:
    def __init__(self, data: dict[str, Any], state: State) -> None:
        self.data = data
        self.state = state
        self.towns = {t["slug"]: t for t in data["gazetteer"]["towns"]}
        self.products = {p["sku"]: p for p in data["shop"]["products"]}

    # ------------------------------------------------------------ gazetteer

    def gazetteer(self, path: str, query: dict[str, str]) -> tuple[int, str]:
        g = self.data["gazetteer"]
        nav = [("Home", "/sites/gazetteer/"), ("All towns", "/sites/gazetteer/towns")]
        search_form = (
            "<form action='/sites/gazetteer/search' method='get' role='search'>"
            "<input type='search' name='q' aria-label='Search towns' placeholder='Search towns'"
            f" value='{esc(query.get('q', ''))}'> <button type='submit'>Search</button></form>"
        )
        if path in ("", "/"):
            body = (
                f"<h1>{esc(g['title'])}</h1><p>Facts about the towns of the Riverlands: "
                "population, founding year, elevation and mayor. Search for a town by name.</p>"
                + search_form
            )
            return 200, page(g["title"], g["title"], nav, body)
        if path == "/search":
            q = query.get("q", "").strip()
            with self.state.lock:
                self.state.searches.append(q)
            words = q.lower().split()
            hits = [t for t in g["towns"] if words and all(w in t["name"].lower() for w in words)]
            items = "".join(
                f"<li><a href='/sites/gazetteer/town/{esc(t['slug'])}'>{esc(t['name'])}</a>"
                f" &mdash; {esc(t['region'])}</li>"
                for t in hits
            )
            result = (
                f"<p>{len(hits)} result(s) for &ldquo;{esc(q)}&rdquo;</p><ul class='results'>{items}</ul>"
                if hits
                else f"<p>No towns match &ldquo;{esc(q)}&rdquo;.</p>"
            )
            body = f"<h1>Search</h1>{search_form}{result}"
            return 200, page(f"Search: {q} - {g['title']}", g["title"], nav, body)
        if path == "/towns":
            items = "".join(
                f"<li><a href='/sites/gazetteer/town/{esc(t['slug'])}'>{esc(t['name'])}</a></li>"
                for t in sorted(g["towns"], key=lambda t: t["name"])
            )
            body = f"<h1>All towns</h1><ul class='results'>{items}</ul>"
            return 200, page(f"All towns - {g['title']}", g["title"], nav, body)
        match = re.fullmatch(r"/town/([a-z0-9-]+)", path)
        if match and match.group(1) in self.towns:
            t = self.towns[match.group(1)]
            rows = [
                ("Region", t["region"]),
                ("Population", f"{t['population']:,}"),
                ("Founded", t["founded"]),
                ("Elevation", f"{t['elevation_m']} m"),
                ("Mayor", t["mayor"]),
                ("River", t["river"]),
            ]
            # Focusable rows: each fact is an element of its own, so a mark names it.
            table = "".join(
                f"<tr tabindex='0'><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows
            )
            body = f"<h1>{esc(t['name'])}</h1>{search_form}<table class='facts'>{table}</table>"
            return 200, page(f"{t['name']} - {g['title']}", g["title"], nav, body)
        return 404, page("Not found", g["title"], nav, "<h1>Page not found</h1>")

    # ------------------------------------------------------------ garden (form)

    def garden_form(self, values: dict[str, str], errors: list[str]) -> str:
        g = self.data["garden"]
        nav = [("Apply for a plot", "/sites/garden/")]

        def radios(name: str, options: list[str], legend: str) -> str:
            inner = "".join(
                f"<label><input type='radio' name='{name}' value='{esc(o)}'"
                f"{' checked' if values.get(name) == o else ''}> {esc(o)}</label> "
                for o in options
            )
            return f"<fieldset class='field'><legend>{esc(legend)}</legend>{inner}</fieldset>"

        error_html = (
            "<div role='alert' class='error'><p>Please fix the following:</p><ul>"
            + "".join(f"<li>{esc(e)}</li>" for e in errors)
            + "</ul></div>"
            if errors
            else ""
        )
        body = (
            f"<h1>Apply for a garden plot</h1>{error_html}"
            "<form action='/sites/garden/apply' method='post' novalidate>"
            "<div class='field'><label for='full_name'>Full name</label><br>"
            f"<input type='text' id='full_name' name='full_name' value='{esc(values.get('full_name', ''))}'></div>"
            "<div class='field'><label for='email'>Email</label><br>"
            f"<input type='email' id='email' name='email' value='{esc(values.get('email', ''))}'></div>"
            + radios("plot", g["plots"], "Plot size")
            + radios("watering", g["watering"], "Watering slot")
            + "<div class='field'><label><input type='checkbox' name='agree' value='yes'"
            + (" checked" if values.get("agree") else "")
            + "> I agree to the garden rules</label></div>"
            "<button type='submit'>Submit application</button></form>"
        )
        return page("Apply for a plot - " + g["title"], g["title"], nav, body)

    def garden(
        self, method: str, path: str, query: dict[str, str], form: dict[str, str]
    ) -> tuple[int, str] | str:
        g = self.data["garden"]
        if method == "GET" and path in ("", "/"):
            return 200, self.garden_form({}, [])
        if method == "POST" and path == "/apply":
            values = {
                k: form.get(k, "").strip()
                for k in ("full_name", "email", "plot", "watering", "agree")
            }
            errors = []
            if not values["full_name"]:
                errors.append("Full name is required.")
            if not EMAIL_RE.match(values["email"]):
                errors.append("Enter a valid email address.")
            if values["plot"] not in g["plots"]:
                errors.append("Choose a plot size.")
            if values["watering"] not in g["watering"]:
                errors.append("Choose a watering slot.")
            if values["agree"] != "yes":
                errors.append("You must agree to the garden rules.")
            if errors:
                with self.state.lock:
                    self.state.rejected += 1
                return 200, self.garden_form(values, errors)
            record = {
                "full_name": values["full_name"],
                "email": values["email"],
                "plot": values["plot"],
                "watering": values["watering"],
                "agree": True,
            }
            with self.state.lock:
                self.state.submissions.append(record)
                number = len(self.state.submissions)
            return f"/sites/garden/thanks?ref=NB-{number:04d}"
        if method == "GET" and path == "/thanks":
            ref = query.get("ref", "")
            body = (
                "<h1>Application received</h1>"
                f"<p>Thank you. Your reference number is <strong>{esc(ref)}</strong>.</p>"
                "<p><a href='/sites/garden/'>Back to the application form</a></p>"
            )
            return 200, page("Application received - " + g["title"], g["title"], [], body)
        return 404, page("Not found", g["title"], [], "<h1>Page not found</h1>")

    # ------------------------------------------------------------ shop

    def shop(
        self, method: str, path: str, query: dict[str, str], form: dict[str, str]
    ) -> tuple[int, str] | str:
        with self.state.lock:
            count = sum(self.state.cart.values())
        nav = [("Catalogue", "/sites/shop/"), (f"Cart ({count})", "/sites/shop/cart")]
        title = self.data["shop"]["title"]

        def done(heading: str, body: str) -> tuple[int, str]:
            return 200, page(f"{heading} - {title}", title, nav, body)

        product = re.fullmatch(r"/product/([a-z0-9-]+)", path)
        order = re.fullmatch(r"/order/(\d+)", path)
        answer: tuple[int, str] | str | None = None
        if method == "GET" and path in ("", "/"):
            answer = self._shop_catalogue(done)
        elif method == "GET" and product and product.group(1) in self.products:
            answer = self._shop_product(done, self.products[product.group(1)])
        elif method == "POST" and path == "/cart/add":
            answer = self._shop_cart_add(done, form)
        elif method == "POST" and path == "/cart/remove":
            with self.state.lock:
                self.state.cart.pop(form.get("sku", ""), None)
            answer = "/sites/shop/cart"
        elif method == "GET" and path == "/cart":
            answer = self._shop_cart(done)
        elif path == "/checkout" and method in ("GET", "POST"):
            answer = self._shop_checkout(done, method, form)
        elif method == "GET" and order:
            answer = self._shop_order(done, int(order.group(1)))
        if answer is None:
            return 404, page("Not found", title, nav, "<h1>Page not found</h1>")
        return answer

    def _shop_catalogue(self, done: _Done) -> tuple[int, str]:
        items = "".join(
            f"<li><a href='/sites/shop/product/{esc(p['sku'])}'>{esc(p['name'])}</a>"
            f" &mdash; {money(p['price_cents'])}</li>"
            for p in self.data["shop"]["products"]
        )
        return done("Catalogue", f"<h1>Catalogue</h1><ul class='products'>{items}</ul>")

    def _shop_product(self, done: _Done, p: dict[str, Any]) -> tuple[int, str]:
        body = (
            f"<h1>{esc(p['name'])}</h1><p>{esc(p['description'])}</p>"
            f"<p>Price: <strong>{money(p['price_cents'])}</strong></p>"
            "<form action='/sites/shop/cart/add' method='post'>"
            f"<input type='hidden' name='sku' value='{esc(p['sku'])}'>"
            "<div class='field'><label for='qty'>Quantity</label> "
            "<input type='number' id='qty' name='qty' value='1' min='1' max='20' style='width:80px'></div>"
            "<button type='submit'>Add to cart</button></form>"
        )
        return done(p["name"], body)

    def _shop_cart_add(self, done: _Done, form: dict[str, str]) -> tuple[int, str] | str:
        sku = form.get("sku", "")
        try:
            qty = int(form.get("qty", "1").strip() or "1")
        except ValueError:
            qty = 0
        if sku not in self.products or not 1 <= qty <= 20:
            return done("Error", "<p role='alert' class='error'>Invalid quantity.</p>")
        with self.state.lock:
            self.state.cart[sku] = self.state.cart.get(sku, 0) + qty
        return "/sites/shop/cart"

    def _shop_cart(self, done: _Done) -> tuple[int, str]:
        with self.state.lock:
            cart = dict(self.state.cart)
        if not cart:
            return done(
                "Cart",
                "<h1>Your cart</h1><p>Your cart is empty.</p>"
                "<p><a href='/sites/shop/'>Continue shopping</a></p>",
            )
        rows = "".join(
            f"<tr><td>{esc(self.products[sku]['name'])}</td><td>{qty}</td>"
            f"<td>{money(qty * self.products[sku]['price_cents'])}</td><td>"
            "<form action='/sites/shop/cart/remove' method='post' style='margin:0'>"
            f"<input type='hidden' name='sku' value='{esc(sku)}'>"
            f"<button type='submit' aria-label='Remove {esc(self.products[sku]['name'])}'>Remove</button>"
            "</form></td></tr>"
            for sku, qty in cart.items()
        )
        total = sum(q * self.products[k]["price_cents"] for k, q in cart.items())
        body = (
            "<h1>Your cart</h1><table class='facts'><tr><th>Item</th><th>Quantity</th>"
            f"<th>Price</th><th></th></tr>{rows}</table><p>Total: <strong>{money(total)}</strong></p>"
            "<p><a href='/sites/shop/'>Continue shopping</a> &nbsp; "
            "<a href='/sites/shop/checkout'>Proceed to checkout</a></p>"
        )
        return done("Cart", body)

    @staticmethod
    def _checkout_errors(values: dict[str, str]) -> list[str]:
        errors: list[str] = []
        if not values["name"]:
            errors.append("Name is required.")
        if not values["address"]:
            errors.append("Street address is required.")
        if not values["city"]:
            errors.append("City is required.")
        if values["shipping"] not in ("Standard", "Express"):
            errors.append("Choose a shipping method.")
        return errors

    def _shop_checkout(
        self, done: _Done, method: str, form: dict[str, str]
    ) -> tuple[int, str] | str:
        with self.state.lock:
            cart = dict(self.state.cart)
        if not cart:
            return done("Checkout", "<h1>Checkout</h1><p>Your cart is empty.</p>")
        values = {k: form.get(k, "").strip() for k in ("name", "address", "city", "shipping")}
        errors = self._checkout_errors(values) if method == "POST" else []
        if method == "POST" and not errors:
            total = sum(q * self.products[k]["price_cents"] for k, q in cart.items())
            order = {"items": cart, **values, "total_cents": total}
            with self.state.lock:
                self.state.orders.append(order)
                self.state.cart = {}
                number = len(self.state.orders)
            return f"/sites/shop/order/{number}"
        error_html = (
            "<div role='alert' class='error'><ul>"
            + "".join(f"<li>{esc(e)}</li>" for e in errors)
            + "</ul></div>"
            if errors
            else ""
        )

        def field(name: str, label: str) -> str:
            return (
                f"<div class='field'><label for='{name}'>{label}</label><br>"
                f"<input type='text' id='{name}' name='{name}' value='{esc(values[name])}'></div>"
            )

        ship = "".join(
            f"<label><input type='radio' name='shipping' value='{o}'"
            f"{' checked' if values['shipping'] == o else ''}> {o} shipping</label> "
            for o in ("Standard", "Express")
        )
        body = (
            f"<h1>Checkout</h1>{error_html}<form action='/sites/shop/checkout' method='post'>"
            + field("name", "Full name")
            + field("address", "Street address")
            + field("city", "City")
            + f"<fieldset class='field'><legend>Shipping</legend>{ship}</fieldset>"
            "<button type='submit'>Place order</button></form>"
        )
        return done("Checkout", body)

    def _shop_order(self, done: _Done, n: int) -> tuple[int, str] | None:
        with self.state.lock:
            orders = list(self.state.orders)
        if not 1 <= n <= len(orders):
            return None
        o = orders[n - 1]
        lines = "".join(
            f"<li>{q} &times; {esc(self.products[k]['name'])}</li>" for k, q in o["items"].items()
        )
        body = (
            f"<h1>Order placed</h1><p>Order number <strong>GH-{n:04d}</strong>, "
            f"total {money(o['total_cents'])}, {esc(o['shipping'])} shipping to "
            f"{esc(o['name'])}, {esc(o['address'])}, {esc(o['city'])}.</p><ul>{lines}</ul>"
        )
        return done("Order placed", body)

    def index(self) -> str:
        body = (
            "<h1>Offline sites</h1><ul>"
            + "".join(
                f"<li><a href='/sites/{name}/'>{esc(self.data[name]['title'])}</a></li>"
                for name in ("gazetteer", "garden", "shop")
            )
            + "<li><a href='/miniwob/miniwob/'>MiniWoB++</a></li></ul>"
        )
        return page("Offline sites", "Offline sites", [], body)


class _Handler(BaseHTTPRequestHandler):
    """The site server's HTTP handler; :func:`make_handler` binds it to its sites."""

    protocol_version = "HTTP/1.1"
    miniwob_root: str
    sites: Sites
    state: State

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(
        self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _html(self, status: int, text: str) -> None:
        self._send(status, text.encode("utf-8"), "text/html; charset=utf-8")

    def _static(self, rel: str) -> None:
        root = self.miniwob_root
        target = os.path.realpath(os.path.join(root, rel))
        if os.path.isdir(target):
            names = sorted(os.listdir(target))
            links = "".join(f"<li><a href='{esc(n)}'>{esc(n)}</a></li>" for n in names)
            self._html(200, f"<html><body><ul>{links}</ul></body></html>")
            return
        if not target.startswith(root + os.sep) or not os.path.isfile(target):
            self._html(404, "<h1>Not found</h1>")
            return
        ctype = mimetypes.guess_type(target)[0] or "application/octet-stream"
        with open(target, "rb") as fh:
            self._send(200, fh.read(), ctype)

    def _control(self, method: str, path: str) -> bool:
        """The server's own routes (health, state, reset, index); whether one answered."""
        state = self.state
        if path == "/__health":
            self._json(200, {"ok": True})
        elif path == "/__state" and method == "GET":
            with state.lock:
                self._json(200, state.to_dict())
        elif path == "/__reset" and method == "POST":
            with state.lock:
                state.reset()
            self._json(200, {"ok": True})
        elif path in ("/", ""):
            self._html(200, self.sites.index())
        elif path.startswith("/miniwob/") and method == "GET":
            self._static(path[len("/miniwob/") :])
        else:
            return False
        return True

    def _site(self, method: str, path: str, query: dict[str, str], form: dict[str, str]) -> None:
        match = re.fullmatch(r"/sites/(gazetteer|garden|shop)(/.*)?", path)
        if not match:
            self._html(404, "<h1>Not found</h1>")
            return
        name, sub = match.group(1), match.group(2) or ""
        if name == "gazetteer":
            result: tuple[int, str] | str = (
                self.sites.gazetteer(sub, query) if method == "GET" else (405, "")
            )
        elif name == "garden":
            result = self.sites.garden(method, sub, query, form)
        else:
            result = self.sites.shop(method, sub, query, form)
        if isinstance(result, str):  # POST/redirect/GET
            self._send(303, b"", "text/plain", {"Location": result})
        else:
            self._html(*result)

    def _route(self, method: str) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(parsed.path)
        query = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
        form: dict[str, str] = {}
        if method == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._json(413, {"error": "body too large"})
                return
            raw = self.rfile.read(length).decode("utf-8", "replace")
            form = dict(urllib.parse.parse_qsl(raw, keep_blank_values=True))
        if not self._control(method, path):
            self._site(method, path, query, form)

    def do_GET(self) -> None:
        self._route("GET")

    def do_HEAD(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")


def make_handler(root: str, sites: Sites, state: State) -> type[BaseHTTPRequestHandler]:
    """The handler class serving ``sites`` and the MiniWoB++ files under ``root``."""
    bound = {
        "miniwob_root": os.path.realpath(os.path.join(root, "miniwob")),
        "sites": sites,
        "state": state,
    }
    return type("Handler", (_Handler,), bound)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--root", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args(argv)
    with open(os.path.join(args.root, "data.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    state = State()
    server = ThreadingHTTPServer(
        (args.host, args.port), make_handler(args.root, Sites(data, state), state)
    )
    server.daemon_threads = True
    print(f"site server on http://{args.host}:{args.port}/", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
