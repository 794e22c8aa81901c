"""An HTTP proxy that adds a fixed delay to every request before passing it on, as a real object store's latency.

    python bench/latency_proxy.py --upstream http://127.0.0.1:9023 --delay_ms 20
    STORAGE_EMULATOR_HOST=http://127.0.0.1:<its port> beam-etl convert --input gs://bkt/photos/ ...

Each request sleeps `delay_ms` on its own thread, so concurrent requests overlap their delays
as they do against a real store (which answers in parallel); one client waiting on one request
at a time pays the full delay every time.
"""

import argparse
import http.client
import http.server
import socketserver
import threading
import time
import urllib.parse

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


class LatencyProxy:
    """A reverse proxy on 127.0.0.1:port in front of `upstream` (http://host:port), in a thread."""

    def __init__(self, upstream: str, delay_ms: float, port: int = 0):
        target = urllib.parse.urlsplit(upstream)
        self.delay, self.requests = delay_ms / 1000.0, 0
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
                proxy.requests += 1
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

        self.server = Server(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, name="latency-proxy", daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="http://host:port of the emulator")
    p.add_argument("--delay_ms", type=float, default=20.0)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    proxy = LatencyProxy(args.upstream, args.delay_ms, args.port)
    print(f"STORAGE_EMULATOR_HOST={proxy.url}  # {args.delay_ms:g} ms per request to {args.upstream}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        proxy.close()


if __name__ == "__main__":
    main()
