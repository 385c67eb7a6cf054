"""The mutant zoo: adapters that wrap ``mine`` with exactly one real bug each.

Each mutant (:class:`tests.mutants.base.MutantSpec`) replaces one op of the reference adapter by a
buggy version written the way a real trainer had it, and cites where the bug comes from: a row of
the bug catalogue ``docs/bug-catalogue.md`` (``C8``), an upstream issue or pull request (``verl#7321``,
``SkyRL-PR#1928``), or the spec clause that names the pitfall (``GRP-2``).
``tests/test_mutant_zoo.py`` runs the conformance suite against every mutant and requires each one
to fail at least one clause.

Run one by hand::

    python -m pytest conformance/ -x -q --impl=tests.mutants.zoo:FACTORIES.B1_min_before_advantage

The registry is :data:`tests.mutants.zoo.MUTANTS`.
"""
