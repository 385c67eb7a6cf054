"""Checkpoints: the complete state of a run, written atomically, read back without pickle.

One checkpoint is a directory ``OUT/checkpoints/iter-NNNNNN/`` (NNNNNN: the number of completed
iterations, six digits) holding

- ``policy.safetensors``, ``critic.safetensors``, ``reference.safetensors`` and, when the run has
  one, ``reward_model.safetensors``: state dicts (tied weights stored once, see ``aliases``);
- ``optimizer.safetensors``: the tensors of the optimizer's state dict (keyed by parameter name);
  its structure and scalars (steps, hyper-parameters) are JSON in ``trainer_state.json``;
- ``rng.safetensors``: the global torch RNG state of every process (the Python and NumPy ones are
  in the JSON). The trainer draws no number from these (every draw is keyed by seed, stream,
  iteration and sample index: :mod:`ppo_ref.trainer.seeding`); they are restored for user code
  such as a reward function that uses them;
- ``metrics.jsonl``: the metrics records of the completed iterations;
- ``trainer_state.json``, written last: format and version, iteration, config, KL coefficient,
  non-finite step count, initial evaluation, process count, file list, and the JSON parts above.

Atomic: everything is written into ``.iter-NNNNNN.tmp-PID`` next to the final name, each file and
the directory are fsynced, then one ``os.rename`` gives the directory its name. A process killed
mid-write leaves only a temporary directory, which :func:`find_checkpoint` never picks. Loading uses
``safetensors.torch.load_file`` and ``json``: no pickle is ever read from disk.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from ppo_ref.trainer.metrics import json_safe

__all__ = [
    "CHECKPOINTS",
    "FORMAT",
    "STATE_FILE",
    "TEST_PAUSE_ENV",
    "Checkpoint",
    "capture_rng_state",
    "checkpoint_name",
    "decode_tree",
    "encode_tree",
    "find_checkpoint",
    "load_checkpoint",
    "remove_stale_temporaries",
    "restore_rng_state",
    "write_checkpoint",
]

CHECKPOINTS = "checkpoints"
"""The folder of OUT that holds the checkpoints."""
STATE_FILE = "trainer_state.json"
"""The JSON file of a checkpoint, written last."""
FORMAT = "ppo-ref-checkpoint"
VERSION = 1
TEST_PAUSE_ENV = "PPO_REF_CHECKPOINT_TEST_PAUSE"
"""Test hook: ``"N:SECONDS"`` sleeps SECONDS in the middle of writing checkpoint N (after its first
file), so a test can kill the process while a checkpoint is half written."""

_NAME = re.compile(r"^iter-(\d{6,})$")


def checkpoint_name(completed: int) -> str:
    """``iter-NNNNNN`` for ``completed`` iterations (six digits, more past 999999)."""
    if completed < 0:
        raise ValueError(f"completed: expected a number of iterations >= 0, got {completed}")
    return f"iter-{completed:06d}"


# -- nested state <-> JSON + tensors ------------------------------------------------------------------


def encode_tree(tree: Any, prefix: str = "") -> tuple[Any, dict[str, Tensor]]:
    """Split a nested state (dicts, lists, tuples, scalars, tensors) into JSON and named tensors.

    Tensors become ``{"tensor": name}`` (names ``prefix`` + a counter); tuples ``{"tuple": [...]}``,
    lists ``{"list": [...]}``, dicts ``{"dict": [[key, value], ...]}`` (keys keep their type);
    ``None``, bools, ints, floats and strings stay as they are. Anything else is a ``ValueError``:
    a checkpoint never falls back to pickle.
    """
    tensors: dict[str, Tensor] = {}

    def encode(node: Any) -> Any:
        if isinstance(node, Tensor):
            name = f"{prefix}{len(tensors)}"
            tensors[name] = node.detach().cpu().contiguous()
            return {"tensor": name}
        if isinstance(node, np.ndarray):
            return {"ndarray": node.tolist(), "dtype": str(node.dtype)}
        if isinstance(node, Mapping):
            return {"dict": [[encode(k), encode(v)] for k, v in node.items()]}
        if isinstance(node, tuple):
            return {"tuple": [encode(v) for v in node]}
        if isinstance(node, list):
            return {"list": [encode(v) for v in node]}
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, (np.integer, np.floating, np.bool_)):
            return node.item()
        raise ValueError(f"state: cannot store a {type(node).__name__} without pickle")

    return encode(tree), tensors


def decode_tree(encoded: Any, tensors: Mapping[str, Tensor]) -> Any:
    """Inverse of :func:`encode_tree`."""
    if isinstance(encoded, dict):
        if "tensor" in encoded:
            return tensors[encoded["tensor"]]
        if "ndarray" in encoded:
            return np.asarray(encoded["ndarray"], dtype=encoded["dtype"])
        if "dict" in encoded:
            return {decode_tree(k, tensors): decode_tree(v, tensors) for k, v in encoded["dict"]}
        if "tuple" in encoded:
            return tuple(decode_tree(v, tensors) for v in encoded["tuple"])
        if "list" in encoded:
            return [decode_tree(v, tensors) for v in encoded["list"]]
        raise ValueError(f"state: unknown entry {sorted(encoded)}")
    return encoded


def _unique_tensors(state_dict: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The state dict with each tied tensor stored once, and ``{alias: stored name}`` for the others.

    Two entries are tied when they are the same view of the same storage (a tied embedding and
    output layer); other entries that share storage are copied (safetensors stores no overlaps).
    """
    stored: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    views: dict[tuple[object, ...], str] = {}
    storages: set[int] = set()
    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        pointer = tensor.untyped_storage().data_ptr()
        key: tuple[object, ...] = (
            pointer,
            int(tensor.storage_offset()),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )
        if key in views:
            aliases[name] = views[key]
            continue
        views[key] = name
        shared = pointer in storages and tensor.numel() > 0
        storages.add(pointer)
        tensor = tensor.cpu()
        stored[name] = tensor.clone() if shared or not tensor.is_contiguous() else tensor
    return stored, aliases


