"""Real servers on 127.0.0.1 for the remote-storage tests, the experiments and phase 2's benchmark.

- :class:`S3Server`: moto's standalone S3 API server (``moto[server]``), in this process.
- :class:`RangeHTTPServer`: a static file server with single-range ``Range`` requests, ``ETag`` and
  ``If-Match`` (stdlib ``http.server``).
- :class:`FaultProxy`: an HTTP proxy in front of either that adds latency, answers 503 ``SlowDown``,
  resets connections, cuts bodies short or stalls, a given number of times, and records every request.

Each is a context manager that starts on ``__enter__`` (a free port chosen by the system) and stops
every thread and socket it made on ``__exit__``. Nothing here reaches beyond loopback:
:func:`fake_aws_environment` gives the variables that point AWS clients at a local endpoint with fake
credentials and the EC2 metadata service disabled.
"""

from __future__ import annotations

import email.message
import email.utils
import http.client
import http.server
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FaultProxy", "RangeHTTPServer", "Request", "S3Server", "fake_aws_environment"]

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


def fake_aws_environment(endpoint: str) -> dict[str, str]:
    """Environment variables that make boto3, s3fs and obstore talk to ``endpoint`` with fake
    credentials, never to AWS nor to the EC2 metadata service."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",  # botocore's switch; obstore has none, so its metadata
        "AWS_METADATA_ENDPOINT": "http://127.0.0.1:9",  # endpoint points at a closed local port instead
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


class _Threads(http.server.ThreadingHTTPServer):
    """A threading HTTP server that can close the connections its handlers keep open (keep-alive)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, handler) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.open_sockets: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.handler_threads: list[threading.Thread] = []

    def process_request(self, request, client_address):
        with self.lock:
            self.open_sockets.add(request)
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address), daemon=True)
        with self.lock:
            self.handler_threads = [t for t in self.handler_threads if t.is_alive()] + [thread]
        thread.start()

    def handle_error(self, request, client_address) -> None:
        import sys

        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that closed or reset its connection (aiohttp's pool does): normal
        super().handle_error(request, client_address)

    def shutdown_request(self, request):
        with self.lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def stop(self, thread: threading.Thread) -> None:
        self.shutdown()
        thread.join(10)
        with self.lock:
            sockets, threads = list(self.open_sockets), list(self.handler_threads)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for handler in threads:
            handler.join(10)
        self.server_close()


class _Served:
    """Start/stop of a :class:`_Threads` server in a thread of its own."""

    def __init__(self) -> None:
        self._server: _Threads | None = None
        self._thread: threading.Thread | None = None

    def _start(self, handler) -> None:
        self._server = _Threads(handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc_info) -> None:
        if self._server is not None:
            self._server.stop(self._thread)
            self._server = None


class S3Server:
    """moto's S3 server on 127.0.0.1, with a fresh bucket per :meth:`bucket` call.

    Example:
        with S3Server() as s3:
            bucket = s3.bucket()          # "gpuload-test-1"
            s3.endpoint                   # "http://127.0.0.1:PORT"
    """

    def __init__(self) -> None:
        self._server = None
        self._count = 0

    def __enter__(self) -> S3Server:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.stop()

    def client(self):
        """A boto3 S3 client of this server (for the tests' own setup and checks)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def bucket(self) -> str:
        """Create a new empty bucket; returns its name."""
        self._count += 1
        name = f"gpuload-test-{os.getpid()}-{self._count}"
        self.client().create_bucket(Bucket=name)
        return name


class RangeHTTPServer(_Served):
    """Static files under ``root``, read-only, with ``Range: bytes=a-b``, ``ETag`` and ``If-Match``.

    The ETag is the file's size and modification time (as nginx makes it); a GET whose ``If-Match``
    names another ETag gets 412. Requests are recorded in :attr:`requests`; :attr:`latency` seconds are
    added before each answer, and the body bytes sent are counted in :attr:`bytes_sent` (as the socket
    takes them: a client that stops reading stops the count). With ``ignore_range``, a GET is answered
    200 with the whole file whatever its ``Range`` (as some servers and proxies do). Its HEAD and GET
    answers are also what S3 clients expect of a path-style ``/bucket/key`` endpoint (size, ETag,
    Last-Modified, ranges), so an S3 client pointed at it reads ``root/bucket/key``: a server cheap
    enough not to limit a comparison of clients (moto copies the whole object for every ranged GET).
    """

    def __init__(self, root: str | os.PathLike, *, ignore_range: bool = False) -> None:
        super().__init__()
        self.root = Path(root)
        self.ignore_range = ignore_range
        self.requests: list[Request] = []
        self.latency = 0.0
        self.bytes_sent = 0  # body bytes answered (what clients downloaded), for benchmarks
        self._count_lock = threading.Lock()

    def __enter__(self) -> RangeHTTPServer:
        self._start(_range_handler(self))
        return self


def _etag(path: Path) -> str:
    stat = path.stat()
    return f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'


def _range_handler(owner: RangeHTTPServer):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            owner.requests.append(Request(self.command, self.path, self.headers))
            if owner.latency:
                time.sleep(owner.latency)
            path = owner.root / self.path.split("?", 1)[0].lstrip("/")
            if not path.resolve().is_relative_to(owner.root.resolve()) or not path.is_file():
                return self._reply(404, b"not found")
            etag, size = _etag(path), path.stat().st_size
            if self.headers.get("If-Match") not in (None, "*", etag):
                return self._reply(412, b"precondition failed")
            headers = {
                "ETag": etag,
                "Accept-Ranges": "bytes",
                "Last-Modified": email.utils.formatdate(path.stat().st_mtime, usegmt=True),
            }
            wanted = self.headers.get("Range")
            if wanted is None or owner.ignore_range:
                return self._reply(200, path.read_bytes() if body else b"", headers, body, size)
            match = _RANGE.match(wanted.strip())
            start = int(match[1]) if match else size
            end = min(int(match[2]) if match and match[2] else size - 1, size - 1)
            if start >= size or start > end:
                return self._reply(416, b"", {"Content-Range": f"bytes */{size}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            with open(path, "rb") as file:  # only the range: a large object costs no more than a small one
                data = os.pread(file.fileno(), end + 1 - start, start) if body else b""
            self._reply(206, data, headers, body, end + 1 - start)

        def _reply(
            self, status: int, data: bytes, headers: dict | None = None, body: bool = True, length: int | None = None
        ) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data) if length is None else length))
            self.end_headers()
            if body and self.command != "HEAD":  # a HEAD answer has no body, whatever its status
                for start in range(0, len(data), 2**20):  # counted as the socket takes it
                    self.wfile.write(data[start : start + 2**20])
                    with owner._count_lock:
                        owner.bytes_sent += min(2**20, len(data) - start)

    return Handler


@dataclass
class Request:
    """One request a server or the proxy saw; ``headers`` is case-insensitive (``headers["range"]``)."""

    method: str
    path: str
    headers: email.message.Message = field(default_factory=email.message.Message)


FAULTS = ("503", "500", "404", "reset", "short", "stall", "trickle")


class FaultProxy(_Served):
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` (``http://127.0.0.1:PORT``) that injects faults.

    - :attr:`latency`: seconds added before every answer (a remote store's round trip).
    - :meth:`fail`: the next ``times`` requests whose method is in ``methods`` (and whose path contains
      ``path``) get the fault instead of their answer: ``"503"`` (S3's ``SlowDown``), ``"500"``,
      ``"404"`` (S3's ``NoSuchKey``: an object gone between its HEAD and its GET), ``"reset"`` (the
      connection closed with no answer), ``"short"`` (the answer's headers, then half its body, then
      the connection closed), ``"stall"`` (no answer for ``stall_seconds``), ``"trickle"`` (the
      answer's headers, then its body in 50 pieces spread over ``stall_seconds``: never a pause as
      long as a read timeout, the whole far longer).
    - :attr:`requests`: every request, in order (method, path, headers), faulted or not.

    Example:
        with S3Server() as s3, FaultProxy(s3.endpoint) as proxy:
            proxy.latency = 0.02
            proxy.fail("503", times=2)
            ... point clients at proxy.url ...
    """

    def __init__(self, upstream: str, *, stall_seconds: float = 5.0) -> None:
        super().__init__()
        host, port = upstream.removeprefix("http://").rstrip("/").split(":")
        self.upstream = (host, int(port))
        self.latency = 0.0
        self.stall_seconds = stall_seconds
        self.requests: list[Request] = []
        self._faults: list[list] = []  # [kind, remaining, methods, path]
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def __enter__(self) -> FaultProxy:
        self._start(_proxy_handler(self))
        return self

    def __exit__(self, *exc_info) -> None:
        self._stopping.set()
        super().__exit__(*exc_info)

    def fail(self, kind: str, times: int = 1, methods: tuple[str, ...] = ("GET",), path: str = "") -> None:
        """Give the next ``times`` matching requests the fault ``kind`` (see the class docstring)."""
        if kind not in FAULTS:
            raise ValueError(f"kind must be one of {FAULTS}, got {kind!r}")
        with self._lock:
            self._faults.append([kind, times, tuple(methods), path])

    def clear(self) -> None:
        """Drop the faults not yet given and the recorded requests."""
        with self._lock:
            self._faults.clear()
            self.requests.clear()

    def gets(self, path: str = "") -> list[Request]:
        """The GET requests recorded whose path contains ``path``."""
        with self._lock:
            return [request for request in self.requests if request.method == "GET" and path in request.path]

    def _take(self, method: str, path: str) -> str | None:
        with self._lock:
            for fault in self._faults:
                kind, remaining, methods, fragment = fault
                if remaining > 0 and method in methods and fragment in path:
                    fault[1] -= 1
                    return kind
        return None


def _proxy_handler(owner: FaultProxy):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self._forward()

        do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _forward(self) -> None:
            body = self._read_body()
            with owner._lock:
                owner.requests.append(Request(self.command, self.path, self.headers))
            fault = owner._take(self.command, self.path)
            if owner.latency:
                time.sleep(owner.latency)
            if fault == "reset":
                self.close_connection = True
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                return  # the handler closes the socket: a reset with no answer
            if fault == "stall":
                owner._stopping.wait(owner.stall_seconds)
                self.close_connection = True
                return
            if fault in ("503", "500", "404"):
                code, reason = {
                    "503": ("SlowDown", "Please reduce your request rate."),
                    "500": ("InternalError", "We encountered an internal error. Please try again."),
                    "404": ("NoSuchKey", "The specified key does not exist."),
                }[fault]
                data = f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{reason}</Message></Error>'
                self.send_response(int(fault))
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":  # a HEAD answer has no body
                    self.wfile.write(data.encode())
                return
            headers = {name: value for name, value in self.headers.items() if name.lower() != "transfer-encoding"}
            headers["Content-Length"] = str(len(body))
            upstream = http.client.HTTPConnection(*owner.upstream, timeout=60)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                self.send_response(response.status, response.reason)
                for name, value in response.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(name, value)
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command == "HEAD":
                    return
                if fault == "short" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if fault == "trickle":
                    piece = -(-len(data) // 50)
                    for start in range(0, len(data), piece):
                        if owner._stopping.wait(owner.stall_seconds / 50):
                            break
                        self.wfile.write(data[start : start + piece])  # a client that gave up: OSError, ignored
                    self.close_connection = True
                    return
                self.wfile.write(data)
            finally:
                upstream.close()

    return Handler
