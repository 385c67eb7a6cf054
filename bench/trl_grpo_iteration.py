"""TRL 1.16's ``GRPOTrainer`` at the GRPO benchmark settings, timed one iteration (optimizer step) at a time.

Runs in its own environment (``.envs/trl116``, built by ``tools/thirdparty_envs.py trl116``)::

    .envs/trl116/bin/python -m bench.trl_grpo_iteration --beta 0          # median of 8 iterations
    .envs/trl116/bin/python -m bench.trl_grpo_iteration --serve --beta 0  # the worker of tools/run_bench.py

Same model, tokenizer, prompts and reward as ppo-ref's side (:mod:`bench.tiny_grpo`); the model is
saved with ``save_pretrained`` and reloaded, because with ``beta > 0`` TRL rebuilds its reference
model from ``model.config._name_or_path``. ``GRPOConfig`` (everything else TRL's default; the
research note ``trl-grpo-offline`` lists the defaults that differ from transformers'):
``use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False`` (TRL defaults bf16 and
gradient checkpointing on), ``max_grad_norm=0`` (no clipping), ``per_device_train_batch_size=64,
gradient_accumulation_steps=1`` (one micro-batch of 64, one optimizer step per generation),
``num_generations=8, max_completion_length=32, temperature=1.0, top_k=0, top_p=1.0,
use_vllm=False``, ``learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0,
weight_decay=0.0`` (optimizer ``adamw_torch_fused``, TRL's default), ``beta`` as given,
``loss_type="dapo", epsilon=0.2, num_iterations=1, scale_rewards="group"`` (defaults, set
explicitly), ``logging_steps=1`` (metrics every iteration, as ppo-ref's metrics.jsonl),
``report_to="none", save_strategy="no", log_completions=False, dataloader_num_workers=0,
seed=0``.

``train()`` runs in a background thread; a ``TrainerCallback`` pauses it in ``on_train_begin``
and at every ``on_step_end`` (after the optimizer step), so one timed step is one whole
iteration of TRL's loop: generation, reward, advantages, loss, backward, optimizer, logging.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch

from bench import tiny_grpo as g
from bench import tiny_ppo
from bench.trl_iteration import TrlStepper, serve, versions

__all__ = ["grpo_trl_config", "make_trl_grpo_trainer"]


def grpo_trl_config(out_dir: str, beta: float) -> Any:
    """TRL's ``GRPOConfig`` at the benchmark settings (see the module docstring)."""
    from trl import GRPOConfig

    if beta < 0:
        raise ValueError(f"beta: expected a number >= 0, got {beta}")
    return GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        max_grad_norm=0.0,
        per_device_train_batch_size=g.MICRO_BATCH,
        gradient_accumulation_steps=g.BATCH // g.MICRO_BATCH,
        num_generations=g.GROUP,
        max_completion_length=g.RESPONSE_TOKENS,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        use_vllm=False,
        learning_rate=g.LEARNING_RATE,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        beta=beta,
        loss_type="dapo",
        epsilon=g.CLIP,
        num_iterations=1,
        scale_rewards="group",
        max_steps=1_000_000,  # the stepper stops the run long before
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        log_completions=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        seed=g.SEED,
    )


def make_trl_grpo_trainer(out_dir: str, callbacks: list[Any], beta: float) -> Any:
    """TRL's ``GRPOTrainer`` on the benchmark's model (saved and reloaded from ``out_dir/model``)."""
    from datasets import Dataset
    from transformers import GPT2LMHeadModel
    from trl import GRPOTrainer

    model_dir = Path(out_dir) / "model"
    g.build_policy().save_pretrained(model_dir)
    model = GPT2LMHeadModel.from_pretrained(model_dir).float().eval()
    return GRPOTrainer(
        model=model,
        reward_funcs=g.target_fraction,
        args=grpo_trl_config(str(Path(out_dir) / "out"), beta),
        train_dataset=Dataset.from_dict({"prompt": g.prompt_texts()}),
        processing_class=g.build_tokenizer(),
        callbacks=callbacks,
    )


def settings(stepper: TrlStepper) -> dict[str, Any]:
    """The settings TRL actually ran with (read back from the trainer, not from this file)."""
    args = stepper.trainer.args
    names = (
        "bf16 fp16 gradient_checkpointing max_grad_norm per_device_train_batch_size "
        "gradient_accumulation_steps steps_per_generation generation_batch_size num_generations "
        "max_completion_length temperature top_k top_p use_vllm learning_rate lr_scheduler_type "
        "weight_decay beta loss_type epsilon num_iterations scale_rewards logging_steps "
        "disable_dropout mask_truncated_completions"
    ).split()
    found = {name: getattr(args, name, None) for name in names}
    found["optim"] = str(args.optim)
    found["optimizer"] = type(stepper.trainer.optimizer).__name__ if stepper.trainer.optimizer else None
    found["lr_scheduler_type"] = str(args.lr_scheduler_type)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="worker mode for tools/run_bench.py")
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0 or 0.04 in the run)")
    parser.add_argument("--warmup", type=int, default=2, help="iterations run before timing")
    parser.add_argument("--iterations", type=int, default=8, help="timed iterations")
    args = parser.parse_args(argv)
    torch.set_num_threads(g.THREADS)
    if args.serve:
        tiny_ppo.claim_stdout_for_protocol()
    out_dir = tempfile.mkdtemp(prefix="trl-grpo-bench-")
    stepper = TrlStepper(
        out_dir, factory=lambda callbacks: make_trl_grpo_trainer(out_dir, callbacks, args.beta)
    )
    try:
        if args.serve:
            serve(stepper, settings)
            return 0
        result = stepper.timed(args.warmup, args.iterations)
        result |= {
            "peak_rss_bytes": tiny_ppo.peak_rss_bytes(),
            "versions": versions(),
            "settings": settings(stepper),
        }
        print(json.dumps(result, default=str))  # the last line of stdout
    finally:
        stepper.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
