"""Shared fixtures: one real store server per session, one fork server, a job per test."""

from __future__ import annotations

import faulthandler
import itertools
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
# `ftcoord-store` counts its lives in a state file under $XDG_STATE_HOME: the suite's stay out of the home directory.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="ftcoord-tests-state-")

from ftcoord import StoreServer  # noqa: E402
from tests.helpers.cluster import Forker, Job  # noqa: E402

FAST_TIMING = {"heartbeat_interval": 0.1, "heartbeat_timeout": 1.0, "join_timeout": 0.5,
               "barrier_timeout": 15.0, "connect_timeout": 10.0}
_job_numbers = itertools.count()
HARD_TIMEOUT_MARGIN_S = 60.0
_STDERR = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STDERR] = os.dup(sys.stderr.fileno())  # the terminal's, before a test's output is captured


def pytest_unconfigure(config: pytest.Config) -> None:
    faulthandler.cancel_dump_traceback_later()
    if _STDERR in config.stash:
        os.close(config.stash[_STDERR])
        del config.stash[_STDERR]


def _timeout_of(item: pytest.Item) -> float:
    """The test's pytest-timeout limit: its marker's (`pytest.mark.timeout(30)`), else --timeout's, else the ini's
    (0: none)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        return float(marker.args[0] if marker.args else marker.kwargs["timeout"])
    option = item.config.getoption("timeout", None)
    return float(option if option is not None else item.config.getini("timeout") or 0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """A backstop for pytest-timeout: its signal method cannot end a test blocked inside a C call (a store read of a
    key that never comes: seen, a test hung 12 minutes past its 30 s limit), since a Python signal handler runs only
    when the call returns; CI would then hang for its 90 minutes. HARD_TIMEOUT_MARGIN_S after the test's own limit,
    a C-level watchdog (faulthandler) prints every thread's stack and ends the run with status 1."""
    timeout = _timeout_of(item)
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout + HARD_TIMEOUT_MARGIN_S, exit=True, file=item.config.stash[_STDERR])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session", autouse=True)
def scratch_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Flash images and other node-local scratch of every test job live here, not in the machine's
    /dev/shm (launchers reap what dead jobs left there: tests must not touch a user's)."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("scratch")
    mp.setenv("FTCOORD_SCRATCH_ROOT", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="session")
def store_server() -> Iterator[StoreServer]:
    server = StoreServer("127.0.0.1", 0)
    yield server
    server.close()


@pytest.fixture(scope="session")
def reference_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One chaos reference cache for the session: scenarios with the same job share a verified reference."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("ftcoord-cache")
    mp.setenv("FTCOORD_CACHE_DIR", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="session")
def forker() -> Iterator[Forker]:
    f = Forker()
    yield f
    f.close()


@pytest.fixture
def job_id(request: pytest.FixtureRequest) -> str:
    """A fresh job id per test: jobs share the store server but not their keys."""
    return f"{request.node.name[:60].replace('[', '-').replace(']', '')}-{os.getpid()}-{next(_job_numbers)}"


@pytest.fixture
def make_job(store_server: StoreServer, forker: Forker, job_id: str, tmp_path: Path) -> Iterator:
    jobs: list[Job] = []

    def make(target: int, min_world_size: int = 1, **timing: float) -> Job:
        job = Job(forker, store_server.address, f"{job_id}-{len(jobs)}", tmp_path / f"job{len(jobs)}",
                  target, min_world_size, {**FAST_TIMING, **timing})
        job.workdir.mkdir(parents=True, exist_ok=True)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.kill_all()
