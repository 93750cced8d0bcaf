"""The evaluation harness: methods × attention variants × domains × tasks × seeds on tau2.

A run folder holds:

- ``episodes.jsonl``: one trajectory per episode, appended as it finishes (the resume log);
- ``results.jsonl``: one result line per episode (reward, termination — ``max_steps`` marks an
  episode cut at ``env.max_steps`` —, tau2 steps, turn split, the turn tag of every agent turn
  (question / confirmation / verification / act), model calls by role, seconds, decisions,
  the router's budget, frequency and calls, the query generator when it is not the recipe's
  default, attention costs), derived from the trajectory and the judge;
- ``provenance.json`` and ``recipe.resolved.yaml``: recipe, commit, versions, endpoints, seeds;
- ``run.json``: the settings that make results comparable; a rerun with other settings is refused;
- ``tau2_results/<domain>__<agent>.json``: the episodes in tau2's results format (what ``tau2
  run`` writes; ``tau2 view --dir`` opens it), rewritten whole at the end of each run.

A rerun after a crash or a kill runs only the episodes missing from ``episodes.jsonl`` (their
key is (domain, task, seed, method[/variant][ [step N]])), plus those that ended in an error unless
``eval.retry_errors`` is false, and writes result lines for episodes that have none, so the
finished folder equals that of an uninterrupted run. :func:`check_errors` fails an evaluation
where more than ``eval.max_error_fraction`` of the episodes errored.

A checkpoint sweep (:func:`evaluate_checkpoints`) evaluates several saved steps of one training
run into one folder: each result line records its checkpoint (training run name, step, folder).

Every episode of a run (all arms, and all checkpoints of a sweep) goes through one queue
(:mod:`prour.eval.queue`), which holds each model at its own in-flight limit and takes the arms
in turn; ``queue.jsonl`` records each session's rate and achieved concurrency.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prour.build import Builder
from prour.config import ModelConfig, Recipe
from prour.env import runner as episode_runner
from prour.env.trajectory import Trajectory
from prour.eval.arms import Arm, GeneratorCheckpoint, with_checkpoint
from prour.eval.kit import MethodKit, attention_caches
from prour.eval.methods import check_method, question_writer
from prour.eval.results import record_lines
from prour.eval.run_record import check_run_dir, run_settings, same_model, write_run_provenance

logger = logging.getLogger(__name__)

EPISODES_FILE = "episodes.jsonl"
RESULTS_FILE = "results.jsonl"


def uses_router(method: str) -> bool:
    """Whether a method routes with a router whose budget and frequency a sweep varies."""
    return check_method(method).router is not None


def arm_points(cfg: Any, method: str) -> list[tuple[tuple[str, int | None], ...] | None]:
    """The ``eval.sweep`` points a method runs under: every point for a routed method, else
    one run without a point (its result does not depend on the router)."""
    if not cfg.sweep or not uses_router(method):
        return [None]
    return [tuple(point.items()) for point in cfg.sweep_points()]


def uses_generator(method: str) -> bool:
    """Whether a method calls the query generator (its result depends on the checkpoint)."""
    return "generator" in check_method(method).roles


def evaluate_checkpoints(recipe: Recipe, run_dir: str | Path,
                         generators: list[GeneratorCheckpoint], progress: bool = True,
                         announce: Any = None,
                         default_generator: ModelConfig | None = None) -> list[dict[str, Any]]:
    """Evaluate every checkpoint into one run folder (resumable like any run), all through one
    queue (:func:`run_evaluations`): the methods that use the generator once per checkpoint,
    the others once (with the first). ``announce(g)`` is called for each checkpoint before the
    queue starts; ``default_generator`` as for :class:`Evaluation`."""
    steps = [g.step for g in generators]
    evaluations = []
    try:
        for i, generator in enumerate(generators):
            methods = [m for m in recipe.eval.methods if i == 0 or uses_generator(m)]
            if not methods:
                break
            if announce is not None:
                announce(generator)
            step_recipe = with_checkpoint(recipe, generator.path)
            step_recipe = step_recipe.model_copy(
                update={"eval": step_recipe.eval.model_copy(update={"methods": methods})})
            evaluations.append(Evaluation(step_recipe, run_dir, progress,
                                          default_generator=default_generator,
                                          checkpoint=generator, sweep_steps=steps))
        return run_evaluations(evaluations, progress)
    finally:
        for evaluation in evaluations:
            evaluation.close()


def run_evaluations(evaluations: list[Evaluation], progress: bool = True) -> list[dict[str, Any]]:
    """Run several evaluations of one run folder (a checkpoint sweep's steps) through one queue
    (:mod:`prour.eval.queue`): their episodes interleave under each model's in-flight limit;
    then each writes the result lines of its episodes. Returns them in job order."""
    from prour.eval.queue import run_queue

    if not evaluations:
        return []
    first = evaluations[0]
    batches = [evaluation.prepare() for evaluation in evaluations]
    limits: dict[str, int] = {}
    for evaluation in evaluations:
        for lane, limit in evaluation.limits().items():
            limits[lane] = min(limit, limits.get(lane, limit))
    items = [item for batch in batches for item in batch]
    logger.info("evaluation: %d episode(s) in one queue in %s", len(items), first.run_dir)
    trajectories = run_queue(items, limits, first.cfg.concurrency,
                             first.run_dir / EPISODES_FILE, progress, env=first.recipe.env,
                             retry_errors=first.cfg.retry_errors)
    results, at = [], 0
    for evaluation, batch in zip(evaluations, batches):
        part = trajectories[at:at + len(batch)]
        at += len(batch)
        results += evaluation.record_results([evaluation.arm_of[i.group] for i in batch], part)
    first.export_tau2()
    return results


class Evaluation:
    """Runs and resumes one evaluation; :meth:`run` returns the result lines in job order."""

    def __init__(self, recipe: Recipe, run_dir: str | Path, progress: bool = True,
                 builder: Builder | None = None, default_generator: ModelConfig | None = None,
                 checkpoint: GeneratorCheckpoint | None = None,
                 sweep_steps: list[int | None] | None = None):
        """``default_generator``: the recipe file's own ``models.generator`` (before ``--set``
        and ``--checkpoint``); result lines name the generator where the run's differs. None:
        the run's generator is the default. ``checkpoint``: the training checkpoint that
        ``models.generator`` loads (its result lines name its run and step); ``sweep_steps``:
        all steps of the sweep it belongs to (provenance)."""
        self.recipe, self.cfg = recipe, recipe.eval
        self.generator = recipe.models.get("generator")
        self.default_generator = default_generator or self.generator
        self.run_dir = Path(run_dir)
        self.progress = progress
        attention = self.cfg.attention
        cache_root = Path(attention.cache_dir) if attention is not None and attention.cache_dir \
            else self.run_dir / "attention"
        self.kit = MethodKit(builder or Builder(recipe), attention_caches(cache_root))
        self.checkpoint, self.sweep_steps = checkpoint, sweep_steps
        self.arms = [Arm(m, a, checkpoint if uses_generator(m) else None, point, label)
                     for m in self.cfg.methods
                     for a, label in zip(self.cfg.variants(), self.cfg.variant_labels())
                     for point in arm_points(self.cfg, m)]
        self.arm_of = {arm.key: arm for arm in self.arms}

    # -- setup --

    def settings(self) -> dict[str, Any]:
        """What must match for two runs' results to sit in one folder."""
        return run_settings(self.recipe, self.kit.rollout, self.checkpoint)

    def check_run_dir(self) -> None:
        """Refuse to mix results of different settings in one folder (names the keys)."""
        check_run_dir(self.run_dir, self.settings())

    def write_provenance(self) -> None:
        write_run_provenance(self.run_dir, self.recipe, [arm.key for arm in self.arms],
                             {d: len(self.tasks(d)) for d in self.cfg.domains},
                             self.generator_swap(), self.checkpoint, self.sweep_steps)

    def tasks(self, domain: str) -> list[Any]:
        from prour.env.domains import select_tasks

        ids = wanted_tasks(self.cfg.tasks, domain) if self.cfg.tasks is not None else None
        return select_tasks(domain, self.cfg.split, ids, self.cfg.max_tasks, key="eval.tasks")

    def jobs(self) -> list[tuple[Arm, Any]]:
        """(arm, EpisodeJob) pairs, arm-major then domain, task and seed; each episode's agent
        and user seed their unseeded requests from the job's seed (its key), never from the
        order the queue runs them in."""
        from prour.env.runner import EpisodeJob

        out = []
        for arm in self.arms:
            for domain in self.cfg.domains:
                router = arm.router(self.recipe.router)
                factories = {seed: (self.kit.agent_factory(arm.method, domain, arm.attention,
                                                           router, seed=seed),
                                    self.kit.user_factory(arm.method, seed=seed))
                             for seed in self.cfg.seeds}
                for task in self.tasks(domain):
                    for seed in self.cfg.seeds:
                        make_agent, make_user = factories[seed]
                        out.append((arm, EpisodeJob(domain, task, arm.key, make_agent, make_user,
                                                    seed, self.cfg.split)))
        return out

    def lanes(self, arm: Arm) -> tuple[str, ...]:
        """The models (queue lanes, :func:`prour.llm.registry.lane_name`) the arm's episodes call."""
        from prour.eval.methods import method_roles
        from prour.eval.queue import role_lanes

        return role_lanes(self.recipe, method_roles(self.cfg, arm.method, arm.attention))

    def limits(self) -> dict[str, int]:
        """Lane -> in-flight limit of every model this evaluation calls."""
        from prour.eval.methods import eval_roles
        from prour.eval.queue import lane_limits

        return lane_limits(self.recipe, eval_roles(self.cfg))

    # -- running --

    def prepare(self) -> list[Any]:
        """Check the arms and the run folder, write provenance; the queue items of every
        episode (:class:`prour.eval.queue.QueuedEpisode`), in job order."""
        from prour.eval.queue import QueuedEpisode, check_limits

        check_limits(self.recipe)
        for arm in self.arms:
            self.kit.check(arm.method, arm.attention)
        self.check_run_dir()
        self.write_provenance()
        lanes = {arm.key: self.lanes(arm) for arm in self.arms}
        return [QueuedEpisode(job, arm.key, lanes[arm.key]) for arm, job in self.jobs()]

    def run(self) -> list[dict[str, Any]]:
        """Run what is missing through one queue, write result lines for new episodes, return
        all results."""
        return run_evaluations([self], self.progress)

    def export_tau2(self) -> list[Path]:
        """Every episode of the folder in tau2's results format (``tau2_results/``, one file per
        domain and agent name), for ``tau2 view`` and ``prour import tau2``."""
        from prour.env.tau2_export import export_run

        env = self.recipe.env
        return export_run(self.run_dir, self.run_dir / EPISODES_FILE, max_steps=env.max_steps,
                          max_errors=env.max_errors)

    def record_results(self, arms: list[Arm], trajectories: list[Trajectory]) -> list[dict[str, Any]]:
        """Result lines for episodes without one (or whose episode was rerun); all in order."""
        path = self.run_dir / RESULTS_FILE
        stored = load_result_lines(path) if path.exists() else {}
        return record_lines(path, arms, trajectories,
                            [stored.get(result_key(traj.key)) for traj in trajectories],
                            self._judge(), self.generator_of, self.writer_of)

    def generator_swap(self) -> str | None:
        """The generator's name when it is not the recipe's default (a ``--set
        models.generator…`` or ``--checkpoint`` swap), else None; a checkpoint is named by its
        training run and step (``run step N``), never by its folder."""
        if self.checkpoint is not None:
            return self.checkpoint.label
        if self.generator is None or same_model(self.generator, self.default_generator):
            return None
        return model_name(self.generator)

    def writer_of(self, arm: Arm) -> str | None:
        """The model that wrote the arm's questions (:func:`prour.eval.methods.question_writer`;
        a checkpoint arm's is its step's folder)."""
        if arm.checkpoint is not None and check_method(arm.method).writer == "generator":
            return str(Path(arm.checkpoint.path).resolve())
        return question_writer(arm.method, self.recipe.models)

    def generator_of(self, arm: Arm) -> str | None:
        """The swapped generator's name for a method that writes queries with it."""
        return self.generator_swap() if uses_generator(arm.method) else None

    def _judge(self) -> Any:
        if not self.cfg.judge or self.cfg.attention is None:
            return None
        return self.kit.builder.judge(self.kit.builder.judge_attempts(), self.kit.caches["judge"])

    def close(self) -> None:
        self.kit.close()


