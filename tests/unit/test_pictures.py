"""The checked-in pictures are drawn from their checked-in sources."""

from __future__ import annotations

from pathlib import Path

from tools.pictures import source_hash, sources, stamp_of


def test_every_picture_was_drawn_from_its_current_mermaid_source() -> None:
    drawn = {p.stem for p in sources()}
    assert {"architecture", "transaction-states", "invoice-states"} <= drawn
    stale = [
        p.name
        for p in sources()
        if not p.with_suffix(".svg").is_file() or stamp_of(p.with_suffix(".svg")) != source_hash(p)
    ]
    assert stale == [], f"draw them again: python -m tools.pictures {' '.join(stale)}"


def test_the_stamp_is_read_from_the_svg_and_follows_the_source(tmp_path: Path) -> None:
    source, svg = tmp_path / "a.mmd", tmp_path / "a.svg"
    source.write_text("flowchart TB\n  A --> B\n")
    svg.write_text(f"<svg><!-- source sha256: {source_hash(source)} --></svg>")
    assert stamp_of(svg) == source_hash(source)
    source.write_text("flowchart TB\n  A --> C\n")
    assert stamp_of(svg) != source_hash(source)
    svg.write_text("<svg></svg>")
    assert stamp_of(svg) is None
