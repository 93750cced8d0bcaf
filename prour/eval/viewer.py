"""``prour view``: a run folder as a static HTML site, read in any browser without a server.

The site has one index page (every method × task with its outcome, turns by tag and cost) and one
page per episode: the conversation, a decision table (at each agent turn the AU/EU, the route, the
generated question or verification query, the answer it got and the attention cost of a delivered
request; for methods without the decomposer, the AU/EU (and, on imported runs, the route) of the
post-hoc decomposer pass where ``prour report --posthoc-uncertainty`` measured them) and tau2's
reward breakdown. Evaluation computes no information gain (it is the training reward: it needs
the policy's log-probabilities of G*), so the pages show none. Every text that comes from
a model, a user simulator, a tool or a file is HTML-escaped; the pages load nothing from outside.

A run folder is an evaluation (``episodes.jsonl`` beside ``results.jsonl``) or a folder of
trajectories (``trajectories.jsonl``: ``prour collect`` or ``prour import tau2``). Episodes no
router took carry no turn tags of their own: they get the inferred tags of
:mod:`prour.eval.tags`, shown in their own columns.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prour.env.trajectory import JsonlRecords, Trajectory, read_trajectories

EPISODE_FILES = ("episodes.jsonl", "trajectories.jsonl")  # an evaluation's, then collect/import's
RESULTS_FILE = "results.jsonl"
VIEW_DIR = "view"  # where `prour view RUN` writes without --out (inside RUN)
INDEX = "index.html"

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #bbb;padding:.25em .5em;vertical-align:top;text-align:left}
th{background:#eee}
pre{white-space:pre-wrap;margin:0;font-family:ui-monospace,monospace;font-size:90%}
.msg{border-left:4px solid #999;margin:.4em 0;padding:.3em .6em}
.assistant{border-color:#2b6cb0}.user{border-color:#2f855a}.tool{border-color:#b7791f}
.note{border-color:#805ad5;background:#f6f0ff}.pass{color:#2f855a}.fail{color:#c53030}
.meta{color:#666;font-size:85%}
"""


def esc(value: Any) -> str:
    """``value`` as escaped HTML text (None as an empty cell)."""
    return "" if value is None else html.escape(str(value), quote=True)


@dataclass
class Episode:
    """One trajectory with what the viewer shows beside it."""

    trajectory: Trajectory
    method: str
    line: dict[str, Any] | None = None  # its results.jsonl line (None: no evaluation line)
    posthoc: list[dict[str, Any]] = field(default_factory=list)  # post-hoc decisions by turn
    page: str = ""
    routed: bool = True  # its agent turns carry prour's own turn tags
    tags: list[str] = field(default_factory=list)


def episode_file(run_dir: Path) -> Path:
    """The run's episodes file; a clear error when the folder has none."""
    for name in EPISODE_FILES:
        if (run_dir / name).is_file():
            return run_dir / name
    from prour.env.trajectory import is_tau2_results, misplaced_message

    for candidate in sorted(run_dir.glob("*.json")):
        if is_tau2_results(candidate):
            raise ValueError(misplaced_message(candidate))
    raise FileNotFoundError(f"{run_dir}: no {' or '.join(EPISODE_FILES)} (is it a run folder of "
                            "`prour eval`, `prour collect` or `prour import tau2`?)")


def load_episodes(run_dir: str | Path) -> JsonlRecords:
    """The run's episodes with their result lines (matched by key), method label and tags. A key
    stored twice (an errored episode and its rerun) keeps its last record, as the results, the
    report and the tau2 export do; ``.skipped`` lists the episode file's unreadable lines (torn
    by a crash), which are left out as the harness leaves them out on resume."""
    run_dir = Path(run_dir)
    path = episode_file(run_dir)
    from prour.eval.harness import load_result_lines, result_key
    from prour.eval.posthoc import load_posthoc

    posthoc = load_posthoc(run_dir)
    lines = {}
    if (run_dir / RESULTS_FILE).is_file():  # lines torn by a crash are skipped, as on resume
        lines = load_result_lines(run_dir / RESULTS_FILE)
    stored = read_trajectories(path, on_error="skip")
    episodes = JsonlRecords(skipped=stored.skipped)
    latest = {traj.key: traj for traj in stored}
    for number, traj in enumerate(latest.values()):
        line = lines.get(result_key(traj.key))
        episode = Episode(traj, method_label(traj), line,
                          posthoc.get(result_key(traj.key), []))
        try:
            episode.routed, episode.tags = episode_tags(traj, line)
        except ValueError as exc:  # e.g. a domain no longer registered: name the episode
            raise ValueError(f"{path}: episode {result_key(traj.key)!r}: {exc}") from None
        episode.page = f"episode-{number:04d}-{slug(episode.method)}-{slug(traj.domain)}-" \
                       f"{slug(traj.task_id)}-s{traj.seed}.html"
        episodes.append(episode)
    return episodes


