"""The trainer's configuration: one frozen dataclass, validated on construction.

Every field has a docstring (the string right below it); the CLI turns each field into an override
flag and shows that docstring in ``--help``. Values come, in increasing priority, from the
defaults, the task's ``config_overrides``, a TOML file, and command-line flags.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import itertools
import math
import sys
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, Union

from ppo_ref.aggregation import LossAggregation
from ppo_ref.kl import KLEstimator
from ppo_ref.kl_loss import KLLossEstimator
from ppo_ref.trainer.estimators import ADVANTAGE_ESTIMATORS, AdvantageEstimatorName, PolicyLossName

__all__ = [
    "CRITIC_FIELDS",
    "CRITIC_FREE_ESTIMATORS",
    "GROUP_ESTIMATORS",
    "RESUME_MUTABLE_FIELDS",
    "SEQUENCE_LEVEL_ESTIMATORS",
    "TrainerConfig",
    "check_field_values",
    "config_from_toml",
    "field_docs",
    "field_types",
    "read_toml",
]


@dataclass(frozen=True)
class TrainerConfig:
    """Everything that determines a PPO-RLHF run (with the task, the seed makes it reproducible)."""

    # -- run ------------------------------------------------------------------------------------
    task: str = "positive-review"
    """Built-in task: positive-review, positive-review-rm, reverse, length or smollm2-sentiment."""
    iterations: int = 50
    """Number of PPO iterations (rollout + update)."""
    seed: int = 0
    """The one seed of the run: task construction, prompt sampling, sampling noise, shuffling."""
    out: str = "ppo-ref-run"
    """Output directory (metrics.jsonl, rollouts.jsonl, summary.json, plots, TensorBoard events)."""
    policy: str | None = None
    """Local Hugging Face causal-LM checkpoint (with its tokenizer) to train instead of the task's policy."""
    reward: str | None = None
    """The reward instead of the task's: a local AutoModelForSequenceClassification checkpoint (one
    label), or a Python function 'module:function' called as function(prompts, responses) -> scores."""
    reference: str | None = None
    """Local causal-LM checkpoint for the frozen KL reference (None = a copy of the initial policy)."""
    prompts: str | None = None
    """JSONL file of prompts, one {"prompt": ...} per line (optional "split": "train"|"eval"; without
    any, 10% is held out for evaluation); blank lines are skipped, and the command says how many."""

    # -- 1-2: prompts and generation ------------------------------------------------------------
    rollout_batch_size: int = 64
    """Responses per iteration (one prompt each)."""
    max_new_tokens: int = 32
    """Longest response; a response that reaches it without EOS is cut ('length' stop)."""
    temperature: float = 1.0
    """Sampling temperature; log-probs and entropies are computed from logits / temperature."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1 = off)."""
    top_k: int = 0
    """Sample only among the top_k most probable tokens (0 = off)."""
    sampler: Literal["dynamic", "static", "static-compiled"] = "dynamic"
    """How the sampler feeds the policy's forwards: dynamic (a KV cache that grows each step), static
    (one prefill per group of identical prompts, a preallocated cache and attention mask, finished
    rows compacted out) or static-compiled (static with a torch.compile'd decode step; eager, with
    one printed line, where compilation fails). The same tokens for the same seed; log-probs within
    float rounding. static-compiled pays its compile time back only in long runs (docs/trainer.md)."""
    forward_batch_size: int | None = None
    """Rows per no-grad forward pass in rollouts and evaluation (None = all at once)."""

    # -- 3-5: scores and token rewards ----------------------------------------------------------
    missing_eos: Literal["none", "penalty", "replace"] = "replace"
    """Rule for responses without EOS: keep the score, subtract missing_eos_penalty, or replace it."""
    missing_eos_penalty: float = 1.0
    """Subtracted from the score of a response without EOS when missing_eos = 'penalty'."""
    missing_eos_score: float = -1.0
    """The score of a response without EOS when missing_eos = 'replace'."""
    on_bad_score: Literal["error", "skip"] = "error"
    """A score that is not a finite number (or a reward function that raises on a sample): stop with
    an error naming the sample, or skip (drop the sample from training; counted in skipped_samples)."""
    kl_coef: float = 0.05
    """KL penalty coefficient beta (the initial one when adaptive_kl is on)."""
    adaptive_kl: bool = False
    """Adapt beta towards kl_target (Ziegler et al. 2019) instead of keeping it fixed."""
    kl_target: float = 6.0
    """Target of the adaptive controller: mean per-sequence summed KL to the reference."""
    kl_horizon: float = 10000.0
    """Horizon of the adaptive controller, in sequences."""
    kl_estimator: KLEstimator = "k1"
    """Per-token KL estimator for the reward penalty and the logged kl_ref."""
    truncation: Literal["terminal", "bootstrap"] = "terminal"
    """A response cut at max_new_tokens: terminal (V_next = 0) or bootstrap (V_next from the critic)."""

    # -- 6: advantages --------------------------------------------------------------------------
    gamma: float = 1.0
    """Discount factor."""
    lam: float = 0.95
    """GAE lambda."""
    advantage_estimator: AdvantageEstimatorName = "gae"
    """gae (with a critic), or critic-free (no value model is built): grpo, dr_grpo or rloo (one
    advantage per response from its group, on its return sum_t r_t, not whitened), reinforce++
    (discounted returns, whitened) or reinforce++-baseline (return minus the group's mean, whitened)."""
    group_size: int = 1
    """Responses per prompt: rollout_batch_size / group_size prompts, each sampled group_size times
    (must divide rollout_batch_size; >= 2 for grpo, dr_grpo, rloo and reinforce++-baseline)."""

    # -- 7: PPO update --------------------------------------------------------------------------
    ppo_epochs: int = 4
    """Passes over the rollout batch per iteration (reshuffled each time)."""
    num_minibatches: int = 4
    """Minibatches per epoch (one optimizer step each); must divide rollout_batch_size."""
    micro_batch_size: int | None = None
    """Rows per forward/backward inside a minibatch (gradient accumulation; None = whole minibatch)."""
    clip_eps: float = 0.2
    """PPO ratio clip epsilon."""
    value_clip_eps: float | None = 0.2
    """Value clip range around the rollout values, in reward units (None = unclipped value loss)."""
    vf_coef: float = 0.1
    """Weight of the value loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    loss_agg: LossAggregation = "token-mean"
    """Reduction of the policy (and KL) loss over a minibatch, as ppo_ref.aggregate_loss (the last mode
    is Dr. GRPO's); normalised by the whole minibatch's counts, however it is split into micro
    batches and processes."""
    # -- 7: the policy loss's family (checked together in _check_loss_fields) --------------------
    norm_constant: float | None = None
    """Divisor C of loss_agg = seq-mean-token-sum-norm (None = max_new_tokens); only with that mode."""
    policy_loss: PolicyLossName = "ppo"
    """ppo (the clipped token ratio), gspo (the clipped sequence ratio; needs one advantage per
    sequence and the sequence mean as loss_agg) or cispo (a clipped, detached IS weight times the
    log prob)."""
    clip_eps_high: float | None = None
    """Upper clip offset (DAPO's clip higher; >= clip_eps; None = clip_eps). For cispo the weight's
    upper bound is 1 + clip_eps_high and its lower 1 - clip_eps."""
    dual_clip: float | None = None
    """Dual clip c > 1 of PPO (a negative advantage's objective is bounded by c * A; None = off)."""
    kl_in: Literal["reward", "loss"] = "reward"
    """Where the KL to the reference goes: the token rewards (-kl_coef * KL per token), or the loss
    (kl_coef * kl_loss, aggregated like the policy loss; then no KL in the rewards)."""
    kl_loss_estimator: KLLossEstimator | None = None
    """KL estimator of kl_in = loss (None = k3, as GRPO); only with kl_in = loss."""
    rollout_correction: Literal[
        "none",
        "token-truncate",
        "token-mask",
        "sequence-truncate",
        "sequence-mask",
        "geometric-truncate",
        "geometric-mask",
    ] = "none"
    """Importance correction for the sampler's log probs (ppo_ref.rollout_correction), LEVEL and MODE:
    per token, per sequence (product) or geometric (the sequence's geometric mean); truncate (TIS) or
    mask (MIS, IcePop). Each token's policy loss is weighted by w = exp(old log prob minus the
    sampler's log prob), truncated at or masked outside the bounds below."""
    rollout_correction_high: float = 2.0
    """Upper bound of the rollout-correction weight (truncate: min(w, high); mask: w > high gives 0)."""
    rollout_correction_low: float | None = None
    """Lower bound of the rollout-correction weight (None = no lower bound); <= rollout_correction_high."""
    rollout_temperature: float | None = None
    """Sampling temperature of the generator when it should differ from temperature (None = the same):
    makes the sampler and the trained policy differ on purpose (to exercise rollout_correction)."""
    critic: Literal["policy", "reward", "value-head"] = "policy"
    """Critic: separate model from the policy's backbone, from the reward model's, or a head on the policy."""
    learning_rate: float = 1e-4
    """AdamW learning rate of the policy."""
    critic_learning_rate: float | None = None
    """AdamW learning rate of the critic (None = learning_rate)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float | None = 1.0
    """Clip the gradient norm of the policy and of the critic, each, to this (None = no clipping)."""
    target_approx_kl: float | None = None
    """Stop this iteration's PPO epochs once a minibatch's approx-KL to the rollout policy exceeds this."""

    # -- 8: checks, evaluation and output -------------------------------------------------------
    logprob_check_tolerance: float | None = None
    """Largest allowed |log-ratio| at the first minibatch (None = 1e-3 in float32, 0.25 in bf16)."""
    max_nonfinite_steps: int = 3
    """Stop the run once more than this many optimizer steps were skipped for non-finite values."""
    eval_samples: int = 256
    """Responses sampled (temperature 1) from held-out prompts for the initial and final evaluation."""
    audit_samples: int = 4
    """Samples of each iteration written in full to rollouts.jsonl."""
    tensorboard: bool = True
    """Also write TensorBoard events to OUT/tensorboard when tensorboard is installed."""
    progress_bar: bool = True
    """Show a console progress bar with the key figures."""
    plots: bool = True
    """Write PNG plots of score, KL, entropy and response length to OUT/."""
    save_every: int = 0
    """Write a checkpoint to OUT/checkpoints/iter-NNNNNN every K iterations (0 = only the last one)."""
    mixed_precision: Literal["auto", "no", "bf16"] = "auto"
    """Model forwards in bf16 autocast ('auto' = bf16 on CUDA, float32 on CPU); PPO math stays float32."""
    threads: int | None = None
    """CPU threads of the ppo-ref command (torch intra-op; 0 = torch's default, one per core; None =
    OMP_NUM_THREADS if set, else 1). Set before torch loads, with OMP_WAIT_POLICY=PASSIVE at one
    thread (ppo_ref_entry); PPOTrainer used from Python leaves the process's setting alone."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = _coerce(getattr(self, f.name), field_types()[f.name], f.name)
            object.__setattr__(self, f.name, value)
        self._check_ranges()

    def _check_ranges(self) -> None:
        for name in ("iterations", "rollout_batch_size", "max_new_tokens", "ppo_epochs", "num_minibatches"):
            _require(getattr(self, name) >= 1, name, "an int >= 1")
        for name in ("seed", "top_k", "max_nonfinite_steps", "audit_samples", "save_every"):
            _require(getattr(self, name) >= 0, name, "an int >= 0")
        _require(self.threads is None or self.threads >= 0, "threads", "an int >= 0 or None")
        _require(self.eval_samples >= 1, "eval_samples", "an int >= 1")
        for name in ("forward_batch_size", "micro_batch_size"):
            value = getattr(self, name)
            _require(value is None or value >= 1, name, "an int >= 1 or None")
        _require(self.rollout_batch_size >= 2, "rollout_batch_size", "an int >= 2 (advantage whitening)")
        _require(
            self.rollout_batch_size % self.num_minibatches == 0,
            "num_minibatches",
            f"a divisor of rollout_batch_size={self.rollout_batch_size}",
        )
        positive = ("temperature", "clip_eps", "learning_rate", "kl_target", "kl_horizon", "adam_eps")
        for name in positive:
            _require(getattr(self, name) > 0, name, "a number > 0")
        for name in ("value_clip_eps", "critic_learning_rate", "max_grad_norm", "target_approx_kl"):
            value = getattr(self, name)
            _require(value is None or value > 0, name, "a number > 0 or None")
        tolerance = self.logprob_check_tolerance
        _require(tolerance is None or tolerance > 0, "logprob_check_tolerance", "a number > 0 or None")
        for name in ("kl_coef", "vf_coef", "entropy_coef", "weight_decay", "missing_eos_penalty"):
            _require(getattr(self, name) >= 0, name, "a number >= 0")
        for name in ("gamma", "lam"):
            _require(0 <= getattr(self, name) <= 1, name, "a number in [0, 1]")
        _require(0 < self.top_p <= 1, "top_p", "a number in (0, 1]")
        _require(self.out != "", "out", "a non-empty path")
        _require(self.task != "", "task", "a non-empty task name")
        self._check_estimator_fields()
        self._check_loss_fields()

    def _check_estimator_fields(self) -> None:
        """The advantage estimator's combinations (see :data:`CRITIC_FIELDS`)."""
        estimator, size = self.advantage_estimator, self.group_size
        _require(size >= 1, "group_size", "an int >= 1")
        _require(
            self.rollout_batch_size % size == 0,
            "group_size",
            f"a divisor of rollout_batch_size={self.rollout_batch_size}",
        )
        if estimator in GROUP_ESTIMATORS:
            _require(
                size >= 2,
                "group_size",
                f"an int >= 2 with advantage_estimator={estimator!r} (its baseline is the group)",
            )
        if self.uses_critic:
            return
        for name, unused_when in CRITIC_FIELDS.items():
            default = _DEFAULTS[name]
            if getattr(self, name) != default and estimator in unused_when:
                raise ValueError(
                    f"config field {name!r}: advantage_estimator={estimator!r} does not use it "
                    f"({_UNUSED_BECAUSE[name]}); leave it at its default {default!r}"
                )

    def _check_loss_fields(self) -> None:
        """The policy loss's combinations: ranges, then the pairs that make no sense together."""
        for name in ("norm_constant", "rollout_temperature", "rollout_correction_low"):
            value = getattr(self, name)
            _require(value is None or value > 0, name, "a number > 0 or None")
        _require(self.rollout_correction_high > 0, "rollout_correction_high", "a number > 0")
        if self.clip_eps_high is not None:
            _require(
                self.clip_eps_high >= self.clip_eps, "clip_eps_high", f">= clip_eps={self.clip_eps} or None"
            )
        if self.dual_clip is not None:
            _require(
                self.dual_clip > 1, "dual_clip", "a number > 1 or None (the dual clip bounds ratios above 1)"
            )
            _require(
                self.policy_loss == "ppo",
                "dual_clip",
                f"None with policy_loss={self.policy_loss!r} (only ppo has a dual clip)",
            )
        if self.norm_constant is not None:
            _require(
                self.loss_agg == "seq-mean-token-sum-norm",
                "norm_constant",
                f"None with loss_agg={self.loss_agg!r} (only seq-mean-token-sum-norm divides by it)",
            )
        if self.policy_loss == "gspo":
            _require(
                self.advantage_estimator in SEQUENCE_LEVEL_ESTIMATORS,
                "advantage_estimator",
                f"one of {SEQUENCE_LEVEL_ESTIMATORS} with policy_loss='gspo' (GSPO weighs one advantage per "
                f"sequence; {self.advantage_estimator!r} gives one per token)",
            )
            _require(
                self.loss_agg == "seq-mean-token-mean",
                "loss_agg",
                "'seq-mean-token-mean' with policy_loss='gspo' (gspo_loss averages over sequences)",
            )
            _require(
                not self.rollout_correction.startswith("token-"),
                "rollout_correction",
                "a sequence or geometric level with policy_loss='gspo' (one weight per sequence)",
            )
        if self.kl_in == "reward":
            _require(
                self.kl_loss_estimator is None,
                "kl_loss_estimator",
                "None with kl_in='reward' (kl_estimator sets the reward's KL; this one is for kl_in='loss')",
            )
        if self.rollout_correction == "none":
            for name in ("rollout_correction_high", "rollout_correction_low"):
                _require(
                    getattr(self, name) == _DEFAULTS[name],
                    name,
                    f"its default {_DEFAULTS[name]!r} with rollout_correction='none' (no correction uses it)",
                )
        low = self.rollout_correction_low
        if low is not None:
            _require(
                low <= self.rollout_correction_high,
                "rollout_correction_low",
                f"<= rollout_correction_high={self.rollout_correction_high} or None",
            )

    @property
    def sampling_temperature(self) -> float:
        """The generator's temperature: ``rollout_temperature``, or ``temperature`` when it is None."""
        return self.temperature if self.rollout_temperature is None else self.rollout_temperature

    @property
    def loss_norm_constant(self) -> float | None:
        """``norm_constant`` of the loss aggregation: ``max_new_tokens`` by default for
        seq-mean-token-sum-norm, None for the other modes."""
        if self.loss_agg != "seq-mean-token-sum-norm":
            return None
        return float(self.max_new_tokens) if self.norm_constant is None else self.norm_constant

    @property
    def uses_critic(self) -> bool:
        """Whether the run has a critic (value model): only with ``advantage_estimator = "gae"``.
        Without one the trainer builds no value model, runs no critic forward and no value loss."""
        return self.advantage_estimator not in CRITIC_FREE_ESTIMATORS

    @property
    def uses_reference_forward(self) -> bool:
        """Whether stage 4 runs the frozen reference's forward: only when a KL term can be nonzero
        (``kl_coef > 0``, or ``adaptive_kl``). With ``kl_coef = 0`` and a fixed coefficient the
        rollout holds no reference log-probs and no KL (``kl_ref`` and ``kl_loss`` are left out of
        the iteration's metrics); the evaluations still measure the KL to the reference."""
        return self.kl_coef > 0 or self.adaptive_kl

    @property
    def uses_kl_loss(self) -> bool:
        """Whether stage 7's loss has a KL term: ``kl_in = "loss"`` and a reference forward
        (:attr:`uses_reference_forward`); with ``kl_coef = 0``, fixed, there is no term and no
        ``kl_loss`` metric."""
        return self.kl_in == "loss" and self.uses_reference_forward

    @property
    def old_logprobs_from_sampler(self) -> bool:
        """Whether the old log-probs are the sampler's own log-probs of its tokens, with no stage-4
        forward of the policy (the critic-free on-policy case, as TRL's ``num_iterations = 1``).

        True when the sampler draws from exactly the distribution being trained and nothing else
        needs the forward: no critic (no values), sampling at ``temperature``
        (``rollout_temperature`` None), ``top_k = 0`` and ``top_p = 1`` (no truncated sampling
        distribution), no ``rollout_correction`` (which compares the two on purpose), no bf16
        (``mixed_precision`` not ``bf16``; the trainer also requires autocast off) and
        ``num_minibatches = 1``, so that stage 7's step-0 check recomputes the log-probs of every
        action token with the update's forward and stops the run if any differs from the sampler's
        by more than the log-prob tolerance: the identity is checked at run time on every
        iteration, never assumed. The policy has no dropout in either pass (the trainer disables it).
        """
        return (
            not self.uses_critic
            and self.rollout_temperature is None
            and self.top_k == 0
            and self.top_p == 1.0
            and self.rollout_correction == "none"
            and self.mixed_precision != "bf16"
            and self.num_minibatches == 1
        )

    @property
    def minibatch_size(self) -> int:
        """Rows per minibatch (one optimizer step)."""
        return self.rollout_batch_size // self.num_minibatches


CRITIC_FREE_ESTIMATORS = tuple(name for name, entry in ADVANTAGE_ESTIMATORS.items() if not entry.critic)
"""The advantage estimators without a critic: the trainer builds no value model for them."""

SEQUENCE_LEVEL_ESTIMATORS = tuple(name for name, entry in ADVANTAGE_ESTIMATORS.items() if entry.per_sequence)
"""The advantage estimators that give one advantage per sequence (the same on each of its action
tokens; whitening keeps that): the ones policy_loss = gspo accepts."""

GROUP_ESTIMATORS = tuple(name for name, entry in ADVANTAGE_ESTIMATORS.items() if entry.group_baseline)
"""The advantage estimators whose baseline is the group of responses to the same prompt (group_size >= 2)."""

CRITIC_FIELDS: dict[str, tuple[str, ...]] = {
    "critic": CRITIC_FREE_ESTIMATORS,
    "critic_learning_rate": CRITIC_FREE_ESTIMATORS,
    "vf_coef": CRITIC_FREE_ESTIMATORS,
    "value_clip_eps": CRITIC_FREE_ESTIMATORS,
    "truncation": CRITIC_FREE_ESTIMATORS,
    "lam": CRITIC_FREE_ESTIMATORS,
    "gamma": GROUP_ESTIMATORS,
}
"""Fields that a critic-free estimator does not use -> the estimators that reject a value other
than the field's default. A value equal to the default is accepted (it cannot be told apart from
an unset one, and changes nothing); any other stops the run before any work, naming the field.
``reinforce++`` uses ``gamma`` (its returns are discounted); the group estimators do not (their
sequence return is the undiscounted sum of the token rewards)."""

_UNUSED_BECAUSE: dict[str, str] = {
    "critic": "it builds no critic",
    "critic_learning_rate": "it builds no critic",
    "vf_coef": "it has no value loss",
    "value_clip_eps": "it has no value loss",
    "truncation": "bootstrapping needs a critic's value; a cut response is terminal",
    "lam": "GAE lambda; REINFORCE++ uses lambda = 1",
    "gamma": "its sequence return is the undiscounted sum of the token rewards",
}

RESUME_MUTABLE_FIELDS: frozenset[str] = frozenset(
    {"iterations", "out", "save_every", "tensorboard", "progress_bar", "plots", "audit_samples"}
    | {"max_nonfinite_steps", "on_bad_score", "threads"}
)
"""Fields a resumed run may set differently from its checkpoint; the others determine the run's
math and must stay as they were (``on_bad_score`` may change so that a run stopped by a bad score
can go on skipping it)."""


def _require(ok: bool, name: str, expected: str) -> None:
    if not ok:
        raise ValueError(f"config field {name!r}: expected {expected}")


def _coerce(value: object, annotation: object, name: str) -> object:
    """Check ``value`` against the field's type; ints are accepted (and converted) for floats."""
    options = _union_members(annotation)
    if value is None:
        if type(None) in options:
            return None
        raise ValueError(f"config field {name!r}: expected {_describe(annotation)}, got None")
    for option in options:
        if option is type(None):
            continue
        if typing.get_origin(option) is Literal:
            if isinstance(value, str) and value in typing.get_args(option):
                return value
        elif option is bool:
            if isinstance(value, bool):
                return value
        elif option is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif option is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                return float(value)
        elif option is str and isinstance(value, str):
            return value
    raise ValueError(f"config field {name!r}: expected {_describe(annotation)}, got {value!r}")


def _union_members(annotation: object) -> tuple[object, ...]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _describe(annotation: object) -> str:
    parts = []
    for option in _union_members(annotation):
        if option is type(None):
            parts.append("None")
        elif typing.get_origin(option) is Literal:
            parts.append("one of " + ", ".join(repr(v) for v in typing.get_args(option)))
        elif option is float:
            parts.append("a finite number")
        else:
            parts.append(_TYPE_NAMES.get(option, str(option)))
    return " or ".join(parts)


_TYPE_NAMES: dict[object, str] = {bool: "true or false", int: "an integer", str: "a string"}
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(TrainerConfig)}
_TYPES: dict[str, object] = {}
_DOCS: dict[str, str] = {}


def field_types() -> dict[str, object]:
    """Resolved type annotation of every field (e.g. ``int``, ``float | None``, a ``Literal``)."""
    if not _TYPES:
        _TYPES.update(typing.get_type_hints(TrainerConfig))
    return _TYPES


def field_docs() -> dict[str, str]:
    """The docstring of every field, read from this module's source (the string below each field)."""
    if not _DOCS:
        tree = ast.parse(inspect.getsource(TrainerConfig))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, following in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                _DOCS[node.target.id] = following.value.value.strip()
    return _DOCS


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file into a dict (tomllib on Python >= 3.11, else the ``tomli`` package)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised only on Python 3.10
        try:
            import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]
        except ImportError as error:
            raise ValueError(
                f"--config {path}: reading TOML on Python 3.10 needs the 'tomli' package (pip install tomli)"
            ) from error
    try:
        with open(path, "rb") as handle:
            values: dict[str, Any] = tomllib.load(handle)
            return values
    except OSError as error:
        raise ValueError(f"--config {path}: cannot read the file ({error.strerror})") from error
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"--config {path}: not valid TOML ({error})") from error


def check_field_values(values: dict[str, Any], source: str) -> None:
    """Check that every key of ``values`` is a config field and every value has the field's type.

    Ranges and relations between fields are checked when the :class:`TrainerConfig` is built.
    Errors are ``ValueError`` starting with ``source`` (e.g. the TOML file) and naming the field.
    """
    known = [f.name for f in fields(TrainerConfig)]
    for key, value in values.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{source}: unknown config field {key!r}{hint}")
        try:
            _coerce(value, field_types()[key], key)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None


def config_from_toml(path: str | Path) -> dict[str, Any]:
    """The field values set in a TOML file (a flat table of ``field = value``), checked by name and type."""
    values = read_toml(path)
    check_field_values(values, f"--config {path}")
    return values
