"""ppo-ref's side of the critic-free (GRPO) benchmark, and the bare model work it is measured against.

``--serve trainer --beta B``: ppo-ref's own ``PPOTrainer.train()`` at the settings of
:mod:`bench.tiny_grpo` (``advantage_estimator="grpo"``, ``group_size=8``, KL as a loss when
``B > 0``), stepped one iteration at a time by :class:`bench.ppo_ref_side.TrainStepper`, with every
runtime check, metric, audit record, TensorBoard event and progress-bar update on.

``--serve bare --beta B``: :class:`BareGrpo`, the model work of one iteration alone on its own copy
of the same model: one ``generate`` of 64 responses (transformers' ``model.generate``, and
separately ppo-ref's sampler), the reference model's no-grad forward when ``B > 0``, and one
forward+backward per micro-batch with a plain clipped loss, then a fused AdamW step. Nothing else:
no scoring, no advantages, no checks, no metrics. It runs in a process of its own so that the
trainer's peak memory is the trainer's alone.

``python -m bench.grpo_side`` prints the median of 8 iterations of the trainer (beta 0) after 2
warm-up ones; ``tools/run_bench.py`` drives the workers.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from bench import tiny_grpo as g
from bench.ppo_ref_side import TrainStepper, info
from bench.worker import reply

__all__ = ["BareGrpo", "grpo_config", "make_grpo_trainer", "serve"]


def grpo_config(out_dir: str, beta: float, **overrides: Any) -> Any:
    """ppo-ref's :class:`TrainerConfig` at the GRPO benchmark settings (checks and metrics all on)."""
    from ppo_ref.trainer import TrainerConfig

    if beta < 0:
        raise ValueError(f"beta: expected a number >= 0, got {beta}")
    values: dict[str, Any] = dict(
        task="bench-tiny-grpo",
        iterations=1_000_000,  # the stepper stops the run
        seed=g.SEED,
        out=out_dir,
        rollout_batch_size=g.BATCH,
        max_new_tokens=g.RESPONSE_TOKENS,
        temperature=1.0,
        missing_eos="none",  # TRL's GRPOTrainer keeps the score of a response cut at the limit
        advantage_estimator="grpo",
        group_size=g.GROUP,
        kl_coef=beta,
        kl_in="loss",  # GRPO: beta * KL(k3) in the loss, as TRL
        kl_loss_estimator="k3",
        ppo_epochs=1,
        num_minibatches=1,
        micro_batch_size=g.MICRO_BATCH,
        clip_eps=g.CLIP,
        entropy_coef=0.0,
        loss_agg="token-mean",  # TRL's loss_type="dapo": token sum over the batch's token count
        learning_rate=g.LEARNING_RATE,
        weight_decay=0.0,
        max_grad_norm=None,  # no clipping (TRL: max_grad_norm=0); the norm is still computed and logged
        eval_samples=g.BATCH,  # evaluation runs once before the timed iterations
        plots=False,  # written at the end of a run, never reached here
        mixed_precision="no",
    )
    values.update(overrides)
    return TrainerConfig(**values)


def make_grpo_trainer(out_dir: str, beta: float, **overrides: Any) -> Any:
    """A :class:`ppo_ref.trainer.PPOTrainer` on the GRPO benchmark's model, tokenizer, prompts and reward."""
    from ppo_ref.trainer import PPOTrainer, TrainingSetup

    texts = g.prompt_texts()
    setup = TrainingSetup(
        tokenizer=g.build_tokenizer(),
        policy=g.build_policy(),
        train_prompts=texts,
        eval_prompts=texts,
        reward_function=g.target_fraction,
        name="bench-tiny-grpo",
    )
    return PPOTrainer(grpo_config(out_dir, beta, **overrides), setup)


def _timed(call: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median wall seconds and median process CPU seconds of ``repeats`` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        began, cpu_began = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - began)
        cpu.append(time.process_time() - cpu_began)
    return statistics.median(wall), statistics.median(cpu)


