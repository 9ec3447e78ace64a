"""The launchers of a chaos run (chaos.launchers): which node a scenario's slot is on."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.launchers import Launchers
from chaos.scenario import parse

pytestmark = pytest.mark.timeout(10)


def test_a_hot_spares_slot_is_on_the_first_node(tmp_path: Path) -> None:
    """A scenario numbers the spares after the workers (slots nproc..), and the first node's launcher runs them: a
    lose, partition, replace or standby fault aimed at a spare's slot stopped the run with a bare StopIteration."""
    job = parse('name = "x"\ndescription = "d"\n[job]\nnproc = 2\nspares = 1\nglobal_batch = 8\n'
                'nodes = [[0], [1]]\n', "spare.toml").job
    launchers = Launchers(job, "127.0.0.1:1", "job", tmp_path, [], None, tmp_path / "launchers.out")
    assert launchers.node_of(2) is launchers.nodes[0]
    assert launchers.node_of(1) is launchers.nodes[1]
    assert launchers.node_of(0) is launchers.nodes[0]
