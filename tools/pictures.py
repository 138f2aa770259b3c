"""The docs' drawn pictures, made from their sources and stamped with the source's hash.

``python -m tools.pictures [NAME ...]`` draws ``docs/images/NAME.svg`` from
``docs/images/NAME.mmd`` (every source when no name is given) with mermaid-cli
(``npx``, so it needs Node.js) driving Debian's ``chromium`` (``apt-get install
chromium``; no browser is downloaded). The SVGs are checked in, so neither is needed to
build the docs or run the tests; the stamp lets a test fail when a source changed and
its picture was not drawn again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["IMAGES", "draw", "source_hash", "sources", "stamp_of"]

IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
_STAMP = re.compile(r"<!-- source sha256: ([0-9a-f]{64}) -->")


def source_hash(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def stamp_of(svg: Path) -> str | None:
    """The source hash an SVG was stamped with, or None."""
    found = _STAMP.search(svg.read_text(encoding="utf-8"))
    return found.group(1) if found else None


def sources(images: Path = IMAGES) -> list[Path]:
    """Every picture's source."""
    return sorted(images.glob("*.mmd"))


def draw(source: Path) -> Path:
    """Draw ``source`` (a Mermaid file) to the SVG beside it, stamped with its hash."""
    images, svg = source.parent, source.with_suffix(".svg")
    chromium, npx = shutil.which("chromium"), shutil.which("npx")
    if chromium is None or npx is None:
        raise SystemExit("drawing the picture needs chromium (apt) and npx (Node.js)")
    with tempfile.TemporaryDirectory() as tmp:
        browser = Path(tmp) / "puppeteer.json"
        browser.write_text(json.dumps({"executablePath": chromium, "args": ["--no-sandbox"]}))
        subprocess.run(
            [npx, "--yes", "-p", "@mermaid-js/mermaid-cli", "mmdc", "-i", str(source),
             "-o", str(svg), "-c", str(images / "mermaid.json"), "-p", str(browser),
             "-b", "white"],
            check=True,
            env={**os.environ, "PUPPETEER_SKIP_DOWNLOAD": "1"},
        )  # fmt: skip
    drawn = svg.read_text(encoding="utf-8")
    stamp = f"<!-- source sha256: {source_hash(source)} -->"
    svg.write_text(drawn.replace(">", ">" + stamp, 1), encoding="utf-8")
    return svg


def main(argv: list[str]) -> int:
    wanted = [IMAGES / f"{name}.mmd" for name in argv] or sources()
    missing = [str(p) for p in wanted if not p.is_file()]
    if missing:
        print(f"no picture source: {', '.join(missing)}", file=sys.stderr)
        return 2
    for source in wanted:
        print(draw(source))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
