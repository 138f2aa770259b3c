"""``make mutate``'s verdict: mutmut's results for ``domain/``, per module and in total.

mutmut 3 keeps one ``mutants/domain/<module>.py.meta`` (JSON) per module, with each
mutant's exit code. This reads them, without mutmut's own code, and prints a table:
killed (a test failed, or the mutant timed out), survived, no tests (no test runs the
mutated function), judged equivalent, and the score, killed / (all - equivalent).

The mutants judged equivalent are listed by name, each with its reason, in
``tests/README.md``; a survivor not in that list fails the run, and so does a score
below ``TOTAL_THRESHOLD`` in total or below ``MODULE_THRESHOLD`` in any module.

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
_NAME = re.compile(r"`(domain\.[\w.ǁ]+__mutmut_\d+)`")


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
    """Each module's results from mutmut's ``.meta`` files under ``mutants/domain``."""
    results = []
    for meta in sorted((mutants / "domain").rglob("*.py.meta")):
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
        f"{'module':<26}{'mutants':>8}{'killed':>8}{'survived':>9}{'no tests':>9}"
        f"{'equiv.':>7}{'other':>6}{'score':>8}"
    ]
    total = ModuleResult("domain/ (total)")
    ok = True
    for r in results:
        lines.append(_row(r))
        total.killed += r.killed
        for name in ("equivalent", "survived", "no_tests", "other"):
            getattr(total, name).extend(getattr(r, name))
        if r.score is not None and r.score < MODULE_THRESHOLD:
            ok = False
            lines.append(f"  ^ below the {MODULE_THRESHOLD:.0f}% a module must reach")
    lines += [_row(total), ""]
    if total.score is None or total.score < TOTAL_THRESHOLD:
        ok = False
        lines.append(f"FAIL: the total is below {TOTAL_THRESHOLD:.0f}%")
    unexplained = total.survived + total.no_tests + total.other
    if unexplained:
        ok = False
        lines.append(f"FAIL: {len(unexplained)} mutants not killed and not judged equivalent:")
        lines += [f"  {name}" for name in unexplained]
    seen = {n for r in results for n in r.equivalent}
    stale = sorted(equivalent - seen)
    if stale:
        lines.append("note: listed as equivalent but killed or gone (update the list):")
        lines += [f"  {name}" for name in stale]
    if ok:
        lines.append(
            f"OK: {total.score:.1f}% killed (>= {TOTAL_THRESHOLD:.0f}%), no module below"
            f" {MODULE_THRESHOLD:.0f}%, every survivor judged equivalent"
        )
    return lines, ok


def _row(r: ModuleResult) -> str:
    score = "-" if r.score is None else f"{r.score:.1f}%"
    return (
        f"{r.module:<26}{r.counted + len(r.equivalent):>8}{r.killed:>8}{len(r.survived):>9}"
        f"{len(r.no_tests):>9}{len(r.equivalent):>7}{len(r.other):>6}{score:>8}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, default=Path("mutants"))
    parser.add_argument("--equivalent", type=Path, default=Path("tests/README.md"))
    args = parser.parse_args(argv)
    if not (args.mutants / "domain").is_dir():
        print(f"no mutmut results under {args.mutants}/domain: run `make mutate`")
        return 2
    equivalent = read_equivalent(args.equivalent)
    lines, ok = verdict(read_results(args.mutants, equivalent), equivalent)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
