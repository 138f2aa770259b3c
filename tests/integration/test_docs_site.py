"""The documentation site, checked as a reader sees it: built with ``mkdocs build --strict``,
served over HTTP and opened in headless Chromium (Debian's ``chromium`` package, driven
by Playwright against that system browser: no browser is downloaded).

Three pages a reader lands on (the index, a runbook, the benchmarks) load with no console
error, no failed request and every image drawn (``naturalWidth`` above zero); every
internal link, image, stylesheet and script of every built page answers 200.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
READER_PAGES = ("", "operate/runbooks/stripe-down/", "benchmarks/")


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(
            "the docs check needs Debian's chromium: `apt-get install -y chromium`"
            " (make test installs it: infra/debian-packages.sh)"
        )
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_Quiet, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"a": "href", "img": "src", "link": "href", "script": "src"}.get(tag)
        for name, value in attrs:
            if name == wanted and value:
                self.targets.append(value)


def _internal_targets(site: Path, base: str) -> dict[str, set[str]]:
    """Every internal URL the built pages refer to, with the pages that refer to it."""
    found: dict[str, set[str]] = {}
    for page in site.rglob("*.html"):
        page_url = urljoin(base, page.relative_to(site).as_posix())
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        for target in parser.targets:
            url = urljoin(page_url, target)
            parts = urlsplit(url)
            if not url.startswith(base):
                continue  # outside the site: not ours to check here
            found.setdefault(parts._replace(fragment="").geturl(), set()).add(page_url)
    return found


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (loopback)
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_every_internal_link_image_and_asset_of_the_site_answers(site: Path, served: str) -> None:
    targets = _internal_targets(site, served)
    assert len(targets) > 20  # the walk found the site's pages, not an empty build
    broken = {url: sorted(pages)[:3] for url, pages in targets.items() if _status(url) != 200}
    assert broken == {}


def _visit(browser: Any, url: str) -> tuple[list[str], list[str], int]:
    """What went wrong loading ``url``, the images it did not draw, and how many it drew."""
    page = browser.new_page()
    problems: list[str] = []
    page.on(
        "console",
        lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
    answer = page.goto(url, wait_until="networkidle")
    if answer is None or answer.status != 200:
        problems.append(f"answered {answer.status if answer else None}")
    if not page.title():
        problems.append("no title")
    images = page.evaluate(
        "Array.from(document.images).map(i => [i.currentSrc, i.complete, i.naturalWidth])"
    )
    page.close()
    undrawn = [src for src, complete, width in images if not complete or width <= 0]
    return problems, undrawn, len(images) - len(undrawn)


def test_the_pages_a_reader_lands_on_load_without_errors_and_draw_every_image(
    served: str,
) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            seen = {path: _visit(browser, served + path) for path in READER_PAGES}
        finally:
            browser.close()
    assert {path: seen[path][:2] for path in READER_PAGES} == {p: ([], []) for p in READER_PAGES}
    assert seen[""][2] >= 1  # the index shows the architecture picture
