"""The train and export stages' rows of the chain (and the ig-clarifier baseline's own
training and export, on :func:`prour.step.ig_recipe`): where each reads and writes, how "done"
is read, the roles the reward calls, the recipe keys its outputs depend on; what the trainer
installs, loads and places.

Nothing heavy is imported here: what a row needs it imports inside its functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prour.step import (
    GPU_EXTRA,
    Extra,
    File,
    Stage,
    Step,
    checkpoints,
    exported,
    ig_recipe,
    ig_sets,
    ig_trains,
    no_ig,
    of_ig,
    total_steps,
)
from prour.step import RECIPE_OPTION as _R

if TYPE_CHECKING:  # pragma: no cover
    from prour.config import Recipe


# ---- paths the steps read and write --------------------------------------------------------------


def _train_files(recipe: Recipe) -> tuple[File, ...]:
    """``train.train_file`` / ``val_file`` as the trainer reads them."""
    if recipe.train is None:
        return ()
    files = (("train.train_file", recipe.train.train_file), ("train.val_file", recipe.train.val_file))
    return tuple(File(key, Path(path)) for key, path in files if path)


def _verl(recipe: Recipe) -> bool:
    """verl's trainer with its FSDP engine, which saves ``global_step_N`` (the CPU rehearsal,
    ``train.verl.engine: cpu_rehearsal``, saves ``step_N`` folders as the local trainer does)."""
    return (recipe.train is not None and recipe.train.backend == "verl"
            and recipe.train.verl.engine != "cpu_rehearsal")


def _final_step(recipe: Recipe) -> Path:
    """The last step's folder: ``step_N`` (local) or ``global_step_N`` (verl's)."""
    from prour.train.checkpoint import step_dir

    if _verl(recipe):
        return checkpoints(recipe) / f"global_step_{total_steps(recipe)}"
    return step_dir(checkpoints(recipe), total_steps(recipe))


def _export_clears(recipe: Recipe) -> tuple[File, ...]:
    """What a rerun of export replaces: verl's merged folder; a local step_N is train's own."""
    return (File("train.output_dir", exported(recipe)),) if _verl(recipe) else ()


# ---- how "done" is read --------------------------------------------------------------------------


def _trained(recipe: Recipe) -> bool:
    """The trainer saved its last step (a complete local ``step_N``, or verl's newest step)."""
    from prour.train.checkpoint import complete_checkpoints, latest_verl_step, untrained_verl_step

    if _verl(recipe):  # or the initial policy saved as the last step (an empty train file)
        saved = [latest_verl_step(checkpoints(recipe)), untrained_verl_step(checkpoints(recipe))]
        return max(step or 0 for step in saved) >= total_steps(recipe)
    return any(step >= total_steps(recipe) for step, _ in complete_checkpoints(checkpoints(recipe)))


def _exported_done(recipe: Recipe) -> bool:
    from prour.train.checkpoint import is_hf_folder

    return is_hf_folder(exported(recipe))


# ---- roles, and what the trainer installs, loads and places --------------------------------------


def _train_modes(recipe: Recipe) -> set[str]:
    """The modes of the states in the train file that training keeps (``train.modes``): all
    of ``train.modes`` while the file does not exist yet; none when it exists but cannot be read
    (the path check names that file, the one cause: no guess at the roles it would need)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from prour.train.reward import RESPONDERS

    files = _train_files(recipe)
    wanted = set(recipe.train.modes or RESPONDERS) if recipe.train is not None else set(RESPONDERS)
    try:
        return wanted & set(pq.read_table(files[0].path, columns=["extra_info"])
                            .column("extra_info").combine_chunks().field("mode").to_pylist())
    except (IndexError, OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return set() if files and Path(files[0].path).is_file() else wanted


def _train_roles(recipe: Recipe) -> tuple[str, ...]:
    """The policy and what the reward calls on the train file's modes
    (:func:`prour.train.reward.reward_roles`: the responders, and the judge when the attention
    reward prices questions with it)."""
    from prour.train.reward import reward_roles

    return ("generator", *reward_roles(recipe, _train_modes(recipe)))


def _train_extras(recipe: Recipe) -> tuple[Extra, ...]:
    train = recipe.train
    if train is None or train.backend != "verl":
        return ()
    why = "train.backend=verl"
    fix = f"install it: {GPU_EXTRA}"
    needed = [Extra("verl", why, fix), Extra("ray", why, fix), Extra("transfer_queue", why, fix)]
    if train.verl.engine != "cpu_rehearsal":  # the rehearsal's policy samples its own rollouts
        needed.append(Extra("vllm", f"{why} rolls out with vLLM", fix))
    if train.verl.attn_implementation == "flash_attention_2":
        needed.append(Extra("flash_attn", "train.verl.attn_implementation=flash_attention_2",
                            "install it: pip install flash-attn --no-build-isolation (a source "
                            "build)"))
    return tuple(needed)


def _verl_policy(recipe: Recipe) -> tuple[tuple[str, str], ...]:
    """verl loads the policy by path or hub id whatever its backend."""
    policy = recipe.models.get("generator")
    if policy is None or recipe.train is None or recipe.train.backend != "verl" \
            or policy.backend == "hf":  # an hf role's weights are checked as such
        return ()
    return ((str(policy.path or policy.model), "models.generator"),)


def _trainer_gpus(recipe: Recipe) -> dict[str, int]:
    if recipe.train is None or recipe.train.backend != "verl":
        return {}
    if recipe.train.verl.engine == "cpu_rehearsal":  # CPU only: places nothing on GPUs
        return {}
    return {"train.verl.n_gpus_per_node": recipe.train.verl.n_gpus_per_node}


def _no_train(recipe: Recipe) -> str | None:
    return None if recipe.train is not None else "the recipe has no `train` section"


# ---- the recipe keys each step's outputs depend on (Step.keys) -----------------------------------


_TRAIN_KEYS = ("train", "-train.wandb", "-train.keep_checkpoints", "models.generator",
               "models.strict_user", "models.verifier", "models.judge", "reward",
               "-reward.responder_concurrency", "seed")


# ---- the stages ----------------------------------------------------------------------------------


TRAIN = Stage("train", "DAPO on the information-gain reward", (
    Step("train", "checkpoints every train.save_every steps, metrics.jsonl", ("train", *_R),
         reads=_train_files, writes=lambda r: (File("train.output_dir", _final_step(r)),),
         roles=_train_roles, done=_trained, keys=_TRAIN_KEYS,
         clears=lambda r: (File("train.output_dir", checkpoints(r)),), resume=("--resume",)),
    # The IG-Clarifier baseline's own DAPO run: the same recipe with its settings (one table,
    # prour.config.ig_clarifier.SETTINGS) into its own folder; only when eval.methods has it.
    Step("train-ig-clarifier", "the ig-clarifier baseline's clarifier (its own reward)",
         ("train", *_R, *ig_sets()), reads=of_ig(_train_files),
         writes=of_ig(lambda r: (File("train.output_dir", _final_step(r)),)),
         roles=of_ig(_train_roles), done=lambda r: ig_trains(r) and _trained(ig_recipe(r)),
         keys=_TRAIN_KEYS,
         clears=of_ig(lambda r: (File("train.output_dir", checkpoints(r)),)),
         resume=("--resume",), skip=no_ig),
), placement="trainer", slurm="train", extras=_train_extras, weights=_verl_policy,
    gpus=_trainer_gpus, skip=_no_train)


EXPORT = Stage("export", "the saved steps as Hugging Face folders", (
    Step("export", "the final step as a Hugging Face folder (what eval loads)",
         ("train", "export", *_R),
         reads=lambda r: (File("train.output_dir", _final_step(r)),),
         writes=lambda r: (File("train.output_dir", exported(r) / "config.json"),),
         done=_exported_done, keys=("train.output_dir", "train.total_steps",
                                    "train.backend"), clears=_export_clears),
    Step("export-ig-clarifier", "the ig-clarifier's final step (what eval's "
         "models.ig_clarifier loads)", ("train", "export", *_R, *ig_sets()),
         reads=of_ig(lambda r: (File("train.output_dir", _final_step(r)),)),
         writes=of_ig(lambda r: (File("train.output_dir", exported(r) / "config.json"),)),
         done=lambda r: ig_trains(r) and _exported_done(ig_recipe(r)),
         keys=("train.output_dir", "train.total_steps", "train.backend"),
         clears=of_ig(_export_clears), skip=no_ig),
), placement="none", slurm_command=("train", "export", *_R), skip=_no_train,
    preflight=False)
