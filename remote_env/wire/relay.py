"""The relay through the pool server: a trainer that cannot reach the actors' pod
addresses (a laptop behind one ``kubectl port-forward`` of the head service) opens
each actor channel through the lease API's port instead.

One HTTP request upgrades the connection (``GET /v1/relay?...`` with ``Upgrade:
envpool-relay/1``); after ``101 Switching Protocols`` the pool server splices the
bytes both ways to the leased actor's data address, and the channel is spoken end
to end over it (section 2 and 3 of ``remote_env/wire/README.md``): the lease key
never reaches the relay, whose bytes it cannot forge (each side checks the other's
HMAC). The pool server connects only to the current actor of a lease the caller
holds (lease id, slot, actor id and epoch checked against the lease book), never to
a host the caller names: it is no open proxy.

This module is the protocol both ends share (pure: no pool or driver code) and the
client's half (:class:`RelayDialer`: the standard library's sockets only, no Ray).
"""

from __future__ import annotations

import json
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

#: The ``Upgrade`` token both ends name; another is refused (400).
UPGRADE: Final = "envpool-relay/1"
PATH: Final = "/v1/relay"
#: The longest response head the client reads before the spliced bytes begin.
_MAX_HEAD: Final = 16384


class RelayRefusedError(ConnectionError):
    """The pool server did not relay: its HTTP status and JSON answer.

    A :class:`ConnectionError` (an ``OSError``): callers that handle an unreachable
    actor (a failed call, then ``/v1/replace``) handle it the same way.
    """

    def __init__(self, status: int, body: Mapping[str, Any], where: str) -> None:
        message = str(body.get("error") or body)
        super().__init__(f"relay {where}: HTTP {status}: {message}")
        self.status = status
        self.body = dict(body)

    @property
    def reason(self) -> str:
        return str(self.body.get("reason", ""))


@dataclass(frozen=True)
class RelayTarget:
    """Which actor of which lease a relayed connection is for: the query of the
    upgrade request, checked by the pool server against its lease book."""

    lease_id: str
    slot: int
    actor_id: str
    epoch: int

    def query(self) -> str:
        return urllib.parse.urlencode({"lease_id": self.lease_id, "slot": self.slot,
                                       "actor_id": self.actor_id, "epoch": self.epoch})

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> RelayTarget:
        """From the request's query; ``ValueError`` naming the field that is wrong."""
        def text(name: str) -> str:
            value = query.get(name, "")
            if not value:
                raise ValueError(f"query field {name!r}: missing")
            return value

        def number(name: str) -> int:
            raw = text(name)
            if not raw.isdigit():
                raise ValueError(f"query field {name!r}: must be an integer >= 0, got {raw!r}")
            return int(raw)

        return cls(text("lease_id"), number("slot"), text("actor_id"), number("epoch"))


def request_head(host: str, target: RelayTarget, token: str) -> bytes:
    """The upgrade request's bytes (no body)."""
    return (f"GET {PATH}?{target.query()} HTTP/1.1\r\n"
            f"Host: {host}\r\n"
            f"Authorization: Bearer {token}\r\n"
            "Connection: Upgrade\r\n"
            f"Upgrade: {UPGRADE}\r\n"
            "Content-Length: 0\r\n\r\n").encode()


def response_head() -> bytes:
    """The pool server's ``101`` (the spliced bytes follow it at once)."""
    return (f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: {UPGRADE}\r\n"
            "Connection: Upgrade\r\n\r\n").encode()


def parse_response_head(head: bytes) -> tuple[int, dict[str, str]]:
    """(status, headers with lower-case names) of a response head (through the blank
    line); ``ValueError`` for anything that is not HTTP/1.x."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


def split_url(url: str) -> tuple[str, int]:
    """(host, port) of the lease API's ``http://host:port`` URL."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname:
        raise ValueError(f"the relay goes through the lease API's http://HOST:PORT, got {url!r}")
    return parsed.hostname, parsed.port or 80


class RelayDialer:
    """Opens one actor's channel through the pool server (``channel.Channel`` takes it
    in place of an address): connect to the lease API's port, upgrade, and hand the
    socket over at the first spliced byte, for the channel's own handshake."""

    def __init__(self, url: str, token: str, target: RelayTarget) -> None:
        self.host, self.port = split_url(url)
        self._url = url
        self._token = token
        self.target = target

    def dial(self, timeout_s: float) -> socket.socket:
        """A connected socket whose next bytes are the actor's (its channel hello).

        Raises:
            RelayRefusedError: the pool server refused (401 token, 404/409 not a current
                actor of a lease held, 503 too many relayed connections or the actor
                unreachable from the head).
            OSError: the lease API's port is unreachable (the port-forward is down).
        """
        sock = socket.create_connection((self.host, self.port), timeout=timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(request_head(f"{self.host}:{self.port}", self.target, self._token))
            head = self._read_head(sock)
            status, headers = parse_response_head(head)
            if status != 101:
                raise RelayRefusedError(status, self._error_body(sock, headers), str(self))
            if headers.get("upgrade", "").lower() != UPGRADE:
                raise RelayRefusedError(502, {"error": f"the server upgraded to "
                                              f"{headers.get('upgrade')!r}, not {UPGRADE}: "
                                              "is this an EnvPool lease API?"}, str(self))
            return sock
        except ValueError as exc:  # not HTTP: something else listens there
            sock.close()
            raise RelayRefusedError(502, {"error": f"{exc}: is {self._url} the pool's lease "
                                          "API?"}, str(self)) from None
        except BaseException:
            sock.close()
            raise

    @staticmethod
    def _read_head(sock: socket.socket) -> bytes:
        """The response head, and not a byte past it: the spliced stream begins right
        after. Peeked, then taken exactly; a head split over packets byte by byte
        (~100 bytes, once per connection)."""
        seen = sock.recv(_MAX_HEAD, socket.MSG_PEEK)
        end = seen.find(b"\r\n\r\n")
        if end >= 0:
            return _recv_exact(sock, end + 4)
        head = bytearray()
        while not head.endswith(b"\r\n\r\n"):
            if len(head) >= _MAX_HEAD:
                raise ValueError("the response head is over 16 KiB")
            head += _recv_exact(sock, 1)
        return bytes(head)

    @staticmethod
    def _error_body(sock: socket.socket, headers: Mapping[str, str]) -> dict[str, Any]:
        size = int(headers.get("content-length", "0") or 0)
        raw = _recv_exact(sock, min(size, 1 << 20)) if size else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"error": raw.decode(errors="replace")[:500]}
        return body if isinstance(body, dict) else {"error": str(body)}

    def __str__(self) -> str:
        return f"via {self._url} to slot {self.target.slot}"


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError("the lease API closed the connection mid-answer")
        buf += chunk
    return bytes(buf)

