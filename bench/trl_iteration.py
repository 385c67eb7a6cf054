"""TRL 1.12's experimental ``PPOTrainer`` at the benchmark settings, timed one iteration at a time.

Runs in TRL's own environment (``.envs/trl``, built by ``tools/thirdparty_envs.py trl``)::

    .envs/trl/bin/python -m bench.trl_iteration            # prints the median of 16 iterations
    .envs/trl/bin/python -m bench.trl_iteration --serve    # the worker tools/run_bench.py drives

Same models, tokenizer and prompts as ppo-ref's side (:mod:`bench.tiny_ppo`). ``PPOConfig``:
per_device_train_batch_size=64, gradient_accumulation_steps=1, num_mini_batches=4 (16 rows per
optimizer step), local_rollout_forward_batch_size=64, response_length=32, stop_token=None,
temperature=1, num_ppo_epochs=4, learning_rate=3e-4, weight_decay=0, kl_coef=0.05 (k1),
cliprange=0.2, cliprange_value=0.2, vf_coef=0.1, gamma=1, lam=0.95, and three defaults
overridden as in the research note: num_sample_generations=0, bf16=False,
gradient_checkpointing=False. The optimizer is TrainingArguments' default ``adamw_torch_fused``.

``train()`` runs in a background thread; a :class:`transformers.TrainerCallback` pauses it in
``on_train_begin`` and at every ``on_step_end`` (the end of an iteration, after its metrics are
logged), so one step is exactly one iteration of TRL's loop, its per-iteration ``gc.collect()``
calls included.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch

from bench import tiny_ppo as s
from bench.paused_train import PausedTrain
from bench.worker import reply
from bench.worker import serve as serve_requests

__all__ = ["TrlStepper", "make_trl_trainer"]


def make_trl_trainer(out_dir: str, callbacks: list[Any]) -> Any:
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    models = s.build_models()
    ids = s.prompt_ids().tolist()
    config = PPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=s.BATCH,
        per_device_eval_batch_size=s.BATCH,
        gradient_accumulation_steps=1,
        num_mini_batches=s.MINIBATCHES,
        local_rollout_forward_batch_size=s.BATCH,
        total_episodes=s.BATCH * 100_000,  # the stepper stops the run long before
        num_ppo_epochs=s.EPOCHS,
        response_length=s.RESPONSE_TOKENS,
        stop_token=None,
        temperature=1.0,
        missing_eos_penalty=None,
        learning_rate=s.LEARNING_RATE,
        weight_decay=0.0,
        kl_coef=s.KL_COEF,
        kl_estimator="k1",
        cliprange=s.CLIP,
        cliprange_value=s.VALUE_CLIP,
        vf_coef=s.VF_COEF,
        gamma=s.GAMMA,
        lam=s.LAM,
        whiten_rewards=False,
        num_sample_generations=0,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=s.SEED,
    )
    return PPOTrainer(
        args=config,
        processing_class=s.build_tokenizer(),
        model=models["policy"],
        ref_model=models["reference"],
        reward_model=models["reward"],
        value_model=models["value"],
        train_dataset=Dataset.from_dict({"input_ids": ids}),
        eval_dataset=Dataset.from_dict({"input_ids": ids[: s.BATCH]}),
        callbacks=callbacks,
    )


class TrlStepper(PausedTrain):
    """TRL's ``train()`` in a thread, paused at each iteration boundary; ``step()`` runs one."""

    def __init__(self, out_dir: str, factory: Callable[[list[Any]], Any] | None = None) -> None:
        """``factory(callbacks)`` builds the TRL trainer (default: :func:`make_trl_trainer`, PPO)."""
        from transformers import TrainerCallback

        super().__init__("TRL")
        stepper = self

        class Pause(TrainerCallback):  # type: ignore[misc]
            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                stepper.pause()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                stepper.pause()

        self.trainer = make_trl_trainer(out_dir, [Pause()]) if factory is None else factory([Pause()])
        self.start(self.trainer.train, "trl-train")

    def global_step(self) -> int:
        return int(self.trainer.state.global_step)


def versions() -> dict[str, str]:
    import accelerate
    import datasets
    import transformers
    import trl

    return {
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "datasets": datasets.__version__,
        "torch": torch.__version__,
    }


def serve(stepper: TrlStepper, settings: Callable[[TrlStepper], dict[str, Any]] | None = None) -> None:
    """The worker protocol of ``bench/ppo_ref_side.py``: ``iterations``, ``info``, ``quit``; ``info``
    includes ``settings(stepper)`` where given (the GRPO side's settings read back from TRL)."""

    def info(_: dict[str, Any]) -> dict[str, Any]:
        found = {
            "peak_rss_bytes": s.peak_rss_bytes(),
            "iterations_logged": stepper.global_step(),
            "versions": versions(),
            "threads": torch.get_num_threads(),
        }
        return found if settings is None else {**found, "settings": settings(stepper)}

    reply({"ready": True, "peak_rss_bytes": s.peak_rss_bytes()})
    serve_requests({"iterations": stepper.iterations, "info": info})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="worker mode for tools/run_bench.py")
    parser.add_argument("--warmup", type=int, default=3, help="iterations run before timing")
    parser.add_argument("--iterations", type=int, default=16, help="timed iterations")
    args = parser.parse_args(argv)
    torch.set_num_threads(s.THREADS)
    if args.serve:
        s.claim_stdout_for_protocol()
    stepper = TrlStepper(tempfile.mkdtemp(prefix="trl-bench-"))
    try:
        if args.serve:
            serve(stepper)
            return 0
        result = stepper.timed(args.warmup, args.iterations)
        result |= {
            "tokens_per_second": s.BATCH * s.RESPONSE_TOKENS / result["median_seconds_per_iteration"],
            "peak_rss_bytes": s.peak_rss_bytes(),
            "versions": versions(),
        }
        print(json.dumps(result))  # the last line of stdout
    finally:
        stepper.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
