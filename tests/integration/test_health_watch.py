"""``billing-ledger health --watch`` as an operator runs it: a subprocess against a real
database, on a terminal (a pseudo-terminal: rich redraws in place) and into a pipe
(each redraw after the last, plain text). It shows the figures and the backlog's
sparkline, follows the backlog as it rises, and Ctrl-C ends it with status 0."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from adapters.bootstrap import build_projector
from adapters.cli.health_watch import BARS
from adapters.settings import Settings
from domain.metering import Metering
from domain.transaction import Source
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import usage

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli", "health", "--watch", "--interval", "0.2"]
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SPARK = re.compile(f"backlog, last minute +([{BARS}]+) +now (\\d+), max (\\d+)")
FOOTER = "Ctrl-C to stop"
WAIT_S = 60.0


class Screen:
    """What the watch wrote so far, escape codes removed, read as it comes."""

    def __init__(self, fd: int) -> None:
        self.fd, self.raw = fd, b""

    @property
    def text(self) -> str:
        return ESCAPE.sub("", self.raw.decode(errors="replace"))

    def until(self, seen: Callable[[str], object], what: str) -> None:
        """Read until ``seen(text)`` holds (the run fails after WAIT_S without it)."""
        deadline = time.monotonic() + WAIT_S
        while not seen(self.text):
            left = deadline - time.monotonic()
            assert left > 0, f"no {what} in: {self.text[-2000:]}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # the terminal closed: the watch has exited
                    chunk = b""
                assert chunk, f"the watch ended before any {what}: {self.text[-2000:]}"
                self.raw += chunk


@contextmanager
def _watching(env: dict[str, str], out: int, *more: str) -> Iterator[subprocess.Popen[bytes]]:
    """The watch (with ``more`` options) writing to ``out`` (closed here: the watch
    holds it); killed on the way out if a failed test left it running."""
    watch = subprocess.Popen(
        [*CLI, *more], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
    )
    os.close(out)
    try:
        yield watch
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()


def _ctrl_c(watch: subprocess.Popen[bytes]) -> int:
    watch.send_signal(signal.SIGINT)
    return watch.wait(timeout=30)


def _whole(text: str) -> str:
    """The redraws written to their end (each ends with its footer)."""
    return text[: text.rfind(FOOTER) + len(FOOTER)] if FOOTER in text else ""


def _sparklines(text: str) -> list[tuple[str, int, int]]:
    """(bars, now, max) of each whole redraw."""
    return [(bars, int(now), int(top)) for bars, now, top in SPARK.findall(_whole(text))]


def _backlog_of_three(settings: Settings, ledger: BillingLedger) -> None:
    batch = [Metering(usage(f"watch-{i}"), Source("usage", 0, i)) for i in range(3)]
    ledger.record_usage(batch)
    with build_projector(settings, ledger) as projector:
        projector.pump_all()


def test_the_watch_redraws_the_figures_and_the_backlog_in_a_terminal_and_ctrl_c_ends_it(
    settings: Settings, ingest_ledger: BillingLedger
) -> None:
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 110, 0, 0))
    env = {**settings_env(settings), "TERM": "xterm-256color"}
    screen = Screen(main)
    with _watching(env, child) as watch:
        screen.until(lambda t: "status: ok" in t and _sparklines(t), "first redraw")
        for label in ("backlog: metered", "retries due now", "workers alive", "dead letters"):
            assert label in _whole(screen.text)
        assert _sparklines(screen.text)[-1][1:] == (0, 0)

        _backlog_of_three(settings, ingest_ledger)
        screen.until(lambda t: any(now == 3 for _, now, _ in _sparklines(t)), "backlog of 3")
        bars, now, top = next(s for s in _sparklines(screen.text) if s[1] == 3)
        assert (now, top) == (3, 3)
        assert bars[0] == BARS[0] and bars[-1] == BARS[-1]  # it rose from 0 to its top
        assert b"\x1b[1A" in screen.raw  # redrawn in place: the cursor goes back up

        assert _ctrl_c(watch) == 0
    os.close(main)
    assert "Traceback" not in screen.text


def test_the_watch_into_a_pipe_prints_plain_redraws_one_after_the_other(
    settings: Settings, ingest_ledger: BillingLedger
) -> None:
    read, write = os.pipe()
    screen = Screen(read)
    with _watching(settings_env(settings), write) as watch:
        screen.until(lambda t: _whole(t).count("status: ok") >= 2, "two redraws")
        assert _ctrl_c(watch) == 0
    while chunk := os.read(read, 65536):
        screen.raw += chunk
    os.close(read)
    assert b"\x1b" not in screen.raw  # no cursor moves, no colours: a log reads it
    text = screen.text
    assert text.startswith("status: ok\nbacklog, last minute  ")
    assert "backlog: metered" in text and "projector behind (events)" in text
    lines = _sparklines(text)
    assert len(lines) >= 2 and lines[0] == (BARS[0], 0, 0) and lines[1] == (BARS[0] * 2, 0, 0)


def test_the_watch_with_json_prints_a_report_a_line_until_ctrl_c(
    settings: Settings, ingest_ledger: BillingLedger
) -> None:
    read, write = os.pipe()
    screen = Screen(read)
    with _watching(settings_env(settings), write, "--json") as watch:
        screen.until(lambda t: t.count("\n") >= 2, "two reports")
        assert _ctrl_c(watch) == 0
    os.close(read)
    first, second = (json.loads(line) for line in screen.text.splitlines()[:2])
    assert first["status"] == second["status"] == "ok"
    assert first["backlog_metered"] == 0 and "workers" in second


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--interval", "3"], "--interval goes with --watch"),
        (["--watch", "2", "--interval", "3"], "--watch 2 and --interval 3 disagree"),
        (["--watch", "--interval", "0"], "'0' must be greater than 0"),
    ],
)
def test_a_watch_interval_that_makes_no_sense_is_misuse(args: list[str], said: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "health", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
