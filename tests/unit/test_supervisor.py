"""``adapters.supervisor`` with fake roles: a failing role restarts and the others run on;
only repeated failure within the window ends the process; a stop waits for the unit of
work in flight."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from adapters.errors import WorkerFailed
from adapters.observability.metrics import metrics
from adapters.supervisor import RestartPolicy, RoleRun, Supervisor
from tests.integration.support import wait_for

QUICK = RestartPolicy(base_s=0.001, max_delay_s=0.01, max_failures=5, window_s=60)


@dataclass
class FakeRole:
    """Fails its first ``failures`` runs (raising, or returning on its own), then runs
    until stopped. Counts how often it was built."""

    failures: int = 0
    returns: bool = False  # fail by returning instead of raising
    builds: int = 0
    running: threading.Event = field(default_factory=threading.Event)

    def build(self) -> RoleRun:
        self.builds += 1
        return self.run

    def run(self, stop: threading.Event) -> None:
        if self.builds <= self.failures:
            if self.returns:
                return
            raise ConnectionError(f"broker gone (run {self.builds})")
        self.running.set()
        stop.wait()


class Running:
    """A supervisor running in a thread; ``finish()`` stops it and returns what ``run``
    raised (or None)."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.supervisor.run()
        except BaseException as exc:  # handed to the test by finish()
            self.error = exc

    def finish(self) -> BaseException | None:
        self.supervisor.stop.set()
        self.thread.join()
        return self.error


@pytest.fixture
def running() -> Iterator[Callable[[Supervisor], Running]]:
    started: list[Running] = []

    def start(supervisor: Supervisor) -> Running:
        started.append(Running(supervisor))
        return started[-1]

    yield start
    for r in started:
        r.finish()


def _restarts_metric(role: str) -> float:
    text = metrics().render().decode()
    found = re.search(rf'^billing_role_restarts_total{{role="{role}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_failing_role_is_rebuilt_and_restarted_while_the_others_keep_running(
    running: Callable[[Supervisor], Running],
) -> None:
    flaky, steady = FakeRole(failures=2), FakeRole()
    before = _restarts_metric("flaky")
    stop = threading.Event()
    sup = running(Supervisor({"flaky": flaky.build, "steady": steady.build}, stop, policy=QUICK))

    wait_for(
        lambda: flaky.running.is_set() and steady.running.is_set(),
        timeout=10,
        what="the third build of the flaky role and the steady one to run",
    )
    assert (flaky.builds, steady.builds) == (3, 1)
    assert sup.supervisor.restarts == {"flaky": 2, "steady": 0}
    assert sup.supervisor.status()["restarts"] == {"flaky": 2}
    assert _restarts_metric("flaky") - before == 2
    assert sup.finish() is None  # a clean stop: no error


def test_a_role_that_returns_while_the_process_runs_is_restarted(
    running: Callable[[Supervisor], Running],
) -> None:
    quitter = FakeRole(failures=1, returns=True)
    sup = running(Supervisor({"quitter": quitter.build}, threading.Event(), policy=QUICK))
    wait_for(quitter.running.is_set, timeout=10, what="the role to run again")
    assert sup.supervisor.restarts == {"quitter": 1}


def test_repeated_failure_within_the_window_stops_every_role_and_raises() -> None:
    steady = FakeRole()
    builds = [0]

    def broken(stop: threading.Event) -> None:
        steady.running.wait()  # the other role is at work when this one fails for good
        builds[0] += 1
        raise ConnectionError(f"broker gone (run {builds[0]})")

    stop = threading.Event()
    policy = RestartPolicy(base_s=0.001, max_delay_s=0.001, max_failures=3, window_s=3600)
    supervisor = Supervisor({"broken": lambda: broken, "steady": steady.build}, stop, policy=policy)
    with pytest.raises(WorkerFailed, match=r"broken worker failed 3 times within 3600 s; last: "
                       r"ConnectionError: broker gone \(run 3\)"):  # fmt: skip
        supervisor.run()  # returns (raising) only once every role has ended
    assert stop.is_set() and builds == [3]
    assert [t.name for t in threading.enumerate() if t.name in ("broken", "steady")] == []


