"""PPO throughput and peak memory of ppo-ref's trainer on a random-initialised model of SmolLM2-135M's shape.

Nothing is loaded: the model is a ``LlamaForCausalLM`` built from :func:`smollm2_shape_config`
(30 layers, hidden 576, 9/3 heads, MLP 1536, vocabulary 49152, tied embeddings; 134.5M parameters)
and the tokenizer is a synthetic word-level one of the same vocabulary size (``w3`` ... ``w49151``),
built in memory. The reward is a cheap rule on the sampled words (the share of even token ids), so the
figures measure the trainer, not a reward model. Random weights rarely sample EOS, so nearly every
response runs to ``--max-new-tokens``: a steady full-length workload.

On a GPU the trainer runs its bf16 autocast (float32 master weights; log-prob, KL and advantage math
in float32). The first iteration is a warm-up and is left out of the averages. Peak memory is
``torch.cuda.max_memory_allocated`` over the whole run (initial and final evaluation included).

    python examples/smollm2_gpu_bench.py                  # GPU: 5 iterations, batch 64, 64 + 128 tokens
    python examples/smollm2_gpu_bench.py --smoke          # CPU check of the code path: 2 layers, tiny sizes
    python examples/smollm2_gpu_bench.py --append-to bench/RESULTS.md

It prints a Markdown block (ready for ``bench/RESULTS.md``) and writes ``OUT/bench.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from ppo_ref.tasks.smollm2 import smollm2_shape_config
from ppo_ref.trainer import PPOTrainer, TrainerConfig, TrainingSetup

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Ids 0, 1 and 2, as in SmolLM2 (BOS 1, EOS = pad 2)."""


def synthetic_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of ``vocab_size`` tokens: the special tokens, then ``w3`` ... (left padding)."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{index}": index for index in range(len(SPECIAL_TOKENS), vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS[0]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=SPECIAL_TOKENS[0],
        bos_token=SPECIAL_TOKENS[1],
        eos_token=SPECIAL_TOKENS[2],
        pad_token=SPECIAL_TOKENS[2],
        padding_side="left",
    )


