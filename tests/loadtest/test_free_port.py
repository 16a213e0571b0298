"""Ports the harness hands to servers it starts."""

from __future__ import annotations

import socket

import pytest

from loadtest.harness.processes import ephemeral_ports, free_port, outside_ephemeral_range


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


@pytest.mark.parametrize(
    ("kernel_range", "drawn_from"),
    [
        ((32768, 60999), (16384, 32768)),  # Linux's default: below it
        ((49152, 65535), (16384, 32768)),  # IANA's: below, capped as Linux's
        ((2000, 65535), (1024, 2000)),  # a little room below
        ((1024, 60999), (61000, 65536)),  # none below: above it
        ((1, 65535), (1024, 65536)),  # none either side: anywhere unprivileged
    ],
)
def test_ports_are_drawn_outside_the_kernels_range_where_there_is_room(
    kernel_range: tuple[int, int], drawn_from: tuple[int, int]
) -> None:
    assert outside_ephemeral_range(*kernel_range) == drawn_from
