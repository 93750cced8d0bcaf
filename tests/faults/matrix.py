"""The fault matrix of the long commands: the single source of truth of which test holds each
(command, fault) cell, which cells do not apply and why, and which are not built yet. Print it
with ``python tests/faults/matrix.py`` (docs/reliability.md holds its output);
tests/faults/test_matrix.py checks every named test exists and every cell is filled.

A cell's tier: ``CI`` (``make test``: CPU, the vLLM venv and the local Slurm included), ``full``
(``make test-full`` only) or ``slurm`` (marked slurm, run by ``make test`` where root can start
Slurm). Every test a cell names asserts what issue 36 asks of its fault: a non-zero exit with one
line naming cause and fix, no traceback, the lock freed and, after the fault is removed, a rerun
with every record exactly once (or checkpoints that load).

A second table, :data:`FLAKY`, holds the flaky servers: the commands that call served models
for long (eval, and the local trainer's responders) against a server that fails a seeded share
of requests in one way (or all ways mixed), or whose retries run out. Its cells assert that every
episode and every reward is recorded exactly once, as a clean server's run records it, and that
the run reports the failed attempts by kind, their share and the retries as the server counts
them."""

from __future__ import annotations

from dataclasses import dataclass

COMMANDS = ("collect", "normalize", "calibrate", "extract", "train local",
            "train verl rehearsal", "eval", "report", "prour run", "installed prour",
            "process tree")
FAULTS = ("SIGINT start-up", "SIGINT mid-run", "SIGTERM mid-run", "Slurm repeated SIGTERM",
          "kill -9 + rerun", "read-only run folder", "full disk", "HTTP 500", "timeout",
          "closed mid-reply", "vLLM dies mid-step", "torn last line", "truncated checkpoint",
          "corrupt parquet")


@dataclass(frozen=True)
class Cell:
    """``tests``: (tier, "path::function") pairs; else ``na`` (why it does not apply) or ``gap``
    (why it is not built)."""

    tests: tuple[tuple[str, str], ...] = ()
    na: str = ""
    gap: str = ""

    @property
    def mark(self) -> str:
        if self.tests:
            tiers = {tier for tier, _ in self.tests}
            return "CI" if "CI" in tiers else "/".join(sorted(tiers))
        return "n/a" if self.na else "gap"


def t(*pairs: str) -> Cell:
    """A cell from "TIER path::function" strings."""
    return Cell(tests=tuple(tuple(p.split(" ", 1)) for p in pairs))  # type: ignore[misc]


F = "tests/faults/test_collect_faults.py::"
R = "tests/faults/test_report_faults.py::"
E = "tests/faults/test_eval_faults.py::"
S = ("tests/faults/test_stage_faults.py::test_a_backend_fault_fails_the_stage_in_one_line_then_"
     "a_rerun_writes_each_record_once")
U = ("CI tests/faults/test_start_up_faults.py::test_ctrl_c_during_start_up_is_one_line_without_"
     "a_traceback")
TR = ("full tests/faults/test_train_faults.py::test_a_signal_mid_training_names_the_checkpoint_"
      "and_resume_saves_every_step_once")
RUN = ("full tests/faults/test_run_faults.py::test_a_signal_to_the_process_group_mid_step_"
       "reports_once_and_a_rerun_completes")
D = ("tests/faults/test_stage_faults.py::test_a_read_only_or_full_run_folder_is_one_line_then_"
     "a_rerun_writes_each_record_once")
SG = "tests/faults/test_stage_signals.py::"
RS = "tests/faults/test_run_step_faults.py::"
VD = ("full tests/faults/test_vllm_dies.py::test_the_model_server_dies_mid_step_then_a_rerun_"
      "completes")
TV = "full tests/faults/test_train_vllm_dies.py::test_the_responders_server_dies_mid_"
RH = ("tests/faults/test_rehearsal_faults.py::test_a_signal_mid_rehearsal_names_the_checkpoint_"
      "and_resume_saves_every_step_once")
RHD = ("tests/faults/test_rehearsal_faults.py::test_a_read_only_or_full_output_folder_is_one_"
       "line_then_the_rehearsal_trains")
