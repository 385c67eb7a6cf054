"""GPU variant of the trainer benchmark: ppo-ref's PPOTrainer on a randomly initialised ~125M model.

    python examples/gpu_trainer_bench.py                       # GPT-2 small shape, bf16, on CUDA
    python examples/gpu_trainer_bench.py --model llama-125m    # a Llama shape of about the same size
    python examples/gpu_trainer_bench.py --smoke               # tiny sizes on the CPU (proves the path)

Nothing is downloaded: the models are built from a config with random weights (policy, frozen
reference, reward model; the critic is a copy of the policy's backbone with a zero head), and the
tokenizer is a word-level vocabulary ``t0 .. t{V-1}`` with PAD and EOS outside the model's
vocabulary, so every response has exactly ``--response-tokens`` tokens. ``train()`` runs with every
check and metric on (as in ``bench/test_trainer.py``); the bare model work of an iteration
(generation, the four no-grad forwards, the update's forward/backward/AdamW steps) is timed in the
same process between iterations. Prints a Markdown block to paste into ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import tiny_ppo  # noqa: E402
from bench.ppo_ref_side import BareCompute, TrainStepper, bench_config  # noqa: E402

SHAPES: dict[str, dict[str, int]] = {
    "gpt2-125m": {"layers": 12, "heads": 12, "hidden": 768, "vocab": 50257},
    "llama-125m": {"layers": 12, "heads": 12, "hidden": 768, "vocab": 32000, "intermediate": 2048},
    "smoke": {"layers": 2, "heads": 2, "hidden": 64, "vocab": 128, "intermediate": 128},
}


def build_models(kind: str, shape: dict[str, int], context: int) -> dict[str, Any]:
    """Policy, reference (a copy of the policy) and a one-label reward model, random init, float32."""
    if kind.startswith("llama"):
        from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

        def config(**extra: Any) -> Any:
            return LlamaConfig(
                hidden_size=shape["hidden"],
                intermediate_size=shape["intermediate"],
                num_hidden_layers=shape["layers"],
                num_attention_heads=shape["heads"],
                num_key_value_heads=shape["heads"],
                vocab_size=shape["vocab"],
                max_position_embeddings=context,
                bos_token_id=None,
                eos_token_id=None,
                **extra,
            )

        lm, classifier = LlamaForCausalLM, LlamaForSequenceClassification
    else:
        from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

        def config(**extra: Any) -> Any:
            return GPT2Config(
                n_layer=shape["layers"],
                n_head=shape["heads"],
                n_embd=shape["hidden"],
                vocab_size=shape["vocab"],
                n_positions=context,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                bos_token_id=None,
                eos_token_id=None,
                **extra,
            )

        lm, classifier = GPT2LMHeadModel, GPT2ForSequenceClassification
    torch.manual_seed(0)
    policy = lm(config()).float()
    torch.manual_seed(1)
    reward = classifier(config(num_labels=1)).float()
    reference = lm(config()).float()
    reference.load_state_dict(policy.state_dict())
    return {"policy": policy, "reference": reference, "reward": reward}


def build_tokenizer(vocab: int) -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    words["[PAD]"], words["[EOS]"] = vocab, vocab + 1
    core = Tokenizer(WordLevel(words, unk_token="[PAD]"))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="[PAD]", eos_token="[EOS]", unk_token="[PAD]", padding_side="left"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["gpt2-125m", "llama-125m"], default="gpt2-125m")
    parser.add_argument("--smoke", action="store_true", help="tiny model and batch on the CPU, 2 iterations")
    parser.add_argument("--batch", type=int, default=64, help="rollout batch size")
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--mixed-precision", choices=["auto", "no", "bf16"], default="auto")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch, args.prompt_tokens, args.response_tokens = 8, 8, 8
        args.warmup, args.iterations, args.minibatches, args.epochs = 1, 2, 2, 2
    kind = f"{args.model} (smoke size)" if args.smoke else args.model
    shape = SHAPES["smoke" if args.smoke else args.model]
    torch.set_num_threads(max(1, torch.get_num_threads()))

    from ppo_ref.trainer import PPOTrainer, TrainingSetup

    context = args.prompt_tokens + args.response_tokens
    models = build_models(args.model, shape, context)
    generator = torch.Generator().manual_seed(100)
    prompt_ids = torch.randint(
        0, shape["vocab"], (max(4 * args.batch, 64), args.prompt_tokens), generator=generator
    )
    texts = [" ".join(f"t{i}" for i in row) for row in prompt_ids.tolist()]
    out_dir = tempfile.mkdtemp(prefix="ppo-ref-gpu-bench-")
    config = bench_config(
        out_dir,
        rollout_batch_size=args.batch,
        max_new_tokens=args.response_tokens,
        num_minibatches=args.minibatches,
        ppo_epochs=args.epochs,
        eval_samples=args.batch,
        mixed_precision=args.mixed_precision,
        progress_bar=False,
    )
    setup = TrainingSetup(
        tokenizer=build_tokenizer(shape["vocab"]),
        policy=models["policy"],
        train_prompts=texts,
        eval_prompts=texts[: args.batch],
        reward_model=models["reward"],
        reference=models["reference"],
        name=f"bench-{args.model}",
    )
    trainer = PPOTrainer(config, setup)
    device = trainer.device
    bare = BareCompute(trainer)
    stepper = TrainStepper(trainer)
    try:
        for _ in range(args.warmup):
            stepper.step()
        bare.measure(repeats=1)  # warm-up
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seconds, bares = [], []
        for _ in range(args.iterations):
            seconds.append(stepper.step())
            bares.append(bare.measure(repeats=1))
        records = stepper.metrics_records()[-args.iterations :]
    finally:
        stepper.close()
    parameters = sum(p.numel() for p in models["policy"].parameters())
    median = statistics.median(seconds)
    tokens = args.batch * args.response_tokens
    bare_median = {k: statistics.median(b[k] for b in bares) for k in bares[0]}
    overheads = [s / b["bare"] for s, b in zip(seconds, bares, strict=True)]
    # seconds_iteration is left out: the trainer's own clock also counts the stepper's pause.
    stages = {
        k: statistics.median(r[k] for r in records)
        for k in records[0]
        if k.startswith("seconds_") and k != "seconds_iteration"
    }
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    lines = [
        f"### GPU trainer benchmark: {kind}, {parameters / 1e6:.1f}M parameters per model ({name})",
        "",
        f"`python examples/gpu_trainer_bench.py {' '.join(argv if argv is not None else sys.argv[1:])}` on "
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; torch {torch.__version__}, mixed precision "
        f"{'bf16' if trainer.autocast_dtype is not None else 'no'}; batch {args.batch}, "
        f"{args.prompt_tokens}-token prompts, {args.response_tokens}-token responses, {args.epochs} epochs x "
        f"{args.minibatches} minibatches; {args.iterations} timed iterations after {args.warmup} warm-up.",
        "",
        "| | value |",
        "|---|---|",
        f"| seconds per iteration, median (min-max) | {median:.3f} ({min(seconds):.3f}-{max(seconds):.3f}) |",
        f"| response tokens per second | {tokens / median:.0f} |",
        f"| bare compute: generate / forwards / update / sum | {bare_median['generate']:.3f} / "
        f"{bare_median['forwards']:.3f} / {bare_median['update']:.3f} / {bare_median['bare']:.3f} s |",
        f"| overhead (iteration / bare, median of pairs) | {statistics.median(overheads):.2f}x |",
        "| ppo-ref stages (median s) | "
        + ", ".join(f"{k.removeprefix('seconds_')} {v:.3f}" for k, v in stages.items())
        + " |",
        f"| peak RSS | {tiny_ppo.peak_rss_bytes() / 2**20:.0f} MiB |",
    ]
    if device.type == "cuda":
        allocated = torch.cuda.max_memory_allocated(device) / 2**30
        reserved = torch.cuda.max_memory_reserved(device) / 2**30
        lines.append(f"| peak GPU memory allocated / reserved | {allocated:.2f} / {reserved:.2f} GiB |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"\n(wall {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    raise SystemExit(code)
