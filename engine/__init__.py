"""Seam's inference engine (PyTorch): model, weights, KV + state pools, scheduler, ranks, reconfiguration.

It imports solvers, never Django, and never transformers at run time.
"""
