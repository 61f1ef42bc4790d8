"""headrace.localserver.LocalServer (the demo's, the benchmarks' and the pytest plugin's
nats-server) when the port it picked is taken before the server listens on it: what
parallel test runs do to each other."""

from __future__ import annotations

import socket

import pytest
from headrace.localserver import LocalServer, LocalServerError


def listening_socket(port: int = 0) -> socket.socket:
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    return squatter


def test_a_port_it_picked_that_is_taken_meanwhile_is_replaced() -> None:
    server = LocalServer(jetstream=False)
    taken = server.port
    with listening_socket(taken):
        server.start()
        try:
            assert server.port != taken
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
                assert client.recv(4096).startswith(b"INFO ")
        finally:
            server.stop()


def test_a_port_the_caller_gave_is_not_replaced() -> None:
    with listening_socket() as squatter:
        taken = squatter.getsockname()[1]
        server = LocalServer(jetstream=False, port=taken)
        with pytest.raises(LocalServerError, match="address already in use"):
            server.start()
        assert server.port == taken
