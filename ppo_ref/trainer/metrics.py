"""Stage 8's outputs: metrics.jsonl (+ TensorBoard), the rollout audit log, the summary and the plots.

Files written to the output directory OUT:

- ``metrics.jsonl``: one JSON object per iteration with :data:`REQUIRED_METRICS`, the per-stage
  seconds (``seconds_*``), ``tokens_per_second`` and the check diagnostics (:data:`CHECK_METRICS`).
- ``tensorboard/``: the same scalars as TensorBoard events, when tensorboard is installed.
- ``rollouts.jsonl``: the first K samples of every iteration in full (see :func:`audit_records`).
- ``summary.json``: the run's evaluation before and after training, and its wall time.
- ``score.png``, ``kl_ref.png``, ``entropy.png``, ``response_length.png``,
  ``explained_variance.png``: per-iteration plots, titled with the run; the score plot also shows
  the held-out evaluations before and after training.
- ``checkpoints/iter-NNNNNN/``: the run's state (see :mod:`ppo_ref.trainer.checkpoint`).

Non-finite numbers are written as JSON ``null``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ppo_ref import explained_variance, masked_mean, masked_var
from ppo_ref.trainer.data import Rollout

if TYPE_CHECKING:
    from ppo_ref.trainer.update import UpdateStats

__all__ = [
    "CHECK_METRICS",
    "IDENTICAL_SCORE_ITERATIONS",
    "PLOTS",
    "REQUIRED_METRICS",
    "STAGE_SECONDS",
    "AuditLog",
    "IdenticalScoreWatch",
    "MetricsLogger",
    "ProgressBar",
    "audit_records",
    "iteration_metrics",
    "json_safe",
    "loss_family_metrics",
    "plot_metrics",
    "well_formed_rate",
    "write_summary",
]

REQUIRED_METRICS: tuple[str, ...] = (
    "iteration",
    "score_mean",
    "score_std",
    "reward_mean",
    "kl_ref",
    "kl_coef",
    "entropy",
    "response_length",
    "eos_rate",
    "clipfrac",
    "ratio_outside_frac",
    "approx_kl",
    "ratio_mean",
    "ratio_max",
    "policy_loss",
    "value_loss",
    "explained_variance",
    "advantage_mean",
    "advantage_std",
    "value_mean",
)
"""The fields of every metrics.jsonl record required by the trainer issue (docs/outputs.md documents each)."""

STAGE_SECONDS: tuple[str, ...] = (
    "seconds_prompts",
    "seconds_generate",
    "seconds_score",
    "seconds_forward",
    "seconds_advantages",
    "seconds_update",
    "seconds_metrics",
    "seconds_iteration",
    "tokens_per_second",
)
"""Per-stage wall seconds of each iteration and response tokens generated per second of iteration."""

CHECK_METRICS: tuple[str, ...] = (
    "logprob_check_max_abs_diff",
    "nonfinite_steps",
    "optimizer_steps",
    "grad_norm_policy",
    "grad_norm_critic",
    "well_formed_rate",
    "skipped_samples",
)
"""Diagnostics of the runtime checks (first-minibatch log-prob identity, skipped steps, gradients)."""

PLOTS: dict[str, tuple[str, str]] = {
    "score.png": ("score_mean", "mean score"),
    "kl_ref.png": ("kl_ref", "KL to reference (per sequence)"),
    "entropy.png": ("entropy", "entropy (nats/token)"),
    "response_length.png": ("response_length", "response length (tokens)"),
    "explained_variance.png": ("explained_variance", "critic explained variance"),
}
"""Plot file name -> (metric, y-axis label)."""


def json_safe(value: Any) -> Any:
    """Recursively replace non-finite floats by None (strict JSON) and tuples by lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _dump(value: Any) -> str:
    return json.dumps(json_safe(value), allow_nan=False)