def slug(text: str) -> str:
    """``text`` reduced to file-name characters."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:40]


def method_label(traj: Trajectory) -> str:
    """The episode's agent name: in an evaluation the arm's key (method, variant, sweep point,
    checkpoint step; the report's systems apart), the same with or without a result line."""
    return traj.agent


def episode_tags(traj: Trajectory, line: dict[str, Any] | None) -> tuple[bool, list[str]]:
    """(routed, tags): prour's own turn tags for an episode of ``prour eval`` (it has a result
    line; a base agent's turns are all act, as in the reports) or one whose turns carry tags,
    else the inferred tags of :func:`prour.eval.tags.turn_tags` (imported, collected)."""
    from prour.eval.agent import is_agent_turn, turn_labels
    from prour.eval.tags import turn_tags

    turns = [s for s in traj.steps if is_agent_turn(s)]
    if line is not None or any("turn" in s.meta or "decision" in s.meta for s in turns):
        return True, turn_labels(traj)
    return False, turn_tags(traj)


# ---- decisions ------------------------------------------------------------------------------


def decision_rows(episode: Episode) -> list[dict[str, Any]]:
    """One row per agent turn: tag, route, AU/EU, query, its answer, attention cost, and the
    post-hoc decomposer's AU/EU/route (None where not measured)."""
    from prour.eval.agent import is_agent_turn, step_labels

    traj = episode.trajectory
    costs = request_costs(episode.line)
    turns = [s for s in traj.steps if is_agent_turn(s)]
    posthoc = {record["step"]: record for record in episode.posthoc}
    rows = []
    for number, step in enumerate(turns):
        meta = step.meta
        decision = meta.get("decision") if isinstance(meta.get("decision"), dict) else {}
        query = meta.get("query") if isinstance(meta.get("query"), dict) else {}
        tag = " + ".join(step_labels(meta)) if episode.routed else episode.tags[number]
        rows.append({
            "turn": number, "message": step.message_index, "tag": tag,
            "route": meta.get("route"), "au": decision.get("au"), "eu": decision.get("eu"),
            "skipped": decision.get("why") if decision.get("skipped") else None,
            "query": query.get("question") if query.get("kind") == "ask" else query.get("kind"),
            "answer": turn_answer(traj, step.message_index, meta),
            "cost": costs.get(step.message_index),
            "posthoc": posthoc.get(number),
        })
    return rows


def turn_answer(traj: Trajectory, message_index: int, meta: dict[str, Any]) -> str | None:
    """The verifier's answer of a verify turn, or the user's reply to a clarify question."""
    verify = meta.get("verify")
    if isinstance(verify, dict):
        return verify.get("error") if verify.get("failed") else verify.get("answer")
    if meta.get("turn") != "clarify":
        return None
    for step in traj.steps:
        if step.message_index > message_index and step.kind == "user_message":
            return traj.messages[step.message_index].get("content")
    return None


def request_costs(line: dict[str, Any] | None) -> dict[int, float | None]:
    """Attention cost of each delivered request by message index, under the run's accounting
    (None where the judge scores it needs are missing)."""
    from prour.config.attention import CostWeights
    from prour.eval.attention.cost import request_cost

    attention = (line or {}).get("attention")
    if not isinstance(attention, dict):
        return {}
    weights = CostWeights.model_validate(attention["weights"])
    out: dict[int, float | None] = {}
    for row in attention.get("requests") or []:
        try:
            out[row["message_index"]] = request_cost(row, attention["accounting"], weights)
        except ValueError:
            out[row["message_index"]] = None
    return out


# ---- pages ----------------------------------------------------------------------------------


def page(title: str, body: Iterable[str], style: str = "") -> str:
    """A whole HTML document with the inline style sheet (``style`` added after it)."""
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
            f"<style>{STYLE}{style}</style></head><body>\n{''.join(body)}\n</body></html>\n")


def contents(entries: Iterable[tuple[str, str]]) -> str:
    """A list of links to a page's sections: (section id, title) pairs."""
    return "<ul>" + "".join(f'<li><a href="#{esc(key)}">{esc(title)}</a></li>'
                            for key, title in entries) + "</ul>"


def table(headers: list[str], rows: Iterable[list[str]], table_id: str = "") -> str:
    """An HTML table; ``rows`` hold already escaped cells."""
    ident = f' id="{esc(table_id)}"' if table_id else ""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    lines = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{lines}</tbody></table>\n"


