"""``bench/sampler_compare.py`` (issue 26) runs end to end, one short round at beta 0, so the sampler
section of ``bench/RESULTS.md`` cannot rot: its four workers start (TRL 1.16's needs
``.envs/trl116``), the compiled decode draws the tokens of the dynamic one, and the floor is the sum
it says. Untimed: the figures come from ``python tools/run_bench.py``; the SmolLM2 runs need the
pretrained model and are left out here (``--no-smollm2``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import sampler_compare
from tests.thirdparty_env import thirdparty_python

ROOT = Path(__file__).resolve().parent.parent


def test_one_round_at_beta_0_writes_its_figures(tmp_path: Path) -> None:
    thirdparty_python("trl116")  # TRL's worker; skips without it, fails under PPO_REF_REQUIRE_ENVS=1
    out = tmp_path / "sampler.json"
    command = [sys.executable, "bench/sampler_compare.py", "--rounds", "1", "--block", "1", "--warmup", "1"]
    command += ["--betas", "0", "--no-smollm2", "--out", str(out)]
    done = subprocess.run(
        command, cwd=ROOT, env={**os.environ, "PPO_REF_BENCH_THREADS": "2"}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["command"] == "python bench/sampler_compare.py " + " ".join(command[2:])
    assert "smollm2" not in data and [run["beta"] for run in data["betas"]] == [0.0]
    run = data["betas"][0]
    assert run["ready"]["decode"]["same_tokens_as_dynamic"] == {
        "dynamic": True,
        "static": True,
        "static-compiled": True,
    }
    (record,) = run["rounds"]
    assert set(record["decode"]) == {"generate", *sampler_compare.MODES}
    assert all(len(record[name]) == 1 for name in ("dynamic", "static-compiled", "trl"))
    floor = run["floor"]
    assert floor["decode_seconds"] == record["decode"]["static-compiled"]
    assert floor["seconds"] == pytest.approx(
        floor["decode_seconds"] + floor["forward_seconds"] + floor["update_seconds"]
    )
    assert floor["trl_over_floor"] == pytest.approx(record["trl"][0] / floor["seconds"])
    assert 0 < floor["update_seconds"] < max(record["static-compiled"])  # a stage of that iteration


def test_the_smollm2_command_is_the_readme_preset_with_the_sampler() -> None:
    command = sampler_compare.smollm2_command("static-compiled", 3, 16, "/tmp/out")
    assert Path(command[0]).name == "ppo-ref" and Path(command[0]).parent == Path(sys.executable).parent
    assert command[1:] == [
        "train",
        "--task",
        "smollm2-sentiment",
        "--iterations",
        "3",
        "--sampler",
        "static-compiled",
        "--eval-samples",
        "16",
        "--no-plots",
        "--out",
        "/tmp/out",
    ]