class MetricsLogger:
    """Appends one record per iteration to OUT/metrics.jsonl and, if available, to TensorBoard.

    ``enabled=False`` (processes other than the main one) writes nothing.
    """

    def __init__(self, out_dir: Path, tensorboard: bool, enabled: bool = True) -> None:
        self.path = out_dir / "metrics.jsonl"
        self._handle: Any = open(self.path, "w", encoding="utf-8") if enabled else None  # closed in close()
        self._writer: Any = None
        if tensorboard and enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                self._writer = None
            else:
                self._writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def write(self, record: Mapping[str, Any], tensorboard: bool = True) -> None:
        """Write one iteration's record (flushed at once, so a killed run keeps its lines);
        ``tensorboard=False`` skips the TensorBoard events (records of a resumed run's past)."""
        if self._handle is None:
            return
        self._handle.write(_dump(record) + "\n")
        self._handle.flush()
        if self._writer is not None and tensorboard:
            step = int(record["iteration"])
            for key, value in record.items():
                if key != "iteration" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        """Close the files."""
        if self._handle is not None:
            self._handle.close()
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AuditLog:
    """OUT/rollouts.jsonl: full records of the first K samples of every iteration.

    ``keep_before=N`` (a resumed run) keeps the file's records of iterations before N and drops
    the later ones, which the resumed run writes again; ``enabled=False`` writes nothing.
    """

    def __init__(self, out_dir: Path, enabled: bool = True, keep_before: int | None = None) -> None:
        self.path = out_dir / "rollouts.jsonl"
        kept: list[str] = []
        if enabled and keep_before is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    if int(json.loads(line)["iteration"]) < keep_before:
                        kept.append(line + "\n")
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by a killed run
        self._handle: Any = open(self.path, "w", encoding="utf-8") if enabled else None  # closed in close()
        if self._handle is not None and kept:
            self._handle.write("".join(kept))

    def write(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append records (one JSON object per line)."""
        if self._handle is None:
            return
        for record in records:
            self._handle.write(_dump(record) + "\n")
        self._handle.flush()

    def close(self) -> None:
        """Close the file."""
        if self._handle is not None:
            self._handle.close()


class ProgressBar:
    """A tqdm bar over iterations showing score, KL, response length and EOS rate (no-op if disabled)."""

    def __init__(self, total: int, enabled: bool, initial: int = 0) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm.auto import tqdm  # type: ignore[import-untyped, unused-ignore]

            self._bar = tqdm(total=total, initial=initial, desc="ppo", unit="it", dynamic_ncols=True)

    def update(self, record: Mapping[str, Any]) -> None:
        """Advance by one iteration and show its key figures."""
        if self._bar is None:
            return
        self._bar.set_postfix(
            score=f"{record['score_mean']:.3f}",
            kl=f"{record['kl_ref']:.2f}",
            len=f"{record['response_length']:.1f}",
            eos=f"{record['eos_rate']:.2f}",
            refresh=False,
        )
        self._bar.update(1)

    def write(self, line: Callable[[], None]) -> None:
        """Run ``line`` (which prints a line) with the bar out of the way, then redraw the bar."""
        if self._bar is None:
            line()
            return
        with self._bar.external_write_mode():
            line()

    def close(self) -> None:
        """Close the bar."""
        if self._bar is not None:
            self._bar.close()


IDENTICAL_SCORE_ITERATIONS = 3
"""Iterations in a row whose scores are all the same before :class:`IdenticalScoreWatch` warns."""


class IdenticalScoreWatch:
    """Warns, once per run, when the reward gives every response the same score ``iterations``
    iterations in a row.

    Within such an iteration the reward tells no response from another: the advantages carry no
    preference from it (a group baseline makes them 0), so the policy learns nothing from the
    reward (only from the missing-EOS score, where it applies). :meth:`observe` takes each
    iteration's rollout and returns the warning the first time the run of such iterations reaches
    ``iterations``, else None. It looks at the reward's own scores (``scored.raw``, before the
    missing-EOS rule) of the valid samples; an iteration with fewer than two counts as not identical.
    """

    def __init__(self, iterations: int = IDENTICAL_SCORE_ITERATIONS) -> None:
        if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
            raise ValueError(f"iterations: expected an int >= 1, got {iterations!r}")
        self.iterations = iterations
        self._values: list[float] = []
        self.warned = False

    def observe(self, rollout: Rollout) -> str | None:
        """Count ``rollout``'s iteration; the warning when it completes the run of identical ones."""
        scores = rollout.scored.raw[rollout.valid.cpu()]
        identical = scores.numel() > 1 and bool((scores == scores[0]).all())
        self._values = [*self._values, float(scores[0])] if identical else []
        if self.warned or len(self._values) < self.iterations:
            return None
        self.warned = True
        first = rollout.iteration - self.iterations + 2  # 1-based, as the progress bar counts
        values = sorted(set(self._values))
        shown = ", ".join(f"{v:g}" for v in values[:3]) + (", ..." if len(values) > 3 else "")
        return (
            f"the reward gave every response the same score within each of iterations {first}-"
            f"{rollout.iteration + 1} ({scores.numel()} responses each; score {shown}): it does not "
            "tell the responses apart, so the policy learns nothing from it (only from the "
            "missing-EOS score, if a response lacks EOS). Check that the reward can return different "
            "scores (is it constant, or always clipped?)"
        )


