"""``ppo-ref step-check`` (ppo_ref.adapters.step_check, issue 21): the step tier at a user's settings.

Here, without TRL or verl: the config reading, the one-line errors and exit status 2. In
``.envs/trl116`` and ``.envs/verl`` (marked thirdparty): the README's commands as typed, their
verdicts and words (the bnpo split measured at 19.7%: a declared convention; GPT-2's position ids
under prompt padding: STEP-3; verl's width normaliser: STEP-3; its length-only overlong penalty:
STEP-5's declared convention), a checkpoint's config.json of a rotary family passing STEP-3, and an
unknown key.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ppo_ref.adapters.step_check import StepCheck, load_config, main, step_check
from tests.docs_text import section
from tests.thirdparty_env import thirdparty_python

ROOT = Path(__file__).resolve().parent.parent


def test_load_config_reads_json_and_yaml_and_names_the_file_when_it_cannot(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"loss_type": "bnpo"}')
    (tmp_path / "b.yaml").write_text("loss_agg_mode: token-mean\nclip_ratio_high: 0.28\n")
    assert load_config(str(tmp_path / "a.json")) == {"loss_type": "bnpo"}
    assert load_config(str(tmp_path / "b.yaml")) == {"loss_agg_mode": "token-mean", "clip_ratio_high": 0.28}
    (tmp_path / "c.json").write_text('{"loss_type": ')
    (tmp_path / "d.yaml").write_text("- a list\n")
    for name, words in (
        ("c.json", "not valid JSON"),
        ("d.yaml", "must hold a mapping"),
        ("e.json", "cannot read"),
    ):
        with pytest.raises(ValueError, match=r"^config: ") as caught:
            load_config(str(tmp_path / name))
        assert words in str(caught.value) and name in str(caught.value)


def test_bad_input_is_one_line_naming_it_with_exit_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["--impl", "trl116", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ppo-ref step-check: error: config:") and "\n" not in err
    with pytest.raises(ValueError, match=r"^impl:"):
        step_check("openrlhf")
    with pytest.raises(ValueError, match=r"^padding_side:"):
        step_check("trl116", {}, padding_side="up")
    report = StepCheck("header", notes=["a note"])
    assert report.lines() == ["header", "  a note", "0 of 0 clauses fail at these settings"]


@pytest.mark.skipif(importlib.util.find_spec("trl") is not None, reason="TRL is installed here")
def test_a_library_that_is_not_installed_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--impl", "trl116"]) == 2
    assert "impl: trl116 is not installed here" in capsys.readouterr().err


def _readme_block() -> list[str]:
    text = section("At your own settings: `ppo-ref step-check`")  # docs/step-tier.md
    block = re.search(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    assert block is not None
    return block.group(1).splitlines()


def _environment(env: str) -> dict[str, str]:
    bin_dir = str(thirdparty_python(env).parent)  # skips where .envs/ENV is missing
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    return {
        **base,
        "PATH": bin_dir + os.pathsep + base.get("PATH", ""),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.thirdparty
def test_the_readme_step_check_commands_as_typed(tmp_path: Path) -> None:
    lines = _readme_block()
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    for line in lines:
        impl = re.search(r"--impl (\S+)", line)
        env = _environment("trl116" if impl is None or impl.group(1) == "trl116" else impl.group(1))
        done = subprocess.run(
            ["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        if impl is None:
            assert done.returncode == 0, done.stderr
        else:
            outputs[impl.group(1)] = done
    assert set(outputs) == {"trl116", "verl"}
    trl = outputs["trl116"]
    assert trl.returncode == 1, trl.stdout + trl.stderr[-3000:]
    step2 = "STEP-2 declared convention: the gradient changes by 19.7% between 1 and 4 micro-batches"
    assert f"{step2} with loss_type bnpo" in trl.stdout
    assert (
        "STEP-3 FAIL: one extra column of left padding on the prompts changes the gradient by" in trl.stdout
    )
    assert trl.stdout.rstrip().endswith("1 of 5 clauses fail at these settings (STEP-3)")
    verl = outputs["verl"]
    assert verl.returncode == 1, verl.stdout + verl.stderr[-3000:]
    assert "settings applied: clip_ratio_high=0.28" in verl.stdout
    assert "3 extra padding columns on the completions change the gradient by 33.3%" in verl.stdout
    assert "STEP-5 declared convention: every row's reward is its score plus a penalty of its length" in (
        verl.stdout
    )
    assert verl.stdout.rstrip().endswith("1 of 5 clauses fail at these settings (STEP-3)"), verl.stdout
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 768}))
    command = ["ppo-ref", "step-check", "--impl", "verl", "--config", "actor.yaml", "--model", "gpt2"]
    bad = subprocess.run(
        command, cwd=tmp_path, env=_environment("verl"), capture_output=True, text=True, timeout=600
    )
    assert bad.returncode == 2 and bad.stdout == "", bad.stdout + bad.stderr[-3000:]
    last = bad.stderr.strip().splitlines()[-1]
    assert last == "ppo-ref step-check: error: model: verl 0.9.1 cannot load a gpt2 model", last


CHECKPOINT = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}

FROM_PYTHON = """
import json, sys
from ppo_ref.adapters.step_check import step_check
report = step_check("trl116", {"loss_type": "grpo", "epsilon_high": 0.28}, model=sys.argv[1])
print("RESULT" + json.dumps({c.clause: c.verdict for c in report.clauses}) + "\\t" + report.header)
"""


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.thirdparty
def test_a_rotary_checkpoint_family_passes_step3_and_an_unknown_key_is_named(tmp_path: Path) -> None:
    env = _environment("trl116")
    (tmp_path / "config.json").write_text(json.dumps(CHECKPOINT))
    python = str(thirdparty_python("trl116"))
    done = subprocess.run(
        [python, "-c", FROM_PYTHON, str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-2000:]
    verdicts, header = line[len("RESULT") :].split("\t")
    assert json.loads(verdicts) == dict.fromkeys(("STEP-1", "STEP-2", "STEP-3", "STEP-4", "STEP-5"), "pass")
    assert "model family llama" in header
    (tmp_path / "typo.json").write_text('{"loss_typo": "bnpo"}')
    bad = subprocess.run(
        ["ppo-ref", "step-check", "--impl", "trl116", "--config", "typo.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines()[-1] == (
        "ppo-ref step-check: error: config: unknown GRPOConfig key 'loss_typo' (TRL 1.16.0)"
    )
    assert sys.executable  # the test itself runs in the main venv


def test_the_ppo_ref_command_routes_step_check_and_lists_it(capsys: pytest.CaptureFixture[str]) -> None:
    from ppo_ref.cli import main as cli_main

    assert cli_main(["step-check", "--impl", "trl116", "--config", "missing.json"]) == 2
    assert "config: cannot read 'missing.json'" in capsys.readouterr().err
    assert cli_main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert "train" in listed and "step-check" in listed
