"""The checked-in pictures are drawn from their checked-in sources."""

from __future__ import annotations

from pathlib import Path

from tools.pictures import IMAGES, source_hash, stamp_of


def test_the_architecture_svg_was_drawn_from_the_current_mermaid_source() -> None:
    svg = IMAGES / "architecture.svg"
    assert stamp_of(svg) == source_hash(IMAGES / "architecture.mmd"), (
        "docs/images/architecture.mmd changed: draw it again with"
        " `python -m tools.pictures architecture`"
    )


def test_the_stamp_is_read_from_the_svg_and_follows_the_source(tmp_path: Path) -> None:
    source, svg = tmp_path / "a.mmd", tmp_path / "a.svg"
    source.write_text("flowchart TB\n  A --> B\n")
    svg.write_text(f"<svg><!-- source sha256: {source_hash(source)} --></svg>")
    assert stamp_of(svg) == source_hash(source)
    source.write_text("flowchart TB\n  A --> C\n")
    assert stamp_of(svg) != source_hash(source)
    svg.write_text("<svg></svg>")
    assert stamp_of(svg) is None