TooManyErrors = episode_runner.TooManyErrors  # what check_errors raises (collect shares it)


def check_errors(results: list[dict[str, Any]], max_fraction: float) -> None:
    """Raise :class:`TooManyErrors` when more than ``max_fraction`` of the episodes errored; the
    message names the share, the most common error and how a rerun retries them."""
    errors = [line.get("errors") or [] if line["error"] else None for line in results]
    episode_runner.check_error_share(
        errors, max_fraction, "eval.max_error_fraction",
        "it runs the errored episodes again (eval.retry_errors=true)")


def model_name(cfg: ModelConfig) -> str:
    """A short name of a model for report labels: served name, folder name, or script."""
    return cfg.model or (Path(cfg.path).name if cfg.path else None) or cfg.script or cfg.backend


def wanted_tasks(entries: list[str], domain: str) -> set[str]:
    """Task ids of ``domain`` named by ``eval.tasks``: ``"domain:id"`` or a bare id (any domain)."""
    out = set()
    for entry in entries:
        scope, sep, task_id = entry.rpartition(":")
        if not sep or scope == domain:
            out.add(task_id)
    return out


# ---- result lines -------------------------------------------------------------------------


def result_key(key: tuple[str, str, int, str] | list[Any]) -> str:
    domain, task_id, seed, agent = key
    return f"{domain}|{task_id}|{seed}|{agent}"


