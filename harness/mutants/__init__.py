"""The mutant zoo: one minimal faulty engine per bug kind of ``docs/bug-kinds.md``.

Each module defines ``binding`` (the reference engine with one op replaced by the faulty version)
and ``EXPECTED``: the (op, property) pairs that must catch it. ``tests/test_mutants.py`` asserts that
every mutant is caught under the CI profile, and that every generic property is failed by at least
one mutant (a property no mutant fails is a defect). A module may also define ``CAUGHT_BY``: finding ids
(``op.property.dtype.regime``) of its ``EXPECTED`` pairs that fail under the CI profile; the self-test
then checks the mutant on those findings only (``--findings``), and each must fail. Select one with
``--engine mutants.<name>``.
Mutants import the catalog (Binding), families, core and ``bindings.reference``; never properties or above.
"""
