"""The incident picture (``tools.incident_picture``), drawn from the measured run kept
beside it in docs/images: the measured side and the model side each say what they are,
and the picture kept in the repository carries the model's label too. No service is
started (the kept series stands for the run)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from tools.incident_picture import MODEL_LABELS, MODEL_TITLE, main
from tools.plots import LABELS

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
SVG = "{http://www.w3.org/2000/svg}"


def _texts(path: Path) -> set[str]:
    root = ET.parse(path).getroot()  # noqa: S314 (a file of this repository or this test)
    return {" ".join("".join(t.itertext()).split()) for t in root.iter(SVG + "text")}


def test_the_picture_sets_the_measured_run_beside_a_model_labelled_as_one(
    tmp_path: Path,
) -> None:
    out = tmp_path / "incident.svg"
    assert main([str(out), "--series", str(IMAGES / "incident-series.json")]) == 0
    texts = _texts(out)
    assert "MEASURED: this ledger (bench outage)" in texts
    assert {LABELS["backlog"], LABELS["requests"], LABELS["outage"]} <= texts
    assert {MODEL_TITLE, *MODEL_LABELS.values()} <= texts
    assert any(t.startswith("Measured: billing-ledger bench outage --rate") for t in texts)
    assert any(t.startswith("Model (tools/incident_model.py), not measured:") for t in texts)


def test_the_picture_in_the_docs_is_labelled_as_measured_and_model() -> None:
    texts = _texts(IMAGES / "incident.svg")
    assert MODEL_TITLE in texts and "MEASURED: this ledger (bench outage)" in texts


def test_a_picture_of_an_unknown_format_is_refused_before_anything_is_measured(
    tmp_path: Path,
) -> None:
    assert main([str(tmp_path / "incident.gif")]) == 2
    assert list(tmp_path.iterdir()) == []