def test_failures_further_apart_than_the_window_never_end_the_process(
    running: Callable[[Supervisor], Running],
) -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 100.0  # each failure is 100 s after the one before
        return now[0]

    policy = RestartPolicy(base_s=0.001, max_delay_s=0.001, max_failures=2, window_s=60)
    flaky = FakeRole(failures=6)
    sup = running(Supervisor({"flaky": flaky.build}, threading.Event(), policy=policy,
                             clock=clock))  # fmt: skip
    wait_for(flaky.running.is_set, timeout=10, what="the role to run after six failures")
    assert sup.finish() is None
    assert sup.supervisor.restarts == {"flaky": 6}


def test_a_role_waiting_to_restart_is_named_in_the_status_until_it_runs_again(
    running: Callable[[Supervisor], Running],
) -> None:
    flaky = FakeRole(failures=1)
    patient = RestartPolicy(base_s=3600, max_delay_s=3600, max_failures=5, window_s=60)
    sup = running(Supervisor({"flaky": flaky.build}, threading.Event(), policy=patient,
                             jitter=lambda: 0.0))  # fmt: skip

    status = wait_for(
        lambda: (s := sup.supervisor.status())["restarting"] and s, what="the restart to wait"
    )
    assert status["restarting"]["flaky"]["error"] == "ConnectionError: broker gone (run 1)"
    assert status["restarting"]["flaky"]["failures"] == 1
    assert 1700 < status["restarting"]["flaky"]["restart_in_s"] <= 1800  # half of 3600, jitter 0
    assert sup.finish() is None  # a stop wakes the wait: it does not sit out the backoff
    assert flaky.builds == 1


def test_a_stop_waits_for_the_unit_of_work_in_flight_before_run_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    order: list[str] = []
    in_flight, release = threading.Event(), threading.Event()

    def slow(stop: threading.Event) -> None:
        in_flight.set()
        stop.wait()
        release.wait()  # the unit of work in flight when the stop came
        order.append("role ended")

    stop = threading.Event()
    supervisor = Supervisor({"slow": lambda: slow}, stop, policy=QUICK, wait_log_s=0.01)

    def run_then_close() -> None:
        supervisor.run()
        order.append("run returned: the caller closes the shared pools")

    runner = threading.Thread(target=run_then_close)
    with caplog.at_level(logging.WARNING, logger="adapters.supervisor"):
        runner.start()
        in_flight.wait()
        stop.set()
        wait_for(
            lambda: "stopping: waiting for slow to finish" in caplog.text,
            what="the supervisor to say what it waits for",
        )
        release.set()
        runner.join()
    assert order == ["role ended", "run returned: the caller closes the shared pools"]


def test_an_error_while_stopping_is_logged_and_not_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def closing_badly(stop: threading.Event) -> None:
        stop.set()  # as a signal arriving, then the role's clean-up failing
        raise OSError("socket already closed")

    stop = threading.Event()
    supervisor = Supervisor({"r": lambda: closing_badly}, stop, policy=QUICK)
    with caplog.at_level(logging.WARNING, logger="adapters.supervisor"):
        supervisor.run()
    assert supervisor.restarts == {"r": 0}
    assert "ended with an error while stopping: OSError: socket already closed" in caplog.text


@pytest.mark.parametrize(
    ("failures", "jitter", "delay"),
    [(1, 0.0, 0.5), (1, 0.999, 0.9995), (2, 0.0, 1.0), (3, 0.0, 2.0), (6, 0.0, 5.0), (9, 0.0, 5.0)],
)
def test_the_backoff_doubles_up_to_its_ceiling_with_the_upper_half_jittered(
    failures: int, jitter: float, delay: float
) -> None:
    policy = RestartPolicy(base_s=1.0, max_delay_s=10.0)
    assert policy.delay(failures, jitter) == pytest.approx(delay)
