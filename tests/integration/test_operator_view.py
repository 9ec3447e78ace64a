"""The operator's view of a real job: `ftcoord status` and the launcher's /metrics, before and after a SIGKILL,
agreeing with the job's own `generation_changed` event on what the fault cost."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from chaos.report.metrics import read_logs
from ftcoord import StoreServer, connect, job_store
from ftcoord.observe.job_view import JobReader, JobView
from ftcoord.observe.render import render
from tests.helpers.cluster import REPO
from tests.helpers.runs import AllreduceRun, launch
from tests.helpers.script_runs import ScriptRun
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(240)
ENV = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_CPP_LOG_LEVEL": "ERROR"}


def status(store: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftcoord.observe.cli", "status", "--store", store, *args],
                          capture_output=True, text=True, timeout=60, env=ENV)


def status_json(store: str, job: str) -> dict[str, Any]:
    result = status(store, "--job", job, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the launcher's /metrics, parsed with prometheus_client's own parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    found = [v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()]
    assert found, f"no sample {name}{labels}"
    return sum(found)


def metrics_port(logs: Path) -> int:
    serving = wait_until(lambda: read_logs(logs, ("metrics_serving",)), 60, "the launcher's metrics endpoint")
    return int(serving[0]["address"].rpartition(":")[2])


def test_status_and_metrics_show_a_job_and_what_a_sigkill_cost(store_server: StoreServer, job_id: str,
                                                               tmp_path: Path) -> None:
    store = store_server.address
    run = ScriptRun(tmp_path / "run", store, job_id, "examples/quickstart.py", ["--steps", "1000000"],
                    launch_args=("--metrics-port", "0"))
    try:
        port = metrics_port(run.logs)

        def training() -> dict[str, Any] | None:
            shown = status(store, "--job", job_id, "--json")  # an error until the first process registers
            if shown.returncode != 0:
                return None
            view = json.loads(shown.stdout)
            steps = [s["step"] or 0 for s in view["slots"]]
            return view if view["world_size"] == 2 and len(steps) == 2 and min(steps) > 50 else None

        before = wait_until(training, 120, "both ranks training, seen by ftcoord status")
        assert before["members"] == [0, 1] and before["state"] == "running"
        assert before["leader"]["slot"] in (0, 1) and before["record_leader"]["slot"] in (0, 1)
        assert [s["state"] for s in before["slots"]] == ["rank 0", "rank 1"]
        assert all(s["heartbeat_age_s"] < before["timeout_s"] for s in before["slots"])
        assert all(s["steps_per_s"] > 0 for s in before["slots"])
        unknown = status(store, "--job", "no-such-job")
        assert unknown.returncode == 1 and unknown.stderr.count("\n") == 1, unknown.stderr
        assert "no job 'no-such-job'" in unknown.stderr and job_id in unknown.stderr, unknown.stderr
        listing = status(store, "--json")  # one job on the store: its view; several (other tests' too): a list
        assert listing.returncode == 0, listing.stderr
        shown = json.loads(listing.stdout)
        listed = {j["job"]: j["state"] for j in shown["jobs"]} if "jobs" in shown else {shown["job"]: shown["state"]}
        assert listed[job_id] == "running"
        first = scrape(port)
        assert value(first, "ftcoord_generation") == before["generation"]
        assert value(first, "ftcoord_world_size") == 2 and value(first, "ftcoord_target_world_size") == 2
        assert value(first, "ftcoord_restarts_total") == 0

        victim = before["slots"][1]["pid"]
        os.kill(victim, signal.SIGKILL)

        def recovered() -> dict[str, Any] | None:
            view = status_json(store, job_id)
            slot = view["slots"][1]
            back = view["world_size"] == 2 and slot["incarnation"] == 2 and slot["state"] == "rank 1"
            return view if back and view["incidents"] and (slot["step"] or 0) > 0 else None

        after = wait_until(recovered, 120, "the restart and the new generation, seen by ftcoord status")
        assert after["generation"] > before["generation"]
        assert after["slots"][1]["restarts_by_kind"]["signal"] == 1 and after["slots"][1]["process_restarts"] == 1
        assert after["slots"][1]["pid"] != victim
        assert after["slots"][0]["in_process_restarts"] >= 1, "the survivor restarted in-process"
        incident = after["incidents"][-1]
        assert incident["witness"] == 0 and incident["stall_s"] > 0
        # The root cause as the leader named it, not the survivor that saw it (its interrupt) nor its exception in
        # gloo's words; the recent generations show it beside the generation that ended.
        assert re.fullmatch(r"slot 1 died \(SIGKILL\)(, seen by .+)?", incident["cause"]), incident["cause"]
        ended = next(g for g in after["recent"] if g["generation"] == after["generation"])
        assert ended["cause"] == incident["cause"], after["recent"]
        assert after["lost_s"] == pytest.approx(sum(i["cost_s"] for i in after["incidents"]), abs=1e-3)

        def scraped_recovery() -> dict | None:
            samples = scrape(port)
            return samples if value(samples, "ftcoord_recovery_seconds_count") else None

        second = wait_until(scraped_recovery, 30, "the recovery in the launcher's metrics")
        assert value(second, "ftcoord_generation") > value(first, "ftcoord_generation")
        assert value(second, "ftcoord_restarts_total", slot="1", kind="signal") == 1
        assert value(second, "ftcoord_restarts_total") == 1
        assert value(second, "ftcoord_in_process_restarts_total", slot="0") >= 1
        assert value(second, "ftcoord_steps_committed_total") > value(first, "ftcoord_steps_committed_total")
        # One number per fault: the event, the status and the histogram carry the same stall.
        events = read_logs(run.logs, ("generation_changed",))
        assert [e["stall_s"] for e in events] == [i["stall_s"] for i in after["incidents"]]
        assert value(second, "ftcoord_recovery_seconds_count") == len(events)
        assert value(second, "ftcoord_recovery_seconds_sum") == pytest.approx(sum(e["stall_s"] for e in events))
    finally:
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait(30)


def test_an_unreachable_store_is_one_line() -> None:
    started = time.monotonic()
    result = status(f"127.0.0.1:{free_port()}", "--connect-timeout", "1")
    assert result.returncode == 1 and time.monotonic() - started < 20
    assert result.stderr.count("\n") == 1 and "no store answers at 127.0.0.1:" in result.stderr, result.stderr
    assert "FTCOORD_STORE" in result.stderr and "Traceback" not in result.stderr


def test_watch_redraws_live_at_80_columns(store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    """`ftcoord status --watch` in a real terminal (tmux, 80 columns): the text fits and moves; Ctrl-C ends it."""
    tmux = shutil.which("tmux")
    assert tmux, "tmux is needed to check --watch in a real terminal (apt install tmux)"
    run = ScriptRun(tmp_path / "run", store_server.address, job_id, "examples/quickstart.py", ["--steps", "1000000"])
    session = f"ftcoord-watch-{os.getpid()}"
    socket_name = str(tmp_path / "tmux.sock")
    command = f"{sys.executable} -m ftcoord.observe.cli status --store {store_server.address} --job {job_id} --watch"
    try:
        subprocess.run([tmux, "-S", socket_name, "new-session", "-d", "-s", session, "-x", "80", "-y", "30",
                        f"env PYTHONPATH={REPO} {command}"], check=True, timeout=30)

        def screen() -> str:
            return subprocess.run([tmux, "-S", socket_name, "capture-pane", "-p", "-t", session], capture_output=True,
                                  text=True, timeout=30).stdout

        def steps_shown() -> int | None:
            found = re.search(r"rank 0(?: \(waiting\))?\s+\d+\s+\S+\s+(\d+)", screen())
            return int(found.group(1)) if found else None

        first = wait_until(steps_shown, 120, "the slots table with rank 0's step")
        wait_until(lambda: (s := steps_shown()) is not None and s > first, 30, "the step to move on the screen")
        text = screen()
        assert f"job {job_id}" in text and "generation" in text and "rank 1" in text, text
        assert all(len(line) <= 80 for line in text.splitlines()), text
        subprocess.run([tmux, "-S", socket_name, "send-keys", "-t", session, "C-c"], check=True, timeout=30)
        wait_until(lambda: subprocess.run([tmux, "-S", socket_name, "has-session", "-t", session],
                                          capture_output=True, timeout=30).returncode != 0, 30,
                   "ftcoord status --watch to end on Ctrl-C")
    finally:
        subprocess.run([tmux, "-S", socket_name, "kill-server"], capture_output=True, timeout=30)
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait(30)


def free_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_status_shows_where_a_stuck_training_thread_stands_before_it_is_fenced(store_server: StoreServer, job_id: str,
                                                                                tmp_path: Path) -> None:
    """Slot 1's training thread sticks at step 20 (its heartbeat runs on; progress_timeout 8 s). Half the timeout
    later the job's view (what `ftcoord status` prints) shows where it stands (ftcoord.liveness.still_stack), before the
    leader fences it and its launcher's SIGKILL leaves nothing to ask; slot 0, waiting on it in the all-reduce, is not
    shown. Its log has the stack. The order is asserted on the events' own times, not on when this test looked."""
    store = store_server.address
    proc = launch(tmp_path, store, job_id, "--steps", "400", "--stall-at", "1:20", "--progress-timeout", "8", nproc=2)
    try:
        run = AllreduceRun(tmp_path)
        wait_until(lambda: run.events("fault"), 60, "slot 1 to stall")
        reader = JobReader(job_store(connect(store), job_id), job_id)

        def still() -> tuple[JobView, dict[int, str]] | None:
            view = reader.read()
            shown = {s.slot: s.still_at for s in view.slots if s.still_at}
            return (view, shown) if shown else None

        view, shown = wait_until(still, 30, "the job's view to show where slot 1 stands")
        assert list(shown) == [1] and shown[1].endswith(" in train") and "allreduce_job.py:" in shown[1], shown
        console = Console(record=True, width=80)
        console.print(render(view))
        text = console.export_text()
        assert "standing still" in text and "helpers/allreduce_job.py" in text, text
        (logged,) = wait_until(lambda: run.logs("training_thread_still"), 30, "slot 1's log of its still stack")
        assert logged["slot"] == 1 and logged["at"] == shown[1] and "time.sleep(3600)" in logged["stack"], logged
        declared = wait_until(lambda: run.logs("member_declared_dead"), 60, "the leader to fence slot 1")
        assert [(e["slot"], e["reason"]) for e in declared] == [(1, "hung")], declared
        assert logged["mono"] < declared[0]["mono"], "fenced before it published where it stood"
    finally:
        proc.kill()
