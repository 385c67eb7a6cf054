"""The stand-ins :mod:`ppo_ref.adapters.thirdparty.openrlhf_step` uses for what a CPU cannot run in
OpenRLHF 0.11.2's actor step (each listed in the runner's ``provenance``): the import stubs and a gloo
process group of one, ``torch.cuda`` calls answered on the CPU with OpenRLHF's device mesh there,
``fp32`` parameters (the release raises for it), and vLLM's engine answering the batch's completions
with vLLM's finish reasons. None of them changes a reward, the loss or its normalisation.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

__all__ = ["Generation", "VllmEngine", "cpu_calls", "fp32_parameters", "setup_process"]


def setup_process() -> None:
    """The import stubs and a gloo process group of world size 1 (once per process)."""
    import torch.distributed as dist

    from ppo_ref.adapters.thirdparty import _openrlhf_stubs

    _openrlhf_stubs.install()
    if not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        for key, value in (
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", str(port)),
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),  # deepspeed.init_distributed reads it (else it tries MPI discovery)
            ("WORLD_SIZE", "1"),
        ):
            os.environ.setdefault(key, value)
        dist.init_process_group("gloo", rank=0, world_size=1)


@contextlib.contextmanager
def cpu_calls(device: Any = "cpu") -> Iterator[None]:
    """``torch.cuda.current_device`` answering ``device``; ``synchronize`` / ``empty_cache`` no-ops;
    OpenRLHF's ``init_device_mesh`` on the CPU (the stand-ins of the module docstring)."""
    ds_module: Any = importlib.import_module("openrlhf.utils.deepspeed.deepspeed")
    saved = (
        torch.cuda.current_device,
        torch.cuda.synchronize,
        torch.cuda.empty_cache,
        torch.cuda.set_device,
        ds_module.init_device_mesh,
    )
    mesh = saved[4]

    def cpu_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        return mesh("cpu", *args, **kwargs)

    torch.cuda.current_device = lambda: device
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.set_device = lambda device: None
    ds_module.init_device_mesh = cpu_mesh
    try:
        yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.empty_cache, torch.cuda.set_device = (
            saved[:4]
        )
        ds_module.init_device_mesh = saved[4]


@contextlib.contextmanager
def fp32_parameters() -> Iterator[None]:
    """``convert_to_torch_dtype("fp32")`` answering float32 (the release raises for it)."""
    utils: Any = importlib.import_module("openrlhf.utils.utils")
    convert = utils.convert_to_torch_dtype

    def fp32(param_dtype: str) -> torch.dtype:
        return torch.float32 if param_dtype == "fp32" else convert(param_dtype)

    utils.convert_to_torch_dtype = fp32
    try:
        yield
    finally:
        utils.convert_to_torch_dtype = convert


class Generation:
    """vLLM's ``CompletionOutput`` as ``execute`` reads it."""

    def __init__(self, token_ids: list[int], finish_reason: str) -> None:
        self.token_ids, self.finish_reason, self.logprobs = token_ids, finish_reason, None


class VllmEngine:
    """vLLM's engine in ``SingleTurnAgentExecutor.execute``: ``generate`` answers the batch's
    completion of the row being rolled out, with vLLM's finish reason."""

    def __init__(self, completion: tuple[int, ...], eos_id: int, max_tokens: int) -> None:
        self.completion, self.eos_id, self.max_tokens = completion, eos_id, max_tokens

    async def generate(self, prompt_token_ids: list[int], params: Any, multi_modal_data: Any = None) -> Any:
        if params.max_tokens != self.max_tokens:
            raise RuntimeError(
                f"execute asked for {params.max_tokens} tokens, the budget is {self.max_tokens}"
            )
        ended = self.completion[-1] == self.eos_id
        reason = "stop" if ended else ("length" if len(self.completion) >= params.max_tokens else "stop")
        return SimpleNamespace(outputs=[Generation(list(self.completion), reason)])