def write_summary(out_dir: Path, summary: Mapping[str, Any]) -> Path:
    """Write OUT/summary.json (indented) and return its path."""
    path = out_dir / "summary.json"
    path.write_text(json.dumps(json_safe(summary), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def plot_metrics(
    out_dir: Path,
    records: Sequence[Mapping[str, Any]],
    run: str = "",
    evaluations: Mapping[int, float | None] | None = None,
) -> list[Path]:
    """Write one PNG per entry of :data:`PLOTS` (metric against iteration) into OUT/; return the paths.

    Each plot is titled with its metric and ``run`` (e.g. the task and seed). ``evaluations`` maps an
    iteration to a held-out evaluation score (0: before training; the number of iterations: after
    the last one), drawn on the score plot as separate points. A metric with no finite value in any
    record (the explained variance of a run without a critic) gets no plot.
    """
    if not isinstance(run, str):
        raise ValueError(f"run: expected a string, got {type(run).__name__}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    iterations = [int(r["iteration"]) for r in records]
    paths = []
    for file_name, (metric, label) in PLOTS.items():
        values = [float("nan") if r.get(metric) is None else float(r[metric]) for r in records]
        if not any(math.isfinite(v) for v in values):
            continue
        figure, axes = plt.subplots(figsize=(5.5, 3.6), dpi=100)
        axes.plot(iterations, values, marker="o", markersize=3, label="training rollouts")
        if metric == "score_mean" and evaluations:
            points = sorted((i, v) for i, v in evaluations.items() if v is not None and math.isfinite(v))
            if points:
                axes.plot(
                    [i for i, _ in points],
                    [v for _, v in points],
                    linestyle="none",
                    marker="D",
                    markersize=6,
                    color="tab:red",
                    label="held-out evaluation",
                )
                for i, v in points:
                    axes.annotate(f"{v:.3f}", (i, v), textcoords="offset points", xytext=(4, 4), fontsize=8)
                axes.legend(fontsize=8, loc="best")
        axes.set_title(f"{label}{' - ' + run if run else ''}", fontsize=10)
        axes.set_xlabel("iteration")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
        figure.tight_layout()
        path = out_dir / file_name
        figure.savefig(path, metadata={"Title": f"{label} - {run}" if run else label})
        plt.close(figure)
        paths.append(path)
    return paths


def iteration_metrics(
    rollout: Rollout,
    stats: UpdateStats,
    timings: dict[str, float],
    nonfinite_steps: int,
    well_formed: Callable[[str, str], bool] | None,
    *,
    critic: bool = True,
) -> dict[str, Any]:
    """Stage 8: the metrics.jsonl record of an iteration (``nonfinite_steps``: the run's count so
    far; ``well_formed``: the task's format check, or None).

    Score statistics cover the valid samples (a skipped sample has no usable score);
    generation statistics (length, EOS rate, KL to the reference) cover every sample. A run
    without a critic (``critic=False``: a critic-free advantage estimator) has no value loss,
    explained variance, value mean or critic gradient norm: they are NaN (null in metrics.jsonl),
    and so is ``kl_ref`` in a run without a reference forward (``kl_coef = 0``, fixed).
    """
    mask, valid = rollout.mask, rollout.valid.cpu()
    scores = rollout.scored.scores[valid]
    lengths = rollout.sequences.response_mask.sum(dim=1).float()
    skipped = int((~valid).sum())
    record: dict[str, Any] = {
        "iteration": rollout.iteration,
        "score_mean": float(scores.mean()) if scores.numel() else math.nan,
        "score_std": float(scores.std()) if scores.numel() > 1 else 0.0,
        "reward_mean": float(rollout.rewards.sum(dim=1)[rollout.valid].mean()),
        "kl_ref": math.nan if rollout.kl is None else float(rollout.kl.sum(dim=1).mean()),
        "kl_coef": rollout.kl_coef,
        "entropy": float(masked_mean(rollout.entropy, mask)),
        "response_length": float(lengths.mean()),
        "eos_rate": float(rollout.ended.float().mean()),
        "clipfrac": stats.clipfrac,
        "ratio_outside_frac": stats.ratio_outside_frac,
        "approx_kl": stats.approx_kl,
        "ratio_mean": stats.ratio_mean,
        "ratio_max": stats.ratio_max,
        "policy_loss": stats.policy_loss,
        "value_loss": stats.value_loss if critic else math.nan,
        "explained_variance": (
            float(explained_variance(rollout.values, rollout.returns, mask)) if critic else math.nan
        ),
        "advantage_mean": float(masked_mean(rollout.raw_advantages, mask)),
        "advantage_std": math.sqrt(float(masked_var(rollout.raw_advantages, mask))),
        "value_mean": float(masked_mean(rollout.values, mask)) if critic else math.nan,
        "logprob_check_max_abs_diff": stats.logprob_check_max_abs_diff,
        "nonfinite_steps": nonfinite_steps,
        "optimizer_steps": stats.optimizer_steps,
        "grad_norm_policy": stats.grad_norm_policy,
        "grad_norm_critic": stats.grad_norm_critic if critic else math.nan,
        "well_formed_rate": well_formed_rate(well_formed, rollout.prompts, rollout.responses, rollout.ended),
        "skipped_samples": skipped,
    }
    record.update(loss_family_metrics(rollout, stats))
    record.update(timings)
    return record


def loss_family_metrics(rollout: Rollout, stats: UpdateStats) -> dict[str, float]:
    """The statistics of the optional loss terms, present only in runs that use them (a default
    run's record is unchanged): ``dual_clip_frac`` (share of action tokens where the dual clip
    binds), ``kl_loss`` (the KL loss of ``kl_in = "loss"``, before kl_coef), and with a rollout
    correction the mean, standard deviation, min and max of its weights over the action tokens
    and ``rollout_weight_zero_frac`` (the share a mask mode rejected). The mean of untruncated
    token weights stays near 1 even when sampler and policy differ (E_q[p / q] = 1): their spread
    (std, min, max) is what shows the difference."""
    record: dict[str, float] = {}
    if stats.dual_clip_frac is not None:
        record["dual_clip_frac"] = stats.dual_clip_frac
    if stats.kl_loss is not None:
        record["kl_loss"] = stats.kl_loss
    weights = rollout.correction_weights
    if weights is not None:
        kept = weights[rollout.mask]
        if kept.numel():
            record["rollout_weight_mean"] = float(kept.mean())
            record["rollout_weight_std"] = float(kept.std()) if kept.numel() > 1 else 0.0
            record["rollout_weight_min"] = float(kept.min())
            record["rollout_weight_max"] = float(kept.max())
            record["rollout_weight_zero_frac"] = float((kept == 0).float().mean())
    return record


def audit_records(rollout: Rollout, count: int, *, critic: bool = True) -> list[dict[str, Any]]:
    """The first ``count`` samples of a rollout in full (rollouts.jsonl); off-mask entries are null,
    and so are the values and bootstrap value of a run without a critic (``critic=False``) and the
    reference log-probs of a run without a reference forward."""
    records = []
    mask = rollout.sequences.response_mask.cpu()
    columns = {
        "old_logprobs": rollout.old_logprobs,
        "ref_logprobs": rollout.ref_logprobs,
        "values": rollout.values,
        "token_rewards": rollout.rewards,
        "advantages": rollout.advantages,
    }
    for row in range(min(count, mask.shape[0])):
        keep = mask[row].tolist()
        record: dict[str, Any] = {
            "iteration": rollout.iteration,
            "sample_index": int(rollout.sample_index[row]),
            "prompt": rollout.prompts[row],
            "response": rollout.responses[row],
            "response_ids": rollout.sequences.response_ids[row].tolist(),
            "action_mask": [int(k) for k in keep],
            "stop_reason": "eos" if bool(rollout.ended[row]) else "length",
            "skipped": not bool(rollout.valid[row]),
            "score": float(rollout.scored.scores[row]) if bool(rollout.valid[row]) else None,
            "score_components": {
                "raw": float(rollout.scored.raw[row]),
                "missing_eos_adjustment": float(rollout.scored.adjustment[row]),
            },
        }
        for name, tensor in columns.items():
            if tensor is None:
                record[name] = [None] * len(keep)
                continue
            values = tensor[row].tolist()
            record[name] = [
                v if k and (critic or name != "values") else None for v, k in zip(values, keep, strict=True)
            ]
        record["bootstrap_value"] = float(rollout.bootstrap_values[row]) if critic else None
        records.append(record)
    return records


def well_formed_rate(
    check: Callable[[str, str], bool] | None, prompts: Sequence[str], responses: Sequence[str], ended: Tensor
) -> float | None:
    """The share of samples that ended with EOS and pass ``check`` (None without a check)."""
    if check is None:
        return None
    good = [bool(e) and check(p, r) for p, r, e in zip(prompts, responses, ended.tolist(), strict=True)]
    return sum(good) / len(good)
