"""ppo-ref's side of the trainer benchmark: its trainer at the fixed settings, stepped one iteration
at a time, and the bare model work of an iteration timed alone.

:class:`TrainStepper` runs ``PPOTrainer.train()`` itself (every runtime check, metric, audit record,
TensorBoard event and progress-bar update included) in a background thread that pauses at the
start of each iteration, so a caller can time exactly one iteration of the real loop.
:class:`BareCompute` times the unavoidable model work of the same iteration with the same models:
generation with the trainer's sampler, the four no-grad forwards, and the 16 minibatch forward,
backward and optimizer steps, with nothing else around them.

``python -m bench.ppo_ref_side`` prints the median of 16 iterations after 3 warm-up ones and the
process's peak RSS; ``--serve`` is the worker that ``tools/run_bench.py`` drives (see :func:`serve`).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bench import tiny_ppo as s
from bench.paused_train import PausedTrain
from bench.worker import reply
from bench.worker import serve as serve_requests

__all__ = ["BareCompute", "TrainStepper", "make_trainer", "serve"]


def bench_config(out_dir: str, **overrides: Any) -> Any:
    """ppo-ref's :class:`TrainerConfig` at the benchmark settings (checks and metrics all on)."""
    from ppo_ref.trainer import TrainerConfig

    values: dict[str, Any] = dict(
        task="bench-tiny-gpt2",
        iterations=1_000_000,  # the stepper stops the run; train() never reaches the end
        seed=s.SEED,
        out=out_dir,
        rollout_batch_size=s.BATCH,
        max_new_tokens=s.RESPONSE_TOKENS,
        temperature=1.0,
        missing_eos="none",  # no response can end (EOS is outside the vocabulary); TRL: no penalty
        kl_coef=s.KL_COEF,
        kl_estimator="k1",
        truncation="terminal",  # TRL: value after the last column is 0
        gamma=s.GAMMA,
        lam=s.LAM,
        ppo_epochs=s.EPOCHS,
        num_minibatches=s.MINIBATCHES,
        clip_eps=s.CLIP,
        value_clip_eps=s.VALUE_CLIP,
        vf_coef=s.VF_COEF,
        entropy_coef=0.0,
        critic="policy",
        learning_rate=s.LEARNING_RATE,
        weight_decay=0.0,
        max_grad_norm=None,  # no clipping (TRL clips nothing); the norms are still computed and logged
        eval_samples=s.BATCH,  # evaluation happens outside the timed iterations
        plots=False,  # written once at the end of a run, outside the timed iterations
        mixed_precision="no",
    )
    values.update(overrides)
    return TrainerConfig(**values)


def make_trainer(out_dir: str, **overrides: Any) -> Any:
    """A :class:`ppo_ref.trainer.PPOTrainer` on the benchmark's models, tokenizer and prompts."""
    from ppo_ref.trainer import PPOTrainer, TrainingSetup

    models = s.build_models()
    texts = s.prompt_texts()
    setup = TrainingSetup(
        tokenizer=s.build_tokenizer(),
        policy=models["policy"],
        train_prompts=texts,
        eval_prompts=texts[: s.BATCH],
        reward_model=models["reward"],
        reference=models["reference"],
        name="bench-tiny-gpt2",
    )
    return PPOTrainer(bench_config(out_dir, **overrides), setup)


