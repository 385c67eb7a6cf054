"""Data parallelism through accelerate: which rows a process owns, and the few collectives the loop needs.

The rule that makes N processes give the result of one: every quantity is defined on the *global*
batch, and a process only does the expensive work for its own rows.

- A rollout batch of B samples is cut into W contiguous blocks of B / W rows (process r owns global
  sample indices ``r * B / W ...``). Each process generates, scores and forwards its block; the
  sampling noise of a sample is keyed by its global index, so the samples are those of one process.
- The rollout is then all-gathered, so every process holds the whole batch: the KL statistics (the
  adaptive controller's input), the advantage whitening and every metric are the same ppo_ref calls
  on the same global tensors as in one process.
- Each minibatch is the one a single process would draw (the shuffle is keyed by seed, iteration and
  epoch); process r runs forward and backward on its W-th of the minibatch's rows. Its loss is its
  share of the *global* minibatch's token count (every process knows the whole minibatch's mask),
  and the data-parallel backend (DDP, FSDP, DeepSpeed) averages gradients over the W processes, so
  each loss is multiplied by W (:attr:`DataParallel.gradient_scale`): the summed gradient equals the
  one-process gradient.
- Decisions that could diverge (a non-finite loss, the step-0 log-prob check, an early stop, a stop
  request) are taken on all-reduced values, so every process takes the same branch.

With one process every collective is the identity and nothing is wrapped.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, Protocol

import torch
from accelerate import Accelerator  # type: ignore[import-untyped, unused-ignore]
from accelerate.state import PartialState  # type: ignore[import-untyped, unused-ignore]
from accelerate.utils import (  # type: ignore[import-untyped, unused-ignore]
    DistributedType,
    FullyShardedDataParallelPlugin,
    gather,
    gather_object,
    parse_flag_from_env,
)
from torch import Tensor, nn

__all__ = [
    "Collectives",
    "DataParallel",
    "LocalCollectives",
    "cpu_fsdp2_accelerator",
    "default_accelerator",
    "exit_launched_process",
]


def default_accelerator() -> Accelerator:
    """The run's ``Accelerator`` when none is given (mixed precision off: the trainer autocasts itself).

    Launched as several processes (``torchrun``) on a machine without an accelerator, it is
    ``Accelerator(cpu=True)``, which joins the processes over gloo; without ``cpu=True`` accelerate
    would leave each process on its own, and they would run the same run side by side. Launched
    there with an FSDP config (``accelerate launch --config_file examples/accelerate/fsdp2.yaml``,
    which sets ``ACCELERATE_USE_FSDP``), it is :func:`cpu_fsdp2_accelerator`: the parameters are
    sharded as on GPUs, instead of the plain data parallelism accelerate itself would fall back to.
    """
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    has_accelerator = getattr(torch, "accelerator", None)
    device_found = (
        has_accelerator.is_available() if has_accelerator is not None else torch.cuda.is_available()
    )
    cpu_processes = processes > 1 and not device_found
    if cpu_processes and parse_flag_from_env("ACCELERATE_USE_FSDP"):
        return cpu_fsdp2_accelerator()
    return Accelerator(cpu=cpu_processes, mixed_precision="no")


def cpu_fsdp2_accelerator(plugin: FullyShardedDataParallelPlugin | None = None) -> Accelerator:
    """An ``Accelerator`` for several CPU processes (gloo) whose ``prepare`` shards with FSDP2.

    accelerate declines FSDP without an accelerator: on CPU processes its state is ``MULTI_CPU``
    (plain data parallelism, parameters left whole), whatever the FSDP config. Its FSDP2 path does
    run on CPUs (``fully_shard`` over gloo), so this builds ``Accelerator(cpu=True)`` and switches
    accelerate's shared state to FSDP with ``plugin`` (default: the plugin the launch config's
    ``FSDP_*`` environment describes, as ``accelerate launch`` sets it). From there accelerate's
    own FSDP2 code runs, as on GPUs: ``prepare`` (its ``fsdp2_prepare_model``: ``fully_shard`` on
    each transformer block and on the root, the optimizer moved to the sharded parameters),
    ``clip_grad_norm_`` and ``unwrap_model``. What differs from GPUs is the device and the
    collectives' backend (gloo, not NCCL). Mixed precision stays off (the trainer autocasts itself).

    Raises ``ValueError`` outside a launch of several processes (``WORLD_SIZE`` > 1), for a plugin
    that is not a ``FullyShardedDataParallelPlugin`` of ``fsdp_version`` 2 (FSDP1 is not supported),
    and ``RuntimeError`` if this accelerate's state does not take the switch.
    """
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes < 2:
        raise ValueError(
            f"WORLD_SIZE: sharding needs several processes (torchrun or accelerate launch), got {processes}"
        )
    plugin = FullyShardedDataParallelPlugin() if plugin is None else plugin
    if not isinstance(plugin, FullyShardedDataParallelPlugin):
        raise ValueError(f"plugin: expected a FullyShardedDataParallelPlugin, got {type(plugin).__name__}")
    if int(plugin.fsdp_version) != 2:
        raise ValueError(
            f"plugin: fsdp_version {plugin.fsdp_version} is not supported (set fsdp_version: 2 in the "
            "accelerate config; FSDP1's flat parameters break the separate clipping of policy and critic)"
        )
    accelerator = Accelerator(cpu=True, mixed_precision="no")
    # Both shared states: accelerate's state objects copy PartialState's distributed_type when built.
    PartialState().distributed_type = DistributedType.FSDP
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    if accelerator.distributed_type != DistributedType.FSDP or not accelerator.is_fsdp2:
        raise RuntimeError(
            "accelerate did not take the switch to FSDP2 on CPU processes; run FSDP on GPUs, or DDP here"
        )
    return accelerator


class Collectives(Protocol):
    """What stage 7 needs to agree across processes (see :class:`LocalCollectives` for one process)."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def gradient_scale(self) -> float: ...

    def all_true(self, flag: bool) -> bool: ...

    def sum_and_max(
        self, sums: Sequence[float], maxima: Sequence[float]
    ) -> tuple[list[float], list[float]]: ...


