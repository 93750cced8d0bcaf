"""The eval and report stages' rows of the chain: eval.methods on tau2, the trade-off sweeps
(Figures 5 and 8), the post-hoc decomposer pass (Figure 6) and the report; where each reads and
writes, how "done" is read, the roles each calls, the recipe keys its outputs depend on.

Nothing heavy is imported here: what a row needs it imports inside its functions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prour.router.steps import DECOMPOSER_KEYS
from prour.step import RECIPE_OPTION as _R
from prour.step import (
    TRADEOFF_NAMES,
    File,
    Stage,
    Step,
    eval_dir,
    eval_serving,
    exported,
    line_count,
    of_ig,
    tradeoff_dir,
    tradeoff_methods,
    tradeoff_sweep,
)

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe


def tradeoff_recipe(recipe: Recipe, name: str) -> Recipe:
    """The recipe a trade-off step's ``prour eval`` runs: eval.tradeoff.methods over one router
    key's values (the ``--set`` items of its command)."""
    from prour.recipes import with_settings

    items = [f"eval.methods={json.dumps(tradeoff_methods(recipe))}",
             f"eval.sweep={json.dumps(tradeoff_sweep(recipe, name))}"]
    return with_settings(recipe, items, f"the eval.tradeoff.{name} sweep")


# ---- how "done" is read --------------------------------------------------------------------------


def _evaluated(recipe: Recipe, folder: Path | None = None) -> bool:
    """A result line for every episode the eval section plans: methods (a routed one once per
    eval.sweep point) x attention variants x the tasks of each domain x seeds (``prour eval`` reruns only the missing ones)."""
    from prour.env.domains import select_tasks
    from prour.eval.harness import wanted_tasks

    cfg = recipe.eval
    tasks = sum(len(select_tasks(domain, cfg.split, None if cfg.tasks is None
                                 else wanted_tasks(cfg.tasks, domain), cfg.max_tasks,
                                 key="eval.tasks")) for domain in cfg.domains)
    from prour.eval.harness import arm_points

    arms = sum(len(arm_points(cfg, method)) for method in cfg.methods) * len(cfg.variants())
    planned = arms * tasks * len(cfg.seeds)
    return line_count((folder or eval_dir(recipe)) / "results.jsonl") >= planned


def _sweeping(name: str, fn: Callable[[Recipe], Any], absent: Any) -> Callable[[Recipe], Any]:
    """``fn`` of the trade-off step's recipe (:func:`tradeoff_recipe`); ``absent`` (the recipe
    itself when None) for a recipe that leaves the sweep out."""
    def of(recipe: Recipe) -> Any:
        if _no_tradeoff(name)(recipe) is not None:
            return recipe if absent is None else absent
        return fn(tradeoff_recipe(recipe, name))
    return of


def _swept(name: str) -> Callable[[Recipe], bool]:
    """Done: the trade-off sweep's folder holds a result line per episode it plans."""
    return lambda recipe: _no_tradeoff(name)(recipe) is None and _evaluated(
        tradeoff_recipe(recipe, name), tradeoff_dir(recipe, name))


def _no_tradeoff(name: str) -> Callable[[Recipe], str | None]:
    def why(recipe: Recipe) -> str | None:
        if not recipe.eval.tradeoff.run:
            return "eval.tradeoff.run is false"
        if not tradeoff_methods(recipe):
            return "eval.methods holds none of eval.tradeoff.methods"
        return None if getattr(recipe.eval.tradeoff, name) else \
            f"eval.tradeoff.{name} lists no value"
    return why


def _posthoc_file(recipe: Recipe) -> File:
    from prour.eval.posthoc import POSTHOC_FILE

    return File("eval (run_dir/eval)", eval_dir(recipe) / POSTHOC_FILE)


def _posthoc_done(recipe: Recipe) -> bool:
    """Every decision the post-hoc pass measures has its line (eval's episodes read)."""
    from prour.eval.posthoc import posthoc_pending

    return _posthoc_file(recipe).path.is_file() and posthoc_pending(eval_dir(recipe)) == 0


def _no_posthoc(recipe: Recipe) -> str | None:
    from prour.eval.posthoc import needs_posthoc

    methods = recipe.eval.methods
    if all(needs_posthoc(method) for method in methods):  # Figure 6 sets them beside Prour's
        return "eval.methods holds no method that routes with the decomposer"
    if not any(needs_posthoc(method) for method in methods):
        return "every method of eval.methods records its own AU/EU"
    return None if "decomposer" in recipe.models else "the recipe has no models.decomposer"


# ---- reads, roles --------------------------------------------------------------------------------


def _tradeoff_results(recipe: Recipe) -> tuple[File, ...]:
    """The result files of the trade-off sweeps this recipe runs (what the report also reads)."""
    return tuple(File(f"eval.tradeoff.{name}", tradeoff_dir(recipe, name) / "results.jsonl")
                 for name in TRADEOFF_NAMES if _no_tradeoff(name)(recipe) is None)


