"""The actors' data channels on a fixed port range (ENVPOOL_DATA_PORTS), the one the
pool's NetworkPolicy opens to trainers without Ray: real sockets on the loopback."""

from __future__ import annotations

import ast
import re
import shlex
import socket
from pathlib import Path
from typing import Any

import pytest

from remote_env.wire import channel


def _echo(message: Any) -> Any:
    return message


def _free_range(size: int) -> tuple[int, int]:
    """``size`` consecutive ports that are free now (probed by binding them)."""
    for low in range(31000, 32700, size):
        socks = []
        try:
            for port in range(low, low + size):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                socks.append(s)
            return low, low + size - 1
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port range on the loopback")


def test_actors_listen_inside_the_range_each_on_its_own_port(monkeypatch: pytest.MonkeyPatch) -> None:
    low, high = _free_range(3)
    monkeypatch.setenv(channel.DATA_PORTS_ENV, f"{low}-{high}")
    servers = [channel.ChannelServer(_echo) for _ in range(3)]
    try:
        ports = set()
        for srv in servers:
            where = channel.parse_tcp(srv.listen_tcp("127.0.0.1"))
            assert where is not None
            ports.add(where[1])
        assert ports == {low, low + 1, low + 2}
        # a fourth finds the range full: a clear error, not a port outside it
        extra = channel.ChannelServer(_echo)
        try:
            with pytest.raises(OSError, match=f"no free TCP port in ENVPOOL_DATA_PORTS={low}-{high}"):
                extra.listen_tcp("127.0.0.1")
        finally:
            extra.close()
    finally:
        for srv in servers:
            srv.close()


def test_without_the_range_any_free_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(channel.DATA_PORTS_ENV, raising=False)
    srv = channel.ChannelServer(_echo)
    try:
        assert channel.parse_tcp(srv.listen_tcp("127.0.0.1")) is not None
    finally:
        srv.close()


@pytest.mark.parametrize("bad", ["", "20000", "20000-", "a-b", "3-2", "0-10", "1-70000", "1--2"])
def test_a_bad_range_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="ENVPOOL_DATA_PORTS must be '<low>-<high>'"):
        channel.parse_port_range(bad)


def test_the_trainer_image_installs_the_client_extra() -> None:
    """tests/cluster/image.sh's Ray-free trainer image holds what the 'client' extra names."""
    repo = Path(__file__).resolve().parents[2]
    # the extra's one line (tomllib is 3.11+, the package supports 3.10)
    line = re.search(r"^client = (\[.*\])$", (repo / "pyproject.toml").read_text(), re.M)
    assert line, "no 'client' extra in pyproject.toml"
    extra = ast.literal_eval(line.group(1))
    script = (repo / "tests" / "cluster" / "image.sh").read_text()
    m = re.search(r'^TRAINER_PIP_DEPS="(.*)"$', script, re.M)
    assert m, "TRAINER_PIP_DEPS not found in image.sh"
    assert sorted(shlex.split(m.group(1))) == sorted(extra)
    assert not any(d.split("[")[0].split(">")[0].split("=")[0] == "ray" for d in extra)