class ResultLines(dict):
    """Result lines by key; ``skipped`` names each line left out (``file:line: why``)."""

    def __init__(self, lines: dict[str, dict[str, Any]] | None = None,
                 skipped: list[str] | None = None):
        super().__init__(lines or {})
        self.skipped: list[str] = list(skipped or [])
        self.line_numbers: dict[str, int] = {}  # key -> the file line its kept record is on


def load_result_lines(path: str | Path) -> ResultLines:
    """Result lines by key (a later line replaces an earlier one); a corrupt line, or one
    without a ``key`` of four items, is skipped with a warning naming file and line and listed
    in ``.skipped`` (a report says how many)."""
    from prour.env.trajectory import read_numbered

    numbered = read_numbered(path, "skip")
    out = ResultLines(skipped=[f"{path}:{n}: corrupt (not a JSON object)"
                               for n in numbered.skipped])
    for number, row in numbered:
        key = row.get("key")
        if not isinstance(key, list) or len(key) != 4 or isinstance(key[2], bool) \
                or not all(isinstance(k, (str, int)) for k in key):
            out.skipped.append(f"{path}:{number}: `key` is {key!r}, not [domain, task id, "
                               "seed, agent]")
            logger.warning("skipping result line %s", out.skipped[-1])
            continue
        out[result_key(key)] = row
        out.line_numbers[result_key(key)] = number
    return out
