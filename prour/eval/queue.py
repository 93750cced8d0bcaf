"""One queue for a whole evaluation run: every episode of every arm (method, attention variant,
sweep point, checkpoint) × domain × task × seed goes through one scheduler.

Each model an episode calls is a *lane* (a served model at its URL, an in-process ``hf`` model,
a scripted one). A lane has an in-flight limit: the number of its requests that may be in
flight at the same time, held by a gate (:class:`RequestGates`) around every call an episode
makes (:class:`prour.eval.agent.CountingLLM`), whichever episode or method makes it. The limit
of a served model is its servers' sequence slots (every replica's ``max_num_seqs``, as the
endpoints file records them: sized per step where the recipe does not pin them), its client's
``models.<role>.max_concurrency`` and ``eval.max_in_flight`` (keyed by role or model id),
whichever is lowest; an in-process or scripted model has only the last.
``eval.concurrency`` is the number of episodes at once, all lanes together (the worker
threads): an episode spends its time on several models, its tools and its own code, so a lane
stays full only when more episodes than its limit may call it.

The scheduler takes the arms in turn (round robin), so the methods interleave from the start.
Every finished episode is appended to ``episodes.jsonl`` at once (the resume log), whatever its
place in the queue; its seed is its key's seed, so the order does not change an outcome.

Each session appends one line to ``queue.jsonl`` in the run folder (also when interrupted): its
wall time, the episodes it finished, their rate per minute, the mean number of episodes in flight
(overall and per lane), per lane the mean number of requests in flight, the share of the time it
sat at its limit and how many calls waited for a slot, and the limits; and per served model's
client (by role) what its requests cost: attempts, failed ones by kind and their share, retries
and requests given up (``requests``, :mod:`prour.llm.retry`). ``prour.estimate`` reads it as the
achieved concurrency.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from prour.files import append_jsonl
from prour.llm.registry import client_concurrency, lane_name

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import EnvConfig, ModelConfig, Recipe
    from prour.env.runner import EpisodeJob
    from prour.env.trajectory import Trajectory

logger = logging.getLogger(__name__)

QUEUE_FILE = "queue.jsonl"
LIMIT_KEY = "eval.max_in_flight"


@dataclass(frozen=True)
class QueuedEpisode:
    """One episode in the queue: its job, the arm it belongs to (``group``: progress and turn
    taking) and the lanes (models) it calls (counted per lane in ``queue.jsonl``)."""

    job: EpisodeJob
    group: str
    lanes: tuple[str, ...]


def check_limits(recipe: Recipe) -> None:
    """ValueError naming ``eval.max_in_flight.<key>`` when a key names no role of ``models`` and
    no model id (``models.<role>.model``, ``serve.models``)."""
    roles = sorted(recipe.models)
    ids = sorted({str(c.model) for c in recipe.models.values() if c.model}
                 | set(recipe.serve.models))
    for key in recipe.eval.max_in_flight:
        if key not in roles and key not in ids:
            raise ValueError(f"{LIMIT_KEY}.{key}: names no model role ({', '.join(roles)}) and "
                             f"no served model id ({', '.join(ids) or 'none'})")


def lane_limits(recipe: Recipe, roles: Iterable[str]) -> dict[str, int]:
    """Lane -> in-flight limit for the models of ``roles``: the lowest of ``eval.concurrency``,
    for a served model its client's ``max_concurrency`` and its server's ``max_num_seqs``, and
    the ``eval.max_in_flight`` entries that name the role or its model id."""
    check_limits(recipe)
    given = recipe.eval.max_in_flight
    out: dict[str, int] = {}
    for role in roles:
        cfg = recipe.models.get(role)
        if cfg is None:
            continue
        caps = [recipe.eval.concurrency]
        if role in given:
            caps.append(given[role])
        if cfg.model and str(cfg.model) in given:
            caps.append(given[str(cfg.model)])
        if cfg.backend == "openai":  # the client's own cap on requests in flight, the server's
            caps.append(client_concurrency(cfg))
            caps += server_caps(recipe, cfg)
        lane = lane_name(cfg)
        out[lane] = min([out.get(lane, recipe.eval.concurrency), *caps])
    return out


def server_caps(recipe: Recipe, cfg: ModelConfig) -> list[int]:
    """The requests a served model's copies run at once, when known: from the endpoints file
    (``server_slots``: every copy's ``max_num_seqs`` summed), else ``serve.models.<id>``'s
    ``max_num_seqs`` times its ``replicas`` (a number)."""
    if cfg.server_slots is not None:
        return [cfg.server_slots]
    spec = recipe.serve.models.get(str(cfg.model))
    if spec is None or spec.max_num_seqs is None:
        return []
    return [spec.max_num_seqs * (spec.replicas if isinstance(spec.replicas, int) else 1)]


def role_lanes(recipe: Recipe, roles: Iterable[str]) -> tuple[str, ...]:
    """The lanes (:func:`prour.llm.registry.lane_name`) of the models of ``roles``, in role order;
    a role without a model has none."""
    return tuple(dict.fromkeys(lane_name(recipe.models[role]) for role in roles
                               if role in recipe.models))


def keyed_seed(episode_seed: int, role: str, call: int, item: int) -> int:
    """The sampling seed of a request that brought none: a function of the episode's seed (its
    key's), the role, the role's call index in the episode and the request's place in the call,
    never of what else runs at the time (56 bits, valid for vLLM and the hf backend)."""
    digest = hashlib.sha256(f"{episode_seed}|{role}|{call}|{item}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


_active: ContextVar[RequestGates | None] = ContextVar("prour_request_gates", default=None)


class RequestGates:
    """Requests in flight per lane, each lane held at its limit: a call waits until its lane
    has room. Records the time integral of the requests in flight, the time at the limit and
    the calls that waited (the record of :func:`run_queue`'s session)."""

    def __init__(self, limits: Mapping[str, int]):
        self.limits = dict(limits)
        self._room = threading.Condition()
        self.busy: Counter[str] = Counter()
        self.area: Counter[str] = Counter()
        self.full: Counter[str] = Counter()  # seconds at the limit
        self.calls: Counter[str] = Counter()
        self.waited: Counter[str] = Counter()
        self.started = self.last = time.monotonic()

    def _tick(self) -> None:
        now = time.monotonic()
        dt_s = now - self.last
        for lane, n in self.busy.items():
            self.area[lane] += n * dt_s
            if n >= self.limits[lane]:
                self.full[lane] += dt_s
        self.last = now

    @contextlib.contextmanager
    def hold(self, lane: str, n: int = 1) -> Iterator[None]:
        """``n`` requests of ``lane`` in flight for the block (a batch over the limit takes the
        whole lane); a lane without a limit is not held. After SIGINT/SIGTERM a waiting call
        does not start (:class:`prour.interrupt.Stopping`)."""
        from prour import interrupt

        limit = self.limits.get(lane)
        if limit is None or n < 1:
            yield
            return
        n = min(n, limit)
        with self._room:
            self.calls[lane] += 1
            if self.busy[lane] + n > limit:
                self.waited[lane] += 1
            while self.busy[lane] + n > limit:
                self._room.wait(timeout=0.5)
                interrupt.check()
            self._tick()
            self.busy[lane] += n
        try:
            yield
        finally:
            with self._room:
                self._tick()
                self.busy[lane] -= n
                self._room.notify_all()

    def record(self) -> dict[str, dict[str, Any]]:
        """Per lane: mean requests in flight, share of the time at the limit, calls, waits."""
        with self._room:
            self._tick()
            wall = max(self.last - self.started, 1e-9)
            return {lane: {"mean_requests": round(self.area[lane] / wall, 3),
                           "at_limit": round(self.full[lane] / wall, 3),
                           "calls": self.calls[lane], "waited": self.waited[lane]}
                    for lane in sorted(self.limits)}


@contextlib.contextmanager
def request_slot(lane: str | None, n: int = 1) -> Iterator[None]:
    """Hold ``n`` requests of ``lane`` in the running queue's gates (:class:`RequestGates`);
    outside a queue, or for a model without a lane, nothing is held."""
    gates = _active.get()
    if gates is None or lane is None:
        yield
        return
    with gates.hold(lane, n):
        yield


class _Lanes:
    """Episodes in flight, overall and per lane, with their time integral (the achieved
    concurrency)."""

    def __init__(self, limits: Mapping[str, int], concurrency: int):
        self.limits, self.concurrency = dict(limits), concurrency
        self.busy: Counter[str] = Counter()
        self.running = 0
        self.area: Counter[str] = Counter()
        self.total_area = 0.0
        self.started = self.last = time.monotonic()

    def _tick(self) -> None:
        now = time.monotonic()
        dt_s = now - self.last
        self.total_area += self.running * dt_s
        for lane, n in self.busy.items():
            self.area[lane] += n * dt_s
        self.last = now

    def fits(self) -> bool:
        """Whether another episode may start (its lanes' limits hold its requests, not it)."""
        return self.running < self.concurrency

    def take(self, lanes: Sequence[str]) -> None:
        self._tick()
        self.running += 1
        for lane in lanes:
            self.busy[lane] += 1

    def give(self, lanes: Sequence[str]) -> None:
        self._tick()
        self.running -= 1
        for lane in lanes:
            self.busy[lane] -= 1

    def record(self, gates: RequestGates | None = None) -> dict[str, Any]:
        self._tick()
        wall = max(self.last - self.started, 1e-9)
        requests = gates.record() if gates is not None else {}
        return {"wall_s": round(wall, 3), "mean_in_flight": round(self.total_area / wall, 3),
                "lanes": {lane: {"limit": limit, "mean_in_flight": round(self.area[lane] / wall, 3),
                                 **requests.get(lane, {})}
                          for lane, limit in sorted(self.limits.items())}}


class _Turns:
    """The not yet started episodes by group; :meth:`next` takes groups in turn."""

    def __init__(self, items: Iterable[QueuedEpisode]):
        self.groups: dict[str, deque[QueuedEpisode]] = {}
        for item in items:
            self.groups.setdefault(item.group, deque()).append(item)
        self.order = list(self.groups)
        self.at = 0

    def __bool__(self) -> bool:
        return any(self.groups.values())

    def next(self, lanes: _Lanes) -> QueuedEpisode | None:
        """The head episode of the next group (after the last one served) that fits."""
        for shift in range(len(self.order)):
            index = (self.at + shift) % len(self.order)
            queue = self.groups[self.order[index]]
            if queue and lanes.fits():
                self.at = index + 1
                return queue.popleft()
        return None


class QueueProgress:
    """One bar for the whole queue: done/total, episodes per minute, and per group its finished
    count and error share; with ``enabled`` false, nothing."""

    def __init__(self, totals: Mapping[str, int], enabled: bool):
        self.totals = dict(totals)
        self.total = sum(self.totals.values())
        self.enabled = enabled and self.total > 0
        self.done: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.started = time.monotonic()

    def __enter__(self) -> Self:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[groups]}"),
                                 transient=False)
            self._bar.start()
            self._task = self._bar.add_task("", total=self.total, groups=self.groups_text())
        return self

    def rate(self) -> float:
        """Episodes per minute since the queue started."""
        minutes = (time.monotonic() - self.started) / 60
        return sum(self.done.values()) / minutes if minutes > 0 else 0.0

    def groups_text(self) -> str:
        parts = []
        for group, total in self.totals.items():
            done, errors = self.done[group], self.errors[group]
            share = f" err {errors / done:.0%}" if done else ""
            parts.append(f"{group} {done}/{total}{share}")
        return " | ".join(parts)

    def advance(self, group: str, trajectory: Trajectory) -> None:
        self.done[group] += 1
        self.errors[group] += int(trajectory.termination == "error")
        if self.enabled:
            self._bar.update(self._task, advance=1, groups=self.groups_text(),
                             description=f"queue {self.rate():.1f}/min")

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._bar.stop()


