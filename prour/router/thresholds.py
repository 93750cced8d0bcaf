"""Calibrated thresholds stored per decomposer model, with provenance (paper A.2.2: AU/EU scales
are model-specific, so a pair fitted for one model must never be used for another)."""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prour.config import ModelConfig, Recipe
from prour.config.router import RouterConfig
from prour.files import file_sha256, write_atomic
from prour.router.calibration import Calibration


class ThresholdsNotFound(LookupError, ValueError):
    """No thresholds for this decomposer model in this file (a ValueError too, so that every
    stage reports it as the one-line setup error it is)."""


@dataclass(frozen=True)
class Thresholds:
    """(τ_AU, τ_EU) for one decomposer model and where they came from."""

    model_id: str
    tau_au: float
    tau_eu: float
    macro_f1: float
    dataset: str
    date: str
    n_states: int = 0
    per_class_f1: dict[str, float] = field(default_factory=dict)
    grid: tuple[float, float, float] | list[float] = (0.0, 0.8, 0.01)
    # sha256 of the dev labels file the search read (None: not recorded); the chain's search
    # step is done only while the labels are still these
    labels_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decomposer_model_id(model: ModelConfig) -> str:
    """The key thresholds are stored under: served model name, else path, else script name."""
    ident = model.model or model.path or model.script
    if not ident:
        raise ValueError("the decomposer model config names no model, path or script")
    return f"{model.backend}:{ident}"


def calibration_dir(recipe: Recipe) -> Path:
    """``router.calibration.out_dir``, default ``<run_dir>/calibration``: the thresholds' default
    folder, where the calibration pipeline also keeps its labels and decomposer caches."""
    configured = recipe.router.calibration.out_dir
    return Path(configured) if configured else recipe.resolved_run_dir() / "calibration"


def labels_sha256(path: Path) -> str | None:
    """The sha256 a labels file is approved (and fitted) under; None when it does not exist."""
    return file_sha256(path) if path.is_file() else None


def thresholds_path(recipe: Recipe) -> Path:
    """Where the thresholds go: ``router.thresholds_file``, default in the calibration folder."""
    return Path(recipe.router.thresholds_file or calibration_dir(recipe) / "thresholds.json")


class ThresholdStore:
    """A JSON file ``{model_id: Thresholds}``; writes are atomic (temp file + rename)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def read(self) -> dict[str, dict[str, Any]]:
        if not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            message = f"{self.path}: expected a JSON object keyed by model id"
            raise ValueError(message)  # noqa: TRY004 - a bad file, not a bad argument
        return data

    def get(self, model_id: str) -> Thresholds:
        if not self.path.is_file():
            raise ThresholdsNotFound(
                f"thresholds file {self.path} does not exist (looked for decomposer model "
                f"{model_id!r}); run `prour calibrate` or set router.tau_au / router.tau_eu"
            )
        data = self.read()
        if model_id not in data:
            known = ", ".join(sorted(data)) or "none"
            raise ThresholdsNotFound(
                f"no calibrated thresholds for decomposer model {model_id!r} in {self.path} "
                f"(models there: {known}); run `prour calibrate` for this model or set "
                "router.tau_au / router.tau_eu"
            )
        try:
            return Thresholds(**data[model_id])
        except TypeError as exc:
            raise ValueError(f"{self.path}: entry {model_id!r} is malformed ({exc})") from None

    def put(self, thresholds: Thresholds) -> None:
        data = self.read()
        data[thresholds.model_id] = thresholds.to_dict()
        write_atomic(self.path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_thresholds(
    path: str | Path, model_id: str, calibration: Calibration, dataset: str,
    labels_sha256: str | None = None,
) -> Thresholds:
    """Store a calibration result for ``model_id`` (replacing an older one) and return it;
    ``labels_sha256``: the digest of the labels it was fitted on."""
    record = Thresholds(
        model_id=model_id,
        tau_au=calibration.tau_au,
        tau_eu=calibration.tau_eu,
        macro_f1=calibration.macro_f1,
        dataset=dataset,
        date=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        n_states=calibration.n_states,
        per_class_f1=dict(calibration.per_class_f1),
        grid=list(calibration.grid),
        labels_sha256=labels_sha256,
    )
    ThresholdStore(path).put(record)
    return record


def load_thresholds(path: str | Path, model_id: str) -> Thresholds:
    """Thresholds for ``model_id``; :class:`ThresholdsNotFound` names the model and the file."""
    return ThresholdStore(path).get(model_id)


def router_thresholds(
    router: RouterConfig, model_id: str, calibrated: str | Path | None = None
) -> tuple[float, float]:
    """(τ_AU, τ_EU): ``router.tau_au``/``tau_eu`` if set, else the pair calibrated for
    ``model_id`` in ``router.thresholds_file``, else in ``calibrated`` (where `prour calibrate`
    writes them by default)."""
    if router.tau_au is not None and router.tau_eu is not None:
        return router.tau_au, router.tau_eu
    path = router.thresholds_file or calibrated
    if not path:
        raise ValueError(
            "router: no thresholds; set router.tau_au and router.tau_eu, or "
            "router.thresholds_file (written by `prour calibrate`)"
        )
    found = load_thresholds(path, model_id)
    return found.tau_au, found.tau_eu
