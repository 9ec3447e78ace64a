"""Timing and quorum settings: sane defaults, and bad values refused with a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftcoord import ConfigError, QuorumPolicy, Timing, Wrapper, log


def test_defaults_are_consistent() -> None:
    timing = Timing()
    assert timing.heartbeat_interval < timing.heartbeat_timeout < timing.barrier_timeout
    assert timing.join_timeout < timing.barrier_timeout


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"heartbeat_interval": 0}, "heartbeat_interval=0 must be a positive"),
        ({"heartbeat_interval": -1.0}, "heartbeat_interval=-1.0"),
        ({"heartbeat_timeout": float("nan")}, "heartbeat_timeout=nan"),
        ({"heartbeat_interval": 2.0, "heartbeat_timeout": 3.0}, "at least twice heartbeat_interval=2.0s"),
        ({"heartbeat_timeout": 10.0, "barrier_timeout": 10.0}, "must be below barrier_timeout=10.0s"),
        ({"join_timeout": 30.0, "barrier_timeout": 20.0}, "join_timeout=30.0s must be below"),
    ],
)
def test_invalid_timing_is_refused_naming_the_values(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        Timing(**settings)


def test_quorum_policy_accepts_only_divisors_of_the_global_batch() -> None:
    policy = QuorumPolicy(target_world_size=4, min_world_size=1, global_batch=8)
    assert [n for n in range(1, 6) if policy.accepts(n)] == [1, 2, 4]


def test_quorum_policy_refuses_a_launch_whose_world_size_does_not_divide_the_global_batch() -> None:
    """Trimming to a size that fits is for faults: a bad launch is refused up front, naming both numbers."""
    with pytest.raises(ConfigError, match=r"global_batch 7 is not divisible by the job's world size 2; launch a "
                                          r"world size in \[1\] .*--global-batch"):
        QuorumPolicy(target_world_size=2, global_batch=7)
    with pytest.raises(ConfigError, match=r"world size 4; launch a world size in \[1, 7\]"):
        QuorumPolicy(target_world_size=4, min_world_size=2, global_batch=7)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_world_size": 0}, "target world size 0"),
        ({"target_world_size": 2, "min_world_size": 3}, "min_world_size=3 must be between 1 and"),
        ({"target_world_size": 4, "max_world_size": 2}, "max_world_size=2 is below"),
    ],
)
def test_quorum_policy_refuses_inconsistent_sizes(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        QuorumPolicy(**kwargs)


def test_the_default_progress_timeout_stays_below_the_collectives_timeout(tmp_path: Path) -> None:
    """A stuck rank is fenced as the culprit before gloo times its peers out (Timing.progress_timeout_below): 40 s
    at the library's defaults, where both were 60 s; 12 heartbeat timeouts when that is shorter. One set by hand
    is kept, and one not below pg_timeout is warned about, with what to do."""
    assert Timing().progress_timeout_below(60.0) == 40.0
    assert Timing(heartbeat_interval=0.2, heartbeat_timeout=2.0).progress_timeout_below(60.0) == 24.0
    assert Wrapper(store="127.0.0.1:1", job_id="j", slot=0, world_size=1).progress_timeout == 40.0
    assert Wrapper(store="127.0.0.1:1", job_id="j", slot=0, world_size=1, pg_timeout=9.0).progress_timeout == 6.0
    events = tmp_path / "events.jsonl"
    log.configure(events, console=False)  # an earlier test may have kept warnings out (chaos run's level is "error")
    kept = Wrapper(store="127.0.0.1:1", job_id="j", slot=0, world_size=1, progress_timeout=90.0).progress_timeout
    assert kept == 90.0
    logs = [json.loads(line) for line in events.read_text().splitlines()]
    (warning,) = [e for e in logs if e["event"] == "progress_timeout_not_below_pg_timeout"]
    assert warning["pg_timeout"] == 60.0 and "below pg_timeout" in warning["what_to_do"], warning


def test_ftcoord_leaves_the_applications_logging_as_it_was(tmp_path: Path) -> None:
    """An application configured structlog and the standard logging its own way; ftcoord, used as a library and even
    configured by its own entry point (as a Wrapper under a launcher configures its log directory), changes neither:
    the application's events still go where it sent them, and a library's events reach the application's handlers
    through the standard loggers `ftcoord.<component>`, at the levels the application chose."""
    code = f"""
