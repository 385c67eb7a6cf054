"""rlinf-step-token-mean-micro-batch (trainer-path): with ``algorithm.loss_agg_func: token-mean``,
RLinf 0.3.0's FSDP actor (``FSDPActor.training_step``) takes the token mean within each micro-batch and
divides it by the number of micro-batches, so an optimizer step's gradient is the mean of per-micro-batch
token means, not the token mean over the step's batch: it changes with ``actor.micro_batch_size``.

Run from the repository root: ``.envs/rlinf/bin/python findings/repro/rlinf-step-token-mean-micro-batch.py``
(standalone: ``pip install --no-deps rlinf==0.3.0`` plus ``omegaconf ray regex torch transformers==4.57.6
accelerate==1.16.0``; imports only torch, omegaconf, transformers and rlinf).

Drives ``rlinf.workers.actor.fsdp_actor_worker.FSDPActor.training_step`` (the reasoning actor's update,
built by its own ``__init__`` and ``FSDPModelManager.setup_model_and_optimizer``: FSDP2 over a gloo group
of one, fp32) on a tiny random Qwen2 and one batch of 4 rows with response lengths 5, 2, 1, 3:
``_split_to_micro_batch`` (``split_num = rows // micro_batch_size``), ``forward_batch``, ``policy_loss``
(``loss_type: actor`` -> ``compute_ppo_actor_loss`` with ``get_loss_agg_func(loss_agg_func)``), then
``loss = loss / self.gradient_accumulation`` (rlinf/workers/actor/fsdp_actor_worker.py:819) and backward.
The gradient is read when ``training_step`` calls ``optimizer_step`` (before clipping; lr 0).
Trigger: ``token-mean`` (the documented setting) with more than one micro-batch per step
(``micro_batch_size`` 1 and 2; RLinf's ``qwen2.5-1.5b-grpo-fsdp.yaml`` has ``micro_batch_size: 1``).
Default-like controls: ``token-mean`` with one micro-batch; ``seq-mean-token-mean`` split in 4.

Expected (spec AGG-2 / STEP-2: the step's loss is the token mean over the whole batch, whatever the split):
the gradient of ``-(1/N) sum_t min(r_t A_t, clip(r_t, 0.8, 1.2) A_t)`` over all N response tokens of the
batch, computed by hand on a copy of the same weights (eager attention, no FSDP). Got: RLinf's gradient.
Exit 1 while a split ``token-mean`` step differs from the expected gradient by more than 1e-5 of its
largest entry.

Stand-ins, none on the loss (what a CPU process without Ray cannot run): ``Worker.torch_device_type`` =
"cpu" and a CPU ``Worker.torch_platform`` (RLinf has no CPU accelerator), ``Worker.__init__`` setting
rank 0 of a group of one (no Ray actor), eager attention where ``model_provider_func`` asks for
flash_attention_2, ``init_worker``'s rollout-weight handshake skipped.
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
os.environ.setdefault("MASTER_PORT", "29541")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")

from rlinf.scheduler import Worker


class CpuPlatform:
    """STAND-IN: Worker.torch_platform is None without an accelerator (AcceleratorType.NO_ACCEL)."""

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


Worker.torch_platform = CpuPlatform()
Worker.torch_device_type = "cpu"


def _no_ray_init(self, *args, **kwargs):
    """STAND-IN for Worker.__init__ (Ray actor plumbing): rank 0 of a group of one."""
    self._rank = 0
    self._world_size = 1
    self._is_ray_actor = False
    self._timer_metrics = {}


Worker.__init__ = _no_ray_init

import rlinf.hybrid_engines.fsdp.fsdp_model_manager as fsdp_model_manager  # noqa: E402
from rlinf.workers.actor.fsdp_actor_worker import FSDPActor  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config  # noqa: E402


class EagerAutoConfig:
    """STAND-IN: flash_attention_2 (CUDA-only) requested unconditionally -> eager attention."""

    @staticmethod
    def from_pretrained(*args, **kwargs):
        if kwargs.get("attn_implementation") == "flash_attention_2":
            kwargs["attn_implementation"] = "eager"
        return AutoConfig.from_pretrained(*args, **kwargs)


fsdp_model_manager.AutoConfig = EagerAutoConfig

PROMPT, RESPONSE, VOCAB, B = 3, 5, 16, 4
TOLERANCE = 1e-5


def tiny_qwen(directory: str) -> str:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        tie_word_embeddings=False,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config, attn_implementation="eager").save_pretrained(directory)
    return directory


def config(model_path: str, loss_agg_func: str):
    fsdp = {
        "strategy": "fsdp2", "use_liger_kernel": False, "gradient_checkpointing": False,
        "mixed_precision": {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
        "amp_autocast": {"enabled": False, "precision": "bf16"}, "grad_scaler": {"enabled": False},
        "cpu_offload": False, "offload_pin_memory": False, "reshard_after_forward": True,
        "enable_gradient_accumulation": False, "forward_prefetch": False, "limit_all_gathers": False,
        "backward_prefetch": None, "use_orig_params": False,
        "wrap_policy": {"transformer_layer_cls_to_wrap": None, "min_num_params": 0},
    }  # fmt: skip
    return OmegaConf.create(
        {
            "data": {"max_prompt_length": PROMPT, "rollout_batch_size": 2},
            "runner": {"task_type": "reasoning"},
            "rollout": {"group_name": "RolloutGroup"},
            "algorithm": {
                "calculate_entropy": False, "entropy_bonus": 0.0, "kl_beta": 0.0,
                "kl_penalty_type": "low_var_kl", "group_size": 2, "loss_agg_func": loss_agg_func,
                "n_minibatches": 1, "entropy_op_type": "torch", "ratio_clip_eps": 0.2, "loss_type": "actor",
                "adv_type": "grpo", "logprob_forward_micro_batch_size": 2,
                "sampling_params": {"temperature": 1.0},
            },
            "actor": {
                "micro_batch_size": B,
                "model": {
                    "encoder_seq_length": PROMPT + RESPONSE, "precision": "fp32", "model_path": model_path,
                },
                "optim": {
                    "lr": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "clip_grad": 1e9, "weight_decay": 0.0,
                },
                "fsdp_config": fsdp,
            },
        }
    )  # fmt: skip


def main() -> int:
    dist.init_process_group("gloo", rank=0, world_size=1)
    path = tiny_qwen(tempfile.mkdtemp())
    reference = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")

    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, VOCAB, (B, PROMPT + RESPONSE), generator=g)
    response_mask = torch.tensor(
        [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool
    )  # response lengths 5, 2, 1, 3
    attention_mask = torch.ones(B, PROMPT + RESPONSE, dtype=torch.long)
    attention_mask[:, PROMPT:] = response_mask.long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    old = -2.0 + 0.3 * torch.randn(B, RESPONSE, generator=g)
    adv = torch.randn(B, 1, generator=g).expand(B, RESPONSE).contiguous()
    batch = {
        "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
        "response_mask": response_mask, "rollout_logprobs": old, "advantages": adv,
    }  # fmt: skip

    def expected(mode: str) -> dict[str, torch.Tensor]:
        """The whole batch's aggregation of the clipped surrogate, by hand on the same weights."""
        ref = copy.deepcopy(reference)
        logits = ref(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        lp = torch.log_softmax(logits[:, PROMPT - 1 : -1].float(), -1).gather(
            -1, input_ids[:, PROMPT:, None]
        )[..., 0]
        ratio = (lp - old).exp()
        per = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        m = response_mask.float()
        if mode == "token-mean":
            loss = (per * m).sum() / m.sum()  # one mean over all N tokens of the step
        else:  # seq-mean-token-mean: the mean over rows of each row's token mean
            loss = ((per * m).sum(-1) / m.sum(-1)).mean()
        loss.backward()
        return {n: p.grad for n, p in ref.named_parameters()}

    def rlinf_gradient(actor, micro: int) -> dict[str, torch.Tensor]:
        captured: dict[str, dict[str, torch.Tensor]] = {}
        step = actor.optimizer_step

        def capture_then_step():
            captured["grad"] = {}
            for n, p in actor.model.named_parameters():
                grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                captured["grad"][n] = grad.detach().clone()
            return step()

        actor.optimizer_step = capture_then_step
        actor.micro_batch_size = micro
        actor.training_step({k: v.clone() for k, v in batch.items()})
        actor.optimizer_step = step
        return captured["grad"]

    def relative(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
        diff = max(float((got[n] - w).abs().max()) for n, w in want.items())
        return diff / max(float(w.abs().max()) for w in want.values())

    reproduces = False
    for mode, micros in (("token-mean", (4, 2, 1)), ("seq-mean-token-mean", (4, 1))):
        actor = FSDPActor(config(path, mode), SimpleNamespace(is_disaggregated=False))
        actor.setup_model_and_optimizer()  # init_worker minus its rollout-weight handshake (Ray)
        want = expected(mode)
        for micro in micros:
            got = rlinf_gradient(actor, micro)
            rel = relative(got, want)
            ratio = float(
                sum((got[n] * w).sum() for n, w in want.items()) / sum((w * w).sum() for w in want.values())
            )
            split = B // micro
            label = "trigger" if mode == "token-mean" and split > 1 else "control"
            print(
                f"{label:7s} loss_agg_func={mode:19s} micro_batch_size={micro} ({split} per step): "
                f"|got - expected| / max|expected| = {rel:.3g} (expected 0), "
                f"<got, expected> / |expected|^2 = {ratio:.4f} (expected 1)"
            )
            if mode == "token-mean" and split > 1 and rel > TOLERANCE:
                reproduces = True
            if mode == "token-mean" and micro == 1:  # one row per micro-batch: each row's own token mean
                as_seq = relative(got, expected("seq-mean-token-mean"))
                print(
                    "        token-mean at micro_batch_size=1 vs seq-mean-token-mean's expected gradient: "
                    f"{as_seq:.3g}"
                )
    dist.destroy_process_group()
    return 1 if reproduces else 0


if __name__ == "__main__":
    sys.exit(main())
