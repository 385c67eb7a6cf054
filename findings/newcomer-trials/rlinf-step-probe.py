"""Can RLinf 0.3.0's reasoning actor training step (FSDPActor.training_step) run on a CPU?

Standalone (imports no ppo_ref). Run in .envs/rlinf (tools/thirdparty_envs.py rlinf) with two packages added
(rlinf-step.md, section 1):
    .envs/rlinf/bin/python -m pip install -c .envs/constraints.txt transformers==4.57.6 accelerate==1.16.0
    OMP_NUM_THREADS=1 .envs/rlinf/bin/python findings/newcomer-trials/rlinf-step-probe.py
PROBE_DROP=platform|ray|attn drops one stand-in to show the error it stands in for.
It builds a tiny random Qwen2 in a temporary directory, opens a gloo group of one, constructs
rlinf.workers.actor.fsdp_actor_worker.FSDPActor with its own __init__ and
FSDPModelManager.setup_model_and_optimizer (FSDP2), and calls FSDPActor.training_step on one batch.
It then recomputes the token-mean PPO clipped loss by hand on a copy of the same weights and
compares the gradient. Stand-ins (only what a CPU / no-Ray process cannot run) are marked STAND-IN.
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
from types import SimpleNamespace

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")

from rlinf.scheduler import Worker


class CpuPlatform:
    """STAND-IN: Worker.torch_platform is None without an accelerator (AcceleratorType.NO_ACCEL,
    rlinf/scheduler/hardware/accelerators/accelerator.py:444); torch.cuda's calls, for the CPU."""

    @staticmethod
    def set_device(index: int) -> None:
        return None

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def synchronize() -> None:
        return None


DROP = set(os.environ.get("PROBE_DROP", "").split(","))  # e.g. PROBE_DROP=platform,ray,attn: see each blocker
if "platform" not in DROP:
    Worker.torch_platform = CpuPlatform()
    Worker.torch_device_type = "cpu"


def _no_ray_init(self, *args, **kwargs):
    """STAND-IN for Worker.__init__ (Ray actor plumbing, worker.py:386-420): rank 0 of a group of 1."""
    self._rank = 0
    self._world_size = 1
    self._is_ray_actor = False
    self._timer_metrics = {}  # set by _env_setup_before_init (worker.py:373) in a Ray worker


if "ray" not in DROP:
    Worker.__init__ = _no_ray_init

import rlinf.hybrid_engines.fsdp.fsdp_model_manager as fsdp_model_manager  # noqa: E402
from rlinf.workers.actor.fsdp_actor_worker import FSDPActor  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config  # noqa: E402


class EagerAutoConfig:
    """STAND-IN: FSDPModelManager.model_provider_func asks for attn_implementation=
    "flash_attention_2" unconditionally (fsdp_model_manager.py:155-159); flash-attn is CUDA-only,
    so the config is loaded with eager attention instead. Nothing else changes."""

    @staticmethod
    def from_pretrained(*args, **kwargs):
        if kwargs.get("attn_implementation") == "flash_attention_2":
            kwargs["attn_implementation"] = "eager"
        return AutoConfig.from_pretrained(*args, **kwargs)


if "attn" not in DROP:
    fsdp_model_manager.AutoConfig = EagerAutoConfig

PROMPT, RESPONSE, VOCAB = 3, 5, 16


def tiny_qwen(directory: str) -> str:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.save_pretrained(directory)
    return directory


def config(model_path: str, micro: int):
    return OmegaConf.create(
        {
            "data": {"max_prompt_length": PROMPT, "rollout_batch_size": 2},
            "runner": {"task_type": "reasoning"},
            "rollout": {"group_name": "RolloutGroup"},
            "algorithm": {
                "calculate_entropy": False,
                "entropy_bonus": 0.0,
                "kl_beta": 0.0,
                "kl_penalty_type": "low_var_kl",
                "group_size": 2,
                "loss_agg_func": "token-mean",
                "n_minibatches": 1,
                "entropy_op_type": "torch",
                "ratio_clip_eps": 0.2,
                "loss_type": "actor",
                "adv_type": "grpo",
                "logprob_forward_micro_batch_size": 2,
                "sampling_params": {"temperature": 1.0},
            },
            "actor": {
                "micro_batch_size": micro,
                "model": {
                    "encoder_seq_length": PROMPT + RESPONSE,
                    "precision": "fp32",
                    "model_path": model_path,
                },
                "optim": {
                    "lr": 0.0,
                    "adam_beta1": 0.9,
                    "adam_beta2": 0.999,
                    "clip_grad": 1e9,
                    "weight_decay": 0.0,
                },
                "fsdp_config": {
                    "strategy": "fsdp2",
                    "use_liger_kernel": False,
                    "gradient_checkpointing": False,
                    "mixed_precision": {
                        "param_dtype": "fp32",
                        "reduce_dtype": "fp32",
                        "buffer_dtype": "fp32",
                    },
                    "amp_autocast": {"enabled": False, "precision": "bf16"},
                    "grad_scaler": {"enabled": False},
                    "cpu_offload": False,
                    "offload_pin_memory": False,
                    "reshard_after_forward": True,
                    "enable_gradient_accumulation": False,
                    "forward_prefetch": False,
                    "limit_all_gathers": False,
                    "backward_prefetch": None,
                    "use_orig_params": False,
                    "wrap_policy": {"transformer_layer_cls_to_wrap": None, "min_num_params": 0},
                },
            },
        }
    )


