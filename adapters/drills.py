"""Fault drills: wrappers installed around the parts ``adapters.bootstrap`` built, so a
process dies (SIGKILL) or a role fails at a chosen moment. ``billing-ledger run
--drill NAME`` (hidden) installs one; the drills in ``tests/drills`` use them to prove
that nothing is lost or billed twice across a crash. Production constructors take no
drill switches.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from adapters.charging.pusher import LinePusher
from store.ledger import BillingLedger

__all__ = ["DRILLS", "DrillFailure", "fail_first_call", "install_drill"]

DRILLS = (
    "kill_after_save",
    "kill_after_stripe",
    "kill_before_stripe",
    "kill_after_finalize",
    "fail_charge_once",
)


def install_drill(drill: str, *, ledger: BillingLedger | None, pusher: LinePusher | None) -> None:
    """Wrap the built parts so that the process dies (SIGKILL) at the drill's moment:

    * ``kill_after_save``: after an ingest batch is saved (``ledger``), before its
      offsets commit;
    * ``kill_before_stripe``: as a line push is about to set its items in Stripe;
    * ``kill_after_stripe``: after Stripe answered a line push, before it is recorded;
    * ``kill_after_finalize``: after Stripe answered an invoice's finalize, before the
      closer records it (the closer shares the pusher's Stripe client).

    (``fail_charge_once`` is installed on the charge role as it is built: its first
    poll raises, once per process, so the role fails and is restarted.)
    """
    if drill not in DRILLS:
        raise ValueError(f"unknown drill {drill!r} (one of: {', '.join(DRILLS)})")
    if drill == "kill_after_save" and ledger is not None:
        _wrap(ledger, "save_decided", after=_die)  # record_usage's saves and write-behind's
    if pusher is not None and drill == "kill_before_stripe":
        _wrap(pusher.gateway, "set_line_items", before=_die)
    elif pusher is not None and drill == "kill_after_stripe":
        _wrap(pusher.gateway, "set_line_items", after=_die)
    elif pusher is not None and drill == "kill_after_finalize":
        _wrap(pusher.gateway, "finalize_invoice", after=_die)


class DrillFailure(RuntimeError):
    """Raised on purpose by the ``fail_charge_once`` drill."""


def fail_first_call(obj: object, name: str, armed: list[bool]) -> None:
    """Make the next call of ``obj.name`` raise, while ``armed`` (once per process)."""

    def fail() -> None:
        if armed[0]:
            armed[0] = False
            raise DrillFailure(f"drill: {name} fails once")

    _wrap(obj, name, before=fail)


def _wrap(
    obj: object,
    name: str,
    *,
    before: Callable[[], None] = lambda: None,
    after: Callable[[], None] = lambda: None,
) -> None:
    original = getattr(obj, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        before()
        result = original(*args, **kwargs)
        after()
        return result

    setattr(obj, name, wrapped)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
