"""A TCP forwarder on 127.0.0.1 that a test can cut and restore: a database that goes away and comes
back, while the real server behind it (the shared PostgreSQL) stays up for every other test."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class TcpProxy:
    """Forwards 127.0.0.1:`port` → `upstream`. `cut()` drops every open connection and refuses new
    ones (accepts and closes them at once, as a crashed server's host would reset them); `restore()`
    forwards again."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._accepter = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)

    def __enter__(self) -> TcpProxy:
        self._accepter.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._closed.set()
        self._drop_all()
        self._listener.close()
        self._accepter.join(timeout=5)

    def cut(self) -> None:
        self._cut.set()
        self._drop_all()

    def restore(self) -> None:
        self._cut.clear()

    def _drop_all(self) -> None:
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        self._listener.settimeout(0.1)
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
