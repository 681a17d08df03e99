"""A TCP proxy in front of a real service, to simulate its outages: cut it off (connections
reset, new ones refused), freeze it (connections stay open and silent), bring it back; or, for
Postgres, drop one connection right after a statement was executed and committed but before
its answer reached the client (an unknown commit outcome).

The outage tests (tests/integration) and the chaos run (``processor.tools.chaos``) use it;
``TcpProxy.for_dsn`` puts one in front of a Postgres DSN and ``dsn`` gives the DSN through it.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

import psycopg

_READY_FOR_QUERY = b"Z\x00\x00\x00\x05"  # Postgres' ReadyForQuery message, any status


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._flowing = threading.Event()
        self._flowing.set()
        self.held = 0  # chunks read and held back while frozen: a peer waits on each
        self._lose_answer_to: bytes | None = None
        self.answers_lost = 0
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def for_dsn(cls, dsn: str) -> TcpProxy:
        """A proxy in front of the Postgres server ``dsn`` names (host and port)."""
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        return cls(str(params.get("host") or "127.0.0.1"), int(str(params.get("port") or 5432)))

    def dsn(self, dsn: str) -> str:
        """``dsn`` with its host and port replaced by this proxy's."""
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        params.update(host="127.0.0.1", port=str(self.port))
        return psycopg.conninfo.make_conninfo("", **params)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._open.is_set():
                client.close()  # the outage: connections are refused as soon as they come
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)  # a frozen connection must hang, not time out here
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(a, selectors.EVENT_READ, b)
        selector.register(b, selectors.EVENT_READ, a)
        losing = False  # a marked statement went up: its answer never comes back
        try:
            while True:
                for key, _ in selector.select(timeout=1):
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = source.recv(65536)
                    if not data:
                        return
                    if not self._flowing.is_set():
                        with self._lock:
                            self.held += 1
                        self._flowing.wait()  # frozen: hold the bytes, answer nothing
                    if source is a and self._take_marked(data):
                        losing = True
                    elif source is b and losing:
                        # Swallow the answer until Postgres is ready for the next query
                        # (ReadyForQuery: the statement's transaction is over), then drop.
                        if _READY_FOR_QUERY in data:
                            with self._lock:
                                self.answers_lost += 1
                            return
                        continue
                    key.data.sendall(data)  # after a cut, the socket is shut: OSError
        except OSError:
            return
        finally:
            selector.close()
            for s in (a, b):
                s.close()

    def cut(self) -> None:
        """Drop every open connection and refuse new ones until restore(). Ends a freeze."""
        self._open.clear()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        self._flowing.set()  # held bytes go nowhere: their sockets are shut

    def lose_answer_to(self, marker: bytes) -> None:
        """The next statement whose bytes contain ``marker`` runs (and commits), but the
        connection drops before its answer reaches the client."""
        self._lose_answer_to = marker

    def _take_marked(self, data: bytes) -> bool:
        with self._lock:
            if self._lose_answer_to is not None and self._lose_answer_to in data:
                self._lose_answer_to = None
                return True
        return False

    def freeze(self) -> None:
        """Keep every connection open but pass nothing on, in either direction, until
        restore(): a hung service or a dropped network path (no reset, no answer). New
        connections are accepted and frozen too."""
        self._flowing.clear()

    def restore(self) -> None:
        """Accept connections and pass bytes on again (the bytes held while frozen first)."""
        self._open.set()
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._listener.close()