import io, json, logging, structlog
mine = io.StringIO()
structlog.configure(processors=[structlog.processors.JSONRenderer()], logger_factory=structlog.PrintLoggerFactory(mine))
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.name, record.levelname, record.getMessage()))
logging.basicConfig(level=logging.INFO, handlers=[Keep()])
logging.getLogger("ftcoord.quiet").setLevel(logging.WARNING)
before = (structlog.get_config(), logging.getLogger().handlers[:], logging.getLogger().level)
from ftcoord import log
log.get_logger(component="x", slot=2).info("ftcoord_default", n=1)
log.get_logger(component="quiet").info("below_the_applications_level")
log.configure({str(tmp_path / "ftcoord.jsonl")!r}, console=False)
log.get_logger(component="x").info("ftcoord_event")
structlog.get_logger().info("app_event")
after = (structlog.get_config(), logging.getLogger().handlers[:], logging.getLogger().level)
assert before == after, (before, after)
assert [json.loads(line)["event"] for line in mine.getvalue().splitlines()] == ["app_event"], mine.getvalue()
assert records == [("ftcoord.x", "INFO", "ftcoord_default slot=2 n=1")], records
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
    events = [json.loads(line)["event"] for line in (tmp_path / "ftcoord.jsonl").read_text().splitlines()]
    assert events == ["ftcoord_event"]


def test_with_no_logging_setup_a_library_shows_warnings_only() -> None:
    """Python's own default for a library: with no handler anywhere, warnings reach stderr and info stays quiet."""
    code = """
from ftcoord import log
log.get_logger(component="x").info("an_info")
log.get_logger(component="x").warning("a_warning", what_to_do="read it")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "a_warning what_to_do='read it'", done.stderr


def test_a_logger_survives_copy_and_pickle_and_follows_a_later_configure(tmp_path: Path) -> None:
    """Objects that hold a logger may be copied or pickled (a checkpoint strategy, a CallWrapper); a logger made
    before an entry point configures ftcoord's output writes where that configure says."""
    import copy
    import pickle

    logger = log.get_logger(component="t")
    copies = [copy.copy(logger), copy.deepcopy(logger), pickle.loads(pickle.dumps(logger))]
    events = tmp_path / "events.jsonl"
    log.configure(events, console=False)
    for i, each in enumerate([logger, *copies]):
        each.info("written", copy=i)
    assert [json.loads(line)["copy"] for line in events.read_text().splitlines()] == [0, 1, 2, 3]


@pytest.mark.parametrize("launched", [False, True])
def test_a_rank_keeps_the_applications_terminal_unless_its_launcher_started_it(tmp_path: Path, launched: bool) -> None:
    """A Wrapper in the user's own process leaves the terminal to the application's logging (the log directory still
    gets every event); under ftcoord-launch the rank is ftcoord's process and renders its own terminal."""
    code = f"""
import json, logging, pathlib
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.basicConfig(level=logging.INFO, handlers=[Keep()])
from ftcoord import log
from ftcoord.wrapper.decorator import route_events
route_events({str(tmp_path)!r}, 3)
log.get_logger(component="wrapper").info("rank_event")
(events,) = pathlib.Path({str(tmp_path)!r}).glob("slot3-*.jsonl")
assert [json.loads(line)["event"] for line in events.read_text().splitlines()] == ["rank_event"]
print(log.is_configured(), records)
"""
    environ = {k: v for k, v in os.environ.items() if k != "FTCOORD_LAUNCHER_PID"}
    if launched:
        environ["FTCOORD_LAUNCHER_PID"] = str(os.getpid())
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environ)
    assert done.returncode == 0, done.stderr
    if launched:
        assert done.stdout.strip() == "True []" and "rank_event" in done.stderr, done.stdout + done.stderr
    else:
        assert done.stdout.strip() == "False ['rank_event']" and done.stderr == "", done.stdout + done.stderr
