"""openrlhf-2: GAE runs through the holes that OpenRLHF's multi-turn agent leaves in ``action_mask``.

Interpreter: .envs/openrlhf/bin/python findings/repro/openrlhf-2.py (run from the repository root;
standalone: ``pip install openrlhf==0.11.2 deepspeed==0.19.6 ray==2.55.0 peft transformers==5.15.0
aiohttp`` on CPU, no flash-attn / vllm / Pillow needed).

Drives OpenRLHF 0.11.2's own multi-turn agent path, as ``--train.agent_func_path`` runs it:
- the command line of ``openrlhf/cli/train_ppo_ray.py`` (its real parser and checks; ``train`` is
  stopped at its first line), at the defaults and at the triggering setting;
- ``MultiTurnAgentExecutor.execute`` (``utils/agent.py``) with a two-turn environment, a
  word-level tokenizer built in-process and a scripted engine standing in for vLLM's;
- ``SamplesGenerator._process_response_into_experience`` (``action_mask`` is 1 on the agent's action
  ranges only: the environment's feedback tokens between the turns are a hole);
- ``RemoteExperienceMaker.split_rollout_samples`` and ``compute_advantages_and_returns`` (what
  ``make_experience_batch`` calls), estimator ``gae`` (the default), advantages whitened (the default).
The critic's values are a fixed ramp (standing in for the critic's forward) and the KL is 0 (step 1:
the actor is the reference).

Spec GAE-2: a hole is skipped, one discount per action token:
  A_t = r_t + gamma * V_next(t) - V_t + gamma * lambd * A_next(t), next(t) = the next action token
  (V = 0 and A = 0 after the last one), reward = the score on the last action token;
then whitened over the action tokens as OpenRLHF does. Computed inline below with plain torch.
OpenRLHF's ``get_advantages_and_returns`` (``trainer/ppo_utils/experience_maker.py:377``) zeroes
values and rewards at the hole and runs the recursion through it, so each hole token is a step with
V = 0: the last action token before the hole bootstraps from 0 and the next turn's value arrives
discounted by (gamma * lambd) per hole token.

Defaults (``--algo.advantage.gamma 1 --algo.advantage.lambd 1``): the sums telescope and the action
tokens' advantages are right (expected == got). Triggering setting: ``--algo.advantage.lambd 0.95``
(also ``--algo.advantage.gamma`` below 1): wrong. Exit 1 when the triggering setting's advantages
differ from the expected ones by more than 1e-4, else 0.
"""

from __future__ import annotations

# --- Import stand-ins ------------------------------------------------------------------------
# OpenRLHF 0.11.2 imports packages at module level that this CPU-only reproduction never calls:
#   flash_attn (models/ring_attn_utils.py:3-4): sequence packing / ring attention, used only with
#     --ds.packing_samples (off by default; this script passes unpacked batches);
#   vllm (trainer/ray/vllm_engine.py:7-12, trainer/ppo_utils/samples_generator.py:7): the rollout
#     engine; the rollout is not what is reproduced here (the model under training is driven directly);
#   PIL (utils/vlm_utils.py:13, imported by trainer/ray/ppo_actor.py:27): image inputs of
#     vision-language models; text-only batches never reach it.
# flash-attn and vllm need CUDA to install; Pillow is not pulled in without vllm. Each stand-in
# module holds only the names OpenRLHF imports from it, and each name raises when called. The
# finder is appended to the END of sys.meta_path, so a real installation always wins, and the
# Pillow stand-in is removed again as soon as openrlhf.utils.vlm_utils has imported, so that
# transformers still finds Pillow absent.
import importlib.abc
import importlib.machinery
import importlib.util
import sys

_STAND_INS = {
    "flash_attn": (),
    "flash_attn.bert_padding": ("index_first_axis", "pad_input", "rearrange", "unpad_input"),
    "flash_attn.utils": (),
    "flash_attn.utils.distributed": ("all_gather",),
    "vllm": ("SamplingParams", "LLM"),
    "vllm.inputs": ("TokensPrompt",),
    "vllm.utils": ("random_uuid",),
}


class _Unusable:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{self.name} is an import stand-in of this script; the real package is absent")


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _STAND_INS:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        for name in _STAND_INS[module.__name__]:
            setattr(module, name, _Unusable(f"{module.__name__}.{name}"))


sys.meta_path.append(_StandInFinder())
import openrlhf.utils  # noqa: E402  (transformers settles its Pillow check here, without the stand-in)

if importlib.util.find_spec("PIL") is None:
    _STAND_INS.update({"PIL": (), "PIL.Image": ("Image",)})
    import openrlhf.utils.vlm_utils

    for _name in ("PIL.Image", "PIL"):
        del _STAND_INS[_name], sys.modules[_name]
# ----------------------------------------------------------------------------------------------

import asyncio  # noqa: E402
import runpy  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import ray  # noqa: E402
import torch  # noqa: E402
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # noqa: E402
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController  # noqa: E402
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator  # noqa: E402
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402


class _Parsed(Exception):
    pass