class LocalCollectives:
    """The single-process collectives: identity."""

    rank = 0
    world_size = 1
    gradient_scale = 1.0

    def all_true(self, flag: bool) -> bool:
        """``flag`` itself."""
        return flag

    def sum_and_max(self, sums: Sequence[float], maxima: Sequence[float]) -> tuple[list[float], list[float]]:
        """The values themselves."""
        return list(sums), list(maxima)


class DataParallel:
    """The process group of a run, seen through its ``Accelerator``.

    Attributes:
        accelerator: the run's accelerator (``torchrun`` + ``Accelerator(cpu=True)`` on CPUs, or
            ``accelerate launch`` with an accelerate config for DDP, FSDP2 or DeepSpeed).
    """

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator

    # -- who am I ---------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's index in ``0 .. world_size - 1``."""
        return int(self.accelerator.process_index)

    @property
    def world_size(self) -> int:
        """The number of processes W."""
        return int(self.accelerator.num_processes)

    @property
    def is_main(self) -> bool:
        """True on the process that writes files (rank 0)."""
        return self.rank == 0

    @property
    def backend(self) -> str:
        """``none`` (no wrapping), ``ddp``, ``fsdp`` or ``deepspeed``."""
        kind = self.accelerator.distributed_type
        if kind == DistributedType.DEEPSPEED:
            return "deepspeed"
        if kind == DistributedType.FSDP:
            return "fsdp"
        if kind == DistributedType.NO:
            return "none"
        return "ddp"

    @property
    def wraps_models(self) -> bool:
        """Whether the trained models go through ``accelerator.prepare`` (any backend but ``none``)."""
        return self.backend != "none"

    @property
    def sharded_parameters(self) -> bool:
        """FSDP or DeepSpeed ZeRO-3: parameters live in shards, so every forward is a collective.

        Then every process must make the same forward calls: no-grad forwards go through the
        wrapped module, and generation runs until the responses of *all* processes have ended.
        """
        if self.backend == "fsdp":
            return True
        if self.backend == "deepspeed":
            plugin = self.accelerator.state.deepspeed_plugin
            return plugin is not None and int(plugin.zero_stage) == 3
        return False

    @property
    def gradient_scale(self) -> float:
        """W: the backends average gradients over processes; each loss is a share of the global
        minibatch, so scaling it by W turns the average into the one-process sum."""
        return float(self.world_size)

    # -- rows -------------------------------------------------------------------------------------

    def rows(self, count: int, what: str) -> slice:
        """This process's contiguous block of ``count`` global rows (``what`` names them in errors)."""
        if count % self.world_size != 0:
            raise ValueError(
                f"{what}: {count} rows cannot be split evenly over {self.world_size} processes; "
                f"use a multiple of {self.world_size}"
            )
        size = count // self.world_size
        return slice(self.rank * size, (self.rank + 1) * size)

    # -- collectives ------------------------------------------------------------------------------

    def all_true(self, flag: bool) -> bool:
        """True only if ``flag`` is True on every process."""
        if self.world_size == 1:
            return flag
        return bool(self._gather_vector([0.0 if flag else 1.0]).max() == 0.0)

    def any_true(self, flag: bool) -> bool:
        """True if ``flag`` is True on any process."""
        return not self.all_true(not flag)

    def sum_and_max(self, sums: Sequence[float], maxima: Sequence[float]) -> tuple[list[float], list[float]]:
        """Sums over processes of ``sums`` and maxima over processes of ``maxima`` (float64)."""
        if self.world_size == 1:
            return list(sums), list(maxima)
        table = self._gather_vector([*sums, *maxima])  # (W, len)
        n = len(sums)
        return table[:, :n].sum(dim=0).tolist(), table[:, n:].amax(dim=0).tolist()

    def _gather_vector(self, values: Sequence[float]) -> Tensor:
        local = torch.tensor([list(values)], dtype=torch.float64, device=self.accelerator.device)
        gathered: Tensor = gather(local)
        return gathered.cpu()

    def gather_rows(self, tensor: Tensor, pad_value: float | int | bool = 0) -> Tensor:
        """Concatenate every process's rows in rank order (dim 0); dim 1, if any, is right-padded
        with ``pad_value`` to the widest process first. One process: ``tensor`` itself."""
        if self.world_size == 1:
            return tensor
        if tensor.dim() >= 2:
            widths = self._gather_vector([float(tensor.shape[1])])
            width = int(widths.max())
            if tensor.shape[1] < width:
                fill = torch.full(
                    (tensor.shape[0], width - tensor.shape[1], *tensor.shape[2:]),
                    pad_value,
                    dtype=tensor.dtype,
                    device=tensor.device,
                )
                tensor = torch.cat([tensor, fill], dim=1)
        device = tensor.device
        gathered: Tensor = gather(tensor.contiguous().to(self.accelerator.device))
        return gathered.to(device)

    def gather_list(self, items: Sequence[Any]) -> list[Any]:
        """Concatenate every process's list in rank order (texts, small records)."""
        if self.world_size == 1:
            return list(items)
        return list(gather_object(list(items)))

    def barrier(self) -> None:
        """Wait until every process gets here."""
        if self.world_size > 1:
            self.accelerator.wait_for_everyone()

    def broadcast_parameters(self, module: nn.Module) -> None:
        """Copy rank 0's parameters and buffers into ``module`` on every process (frozen models that
        ``prepare`` does not synchronise: the reference and the reward model)."""
        if self.world_size == 1:
            return
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                torch.distributed.broadcast(tensor.data, src=0)

    # -- wrapping ---------------------------------------------------------------------------------

    def prepare(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        """``accelerator.prepare`` the trained module and its optimizer (DDP, FSDP2 or DeepSpeed)."""
        prepared, wrapped_optimizer = self.accelerator.prepare(module, optimizer)
        return prepared, wrapped_optimizer

    def configure_deepspeed(self, rows_per_process: int, max_grad_norm: float | None) -> None:
        """Fill the DeepSpeed config's ``auto`` fields that accelerate cannot infer without a dataloader.

        One micro-batch per optimizer step (the trainer accumulates micro-batches itself only
        outside DeepSpeed), and the trainer's gradient clipping as DeepSpeed's (one norm over the
        policy and the critic together, unlike the trainer's per-model clipping).
        """
        plugin = self.accelerator.state.deepspeed_plugin
        if plugin is None:
            return
        values = plugin.deepspeed_config
        values["train_micro_batch_size_per_gpu"] = rows_per_process
        values["gradient_accumulation_steps"] = 1
        values["train_batch_size"] = rows_per_process * self.world_size
        if values.get("gradient_clipping", "auto") == "auto":
            values["gradient_clipping"] = 0.0 if max_grad_norm is None else float(max_grad_norm)


def exit_launched_process(accelerator: Accelerator, status: int = 0) -> NoReturn:
    """End one process of a launched run: destroy its process group, flush, and ``os._exit(status)``.

    Call it where the trainer (its wrapped module) is still referenced, once the run's files are
    closed. The process then ends without destructors, because on CPUs (gloo) tearing down what
    holds the process group can hang or abort a process whose run went well, seen with torch 2.13:

    - *hang*: the last reference to the group, a DDP ``Reducer`` freed with the GIL held, joins
      gloo's worker threads in ``~ProcessGroupGloo`` while one of them frees an all-gather's work,
      whose tensors need the GIL to be freed (py-spy: ``std::thread::join`` under
      ``c10d::Reducer::~Reducer`` against ``gil_scoped_acquire`` under ``~AsyncAllgatherWork``);
      the same wait as pytorch#56297, still open;
    - *abort*: left to the interpreter's exit, the same worker threads reach for a GIL that is
      being torn down: ``terminate called without an active exception``, SIGABRT (the reason of
      pytorch#179291, an ``atexit`` fix abandoned as "much more complicated").

    ``accelerator.end_training()`` first, so the group is destroyed (and the backend shut down) on
    every process before any of them leaves; the launcher sees ``status`` from each process.

    Args:
        accelerator: the run's accelerator.
        status: the exit status, 0 to 255.
    """
    if isinstance(status, bool) or not isinstance(status, int) or not 0 <= status <= 255:
        raise ValueError(f"status: expected an exit status from 0 to 255, got {status!r}")
    if not callable(getattr(accelerator, "end_training", None)):
        raise ValueError(f"accelerator: expected an accelerate Accelerator, got {type(accelerator).__name__}")
    accelerator.end_training()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