RESP = ("tests/faults/test_train_faults.py::test_responders_that_fail_every_request_stop_"
        "training_then_a_rerun_trains")
SIG = SG + "test_a_fault_mid_run_then_a_rerun_stores_every_record_once"
NO_CKPT = "writes no checkpoint (JSONL records, resumed by key)"
NO_PARQUET = "reads and writes no parquet"
NO_MODEL = "calls no model server"
# The rows of what sits around every command: the console script users run (``prour`` as
# installed, pyproject's [project.scripts]) and the tree of processes a command starts.
IE = ("tests/cli/test_installed_entry.py::test_the_installed_prour_into_a_read_only_or_full_"
      "folder_is_one_line")
PT = ("tests/faults/test_process_tree_faults.py::test_kill_minus_nine_of_prour_run_ends_its_step_"
      "and_a_rerun_finds_no_orphan")
RAY = ("tests/cluster/test_slurm_ray_signals.py::test_scancel_reaching_the_ray_workers_and_the_"
       "driver_exits_130_and_the_resubmission_resumes")
ENTRY_ONLY = ("a fault of the command, not of its entry: the command's row, whose CI cells run the "
              "same installed script")
TREE_ONLY = "a fault of the command, not of its process tree: the command's row"
SHORT = "a few seconds of reading files, no resumable phase: a rerun rewrites its folder whole"

