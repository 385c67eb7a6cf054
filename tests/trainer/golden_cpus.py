"""Golden trainer data per CPU fingerprint, and the cross-CPU tolerance the golden test falls back to.

Floating-point results differ between CPUs (AVX2 / AVX-512 / AMX kernels, reduction orders, thread
counts), so a bit-for-bit golden run holds only on the CPU that wrote it. Each folder under
``data/golden/`` holds the golden files one CPU wrote, with that CPU's :func:`fingerprint` in
``fingerprint.json``. The golden test compares bit for bit against the folder whose fingerprint
matches this machine's (:func:`matching_folder`), and, on every machine, compares the small case
against every folder within :func:`cross_cpu_rtol`: a relative tolerance of :data:`DRIFT_FACTOR`
times the largest drift measured between the folders' own data (two CPUs running the same code).

``PPO_REF_WRITE_GOLDEN=1`` writes this machine's data into its own folder (:func:`folder_for`),
creating the folder and its ``fingerprint.json`` when the CPU is new.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

GOLDEN = Path(__file__).parent / "data" / "golden"
MATCH_KEYS = ("cpu_model", "isa_flags", "torch", "torch_cpu_capability", "torch_threads", "machine")
"""What must agree for two machines to be expected to compute the same bits (``python`` and
``commit`` in a fingerprint are recorded, not compared)."""
DRIFT_FACTOR = 100.0
"""The cross-CPU tolerance is this many times the drift measured between the known CPUs' data."""
RECORDED_DRIFT = {"tiny-value-head-rm": 8.679070930983517e-06}
"""The drift measured between the AMD EPYC's and the Intel Xeon's data at de36b5b (the largest relative
difference, at ``rollouts[3].token_rewards[4]``), used while fewer than two CPUs' data are current."""


def _isa_flags() -> list[str]:
    """The vector-ISA flags of /proc/cpuinfo that decide which kernels torch runs (avx*, amx*, fma)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    flags = line.partition(":")[2].split()
    return sorted({f for f in flags if f.startswith(("avx", "amx", "fma"))})


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), e.g. ``AMD EPYC``."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return platform.processor() or "unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else platform.processor() or "unknown"


def fingerprint() -> dict[str, Any]:
    """This machine's fingerprint, in the shape of ``fingerprint.json``."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu_model": cpu_model(),
        "isa_flags": _isa_flags(),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "commit": commit or "unknown",
    }


def known_folders() -> list[Path]:
    """Every folder of golden data, in name order."""
    return sorted(p.parent for p in GOLDEN.glob("*/fingerprint.json"))


def _matches(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(key) == b.get(key) for key in MATCH_KEYS)


def matching_folder(current: dict[str, Any] | None = None) -> Path | None:
    """The folder written on a machine with this fingerprint, or None for a CPU with no data."""
    current = fingerprint() if current is None else current
    for folder in known_folders():
        if _matches(current, json.loads((folder / "fingerprint.json").read_text(encoding="utf-8"))):
            return folder
    return None


def folder_for(current: dict[str, Any] | None = None) -> Path:
    """Where this machine's golden data lives: its matching folder, or a new one named after it."""
    current = fingerprint() if current is None else current
    found = matching_folder(current)
    if found is not None:
        return found
    words = re.findall(r"[a-z0-9]+", current["cpu_model"].lower())
    words = [w for w in words if w not in {"r", "tm", "processor", "cpu"}][:3]
    digest = hashlib.sha256(json.dumps([current[k] for k in MATCH_KEYS]).encode()).hexdigest()[:8]
    name = "-".join([*words, str(current["torch_cpu_capability"]).lower(), digest])
    return GOLDEN / name


def _numbers(a: Any, b: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """Pairs (path, a, b) of the leaves of two JSON values; a leaf pair of other shapes is yielded as is."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        for key in a:
            yield from _numbers(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _numbers(x, y, f"{path}[{i}]")
    else:
        yield path, a, b


def _is_float(x: Any) -> bool:
    return isinstance(x, float) or (isinstance(x, int) and not isinstance(x, bool))


def differences(result: Any, golden: Any, rtol: float) -> list[str]:
    """Where ``result`` and ``golden`` (JSON values) differ beyond ``rtol``, as readable lines.

    Floats agree when ``|a - b| <= rtol * max(|a|, |b|)`` (so an exact zero must stay zero); every
    other leaf (token ids, masks, stop reasons, texts, counts stored as ints, NaN stored as null)
    must be equal; dicts need the same keys and lists the same length.
    """
    if not (rtol >= 0 and math.isfinite(rtol)):
        raise ValueError(f"rtol must be a finite number >= 0, got {rtol!r}")
    out = []
    for path, a, b in _numbers(result, golden, ""):
        if isinstance(a, float) or isinstance(b, float):
            if _is_float(a) and _is_float(b) and abs(a - b) <= rtol * max(abs(a), abs(b)):
                continue
        elif a == b:
            continue
        out.append(f"{path or '.'}: {a!r} (this run) vs {b!r} (golden)")
    return out


def max_relative_drift(a: Any, b: Any) -> float:
    """The largest ``|x - y| / max(|x|, |y|)`` over the float leaves of two runs of the same code.

    Raises ``ValueError`` when any other leaf differs (then the runs are not comparable by a
    relative tolerance: different tokens were sampled).
    """
    drift = 0.0
    for path, x, y in _numbers(a, b, ""):
        if isinstance(x, float) or isinstance(y, float):
            if not (_is_float(x) and _is_float(y)):
                raise ValueError(f"{path}: {x!r} vs {y!r} is not a pair of numbers")
            scale = max(abs(x), abs(y))
            if scale > 0:
                drift = max(drift, abs(x - y) / scale)
        elif x != y:
            raise ValueError(f"{path}: {x!r} vs {y!r} differ exactly")
    return drift


def comparable(run: dict[str, Any]) -> dict[str, Any]:
    """The parts of a golden run a tolerance can compare (the weights' SHA-256 can only be equal)."""
    return {key: run[key] for key in ("metrics", "rollouts", "summary")}


def load(folder: Path, case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / f"golden-{case}.json").read_text(encoding="utf-8"))
    return data


def cross_cpu_rtol(case: str) -> tuple[float, float]:
    """(tolerance, measured drift) for ``case``: the drift is the largest relative difference between
    any two known CPUs' data for it (:data:`RECORDED_DRIFT` while only one CPU's data is current),
    the tolerance :data:`DRIFT_FACTOR` times that."""
    folders = known_folders()
    if len(folders) < 2:
        if case not in RECORDED_DRIFT:
            raise ValueError(
                f"case {case!r} has golden data from {len(folders)} CPU(s) and no recorded drift"
            )
        return DRIFT_FACTOR * RECORDED_DRIFT[case], RECORDED_DRIFT[case]
    runs = [comparable(load(folder, case)) for folder in folders]
    drift = max(max_relative_drift(a, b) for i, a in enumerate(runs) for b in runs[i + 1 :])
    return DRIFT_FACTOR * drift, drift
