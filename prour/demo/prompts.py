"""The pipeline prompts the warm-start corpus renders, as one fingerprint: a warm-started folder
records it, so new wording in any of them builds the model again (:mod:`prour.demo.warmstart`)."""

from __future__ import annotations

import hashlib
import json


def prompt_fingerprint() -> str:
    """Hash of every pipeline prompt the corpus renders (on fixed inputs): new wording, new build."""
    from prour.data.normalize import goal_prompt as normalize_prompt
    from prour.env.prompts import PROMPTS_VERSION, prompts_hash
    from prour.rewards.belief import belief_prompt
    from prour.rollout.query import query_prompt
    from prour.rollout.strict_user import STRICT_USER_SYSTEM
    from prour.rollout.verifier import VERIFIER_SYSTEM, VERIFIER_USER
    from prour.router.annotation import ANNOTATION_PROMPT
    from prour.router.prompts import action_prompt, goal_prompt, score_prompt

    parts = [
        json.dumps(query_prompt("clarify", "H")),
        json.dumps(query_prompt("verify", "H")),
        goal_prompt("H"),
        action_prompt("H", "T", "G"),
        score_prompt("H", "T", "G"),
        json.dumps(belief_prompt("clarify", "H")),
        json.dumps(belief_prompt("verify", "H")),
        json.dumps(normalize_prompt("I")),
        PROMPTS_VERSION,
        prompts_hash(),  # tau2's agent and user prompts, greeting and stop tokens
        STRICT_USER_SYSTEM,
        VERIFIER_SYSTEM,
        VERIFIER_USER,
        ANNOTATION_PROMPT,
    ]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]
