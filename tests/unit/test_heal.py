"""ftcoord.wrapper.heal: the most advanced member heals the rest, tensor-wise, in place, over a real gloo group.

Each scenario runs its ranks as real processes (forked from the test fork server) on the session's
store server; tests/helpers/heal_ranks.py builds each rank's objects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ftcoord import StoreServer
from tests.helpers.cluster import Forker
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(90)


def run_ranks(forker: Forker, store: StoreServer, job_id: str, tmp_path: Path, scenario: str,
              world: int) -> list[dict[str, Any]]:
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    pids = [forker.spawn([scenario, str(r), str(world), store.address, f"heal/{job_id}", str(outs[r])],
                         tmp_path / f"rank{r}.out", "tests.helpers.heal_ranks") for r in range(world)]
    wait_until(lambda: all(p in forker.exited() for p in pids), 60, f"the {world} ranks of {scenario!r} to finish")
    exited = forker.exited()
    for r, pid in enumerate(pids):
        assert exited[pid] == 0, (tmp_path / f"rank{r}.out").read_text()[-3000:]
    return [json.loads(out.read_text()) for out in outs]


def test_a_fresh_member_receives_every_tensor_in_place_on_its_device(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    ranks = run_ranks(forker, store_server, job_id, tmp_path, "in_place", 2)
    for r in ranks:
        assert r["first"]["source"] == 0 and r["first"]["receivers"] == [1] and r["first"]["step"] == 3
        assert r["in_place"], "parameters, buffers and the plain tensor must be written where they live"
        assert r["devices"] == ["cpu"]
        assert r["again"]["receivers"] == [] and r["again"]["bytes"] == 0
    assert ranks[0]["digests"] == ranks[1]["digests"]
    assert ranks[1]["counter"] == [7.0, 1.0]
    assert ranks[0]["first"]["bytes"] == ranks[1]["first"]["bytes"] > 4 * 600 * 512


def test_a_fresh_optimizer_gets_the_sources_moments_and_the_next_step_agrees_bit_for_bit(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    ranks = run_ranks(forker, store_server, job_id, tmp_path, "adam", 2)
    assert ranks[1]["first"]["receivers"] == [1]
    # Both ranks trained one more step after the heal: with Adam's moments (and its step count)
    # missing or different on the fresh rank, its parameters would differ.
    assert ranks[0]["digests"] == ranks[1]["digests"]
    assert ranks[0]["lr"] == ranks[1]["lr"]


def test_a_member_that_already_matches_receives_nothing(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    ranks = run_ranks(forker, store_server, job_id, tmp_path, "matching", 3)
    assert all(r["first"]["source"] == 0 and r["first"]["receivers"] == [2] for r in ranks)
    assert ranks[1]["first"]["bytes"] == 0, "rank 1 matched the source: it takes no part in the transfer"
    assert ranks[2]["first"]["bytes"] > 0
    assert ranks[0]["digests"] == ranks[1]["digests"] == ranks[2]["digests"]


def test_members_at_the_same_step_with_different_state_are_healed(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    """Ties on the step are decided by digest; two receivers out of four travel over a subgroup."""
    ranks = run_ranks(forker, store_server, job_id, tmp_path, "tied_differs", 4)
    assert all(r["first"]["source"] == 0 and r["first"]["receivers"] == [1, 3] for r in ranks)
    assert ranks[2]["first"]["bytes"] == 0
    assert len({json.dumps(r["digests"]) for r in ranks}) == 1


def test_a_non_tensor_stateful_object_is_healed(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    ranks = run_ranks(forker, store_server, job_id, tmp_path, "stateful", 2)
    assert all(r["first"]["source"] == 1 and r["first"]["step"] == 41 for r in ranks)
    assert ranks[0]["position"] == ranks[1]["position"]
    assert ranks[0]["position"]["cursor"] == 41 and ranks[0]["position"]["epoch"] == 3


def test_different_names_on_different_members_is_a_clear_error_on_every_member(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    ranks = run_ranks(forker, store_server, job_id, tmp_path, "names", 2)
    for r in ranks:
        assert "members hold different names" in r["error"] and "'ema'" in r["error"], r
        assert "rank 0: ['model'] (missing ['ema'])" in r["error"]


def test_when_nobody_holds_state_the_given_step_comes_back_and_nothing_moves(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    ranks = run_ranks(forker, store_server, job_id, tmp_path, "nobody", 2)
    for r in ranks:
        assert r["first"] == {"source": None, "step": -1, "receivers": [], "bytes": 0}
    assert ranks[0]["digests"] != ranks[1]["digests"], "fresh weights from different seeds stay as they are"


def test_a_state_that_cannot_travel_safely_fails_on_every_member(
    forker: Forker, store_server: StoreServer, job_id: str, tmp_path: Path
) -> None:
    ranks = run_ranks(forker, store_server, job_id, tmp_path, "unsendable", 2)
    assert "cannot travel safely" in ranks[0]["error"] and "Position" in ranks[0]["error"], ranks[0]["error"]
    assert "cannot travel safely" in ranks[1]["error"]