def run_queue(items: Sequence[QueuedEpisode], limits: Mapping[str, int], concurrency: int,
              out_path: str | Path, progress: bool = True, *, env: EnvConfig,
              retry_errors: bool) -> list[Trajectory]:
    """Run the episodes not yet stored in ``out_path`` (``retry_errors``: errored ones again)
    through one scheduler, ``concurrency`` at once, appending each as it finishes; returns every
    item's trajectory in item order. ``limits``: lane -> limit of its requests in flight (a lane
    not named: not held)."""
    from prour.env.runner import run_job, stored_episodes
    from prour.llm import retry

    if concurrency < 1:
        raise ValueError(f"eval.concurrency must be >= 1, got {concurrency}")
    for lane, limit in limits.items():
        if limit < 1:
            raise ValueError(f"{LIMIT_KEY}: the limit of {lane} is {limit}, not >= 1")
    path = Path(out_path)
    results = stored_episodes(path, retry_errors)
    todo = list({item.job.key: item for item in items if item.job.key not in results}.values())
    logger.info("queue: %d episode(s) to run, %d already stored", len(todo),
                len(items) - len(todo))
    turns, lanes, gates = _Turns(todo), _Lanes(limits, concurrency), RequestGates(limits)
    totals = Counter(item.group for item in todo)
    finished = Counter()
    running: dict[Future[Trajectory], QueuedEpisode] = {}
    began = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    saving = threading.Lock()
    requests_before = retry.snapshot()

    def work(item: QueuedEpisode) -> Trajectory:
        # saved by the worker: a signal (handled in the main thread) never falls between the
        # append and its count, and an episode that ends while the queue stops is kept
        token = _active.set(gates)  # this worker's calls hold their lanes' request slots
        try:
            traj = run_job(item.job, env)
        finally:
            _active.reset(token)
        with saving:
            append_jsonl(path, traj)
            finished[item.group] += 1
        return traj

    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool, \
                QueueProgress(totals, progress) as bar:
            while turns or running:
                while (item := turns.next(lanes)) is not None:
                    lanes.take(item.lanes)
                    running[pool.submit(work, item)] = item
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    item = running.pop(future)
                    lanes.give(item.lanes)
                    traj = future.result()
                    results[traj.key] = traj
                    bar.advance(item.group, traj)
    finally:  # a signal: nothing new starts; running episodes end at their next request
        if todo:
            with saving:
                _record_session(path.parent / QUEUE_FILE, began, lanes.record(gates),
                                Counter(finished), concurrency, len(todo),
                                {label: counts.record() for label, counts
                                 in retry.since(requests_before).items()})
    return [results[item.job.key] for item in items]


