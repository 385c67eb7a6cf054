"""The models of a PPO-RLHF run and the one forward pass that reads them over response tokens.

- policy: any ``AutoModelForCausalLM``; the reference is a frozen copy of its initial weights.
- critic: a separate backbone plus a scalar head (copied from the policy's backbone with a
  zero-initialised head, or from the reward model's backbone and head), or a scalar head on the
  policy's own last hidden state; or none at all (the critic-free advantage estimators).
- dropout is switched off in every model, and every model stays in eval mode: the log-probs of
  the rollout and of the update come from the same deterministic function.

Layout: for a :class:`~ppo_ref.trainer.data.SequenceBatch` with prompt width P and N response
columns, the log-prob and value of response token t are read at sequence position P - 1 + t (the
state before the token); the value at position P + N - 1 (after the last column) is the bootstrap
value of a response cut at the length limit.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from ppo_ref import entropy, token_logprobs
from ppo_ref.trainer.data import SequenceBatch
from ppo_ref.trainer.truncation import support_logmass

__all__ = [
    "ActorCritic",
    "ActorCriticModule",
    "NonFiniteError",
    "PolicyCaller",
    "ResponseOutputs",
    "ScalarHeadCritic",
    "at_least_float32",
    "call_model",
    "disable_dropout",
    "frozen_copy",
    "output_cache",
    "parameter_dtype",
    "parameter_fingerprint",
    "response_logprobs",
    "split_sequence_classifier",
    "supports_logits_to_keep",
]


class NonFiniteError(RuntimeError):
    """A forward pass produced NaN or inf where the PPO math needs finite numbers."""


_FORWARD_PARAMETERS: dict[type, frozenset[str]] = {}


def _forward_parameters(model: object) -> frozenset[str]:
    """Names of the parameters of ``model.forward`` (a wrapper's model, e.g. DDP's, is in ``.module``)."""
    inner: Any = getattr(model, "module", model)
    kind = type(inner)
    if kind not in _FORWARD_PARAMETERS:
        _FORWARD_PARAMETERS[kind] = frozenset(inspect.signature(inner.forward).parameters)
    return _FORWARD_PARAMETERS[kind]


def supports_logits_to_keep(model: object) -> bool:
    """Whether the model's forward accepts ``logits_to_keep`` (compute logits for the last positions only)."""
    return "logits_to_keep" in _forward_parameters(model)


def call_model(model: Callable[..., Any], **kwargs: Any) -> Any:
    """Call ``model`` with keyword arguments only; ``cache=`` goes to ``cache`` or ``past_key_values``."""
    if "cache" in kwargs and "cache" not in _forward_parameters(model):
        kwargs["past_key_values"] = kwargs.pop("cache")
    return model(**kwargs)


