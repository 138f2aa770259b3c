"""The receiver's code in docs/operate/receiving-webhooks.md runs as written: it accepts
a signed alert once, answers a retry of it without handling it again, and refuses an
altered body."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from billing_ledger_webhooks import signature_header

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operate" / "receiving-webhooks.md"


def _receiver() -> Any:
    (code,) = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    scope: dict[str, Any] = {}
    exec(compile(code, str(PAGE), "exec"), scope)  # noqa: S102 (our own page's code)
    return scope["receive"]


def test_the_documented_receiver_verifies_and_deduplicates(capsys: Any) -> None:
    receive = _receiver()
    body = json.dumps(
        {"id": "e1", "customer_id": "acme", "threshold": {"kind": "spend"}, "usage_id": "u-1"}
    ).encode()
    header = signature_header(body, "whsec_doc", int(time.time()))
    assert receive(body, header, "whsec_doc") == 200
    assert receive(body, header, "whsec_doc") == 200  # a retry: answered, not handled again
    assert capsys.readouterr().out.count("acme reached") == 1
    assert receive(body.replace(b"acme", b"evil"), header, "whsec_doc") == 400
    assert receive(body, header, "whsec_other") == 400
