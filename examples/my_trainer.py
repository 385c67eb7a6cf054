"""A small GRPO trainer of the kind users write: group advantages, a clipped policy loss over
micro-batches with gradient accumulation, one optimizer step per batch. Nothing here imports ppo-ref;
``my_step_runner.py`` judges its step with ppo-ref's step tier (docs/step-tier.md, "Judging your
trainer's step").

The batch is a dict of tensors: ``prompt_ids`` / ``prompt_mask`` (B, P) left-padded,
``response_ids`` / ``response_mask`` (B, T) right-padded, ``scores`` (B,), rows grouped by prompt.
"""

import torch


def group_advantages(scores, group_size, eps=1e-6):
    """Each score minus its group's mean, over the group's standard deviation."""
    grouped = scores.view(-1, group_size)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + eps)).flatten()


def prepare(batch, eos_id, mask_truncated=False):
    """The loss mask (every completion token, EOS included) and which rows were cut without EOS;
    with ``mask_truncated`` the rows cut at the budget are left out of the loss (overlong filtering)."""
    ended = ((batch["response_ids"] == eos_id) & batch["response_mask"].bool()).any(dim=1)
    loss_mask = batch["response_mask"].float()
    if mask_truncated:
        loss_mask = loss_mask * ended.unsqueeze(1)
    return loss_mask, ~ended


def token_logprobs(model, batch, rows):
    """Log-probs of the response tokens of ``rows``, position ids counted from each first real token."""
    input_ids = torch.cat([batch["prompt_ids"][rows], batch["response_ids"][rows]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"][rows], batch["response_mask"][rows]], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    width = batch["response_ids"].shape[1]
    logp = torch.log_softmax(logits[:, -width - 1 : -1].float(), dim=-1)
    return logp.gather(-1, batch["response_ids"][rows].unsqueeze(-1)).squeeze(-1)


def loss_denominator(batch_mask, micro_mask, steps):
    """What a micro-batch's summed token loss is divided by: the whole batch's token count, so every
    token weighs the same however the batch is split (token-mean over the batch)."""
    return batch_mask.sum().clamp(min=1)


def train_step(model, optimizer, batch, group_size, micro_batch_size, eos_id, clip=0.2, mask_truncated=False):
    """One optimizer step on ``batch``: old log-probs in one forward, then the clipped loss of each
    micro-batch of ``micro_batch_size`` rows, backward, and ``optimizer.step()``. Returns its statistics."""
    rows = batch["scores"].shape[0]
    if rows % micro_batch_size:
        raise ValueError(f"micro_batch_size: expected a divisor of {rows}, got {micro_batch_size}")
    loss_mask, truncated = prepare(batch, eos_id, mask_truncated)
    advantages = group_advantages(batch["scores"].float(), group_size)
    with torch.no_grad():
        old_logp = token_logprobs(model, batch, torch.arange(rows))
    steps, losses, ratio, clipped = rows // micro_batch_size, [], 0.0, 0.0
    for start in range(0, rows, micro_batch_size):
        micro = torch.arange(start, start + micro_batch_size)
        mask = loss_mask[micro]
        log_ratio = token_logprobs(model, batch, micro) - old_logp[micro]
        r = torch.exp(log_ratio)
        a = advantages[micro].unsqueeze(1)
        objective = torch.minimum(r * a, r.clamp(1 - clip, 1 + clip) * a)
        loss = -(objective * mask).sum() / loss_denominator(loss_mask, mask, steps)
        loss.backward()
        losses.append(float(loss.detach()))
        if mask.any():
            ratio = max(ratio, float(log_ratio.detach().abs()[mask.bool()].max()))
        clipped += float((((r - 1).abs() > clip) * mask).sum())
    optimizer.step()
    optimizer.zero_grad()
    return {
        "losses": losses,
        "max_abs_log_ratio": ratio,
        "clipfrac": clipped / float(loss_mask.sum().clamp(min=1)),
        "loss_mask": loss_mask,
        "truncated": truncated,
    }


def train(
    model, tokenizer, prompts, reward, iterations=1, group_size=4, max_new_tokens=8, micro_batch_size=4
):
    """The loop: sample ``group_size`` completions per prompt, score them with ``reward(texts)``,
    take one :func:`train_step`. Returns the statistics of the last step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokenizer.padding_side = "left"
    stats = {}
    for _ in range(iterations):
        encoded = tokenizer(
            [p for p in prompts for _ in range(group_size)], return_tensors="pt", padding=True
        )
        with torch.no_grad():
            out = model.generate(
                **encoded, do_sample=True, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id
            )
        response_ids = out[:, encoded["input_ids"].shape[1] :]
        ends = (response_ids == tokenizer.eos_token_id).int().cumsum(dim=1)
        response_mask = ((ends == 0) | ((ends == 1) & (response_ids == tokenizer.eos_token_id))).long()
        texts = tokenizer.batch_decode(response_ids * response_mask, skip_special_tokens=True)
        batch = {
            "prompt_ids": encoded["input_ids"],
            "prompt_mask": encoded["attention_mask"],
            "response_ids": response_ids,
            "response_mask": response_mask,
            "scores": torch.tensor(reward(texts), dtype=torch.float32),
        }
        stats = train_step(model, optimizer, batch, group_size, micro_batch_size, tokenizer.eos_token_id)
    return stats
