"""The op catalog (ops: every family's OpInfo by name) and how an engine is bound to it
(binding: Binding, Lazy, variants and implementations; coverage: which engine functions are checked;
discovery: the engine's numerics functions read from its source with ast; audit: fault-shape rules over them).
Imports rlconform.harness.families, core and workers.
"""
