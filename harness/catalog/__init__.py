"""The op catalog (ops: every family's OpInfo by name) and how an engine is bound to it
(binding: Binding, Lazy, variants and implementations; coverage: which engine functions are checked).
Imports rlconform.harness.families, core and workers.
"""
