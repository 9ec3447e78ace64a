"""`ftcoord status`: find the job on the store, read it (ftcoord.observe.job_view), print it once or live."""

from __future__ import annotations

import json
import time

import torch.distributed as dist
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ftcoord.errors import FtcoordError, StoreUnavailable
from ftcoord.observe.job_view import JobReader
from ftcoord.observe.render import render
from ftcoord.protocol import jobs
from ftcoord.store.address import StoreAddress
from ftcoord.store.client import connect, job_store


def show(store: str, job: str | None, *, watch: bool, as_json: bool, refresh: float,
         connect_timeout: float) -> int:
    address = StoreAddress.parse(store)
    try:
        base = connect(address, deadline=connect_timeout)
    except StoreUnavailable as exc:
        raise FtcoordError(f"no store answers at {address} within {connect_timeout:g}s ({exc}); is ftcoord-store "
                           f"running there? Pass --store HOST:PORT or set FTCOORD_STORE") from None
    known = jobs.listed(base)
    if job is None and len(known) != 1:
        return _list_jobs(base, address, known, as_json)
    job = job or known[0]
    if job not in known and watch:
        try:
            _wait_for_job(base, address, job, refresh)
        except KeyboardInterrupt:
            return 0
    elif job not in known:
        listing = ", ".join(known[-10:]) + (f" (and {len(known) - 10} more)" if len(known) > 10 else "") \
            if known else "none yet"
        raise FtcoordError(f"no job {job!r} on the store at {address}; jobs there: {listing}")
    reader = JobReader(job_store(base, job), job)
    if not watch:
        reader.watch(reader.window())
        view = reader.read()
        if as_json:
            print(view.to_json())
        else:
            Console().print(render(view))
        return 0
    return _watch(reader, refresh)


def _wait_for_job(base: dist.Store, address: StoreAddress, job: str, refresh: float) -> None:
    """--watch of a job that has not started yet: say so, and wait for it (Ctrl-C ends the wait)."""
    console = Console()
    with console.status(f"waiting for job {job!r} to start on the store at {address} (Ctrl-C to stop)"):
        while job not in jobs.listed(base):
            time.sleep(refresh)


def _watch(reader: JobReader, refresh: float) -> int:
    console = Console()
    try:
        with Live(render(reader.read()), console=console, auto_refresh=False) as live:
            while True:
                reader.watch(refresh)
                live.update(render(reader.read()), refresh=True)
    except KeyboardInterrupt:
        return 0
    except dist.DistError as exc:
        raise FtcoordError(f"lost the store while watching job {reader.job!r}: {exc}".splitlines()[0]) from None


def _list_jobs(base: dist.Store, address: StoreAddress, known: list[str], as_json: bool) -> int:
    """Several jobs (or none): one line each, and how to pick one."""
    rows = []
    for job in known:
        reader = JobReader(job_store(base, job), job)
        view = reader.read()
        rows.append({"job": job, "state": view.state, "generation": view.generation, "world_size": view.world_size,
                     "step": view.step})
    if as_json:
        print(json.dumps({"store": str(address), "jobs": rows}, indent=1))
        return 0
    console = Console()
    if not rows:
        console.print(f"no jobs on the store at {address} yet")
        return 0
    table = Table("job", "state", "generation", "world", "step", box=None, header_style="bold")
    for row in rows:
        table.add_row(row["job"], row["state"], str(row["generation"]), str(row["world_size"]),
                      "-" if row["step"] is None else str(row["step"]))
    console.print(table)
    console.print(f"{len(rows)} jobs on {address}: `ftcoord status --job JOB` shows one "
                  f"({time.strftime('%H:%M:%S')})")
    return 0
