"""`chaos bench --only forget`: what forgetting an old generation costs the leader's round (ftcoord.leader.forgetter).

A generation of N members is planted in a real store as a job leaves it (its record, the keys of its change, gloo's
rendezvous key per member), and the leader's schedule forgets it from a thread named as the leader duty's: once
deleting itself (no forgetter: the baseline), once handing it to a Forgetter, alternating which
goes first in each repetition. Measured: how long the leader's round stood in the schedule, the requests it sent
meanwhile (the store link counts them by thread: on a network each is a round trip, so the round stands ~requests x
RTT), and how long until every key was gone. The store is a process of its own; loopback here: the requests are
what carries to a network.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from chaos.bench.recovery import summary
from ftcoord.leader.forgetter import KEEP_GENERATIONS, ForgetSchedule, Forgetter
from ftcoord.log import get_logger
from ftcoord.protocol import keys
from ftcoord.protocol.record import GenerationRecord
from ftcoord.store.link import LinkedStore, StoreLink
from ftcoord.store.server import StoreProcess

_CHANGE_KEYS = (keys.joiners, keys.probe, keys.interrupt, keys.evidence, keys.finished, keys.arrived)
RTT_S = 0.0002
"""A round trip on a datacenter network, for the estimate of the leader's round there (requests x RTT)."""


def plant(store: LinkedStore, generation: int, world: int) -> None:
    """What a generation of `world` members leaves in the store once it ran."""
    record = GenerationRecord(generation=generation, members=tuple(range(world)), incarnations=(1,) * world,
                              leader=0, leader_term=1, target_world_size=world)
    store.compare_set(keys.record(generation), "", record.to_json())
    for key in _CHANGE_KEYS:
        store.set(key(generation), "1")
    for rank in range(world):
        store.set(keys.gloo_rendezvous(generation, rank), b"\0" * 154)


def _round(link: StoreLink, store: LinkedStore, generation: int, world: int,
           forgetter: Forgetter | None) -> tuple[float, int, float]:
    """One forgetting of `generation`: the leader's round (s), its requests, and when its keys were all gone (s)."""
    running = generation + KEEP_GENERATIONS
    store.set(keys.all_arrived(running), "1")  # the newest generation's members all hold its record: quiet
    schedule = ForgetSchedule(patience_s=60.0, forgetter=forgetter)
    schedule.decided(running)
    before = link.requests()
    took: list[float] = []

    def leader_round() -> None:
        started = time.perf_counter()
        schedule.run(store, running)
        took.append(time.perf_counter() - started)

    started = time.perf_counter()
    thread = threading.Thread(target=leader_round, name="ftcoord-leader-0")
    thread.start()
    thread.join()
    last = keys.gloo_rendezvous(generation, world - 1)
    while store.check([last]):
        if time.perf_counter() - started > 120:
            raise TimeoutError(f"generation {generation} of {world} members was not forgotten within 120 s")
        time.sleep(0.005)
    gone = time.perf_counter() - started  # to 5 ms, and sooner while this thread looks: it keeps a core awake
    sent = sum(n for (role, _), n in (link.requests() - before).items() if role == "leader")
    return took[0], sent, gone


def bench_forget(address: str, sizes: list[int], reps: int) -> list[dict[str, Any]]:
    """One row per size: the leader's round, its requests and when the keys were gone, deleting itself and handing
    over (`reps` of each, alternated), in the store at `address`."""
    rows = []
    for world in sizes:
        link = StoreLink(address, f"bench-forget-{world}")
        store = link.connect()
        forgetter = Forgetter(link.client, "ftcoord-forget-0", get_logger(component="bench_forget"))
        measured: dict[str, dict[str, list[float]]] = {m: {"round_s": [], "requests": [], "gone_s": []}
                                                       for m in ("itself", "handed")}
        generation = 1
        for rep in range(reps):
            for mode in (("itself", "handed") if rep % 2 == 0 else ("handed", "itself")):
                plant(store, generation, world)
                took, sent, gone = _round(link, store, generation, world, forgetter if mode == "handed" else None)
                for name, value in (("round_s", took), ("requests", sent), ("gone_s", gone)):
                    measured[mode][name].append(value)
                generation += 1
        forgetter.stop(wait_s=10.0)
        link.close()
        row: dict[str, Any] = {"members": world}
        for mode, values in measured.items():
            requests = statistics.median(values["requests"])
            row[mode] = {"leader_round_ms": summary([s * 1000 for s in values["round_s"]], 2),
                         "leader_requests": requests, f"leader_round_at_{RTT_S * 1000:g}ms_rtt_ms":
                         round(requests * RTT_S * 1000, 1),
                         "keys_gone_ms": summary([s * 1000 for s in values["gone_s"]], 1)}
        rows.append(row)
    return rows


def run_forget_bench(out: Path, quick: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    sizes, reps = ([256, 1024], 3) if quick else ([1024, 4096], 5)
    server = StoreProcess.start("127.0.0.1", 0, own_session=True)  # a store of its own, as a job's
    try:
        rows = bench_forget(server.address, sizes, reps)
    finally:
        server.stop()
    (out / "forget-bench.json").write_text(json.dumps({"repetitions": reps, "rows": rows}, indent=1))
    for row in rows:
        itself, handed = row["itself"], row["handed"]
        print(f"N={row['members']}: the leader's round while an old generation is forgotten: "
              f"{itself['leader_round_ms']['median']} ms ({itself['leader_round_ms']['min']}-"
              f"{itself['leader_round_ms']['max']}), {itself['leader_requests']:g} requests, deleting itself; "
              f"{handed['leader_round_ms']['median']} ms ({handed['leader_round_ms']['min']}-"
              f"{handed['leader_round_ms']['max']}), {handed['leader_requests']:g} requests, handing it to its "
              f"forgetter (keys gone {handed['keys_gone_ms']['median']} ms later; {reps} repetitions)", flush=True)
    return 0
