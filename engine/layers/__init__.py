"""Building blocks shared by the model families: norms, rotary, MLP, MoE, attention and GDN mixers."""
