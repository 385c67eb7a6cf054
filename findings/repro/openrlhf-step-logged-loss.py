"""openrlhf-step-logged-loss (metrics-only): ``ppo_train`` logs ``policy_loss`` as a token-weighted mean of
micro-batch losses that are already shares of the optimizer step's global mean, so with gradient
accumulation and uneven micro-batch token counts the logged number is not the loss that is optimised.

Interpreter: .envs/openrlhf/bin/python findings/repro/openrlhf-step-logged-loss.py (run from the
repository root; standalone: ``pip install openrlhf==0.11.2 deepspeed==0.19.6 ray==2.55.0 peft
transformers==5.15.0 aiohttp`` on CPU, no flash-attn / vllm / Pillow needed).

Drives ``ActorPPOTrainer.ppo_train`` (``openrlhf/trainer/ray/ppo_actor.py:153-257``: the DataLoader over
its ``NaiveReplayBuffer``, ``iter_grad_accum_global_norm`` (``utils/loss_utils.py:80-105``) and
``training_step``) on an ``openrlhf.models.Actor`` loaded from a tiny Llama saved in a temporary
directory (bf16, the default; eager attention), with the args ``openrlhf/cli/train_ppo_ray.py`` builds
(its real parser and checks; ``train`` is stopped at its first line). One optimizer step over 4 rows
of 1, 2, 3 and 6 response tokens (N = 12), old log-probs = the actor's (step 0: ratio 1), advantages
+1, -0.5, +0.5, -1 per row. DeepSpeed's engine is replaced by a stand-in strategy whose ``backward``
divides the loss by gas as ``DeepSpeedEngine.backward`` does (``deepspeed/runtime/engine.py:3337`` in
0.19.6) and whose ``all_reduce`` is the identity (one process); ``torch.cuda.current_device`` answers
0 while the trainer builds its replay buffer (whose ``target_device`` only ``sample()`` reads) and
"cpu" in ``ppo_train``; ``torch.cuda.synchronize`` does nothing.

Setting that triggers it: gradient accumulation (``--train.batch_size`` > ``--train.micro_batch_size``
x world size; the defaults 128 and 1 give gas 128 per GPU) with micro-batches of unequal token counts.
Contrast: ``--train.micro_batch_size`` = ``--train.batch_size`` (gas 1), where the logged value is the
objective. The gradient is not affected (every micro-batch is normalised by the step's global counts,
which DeepSpeed's 1/gas cancels; the conformance suite's STEP-2 passes for OpenRLHF).

Expected: the logged ``policy_loss`` is the optimised objective, the token-mean surrogate over the
step, -(1/N) sum_t A_t = -(1 - 1 + 1.5 - 6)/12 = 0.375 at ratio 1 (the sum of the micro-batches'
backward losses; also what the gas-1 run logs). Got with micro-batch size 1 (gas 4): the token-weighted
mean of the per-micro-batch ``actor_loss`` values (each gas x its share of the global mean),
sum_i gas (S_i / N)(n_i / N) with S_i = -sum of row i's advantages.

Exit status: 1 while the gas-4 run logs a ``policy_loss`` other than the objective (> 1e-3 apart), 0
otherwise.
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
torch.cuda.synchronize = lambda *args, **kwargs: None

PROMPT = [3, 7]
ROWS = [([4], 1.0), ([9, 5], -0.5), ([11, 6, 8], 0.5), ([12, 13, 10, 4, 9, 5], -1.0)]  # (response, A)


def make_strategy(args: SimpleNamespace, gas: int) -> SimpleNamespace:
    """Stands in for DeepspeedStrategy on one CPU process: DeepSpeed's backward (loss / gas), no
    optimizer step, all_reduce of one process (the identity)."""
    return SimpleNamespace(
        args=args,
        ring_attn_group=None,
        accumulated_gradient=gas,
        backward=lambda loss, model, optimizer: (loss / gas).backward(),
        optimizer_step=lambda *a, **k: None,
        get_grad_norm=lambda model: 0.0,
        is_rank_0=lambda: True,
        all_reduce=lambda data, op="mean": data,
    )


def run(actor_dir: str, micro: int) -> tuple[float, list[float]]:
    """ppo_train's logged policy_loss, and the losses handed to backward (after DeepSpeed's 1/gas)."""
    batch = len(ROWS)
    args = cli_args(
        "--actor.model_name_or_path",
        actor_dir,
        "--reward.remote_url",
        "reward.py",
        "--ds.attn_implementation",
        "eager",
        "--train.micro_batch_size",
        str(micro),
        "--train.batch_size",
        str(batch),
    )
    gas = batch // micro
    torch.manual_seed(0)
    actor = Actor(actor_dir, attn_implementation=args.ds.attn_implementation, param_dtype=args.ds.param_dtype)
    optimizer = torch.optim.SGD(actor.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    strategy = make_strategy(args, gas)
    backward_losses: list[float] = []
    plain_backward = strategy.backward

    def backward(loss: torch.Tensor, model: object, optimizer: object) -> None:
        backward_losses.append(float(loss.detach()) / gas)
        plain_backward(loss, model, optimizer)

    strategy.backward = backward
    current_device = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0  # NaiveReplayBuffer.__init__: its target_device
    try:
        trainer = ppo_actor.ActorPPOTrainer(
            strategy,
            actor,
            None,
            optimizer,
            scheduler,
            micro_train_batch_size=args.train.micro_batch_size,
            eps_clip=args.actor.eps_clip,
            dataloader_pin_memory=False,
        )
    finally:
        torch.cuda.current_device = current_device
    items = []
    for response, advantage in ROWS:
        tokens = PROMPT + response
        mask = torch.arange(len(tokens) - 1) >= len(PROMPT) - 1  # action_mask over the shifted tokens
        items.append(
            Experience(
                sequences=torch.tensor(tokens),
                attention_mask=torch.ones(len(tokens), dtype=torch.long),
                action_mask=mask,
                action_log_probs=torch.zeros(len(tokens) - 1),
                advantages=mask.float() * advantage,
                info={},
            )
        )
    experience = make_experience_batch(items)
    with torch.no_grad():  # old log-probs: the actor's own (step 0, ratio 1)
        actor.eval()
        experience.action_log_probs = actor(
            experience.sequences, experience.action_mask, attention_mask=experience.attention_mask
        )
    trainer.replay_buffer.append(experience)
    torch.cuda.current_device = lambda: "cpu"  # ppo_train moves each micro-batch to this device
    try:
        status = trainer.ppo_train(0.0)
    finally:
        torch.cuda.current_device = current_device
    return float(status["policy_loss"]), backward_losses


tokens = sum(len(response) for response, _ in ROWS)
objective = -sum(len(response) * advantage for response, advantage in ROWS) / tokens
gas = len(ROWS)
shares = [-len(response) * advantage / tokens for response, advantage in ROWS]
lengths = [len(response) for response, _ in ROWS]
weighted = sum(gas * share * n / tokens for share, n in zip(shares, lengths, strict=True))
logged: dict[int, float] = {}
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
    for micro in (len(ROWS), 1):
        logged[micro], backward_losses = run(actor_dir, micro)
        print(
            f"--train.micro_batch_size {micro} --train.batch_size {len(ROWS)} (gas {len(ROWS) // micro}): "
            f"logged policy_loss {logged[micro]:.4f}; sum of the backward losses {sum(backward_losses):.4f}"
        )
print(f"expected (the objective, -(1/N) sum_t A_t at ratio 1): {objective:.4f}")
print(
    f"got at gas {gas}: {logged[1]:.4f} (sum_i gas (S_i/N)(n_i/N) = {weighted:.4f}); "
    f"at gas 1: {logged[len(ROWS)]:.4f}"
)
sys.exit(1 if abs(logged[1] - objective) > 1e-3 else 0)