def synthetic_prompts(count: int, length: int, vocab_size: int, seed: int) -> list[str]:
    """``count`` prompts of ``length`` random non-special words each."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(SPECIAL_TOKENS), vocab_size, (count, length), generator=generator)
    return [" ".join(f"w{i}" for i in row) for row in ids.tolist()]


def even_token_share(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """Score in [0, 1]: the share of the response's words with an even id (0 for an empty response)."""
    scores = []
    for response in responses:
        words = response.split()
        even = sum(int(w[1:]) % 2 == 0 for w in words if w[1:].isdigit())
        scores.append(even / len(words) if words else 0.0)
    return scores


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=5, help="PPO iterations (the first is a warm-up)")
    parser.add_argument("--batch-size", type=int, default=64, help="responses per iteration")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="tokens per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per response")
    parser.add_argument("--ppo-epochs", type=int, default=4)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--layers", type=int, default=30, help="transformer layers (SmolLM2-135M: 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="output directory (default: a temporary one)")
    parser.add_argument("--append-to", default=None, help="append the Markdown block to this file")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="quick code-path check: 2 layers, batch 4, 8 + 8 tokens, 2 iterations, 1 epoch x 2 minibatches",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.layers, args.batch_size, args.prompt_tokens, args.max_new_tokens = 2, 4, 8, 8
        args.iterations, args.ppo_epochs, args.num_minibatches = 2, 1, 2
    return args


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Train ``args.iterations`` PPO iterations and return the measured figures."""
    torch.manual_seed(args.seed)
    model_config = smollm2_shape_config(args.layers)
    policy = LlamaForCausalLM(model_config)
    tokenizer = synthetic_tokenizer(model_config.vocab_size)
    prompts = synthetic_prompts(args.batch_size + 1, args.prompt_tokens, model_config.vocab_size, args.seed)
    setup = TrainingSetup(
        tokenizer=tokenizer,
        policy=policy,
        train_prompts=prompts[:-1],
        eval_prompts=prompts[-1:],
        reward_function=even_token_share,
        name=f"smollm2-shape-random-{args.layers}-layers",
    )
    config = TrainerConfig(
        out=str(out_dir),
        iterations=args.iterations,
        seed=args.seed,
        rollout_batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        ppo_epochs=args.ppo_epochs,
        num_minibatches=args.num_minibatches,
        missing_eos="none",
        eval_samples=1,
        audit_samples=0,
        progress_bar=False,
        tensorboard=False,
        plots=False,
    )
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    summary = PPOTrainer(config, setup).train()
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    timed = records[1:] if len(records) > 1 else records
    generation = [r.get("seconds_generate") for r in timed]
    device = torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})"
    return {
        "device": device,
        "mixed_precision": summary["mixed_precision"],
        "parameters": sum(p.numel() for p in policy.parameters()),
        "layers": args.layers,
        "batch_size": args.batch_size,
        "prompt_tokens": args.prompt_tokens,
        "max_new_tokens": args.max_new_tokens,
        "ppo_epochs": args.ppo_epochs,
        "num_minibatches": args.num_minibatches,
        "iterations": args.iterations,
        "timed_iterations": len(timed),
        "seconds_per_iteration": statistics.mean(r["seconds_iteration"] for r in timed),
        "response_tokens_per_second": statistics.mean(r["tokens_per_second"] for r in timed),
        "response_length": statistics.mean(r["response_length"] for r in timed),
        "seconds_generation": statistics.mean(generation) if all(g is not None for g in generation) else None,
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_process_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.date.today().isoformat(),
    }


def markdown(result: dict[str, Any], command: str) -> str:
    """The results as a Markdown section for ``bench/RESULTS.md``."""

    def number(value: float | None, digits: int = 2, unit: str = "") -> str:
        return "n/a" if value is None else f"{value:,.{digits}f}{unit}"

    lines = [
        f"## GPU variant: PPO on a random-initialised SmolLM2-135M-shaped model ({result['date']})",
        "",
        f"Command: `{command}`  ",
        f"Device: {result['device']}; mixed precision: {result['mixed_precision']}; "
        f"torch {result['torch']}, transformers {result['transformers']}.",
        "",
        "| setting | value |",
        "|---|---|",
        f"| model | LlamaForCausalLM, {result['layers']} layers x 576, 9/3 heads, vocab 49152, tied; "
        f"{result['parameters'] / 1e6:.1f}M params, random init |",
        f"| rollout batch, prompt + response tokens | {result['batch_size']}, {result['prompt_tokens']} + "
        f"{result['max_new_tokens']} (mean response {result['response_length']:.1f}) |",
        f"| PPO epochs x minibatches | {result['ppo_epochs']} x {result['num_minibatches']} |",
        f"| iterations timed (after 1 warm-up) | {result['timed_iterations']} of {result['iterations']} |",
        f"| seconds per iteration | {number(result['seconds_per_iteration'], 3)} |",
        f"| of which generation (s) | {number(result['seconds_generation'], 3)} |",
        f"| response tokens per second | {number(result['response_tokens_per_second'], 1)} |",
        f"| peak GPU memory (max_memory_allocated) | {number(result['peak_gpu_memory_gib'], unit=' GiB')} |",
        f"| peak process RSS | {number(result['peak_process_rss_gib'], unit=' GiB')} |",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: running on the CPU; these are not GPU figures", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="smollm2-bench-") as scratch:
        out_dir = Path(args.out) if args.out else Path(scratch)
        result = run(args, out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    command = "python examples/smollm2_gpu_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    block = markdown(result, command.strip())
    print(block)
    if args.append_to:
        with open(args.append_to, "a", encoding="utf-8") as handle:
            handle.write("\n" + block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
