"""The recipes of the third-party environments: what ``tools/thirdparty_envs.py`` installs into each
``.envs/NAME`` (torch's pin, each library's pinned pip steps, the modules its check imports, the test
pins every environment shares). Data only; the builder that runs them is ``tools/thirdparty_envs.py``.

A recipe's :meth:`Recipe.digest` names what its environment was built from: an environment whose
recorded digest differs is rebuilt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

TORCH_PIN = "torch==2.13.0"
# What the 2.13.0 CPU wheel on disk reports as torch.__version__ (checked: "2.13.0+cpu").
TORCH_EXPECTED_VERSION = "2.13.0+cpu"
# Where this machine kind keeps the CPU wheel; pip also finds it through its find-links config.
TORCH_WHEEL_GLOBS = ("/opt/wheels/torch-2.13.0+cpu-cp311-*.whl",)
PYTHON_MAJOR_MINOR = (3, 11)  # the CPU wheel on disk is cp311

# What ppo-ref needs besides torch when installed with --no-deps (its core imports only torch).
PROJECT_EXTRAS = ("numpy", "pytest", "hypothesis")
# Their exact versions in every environment (issue 11, part 5): the suite's examples come from
# Hypothesis and its verdicts from pytest, so every environment runs the versions of ppo-ref's own
# .venv (the matrix records them as test_versions). Not part of the recipe digest: a changed pin
# makes the check fail and the environment is repaired in place (pip), not rebuilt.
TEST_PINS: dict[str, str] = {"numpy": "2.4.6", "pytest": "9.2.0", "hypothesis": "6.170.17"}


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    summary: str
    # pip install argument lists, run in order after torch and before ppo-ref.
    steps: tuple[tuple[str, ...], ...]
    # Modules that must import (the ones an adapter uses).
    imports: tuple[str, ...]
    # Modules tried and reported, but allowed to fail (e.g. need import stubs).
    probe_imports: tuple[str, ...] = ()
    # Environment variables for the check (and for anyone using the env).
    env: tuple[tuple[str, str], ...] = ()
    # Distributions whose versions the check reports.
    report: tuple[str, ...] = ()
    # Python code the check runs before the imports (a compatibility shim an adapter applies too).
    check_prelude: str = ""

    def digest(self) -> str:
        payload = json.dumps([TORCH_PIN, self.steps, PROJECT_EXTRAS, constraints_text()], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


HF_STACK_REPORT = ("transformers", "accelerate", "datasets", "tokenizers", "safetensors")

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        Recipe(
            name="trl",
            summary="TRL 1.12.0, the last release with trl.experimental.ppo",
            steps=(
                # A normal install with dependencies: trl 1.12 declares accelerate>=1.4,
                # datasets>=4.7, jinja2, packaging, transformers>=4.56.2; the pins below satisfy
                # those and ppo-ref's transformers>=5.17,<6.
                (
                    "trl==1.12.0",
                    "transformers==5.24.0",
                    "accelerate==1.15.0",
                    "datasets==5.2.0",
                ),
            ),
            imports=("trl", "trl.trainer.utils", "trl.experimental.ppo.ppo_trainer"),
            env=(("TRL_EXPERIMENTAL_SILENCE", "1"),),
            report=("trl", *HF_STACK_REPORT, "pandas", "pyarrow"),
        ),
        Recipe(
            name="trl116",
            summary="TRL 1.16.0, for the GRPOTrainer benchmark (bench/trl_grpo_iteration.py)",
            steps=(
                # A normal install with dependencies, the same HF stack as the trl env (and ppo-ref's
                # transformers>=5.17,<6), so the two benchmark sides differ only in the trainers.
                (
                    "trl==1.16.0",
                    "transformers==5.24.0",
                    "accelerate==1.15.0",
                    "datasets==5.2.0",
                ),
            ),
            imports=("trl", "trl.trainer.grpo_trainer", "trl.trainer.grpo_config"),
            env=(("TRL_EXPERIMENTAL_SILENCE", "1"),),
            report=("trl", *HF_STACK_REPORT, "pandas", "pyarrow"),
        ),
        Recipe(
            name="verl",
            summary="verl 0.9.1 without its declared dependencies (they would pull vllm/CUDA)",
            steps=(
                ("--no-deps", "verl==0.9.1"),
                # tensordict 0.14 instead of verl's declared <=0.10 (as measured in the research);
                # transformers inside verl's declared range >=5.5.3,<5.11.
                (
                    "tensordict==0.14.3",
                    "omegaconf==2.3.1",
                    "ray==2.51.1",
                    "codetiming==1.4.0",
                    "transformers==5.10.4",
                ),
                # what verl.trainer.ppo.ray_trainer (apply_kl_penalty: KL into the rewards) imports
                (
                    "torchdata==0.11.0",
                    "datasets==5.2.0",
                    "pillow==13.0.0",
                    "peft==0.21.2",
                    "cachetools==8.0.2",
                    "fastapi==0.165.0",
                    "uvicorn==0.54.0",
                    # verl.experimental.reward_loop (RewardLoopManager and its reward managers:
                    # the reward path verl 0.9.1's trainer uses) imports aiohttp at top level.
                    "aiohttp==3.14.5",
                ),
            ),
            imports=(
                "verl",
                "verl.trainer.ppo.core_algos",
                "verl.utils.torch_functional",
                "verl.trainer.ppo.ray_trainer",
                "verl.experimental.reward_loop",
                "verl.experimental.reward_loop.reward_manager.dapo",
            ),
            report=("verl", "tensordict", "omegaconf", "ray", "codetiming", *HF_STACK_REPORT),
        ),
        Recipe(
            name="openrlhf",
            summary="OpenRLHF 0.11.2 without flash-attn/vllm (no CUDA); deepspeed built here",
            steps=(
                ("--no-deps", "openrlhf==0.11.2"),
                # deepspeed's setup.py imports torch, so it must see the env's torch.
                ("setuptools==80.10.2", "wheel==0.48.0"),
                ("--no-build-isolation", "deepspeed==0.19.6"),
                (
                    "peft==0.21.2",
                    "einops==0.8.2",
                    "pylatexenc==2.11",
                    "torchdata==0.11.0",
                    "aiohttp==3.14.5",
                    # ray as declared; openrlhf.trainer.ppo_utils.experience_maker (GAE) imports it.
                    "ray==2.55.0",
                    "transformers==5.15.0",
                    "accelerate==1.15.0",
                    "datasets==5.2.0",
                    # openrlhf.trainer.ray.ppo_actor (ActorPPOTrainer.training_step, the findings'
                    # training path) imports utils/vlm_utils.py, which imports PIL at top level.
                    "pillow==13.0.0",
                ),
            ),
            imports=("openrlhf", "deepspeed"),
            # These import flash_attn / vllm at top level: they need the adapter's import stubs.
            probe_imports=(
                "openrlhf.models.loss",
                "openrlhf.models.utils",
                "openrlhf.trainer.ppo_utils.experience_maker",
                "openrlhf.trainer.ray.ppo_actor",
            ),
            report=("openrlhf", "deepspeed", "peft", "einops", "torchdata", *HF_STACK_REPORT),
        ),
        Recipe(
            name="torchrl",
            summary="TorchRL 0.14.1",
            steps=(("torchrl==0.14.1",),),
            imports=("torchrl", "torchrl.objectives", "torchrl.objectives.value.functional"),
            report=("torchrl", "tensordict"),
        ),
        Recipe(
            name="sb3",
            summary="Stable-Baselines3 2.9.2",
            steps=(("stable-baselines3==2.9.2",),),
            imports=("stable_baselines3", "stable_baselines3.common.buffers"),
            report=("stable-baselines3", "gymnasium"),
        ),
        Recipe(
            name="skyrl",
            summary="skyrl 0.4.0, skyrl-train now its extra (declares Python >=3.12, imports on 3.11)",
            steps=(
                ("--no-deps", "--ignore-requires-python", "skyrl==0.4.0"),
                # What skyrl.backends.skyrl_train.utils.ppo_utils and torch_utils import on the way
                # (the adapters' modules): skyrl/backends/__init__.py imports the Tinker backend
                # (pydantic, skyrl/tinker/types.py), ppo_utils imports ray, jaxtyping, loguru and
                # skyrl.train.config, which imports cloudpathlib, omegaconf and skyrl_gym (skyrl-gym
                # 0.4.0 and its declared func_timeout, pandas, requests). ray 2.57.0 as declared.
                (
                    "jaxtyping==0.3.11",
                    "loguru==0.7.3",
                    "omegaconf==2.3.1",
                    "ray==2.57.0",
                    "cloudpathlib==0.26.0",
                    "pydantic==2.14.4",
                    "skyrl-gym==0.4.0",
                    "func_timeout==4.3.5",
                    "pandas==3.1.1",
                    "requests==2.34.2",
                ),
                # What the training path imports at top level (the worker, skyrl.train.trainer, the
                # generators' utils and SkyRLGymGenerator): the skyrl-train extra's dependencies that
                # install without CUDA (not flash-attn, vllm, vllm-router, nixl, s5cmd), at the pins
                # the extra declares (peft 0.18.1, hydra-core 1.3.4) and transformers inside the
                # declared range >=5.6.1,<=5.16.1.
                (
                    "tqdm==4.70.1",
                    "transformers==5.16.1",
                    "accelerate==1.16.0",
                    "peft==0.18.1",
                    "hydra-core==1.3.4",
                    "datasets==4.0.0",
                    "tensordict==0.15.3",
                    "torchdata==0.11.0",
                    "fastapi==0.165.0",
                    "uvicorn==0.55.0",
                    "orjson==3.13.0",
                    "pybase64==1.5.1",
                ),
            ),
            # On Python 3.11, pydantic refuses skyrl/tinker/types.py's `typing.TypedDict` (it wants
            # typing_extensions.TypedDict below Python 3.12), and skyrl/backends/__init__.py imports
            # that module: every skyrl.backends import fails. The adapter (skyrl.py
            # _import_tinker_types) and the check import that one module with typing.TypedDict
            # bound to typing_extensions.TypedDict, then restore it.
            check_prelude=(
                "import typing, typing_extensions\n"
                "_td = typing.TypedDict\n"
                "typing.TypedDict = typing_extensions.TypedDict\n"
                "try:\n"
                "    import skyrl.tinker.types\n"
                "finally:\n"
                "    typing.TypedDict = _td\n"
            ),
            imports=(
                "skyrl",
                "skyrl.backends.skyrl_train.utils.ppo_utils",
                "skyrl.backends.skyrl_train.utils.torch_utils",
                "skyrl.backends.skyrl_train.workers.worker",
                "skyrl.backends.skyrl_train.training_batch",
                "skyrl.train.trainer",
                "skyrl.train.generators.utils",
                "skyrl.train.generators.skyrl_gym_generator",
            ),
            # imports flash_attn.bert_padding at top level (flash-attn needs CUDA): needs a stand-in
            probe_imports=("skyrl.backends.skyrl_train.workers.model_wrapper",),
            report=("skyrl", "skyrl-gym", "jaxtyping", "loguru", "ray", "pydantic", *HF_STACK_REPORT),
        ),
        Recipe(
            name="rlinf",
            summary="RLinf 0.3.0 without its declared dependencies (sglang/vllm/wandb), transformers 4.57",
            steps=(
                ("--no-deps", "rlinf==0.3.0"),
                # What rlinf.algorithms (advantages, losses, kl_penalty, the aggregations) imports
                # on the way: rlinf/__init__.py registers an omegaconf resolver, rlinf.utils.utils
                # imports rlinf.scheduler (ray), algorithms/toolcall_parsers.py imports regex.
                # ray 2.51.1 as in the verl and skyrl envs (rlinf declares ray[default]>=2.47).
                ("omegaconf==2.3.1", "ray==2.51.1", "regex==2026.11.19"),
                # The step runner's FSDPActor (rlinf/workers/actor/fsdp_actor_worker.py): its FSDP model
                # manager imports transformers' AutoModelForVision2Seq (fsdp_model_manager.py:26; gone in
                # transformers 5, so 4.x, outside ppo-ref's >=5.17 as verl's 5.10.4 is) and
                # hybrid_engines/fsdp/utils.py:35 imports accelerate.
                ("transformers==4.57.6", "accelerate==1.16.0"),
            ),
            imports=(
                "rlinf",
                "rlinf.algorithms.advantages",
                "rlinf.algorithms.losses",
                "rlinf.algorithms.utils",
                "rlinf.utils.utils",
                "rlinf.workers.actor.fsdp_actor_worker",
            ),
            report=("rlinf", "omegaconf", "ray", "regex", *HF_STACK_REPORT),
        ),
        Recipe(
            name="swift",
            summary="ms-swift 4.6.0 (ModelScope SWIFT) with its declared dependencies, plus msgspec",
            steps=(
                # A normal install with dependencies (trl, transformers, peft, accelerate, datasets,
                # modelscope, ...); the pins are what it resolved to on 2026-12-03, inside ppo-ref's
                # transformers>=5.17,<6.
                ("ms-swift==4.6.0", "trl==0.29.1", "transformers==5.19.0"),
                # swift/rlhf_trainers/utils.py imports msgspec at top level, which ms-swift 4.6.0 does
                # not declare (pip check is clean without it, the import fails).
                ("msgspec==0.23.0",),
            ),
            imports=(
                "swift",
                "swift.rl_core.advantage",
                "swift.rlhf_trainers.utils",
                "swift.rlhf_trainers.grpo_trainer",
                "trl.trainer.utils",
            ),
            report=("ms-swift", "trl", "msgspec", "peft", "modelscope", *HF_STACK_REPORT),
        ),
    ]
}


def constraints_text() -> str:
    """The constraints file every pip call gets: nothing may replace the CPU torch."""
    return f"# written by tools/thirdparty_envs.py: nothing may replace the CPU torch\n{TORCH_PIN}\n"
