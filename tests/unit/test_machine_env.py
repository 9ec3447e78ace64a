"""The environment the chaos tools give the processes they start on this machine (chaos.machine_env)."""

from __future__ import annotations

import pytest

from chaos.machine_env import machine_env

pytestmark = pytest.mark.timeout(10)


def test_gloo_binds_on_loopback_and_torch_warns_only_on_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    monkeypatch.setenv("KEPT", "yes")
    values = machine_env(OMP_NUM_THREADS="1")
    assert (values["GLOO_SOCKET_IFNAME"], values["TORCH_CPP_LOG_LEVEL"]) == ("lo", "ERROR")
    assert (values["OMP_NUM_THREADS"], values["KEPT"]) == ("1", "yes")


def test_what_the_caller_set_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth1")
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")
    values = machine_env()
    assert (values["GLOO_SOCKET_IFNAME"], values["TORCH_CPP_LOG_LEVEL"]) == ("eth1", "INFO")
