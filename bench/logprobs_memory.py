"""Peak extra memory of one adapter's ``token_logprobs`` at B = 4, L = 512, V, in a fresh process.

    python -m bench.logprobs_memory --impl mine --vocab 150000      # prints one JSON object

Measured with the resident set size, which is what torch's CPU allocations occupy (tracemalloc
does not see them): after the logits are allocated and the op has run once on a small input
(imports, lazy initialisation, compilation), the RSS high-water mark is reset (Linux
``/proc/self/clear_refs``), the op runs once on the full logits, and ``extra`` is the new
high-water mark minus the RSS just before the call. Where the mark cannot be reset, the
process's ``ru_maxrss`` is used instead (an upper bound that also holds the import peak).
``extra_over_logits`` is ``extra`` divided by the size of the logits tensor.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
from pathlib import Path

import torch

from bench import tiny_ppo as s

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_high_water() -> bool:
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def measure(impl: str, vocab: int, batch: int = 4, length: int = 512) -> dict[str, object]:
    from ppo_ref.adapters import get_adapter

    adapter = get_adapter(impl)
    if "token_logprobs" not in adapter.ops:
        return {"impl": impl, "vocab": vocab, "skipped": f"{adapter.name} does not provide token_logprobs"}
    generator = torch.Generator().manual_seed(0)
    small = torch.randn(1, 8, vocab, generator=generator)
    adapter.token_logprobs(small, torch.randint(0, vocab, (1, 8), generator=generator))
    # Random rows repeated: allocating B * L * V normal draws would take longer than the op.
    block = torch.randn(64, vocab, generator=generator)
    logits = block.repeat(batch * length // 64, 1).view(batch, length, vocab)
    input_ids = torch.randint(0, vocab, (batch, length), generator=generator)
    del block, small
    gc.collect()
    rss_before = _status_kib("VmRSS")
    reset = rss_before is not None and _reset_high_water()
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = adapter.token_logprobs(logits, input_ids, temperature=1.0)
    if reset:
        peak = _status_kib("VmHWM")
        assert peak is not None and rss_before is not None
        extra_kib, method = peak - rss_before, "VmHWM reset before the call, minus VmRSS before it"
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        extra_kib, method = peak - maxrss_before, "ru_maxrss after minus before (an upper bound)"
    logits_bytes = logits.numel() * logits.element_size()
    return {
        "impl": adapter.name,
        "version": adapter.version,
        "vocab": vocab,
        "shape": [batch, length, vocab],
        "logits_bytes": logits_bytes,
        "extra_peak_bytes": extra_kib * 1024,
        "extra_over_logits": extra_kib * 1024 / logits_bytes,
        "result_shape": list(result.shape),
        "method": method,
        "peak_rss_bytes": s.peak_rss_bytes(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="mine")
    parser.add_argument("--vocab", type=int, default=32_000)
    args = parser.parse_args(argv)
    torch.set_num_threads(s.THREADS)
    json.dump(measure(args.impl, args.vocab), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
