"""An HTTP proxy in front of an object-store emulator that counts requests by kind and bytes each way.

Optionally it holds every request `delay_ms` first, as a real store's latency; each request
sleeps on its own thread, so concurrent requests overlap their delays as they do against a
real store. Clients reach it as they reach the emulator: STORAGE_EMULATOR_HOST=<its url>.
"""

import collections
import http.client
import http.server
import socketserver
import threading
import time
import urllib.parse

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


def kind(method: str, path: str) -> str:
    """What a GCS JSON API request does: 'media GET', 'metadata GET', 'list', 'upload part', ..."""
    url = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(url.query)
    if method == "GET":
        if query.get("alt") == ["media"] or url.path.startswith("/download/"):
            return "media GET"
        return "list" if url.path.rstrip("/").endswith("/o") else "metadata GET"
    if method == "POST":
        if "/rewriteTo/" in url.path or "/copyTo/" in url.path:
            return "copy"
        if url.path.startswith("/batch"):
            return "batch"
        upload = query.get("uploadType", [""])[0]
        if upload == "resumable":
            return "upload start"
        if upload:
            return "simple upload"
    if method == "PUT":
        return "upload part"
    if method == "DELETE":
        return "delete"
    return method


class StoreProxy:
    """A reverse proxy on 127.0.0.1:port in front of `upstream` (http://host:port), in a thread.

    counts: requests per kind; bytes_read: media bodies served; bytes_written: upload bodies sent.
    """

    def __init__(self, upstream: str, delay_ms: float = 0.0, port: int = 0):
        target = urllib.parse.urlsplit(upstream)
        self.delay = delay_ms / 1000.0
        self.counts, self.bytes_read, self.bytes_written = collections.Counter(), 0, 0
        self._lock = threading.Lock()
        local = threading.local()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: a client's pooled connection stays open

            def log_message(self, *args):
                pass

            def _connection(self):
                if getattr(local, "conn", None) is None:
                    local.conn = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
                return local.conn

            def _forward(self):
                if proxy.delay:
                    time.sleep(proxy.delay)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                for attempt in (0, 1):  # a kept-alive upstream connection may have been closed
                    conn = self._connection()
                    try:
                        conn.request(self.command, self.path, body=body, headers=headers)
                        resp = conn.getresponse()
                        data = resp.read()
                        break
                    except (http.client.HTTPException, OSError):
                        conn.close()
                        local.conn = None
                        if attempt:
                            raise
                what = kind(self.command, self.path)
                with proxy._lock:
                    proxy.counts[what] += 1
                    if what == "media GET":
                        proxy.bytes_read += len(data)
                    elif what in ("upload part", "simple upload"):
                        proxy.bytes_written += length
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128

            def handle_error(self, request, client_address):
                import sys

                if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):  # a client hung up: not news
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, name="store-proxy", daemon=True).start()

    @property
    def requests(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        with self._lock:
            self.counts, self.bytes_read, self.bytes_written = collections.Counter(), 0, 0

    def snapshot(self) -> dict:
        with self._lock:
            return {"requests": sum(self.counts.values()), "by_kind": dict(self.counts),
                    "bytes_read": self.bytes_read, "bytes_written": self.bytes_written}

    def close(self):
        self.server.shutdown()
        self.server.server_close()
