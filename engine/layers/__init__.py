"""Building blocks shared by the model families: norms, rotary, MLP, MoE, attention and GDN mixers, and the linears
whose weights stay quantized (fp8 block-scaled, 4-bit) with how each is read from its checkpoint format."""
