"""A stand-in engine for the engine-check runner's own tests: a process that behaves as told on the runner's
interface (stdout lines, /health, /v1/completions, SIGTERM). The engine's real behaviour is proven with vLLM in
tests/engine/test_engine_check.py; this only lets the runner's paths (exit, hang, compile, serve) be driven fast.

    python scriptedengine.py --port P --mode serve|nofit|crash|hang|compile [--boot-s S] [--write FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

NOFIT = ("ValueError: To serve at least one request with the model's max seq len (1048576), (4.0 GiB KV cache is "
         "needed, which is larger than the available KV cache memory (1.0 GiB).")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", required=True)
    ap.add_argument("--boot-s", type=float, default=0.2)
    ap.add_argument("--write", help="a file this engine writes while it boots (a compiled artifact)")
    a = ap.parse_args()
    print("INFO engine starting", flush=True)
    if a.write:
        Path(a.write).parent.mkdir(parents=True, exist_ok=True)
        Path(a.write).write_text("compiled")
        print("INFO compiled a graph", flush=True)
    time.sleep(a.boot_s)
    if a.mode == "nofit":
        print(NOFIT, file=sys.stderr, flush=True)
        return 1
    if a.mode == "crash":
        print("RuntimeError: Engine core initialization failed.", file=sys.stderr, flush=True)
        return 1
    if a.mode in ("hang", "compile"):
        while True:
            time.sleep(1)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            out = json.dumps({"choices": [{"text": " ok"}], "model": body["model"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    print("INFO serving", flush=True)
    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