def _record_session(path: Path, began: str, lanes: dict[str, Any], finished: Counter[str],
                    concurrency: int, queued: int,
                    requests: dict[str, dict[str, Any]] | None = None) -> None:
    record = {"started_at": began, **lanes, "concurrency": concurrency,
              "queued": queued, "episodes": sum(finished.values()),
              "by_group": dict(sorted(finished.items())), "requests": requests or {}}
    minutes = record["wall_s"] / 60
    record["episodes_per_min"] = round(record["episodes"] / minutes, 3) if minutes else None
    try:
        append_jsonl(path, record)
    except OSError as exc:  # the rate is a by-product: never the reason a run fails
        logger.warning("could not record the queue's rate in %s: %s", path, exc)


def read_sessions(run_dir: str | Path) -> list[dict[str, Any]]:
    """The queue sessions recorded in ``run_dir/queue.jsonl`` (none: ``[]``)."""
    from prour.env.trajectory import read_jsonl

    path = Path(run_dir) / QUEUE_FILE
    if not path.is_file():
        return []
    return [row for row in read_jsonl(path, on_error="skip")
            if isinstance(row.get("wall_s"), (int, float)) and row.get("episodes")]


def achieved(sessions: Sequence[Mapping[str, Any]]) -> tuple[float, float, int] | None:
    """(mean episodes in flight, episodes per minute, episodes) over recorded sessions,
    weighted by their wall time; None without a session that finished an episode."""
    wall = sum(float(s["wall_s"]) for s in sessions)
    if not sessions or wall <= 0:
        return None
    mean = sum(float(s["mean_in_flight"]) * float(s["wall_s"]) for s in sessions) / wall
    episodes = sum(int(s["episodes"]) for s in sessions)
    return mean, episodes / (wall / 60), episodes