def output_cache(output: Any) -> Any:
    """The KV cache of a model output (``cache`` in transformers 5, ``past_key_values`` before)."""
    found = output.get("cache")
    return found if found is not None else output.get("past_key_values")


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def disable_dropout(model: ModuleT) -> ModuleT:
    """Set every dropout probability to 0 and put the model in eval mode (it stays there)."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
    config = getattr(model, "config", None)
    for name in ("attn_pdrop", "resid_pdrop", "embd_pdrop", "attention_dropout", "hidden_dropout", "dropout"):
        if config is not None and isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)
    return model.eval()


def frozen_copy(model: ModuleT) -> ModuleT:
    """A deep copy with gradients off, dropout off and eval mode: the reference policy."""
    copied = disable_dropout(copy.deepcopy(model))
    copied.requires_grad_(False)
    return copied


def parameter_fingerprint(model: nn.Module) -> Tensor:
    """Float64 sums and absolute sums of every parameter tensor: changes if any weight changes."""
    with torch.no_grad():
        sums = [p.detach().double().sum() for p in model.parameters()]
        abs_sums = [p.detach().double().abs().sum() for p in model.parameters()]
        return torch.stack(sums + abs_sums).cpu()


def at_least_float32(tensor: Tensor) -> Tensor:
    """``tensor`` in float32, or unchanged if it is already float32 or wider (float64 stays float64)."""
    return tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.float()


def parameter_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's first floating-point parameter (float32 if it has none)."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.float32


def _hidden_size(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None)
    if not isinstance(size, int):
        raise ValueError(f"model: cannot find config.hidden_size on {type(model).__name__}")
    return size


def split_sequence_classifier(reward_model: PreTrainedModel) -> tuple[nn.Module, nn.Linear]:
    """``(backbone, head)`` of a decoder-style ``*ForSequenceClassification`` with one output.

    The score must be readable at any position (here: the last real token), so the head must be a
    single ``Linear(hidden, 1)`` beside the backbone, as in GPT-2, Llama, Qwen or Mistral classifiers.
    """
    backbone = reward_model.base_model
    heads = [
        module
        for module in reward_model.children()
        if module is not backbone and not isinstance(module, nn.modules.dropout._DropoutNd)
    ]
    if backbone is reward_model or len(heads) != 1 or not isinstance(heads[0], nn.Linear):
        names = [type(m).__name__ for m in reward_model.children()]
        raise ValueError(
            f"reward model: expected a backbone plus one Linear head (a decoder-style sequence classifier), "
            f"got {type(reward_model).__name__} with children {names}"
        )
    if heads[0].out_features != 1:
        raise ValueError(f"reward model: expected one output (num_labels=1), got {heads[0].out_features}")
    return backbone, heads[0]


class ScalarHeadCritic(nn.Module):
    """A value model: a transformer backbone and a ``Linear(hidden, 1)`` head read at every position."""

    def __init__(self, backbone: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    @staticmethod
    def from_policy(policy: PreTrainedModel) -> ScalarHeadCritic:
        """Copy the policy's backbone; the head starts at zero, so every initial value is 0."""
        head = nn.Linear(_hidden_size(policy), 1, dtype=parameter_dtype(policy))
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        return disable_dropout(ScalarHeadCritic(copy.deepcopy(policy.base_model), head))

    @staticmethod
    def from_reward_model(reward_model: PreTrainedModel) -> ScalarHeadCritic:
        """Copy the reward model's backbone and head: the initial values are its scores."""
        backbone, head = split_sequence_classifier(reward_model)
        return disable_dropout(ScalarHeadCritic(copy.deepcopy(backbone), copy.deepcopy(head)))

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, keep_last: int
    ) -> Tensor:
        """Values (B, keep_last) in float32 (or wider) at the last ``keep_last`` positions."""
        hidden = call_model(
            self.backbone, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state
        return at_least_float32(self.head(hidden[:, -keep_last:]).squeeze(-1))


@dataclass(frozen=True)
class ResponseOutputs:
    """Per-response-token outputs of :meth:`ActorCritic.response_outputs` (float32).

    Attributes:
        logprobs: (B, N) log-probs of the response tokens under ``softmax(logits / temperature)``.
        values: (B, N) V(state before token t), or None if not asked for.
        bootstrap_values: (B,) V after the last response column, or None.
        entropy: (B, N) entropy of ``softmax(logits / temperature)`` before token t, or None.
        kept_logmass: (B, N) ``log S``, the mass ``softmax(logits / temperature)`` puts on its
            ``kept_counts`` most probable tokens before token t (the sampler's top-k / top-p set
            replayed, :func:`~ppo_ref.trainer.truncation.support_logmass`), or None when no kept
            counts were given.
    """

    logprobs: Tensor
    values: Tensor | None
    bootstrap_values: Tensor | None
    entropy: Tensor | None
    kept_logmass: Tensor | None = None


def _logprobs_and_logits(
    model: nn.Module, sequences: SequenceBatch, temperature: float, **extra: Any
) -> tuple[Tensor, Tensor, Any]:
    """Forward ``model`` over the batch; return log-probs (B, N), logits at positions P-1..L-1, output."""
    width = sequences.response_width + 1
    if supports_logits_to_keep(model):
        extra["logits_to_keep"] = width
    output = call_model(
        model,
        input_ids=sequences.input_ids,
        attention_mask=sequences.attention_mask,
        position_ids=sequences.position_ids,
        **extra,
    )
    logits = output.logits[:, -width:]
    try:
        logprobs = token_logprobs(logits, sequences.input_ids[:, -width:], temperature)
    except ValueError:
        if not bool(torch.isfinite(logits).all()):
            raise NonFiniteError(f"{type(model).__name__} produced non-finite logits") from None
        raise
    return logprobs, logits, output


def response_logprobs(model: nn.Module, sequences: SequenceBatch, temperature: float) -> Tensor:
    """(B, N) log-probs of the response tokens under ``model`` (e.g. the frozen reference)."""
    return _logprobs_and_logits(model, sequences, temperature)[0]


class ActorCriticModule(nn.Module):
    """The trained models in one ``nn.Module``: what ``accelerator.prepare`` wraps (DDP, FSDP2, DeepSpeed).

    Every forward of the trained models goes through :meth:`forward`, so a wrapper that gathers
    sharded parameters or synchronises gradients in its own ``forward`` sees every call:
    ``mode="policy"`` calls the causal LM with the given keyword arguments (generation);
    ``mode="outputs"`` returns the :class:`ResponseOutputs` of a prompt + response batch.
    Without ``critic`` and ``value_head`` the module is the policy alone (a critic-free run).
    """

    def __init__(
        self, policy: nn.Module, critic: ScalarHeadCritic | None = None, value_head: nn.Linear | None = None
    ) -> None:
        super().__init__()
        if critic is not None and value_head is not None:
            raise ValueError("critic/value_head: expected at most one of a separate critic or a value head")
        self.policy = disable_dropout(policy)
        self.critic = None if critic is None else disable_dropout(critic)
        self.value_head = None if value_head is None else value_head.eval()
        # FSDP's transformer auto-wrap policy reads the block classes from here.
        blocks = set(getattr(policy, "_no_split_modules", None) or [])
        if critic is not None:
            blocks |= set(getattr(critic.backbone, "_no_split_modules", None) or [])
        self._no_split_modules = sorted(blocks)

    def forward(self, mode: str, **kwargs: Any) -> Any:
        """``mode="policy"``: the policy's own forward; ``mode="outputs"``: :meth:`response_outputs`."""
        if mode == "policy":
            return call_model(self.policy, **kwargs)
        if mode == "outputs":
            # A wrapper's hooks go on the returned tensors (FSDP2 registers its pre-backward hook
            # there and warns that an in-place op on a returned *view* would drop it): return each
            # as a tensor of its own. A copy of (B, N) floats; the values are the same bits.
            out = self.response_outputs(**kwargs)
            return ResponseOutputs(
                logprobs=_not_a_view(out.logprobs),
                values=None if out.values is None else _not_a_view(out.values),
                bootstrap_values=None if out.bootstrap_values is None else _not_a_view(out.bootstrap_values),
                entropy=None if out.entropy is None else _not_a_view(out.entropy),
                kept_logmass=None if out.kept_logmass is None else _not_a_view(out.kept_logmass),
            )
        raise ValueError(f"mode: expected 'policy' or 'outputs', got {mode!r}")

    def response_outputs(
        self,
        *,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        prompt_width: int,
        temperature: float,
        need_values: bool,
        need_entropy: bool,
        kept_counts: Tensor | None = None,
    ) -> ResponseOutputs:
        """Log-probs (and values, entropies, kept log-mass) of the response tokens of a prompt +
        response batch."""
        sequences = SequenceBatch(input_ids, attention_mask, position_ids, prompt_width)
        shared_values = need_values and self.value_head is not None
        extra = {"output_hidden_states": True} if shared_values else {}
        logprobs, logits, output = _logprobs_and_logits(self.policy, sequences, temperature, **extra)
        entropies = entropy(logits[:, :-1] / temperature) if need_entropy else None
        kept_logmass = None
        if kept_counts is not None:
            kept_logmass = support_logmass(logits[:, :-1], kept_counts, temperature).to(logprobs.dtype)
        all_values = None
        if shared_values:
            assert self.value_head is not None
            width = sequences.response_width + 1
            all_values = at_least_float32(self.value_head(output.hidden_states[-1][:, -width:]).squeeze(-1))
        elif need_values:
            if self.critic is None:
                raise ValueError("need_values: this run has no critic (a critic-free advantage estimator)")
            all_values = self.critic(
                sequences.input_ids,
                sequences.attention_mask,
                sequences.position_ids,
                keep_last=sequences.response_width + 1,
            )
        if all_values is not None and not bool(torch.isfinite(all_values).all()):
            raise NonFiniteError("the critic produced non-finite values")
        return ResponseOutputs(
            logprobs=logprobs,
            values=None if all_values is None else all_values[:, :-1],
            bootstrap_values=None if all_values is None else all_values[:, -1],
            entropy=entropies,
            kept_logmass=kept_logmass,
        )


def _not_a_view(tensor: Tensor) -> Tensor:
    """``tensor`` itself, or a copy where it is a view of another tensor."""
    return tensor.clone() if tensor._is_view() else tensor


class PolicyCaller:
    """Calls the policy through a runner of :class:`ActorCriticModule` (``runner(mode="policy", ...)``).

    ``module`` is the policy itself, so :func:`call_model` and :func:`supports_logits_to_keep` read
    the policy's forward signature, as they do through a DDP wrapper.
    """

    def __init__(self, runner: Callable[..., Any], policy: nn.Module) -> None:
        self.runner = runner
        self.module = policy

    def __call__(self, **kwargs: Any) -> Any:
        return self.runner(mode="policy", **kwargs)


class ActorCritic:
    """The trained models: the policy and its critic (separate, a head on the policy, or none).

    ``module`` holds them as one :class:`ActorCriticModule`. Forwards with gradients go through
    ``train_runner``, forwards without through ``inference_runner``; both are ``module`` until the
    trainer prepares it for data parallelism (then DDP's wrapper trains, and the plain module, whose
    parameters every process holds, runs inference; with sharded parameters both are the wrapper).
    """

    def __init__(
        self,
        policy: nn.Module,
        critic: ScalarHeadCritic | None = None,
        value_head: nn.Linear | None = None,
    ) -> None:
        self.module = ActorCriticModule(policy, critic, value_head)
        self.train_runner: Callable[..., Any] = self.module
        self.inference_runner: Callable[..., Any] = self.module

    @property
    def policy(self) -> nn.Module:
        """The causal LM being trained."""
        return self.module.policy

    @property
    def critic(self) -> ScalarHeadCritic | None:
        """The separate critic, or None with a value head."""
        return self.module.critic

    @property
    def value_head(self) -> nn.Linear | None:
        """The value head on the policy's last hidden state, or None with a separate critic."""
        return self.module.value_head

    def policy_parameters(self) -> list[nn.Parameter]:
        """Parameters of the policy (without a value head)."""
        return [p for p in self.policy.parameters() if p.requires_grad]

    @property
    def has_critic(self) -> bool:
        """Whether there is a critic (a separate one or a value head)."""
        return self.critic is not None or self.value_head is not None

    def critic_model(self) -> nn.Module | None:
        """The module that only the value loss trains (the separate critic, or the value head), or None."""
        return self.critic if self.critic is not None else self.value_head

    def critic_parameters(self) -> list[nn.Parameter]:
        """Parameters that only the value loss trains (the separate critic, or the value head);
        empty without a critic."""
        critic = self.critic_model()
        return [] if critic is None else [p for p in critic.parameters() if p.requires_grad]

    def policy_caller(self) -> PolicyCaller:
        """The policy as a callable for generation (through ``inference_runner``)."""
        return PolicyCaller(self.inference_runner, self.policy)

    def response_outputs(
        self,
        sequences: SequenceBatch,
        temperature: float,
        *,
        need_values: bool = True,
        need_entropy: bool = False,
        kept_counts: Tensor | None = None,
    ) -> ResponseOutputs:
        """Log-probs (and values, entropies) of the response tokens: the same code for rollout and
        update; with ``kept_counts`` (B, N), the log-mass on each step's kept set too."""
        runner = self.train_runner if torch.is_grad_enabled() else self.inference_runner
        outputs: ResponseOutputs = runner(
            mode="outputs",
            input_ids=sequences.input_ids,
            attention_mask=sequences.attention_mask,
            position_ids=sequences.position_ids,
            prompt_width=sequences.prompt_width,
            temperature=temperature,
            need_values=need_values,
            need_entropy=need_entropy,
            kept_counts=kept_counts,
        )
        return outputs