# -- writing ----------------------------------------------------------------------------------------


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _pause_for_tests(completed: int) -> None:
    setting = os.environ.get(TEST_PAUSE_ENV)
    if not setting:
        return
    when, _, seconds = setting.partition(":")
    if int(when) == completed:
        time.sleep(float(seconds))


def write_checkpoint(
    out_dir: str | Path,
    completed: int,
    *,
    models: Mapping[str, Mapping[str, Tensor]],
    optimizer_state: Mapping[str, Any] | None,
    rng_states: Sequence[Mapping[str, Any]],
    state: Mapping[str, Any],
    metrics_records: Sequence[Mapping[str, Any]],
) -> Path:
    """Write ``OUT/checkpoints/iter-NNNNNN`` atomically and return its path.

    Args:
        out_dir: the run's output directory OUT.
        completed: the number of completed iterations (the checkpoint's name).
        models: name -> state dict (``policy``, ``critic``, ``reference``, ``reward_model``).
        optimizer_state: the optimizer's state dict (tensors and JSON-able values), or None.
        rng_states: per process, :func:`capture_rng_state`'s result.
        state: JSON-able trainer state (iteration, config, KL coefficient, ...).
        metrics_records: the metrics.jsonl records of the completed iterations.
    """
    root = Path(out_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(completed)
    final = root / name
    temporary = root / f".{name}.tmp-{os.getpid()}"
    if temporary.exists():
        shutil.rmtree(temporary)
    temporary.mkdir()

    files: dict[str, str] = {}
    aliases: dict[str, dict[str, str]] = {}
    for index, (model_name, state_dict) in enumerate(models.items()):
        tensors, model_aliases = _unique_tensors(state_dict)
        path = temporary / f"{model_name}.safetensors"
        save_file(tensors, str(path), metadata={"format": "pt"})
        _fsync_file(path)
        files[model_name] = path.name
        aliases[model_name] = model_aliases
        if index == 0:
            _pause_for_tests(completed)

    optimizer_json = None
    if optimizer_state is not None:
        optimizer_json, optimizer_tensors = encode_tree(optimizer_state, prefix="optimizer.")
        path = temporary / "optimizer.safetensors"
        save_file(optimizer_tensors, str(path))
        _fsync_file(path)
        files["optimizer"] = path.name

    rng_json, rng_tensors = encode_tree(list(rng_states), prefix="rng.")
    path = temporary / "rng.safetensors"
    save_file(rng_tensors, str(path))
    _fsync_file(path)
    files["rng"] = path.name

    path = temporary / "metrics.jsonl"
    lines = [json.dumps(json_safe(r), allow_nan=False) + "\n" for r in metrics_records]
    path.write_text("".join(lines), encoding="utf-8")
    _fsync_file(path)
    files["metrics"] = path.name

    document = {
        "format": FORMAT,
        "version": VERSION,
        **state,
        "iteration": completed,
        "files": files,
        "aliases": aliases,
        "optimizer": optimizer_json,
        "rng": rng_json,
    }
    path = temporary / STATE_FILE
    path.write_text(json.dumps(json_safe(document), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    _fsync_file(path)
    _fsync_dir(temporary)

    if final.exists():  # the same iteration written again (a resumed run): keep a complete copy to the end
        previous = root / f".{name}.old-{os.getpid()}"
        os.rename(final, previous)
        os.rename(temporary, final)
        shutil.rmtree(previous)
    else:
        os.rename(temporary, final)
    _fsync_dir(root)
    return final


def remove_stale_temporaries(out_dir: str | Path) -> list[Path]:
    """Delete the temporary directories that killed writers left in OUT/checkpoints; return them."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if p.is_dir() and re.match(r"^\.iter-\d{6,}\.(tmp|old)-\d+$", p.name)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


# -- reading ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint directory and its ``trainer_state.json``."""

    path: Path
    state: dict[str, Any]

    @property
    def iteration(self) -> int:
        """Completed iterations: the resumed run continues with this iteration index."""
        return int(self.state["iteration"])

    @property
    def config(self) -> dict[str, Any]:
        """The run's config fields as saved."""
        config: dict[str, Any] = self.state["config"]
        return config

    def has(self, name: str) -> bool:
        """Whether the checkpoint holds the state dict or file ``name``."""
        return name in self.state["files"]

    def state_dict(self, name: str) -> dict[str, Tensor]:
        """The state dict ``name`` (``policy``, ``critic``, ...) on the CPU, tied entries restored."""
        if not self.has(name):
            raise ValueError(
                f"checkpoint {self.path}: holds no {name!r} (files: {sorted(self.state['files'])})"
            )
        tensors = load_file(str(self.path / self.state["files"][name]))
        for alias, stored in self.state["aliases"].get(name, {}).items():
            tensors[alias] = tensors[stored]
        return tensors

    def optimizer_state(self) -> dict[str, Any] | None:
        """The optimizer's state dict as saved, or None if the checkpoint holds none."""
        if self.state.get("optimizer") is None:
            return None
        tensors = load_file(str(self.path / self.state["files"]["optimizer"]))
        decoded: dict[str, Any] = decode_tree(self.state["optimizer"], tensors)
        return decoded

    def rng_states(self) -> list[dict[str, Any]]:
        """Per process, the global RNG states as captured."""
        tensors = load_file(str(self.path / self.state["files"]["rng"]))
        decoded: list[dict[str, Any]] = decode_tree(self.state["rng"], tensors)
        return decoded

    def metrics_records(self) -> list[dict[str, Any]]:
        """The metrics records of the completed iterations."""
        text = (self.path / self.state["files"]["metrics"]).read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def _read_state(directory: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((directory / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return None
    return state


def _complete_checkpoints(root: Path) -> list[Path]:
    found = []
    if root.is_dir():
        for child in root.iterdir():
            if child.is_dir() and _NAME.match(child.name) and _read_state(child) is not None:
                found.append(child)
    return sorted(found, key=lambda p: int(p.name.removeprefix("iter-")))


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory that ``--resume PATH`` means.

    PATH is a checkpoint directory (``.../iter-NNNNNN``), or a run directory OUT (or its
    ``checkpoints`` folder), whose newest complete checkpoint is taken. Temporary directories
    of interrupted writes are never taken.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"resume: {path} does not exist")
    if (path / STATE_FILE).exists():
        if not _NAME.match(path.name) or _read_state(path) is None:
            raise ValueError(f"resume: {path} is not a complete ppo-ref checkpoint (interrupted write?)")
        return path
    for root in (path / CHECKPOINTS, path):
        found = _complete_checkpoints(root)
        if found:
            return found[-1]
    raise ValueError(f"resume: no complete checkpoint (checkpoints/iter-NNNNNN) in {path}")


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read the checkpoint ``path`` (a run directory or one checkpoint; see :func:`find_checkpoint`)."""
    directory = find_checkpoint(path)
    state = _read_state(directory)
    assert state is not None
    if state.get("version") != VERSION:
        raise ValueError(
            f"resume: {directory} has checkpoint version {state.get('version')}, expected {VERSION}"
        )
    missing = [f for f in state["files"].values() if not (directory / f).is_file()]
    if missing:
        raise ValueError(f"resume: {directory} lacks {missing}")
    return Checkpoint(directory, state)


# -- RNG states ---------------------------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """This process's global RNG states: Python ``random``, NumPy's legacy global one, torch CPU/CUDA."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Set the global RNG states captured by :func:`capture_rng_state`."""
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    numpy_state = state["numpy"]
    np.random.set_state(tuple(numpy_state))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        for index, value in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(value, index)