class TrainStepper(PausedTrain):
    """Runs ``trainer.train()`` in a thread that waits at the start of every iteration.

    ``step()`` lets exactly one iteration run (rollout, update, checks, metrics, audit log,
    TensorBoard, progress bar) and returns its wall seconds. The pause point is the entry of
    ``collect_rollout``, the first thing ``train()`` does in each iteration.
    """

    def __init__(self, trainer: Any) -> None:
        super().__init__("ppo-ref", " (config.iterations too small?)")
        self.trainer = trainer
        self._profiler: cProfile.Profile | None = None
        self._profile_left = 0
        original: Callable[..., Any] = trainer.collect_rollout

        def paused_collect_rollout(iteration: int, timings: dict[str, float] | None = None) -> Any:
            if self._profiler is not None:
                self._profiler.disable()  # the pause is not part of any iteration
            self.pause()
            if self._profile_left > 0:
                self._profile_left -= 1
                self._profiler = self._profiler or cProfile.Profile()
                self._profiler.enable()
            return original(iteration, timings)

        trainer.collect_rollout = paused_collect_rollout
        self.start(trainer.train, "ppo-ref-train")  # initial evaluation done, paused before iteration 0

    def profile(self, iterations: int) -> pstats.Stats:
        """Run ``iterations`` iterations under cProfile (in the training thread); return the stats."""
        self._profile_left = iterations
        for _ in range(iterations):
            self.step()
        profiler, self._profiler = self._profiler, None  # the thread is paused: no race
        assert profiler is not None
        return pstats.Stats(profiler)

    def metrics_records(self) -> list[dict[str, Any]]:
        """The metrics.jsonl records written so far (one per finished iteration)."""
        path = Path(self.trainer.config.out) / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _median_seconds(call: Callable[[], object], repeats: int, cpu: list[float] | None = None) -> float:
    """Median wall seconds of ``repeats`` calls; the median process CPU seconds go to ``cpu``."""
    times, cpu_times = [], []
    for _ in range(repeats):
        began, cpu_began = time.perf_counter(), time.process_time()
        call()
        times.append(time.perf_counter() - began)
        cpu_times.append(time.process_time() - cpu_began)
    if cpu is not None:
        cpu.append(statistics.median(cpu_times))
    return statistics.median(times)