MATRIX: dict[str, dict[str, Cell]] = {
    "collect": {
        "SIGINT start-up": t("CI tests/test_interrupt.py::"
                             "test_ctrl_c_during_start_up_is_one_line_without_a_traceback"),
        "SIGINT mid-run": t("CI tests/cli/test_bad_inputs.py::"
                            "test_ctrl_c_during_collect_says_what_was_saved_and_exits_130",
                            "full " + F + "test_a_signal_mid_run_saves_reports_frees_the_lock_"
                            "and_a_rerun_completes"),
        "SIGTERM mid-run": t("CI tests/test_interrupt.py::test_sigterm_saves_releases_the_lock_"
                             "exits_130_and_a_rerun_completes",
                             "full " + F + "test_a_signal_mid_run_saves_reports_frees_the_lock_"
                             "and_a_rerun_completes"),
        "Slurm repeated SIGTERM": t("CI " + F + "test_a_signal_mid_run_saves_reports_frees_the_"
                                    "lock_and_a_rerun_completes",
                                    "slurm tests/cluster/test_slurm_signals.py::test_scancel_of_a_"
                                    "collect_job_saves_and_the_resubmission_does_only_the_missing"
                                    "_work"),
        "kill -9 + rerun": t("CI tests/data/test_collect.py::test_killed_collect_resumes_without_"
                             "duplicates_or_losses",
                             "full " + F + "test_kill_minus_nine_mid_run_then_a_rerun_does_only_"
                             "the_missing_work"),
        "read-only run folder": t("CI tests/cli/test_bad_setups.py::"
                                  "test_a_read_only_run_folder_is_one_line"),
        "full disk": t("CI tests/cli/test_bad_setups.py::test_a_full_run_folder_is_one_line_"
                       "naming_the_file_and_the_space"),
        "HTTP 500": t("CI " + F + "test_a_transient_backend_fault_is_retried_and_counted",
                      "CI tests/data/test_collect_errors.py::test_collect_against_a_backend_"
                      "answering_500_exits_1_naming_it_and_retries_later",
                      "full " + F + "test_a_persistent_backend_fault_fails_the_step_then_a_rerun_"
                      "retries_the_errored"),
        "timeout": t("full " + F + "test_a_transient_backend_fault_is_retried_and_counted",
                     "full " + F + "test_a_persistent_backend_fault_fails_the_step_then_a_rerun_"
                     "retries_the_errored",
                     "CI tests/llm/test_openai_faults.py::test_hanging_server_times_out_without_"
                     "hanging"),
        "closed mid-reply": t("full " + F + "test_a_transient_backend_fault_is_retried_and_"
                              "counted",
                              "full " + F + "test_a_persistent_backend_fault_fails_the_step_then"
                              "_a_rerun_retries_the_errored",
                              "CI tests/llm/test_openai_faults.py::test_closed_connection_retried"
                              "_then_clear_error"),
        "vLLM dies mid-step": t("full tests/data/test_collect_vllm.py::test_collect_fails_when_its_"
                                "server_dies_and_a_rerun_retries_the_errored"),
        "torn last line": t("CI tests/data/test_collect_errors.py::test_a_torn_last_line_is_"
                            "repaired_when_collect_resumes",
                            "full " + F + "test_kill_minus_nine_mid_run_then_a_rerun_does_only_"
                            "the_missing_work"),
        "truncated checkpoint": Cell(na=NO_CKPT),
        "corrupt parquet": Cell(na=NO_PARQUET + " (tau2 tasks come from the installed package)"),
    },
    "normalize": {
        "vLLM dies mid-step": t(VD),
        "SIGINT start-up": t(U),
        "SIGINT mid-run": t("full " + SIG),
        "SIGTERM mid-run": t("CI " + SIG),
        "Slurm repeated SIGTERM": t("full " + SIG),
        "kill -9 + rerun": t("CI " + SIG),
        "torn last line": t("CI " + SIG),
        "read-only run folder": t("CI " + D),
        "full disk": t("CI " + D),
        "timeout": t("CI " + S),
        "closed mid-reply": t("CI " + S),
        "HTTP 500": t("CI tests/cli/test_bad_setups.py::test_normalize_against_a_server_"
                      "answering_500"),
        "truncated checkpoint": Cell(na=NO_CKPT),
        "corrupt parquet": Cell(na=NO_PARQUET + " (trajectories and goals are JSONL)"),
    },
    "calibrate": {
        "vLLM dies mid-step": t(VD),
        "SIGINT start-up": t(U),
        "SIGINT mid-run": t("CI " + SIG),
        "SIGTERM mid-run": t("full " + SIG),
        "Slurm repeated SIGTERM": t("CI " + SIG),
        "kill -9 + rerun": t("CI " + SIG),
        "read-only run folder": t("CI " + D),
        "full disk": t("CI " + D),
        "timeout": t("CI " + S),
        "closed mid-reply": t("CI " + S),
        "HTTP 500": t("CI tests/cli/test_bad_setups.py::test_calibrate_against_a_server_"
                      "answering_500"),
        "torn last line": t("CI tests/cli/test_calibrate_states.py::test_a_torn_last_line_"
                            "follows_data_on_bad_line"),
        "truncated checkpoint": Cell(na="writes no checkpoint (labels JSONL, thresholds.json)"),
        "corrupt parquet": Cell(na=NO_PARQUET + " (states and labels are JSONL)"),
    },
    "extract": {
        "vLLM dies mid-step": t(VD),
        "SIGINT start-up": t(U),
        "SIGINT mid-run": t("full " + SIG),
        "SIGTERM mid-run": t("full " + SIG),
        "Slurm repeated SIGTERM": t("full " + SIG),
        "kill -9 + rerun": t("full " + SIG),
        "torn last line": t("full " + SIG),
        "corrupt parquet": t("CI " + SG + "test_a_corrupt_split_left_by_an_earlier_run_is_"
                             "replaced_by_extract"),
        "read-only run folder": t("CI " + D),
        "full disk": t("full " + D),
        "timeout": t("full " + S),
        "closed mid-reply": t("CI " + S),
        "HTTP 500": t("CI tests/cli/test_bad_setups.py::test_extract_against_a_server_"
                      "answering_500"),
        "truncated checkpoint": Cell(na="writes no checkpoint (a decision cache and parquet)"),
    },
    "train local": {
        "vLLM dies mid-step": t(TV + "training_then_resume_trains_every_step_once"),
        "read-only run folder": t("full tests/faults/test_train_faults.py::test_a_read_only_"
                                  "output_folder_is_one_line_then_a_rerun_trains"),
        "SIGINT mid-run": t(TR),
        "SIGTERM mid-run": t(TR),
        "SIGINT start-up": t(U),
        "Slurm repeated SIGTERM": t(TR),
        "HTTP 500": t("CI " + RESP, "CI tests/train/test_local.py::test_responders_that_are_down_"
                      "stop_the_step_before_its_update"),
        "timeout": t("full " + RESP),
        "closed mid-reply": t("full " + RESP),
        "torn last line": t("CI tests/train/test_checkpoint.py::test_kill_minus_nine_then_resume"
                            "_matches_an_uninterrupted_run"),
        "kill -9 + rerun": t("CI tests/train/test_checkpoint.py::test_kill_minus_nine_then_resume"
                             "_matches_an_uninterrupted_run",
                             "CI tests/train/test_checkpoint.py::test_a_second_trainer_refuses_"
                             "then_resume_takes_over_the_dead_ones_lock"),
        "full disk": t("CI tests/train/test_checkpoint.py::test_a_disk_that_fills_during_a_save_"
                       "leaves_the_previous_step_loadable"),
        "truncated checkpoint": t("CI tests/train/test_checkpoint.py::test_a_truncated_newest_"
                                  "checkpoint_is_skipped_and_resume_redoes_it_from_the_one_"
                                  "before"),
        "corrupt parquet": t("CI tests/cli/test_bad_setups.py::test_preflight_reads_the_footer_"
                             "of_parquet_inputs"),
    },
    "train verl rehearsal": {
        "vLLM dies mid-step": t(TV + "rehearsal_then_resume_trains_every_step_once"),
        "SIGINT start-up": t(U),
        "SIGINT mid-run": t("full " + RH),
        "SIGTERM mid-run": t("full " + RH),
        "Slurm repeated SIGTERM": t("full " + RH),
        "read-only run folder": t("full " + RHD),
        "full disk": t("full " + RHD),
        "torn last line": t("full " + RH),
        **{fault: t("full tests/faults/test_rehearsal_faults.py::test_responders_that_fail_every_"
                    "request_stop_the_rehearsal_in_one_line")
           for fault in ("HTTP 500", "timeout", "closed mid-reply")},
        "kill -9 + rerun": t("full tests/cluster/test_multinode_train.py::test_a_rank_killed_"
                             "mid_run_fails_the_job_and_a_resubmission_resumes"),
        "truncated checkpoint": t("CI tests/train/test_checkpoint.py::test_a_truncated_newest_"
                                  "checkpoint_is_skipped_and_resume_redoes_it_from_the_one_"
                                  "before"),
        "corrupt parquet": t("CI tests/cli/test_bad_setups.py::test_preflight_reads_the_footer_"
                             "of_parquet_inputs"),
    },
    "eval": {
        "vLLM dies mid-step": t(VD),
        "SIGINT start-up": t(U),
        "SIGTERM mid-run": t("CI " + E + "test_a_signal_mid_run_saves_reports_frees_the_lock_and_a_"
                             "rerun_completes"),
        "Slurm repeated SIGTERM": t("full " + E + "test_a_signal_mid_run_saves_reports_frees_the_"
                                    "lock_and_a_rerun_completes"),
        "timeout": t("CI " + E + "test_a_transient_backend_fault_is_retried_and_counted",
                     "full " + E + "test_a_persistent_backend_fault_fails_the_eval_then_a_rerun_"
                     "retries_the_errored"),
        "closed mid-reply": t("full " + E + "test_a_transient_backend_fault_is_retried_and_"
                              "counted",
                              "full " + E + "test_a_persistent_backend_fault_fails_the_eval_then"
                              "_a_rerun_retries_the_errored"),
        "SIGINT mid-run": t("CI tests/cli/test_bad_inputs.py::test_ctrl_c_during_eval_says_what_"
                            "was_saved_and_exits_130"),
        "kill -9 + rerun": t("CI tests/eval/test_harness.py::test_killed_evaluation_resumes_to_"
                             "the_same_results",
                             "CI tests/eval/test_harness.py::test_a_second_evaluation_refuses_"
                             "then_a_rerun_takes_over_the_dead_ones_lock"),
        "HTTP 500": t("CI tests/eval/test_eval_failures.py::test_errored_episodes_fail_the_eval_"
                      "mark_the_report_and_rerun",
                      "full " + E + "test_a_transient_backend_fault_is_retried_and_counted",
                      "full " + E + "test_a_persistent_backend_fault_fails_the_eval_then_a_rerun_"
                      "retries_the_errored"),
        "corrupt parquet": Cell(na=NO_PARQUET + " (tau2 tasks, JSONL episodes and results)"),
        "torn last line": t("CI " + E + "test_a_torn_last_episode_is_run_again_and_every_key_"
                            "stored_once"),
        "read-only run folder": t("CI " + E + "test_a_read_only_or_full_run_folder_is_one_line_"
                                  "then_a_rerun_stores_every_key_once"),
        "full disk": t("CI " + E + "test_a_read_only_or_full_run_folder_is_one_line_then_a_"
                       "rerun_stores_every_key_once"),
        "truncated checkpoint": Cell(na="writes no checkpoint; a checkpoint it evaluates is "
                                     "found by train's rule (the newest complete step)"),
    },
    "report": {
        "SIGINT start-up": t("CI " + R + "test_ctrl_c_during_report_start_up_is_one_line_without_"
                             "a_traceback"),
        **{fault: Cell(na=SHORT) for fault in FAULTS[1:5]},
        "read-only run folder": t("CI " + R + "test_a_read_only_report_folder_is_one_line_then_a_"
                                  "rerun_writes_it"),
        "full disk": t("CI " + R + "test_a_full_disk_is_one_line_naming_the_space_then_a_rerun_"
                       "writes_the_report"),
        "torn last line": t("CI " + R + "test_a_torn_last_line_is_named_and_skipped_and_every_"
                            "episode_counted_once"),
        **{fault: Cell(na=NO_MODEL) for fault in FAULTS[7:11]},
        "truncated checkpoint": Cell(na="reads no checkpoint (metrics and results files)"),
        "corrupt parquet": Cell(na=NO_PARQUET),
    },
    "prour run": {
        "vLLM dies mid-step": t(VD),
        "SIGINT mid-run": t(RUN),
        "HTTP 500": t("CI " + RS + "test_a_failing_backend_fails_the_step_and_the_run_then_a_"
                      "rerun_completes"),
        "timeout": t("full " + RS + "test_a_failing_backend_fails_the_step_and_the_run_then_a_"
                     "rerun_completes"),
        "closed mid-reply": t("full " + RS + "test_a_failing_backend_fails_the_step_and_the_run_"
                              "then_a_rerun_completes"),
        "read-only run folder": t("CI " + RS + "test_a_read_only_or_full_run_folder_fails_the_"
                                  "run_in_one_line_then_a_rerun_completes"),
        "full disk": t("full " + RS + "test_a_read_only_or_full_run_folder_fails_the_run_in_one_"
                       "line_then_a_rerun_completes"),
        "torn last line": t("CI " + RS + "test_a_kill_of_the_run_mid_write_leaves_a_torn_line_"
                            "that_the_rerun_repairs"),
        "corrupt parquet": t("CI " + RS + "test_prour_run_makes_a_parquet_output_that_is_cut_"
                             "short_again"),
        "truncated checkpoint": t("full " + RS + "test_a_truncated_final_checkpoint_is_trained_"
                                  "again_by_prour_run"),
        "Slurm repeated SIGTERM": t(RUN),
        "SIGINT start-up": t(U),
        "SIGTERM mid-run": t("CI tests/test_interrupt.py::test_prour_run_passes_sigterm_on_to_"
                             "its_step_and_prints_the_steps_report"),
        "kill -9 + rerun": t("CI tests/test_runner_chain.py::test_a_killed_train_resumes_only_"
                             "its_missing_steps_then_reruns_skip_and_stale_is_named"),
    },
    "installed prour": {
        **{fault: Cell(na=ENTRY_ONLY) for fault in FAULTS},
        "SIGINT start-up": t(U),  # every long command's start-up, through the installed script
        "read-only run folder": t("CI " + IE),
        "full disk": t("CI " + IE),
        "kill -9 + rerun": t("CI " + PT),
    },
    "process tree": {
        **{fault: Cell(na=TREE_ONLY) for fault in FAULTS},
        "SIGINT mid-run": t(RUN),  # Ctrl-C to the runner's group: it passes it on to its step
        "SIGTERM mid-run": t("CI tests/test_interrupt.py::test_prour_run_passes_sigterm_on_to_"
                             "its_step_and_prints_the_steps_report", RUN),
        "Slurm repeated SIGTERM": t("full " + RAY),  # scancel reaches Ray's workers and driver
        "kill -9 + rerun": t("CI " + PT),  # the runner killed: its step dies with it
    },
}

