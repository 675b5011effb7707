"""Numerical kernels: attention over paged KV, the GDN recurrence, the short causal conv, matmuls over quantized
weights.

Each has a PyTorch path that runs anywhere; a fused kernel is used only where it is importable and on its device.
"""

import torch

HALF = (torch.bfloat16, torch.float16)  # the dtypes the Triton kernels take (float32 stays the eager reference)
