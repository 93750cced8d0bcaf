"""Helpers shared by the cluster tests: a stand-in vLLM command, recipe writing, PID checks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from tiny_finetune import learned_by_heart

# Plays `python -m vllm.entrypoints.openai.api_server ...`: answers /health on --port after
# FAKE_DELAY seconds, or exits with code 3 when the model folder holds a file named BROKEN.
FAKE_VLLM = """#!{python}
import os, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
if args[:1] == ["-c"]:  # preflight asks whether vllm imports: this stand-in "has" it
    sys.exit(0)
model = args[args.index("--model") + 1]
print("fake vLLM for", model, "env CUDA_VISIBLE_DEVICES=", os.environ.get("CUDA_VISIBLE_DEVICES"),
      "args", " ".join(args), flush=True)
print("started at", time.time(), flush=True)
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


# A retail-like tool and the one exchange the tool-calling tiny model learns by heart.
ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_order_details",
        "description": "Look up an order by its id.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}
TOOL_PROMPT = [
    {"role": "system", "content": "You are a retail support agent."},
    {"role": "user", "content": "Where is my order #W1001?"},
]
TOOL_CALL = {"name": "get_order_details", "arguments": {"order_id": "#W1001"}}


def tool_calling_model(model_dir: Path, out_dir: Path, steps: int = 40) -> Path:
    """The tiny model fine-tuned (the demo's warm start) to answer TOOL_PROMPT with ORDER_TOOL
    offered by exactly one ``<tool_call>`` block of TOOL_CALL, so that greedy decoding writes a
    tool call for a server's tool parser to find."""
    from prour.demo.corpus import SFTExample

    reply = {"role": "assistant", "content": "", "tool_calls": [{"function": TOOL_CALL}]}
    example = SFTExample("agent", TOOL_PROMPT, reply, tools=[ORDER_TOOL])
    return learned_by_heart(model_dir, out_dir, [example], steps)