class BareGrpo:
    """The model work of one GRPO iteration, alone, on its own copy of the benchmark's model.

    * ``generate`` (``hf``): ``model.generate`` with sampling at temperature 1, up to 32 new tokens,
      stopping at EOS (what TRL's GRPOTrainer calls); ``generate_own``: ppo-ref's sampler on the
      same prompts (reported beside it, not summed);
    * ``reference``: the frozen reference's no-grad forward over prompt + response (only when
      ``beta > 0``);
    * ``update``: per micro-batch, the policy's forward, the token log-probs, a plain clipped
      surrogate (plus ``beta`` times the k3 KL to the reference), the token-mean over the batch,
      backward; then one fused AdamW step. The data (responses, advantages) come from one generate
      at construction and stay fixed.
    """

    def __init__(self, beta: float) -> None:
        from transformers import GenerationConfig

        if beta < 0:
            raise ValueError(f"beta: expected a number >= 0, got {beta}")
        self.beta = beta
        self.policy = g.build_policy()
        self.reference = copy.deepcopy(self.policy).requires_grad_(False) if beta > 0 else None
        prompts = g.prompt_ids()
        self.prompt_ids = prompts.repeat_interleave(g.GROUP, dim=0)  # (64, 8): 8 responses per prompt
        self.prompt_mask = torch.ones_like(self.prompt_ids)
        self.generation_config = GenerationConfig(
            do_sample=True,
            max_new_tokens=g.RESPONSE_TOKENS,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            eos_token_id=g.EOS_ID,
            pad_token_id=g.PAD_ID,
        )
        self.uniforms = torch.rand(g.BATCH, g.RESPONSE_TOKENS, dtype=torch.float64)
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=g.LEARNING_RATE, weight_decay=0.0, fused=True
        )
        sequences = self.generate()
        width = sequences.shape[1] - self.prompt_ids.shape[1]
        completion = sequences[:, -width:]
        is_eos = completion == g.EOS_ID
        self.input_ids = sequences
        self.completion_mask = (is_eos.long().cumsum(dim=1) - is_eos.long()) == 0  # up to the first EOS
        self.attention_mask = torch.cat([self.prompt_mask, self.completion_mask.long()], dim=1)
        self.width = width
        self.advantages = torch.randn(g.BATCH, 1, generator=torch.Generator().manual_seed(1))

    @torch.no_grad()
    def generate(self) -> Tensor:
        """``model.generate`` of the 64 responses: (64, 8 + N) prompt + response ids."""
        out: Tensor = self.policy.generate(
            input_ids=self.prompt_ids,
            attention_mask=self.prompt_mask,
            generation_config=self.generation_config,
        )
        return out

    @torch.no_grad()
    def generate_own(self) -> Any:
        """ppo-ref's sampler (``ppo_ref.trainer.generation.generate``) on the same prompts."""
        from ppo_ref.trainer.generation import generate

        return generate(
            self.policy, self.prompt_ids, self.prompt_mask, self.uniforms, eos_id=g.EOS_ID, pad_id=g.PAD_ID
        )

    def _logprobs(self, model: Any, rows: slice) -> Tensor:
        logits = model(
            input_ids=self.input_ids[rows],
            attention_mask=self.attention_mask[rows],
            logits_to_keep=self.width + 1,
        ).logits[:, :-1]
        targets = self.input_ids[rows, -self.width :]
        return logits.float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def reference_forward(self) -> Tensor | None:
        """The reference's token log-probs of the batch (None when beta = 0)."""
        if self.reference is None:
            return None
        return torch.cat(
            [
                self._logprobs(self.reference, slice(s, s + g.MICRO_BATCH))
                for s in range(0, g.BATCH, g.MICRO_BATCH)
            ]
        )

    def update(self, reference_logprobs: Tensor | None = None) -> Tensor:
        """One optimizer step over the micro-batches; returns the summed loss (detached)."""
        tokens = self.completion_mask.sum()
        total = torch.zeros(())
        for start in range(0, g.BATCH, g.MICRO_BATCH):
            rows = slice(start, start + g.MICRO_BATCH)
            logp = self._logprobs(self.policy, rows)
            ratio = torch.exp(logp - logp.detach())
            adv = self.advantages[rows]
            per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - g.CLIP, 1 + g.CLIP) * adv)
            if reference_logprobs is not None:
                delta = reference_logprobs[rows] - logp
                per_token = per_token + self.beta * (torch.exp(delta) - delta - 1)
            loss = (per_token * self.completion_mask[rows]).sum() / tokens
            loss.backward()
            total = total + loss.detach()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total

    def measure(self, repeats: int = 1) -> dict[str, float]:
        """Median seconds of each part over ``repeats`` runs; ``bare`` = generate + reference + update
        (with ``model.generate``), ``bare_own`` the same with ppo-ref's sampler instead; the
        ``*_cpu`` entries are the same in process CPU seconds."""
        reference = self.reference_forward()
        timed = {
            "generate": _timed(self.generate, repeats),
            "generate_own": _timed(self.generate_own, repeats),
            "reference": _timed(self.reference_forward, repeats)
            if self.reference is not None
            else (0.0, 0.0),
            "update": _timed(lambda: self.update(reference), repeats),
        }
        parts = {name: wall for name, (wall, _) in timed.items()}
        cpu = {name: seconds for name, (_, seconds) in timed.items()}
        parts["bare"] = parts["generate"] + parts["reference"] + parts["update"]
        parts["bare_own"] = parts["generate_own"] + parts["reference"] + parts["update"]
        parts["bare_cpu"] = cpu["generate"] + cpu["reference"] + cpu["update"]
        parts["bare_own_cpu"] = cpu["generate_own"] + cpu["reference"] + cpu["update"]
        parts.update({f"{name}_cpu": seconds for name, seconds in cpu.items()})
        return parts


