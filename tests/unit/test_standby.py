"""The warm standby asks the command's module whether its command line is good before importing torch
(real template processes, real forks)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ftcoord import env
from ftcoord.host.process_state import state, stopped
from ftcoord.launcher.standby_client import ForkedProcess, ForkFailed, WarmStandby
from ftcoord.launcher.standby_template import PythonCommand, unsupported
from tests.helpers.cluster import REPO
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(60)

JOB_ENV = {env.STORE_ENV: "127.0.0.1:29999", env.JOB_ID_ENV: "standby-test", env.WORLD_SIZE_ENV: "2",
           "PYTHONPATH": str(REPO)}


def torch_loaded(pid: int) -> bool:
    """Whether the process has torch's library mapped (what a preload costs: seconds of import)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def nice_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def start(args: list[str], niced: bool = False, command: list[str] | None = None) -> WarmStandby:
    command = command or [sys.executable, "-m", "training"]
    return wait_ready(WarmStandby.start([*command, *args], {**os.environ, **JOB_ENV}, niced=niced))


def wait_ready(standby: WarmStandby) -> WarmStandby:
    def ready() -> bool:
        standby.pump()
        return standby.ready

    wait_until(ready, 45, "the standby never said it was ready")
    return standby


def fork_now(standby: WarmStandby, values: dict[str, str]) -> ForkedProcess:
    """A replacement asked for and collected (the launcher collects it at its next ticks instead)."""
    pending = standby.request_fork(values)
    assert pending is not None, "the standby took no request"
    return wait_until(pending.collect, 10, "the standby to fork the replacement")


def live_children(pid: int) -> set[int]:
    """The processes `pid` forked that are alive (not zombies)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return {int(child) for child in children if state(int(child)) not in (None, "Z")}


def sleeper(tmp_path: Path) -> WarmStandby:
    """A standby of a script that sleeps a minute: its replacements live until they are killed."""
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(60)\n")
    return start([], command=[sys.executable, str(script)])


def test_a_good_command_line_is_preloaded() -> None:
    standby = start(["--steps", "5", "--global-batch", "8"])
    try:
        assert standby.refused is None
        assert torch_loaded(standby.process.pid), "torch should be imported before the first fork"
    finally:
        standby.close()


def test_a_standby_warmed_niced_forks_replacements_at_normal_priority() -> None:
    """Only the import ran niced (its own thread): a replacement trains at normal priority, with no
    privilege needed to undo a nice (an unprivileged standby used to leave every replacement at nice 10)."""
    standby = start(["--steps", "5", "--global-batch", "8"], niced=True)
    try:
        assert nice_of(standby.process.pid) == 0
        child = fork_now(standby, {env.SLOT_ENV: "0"})
        assert nice_of(child.pid) == 0
        child.kill()
    finally:
        standby.close()


@pytest.mark.parametrize("args, says", [
    (["--dataset", "nosuch"], "unknown dataset 'nosuch'"),
    (["--global-batch", "7"], "not divisible by the job's world size 2"),
    (["--steps", "-5"], "--steps"),
])
def test_a_refused_command_line_preloads_nothing_and_its_processes_fail_at_once(args: list[str], says: str) -> None:
    standby = start(args)
    try:
        assert standby.refused is not None and says in standby.refused, standby.refused
        assert not torch_loaded(standby.process.pid)
        started = time.monotonic()
        child = fork_now(standby, {env.SLOT_ENV: "0"})
        assert child.wait(timeout=10) == 2  # the command's own answer to a bad configuration
        assert time.monotonic() - started < 2.0
    finally:
        standby.close()


def test_a_scripts_replacement_finds_what_every_optimizer_imports_already_loaded(tmp_path: Path) -> None:
    """A plain script's replacement (the quickstart's) spent 1.6-2 s importing torch._dynamo, which the first
    optimizer constructor imports, between its fork and its first join."""
    script, seen = tmp_path / "probe.py", tmp_path / "seen.txt"
    script.write_text("import sys\nloaded = [m for m in ('torch', 'torch._dynamo') if m in sys.modules]\n"
                      "open(sys.argv[1], 'w').write(' '.join(loaded))\n")
    standby = start([str(seen)], command=[sys.executable, str(script)])
    try:
        child = fork_now(standby, {env.SLOT_ENV: "0"})
        assert child.wait(timeout=10) == 0
        assert seen.read_text().split() == ["torch", "torch._dynamo"]
    finally:
        standby.close()


def test_a_replacements_death_is_seen_while_its_standby_is_stopped(tmp_path: Path) -> None:
    """The template reaps its replacements and says so; a stopped one says nothing, and its launcher used to see none
    of its ranks die (no restart, no death marked) until it woke. The launcher reads the zombie's exit status."""
    standby = sleeper(tmp_path)
    try:
        child = fork_now(standby, {env.SLOT_ENV: "0"})
        os.kill(standby.process.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(standby.process.pid), 5, "the standby to stop")  # a signal is taken, not sent
        os.kill(child.pid, signal.SIGKILL)
        assert wait_until(lambda: child.poll() is not None, 5, "the launcher to see the death") is True
        assert child.returncode == -signal.SIGKILL
    finally:
        os.kill(standby.process.pid, signal.SIGCONT)
        standby.close()


