"""``make mutate``'s verdict: mutmut's results for ``domain/`` and the money path
outside it (``adapters/charging/``, the Stripe client, the webhook handler), per file.

mutmut 3 keeps one ``mutants/<path>.py.meta`` (JSON) per mutated file, with each
mutant's exit code. This reads them, without mutmut's own code, and prints a table:
killed (a test failed, or the mutant timed out), survived, no tests (no test runs the
mutated function), judged equivalent, and the score, killed / (all - equivalent).

The mutants judged equivalent are listed by name, each with its reason, in
``tests/README.md``. The run fails when any file scores below ``MODULE_THRESHOLD``, when
``domain/`` in total scores below ``TOTAL_THRESHOLD``, or when a mutant of ``domain/``
is not killed and not in that list (the domain is held to every mutant; the adapters to
the per-file threshold, their other survivors printed).

    python -m tools.mutation_report [--mutants mutants] [--equivalent tests/README.md]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ModuleResult", "main", "read_equivalent", "read_results", "verdict"]

TOTAL_THRESHOLD = 95.0
MODULE_THRESHOLD = 90.0

# mutmut's exit codes (mutmut.stats.status_by_exit_code): a timeout (SIGXCPU) or a
# mutant the type checker refused counts as killed, as mutmut's own score counts it.
_KILLED = {1, 3, 24, -24, 152, 255, 36, 37}
_SURVIVED = {0}
_NO_TESTS = {5, 33}
_SKIPPED = {34}
_NAME = re.compile(r"`((?:domain|adapters)\.[\w.ǁ]+__mutmut_\d+)`")
# The folders mutated (``[tool.mutmut] source_paths``), each with its own total row.
PARTS = ("domain", "adapters")


@dataclass
class ModuleResult:
    """One module's mutants by outcome (names kept for what is not killed)."""

    module: str
    killed: int = 0
    equivalent: list[str] = field(default_factory=list)
    survived: list[str] = field(default_factory=list)
    no_tests: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # not run, skipped, suspicious, segfault

    @property
    def counted(self) -> int:
        """Every mutant but those judged equivalent."""
        return self.killed + len(self.survived) + len(self.no_tests) + len(self.other)

    @property
    def score(self) -> float | None:
        return 100.0 * self.killed / self.counted if self.counted else None


def read_equivalent(path: Path) -> set[str]:
    """The mutant names listed (in backquotes) in ``path``."""
    return set(_NAME.findall(path.read_text(encoding="utf-8"))) if path.exists() else set()


def read_results(mutants: Path, equivalent: set[str]) -> list[ModuleResult]:
    """Each file's results from mutmut's ``.meta`` files under ``mutants/<part>``."""
    results = []
    metas = (m for part in PARTS for m in sorted((mutants / part).rglob("*.py.meta")))
    for meta in metas:
        module = meta.relative_to(mutants).as_posix().removesuffix(".meta")
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        results.append(_classify(module, codes.items(), equivalent))
    return results


def _classify(
    module: str, codes: Iterable[tuple[str, int | None]], equivalent: set[str]
) -> ModuleResult:
    result = ModuleResult(module)
    for name, code in sorted(codes):
        if name in equivalent and code not in _KILLED:
            result.equivalent.append(name)
        elif code in _KILLED:
            result.killed += 1
        elif code in _SURVIVED:
            result.survived.append(name)
        elif code in _NO_TESTS:
            result.no_tests.append(name)
        elif code not in _SKIPPED:
            result.other.append(name)
    return result


def verdict(results: Sequence[ModuleResult], equivalent: set[str]) -> tuple[list[str], bool]:
    """The report's lines, and whether every threshold holds."""
    lines = [
        f"{'file':<38}{'mutants':>8}{'killed':>8}{'survived':>9}{'no tests':>9}"
        f"{'equiv.':>7}{'other':>6}{'score':>8}"
    ]
    ok = True
    totals = {part: ModuleResult(f"{part}/ (total)") for part in PARTS}
    for r in results:
        lines.append(_row(r))
        total = totals[r.module.split("/", 1)[0]]
        total.killed += r.killed
        for name in ("equivalent", "survived", "no_tests", "other"):
            getattr(total, name).extend(getattr(r, name))
        if r.score is not None and r.score < MODULE_THRESHOLD:
            ok = False
            lines.append(f"  ^ below the {MODULE_THRESHOLD:.0f}% a file must reach")
    lines += [_row(t) for t in totals.values() if t.counted or t.equivalent]
    lines.append("")
    domain, adapters = totals["domain"], totals["adapters"]
    if domain.score is None or domain.score < TOTAL_THRESHOLD:
        ok = False
        lines.append(f"FAIL: domain/ in total is below {TOTAL_THRESHOLD:.0f}%")
    unexplained = domain.survived + domain.no_tests + domain.other
    if unexplained:
        ok = False
        lines.append(
            f"FAIL: {len(unexplained)} mutants of domain/ not killed and not judged equivalent:"
        )
        lines += [f"  {name}" for name in unexplained]
    within = adapters.survived + adapters.no_tests + adapters.other
    if within:
        lines.append(f"{len(within)} mutants of adapters/ not killed (each file within its"
                     f" threshold unless marked above):")  # fmt: skip
        lines += [f"  {name}" for name in within]
    seen = {n for r in results for n in r.equivalent}
    stale = sorted(equivalent - seen)
    if stale:
        lines.append("note: listed as equivalent but killed or gone (update the list):")
        lines += [f"  {name}" for name in stale]
    if ok:
        lines.append(
            f"OK: domain/ {domain.score:.1f}% killed (>= {TOTAL_THRESHOLD:.0f}%, every survivor"
            f" judged equivalent), no file below {MODULE_THRESHOLD:.0f}%"
        )
    return lines, ok


def _row(r: ModuleResult) -> str:
    score = "-" if r.score is None else f"{r.score:.1f}%"
    return (
        f"{r.module:<38}{r.counted + len(r.equivalent):>8}{r.killed:>8}{len(r.survived):>9}"
        f"{len(r.no_tests):>9}{len(r.equivalent):>7}{len(r.other):>6}{score:>8}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, default=Path("mutants"))
    parser.add_argument("--equivalent", type=Path, default=Path("tests/README.md"))
    args = parser.parse_args(argv)
    if not all((args.mutants / part).is_dir() for part in PARTS):
        print(f"no mutmut results under {args.mutants}/: run `make mutate`")
        return 2
    equivalent = read_equivalent(args.equivalent)
    lines, ok = verdict(read_results(args.mutants, equivalent), equivalent)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
