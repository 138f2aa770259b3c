"""Domain errors.

BillingError
 +-- InvalidUsage          a usage record that cannot be billed (goes to the DLQ)
 +-- IllegalTransition     a lifecycle step not allowed from the current state
 |    +-- StaleOwner       a pusher whose claim of a partition is older than the newest
 +-- UnknownMeter          (also an InvalidUsage) no price for the meter
 +-- PriceListError        a price list (or a price book version) is not valid
"""

from __future__ import annotations

__all__ = [
    "BillingError",
    "IllegalTransition",
    "InvalidUsage",
    "PriceListError",
    "StaleOwner",
    "UnknownMeter",
]


class BillingError(Exception):
    """Raised when a billing rule is broken; the base of every domain error."""


class InvalidUsage(BillingError):
    """Raised when a usage record cannot be billed; the message is the DLQ reason."""


class UnknownMeter(InvalidUsage):
    """Raised when a usage record names a meter the price list does not have."""


class IllegalTransition(BillingError):
    """Raised when a transaction is asked to take a step its state does not allow."""


class StaleOwner(IllegalTransition):
    """Raised when a pusher pushes a line under a claim older than one already recorded
    on it: its process lost the line's partition to the newer claim's owner."""


class PriceListError(BillingError):
    """Raised when a price list, or a version published to the price book, is not valid."""
