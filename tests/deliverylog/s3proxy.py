"""A loopback HTTP proxy in front of the S3 test server that injects 500/503 errors and latency on demand."""

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


class FaultyProxy:
    """Forwards to 127.0.0.1:<upstream>; `should_fail(n)` decides per request number whether to answer 500/503."""

    def __init__(self, upstream_port, should_fail=lambda n: False, delay=0.0):
        self.upstream_port = upstream_port
        self.should_fail = should_fail
        self.delay = delay
        self.requests = 0
        self.failed = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                with proxy._lock:
                    proxy.requests += 1
                    n = proxy.requests
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy.delay:
                    threading.Event().wait(proxy.delay)
                if proxy.should_fail(n):
                    with proxy._lock:
                        proxy.failed += 1
                    status = 503 if n % 2 else 500
                    payload = b"<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>"
                    if status == 500:
                        payload = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status, resp.reason)
                head = self.command == "HEAD"  # a HEAD answer keeps the object's own Content-Length
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP and (head or k.lower() != "content-length"):
                        self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"
