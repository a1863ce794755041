"""Engines bound to the catalog: one module per engine (reference, verl, skyrl, megatron) and
``load`` (``--engine`` spec -> Binding: built-in names, mutants, ``module:attr``, ``file.py``).
Imports the catalog, families, core and workers, and the engine's own package; never properties or above.
"""
