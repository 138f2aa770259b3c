"""``python -m infra.stripe_emulator``: run the emulator in the foreground (see :mod:`.cli`)."""

from __future__ import annotations

from .cli import main

__all__: list[str] = []

if __name__ == "__main__":
    raise SystemExit(main())
