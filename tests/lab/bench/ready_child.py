"""A stand-in child process for ServeProcess tests: prints a ready line like `serve` does.

Modes (argv[1]): ok | exit (dies before ready) | hang (never ready) | stubborn (ignores
SIGTERM) | die (exits with code 4 soon after it answered its readiness probe). In ok/stubborn mode it also starts a grandchild (`sleep`) so the test can check
that stopping kills the whole process group. The grandchild's pid is in the ready line.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

mode = sys.argv[1]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/readiness" else 404)
        self.end_headers()
        if mode == "die" and self.path == "/readiness":
            print("dying now", file=sys.stderr, flush=True)
            threading.Timer(0.2, os._exit, (4,)).start()

    def log_message(self, *args: object) -> None:
        pass


if mode == "exit":
    print("cannot start: no workers", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "hang":
    time.sleep(60)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("some log line on stdout", flush=True)
url = f"http://127.0.0.1:{server.server_address[1]}"
print(json.dumps({"event": "ready", "url": url, "grandchild": grandchild.pid}), flush=True)
server.serve_forever()