class BareCompute:
    """The model work of one iteration alone, on copies of a trainer's models (same shapes, same
    device, same autocast), sized by the trainer's config.

    * ``generate``: the trainer's own sampler (``ppo_ref.trainer.generation.generate``) on one
      rollout batch of prompts;
    * ``forwards``: the four no-grad forwards over prompt + response (policy logits for the old
      log-probs, reference logits, critic values, reward-model hidden state and head);
    * ``update``: every minibatch step of the PPO epochs: policy and critic forward, a plain clipped
      policy loss and clipped value loss (no validation, no statistics), backward, AdamW step.
    """

    def __init__(self, trainer: Any) -> None:
        from ppo_ref.trainer.generation import SequenceBatch, left_pad

        self.config = config = trainer.config
        self.device = trainer.device
        self.autocast = trainer.autocast
        self.policy = copy.deepcopy(trainer.policy).eval()
        self.reference = trainer.reference
        self.critic = copy.deepcopy(trainer.actor_critic.critic).eval()
        self.reward_backbone = trainer.train_scorer.backbone
        self.reward_head = trainer.train_scorer.head
        self.eos_id, self.pad_id = trainer.eos_id, trainer.pad_id
        batch = config.rollout_batch_size
        self.prompt_ids, self.prompt_mask = left_pad(
            trainer.train_prompt_ids[:batch], self.pad_id, self.device
        )
        self.uniforms = torch.rand(batch, config.max_new_tokens, dtype=torch.float64, device=self.device)
        generated = self.generate()
        self.sequences = SequenceBatch.build(
            self.prompt_ids, self.prompt_mask, generated.response_ids, generated.response_mask
        )
        params = [p for p in self.policy.parameters()] + [p for p in self.critic.parameters()]
        self.optimizer = torch.optim.AdamW(
            params, lr=config.learning_rate, weight_decay=config.weight_decay, fused=True
        )
        width = self.sequences.response_width
        generator = torch.Generator().manual_seed(1)
        shape = (batch, width)
        self.old_logp = (-torch.rand(shape, generator=generator) * 4).to(self.device)
        self.advantages = torch.randn(shape, generator=generator).to(self.device)
        self.old_values = (torch.randn(shape, generator=generator) * 0.1).to(self.device)
        self.returns = torch.randn(shape, generator=generator).to(self.device)

    @torch.no_grad()
    def generate(self) -> Any:
        from ppo_ref.trainer.generation import generate

        with self.autocast():
            return generate(
                self.policy,
                self.prompt_ids,
                self.prompt_mask,
                self.uniforms,
                eos_id=self.eos_id,
                pad_id=self.pad_id,
                temperature=1.0,
            )

    def _inputs(self, rows: slice | None = None) -> dict[str, Tensor]:
        seq = self.sequences if rows is None else self.sequences.rows(rows)
        return {
            "input_ids": seq.input_ids,
            "attention_mask": seq.attention_mask,
            "position_ids": seq.position_ids,
        }

    @torch.no_grad()
    def forwards(self) -> dict[str, Tensor]:
        """The four no-grad forwards; returns their outputs (policy and reference logits, values, scores)."""
        keep = self.sequences.response_width + 1
        inputs = self._inputs()
        with self.autocast():
            policy = self.policy(**inputs, logits_to_keep=keep).logits
            reference = self.reference(**inputs, logits_to_keep=keep).logits
            values = self.critic(**inputs, keep_last=keep)
            hidden = self.reward_backbone(**inputs).last_hidden_state
            scores = self.reward_head(hidden[:, -1])
        return {"policy_logits": policy, "reference_logits": reference, "values": values, "scores": scores}

    def update(self) -> list[Tensor]:
        """The PPO epochs' optimizer steps on fixed data; returns each step's loss (detached, no sync)."""
        config = self.config
        width = self.sequences.response_width
        clip, value_clip = config.clip_eps, config.value_clip_eps or float("inf")
        losses: list[Tensor] = []
        for _ in range(config.ppo_epochs):
            for start in range(0, config.rollout_batch_size, config.minibatch_size):
                rows = slice(start, start + config.minibatch_size)
                inputs = self._inputs(rows)
                with self.autocast():
                    logits = self.policy(**inputs, logits_to_keep=width + 1).logits[:, :-1]
                    values = self.critic(**inputs, keep_last=width + 1)[:, :-1]
                targets = inputs["input_ids"][:, -width:]
                logp = logits.float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
                ratio = torch.exp(logp - self.old_logp[rows])
                adv = self.advantages[rows]
                pg = -torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
                old, ret = self.old_values[rows], self.returns[rows]
                clipped = old + (values - old).clamp(-value_clip, value_clip)
                vf = 0.5 * torch.maximum((values - ret) ** 2, (clipped - ret) ** 2).mean()
                loss = pg + config.vf_coef * vf
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                losses.append(loss.detach())
        return losses

    def _seconds(self, call: Callable[[], object], repeats: int, cpu: list[float] | None = None) -> float:
        def synchronized() -> None:
            call()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        return _median_seconds(synchronized, repeats, cpu)

    def measure(self, repeats: int = 3) -> dict[str, float]:
        """Median seconds of each part over ``repeats`` runs, and their sum (``bare``); ``bare_cpu``
        is the same sum in process CPU seconds."""
        cpu: list[float] = []
        parts = {
            "generate": self._seconds(self.generate, repeats, cpu),
            "forwards": self._seconds(self.forwards, repeats, cpu),
            "update": self._seconds(self.update, repeats, cpu),
        }
        parts["bare"] = parts["generate"] + parts["forwards"] + parts["update"]
        parts["bare_cpu"] = sum(cpu)
        return parts