FLAKY_COMMANDS = ("eval", "train local")
FLAKY_FAULTS = ("HTTP 500 share", "timeout share", "dropped mid-reply share", "latency spikes",
                "all four mixed", "retries run out")
FL = "tests/faults/test_flaky_servers.py::"
FLE = FL + "test_an_eval_against_a_flaky_server_stores_every_episode_once_and_reports_its_errors"
FLT = FL + ("test_training_against_flaky_responders_records_every_reward_once_and_counts_the_"
            "errors")
SINGLE = dict(zip(FLAKY_FAULTS[:4], ("http-500", "timeout", "closed-mid-reply",
                                     "latency-spike")))

FLAKY: dict[str, dict[str, Cell]] = {
    "eval": {
        **{fault: t(f"full {FLE}[{kind}]") for fault, kind in SINGLE.items()},
        "all four mixed": t(f"CI {FLE}[mixed]"),
        "retries run out": t("full " + FL + "test_an_eval_whose_retries_run_out_errs_those_"
                             "episodes_once_and_a_rerun_completes"),
    },
    "train local": {
        **{fault: t(f"full {FLT}[{kind}]") for fault, kind in SINGLE.items()},
        "all four mixed": t(f"CI {FLT}[mixed]"),
        "retries run out": t("full " + FL + "test_a_responder_whose_retries_run_out_fails_its_"
                             "samples_and_invents_no_reward"),
    },
}