def main() -> int:
    dist.init_process_group("gloo", rank=0, world_size=1)
    tmp = tempfile.mkdtemp()
    path = tiny_qwen(tmp)
    cfg = config(path, micro=2)
    actor = FSDPActor(cfg, SimpleNamespace(is_disaggregated=False))
    actor.setup_model_and_optimizer()  # init_worker minus _setup_rollout_weight_dst_ranks (Ray)
    reference = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    print("model:", type(actor.model).__name__, "optimizer:", type(actor.optimizer).__name__)

    g = torch.Generator().manual_seed(1)
    B = 4
    input_ids = torch.randint(3, VOCAB, (B, PROMPT + RESPONSE), generator=g)
    attention_mask = torch.ones(B, PROMPT + RESPONSE, dtype=torch.long)
    response_mask = torch.tensor(
        [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool
    )
    attention_mask[:, PROMPT:] = response_mask.long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    old = -2.0 + 0.3 * torch.randn(B, RESPONSE, generator=g)
    adv = torch.randn(B, 1, generator=g).expand(B, RESPONSE).contiguous()
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "rollout_logprobs": old,
        "advantages": adv,
    }
    captured = {}
    original_step = actor.optimizer_step

    def capture_then_step():
        captured["grad"] = {n: p.grad.detach().clone() for n, p in actor.model.named_parameters()}
        return original_step()

    actor.optimizer_step = capture_then_step  # read the gradient before RLinf's own optimizer step

    def formula_grad(micro: int | None) -> dict:
        """-min(r A, clip(r, 0.8, 1.2) A), token-mean per micro-batch of `micro` rows, averaged over
        the micro-batches (micro=None: one token-mean over the whole batch)."""
        ref = copy.deepcopy(reference)
        size = B if micro is None else micro
        total = 0.0
        for mb in range(0, B, size):
            sl = slice(mb, mb + size)
            logits = ref(
                input_ids=input_ids[sl], attention_mask=attention_mask[sl], position_ids=position_ids[sl]
            ).logits[:, PROMPT - 1 : -1]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, input_ids[sl, PROMPT:, None])[..., 0]
            ratio = (lp - old[sl]).exp()
            a = adv[sl]
            per = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a)
            m = response_mask[sl].float()
            total = total + (per * m).sum() / m.sum() / (B // size)
        total.backward()
        return {n: p.grad for n, p in ref.named_parameters()}

    def diff(a: dict, b: dict) -> float:
        out = 0.0
        for n, v in b.items():
            got = a[n].full_tensor() if hasattr(a[n], "full_tensor") else a[n]
            out = max(out, float((got - v).abs().max()))
        return out

    worst = 0.0
    global_mean = formula_grad(None)
    for micro in (1, 2, 4):
        actor.micro_batch_size = micro
        metrics = actor.training_step({k: v.clone() for k, v in batch.items()})
        scale = max(float(v.abs().max()) for v in captured["grad"].values())
        d_mb = diff(captured["grad"], formula_grad(micro))
        d_global = diff(captured["grad"], global_mean)
        worst = max(worst, d_mb)
        print(
            f"micro_batch_size={micro}: grad_norm={metrics['actor/grad_norm']:.6f} "
            f"max|grad|={scale:.4g} vs per-micro-batch token-mean {d_mb:.3g}, "
            f"vs global token-mean {d_global:.3g}"
        )
    print("metrics (last):", {k: round(float(v), 6) for k, v in metrics.items()})

    # 2. RLinf's own path from the scores: recomputed log-probs (inference_step, as run_inference
    # calls it under no_grad), GRPO advantages (compute_advantages_and_returns -> registry
    # calculate_adv_and_returns, adv_type grpo), then training_step with recomputed_logprobs.
    scores = torch.tensor([1.0, 0.0, 0.5, 0.0])  # two groups of group_size 2
    rollout = {k: v.clone() for k, v in batch.items() if k != "advantages"}
    rollout["rewards"] = scores.clone()
    with torch.no_grad():
        recomputed, _ = actor.inference_step(rollout, num_sequences=B, compute_ref_logprobs=False)
    rollout["recomputed_logprobs"] = recomputed
    rollout = actor.compute_advantages_and_returns(rollout)
    advantages = rollout["advantages"]
    grouped = scores.view(-1, 2)
    expected = ((grouped - grouped.mean(-1, keepdim=True)) / (grouped.std(-1, keepdim=True) + 1e-6)).view(
        -1, 1
    )
    expected = expected * response_mask
    print(
        "advantages shape",
        tuple(advantages.shape),
        "max|adv - (r-mean)/(std+1e-6)| =",
        float((advantages - expected).abs().max()),
    )
    actor.micro_batch_size = 2
    metrics = actor.training_step({k: v.clone() for k, v in rollout.items()})
    print(
        "step-0 ratio metrics:",
        {k: round(float(metrics[k]), 8) for k in ("actor/ratio", "actor/approx_kl", "actor/clip_fraction")},
    )
    old, adv = recomputed, advantages
    d2 = diff(captured["grad"], formula_grad(2))
    print(f"from scores, micro_batch_size=2: max|grad(RLinf) - grad(formula)| = {d2:.3g}")
    worst = max(worst, d2)
    dist.destroy_process_group()
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