def _report_reads(recipe: Recipe) -> tuple[File, ...]:
    """The main eval's results, the sweeps', the post-hoc pass's and the taxonomy's labels:
    what the report draws (the labels are read only once approved: not required)."""
    from prour.data.steps import no_taxonomy, taxonomy_labels

    posthoc = (_posthoc_file(recipe),) if _no_posthoc(recipe) is None else ()
    labels = tuple(replace(f, checked=False) for f in taxonomy_labels(recipe)) \
        if no_taxonomy(recipe) is None else ()
    return (File("eval (run_dir/eval)", eval_dir(recipe) / "results.jsonl"),
            *_tradeoff_results(recipe), *posthoc, *labels)


def _reported(recipe: Recipe) -> bool:
    """The report folder is there, drawn from the taxonomy's labels as they are now (a review
    or an approval after it makes it due again)."""
    from prour.data.taxonomy_labels import report_current
    from prour.eval.paper import FILES, PAPER_DIR

    report = eval_dir(recipe) / "report"
    sidecar = (report / PAPER_DIR / FILES["figure2"]).with_suffix(".json")
    return report.exists() and report_current(recipe, sidecar)


def _eval_roles(recipe: Recipe) -> tuple[str, ...]:
    """What the methods call under each attention variant (:func:`prour.eval.methods.eval_roles`:
    the judge when the attention protocol labels or scores with it)."""
    from prour.eval.methods import eval_roles

    return eval_roles(recipe.eval)


def _eval_routes(recipe: Recipe) -> bool:
    from prour.eval.methods import check_method

    return any(check_method(m).router == "decomposer" for m in recipe.eval.methods)


# ---- the recipe keys each step's outputs depend on (Step.keys) -----------------------------------


_EVAL_BASE = ("eval", "-eval.concurrency", "models", "env", "router", "-router.calibration",
              "-router.thresholds_file", "reward", "-reward.responder_concurrency", "seed")
_EVAL_KEYS = (*_EVAL_BASE, "-eval.tradeoff")  # the sweeps are steps of their own


# ---- the stages ----------------------------------------------------------------------------------


EVAL = Stage("eval", "every method of eval.methods on tau2, with the final checkpoint", (
    Step("eval", "one result line per episode", ("eval", *_R, "--checkpoint", "{checkpoints}",
                                                 "--set", "{ig_clarifier}"),
         reads=lambda r: (File("--checkpoint", exported(r) / "config.json", checked=False),
                          *of_ig(lambda i: (File("models.ig_clarifier.path",
                                                 exported(i) / "config.json",
                                                 checked=False),))(r)),
         writes=lambda r: (File("eval (run_dir/eval)", eval_dir(r) / "results.jsonl"),),
         roles=_eval_roles, done=_evaluated, keys=_EVAL_KEYS, serving=eval_serving),
    # Figures 5 and 8 (A.2.3): eval.tradeoff.methods once per value of one router key, each
    # sweep into a run folder of its own under run_dir.
    *(Step(f"eval-{name.replace('_', '-')}", f"{figure}: eval.tradeoff.methods once per "
           f"value of router.{name} (eval.tradeoff.{name})",
           ("eval", *_R, "--checkpoint", "{checkpoints}", "--out", f"{{{name}_dir}}",
            "--set", "eval.methods={tradeoff_methods}", "--set", f"eval.sweep={{{name}_sweep}}"),
           reads=lambda r: (File("--checkpoint", exported(r) / "config.json", checked=False),),
           writes=lambda r, n=name: (File(f"eval.tradeoff.{n}",
                                          tradeoff_dir(r, n) / "results.jsonl"),),
           roles=_sweeping(name, lambda r: _eval_roles(r), ()), done=_swept(name),
           keys=(*_EVAL_BASE, "-eval.methods", "-eval.sweep", "-eval.tradeoff.run",
                 f"-eval.tradeoff.{other}"),
           serving=_sweeping(name, eval_serving, None),
           skip=_no_tradeoff(name))
      for name, other, figure in (("budget", "every_n", "Figure 5"),
                                  ("every_n", "budget", "Figure 8"))),
    # Figure 6's baselines: the decomposer over the episodes of the methods that record no
    # AU/EU of their own (served like every step that calls the decomposer).
    Step("posthoc", "Figure 6's baselines: the decomposer's AU/EU at their first 16 decisions",
         ("posthoc", "{eval_dir}", *_R),
         reads=lambda r: (File("eval (run_dir/eval)", eval_dir(r) / "results.jsonl"),),
         writes=lambda r: (_posthoc_file(r),),
         roles=lambda r: ("decomposer",) if _no_posthoc(r) is None else (),
         done=_posthoc_done, keys=DECOMPOSER_KEYS, skip=_no_posthoc),
), placement="in_process", slurm="eval", routes=_eval_routes,
   sized_from=lambda r: eval_dir(r) / "results.jsonl")


REPORT = Stage("report", "Pass@1 tables with intervals, steps by mode, plots", (
    Step("report", "the report of the eval run", ("report", "{eval_dir}"),
         reads=_report_reads,
         writes=lambda r: (File("eval (run_dir/eval/report)", eval_dir(r) / "report"),),
         done=_reported, keys=("eval.methods", "eval.seeds", "eval.domains", "eval.sweep",
                               "eval.tradeoff", "protocol")),
), placement="none", slurm_command=("report", "{eval_dir}"), preflight=False)
