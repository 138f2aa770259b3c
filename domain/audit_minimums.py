"""The audit of minimum commitments: every closed invoice's true-up recomputed.

For each invoice past ``open``, the true-ups owed are recomputed by the close's own rule
(``domain.closing.true_ups``) from the contract versions as stored (the one in force at the
period's last moment) and what the invoice's other lines bill by meter (each rounded once).
A true-up line that holds another amount, one where none is owed, and none where one is
owed are findings (kind ``minimum``).

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
from domain.closing import counts_toward_minimum, is_true_up, true_ups
from domain.contract import ContractSchedule, ContractVersion
from domain.ids import contract_id
from domain.invoice_states import InvoiceState
from domain.money import format_money

__all__ = ["check_true_ups"]


def check_true_ups(
    invoices: Iterable[InvoiceAudit],
    lines: Mapping[str, LineAudit],
    contracts: Mapping[tuple[str, int], Mapping[str, Any]],
) -> list[Finding]:
    """A finding for each true-up of a closed invoice that is not what its minimums owe."""
    schedules = _schedules(contracts)
    findings: list[Finding] = []
    for invoice in invoices:
        if invoice.state is InvoiceState.OPEN or invoice.period_end is None:
            continue
        found: dict[str, int] = {}
        billed: dict[str, int] = {}
        for line in (lines[i] for i in invoice.lines if i in lines):
            if is_true_up(line.meter):
                found[line.meter] = found.get(line.meter, 0) + line.billed
            elif counts_toward_minimum(line.meter):
                billed[line.meter] = billed.get(line.meter, 0) + line.billed
        schedule = schedules.get(str(contract_id(invoice.customer_id)))
        end = datetime.fromisoformat(invoice.period_end)
        owed = true_ups(schedule, end, invoice.currency, billed)
        version = None if schedule is None else schedule.at_end_of(end)
        basis = "no contract version" if version is None else f"contract version {version.number}"
        money = invoice.currency
        findings += [
            Finding(
                "minimum",
                invoice.invoice_id,
                f"true-up line {meter!r} holds {format_money(found.get(meter, 0), money)}, but"
                f" {basis} and usage of {format_money(sum(billed.values()), money)} owe"
                f" {format_money(owed.get(meter, 0), money)}",
            )
            for meter in sorted(found.keys() | owed.keys())
            if found.get(meter, 0) != owed.get(meter, 0)
        ]
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
            ContractVersion(
                cid,
                number,
                datetime.fromisoformat(moment),
                {},
                data["minimums"],
                data.get("meter_minimums", {}),
            )
        )
    return {cid: ContractSchedule(cid, found) for cid, found in versions.items()}
