"""Helpers shared by the cluster tests: a stand-in vLLM command, recipe writing, PID checks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

# Plays `python -m vllm.entrypoints.openai.api_server ...`: answers /health on --port after
# FAKE_DELAY seconds, or exits with code 3 when the model folder holds a file named BROKEN.
FAKE_VLLM = """#!{python}
import os, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
model = args[args.index("--model") + 1]
print("fake vLLM for", model, "env CUDA_VISIBLE_DEVICES=", os.environ.get("CUDA_VISIBLE_DEVICES"),
      "args", " ".join(args), flush=True)
if os.path.exists(os.path.join(model, "BROKEN")):
    time.sleep(float(os.environ.get("FAKE_FAIL_AFTER", "0.5")))
    print("fatal: no model weights in", model, flush=True)
    sys.exit(3)
time.sleep(float(os.environ.get("FAKE_DELAY", "0")))

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"")
    def log_message(self, *args):
        pass

host = args[args.index("--host") + 1]
HTTPServer((host, int(args[args.index("--port") + 1])), Health).serve_forever()
"""


def write_recipe(path: Path, data: dict[str, Any]) -> Path:
    """Dump a recipe mapping to YAML and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def alive(pid: int, settle_s: float = 5.0) -> bool:
    """Whether ``pid`` still runs after up to ``settle_s`` (zombies count as gone)."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state == "Z" or time.monotonic() > deadline:
            return state != "Z"
        time.sleep(0.05)
