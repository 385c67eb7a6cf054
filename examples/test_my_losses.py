"""One function at a time, without an adapter: ``check_op`` inside your own pytest run.

Each test runs the conformance suite on one function of ``my_ppo_adapter.py`` (the same clauses,
verdicts and report as ``--impl=my_ppo_adapter:make_adapter`` gives that op) and fails with one
block per failing clause (its kind, first failing test, expected against got, a reproduction).
In the directory that holds both files, with ppo-ref installed (``pip install
"ppo-ref[conformance]"``):

    python -m pytest test_my_losses.py
"""

from my_ppo_adapter import my_gae, my_policy_loss
from ppo_ref_conformance import check_op


def test_my_gae_conforms():
    check_op("gae", my_gae)


def test_my_policy_loss_conforms():
    # what the loss implements, declared as the adapter class declares it
    conventions = {"clipfrac": "ratio-outside", "loss_aggregations": ["token-mean"]}
    check_op("policy_loss", my_policy_loss, conventions=conventions)
