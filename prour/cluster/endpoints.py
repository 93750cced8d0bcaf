"""The endpoints file that ``prour serve`` publishes and train/eval read (model id -> base URL).

Its ``status`` moves through ``starting`` (servers launched, not yet healthy) -> ``ready`` ->
``stopped``, or to ``failed`` with an ``error``. An ``openai`` role without a ``base_url`` takes it
from the server whose model id equals the role's ``model`` once the file says ``ready``.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prour.config import Recipe
from prour.files import write_atomic

logger = logging.getLogger(__name__)

SCHEMA = "prour.endpoints/1"
STATUSES = ("starting", "ready", "failed", "stopped")
DEFAULT_NAME = "endpoints.json"
PROBE_TIMEOUT_S = 2.0  # seconds a health probe of an OpenAI-compatible server waits


class EndpointsError(RuntimeError):
    """The endpoints file is missing, unreadable, or says the servers are not usable."""


def endpoints_path(recipe: Recipe) -> Path:
    """The recipe's endpoints file: ``endpoints_file``, else ``<run_dir>/endpoints.json``."""
    explicit = recipe.endpoints_file
    return Path(explicit) if explicit else recipe.resolved_run_dir() / DEFAULT_NAME


def write_endpoints(path: Path, record: dict[str, Any]) -> None:
    """Write the record atomically (readers never see half a file)."""
    if record.get("status") not in STATUSES:
        raise ValueError(
            f"endpoints status must be one of {STATUSES}, got {record.get('status')!r}"
        )
    body = {"schema": SCHEMA, **record, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_atomic(path, json.dumps(body, indent=2) + "\n")


def read_endpoints(path: Path) -> dict[str, Any] | None:
    """The record in ``path``; ``None`` when the file does not exist yet."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EndpointsError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise EndpointsError(f"{path}: not a prour endpoints file (expected schema {SCHEMA!r})")
    if record.get("status") not in STATUSES:
        raise EndpointsError(f"{path}: unknown status {record.get('status')!r}")
    return record


def wait_for_endpoints(path: Path, timeout_s: float, poll_s: float = 1.0) -> dict[str, Any]:
    """Block until the file says ``ready``; raise on ``failed``/``stopped`` or at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = read_endpoints(path)
        status = record["status"] if record else "missing"
        if status == "ready":
            return record  # type: ignore[return-value]
        if status in ("failed", "stopped"):
            error = (record or {}).get("error") or "no error recorded"
            raise EndpointsError(f"servers in {path} are {status}: {error}")
        if time.monotonic() >= deadline:
            raise EndpointsError(
                f"servers in {path} not ready after {timeout_s:g} s (status: {status}); "
                f"is `prour serve` running for this recipe?"
            )
        time.sleep(poll_s)


def process_alive(pid: int | None) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:  # no /proc: fall back to signal 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def apply_endpoints(recipe: Recipe, record: dict[str, Any]) -> Recipe:
    """A copy of ``recipe`` whose ``openai`` roles without ``base_url`` point at their servers:
    the first copy's URL, the other copies' as ``replica_urls`` (the client spreads requests
    over them all), and the requests all copies run at once as ``server_slots``."""
    servers = record.get("servers") or {}
    resolved = recipe.model_copy(deep=True)
    for role, cfg in resolved.models.items():
        if cfg.backend != "openai" or cfg.base_url:
            continue
        server = servers.get(cfg.model)
        if server:
            cfg.base_url = server["base_url"]
            cfg.api_key_file = record.get("key_file") or cfg.api_key_file
            copies = [copy.get("base_url") for copy in server.get("replicas") or []
                      if isinstance(copy, dict) and copy.get("base_url")]
            cfg.replica_urls = [url for url in copies if url != cfg.base_url]
            slots = server.get("slots")
            cfg.server_slots = slots if isinstance(slots, int) and slots > 0 else None
            logger.info("models.%s: %s served at %s%s", role, cfg.model, cfg.base_url,
                        f" and {len(cfg.replica_urls)} more replica(s)" if cfg.replica_urls
                        else "")
    return resolved


def resolve_endpoints(recipe: Recipe) -> Recipe:
    """Fill missing ``openai`` base URLs from a ``ready`` endpoints file; unchanged otherwise."""
    missing = [r for r, c in recipe.models.items() if c.backend == "openai" and not c.base_url]
    if not missing:
        return recipe
    path = endpoints_path(recipe)
    record = read_endpoints(path)
    if record is None or record["status"] != "ready":
        status = record["status"] if record else "missing"
        logger.debug("endpoints file %s is %s; models.%s keep no base_url", path, status, missing)
        return recipe
    return apply_endpoints(recipe, record)


def probe_endpoint(base_url: str, model: str | None, api_key: str | None = None,
                   timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``GET <base_url>/models`` fails or does not list ``model``; None when healthy."""
    url = base_url.rstrip("/") + "/models"
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        return f"{url} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{url} is unreachable ({reason})"
    try:
        served = [item["id"] for item in json.loads(body).get("data", [])]
    except (ValueError, AttributeError, KeyError, TypeError):
        return f"{url} did not answer an OpenAI model list"
    if model and served and model not in served:
        return f"{url} serves {served}, not {model!r}"
    return None
