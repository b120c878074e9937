"""moto's AWS emulator, serving one request at a time.

Stock `moto_server` runs its WSGI app on a threaded werkzeug server without locking:
two conditional writes to the same item can interleave and both succeed, and two
receivers can both get the same SQS message. Serialising every request makes each
API call atomic, as it is on AWS.

One exception keeps that from stalling everything: an SQS long poll
(ReceiveMessage with WaitTimeSeconds > 0) would hold the lock for up to 20 seconds.
It is served as a series of short polls (WaitTimeSeconds=0), each under the lock,
with the lock released between them, until a message arrives or the wait is over:
what the client sees is a long poll; what moto sees is one short request at a time.
A waiting poll retries as soon as any message is sent (and every RECHECK_S, for
messages that become visible by time: delays and lapsed visibility timeouts), so
idle consumers cost the server little and a sent message is picked up at once.

Usage: python moto_server.py HOST PORT_FILE   (binds an ephemeral port, writes it to
PORT_FILE once it is listening, then serves until SIGTERM/SIGINT).
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
import time
from urllib.parse import parse_qsl, urlencode

from moto.moto_server.threaded_moto_server import (  # type: ignore
    DomainDispatcherApplication,
    create_backend_app,
)
from werkzeug.serving import make_server

RECHECK_S = 0.2
SENDS = ("SendMessage", "SendMessageBatch", "ChangeMessageVisibility", "ChangeMessageVisibilityBatch")


class OneAtATime:
    """WSGI middleware: the wrapped app sees one request at a time."""

    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()
        # Bumped after every request that may make a message receivable.
        self.sent = threading.Condition()
        self.generation = 0

    def _call_locked(self, environ, body: bytes):
        environ = dict(environ)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        captured = {}

        def start_response(status, headers, exc_info=None):
            captured["status"] = status
            captured["headers"] = headers
            return lambda _data: None

        with self.lock:
            result = self.app(environ, start_response)
            try:
                # Read the whole response under the lock: moto builds it lazily from
                # shared state.
                payload = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close:
                    close()
        return captured["status"], captured["headers"], payload

    def __call__(self, environ, start_response):
        length = environ.get("CONTENT_LENGTH")
        if length:
            body = environ["wsgi.input"].read(int(length))
        elif environ.get("wsgi.input_terminated"):
            # Chunked upload: werkzeug has de-chunked it and marks the end for us.
            body = environ["wsgi.input"].read()
        else:
            body = b""
        wait_s, short_body = long_poll(environ, body)
        if wait_s:
            deadline = time.monotonic() + wait_s
            while True:
                with self.sent:
                    seen = self.generation
                status, headers, payload = self._call_locked(environ, short_body)
                left = deadline - time.monotonic()
                if not status.startswith("200") or has_messages(environ, payload) or left <= 0:
                    break
                with self.sent:
                    self.sent.wait_for(lambda: self.generation != seen, timeout=min(RECHECK_S, left))
        else:
            status, headers, payload = self._call_locked(environ, body)
            if is_send(environ, body):
                with self.sent:
                    self.generation += 1
                    self.sent.notify_all()
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(payload))))
        start_response(status, headers)
        return [payload]


def long_poll(environ, body: bytes):
    """(seconds, the same request with WaitTimeSeconds=0) for an SQS long poll, else (0, None).

    Handles both SQS wire protocols: JSON (X-Amz-Target: AmazonSQS.ReceiveMessage,
    current SDKs) and query (Action=ReceiveMessage, older clients).
    """
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target == "AmazonSQS.ReceiveMessage":
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            return 0, None
        wait = int(request.get("WaitTimeSeconds") or 0)
        if wait <= 0:
            return 0, None
        request["WaitTimeSeconds"] = 0
        return wait, json.dumps(request).encode()
    if b"Action=ReceiveMessage" in body:
        params = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        wait = next((int(v) for k, v in params if k == "WaitTimeSeconds" and v.isdigit()), 0)
        if wait <= 0:
            return 0, None
        params = [(k, "0" if k == "WaitTimeSeconds" else v) for k, v in params]
        return wait, urlencode(params).encode()
    return 0, None


def is_send(environ, body: bytes) -> bool:
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target.startswith("AmazonSQS."):
        return target.split(".", 1)[1] in SENDS
    return any(f"Action={a}&".encode() in body + b"&" for a in SENDS)


def has_messages(environ, payload: bytes) -> bool:
    if environ.get("HTTP_X_AMZ_TARGET"):
        try:
            return bool(json.loads(payload or b"{}").get("Messages"))
        except ValueError:
            return True
    return b"<Message>" in payload


def main() -> None:
    host, port_file = sys.argv[1], sys.argv[2]
    app = DomainDispatcherApplication(create_backend_app)
    # Threads only accept connections and wait; the middleware admits one at a time.
    server = make_server(host, 0, OneAtATime(app), threaded=True)
    port = server.server_port
    os.environ["MOTO_PORT"] = str(port)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, port_file)

    def stop(_signum, _frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()


if __name__ == "__main__":
    main()
