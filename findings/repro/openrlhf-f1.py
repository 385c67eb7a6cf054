"""openrlhf-f1: with ``--algo.kl.use_loss --algo.kl.estimator k3`` the KL loss has no gradient where k3 > 10.

Interpreter: .envs/openrlhf/bin/python findings/repro/openrlhf-f1.py (run from the repository root;
standalone: ``pip install openrlhf==0.11.2 deepspeed==0.19.6 ray==2.55.0 peft transformers==5.15.0
aiohttp`` on CPU, no flash-attn / vllm / Pillow needed).

Drives ``ActorPPOTrainer.training_step`` (``openrlhf/trainer/ray/ppo_actor.py:259``), the actor update
of ``train_ppo_ray``, on an ``openrlhf.models.Actor`` loaded from a tiny Llama saved in a temporary
directory (``--ds.param_dtype bf16``, the default; ``--ds.attn_implementation eager``: no
flash-attn on CPU), with the args ``openrlhf/cli/train_ppo_ray.py`` builds (its real parser and checks;
``train`` is stopped at its first line). DeepSpeed's engine is replaced by a stand-in strategy whose
``backward`` is ``loss.backward()`` (one micro-batch, gradient accumulation 1: DeepSpeed would not
rescale) and whose optimizer step is skipped, so the gradient that reaches the action log-probs can
be read with a hook. Advantages are 0, so the policy loss adds no gradient and what arrives is
``init_coef * d kl_loss / d logp``.

One sequence, two response tokens; the reference's log-probs are the actor's + [0.2, 3.0] (token 2
fell 3 nats below the reference). k3 (DeepSeekMath, arXiv:2402.03300, eq. 4) per token:
  k3 = exp(ref - logp) - (ref - logp) - 1          -> [0.0214, 16.0855]
  d k3 / d logp = 1 - exp(ref - logp)               -> [-0.2214, -19.0855]
and with the token-mean loss the gradient on each log-prob is init_coef * d k3 / d logp / 2
(init_coef 0.01, the default). ``compute_approx_kl`` (``models/utils.py:108-113``) clamps k3 to
[-10, 10]: token 2 gets k3 = 10 and gradient 0.

Runs: the defaults (KL in the reward, no KL loss: the clamp never reaches a gradient), ``--algo.kl.use_loss``
with the default estimator k1 (gradient init_coef / 2 per token: right), the triggering setting
``--algo.kl.use_loss --algo.kl.estimator k3`` (the KL flags of OpenRLHF's own
``examples/scripts/train_dapo_ray_hybrid_engine.sh``), and that plus ``--algo.kl.unbiased_gradient``
(PR #1309: the gradient is the reverse-KL one, init_coef * (logp - ref) / 2, and survives), and
``--algo.kl.use_loss --algo.kl.estimator k2`` (the KL flags of OpenRLHF's ProRL v2, REINFORCE-baseline
and VLM example scripts) with a token 5 nats below the reference: k2 = (logp - ref)^2 / 2 = 12.5 is
clamped to 10 by the same line, so that token loses its gradient init_coef * (logp - ref) / 2 too.
Exit 1 when the triggering setting's gradient on token 2 is off by more than 1e-6, else 0.
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
from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402
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


def run(
    actor_dir: str, offsets: tuple[float, float], *argv: str
) -> tuple[list[float], list[float], list[float], SimpleNamespace]:
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
    sequences = torch.tensor([[3, 7, 4, 9, 5, 11]])
    attention_mask = torch.ones_like(sequences)
    action_mask = torch.tensor([[True, True]])  # the last two tokens are the response
    with torch.no_grad():
        logp = actor(sequences, action_mask, attention_mask=attention_mask)
    ref = logp + torch.tensor([offsets])
    experience = Experience(
        sequences=sequences,
        attention_mask=attention_mask,
        action_mask=action_mask,
        action_log_probs=logp.clone(),
        base_action_log_probs=ref,
        advantages=torch.zeros_like(logp),
        info={},
    )
    seen: list[torch.Tensor] = []

    def keep_grad(module, inputs, output):
        if torch.is_grad_enabled():
            output[0].retain_grad()
            seen.append(output[0])

    actor.register_forward_hook(keep_grad)
    ((experience, loss_info),) = iter_grad_accum_global_norm(
        [experience], trainer.strategy, 1, lambda e: e.action_mask
    )
    status = trainer.training_step(experience, args.algo.kl.init_coef, 0, loss_info)
    grad = seen[0].grad[0].tolist()
    logged_kl = float(status["metrics"]["kl"]) if "kl" in status["metrics"] else float("nan")
    return grad, logp[0].tolist(), ref[0].tolist(), SimpleNamespace(args=args, logged_kl=logged_kl)


def expected(logp: list[float], ref: list[float], kl: SimpleNamespace) -> tuple[list[float], float]:
    lp, rf = torch.tensor(logp, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64)
    n, coef = lp.numel(), kl.init_coef
    if not kl.use_loss:
        return [0.0] * n, float("nan")
    if kl.estimator == "k1":
        return [coef / n] * n, float((lp - rf).mean())
    if kl.estimator == "k2":  # (logp - ref)^2 / 2
        return (coef * (lp - rf) / n).tolist(), float(((lp - rf) ** 2 / 2).mean())
    k3 = torch.exp(rf - lp) - (rf - lp) - 1
    if kl.unbiased_gradient:  # PR #1309: gradient of w * (logp - ref)^2 / 2, w = 1 on-policy
        return (coef * (lp - rf) / n).tolist(), float(k3.mean())
    return (coef * (1 - torch.exp(rf - lp)) / n).tolist(), float(k3.mean())


wrong = False
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
    k3_loss = ("--algo.kl.use_loss", "--algo.kl.estimator", "k3")
    for label, offsets, argv in (
        ("defaults (KL in the reward, k1)", (0.2, 3.0), ()),
        ("--algo.kl.use_loss (estimator k1)", (0.2, 3.0), ("--algo.kl.use_loss",)),
        ("--algo.kl.use_loss --algo.kl.estimator k3", (0.2, 3.0), k3_loss),
        ("... k3 --algo.kl.unbiased_gradient", (0.2, 3.0), (*k3_loss, "--algo.kl.unbiased_gradient")),
        (
            "--algo.kl.use_loss --algo.kl.estimator k2",
            (0.2, 5.0),
            ("--algo.kl.use_loss", "--algo.kl.estimator", "k2"),
        ),
    ):
        grad, logp, ref, out = run(actor_dir, offsets, *argv)
        want, want_kl = expected(logp, ref, out.args.algo.kl)
        print(f"{label}: logp - ref = {[round(a - b, 4) for a, b in zip(logp, ref, strict=True)]}")
        print(f"  d loss / d logp: expected {[round(v, 6) for v in want]} got {[round(v, 6) for v in grad]}")
        if out.args.algo.kl.use_loss:
            print(f"  logged kl (token mean): expected {want_kl:.4f} got {out.logged_kl:.4f}")
        if label == "--algo.kl.use_loss --algo.kl.estimator k3" and abs(grad[1] - want[1]) > 1e-6:
            wrong = True

sys.exit(1 if wrong else 0)