def number(value: Any, digits: int = 3) -> str:
    """A float to ``digits`` places; anything else escaped as is."""
    if isinstance(value, float):
        return f"{round(value, digits) + 0.0:.{digits}f}"  # + 0.0: no "-0.000"
    return esc(value)


def outcome(traj: Trajectory) -> str:
    """The episode's reward and ending, coloured pass / fail."""
    from prour.eval.metrics import is_success

    if traj.reward is None:
        return f"unscored ({esc(traj.termination)})"
    css = "pass" if is_success(traj.reward) else "fail"
    return f'<span class="{css}">{traj.reward:.2f}</span> {esc(traj.termination)}'


def episode_page(episode: Episode) -> str:
    """The episode's page: header, decision table, conversation, reward breakdown."""
    traj = episode.trajectory
    decisions = decision_rows(episode)
    rows = [[str(r["turn"]), str(r["message"]), esc(r["tag"]), esc(r["route"]),
             number(r["au"]), number(r["eu"]), esc(r["skipped"]), f"<pre>{esc(r['query'])}</pre>",
             f"<pre>{esc(r['answer'])}</pre>", number(r["cost"])] for r in decisions]
    headers = ["turn", "message", "tag" if episode.routed else "inferred tag", "route", "AU",
               "EU", "router skipped", "query", "answer", "attention cost"]
    if episode.posthoc:
        headers += ["post-hoc AU", "post-hoc EU", "post-hoc route"]
        for row, r in zip(rows, decisions):
            record = r["posthoc"] or {}
            row += [number(record.get("au")), number(record.get("eu")), esc(record.get("route"))]
    title = f"{episode.method} · {traj.domain} {traj.task_id} · seed {traj.seed}"
    return page(title, [
        f'<p><a href="{INDEX}">all episodes</a></p><h1>{esc(title)}</h1>',
        (f"<p>outcome: {outcome(traj)} · {traj.seconds:.1f} s · agent {esc(traj.agent)} "
        f"({esc(traj.agent_model)}) · user {esc(traj.user)} ({esc(traj.user_model)})</p>"),
        *[f'<p class="fail">error: {esc(e)}</p>' for e in traj.errors],
        "<h2>Decisions</h2>", table(headers, rows, "decisions"),
        "<h2>Conversation</h2>", conversation(traj),
        "<h2>Reward</h2>", reward_section(traj),
    ])


def conversation(traj: Trajectory) -> str:
    """Every message with its role and step kind; tool calls with their arguments."""
    kinds = {s.message_index: s.kind for s in traj.steps}
    parts = []
    for index, message in enumerate(traj.messages):
        role = str(message.get("role", ""))
        kind = kinds.get(index, "system prompt" if role == "system" else "")
        css = "note" if kind == "agent_note" else role
        head = f"#{index} {role} · {kind}" + (f" · {message['name']}" if message.get("name")
                                                else "")
        text = f"<pre>{esc(message.get('content') or '')}</pre>"
        if role == "system":
            text = f"<details><summary>system prompt</summary>{text}</details>"
        calls = "".join(
            f"<pre>→ {esc(c.get('function', {}).get('name'))}"
            f"({esc(c.get('function', {}).get('arguments'))})</pre>"
            for c in message.get("tool_calls") or [])
        parts.append(f'<div class="msg {esc(css)}"><div class="meta">{esc(head)}</div>'
                     f"{text}{calls}</div>")
    return "\n".join(parts)


def reward_section(traj: Trajectory) -> str:
    """tau2's reward basis, the per-check rewards and anything not evaluated."""
    breakdown = traj.reward_breakdown or {}
    checks = breakdown.get("checks") or {}
    rows = [[esc(name), number(float(value), 2)] for name, value in checks.items()]
    parts = [(f"<p>reward: {outcome(traj)} · basis: {esc(', '.join(breakdown.get('basis') or []))}"
             "</p>"), table(["check", "reward"], rows, "reward")]
    if breakdown.get("not_evaluated"):
        parts.append(f"<p>not evaluated: {esc(', '.join(map(str, breakdown['not_evaluated'])))}"
                     "</p>")
    if breakdown:
        dump = json.dumps(breakdown, indent=1, ensure_ascii=False, default=str)
        parts.append(f"<details><summary>whole breakdown</summary><pre>{esc(dump)}</pre>"
                     "</details>")
    return "".join(parts)


