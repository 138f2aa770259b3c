"""The docs' drawn pictures, made from their sources and stamped with the source's hash.

``python -m tools.pictures architecture`` draws ``docs/images/architecture.svg`` from
``docs/images/architecture.mmd`` with mermaid-cli (``npx``, so it needs Node.js) driving
Debian's ``chromium`` (``apt-get install chromium``; no browser is downloaded). The SVG
is checked in, so neither is needed to build the docs or run the tests; the stamp lets a
test fail when the source changed and the picture was not drawn again.
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

__all__ = ["IMAGES", "draw_architecture", "source_hash", "stamp_of"]

IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
_STAMP = re.compile(r"<!-- source sha256: ([0-9a-f]{64}) -->")


def source_hash(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def stamp_of(svg: Path) -> str | None:
    """The source hash an SVG was stamped with, or None."""
    found = _STAMP.search(svg.read_text(encoding="utf-8"))
    return found.group(1) if found else None


def draw_architecture(images: Path = IMAGES) -> Path:
    source, svg = images / "architecture.mmd", images / "architecture.svg"
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
    if argv != ["architecture"]:
        print("usage: python -m tools.pictures architecture", file=sys.stderr)
        return 2
    print(draw_architecture())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