def cell(command: str, fault: str) -> Cell:
    """The cell of ``command`` × ``fault`` (every one is in MATRIX: the test holds it so)."""
    return MATRIX[command][fault]


def table() -> str:
    """The matrix as a Markdown table (CI / full / slurm / n/a / gap), then the notes."""
    lines = ["| command | " + " | ".join(FAULTS) + " |",
             "|---|" + "---|" * len(FAULTS)]
    for command in COMMANDS:
        marks = [cell(command, fault).mark for fault in FAULTS]
        lines.append(f"| {command} | " + " | ".join(marks) + " |")
    counts: dict[str, int] = {}
    for command in COMMANDS:
        for fault in FAULTS:
            mark = cell(command, fault).mark
            counts[mark] = counts.get(mark, 0) + 1
    lines += ["", "cells: " + ", ".join(f"{n} {mark}" for mark, n in sorted(counts.items())), ""]
    for command in COMMANDS:
        for fault in FAULTS:
            c = cell(command, fault)
            if c.tests:
                names = "; ".join(f"{tier} {name}" for tier, name in c.tests)
                lines.append(f"- {command} × {fault}: {names}")
            elif c.na:
                lines.append(f"- {command} × {fault}: n/a, {c.na}")
    gaps = sorted({cell(c, f).gap for c in COMMANDS for f in FAULTS if cell(c, f).gap})
    if gaps:
        lines += ["", "gaps:"] + [f"- {gap}" for gap in gaps]
    return "\n".join(lines)


def flaky_table() -> str:
    """The flaky-server rows as a Markdown table (CI / full), then the test behind each cell."""
    lines = ["| command, flaky server | " + " | ".join(FLAKY_FAULTS) + " |",
             "|---|" + "---|" * len(FLAKY_FAULTS)]
    for command in FLAKY_COMMANDS:
        marks = [FLAKY[command][fault].mark for fault in FLAKY_FAULTS]
        lines.append(f"| {command} | " + " | ".join(marks) + " |")
    lines.append("")
    for command in FLAKY_COMMANDS:
        for fault in FLAKY_FAULTS:
            names = "; ".join(f"{tier} {name}" for tier, name in FLAKY[command][fault].tests)
            lines.append(f"- {command} × {fault}: {names}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
    print()
    print(flaky_table())
