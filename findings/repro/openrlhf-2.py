"""openrlhf-2 (non-default: a multi-turn agent, ``--train.agent_func_path``, with ``--algo.advantage.lambd``
or ``--algo.advantage.gamma`` below 1).

Run from the repository root: ``.envs/openrlhf/bin/python findings/repro/openrlhf-2.py``.

OpenRLHF's multi-turn agent (``openrlhf/utils/agent.py`` ``MultiTurnAgentExecutor``) returns the
action ranges of each turn; ``SamplesGenerator._process_response_into_experience`` sets
``action_mask`` to 1 on them only, so the environment's feedback tokens between two turns are a hole
in the mask. ``RemoteExperienceMaker.compute_advantages_and_returns`` (estimator ``gae``, the
default) then runs ``get_advantages_and_returns``, which zeroes values and rewards at the hole and
runs the recursion through it: a hole is a step with V = 0, one extra ``gamma * lambd`` and a
bootstrap from 0 instead of the next turn's value. With the defaults gamma = lambd = 1 the action
tokens' advantages telescope to the same numbers (unaffected); with lambd < 1 (or gamma < 1) they
are wrong. Spec GAE-2: holes are skipped, one discount per action token.

Drives: ``_process_response_into_experience`` on an agent response, then
``compute_advantages_and_returns`` on the experience (a stand-in ``self`` with the trainer's
arguments; ``no_std_norm`` so only the batch mean is subtracted) and compares with ppo-ref's ``gae``,
centred the same way.
"""

from __future__ import annotations

from types import SimpleNamespace

from ppo_ref.adapters.thirdparty import _openrlhf_stubs

_openrlhf_stubs.install()
import torch  # noqa: E402
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # noqa: E402
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator  # noqa: E402

import ppo_ref  # noqa: E402

# prompt (3 tokens), turn 1 (2 tokens), environment feedback (2 tokens), turn 2 (2 tokens)
response = {
    "prompt": "p",
    "label": "",
    "images": None,
    "mm_train_inputs": None,
    "reward": 1.0,
    "scores": 1.0,
    "observation_tokens": [11, 12, 13, 21, 22, 31, 32, 41, 42],
    "action_ranges": [(3, 5), (7, 9)],
    "rollout_log_probs": None,
    "truncated": False,
    "extra_logs": {},
}
experience = SamplesGenerator._process_response_into_experience(None, response, max_len=64)
mask = experience.action_mask  # over the sequence shifted by one, as the actor's log-probs are
print("action_mask (from the agent's action ranges):", mask.int().tolist())

values = torch.linspace(0.1, 0.8, mask.shape[1]).unsqueeze(0)  # the critic's values at every position
experience.values = values
experience.rewards = torch.tensor([1.0])
experience.kl = torch.zeros_like(values)
experience.index = [0]
experience.info = {}


def run(gamma: float, lambd: float) -> torch.Tensor:
    args = SimpleNamespace(
        algo=SimpleNamespace(
            advantage=SimpleNamespace(estimator="gae", gamma=gamma, lambd=lambd, no_std_norm=True),
        ),
        rollout=SimpleNamespace(n_samples_per_prompt=1),
        reward=SimpleNamespace(
            clip_range=(-10.0, 10.0), overlong_buffer_len=None, stop_properly_penalty_coef=None
        ),
        data=SimpleNamespace(max_len=64),
    )
    maker = SimpleNamespace(
        strategy=SimpleNamespace(args=args), advantage_estimator="gae", kl_ctl=SimpleNamespace(value=0.0)
    )
    maker.get_advantages_and_returns = lambda *a: RemoteExperienceMaker.get_advantages_and_returns(maker, *a)
    exp = SimpleNamespace(**{k: getattr(experience, k) for k in ("values", "rewards", "kl", "index", "info")})
    exp.action_mask = mask
    exp.response_length = torch.tensor([float(mask.sum())])
    exp.info = {}
    (out,) = RemoteExperienceMaker.compute_advantages_and_returns(maker, [exp])
    return out.advantages


for gamma, lambd in ((1.0, 1.0), (1.0, 0.95)):
    got = run(gamma, lambd)
    rewards = torch.zeros_like(values)
    rewards[0, int(mask.nonzero()[-1, 1])] = 1.0  # compute_reward puts the score on the last action token
    expected, _ = ppo_ref.gae(rewards.double(), values.double(), mask.bool(), gamma, lambd)
    on = mask.bool()
    expected = expected - expected[on].mean()  # OpenRLHF centres the advantages (no_std_norm: no scaling)
    shown = [round(v, 4) for v in got[on].tolist()]
    print(f"gamma={gamma} lambd={lambd}: advantages on the action tokens {shown}; ", end="")
    print(f"expected {[round(v, 4) for v in expected[on].tolist()]}")
