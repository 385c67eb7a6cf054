"""The step-tier example (issue 21): ``examples/my_step_runner.py`` judges ``examples/my_trainer.py``.

- From the installed wheel, outside the checkout: the commands of the README section "Judging your
  trainer's step", as typed, in a directory holding only the example files; every STEP test passes.
- With the example trainer's normalisation broken on purpose (each micro-batch divided by its own
  token count and the accumulation steps: a mean of micro-batch means), STEP-2 fails, by the size
  measured, and nothing else does.

The wheel's environment is a fresh venv holding the wheel alone, with the checkout venv's
site-packages appended to its path for torch and transformers (so no download and no install of
them: seconds, not minutes); ppo-ref itself must import from the venv, never from the checkout.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_text import section

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("my_trainer.py", "my_step_runner.py", "my_ppo_adapter.py")
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

BROKEN = """
import my_trainer
from my_step_runner import make_adapter  # noqa: F401

# the common bug: each micro-batch normalised by its own token count, divided by the accumulation steps
my_trainer.loss_denominator = lambda batch_mask, micro_mask, steps: micro_mask.sum().clamp(min=1) * steps
"""


def _run(
    command: list[str], cwd: Path, env: dict[str, str], ok: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)
    if ok:
        assert done.returncode == 0, f"{command}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PPO_REF_IMPL")}
    return {**env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def _readme_commands() -> list[str]:
    text = section("Judging your trainer's step", subsections=False)  # docs/step-tier.md
    block = re.search(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.startswith("python -m pytest")]


def test_the_readme_commands_judge_the_example_trainer_from_the_installed_wheel(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "ppo_ref_entry.py"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    for name in ("ppo_ref", "conformance", "spec"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = _environment()
    wheels = tmp_path / "wheels"
    pip_wheel = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        ".",
        "-w",
        str(wheels),
    ]
    _run(pip_wheel, source, env)
    (wheel,) = wheels.glob("ppo_ref-*.whl")
    venv = tmp_path / "venv"
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], tmp_path, env)
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], tmp_path, env)
    venv_site = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env
    )
    (Path(venv_site.stdout.strip()) / "checkout-deps.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n", encoding="utf-8"
    )
    user = tmp_path / "users_repo"
    user.mkdir()
    for name in EXAMPLES:
        shutil.copy2(ROOT / "examples" / name, user / name)
    where = _run(
        [
            python,
            "-c",
            "import ppo_ref, ppo_ref_conformance; print(ppo_ref.__file__, ppo_ref_conformance.__file__)",
        ],
        user,
        env,
    )
    for path in where.stdout.split():
        assert Path(path).is_relative_to(venv), f"{path} is not the installed wheel"
    commands = _readme_commands()
    assert commands, "the section documents no python -m pytest command"
    for command in commands:
        words = shlex.split(command)
        done = _run([python, *words[1:], "-p", "no:cacheprovider"], user, env)
        assert re.search(r"\b9 passed\b", done.stdout), done.stdout[-3000:]
        assert "ppo-ref conformance: --impl=my_step_runner:make_adapter -> my-trainer 0.1" in done.stdout


def test_the_example_trainer_with_micro_batch_normalisation_fails_step2_only(tmp_path: Path) -> None:
    (tmp_path / "broken_runner.py").write_text(BROKEN, encoding="utf-8")
    env = _environment(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "examples")]))
    command = [
        sys.executable,
        "-m",
        "pytest",
        "conformance/test_step_tier.py",
        "--impl=broken_runner:make_adapter",
    ]
    done = _run([*command, "-q", "-p", "no:cacheprovider", "-rfE", "--tb=short"], ROOT, env, ok=False)
    failed = set(re.findall(r"^FAILED conformance/test_step_tier.py::(\S+)", done.stdout, re.MULTILINE))
    assert failed == {f"test_step2_micro_batches_give_the_whole_batch_gradient[{k}]" for k in (2, 4)}, (
        done.stdout[-3000:]
    )
    assert re.search(r"\b7 passed\b", done.stdout), done.stdout[-3000:]
    relative = [
        float(x) for x in re.findall(r"micro-batches moved the gradient .*?relative (\S+) >", done.stdout)
    ]
    assert relative and min(relative) > 1e-2, relative  # far above the 1e-5 tolerance


def test_the_example_training_loop_samples_scores_and_steps() -> None:
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import my_trainer
    finally:
        sys.path.remove(str(ROOT / "examples"))
    from ppo_ref.adapters.step_kit import tiny_config, tiny_model, word_tokenizer

    torch.manual_seed(0)
    model, tokenizer = tiny_model(tiny_config("gpt2"), 0), word_tokenizer(16)
    before = [p.detach().clone() for p in model.parameters()]
    stats = my_trainer.train(model, tokenizer, ["t3 t4", "t5"], lambda texts: [t.count("t7") for t in texts])
    assert stats["max_abs_log_ratio"] < 1e-5 and len(stats["losses"]) == 2  # 8 rows, micro-batches of 4
    assert stats["loss_mask"].shape[0] == 8 and stats["loss_mask"].sum() > 0
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
