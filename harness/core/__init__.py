"""The op vocabulary and the comparison machinery every layer above uses: opinfo, contracts,
tolerance, guards, faithful fp32 paths, strategies, generated tensors, torch state; code_changes: which functions of a git checkout a
change touched (ast, no import).
Imports only rlconform.reference (and torch, numpy, hypothesis).
"""
