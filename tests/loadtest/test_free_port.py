"""Ports the harness hands to servers it starts."""

from __future__ import annotations

import socket

from loadtest.harness.processes import ephemeral_ports, free_port


def test_free_ports_lie_below_the_kernels_ephemeral_range_and_are_never_repeated() -> None:
    # a port in the ephemeral range can be taken by any socket that binds port 0 or connects
    # before the server binds it (vLLM's own ZMQ sockets took its KV-events port so in CI)
    low, _ = ephemeral_ports()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < low for port in ports)


def test_a_free_port_can_be_bound_and_a_listened_one_is_never_handed_out() -> None:
    taken = []
    try:
        for _ in range(50):  # hold many, so a draw that hits one of them is likely over the test
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", free_port()))
            sock.listen()
            taken.append(sock)
        held = {s.getsockname()[1] for s in taken}
        assert not held & {free_port() for _ in range(200)}
    finally:
        for sock in taken:
            sock.close()