def cli_args(*argv: str) -> SimpleNamespace:
    """The args ``openrlhf/cli/train_ppo_ray.py`` builds from ``argv`` (parser and checks as is)."""

    def stop(args: SimpleNamespace) -> None:
        raise _Parsed(args)

    is_initialized, get_strategy = ray.is_initialized, openrlhf.utils.get_strategy
    ray.is_initialized = lambda: True  # train()'s first line: do not start a Ray cluster
    openrlhf.utils.get_strategy = stop  # train()'s second line: hand the parsed args back
    saved_argv, sys.argv = sys.argv, ["train_ppo_ray", *argv]
    try:
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")
    except _Parsed as parsed:
        return parsed.args[0]
    finally:
        sys.argv = saved_argv
        ray.is_initialized, openrlhf.utils.get_strategy = is_initialized, get_strategy
    raise RuntimeError("train_ppo_ray did not reach train()")


WORDS = ["<pad>", "<unk>", "q1", "q2", "q3", "a1", "a2", "f1", "f2", "b1", "b2"]
_word_level = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
_word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=_word_level, pad_token="<pad>", unk_token="<unk>")


class ScriptedEngine:
    """Stands in for the vLLM engine the executor calls (``llm_engine.generate``): scripted turns."""

    def __init__(self) -> None:
        self.turns = [" a1 a2", " b1 b2"]

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        text = self.turns.pop(0)
        ids = tokenizer(text=text, add_special_tokens=False)["input_ids"]
        output = SimpleNamespace(token_ids=ids, text=text, finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[output])


class TwoTurnEnvironment(AgentInstanceBase):
    """A user's agent: tool feedback after turn 1, score 1.0 after turn 2."""

    def __init__(self) -> None:
        self.turn = 0

    async def step(self, state_dict, **kwargs):
        self.turn += 1
        done = self.turn == 2
        return {
            "rewards": torch.tensor(1.0 if done else 0.0),
            "scores": torch.tensor(1.0 if done else 0.0),
            "environment_feedback": "" if done else " f1 f2",
            "done": done,
        }


class AgentExecutor(MultiTurnAgentExecutor):  # what a --train.agent_func_path file defines
    def __init__(self) -> None:
        super().__init__(TwoTurnEnvironment)


def run(*argv: str) -> tuple[torch.Tensor, torch.Tensor, SimpleNamespace]:
    args = cli_args("--actor.model_name_or_path", "tiny", "--train.agent_func_path", "agent.py", *argv)
    sampling = SimpleNamespace(max_tokens=None, logprobs=None)  # vllm.SamplingParams' two fields read
    response = asyncio.run(
        AgentExecutor().execute("q1 q2 q3", "", sampling, args.data.max_len, tokenizer, ScriptedEngine())
    )
    generator = object.__new__(SamplesGenerator)
    sample = generator._process_response_into_experience(response, max_len=args.data.max_len)
    kl_controller = FixedKLController(args.algo.kl.init_coef)
    # No Ray model groups: the model forwards of make_experience are replaced by the two lines below.
    strategy = SimpleNamespace(args=args)
    maker = RemoteExperienceMaker(None, None, None, None, kl_controller, strategy, tokenizer)
    (experience,) = maker.split_rollout_samples([sample])
    mask = experience.action_mask
    experience.values = torch.linspace(0.1, 0.8, mask.shape[1]).unsqueeze(0)  # the critic's values
    experience.kl = torch.zeros(mask.shape, dtype=torch.float32)  # step 1: actor == reference
    (experience,) = maker.compute_advantages_and_returns([experience])
    return experience.advantages, mask, args


def expected_advantages(values: torch.Tensor, mask: torch.Tensor, score: float, gamma: float, lambd: float):
    actions = mask[0].nonzero().flatten().tolist()
    adv = torch.zeros(values.shape[1], dtype=torch.float64)
    next_value, next_adv = 0.0, 0.0
    for position in reversed(actions):
        reward = score if position == actions[-1] else 0.0
        value = float(values[0, position])
        delta = reward + gamma * next_value - value
        adv[position] = delta + gamma * lambd * next_adv
        next_value, next_adv = value, float(adv[position])
    on = adv[actions]
    return ((on - on.mean()) / on.var(unbiased=False).clamp(min=1e-8).sqrt()).tolist()


wrong = False
for label, argv in (
    ("defaults (gamma 1, lambd 1)", ()),
    ("--algo.advantage.lambd 0.95", ("--algo.advantage.lambd", "0.95")),
    ("--algo.advantage.gamma 0.99", ("--algo.advantage.gamma", "0.99")),
):
    got, mask, args = run(*argv)
    adv = args.algo.advantage
    print(
        f"{label}: estimator {adv.estimator}, gamma {adv.gamma}, lambd {adv.lambd}, "
        f"action_mask {mask.int().tolist()}"
    )
    values = torch.linspace(0.1, 0.8, mask.shape[1]).unsqueeze(0)
    expected = expected_advantages(values, mask, 1.0, adv.gamma, adv.lambd)
    got_on = got[0][mask[0].bool()].tolist()
    differs = max(abs(g - e) for g, e in zip(got_on, expected, strict=True)) > 1e-4
    shown_expected, shown_got = [round(v, 4) for v in expected], [round(v, 4) for v in got_on]
    print(f"  advantages on the action tokens: expected {shown_expected} got {shown_got}")
    if differs and label.startswith("--algo.advantage.lambd"):
        wrong = True

sys.exit(1 if wrong else 0)
