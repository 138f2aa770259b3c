"""``python -m adapters.cli``: the ``billing-ledger`` command."""

from __future__ import annotations

import sys

from adapters.cli.main import main

sys.exit(main())
