"""The formula's side of the third-party step tests, written once for their check scripts.

``tests/test_step_{openrlhf,rlinf,skyrl,swift,verl}.py`` each run a script in the library's own
environment (:func:`tests.thirdparty_env.run_step_check`, which puts this folder, and only it, on
the script's path: ``from step_formula import ...``; ``tests`` itself is not importable there, where
verl and OpenRLHF install a top-level package of that name). Each script checks its runner's
gradient against the loss computed here independently: GRPO's group advantages, every completion's
log-probabilities under the runner's tiny model loaded again (float32, eager attention, one
unpadded row at a time), and the relative difference of the two gradients. It also collects the
arguments the runner refuses. torch and transformers only: no pytest, nothing of the runner's own
code path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "completion_logprobs",
    "group_advantages",
    "refusals",
    "relative_gradient_difference",
    "tiny_model",
]


def refusals(run: Callable[..., object], batch: Any, calls: Iterable[Mapping[str, object]]) -> list[str]:
    """The argument each call ``run(batch, **kwargs)`` of ``calls`` is refused for: its ValueError's
    text up to the first colon (the argument's name), in order; a call that runs adds nothing."""
    refused = []
    for kwargs in calls:
        try:
            run(batch, **kwargs)
        except ValueError as error:
            refused.append(str(error).split(":")[0])
    return refused


def group_advantages(batch: Any, eps: float) -> Tensor:
    """GRPO's advantage of each row of ``batch`` (``StepBatch``): ``(score - group mean) / (group
    std + eps)``, the std unbiased as torch's, rows in batch order (float32, shape (B,))."""
    scores = torch.tensor(batch.scores).view(-1, batch.group_size)
    centred = scores - scores.mean(1, keepdim=True)
    return (centred / (scores.std(1, keepdim=True) + eps)).flatten()


def tiny_model(runner: Any, batch: Any) -> nn.Module:
    """The runner's tiny model for ``batch``'s vocabulary, loaded again by transformers (float32,
    eager attention): the same weights the library trained from."""
    from transformers import AutoModelForCausalLM

    path = runner._model_path(batch.vocab_size)
    model: nn.Module = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32
    )
    return model


def completion_logprobs(model: nn.Module, batch: Any, row: int, temperature: float = 1.0) -> Tensor:
    """``log pi(c_t | prompt, c_<t)`` of each token of row ``row``'s completion under ``model``, the
    logits divided by ``temperature``: one unpadded sequence, prompt then completion (shape (len(c),))."""
    completion = list(batch.completions[row])
    prompt = list(batch.prompt_ids[row // batch.group_size])
    logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1] / temperature
    tokens = torch.tensor(completion).view(-1, 1)
    logprobs: Tensor = torch.log_softmax(logits, -1).gather(-1, tokens).squeeze(-1)
    return logprobs


def ratio_one_surrogate(
    model: nn.Module,
    batch: Any,
    advantages: Tensor,
    rows: Sequence[int],
    per_token: bool,
    temperature: float = 1.0,
) -> tuple[Tensor, float]:
    """The clipped surrogate's loss over ``rows`` at ratio 1 (step 0), where its gradient is the
    policy gradient's, and its value:

    - ``per_token``: ``-(1/N) sum_i sum_t A_i logp_it``, N the completion tokens of ``rows``
      (token-mean, DAPO), value ``-(1/N) sum_i A_i |c_i|``;
    - else ``-(1/m) sum_i mean_t A_i logp_it`` over the m rows (seq-mean-token-mean, GRPO),
      value ``-(1/m) sum_i A_i``.

    Returns the loss as a tensor (to differentiate) and the value as a float.
    """
    tokens = sum(len(batch.completions[i]) for i in rows)
    loss: Tensor = torch.zeros(())
    value = 0.0
    for i in rows:
        terms = advantages[i] * completion_logprobs(model, batch, i, temperature)
        share = terms.sum() / tokens if per_token else terms.mean() / len(rows)
        weight = len(batch.completions[i]) / tokens if per_token else 1 / len(rows)
        loss, value = loss - share, value - float(advantages[i]) * weight
    return loss, value


def relative_gradient_difference(model: nn.Module, gradient: Mapping[str, Tensor], prefix: str = "") -> float:
    """The largest ``|p.grad - gradient[name]|`` over ``model``'s parameters, divided by the largest
    entry of ``gradient`` (a runner's, its names with ``prefix`` removed: DeepSpeed's ``module.``).
    Fails when ``gradient`` lacks one of the model's parameters."""
    theirs = {name.removeprefix(prefix): g for name, g in gradient.items()}
    named = dict(model.named_parameters())
    assert set(named) <= set(theirs), sorted(set(named) - set(theirs))
    diff = max(float((p.grad.double() - theirs[n]).abs().max()) for n, p in named.items())  # type: ignore[union-attr]
    return diff / max(float(g.abs().max()) for g in theirs.values())
