"""``prour env list|show`` (the tau2 domains) and ``prour episode run`` (one episode, printed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from prour.env.domains import DOMAINS

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from prour.config import EnvConfig
    from prour.env.trajectory import StepRecord

env_app = typer.Typer(help="Inspect the tau2 domains: splits, tools, policy.", no_args_is_help=True)
episode_app = typer.Typer(help="Run single episodes on tau2 tasks.", no_args_is_help=True)

OBSERVATION_CHARS = 400
DOMAIN_HELP = f"One of: {', '.join(DOMAINS)}."


def register(app: typer.Typer) -> None:
    """Add ``env`` and ``episode`` to the main app."""
    app.add_typer(env_app, name="env")
    app.add_typer(episode_app, name="episode")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


@env_app.command("list")
def env_list() -> None:
    """Domains with their split sizes and tool counts (agent tools by tau2 type, user tools)."""
    from rich.console import Console
    from rich.table import Table

    from prour.env.domains import DOMAINS, split_sizes
    from prour.env.environment import tool_types

    table = Table(title="tau2 domains")
    for column in ("domain", "train", "test", "base", "agent tools", "read", "write", "user tools"):
        table.add_column(column, justify="left" if column == "domain" else "right")
    for domain in DOMAINS:
        sizes, types = split_sizes(domain), tool_types(domain)
        kinds = list(types.values())
        table.add_row(
            domain,
            str(sizes["train"]),
            str(sizes["test"]),
            str(sizes["base"]),
            str(len(types)),
            str(kinds.count("read")),
            str(kinds.count("write")),
            str(len(tool_types(domain, "user"))),
        )
    Console().print(table)


@env_app.command("show")
def env_show(
    domain: Annotated[str, typer.Argument(help=DOMAIN_HELP)],
    policy_lines: Annotated[int, typer.Option(help="How many policy lines to print.")] = 15,
) -> None:
    """A domain's tools (READ / WRITE / GENERIC ...), the head of its policy, its split sizes."""
    from rich.console import Console

    from prour.env.domains import check_domain, domain_policy, split_sizes

    try:
        check_domain(domain)
    except ValueError as exc:
        _fail(str(exc))
    console = Console()
    sizes = split_sizes(domain)
    console.print(f"[bold]{domain}[/bold]: " + ", ".join(f"{k} {v}" for k, v in sizes.items()))
    console.print(_tools_table(domain, "assistant", "agent tools"))
    if _has_user_tools(domain):
        console.print(_tools_table(domain, "user", "user tools (the customer's device)"))
    lines = domain_policy(domain).splitlines()
    console.rule(f"policy (first {min(policy_lines, len(lines))} of {len(lines)} lines)")
    console.print("\n".join(lines[:policy_lines]), markup=False, highlight=False)


def _has_user_tools(domain: str) -> bool:
    from prour.env.environment import user_tool_schemas

    return bool(user_tool_schemas(domain))


def _tools_table(domain: str, requestor: str, title: str) -> Any:
    from rich.table import Table

    from prour.env.environment import tool_schemas, tool_types

    types = tool_types(domain, requestor)  # type: ignore[arg-type]
    table = Table(title=title)
    for column in ("tool", "type", "description"):
        table.add_column(column)
    for schema in tool_schemas(domain, requestor):  # type: ignore[arg-type]
        function = schema["function"]
        kind = types.get(function["name"], "?").upper()
        table.add_row(function["name"], kind, _first_line(function.get("description", "")))
    return table


def _build_llm(backend: str | None, model: str | None, base_url: str | None) -> Any:
    from pydantic import ValidationError

    from prour.config import ModelConfig, first_error
    from prour.llm.registry import build_llm

    backend = backend or ModelConfig.model_fields["backend"].default
    if model is None:
        _fail(f"--agent llm / --user llm need --model (backend {backend!r})")
    fields: dict[str, Any] = {"backend": backend}
    if backend == "hf":
        fields["path"] = model
    elif backend == "openai":
        fields.update(model=model, base_url=base_url)
    else:
        fields["script"] = model
    try:
        config = ModelConfig(**fields)
    except ValidationError as exc:
        _fail(f"model options: {first_error(exc)}")
    return build_llm(config)