def index_page(run_dir: Path, episodes: list[Episode], skipped: list[int] | None = None) -> str:
    """Methods × tasks with each episode's outcome (linked), then per-method means; ``skipped``:
    the episode file's unreadable lines, named in the header."""
    methods = sorted({e.method for e in episodes})
    tasks = sorted({(e.trajectory.domain, e.trajectory.task_id) for e in episodes},
                   key=lambda t: (t[0], _task_order(t[1])))
    cells = {}
    for e in episodes:
        cells.setdefault((e.trajectory.domain, e.trajectory.task_id, e.method), []).append(
            f'<a href="{esc(e.page)}">s{e.trajectory.seed}: {outcome(e.trajectory)}</a>')
    grid = [[esc(d), esc(t), *["<br>".join(cells.get((d, t, m), [])) for m in methods]]
            for d, t in tasks]
    return page(f"prour run {run_dir.name}", [
        (f"<h1>Run {esc(run_dir.name)}</h1><p class=\"meta\">{esc(run_dir.resolve())} · "
        f"{len(episodes)} episodes{esc(_skipped_note(run_dir, skipped or []))}</p>"),
        "<h2>Episodes (methods × tasks)</h2>", table(["domain", "task", *methods], grid, "tasks"),
        "<h2>Per method (means per episode)</h2>", method_table(methods, episodes),
    ])


def _skipped_note(run_dir: Path, skipped: list[int], lead: str = " · ") -> str:
    """``lead`` + ``1 unreadable line of episodes.jsonl skipped (line 17)``; empty when none was."""
    if not skipped:
        return ""
    name = episode_file(run_dir).name
    lines = "line" if len(skipped) == 1 else "lines"
    return (f"{lead}{len(skipped)} unreadable {lines} of {name} skipped "
            f"({lines} {', '.join(map(str, skipped))})")


def _task_order(task_id: str) -> tuple[int, str]:
    return (0, f"{int(task_id):012d}") if task_id.isdigit() else (1, task_id)


def method_table(methods: list[str], episodes: list[Episode]) -> str:
    """Per method: episodes, mean reward, turns by tag (prour's and inferred apart), model calls,
    attention cost and seconds."""
    from prour.eval.agent import TURN_TAGS
    from prour.eval.results import model_calls
    from prour.eval.tags import INFERRED_TAGS

    rows = []
    for method in methods:
        mine = [e for e in episodes if e.method == method]
        routed = [e for e in mine if e.routed]
        inferred = [e for e in mine if not e.routed]
        rewards = [e.trajectory.reward or 0.0 for e in mine]
        costs = [e.line["attention"]["cost"] for e in mine
                 if e.line and isinstance(e.line.get("attention"), dict)
                 and e.line["attention"].get("cost") is not None]
        calls = [sum(model_calls(e.trajectory).values()) for e in mine]
        rows.append([
            esc(method), str(len(mine)), number(mean(rewards)),
            *[number(mean([e.tags.count(t) for e in routed])) for t in TURN_TAGS],
            *[number(mean([e.tags.count(t) for e in inferred])) for t in INFERRED_TAGS],
            number(mean(calls)), number(mean(costs)),
            number(mean([e.trajectory.seconds for e in mine]), 1),
        ])
    headers = ["method", "episodes", "reward", *TURN_TAGS, *[f"{t} (inferred)" for t in
                                                             INFERRED_TAGS],
               "model calls", "attention cost", "seconds"]
    return table(headers, rows, "methods")


def mean(values: list[float]) -> float | None:
    """The mean, or None for no values (an empty cell)."""
    return float(sum(values) / len(values)) if values else None


def write_site(run_dir: str | Path, out: str | Path | None = None,
               say: Callable[[str], None] | None = None) -> Path:
    """Write the run's index and episode pages to ``out`` (default ``RUN/view``), removing the
    episode pages an earlier site left there; returns the index page's path. ``say`` is given
    the line on unreadable episode lines left out (the index says it too)."""
    from prour.files import write_atomic

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    out = Path(out) if out is not None else run_dir / VIEW_DIR
    episodes = load_episodes(run_dir)
    if not episodes:
        raise ValueError(f"{episode_file(run_dir)}: no episodes to show"
                         f"{_skipped_note(run_dir, episodes.skipped, '; ')}")
    if episodes.skipped and say is not None:
        say(_skipped_note(run_dir, episodes.skipped, ""))
    for episode in episodes:
        write_atomic(out / episode.page, episode_page(episode))
    pages = {episode.page for episode in episodes}
    for stale in out.glob("episode-*.html"):  # an earlier site's pages the new index does not link
        if stale.name not in pages:
            stale.unlink()
    return write_atomic(out / INDEX, index_page(run_dir, episodes, episodes.skipped))
