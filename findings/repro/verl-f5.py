"""verl-f5: IcePop that rejects every token of the batch stops the training step with ZeroDivisionError
(non-default).

Interpreter: .envs/verl/bin/python (run from the repository root:
``.envs/verl/bin/python findings/repro/verl-f5.py``). Needs only ``pip install verl==0.9.1`` (with its
dependencies torch, tensordict, omegaconf); imports nothing else.

What it drives: ``verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_and_add_to_batch`` -- the
call ``RayPPOTrainer.fit`` makes on every step (``ray_trainer.py:1658``) when
``algorithm.rollout_correction`` is set (it is, by default, with ``rollout_is: null``), the batch has
``rollout_log_probs`` (``rollout.calculate_log_probs`` defaults to true) and ``bypass_mode`` is false
(default) -- on a ``DataProto`` with the fields ``fit`` has put there by then (``old_log_probs``,
``rollout_log_probs``, ``response_mask``). It computes the IcePop weights and then
``compute_is_metrics``, whose effective sample size is
``1.0 / masked_mean(w_norm ** 2, response_mask).item()`` (``rollout_corr_helper.py:757-759``): a Python
float division by 0.0 when no action token keeps a weight.

Trigger: ``algorithm.rollout_correction.rollout_is: token`` with ``rollout_is_threshold: "0.5_5.0"`` (the
preset ``RolloutCorrectionConfig.decoupled_token_icepop()``) on a batch in which every token's ratio
pi_old / pi_rollout lies outside [0.5, 5]; and ``rollout_is: sequence`` with the same IcePop bounds on a
batch whose per-token ratios are all inside the band (0.9 and 1.1) but whose sequence ratios (their
products over 24 tokens) are all outside it. Also runs verl's default (``rollout_is: null``, from verl's
own ``rollout_correction.yaml``), TIS (``rollout_is: token``, threshold 2.0: ``decoupled_token_is()``)
and token IcePop with one token inside the band on the same batches. (The config dataclass's own default
is ``rollout_is: "sequence"``; the trainer reads the YAML, whose default is null.)

Expected (spec IS-1, IS-3): weights w = ratio where lo <= ratio <= hi, else 0 -- here all zeros -- and a
finished step (an effective sample size of 0 for an all-zero batch, as verl PR #7559 proposes). Got:
``ZeroDivisionError: float division by zero``.

Exit status: 1 when the ZeroDivisionError (or weights other than the formula's) appears at a trigger.
"""

from __future__ import annotations

import os
import sys

import torch
import verl
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

# algorithm.rollout_correction as the trainer's Hydra config holds it: verl's own defaults file
# (rollout_is: null, rollout_is_threshold: 2.0, bypass_mode: false) plus the overrides of each run.
DEFAULTS = os.path.join(
    os.path.dirname(verl.__file__), "trainer", "config", "algorithm", "rollout_correction.yaml"
)


def config(**overrides):
    return OmegaConf.merge(OmegaConf.load(DEFAULTS), overrides)


def batch(old, rollout):
    mask = torch.ones_like(old)
    return DataProto.from_dict(
        tensors={"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask}
    )


def expected(old, rollout, config):
    """IcePop / TIS weights from the formula (plain torch)."""
    ratio = torch.exp(old - rollout)
    if config.rollout_is is None:
        return None
    if config.rollout_is == "sequence":
        ratio = torch.exp((old - rollout).sum(-1, keepdim=True)).expand_as(old)
    spec = str(config.rollout_is_threshold)
    if "_" in spec:
        low, high = (float(x) for x in spec.split("_"))
        return torch.where((ratio >= low) & (ratio <= high), ratio, torch.zeros_like(ratio))
    return ratio.clamp(max=float(spec))


def short(weights):
    return sorted({round(v, 4) for row in weights.tolist() for v in row})


def run(label, old, rollout, config, trigger):
    try:
        out, _ = compute_rollout_correction_and_add_to_batch(batch(old, rollout), config)
    except ZeroDivisionError as error:
        print(
            f"{label}: expected weights (values) {short(expected(old, rollout, config))} "
            f"and a finished step; "
            f"got ZeroDivisionError: {error}"
        )
        return trigger
    if config.rollout_is is None:
        print(
            f"{label}: expected no IS weights; got IS weights: {'rollout_is_weights' in out.batch.keys()}, "
            "step finished"
        )
        return False
    got = out.batch["rollout_is_weights"]
    want = expected(old, rollout, config)
    ok = torch.allclose(got, want, atol=1e-6)
    print(
        f"{label}: expected weights {want.tolist()}; got {[[round(v, 4) for v in r] for r in got.tolist()]}"
    )
    return trigger and not ok


def main():
    icepop = config(
        rollout_is="token", rollout_is_threshold="0.5_5.0"
    )  # RolloutCorrectionConfig.decoupled_token_icepop()
    seq_icepop = config(rollout_is="sequence", rollout_is_threshold="0.5_5.0")
    old = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    far = old - 2.0  # ratio e^2 = 7.39 on every token: outside [0.5, 5]
    one_in = far.clone()
    one_in[1, 1] = old[1, 1] - 1.0  # ratio e^1 = 2.72: inside
    long_old = torch.full((2, 24), -1.0)
    drift = torch.tensor([[0.1] * 24, [-0.1] * 24])  # per-token ratio e^-0.1 = 0.90 / e^0.1 = 1.11 (inside)
    wrong = False
    wrong |= run("trigger: token IcePop [0.5, 5], every ratio 7.39", old, far, icepop, True)
    wrong |= run(
        "trigger: sequence IcePop [0.5, 5], token ratios 0.90 / 1.11, sequence ratios e^-2.4 = 0.09 / "
        "e^2.4 = 11.0",
        long_old,
        long_old - drift,
        seq_icepop,
        True,
    )
    run("token IcePop, one ratio 2.72 inside the band", old, one_in, icepop, False)
    run("defaults (rollout_is null), every ratio 7.39", old, far, config(), False)
    run(
        "TIS (decoupled_token_is, threshold 2), every ratio 7.39",
        old,
        far,
        config(rollout_is="token", rollout_is_threshold=2.0),
        False,
    )
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
