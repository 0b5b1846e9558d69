"""The browser image (orchard-test/browser, built by infra/images/build) on the Docker backend:
Debian's chromium driven by the image's Playwright renders a page that a server inside the
same network-less sandbox serves on its own 127.0.0.1 — what the browser recipe relies on.
"""

from __future__ import annotations

import importlib.metadata
import json
import struct
import textwrap

import pytest

from orchard_env_client import SandboxClient
from orchard_testing import SETUP_HINT, docker, only_backend

pytestmark = [pytest.mark.integration, only_backend("docker")]

BROWSER_IMAGE = "orchard-test/browser"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VIEWPORT = (1280, 720)

PAGE = """<!doctype html>
<html><head><title>Orchard browser image</title></head>
<body style="font-family: Arial, sans-serif">
<h1 id="hello">Hello from inside the sandbox</h1>
<button id="go" onclick="document.title = 'clicked'">Go</button>
</body></html>
"""

# Runs inside the sandbox with the image's /opt/venv/bin/python.
SCRIPT = textwrap.dedent(
    """
    import json, sys, time, urllib.request
    from playwright.sync_api import sync_playwright

    url = "http://127.0.0.1:8000/index.html"
    deadline = time.monotonic() + 30
    while True:  # the page server was started in the background just before
        try:
            urllib.request.urlopen(url, timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    out = {}
    with sync_playwright() as p:
        t = time.monotonic()
        browser = p.chromium.launch(executable_path="/usr/bin/chromium")
        out["launch_s"] = time.monotonic() - t
        width, height = int(sys.argv[1]), int(sys.argv[2])
        page = browser.new_page(viewport={"width": width, "height": height})
        t = time.monotonic()
        page.goto(url)
        out["goto_s"] = time.monotonic() - t
        # Text has a real width only when a font was found.
        out["text_width"] = page.evaluate(
            "document.getElementById('hello').getBoundingClientRect().width")
        page.click("#go")
        out["title"] = page.title()
        t = time.monotonic()
        png = page.screenshot()
        out["screenshot_s"] = time.monotonic() - t
        browser.close()
    with open("/tmp/shot.png", "wb") as f:
        f.write(png)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def client(server):
    try:
        docker("image", "inspect", "--format", "{{.Id}}", BROWSER_IMAGE)
    except RuntimeError as exc:  # fail loudly, never skip: the image is part of the setup
        raise RuntimeError(f"{BROWSER_IMAGE} is missing: {exc}; {SETUP_HINT}") from exc
    with SandboxClient(base_url=server.url) as c:
        yield c


def test_chromium_screenshots_a_page_served_inside_the_sandbox(client):
    sandbox = client.create_sandbox(BROWSER_IMAGE, block_network=True)
    try:
        sandbox.upload_content("/workspace/site/index.html", PAGE)
        sandbox.upload_content("/workspace/shot.py", SCRIPT)
        sandbox.start(
            "exec python3 -m http.server 8000 --bind 127.0.0.1 -d /workspace/site", timeout=300
        )
        job = sandbox.exec(
            ["/opt/venv/bin/python", "/workspace/shot.py", *map(str, VIEWPORT)], timeout=180
        )
        assert job.exit_code == 0, job.stderr[-4000:]
        result = json.loads(job.stdout.strip().splitlines()[-1])
        assert result["title"] == "clicked"
        assert result["text_width"] > 100
        png = sandbox.download_content("/tmp/shot.png")
        assert png[:8] == PNG_SIGNATURE
        width, height = struct.unpack(">II", png[16:24])  # IHDR, right after the signature
        assert (width, height) == VIEWPORT
        # The sandbox has no way out: only its own loopback answers.
        probe = sandbox.exec(
            [
                "python3",
                "-c",
                "import urllib.request; urllib.request.urlopen('http://deb.debian.org', timeout=3)",
            ],
            timeout=30,
        )
        assert probe.exit_code != 0
    finally:
        sandbox.delete()


def test_image_playwright_is_the_locked_version(client):
    sandbox = client.create_sandbox(BROWSER_IMAGE, block_network=True)
    try:
        job = sandbox.exec(
            [
                "/opt/venv/bin/python",
                "-c",
                "import importlib.metadata as m; print(m.version('playwright'))",
            ],
            timeout=60,
        )
        assert job.exit_code == 0, job.stderr
        assert job.stdout.strip() == importlib.metadata.version("playwright")
    finally:
        sandbox.delete()