def serve() -> None:
    """Worker loop for ``tools/run_bench.py``: one JSON command per stdin line, one JSON reply per line.

    ``{"cmd": "iterations", "n": k}`` -> ``{"seconds": [...]}`` (k iterations of ``train()``);
    ``{"cmd": "bare", "repeats": r}`` -> the :meth:`BareCompute.measure` dict (the same process, so
    the two are timed under the same conditions); ``{"cmd": "profile", "n": k}`` -> k iterations
    under cProfile; ``{"cmd": "info"}`` -> versions, peak RSS, stage timings; ``{"cmd": "quit"}``.
    """
    out_dir = tempfile.mkdtemp(prefix="ppo-ref-bench-")
    trainer = make_trainer(out_dir)
    bare = BareCompute(trainer)  # copies the initial models (about 1 MB) before any update
    stepper = TrainStepper(trainer)

    def profile(request: dict[str, Any]) -> dict[str, Any]:
        return profile_summary(stepper.profile(int(request["n"])), int(request["n"]))

    reply({"ready": True, "peak_rss_bytes": s.peak_rss_bytes()})
    try:
        serve_requests(
            {
                "iterations": stepper.iterations,
                "bare": lambda request: bare.measure(int(request.get("repeats", 3))),
                "profile": profile,
                "info": lambda request: info(stepper, int(request.get("skip", 0))),
            }
        )
    finally:
        stepper.close()


def profile_summary(stats: pstats.Stats, iterations: int, top: int = 22) -> dict[str, Any]:
    """Self seconds per iteration by where the code lives, and the top functions by self time."""
    areas: dict[str, float] = {}
    rows = []
    for (file, line, name), (_, calls, self_s, total_s, _) in stats.stats.items():  # type: ignore[attr-defined]
        if "/ppo_ref/" in file:
            area = "ppo_ref (trainer and math, Python)"
        elif file == "~" or file.startswith("<"):
            area = "built-ins (torch ops, numpy, I/O)"
        elif "/torch/" in file:
            area = "torch (Python: autograd, optimizer, nn.Module)"
        elif "/transformers/" in file:
            area = "transformers (Python: model code)"
        else:
            area = "other Python (accelerate, tensorboard, json, threading, ...)"
        areas[area] = areas.get(area, 0.0) + self_s / iterations
        where = name if file == "~" else f"{Path(file).name}:{line}({name})"
        rows.append((self_s / iterations, total_s / iterations, calls // iterations, where))
    rows.sort(reverse=True)
    return {
        "iterations": iterations,
        "self_seconds_per_iteration_by_area": dict(sorted(areas.items(), key=lambda kv: -kv[1])),
        "top_self_seconds_per_iteration": [
            {"self_s": a, "cumulative_s": b, "calls": c, "function": w} for a, b, c, w in rows[:top]
        ],
    }


def info(stepper: TrainStepper, skip: int = 0) -> dict[str, Any]:
    """Versions, threads, peak RSS, and the median stage timings of the metrics.jsonl records so
    far, leaving out the first ``skip`` (warm-up) iterations."""
    import accelerate
    import transformers

    import ppo_ref

    records = stepper.metrics_records()
    timed = records[skip:] or records
    return {
        "peak_rss_bytes": s.peak_rss_bytes(),
        "iterations_logged": len(records),
        "last_record": records[-1] if records else None,
        "stage_seconds_median": {
            key: statistics.median(r[key] for r in timed)
            for key in (timed[0] if timed else {})
            if key.startswith("seconds_") and all(isinstance(r.get(key), (int, float)) for r in timed)
        },
        "versions": {
            "ppo_ref": ppo_ref.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "accelerate": accelerate.__version__,
        },
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="worker mode for tools/run_bench.py")
    parser.add_argument("--warmup", type=int, default=3, help="iterations run before timing")
    parser.add_argument("--iterations", type=int, default=16, help="timed iterations")
    args = parser.parse_args(argv)
    torch.set_num_threads(s.THREADS)
    if args.serve:
        s.claim_stdout_for_protocol()
        serve()
        return 0
    stepper = TrainStepper(make_trainer(tempfile.mkdtemp(prefix="ppo-ref-bench-")))
    try:
        result = stepper.timed(args.warmup, args.iterations)
        result |= {
            "tokens_per_second": s.BATCH * s.RESPONSE_TOKENS / result["median_seconds_per_iteration"],
            **info(stepper),
        }
        print(json.dumps(result))
    finally:
        stepper.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