ORPHANED_EXIT = """
import ctypes, os, signal, sys, time
from pathlib import Path
from ftcoord.launcher.standby_client import WarmStandby
from tests.unit.test_standby import fork_now, start
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: this process is the orphan's init
script, go = sys.argv[1:]
standby = start([go], command=[sys.executable, script])
child = fork_now(standby, {"FTCOORD_SLOT": "0"})
standby.process.kill()
standby.process.wait()
Path(go).write_text("")  # the replacement ends now, its template dead
os.waitpid(child.pid, 0)  # reaped at once, as init reaps an orphan (this sandbox's init leaves zombies)
deadline = time.monotonic() + 10
while child.poll() is None and time.monotonic() < deadline:
    time.sleep(0.01)
print(child.returncode)
"""


def test_a_replacements_exit_code_outlives_its_standby(tmp_path: Path) -> None:
    """A killed template leaves its replacements training (each dies with its launcher, not with it), but nobody to
    reap them and say how they ended: init reaps an orphan and tells nobody. Each exit counted as a kill, so a
    configuration error (exit 2), which ends the job, restarted the slot instead, and a finished rank (exit 0) did
    too. A replacement now tells its exit code itself as it ends."""
    script, go = tmp_path / "exits_3.py", tmp_path / "go"
    script.write_text("import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.01)\n"
                      "sys.exit(3)\n")
    node = subprocess.run([sys.executable, "-c", ORPHANED_EXIT, str(script), str(go)], capture_output=True,
                          text=True, timeout=50, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert node.returncode == 0, node.stderr
    assert node.stdout.split() == ["3"], node.stdout


def test_a_request_the_standby_reads_after_its_deadline_forks_nothing(tmp_path: Path) -> None:
    """A stopped (or starved) standby reads a request late: by then its launcher started a new interpreter for the
    slot, and a fork would be a second process for it."""
    standby = sleeper(tmp_path)
    try:
        os.kill(standby.process.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(standby.process.pid), 5, "the standby to stop")  # a signal is taken, not sent
        late = standby.request_fork({env.SLOT_ENV: "0"}, answer_s=0.2, margin_s=30)  # the launcher waits on here
        assert late is not None
        wait_until(lambda: time.monotonic() > late.answer_by + 0.1, 5, "the request's deadline to pass")
        os.kill(standby.process.pid, signal.SIGCONT)

        def answer() -> str:
            try:
                return "forked" if late.collect() is not None else ""
            except ForkFailed as exc:
                return str(exc)

        assert "after its deadline" in wait_until(answer, 10, "the standby to answer")
        assert not live_children(standby.process.pid)
    finally:
        os.kill(standby.process.pid, signal.SIGCONT)
        standby.close(timeout=0)


def test_a_fork_given_up_on_while_the_standby_is_stopped_is_never_made(tmp_path: Path) -> None:
    """The launcher gives up on a stopped standby at once and cancels the request: once continued, the template reads
    the request with its cancellation and forks nothing (the slot's new interpreter is on its way)."""
    standby = sleeper(tmp_path)
    try:
        os.kill(standby.process.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(standby.process.pid), 5, "the standby to stop")  # a signal is taken, not sent
        pending = standby.request_fork({env.SLOT_ENV: "0"}, answer_s=30)
        assert pending is not None
        with pytest.raises(ForkFailed, match="stopped"):
            pending.collect()
        os.kill(standby.process.pid, signal.SIGCONT)
        standby.wait_answer(10)  # its answer, left unread: reading it would kill a fork
        assert select.select([standby.reply_fd], [], [], 0)[0], "the standby never answered"
        assert not live_children(standby.process.pid), "the standby forked a request its launcher had cancelled"
    finally:
        os.kill(standby.process.pid, signal.SIGCONT)
        standby.close(timeout=0)


def test_a_fork_given_up_on_and_made_anyway_is_killed_when_its_answer_comes(tmp_path: Path) -> None:
    """A cancellation that comes after the fork (the launcher stopped, say, as its answer was on its way): the
    process is killed as the answer arrives, never left running beside the slot's own."""
    standby = sleeper(tmp_path)
    try:
        pending = standby.request_fork({env.SLOT_ENV: "0"}, answer_s=30)
        assert pending is not None
        wait_until(lambda: live_children(standby.process.pid), 10, "the fork")  # made; its answer not read yet
        pending.abandon()
        wait_until(lambda: standby.pump() or not live_children(standby.process.pid), 5,
                   "the abandoned fork to be killed as its answer is read")
    finally:
        standby.close(timeout=0)


@pytest.mark.parametrize("padding", [4030, 10000], ids=["just-over-a-page", "several-pages"])
def test_a_stopped_standby_never_holds_up_its_launcher_in_a_full_pipe(tmp_path: Path, padding: int) -> None:
    """Requests (and their cancellations) to a stopped standby wait unread in its stdin. Once the pipe was full, the
    launcher's next write blocked it, every fence and every other slot with it, until the standby woke, which may be
    never. A request that does not fit is not written now: the slot gets a new interpreter.

    A pipe holds 16 pages, not 64 KB: a request just over a page takes two, and the pipe was full at half its bytes
    (the launcher's first count of the room, in bytes, blocked there in CI). A request of several pages is written in
    part, and its rest goes first once the standby reads again."""
    standby = sleeper(tmp_path)
    refused_at: list[int] = []

    def ask_until_refused() -> None:
        for asked in range(1, 1000):
            pending = standby.request_fork({env.SLOT_ENV: "0", "PADDING": "x" * padding}, answer_s=30)
            if pending is None:
                refused_at.append(asked)
                return
            with pytest.raises(ForkFailed, match="stopped"):
                pending.collect()  # given up at once: its cancellation is written too, where it fits

    try:
        os.kill(standby.process.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(standby.process.pid), 5, "the standby to stop")  # a signal is taken, not sent
        asker = threading.Thread(target=ask_until_refused, daemon=True)
        asker.start()
        asker.join(10)
        assert not asker.is_alive(), "the launcher blocked in a write to its stopped standby's full pipe"
        assert refused_at and 4 < refused_at[0] < 20, refused_at  # 16 pages: 2 or 3 a request (its cancellation too)
        os.kill(standby.process.pid, signal.SIGCONT)
        # Requests whose cancellation did not fit are forked once it wakes (their deadline is 30 s): killed as their
        # answers come, never left beside the slot's new interpreter.
        wait_until(lambda: standby.pump() or select.select([standby.reply_fd], [], [], 0.5)[0] == []
                   and not live_children(standby.process.pid), 10, "every fork given up on to be killed")
        forked = fork_now(standby, {env.SLOT_ENV: "0"})  # every line arrived whole: the template still takes requests
        os.kill(forked.pid, signal.SIGKILL)
    finally:
        os.kill(standby.process.pid, signal.SIGCONT)
        standby.close(timeout=0)


def test_the_launcher_starts_its_standby_before_it_imports_torch(tmp_path: Path) -> None:
    """ftcoord.launcher.main starts the node's standby before it imports torch itself: the two imports run side by side
    (~2 s off every job's start here). Whatever the launcher reaches before that start must stay torch-free."""
    script = (
        "import sys\n"
        "from ftcoord import log\n"
        "from ftcoord.launcher import main\n"
        "config, _ = main.parse_config(['--store', '127.0.0.1:29999', '--job-id', 'early', '--nproc', '2', '--',\n"
        "                                 sys.executable, '-m', 'training', '--steps', '5'])\n"
        "keeper = main._start_standby(config, log.get_logger(component='launcher'))\n"
        "assert keeper.standby is not None, 'no standby started'\n"
        "print(keeper.standby.process.pid, 'torch' in sys.modules, flush=True)\n"
        "keeper.release(timeout=0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    pid, torch_imported = done.stdout.split()[-2:]
    assert torch_imported == "False", "the launcher imported torch before it started its standby"
    assert not Path(f"/proc/{pid}").exists(), "the released standby is still there"  # release kills and reaps it


@pytest.mark.parametrize("command, module, script, options", [
    (["python", "-m", "training", "--steps", "5"], "training", None, ()),
    (["/usr/bin/python3", "train.py", "-u"], None, "train.py", ()),
    (["python", "-u", "-m", "training"], "training", None, ("-u",)),
    (["python3.11", "-uB", "-OO", "-X", "faulthandler", "-Wignore", "-P", "train.py", "-X"], None, "train.py",
     ("-uB", "-OO", "-X", "faulthandler", "-Wignore", "-P")),
])
def test_a_command_with_interpreter_options_is_run_in_process(command: list[str], module: str | None,
                                                              script: str | None, options: tuple[str, ...]) -> None:
    """`python -u -m train` is how many launch scripts run a job: it had no warm standby (every replacement a cold
    start of seconds) because only `python -m MOD` and `python FILE.py` were understood. What follows the module or
    script is the command's own (`-u`, `-X` there are its arguments)."""
    parsed = PythonCommand.parse(command)
    assert parsed is not None, unsupported(command)
    assert (parsed.module, parsed.script, parsed.options) == (module, script, options)
    assert parsed.args == command[len(command) - len(parsed.args):]


@pytest.mark.parametrize("command, says", [
    (["python", "-c", "print(1)"], "`-c`"),
    (["python", "-S", "-m", "training"], "`-S`"),  # no site-packages: the template would not find ftcoord
    (["python", "-I", "train.py"], "`-I`"),
    (["python", "-u"], "names no `-m MODULE`"),
    (["python", "-X"], "`-X` has no value"),
    (["python", "-m"], "names no module"),
    (["torchrun", "train.py"], "does not start with a python interpreter"),
])
def test_a_command_a_standby_cannot_run_says_why(command: list[str], says: str) -> None:
    assert PythonCommand.parse(command) is None
    reason = unsupported(command)
    assert reason is not None and says in reason, reason


def test_a_replacement_runs_as_the_interpreter_would_with_the_commands_options(tmp_path: Path) -> None:
    """The template starts with the command's interpreter options, and a fork keeps them: a replacement's output
    unbuffered under -u, no script directory on its path under -P, its warnings' filters, its optimisation level,
    faulthandler on; what the plain command sees, with and without the options."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import faulthandler, json, os, sys\n"
        "json.dump({'stdout': type(sys.stdout.buffer).__name__, 'optimize': sys.flags.optimize,\n"
        "           'safe_path': sys.flags.safe_path, 'warnoptions': sys.warnoptions,\n"
        "           'faulthandler': faulthandler.is_enabled(),\n"
        "           'script_dir_on_path': os.path.dirname(os.path.abspath(__file__)) in sys.path},\n"
        "          open(sys.argv[1], 'w'))\n")
    values = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # -u must be what unbuffers
    values.update(JOB_ENV)
    seen = {}
    for options in ([], ["-u", "-O", "-P", "-X", "faulthandler", "-Wignore::UserWarning"]):
        direct, forked = tmp_path / "direct.json", tmp_path / "forked.json"
        command = [sys.executable, *options, str(script)]
        subprocess.run([*command, str(direct)], env=values, check=True, timeout=30, stdout=subprocess.PIPE)
        standby = wait_ready(WarmStandby.start([*command, str(forked)], values, niced=False))
        try:
            child = fork_now(standby, {env.SLOT_ENV: "0"})
            assert child.wait(timeout=10) == 0
        finally:
            standby.close()
        seen[bool(options)] = json.loads(forked.read_text())
        assert seen[bool(options)] == json.loads(direct.read_text()), options
    assert seen[True] != seen[False], "the options changed nothing the probe can see: this test proves nothing"
    assert seen[True]["stdout"] == "FileIO" and not seen[True]["script_dir_on_path"], seen
