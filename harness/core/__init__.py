"""The op vocabulary and the comparison machinery every layer above uses: opinfo, contracts,
tolerance, guards, faithful fp32 paths, strategies, generated tensors, torch state.
Imports only rlconform.reference (and torch, numpy, hypothesis).
"""
