"""A fork server for tests: imports torch once, then forks real member processes.

Starting Python and importing torch costs ~2.5 s on 2 cores; tests that start and kill
dozens of processes would spend minutes on it. Children forked from this process (which
runs no threads) are real processes: they get real SIGKILL/SIGSTOP and die for real.

Protocol on stdin/stdout, one JSON object a line:
  {"spawn": [argv...], "out": PATH, "target": MODULE, "env": {...}} -> {"pid": N}
     (the child runs MODULE.main(argv); target defaults to tests.helpers.member)
  {"status": true}                  -> {"exited": {pid: code}}  (code < 0: killed by signal)
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys

import torch._dynamo  # noqa: F401 - what every optimizer's constructor imports (~2 s)

import ftcoord  # noqa: F401 - the expensive import, done once before any fork
import training.loop  # noqa: F401
from tests.helpers import allreduce_job, member  # noqa: F401 - preloaded for the children

_exited: dict[int, int] = {}


def _reap(*_: object) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _exited[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _child(argv: list[str], out: str, target: str, env: dict[str, str]) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.environ.update(env)
    code = 1
    try:
        code = importlib.import_module(target).main(argv)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    signal.signal(signal.SIGCHLD, _reap)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "spawn" in request:
            pid = os.fork()
            if pid == 0:
                _child(request["spawn"], request["out"], request.get("target", "tests.helpers.member"),
                       request.get("env", {}))
            print(json.dumps({"pid": pid}), flush=True)
        elif "status" in request:
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
            _reap()
            reply = json.dumps({"exited": _exited})
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
            print(reply, flush=True)


if __name__ == "__main__":
    main()
