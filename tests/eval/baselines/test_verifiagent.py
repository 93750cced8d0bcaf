"""``verifiagent`` end to end on 2 retail + 2 airline tasks with scripted models.

The scripted task agent (eval_world) calls a READ tool, then asks the user a question, then
closes. The scripted meta-verifier (on the agent backbone) judges each draft:

- retail: the READ call is sent back for revision; the agent redrafts it (same call, with the
  meta-check note in its context);
- airline: the READ call is accepted;
- both: the draft question after the tool result needs a check; the tool verifier (also the
  backbone) calls a READ tool and answers; with that evidence the agent redrafts and closes.

So retail tags [verify, act, verify, act] and airline [act, verify, act]; no turn asks the user.
"""

from __future__ import annotations

import json

import pytest
from eval_world import QUESTION, TASKS, VERIFY_Q, agent_reply, verifier_reply
from method_run import check_report, run_method

from prour.eval.agent import EVIDENCE_PREFIX
from prour.llm.scripted import ScriptedLLM

ISSUE = "The lookup does not say which order it is for."


def meta_reply(messages: list[dict]) -> str:
    prompt = "\n".join(str(m.get("content") or "") for m in messages)
    draft = prompt.split("The agent's proposed next step:\n", 1)[1].split("\n\n", 1)[0]
    if QUESTION in draft:
        return json.dumps({"verdict": "check", "issue": "", "query": VERIFY_Q})
    if "Airline Agent Policy" in prompt:
        return json.dumps({"verdict": "accept", "issue": "", "query": ""})
    return json.dumps({"verdict": "revise", "issue": ISSUE, "query": ""})


def backbone() -> ScriptedLLM:
    """The agent backbone: meta-verifier, tool verifier and task agent by prompt."""
    return ScriptedLLM(rules=[(r"You verify one step", meta_reply),
                              (r"You are a Verifier", verifier_reply), (r".", agent_reply)])


@pytest.fixture(scope="module")
def verifiagent_run(tmp_path_factory):
    run = run_method("verifiagent", tmp_path_factory.mktemp("verifiagent"),
                     llms={"agent": backbone()})
    check_report(run)
    return run


@pytest.mark.parametrize("domain_task", TASKS)
def test_verifiagent_verifies_each_draft_and_never_asks(verifiagent_run, domain_task):
    domain, task = domain_task.split(":")
    run = verifiagent_run
    steps = run.agent_steps(domain, task)
    verdicts = [s.meta["decision"].get("verdict") for s in steps]
    if domain == "retail":
        assert run.turns(domain, task) == ["verify", "act", "verify", "act"]
        assert verdicts == ["revise", "check"]
        assert steps[0].meta["verify"] == {"kind": "meta", "answer": ISSUE, "failed": False}
        # draft + redraft twice; one meta check per draft; the verifier's tool round and answer
        calls = {"agent.chat": 4, "meta_verifier.chat": 2, "tool_verifier.chat": 2,
                 "user.chat": 2}
    else:
        assert run.turns(domain, task) == ["act", "verify", "act"]
        assert verdicts == ["accept", "check"]
        calls = {"agent.chat": 3, "meta_verifier.chat": 2, "tool_verifier.chat": 2,
                 "user.chat": 2}
    assert run.calls(domain, task) == calls
    check = steps[-1].meta
    assert check["decision"]["query"] == VERIFY_Q
    assert check["verify"]["kind"] == "tool" and check["verify"]["grounded"]
    assert check["verify"]["tools"] == [("list_all_airports" if domain == "airline"
                                         else "list_all_product_types")]
    traj = run.episode(domain, task)
    notes = [traj.messages[s.message_index]["content"] for s in traj.steps
             if s.kind == "agent_note"]
    assert len(notes) == len([t for t in run.turns(domain, task) if t == "verify"])
    assert all(note.startswith(EVIDENCE_PREFIX) for note in notes)
    assert check["verify"]["answer"] in notes[-1]
    # the redraft after the evidence closes: the user never gets a question
    assert [s.kind for s in steps] == ["agent_tool_call", "agent_message"]
    assert "?" not in traj.messages[steps[-1].message_index]["content"]
    assert run.line(domain, task)["steps"]["clarify"] == 0


@pytest.mark.parametrize(("reply", "error"), [
    ({"verdict": "maybe"}, "verdict must be one of accept, revise, check, got 'maybe'"),
    ({"verdict": "check", "query": "  "}, "a check verdict needs a non-empty query"),
    ({"verdict": "revise"}, "a revise verdict needs a non-empty issue"),
    ({"verdict": "accept", "issue": 3}, "issue must be a string, got int"),
])
def test_meta_verifier_replies_that_cannot_be_acted_on_are_rejected(reply, error) -> None:
    from prour.eval.baselines.verifiagent import check_verdict

    with pytest.raises(ValueError, match=error):
        check_verdict(reply)
    assert check_verdict({"verdict": "check", "query": " Is it paid? "}) == ("check", "",
                                                                             "Is it paid?")
