"""The audit of minimum commitments: every closed invoice's true-up recomputed.

For each invoice past ``open``, the minimum is the one of the customer's contract version
in force at the period's last moment (``domain.contract.ContractSchedule.minimum_for``,
from the contract versions as stored), the usage total the sum of its lines other than the
true-up line (each rounded once), and the true-up owed ``max(0, minimum - usage total)``
(``domain.contract.true_up``). A true-up line that holds another amount, one where none is
owed, and none where one is owed are findings (kind ``minimum``).

Limits: a contract version set after its invoice closed, effective before the period's
end, would make a finding here (the close could not know it); so would a line losing
transactions after the close (a push refused for good), which lowers the usage total the
true-up was computed from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from domain.audit import Finding
from domain.audit_invoices import InvoiceAudit
from domain.audit_lines import LineAudit
from domain.closing import TRUE_UP_METER
from domain.contract import ContractSchedule, ContractVersion, true_up
from domain.ids import contract_id
from domain.invoice_states import InvoiceState
from domain.money import format_money

__all__ = ["check_true_ups"]


def check_true_ups(
    invoices: Iterable[InvoiceAudit],
    lines: Mapping[str, LineAudit],
    contracts: Mapping[tuple[str, int], Mapping[str, Any]],
) -> list[Finding]:
    """A finding for each closed invoice whose true-up is not what its minimum owes."""
    schedules = _schedules(contracts)
    findings: list[Finding] = []
    for invoice in invoices:
        if invoice.state is InvoiceState.OPEN or invoice.period_end is None:
            continue
        held = [lines[i] for i in invoice.lines if i in lines]
        found = sum(line.billed for line in held if line.meter == TRUE_UP_METER)
        usage = sum(line.billed for line in held if line.meter != TRUE_UP_METER)
        schedule = schedules.get(str(contract_id(invoice.customer_id)))
        minimum = (
            None
            if schedule is None
            else schedule.minimum_for(datetime.fromisoformat(invoice.period_end), invoice.currency)
        )
        owed = 0 if minimum is None else true_up(minimum[1], usage)
        if found != owed:
            money = invoice.currency
            basis = (
                "no minimum applies"
                if minimum is None
                else f"contract version {minimum[0]}'s minimum {format_money(minimum[1], money)}"
                f" less usage of {format_money(usage, money)} owes {format_money(owed, money)}"
            )
            findings.append(
                Finding(
                    "minimum",
                    invoice.invoice_id,
                    f"a true-up of {format_money(found, money)}, but {basis}",
                )
            )
    return findings


def _schedules(
    contracts: Mapping[tuple[str, int], Mapping[str, Any]],
) -> dict[str, ContractSchedule]:
    """The stored contract versions (``Contract.Set`` as stored) by contract id."""
    versions: dict[str, list[ContractVersion]] = {}
    for (cid, number), data in sorted(contracts.items()):
        moment = data["effective_from"]
        if isinstance(moment, Mapping):  # a registered type, as the transcoder stores it
            moment = moment["_data_"]
        versions.setdefault(cid, []).append(
            ContractVersion(cid, number, datetime.fromisoformat(moment), {}, data["minimums"])
        )
    return {cid: ContractSchedule(cid, found) for cid, found in versions.items()}