def _print_step(console: Console, step: StepRecord, message: dict[str, Any]) -> None:
    """One transcript line: who, what, and for tool results the (shortened) observation."""
    from rich.markup import escape

    timing = f"[dim]({step.seconds:.2f}s)[/dim]"
    if step.kind == "tool_result":
        text = message.get("content") or ""
        short = text if len(text) <= OBSERVATION_CHARS else text[:OBSERVATION_CHARS] + " …"
        colour = "red" if step.is_error else "green"
        console.print(f"  [{colour}]{escape(step.tool_name or '?')} →[/{colour}] {escape(short)}")
        return
    who = "agent" if step.kind.startswith("agent") else "user"
    colour = "cyan" if who == "agent" else "yellow"
    if message.get("content"):
        label = "note" if step.kind == "agent_note" else who
        console.print(
            f"[bold {colour}]{label}:[/bold {colour}] {escape(message['content'])} {timing}"
        )
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        console.print(
            f"[{colour}]{who} calls[/{colour}] {escape(function.get('name', ''))}"
            f"({escape(str(function.get('arguments', '')))}) {timing}"
        )


@episode_app.command("run")
def episode_run(
    domain: Annotated[str, typer.Option(help=DOMAIN_HELP)],
    task: Annotated[str, typer.Option(help="Task id (see `prour env show`).")],
    agent: Annotated[str, typer.Option(help="oracle | llm")] = "oracle",
    user: Annotated[str, typer.Option(help="oracle | scripted | llm")] = "oracle",
    backend: Annotated[
        str | None, typer.Option(help="hf | openai | scripted (for llm agent/user; default: "
                                      "models.*.backend's)")
    ] = None,
    model: Annotated[str | None, typer.Option(help="HF folder / served model / script")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible server URL")] = None,
    seed: Annotated[int, typer.Option(help="Episode seed.")] = 0,
    max_steps: Annotated[int | None, typer.Option(
        help="tau2 steps (agent and user messages, tool-result batches) before the cut "
             "(default: env.max_steps).")
    ] = None,
    agent_temperature: Annotated[float | None, typer.Option(
        help="Agent sampling temperature (default: env.agent_temperature).")] = None,
    user_temperature: Annotated[float | None, typer.Option(
        help="User sampling temperature (default: env.user_temperature).")] = None,
    user_reply: Annotated[
        list[str] | None, typer.Option(help="Scripted user replies, in order (repeatable).")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Append the trajectory to this JSONL.")] = None,
) -> None:
    """Run one episode, print the transcript as it happens, then the reward."""
    from rich.console import Console

    from prour.env.agents import build_agent
    from prour.env.domains import get_task
    from prour.env.runner import run_episode
    from prour.env.users import build_user
    from prour.files import append_jsonl

    env = _env_section(max_steps=max_steps, agent_temperature=agent_temperature,
                       user_temperature=user_temperature)
    try:
        task_obj = get_task(domain, task)
        llm = _build_llm(backend, model, base_url) if "llm" in (agent, user) else None
        agent_obj = build_agent(agent, **_agent_kwargs(agent, llm, env))
        user_obj = build_user(user, **_user_kwargs(user, llm, env, user_reply))
    except ValueError as exc:
        _fail(str(exc))
    console = Console()
    console.rule(f"{domain} task {task} · agent {agent} · user {user} · seed {seed}")
    traj = run_episode(
        domain,
        task_obj,
        agent_obj,
        user_obj,
        limits=env,
        seed=seed,
        on_step=lambda step, message: _print_step(console, step, message),
    )
    _print_outcome(console, traj)
    if out is not None:
        append_jsonl(out, traj)
        console.print(f"appended to {out}")
    if llm is not None:
        llm.close()


def _env_section(**given: Any) -> EnvConfig:
    """The ``env`` section with the options given on the command line (the others: its own
    defaults, the one place they are written)."""
    from pydantic import ValidationError

    from prour.config import EnvConfig, first_error

    try:
        return EnvConfig(**{key: value for key, value in given.items() if value is not None})
    except ValidationError as exc:
        _fail(f"episode options: {first_error(exc)}")


def _agent_kwargs(name: str, llm: Any, env: EnvConfig) -> dict[str, Any]:
    return {"llm": llm, "env": env} if name == "llm" else {}


def _user_kwargs(name: str, llm: Any, env: EnvConfig, replies: list[str] | None) -> dict:
    if name == "llm":
        return {"llm": llm, "env": env}
    if name == "scripted":
        return {"replies": list(replies or ["Hello, I need some help, please."])}
    return {}


def _print_outcome(console: Console, traj: Any) -> None:
    console.rule("outcome")
    console.print(
        f"termination: {traj.termination}   steps: {len(traj.steps)}   time: {traj.seconds:.2f}s"
    )
    reward = "not scored" if traj.reward is None else f"{traj.reward:.3f}"
    console.print(f"[bold]reward: {reward}[/bold]")
    if traj.reward_breakdown:
        console.print(json.dumps(traj.reward_breakdown, indent=2), markup=False, highlight=False)
    for error in traj.errors:
        console.print(f"[red]error:[/red] {error}", highlight=False)