def serve(role: str, beta: float) -> None:
    """Worker loop for ``tools/run_bench.py`` (the protocol of :func:`bench.ppo_ref_side.serve`).

    ``trainer``: ``iterations`` / ``info`` / ``quit``; ``bare``: ``bare`` / ``info`` / ``quit``.
    """
    from bench import tiny_ppo

    stepper: TrainStepper | None = None
    bare: BareGrpo | None = None
    if role == "trainer":
        stepper = TrainStepper(make_grpo_trainer(tempfile.mkdtemp(prefix="ppo-ref-grpo-bench-"), beta))
    elif role == "bare":
        bare = BareGrpo(beta)
    else:
        raise ValueError(f"role: expected 'trainer' or 'bare', got {role!r}")
    reply({"ready": True, "peak_rss_bytes": tiny_ppo.peak_rss_bytes()})
    try:
        for line in sys.stdin:
            command = json.loads(line)
            if command["cmd"] == "iterations" and stepper is not None:
                seconds = [stepper.step() for _ in range(int(command["n"]))]
                reply({"seconds": seconds, "cpu_seconds": stepper.cpu_seconds[-len(seconds) :]})
            elif command["cmd"] == "bare" and bare is not None:
                reply(bare.measure(int(command.get("repeats", 1))))
            elif command["cmd"] == "info":
                if stepper is not None:
                    reply(info(stepper, int(command.get("skip", 0))))
                else:
                    reply({"peak_rss_bytes": tiny_ppo.peak_rss_bytes(), "threads": torch.get_num_threads()})
            elif command["cmd"] == "quit":
                break
            else:
                reply({"error": f"unknown command for role {role}: {command}"})
    finally:
        if stepper is not None:
            stepper.close()


def main(argv: list[str] | None = None) -> int:
    from bench import tiny_ppo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=["trainer", "bare"], help="worker mode for tools/run_bench.py")
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0 or 0.04 in the run)")
    parser.add_argument("--warmup", type=int, default=2, help="iterations run before timing")
    parser.add_argument("--iterations", type=int, default=8, help="timed iterations")
    args = parser.parse_args(argv)
    torch.set_num_threads(g.THREADS)
    if args.serve:
        tiny_ppo.claim_stdout_for_protocol()
        serve(args.serve, args.beta)
        return 0
    stepper = TrainStepper(make_grpo_trainer(tempfile.mkdtemp(prefix="ppo-ref-grpo-bench-"), args.beta))
    try:
        result = stepper.timed(args.warmup, args.iterations) | info(stepper)
        print(json.dumps(result))
    finally:
        stepper.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
