"""The float64 tiny run of data_parallel_worker.py as one rank of two FSDP2 processes on CPUs.

Launched as a user launches FSDP2, through the accelerate config the GPU check uses::

    accelerate launch --config_file examples/accelerate/fsdp2.yaml --num_processes 2 \\
        tests/reliability/fsdp2_worker.py OUT [CHECKPOINT]

The trainer builds its own accelerator (``default_accelerator``: on CPU processes with an FSDP
config, accelerate's state switched to FSDP2). It trains the run of ``worker_config`` with a
checkpoint after every iteration (or resumes CHECKPOINT and finishes it), then writes
``OUT/fsdp2-rank{R}.json``: how the parameters were sharded, how many policy forwards this
process made and how many generation steps it sampled only because another process's rows had
not ended, and the result of :func:`generation_check` (not after a resume).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from data_parallel_worker import float64_setup, worker_config
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from ppo_ref.trainer import PPOTrainer, TrainerConfig
from ppo_ref.trainer.distributed import exit_launched_process
from ppo_ref.trainer.generation import generate, left_pad, position_ids_from_mask

ROWS = 2  # rows per process in the generation check
STEPS = 6  # its max_new_tokens


def fsdp2_config(out: Path) -> TrainerConfig:
    """The data-parallel test's run, with a checkpoint after every iteration."""
    return replace(worker_config(out), save_every=1)


class Counters:
    """Policy forwards (``mode="policy"``) and generation steps sampled only for other processes."""

    def __init__(self, trainer: PPOTrainer) -> None:
        self.policy_forwards = 0
        self.waited_steps = 0
        module = trainer.actor_critic.module
        forward, all_true = module.forward, trainer.parallel.all_true

        def counted_forward(mode: str, **kwargs: Any) -> Any:
            self.policy_forwards += mode == "policy"
            return forward(mode, **kwargs)

        def counted_all_true(flag: bool) -> bool:
            result = all_true(flag)
            self.waited_steps += flag and not result
            return result

        module.forward = counted_forward  # type: ignore[method-assign]
        trainer.parallel.all_true = counted_all_true  # type: ignore[method-assign]


def sharding(trainer: PPOTrainer) -> dict[str, Any]:
    """How the trained module is held: DTensor parameters, this process's share of the elements."""
    module = trainer.actor_critic.module
    parameters = list(module.parameters())
    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in parameters)
    return {
        "distributed_type": str(trainer.accelerator.distributed_type),
        "backend": trainer.parallel.backend,
        "sharded_parameters": trainer.parallel.sharded_parameters,
        "parameters": len(parameters),
        "dtensor_parameters": sum(isinstance(p, DTensor) for p in parameters),
        "fsdp_modules": sum(isinstance(m, FSDPModule) for m in module.modules()),
        "local_elements": local,
        "global_elements": sum(p.numel() for p in parameters),
    }


def generation_check(trainer: PPOTrainer, counters: Counters) -> dict[str, Any]:
    """ZeRO-3-style sampling with rows of different lengths on different processes.

    Process r samples ``ROWS`` prompts through the sharded module, with noise chosen so that rank
    0's rows draw EOS at their first step and rank 1's never do (their noise picks the last
    tokens of the vocabulary). Every forward all-gathers parameters, so rank 0 must keep making
    forwards until rank 1's rows end: ``generate(..., all_ended=parallel.all_true)``, as the
    trainer calls it. The same rows are then sampled in this process alone by a plain copy of the
    policy (the full state dict gathered from the shards); returned: both results and the
    forward counts.
    """
    rank, pad_id, eos_id = trainer.parallel.rank, trainer.pad_id, trainer.eos_id
    encoded = trainer.train_prompt_ids[rank * ROWS : (rank + 1) * ROWS]
    ids, mask = left_pad(encoded, pad_id, width=max(len(p) for p in trainer.train_prompt_ids[: 2 * ROWS]))
    caller = trainer.actor_critic.policy_caller()
    with torch.no_grad():
        logits = caller(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    cdf = torch.softmax(logits[:, -1].double(), dim=-1).cumsum(dim=-1)
    uniforms = torch.full((ROWS, STEPS), 0.999, dtype=torch.float64)
    if rank == 0:  # the middle of EOS's interval of the first step's CDF
        low = cdf[:, eos_id - 1] if eos_id > 0 else torch.zeros(ROWS, dtype=torch.float64)
        uniforms[:, 0] = (low + cdf[:, eos_id]) / 2 / cdf[:, -1]
    full = get_model_state_dict(trainer.actor_critic.module, options=StateDictOptions(full_state_dict=True))
    plain = float64_setup().policy.eval()
    plain.load_state_dict({k.removeprefix("policy."): v for k, v in full.items() if k.startswith("policy.")})
    before, waited = counters.policy_forwards, counters.waited_steps
    sharded = generate(
        caller, ids, mask, uniforms, eos_id=eos_id, pad_id=pad_id, all_ended=trainer.parallel.all_true,
        inference_mode=False,
    )  # fmt: skip
    sharded_forwards, sharded_waited = counters.policy_forwards - before, counters.waited_steps - waited
    calls: list[object] = []
    plain.register_forward_pre_hook(lambda module, args: calls.append(module))
    alone = generate(plain, ids, mask, uniforms, eos_id=eos_id, pad_id=pad_id)
    return {
        "sharded_response_ids": sharded.response_ids.tolist(),
        "sharded_response_mask": sharded.response_mask.tolist(),
        "sharded_forwards": sharded_forwards,
        "sharded_waited_steps": sharded_waited,
        "alone_response_ids": alone.response_ids.tolist(),
        "alone_response_mask": alone.response_mask.tolist(),
        "alone_forwards": len(calls),
        "pad_id": pad_id,
        "eos_id": eos_id,
    }


def main(out: Path, checkpoint: Path | None) -> None:
    torch.set_num_threads(1)
    trainer = PPOTrainer(fsdp2_config(out), float64_setup(), resume=checkpoint)
    report = {"rank": trainer.parallel.rank, "resumed": checkpoint is not None, **sharding(trainer)}
    counters = Counters(trainer)
    trainer.train()
    report.update(policy_forwards=counters.policy_forwards, waited_steps=counters.waited_steps)
    if checkpoint is None:
        report["generation"] = generation_check(trainer, counters)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"fsdp2-rank{trainer.parallel.rank}.json").write_text(json.dumps(report, indent=1))
    exit_launched_process(trainer.accelerator)  # the trainer still held: no teardown hang or abort


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
