"""openrlhf-f2 (convention): under ``--actor.policy_loss_type gspo`` ``ppo_clip_ratio`` is a token share.

Interpreter: .envs/openrlhf/bin/python findings/repro/openrlhf-f2.py (run from the repository root;
standalone: ``pip install openrlhf==0.11.2 deepspeed==0.19.6 ray==2.55.0 peft transformers==5.15.0
aiohttp`` on CPU, no flash-attn / vllm / Pillow needed).

Drives ``ActorPPOTrainer.training_step`` (``openrlhf/trainer/ray/ppo_actor.py:259``) on an
``openrlhf.models.Actor`` loaded from a tiny Llama saved in a temporary directory (bf16, the default;
eager attention: no flash-attn on CPU), with the args ``openrlhf/cli/train_ppo_ray.py`` builds (its
real parser and checks; ``train`` is stopped at its first line), and reads the ``ppo_clip_ratio``
metric it returns. DeepSpeed's engine is replaced by a stand-in strategy (``loss.backward()``, no
optimizer step). The micro-batch is built by ``make_experience_batch`` (the replay buffer's collate,
right padding) from two sequences: 4 response tokens with old log-probs 0.5 below the actor's
(GSPO ratio s = exp(mean 0.5) = 1.6487 > 1 + 0.2, advantage 1: clipped) and 1 response token with
old = actor (s = 1: not clipped).

Spec GSPO-3: the share of sequences on the flat branch, 1 of 2 = 0.5. OpenRLHF logs
``masked_mean(surr2 < surr1)`` over tokens (``models/loss.py:257``): 4 of 5 = 0.8. That token share is
the statistic the GSPO paper itself reports (Zheng et al. 2025, arXiv:2507.18071: "a difference of
two orders of magnitude in the fractions of clipped tokens" between GSPO and GRPO), so the entry is
a convention, not a bug. With ``--actor.policy_loss_type ppo`` (the default) clipping is per token
and the token share is the spec's statistic too (expected 0.8).

Expected for the GSPO run: the paper's share of tokens (the convention); the spec's share of sequences
is printed next to it. Exit 1 while ``ppo_clip_ratio`` is the token share and differs from the share
of sequences (the behaviour the entry describes still appears, as every script here exits 1 for its
entry's behaviour; verl-f4's does so for verl's ``actor/pg_clipfrac``), 0 otherwise.
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
    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname not in _STAND_INS:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return None

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
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

import runpy  # noqa: E402
import tempfile  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import openrlhf.trainer.ray.ppo_actor as ppo_actor  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from openrlhf.models import Actor  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import Experience, make_experience_batch  # noqa: E402
from openrlhf.utils.loss_utils import iter_grad_accum_global_norm  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402


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


# ActorPPOTrainer.__init__ ends with torch.distributed.barrier() + torch.cuda.synchronize(): one CPU
# process has nothing to wait for.
ppo_actor.torch_dist_barrier_and_cuda_sync = lambda: None
# Its replay buffer asks for the current CUDA device; training_step does not read it (no dynamic
# batching): the experience is handed to training_step as ppo_train's loop hands each micro-batch.
ppo_actor.NaiveReplayBuffer = lambda *args, **kwargs: None


def make_strategy(args: SimpleNamespace) -> SimpleNamespace:
    """Stands in for DeepspeedStrategy: plain backward, no optimizer step (the gradient is read)."""
    return SimpleNamespace(
        args=args,
        ring_attn_group=None,
        accumulated_gradient=1,
        backward=lambda loss, model, optimizer: loss.backward(),
        optimizer_step=lambda *a, **k: None,
        get_grad_norm=lambda model: 0.0,
        is_rank_0=lambda: True,
    )


def run(actor_dir: str, *argv: str) -> tuple[float, torch.Tensor, torch.Tensor, SimpleNamespace]:
    args = cli_args(
        "--actor.model_name_or_path",
        actor_dir,
        "--reward.remote_url",
        "reward.py",
        "--ds.attn_implementation",
        "eager",
        *argv,
    )
    torch.manual_seed(0)
    actor = Actor(actor_dir, attn_implementation=args.ds.attn_implementation, param_dtype=args.ds.param_dtype)
    optimizer = torch.optim.SGD(actor.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    trainer = ppo_actor.ActorPPOTrainer(
        make_strategy(args),
        actor,
        None,
        optimizer,
        scheduler,
        micro_train_batch_size=args.train.micro_batch_size,
        eps_clip=args.actor.eps_clip,
    )

    def sample(tokens: list[int], prompt_length: int) -> Experience:
        mask = torch.arange(len(tokens) - 1) >= prompt_length - 1  # action_mask over the shifted tokens
        zeros = torch.zeros(len(tokens) - 1)
        return Experience(
            sequences=torch.tensor(tokens),
            attention_mask=torch.ones(len(tokens), dtype=torch.long),
            action_mask=mask,
            action_log_probs=zeros,
            advantages=zeros,
            info={},
        )

    experience = make_experience_batch([sample([3, 7, 4, 9, 5, 11], 2), sample([3, 7, 4], 2)])
    mask = experience.action_mask
    with torch.no_grad():
        logp = actor(experience.sequences, mask, attention_mask=experience.attention_mask)
    shift = torch.tensor([[0.5], [0.0]]) * mask  # first row: old log-probs 0.5 below the actor's
    experience.action_log_probs = logp - shift
    experience.advantages = mask.float()
    ((experience, loss_info),) = iter_grad_accum_global_norm(
        [experience], trainer.strategy, 1, lambda e: e.action_mask
    )
    status = trainer.training_step(experience, args.algo.kl.init_coef, 0, loss_info)
    return float(status["metrics"]["ppo_clip_ratio"]), shift, mask, args


def clipped_shares(
    shift: torch.Tensor, mask: torch.Tensor, args: SimpleNamespace, gspo: bool
) -> tuple[float, float]:
    """(share of sequences, share of tokens) on the flat branch (advantages +1: clipped = ratio > 1 + eps)."""
    high = 1 + args.actor.eps_clip_low_high[1]
    m = mask.double()
    log_ratio = shift.double()  # logp - old
    if gspo:
        s = torch.exp((log_ratio * m).sum(-1) / m.sum(-1))
        token_flags = (s > high).double().unsqueeze(-1) * m
    else:
        token_flags = (torch.exp(log_ratio) > high).double() * m
    rows = m.sum(-1) > 0
    sequence_flags = token_flags.sum(-1) > 0
    return float(sequence_flags[rows].double().mean()), float(token_flags.sum() / m.sum())


described = False
with tempfile.TemporaryDirectory() as actor_dir:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=16,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(actor_dir)
    for label, argv in (
        ("defaults (--actor.policy_loss_type ppo)", ()),
        ("--actor.policy_loss_type gspo", ("--actor.policy_loss_type", "gspo")),
    ):
        got, shift, mask, args = run(actor_dir, *argv)
        gspo = args.actor.policy_loss_type == "gspo"
        by_sequence, by_token = clipped_shares(shift, mask, args, gspo)
        print(f"{label}: action_mask {mask.int().tolist()}")
        if gspo:
            print(
                f"  ppo_clip_ratio: expected {by_token:.4f} (the GSPO paper's share of clipped tokens) got "
                f"{got:.4f}; the share of sequences (spec GSPO-3) is {by_sequence:.4f}"
            )
            described = abs(got - by_token) <= 1e-6 and abs(got - by_sequence) > 1e-6
        else:
            print(
                f"  ppo_clip_ratio: expected {by_token:.4f} (share of tokens, PPO clips tokens) got {got:.4f}"
            )

sys.exit(1 if described else 0)
