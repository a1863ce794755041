"""Processes that run engine code: the persistent gloo worker pool (pool, pool_worker, pool_cases),
one-shot isolated children (isolated) and interrupt handling (interrupts).
Imports only rlconform.harness.core (and the standard library, torch).
"""
