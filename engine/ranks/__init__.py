"""Rank processes: one rank serving its layer range on its device, the group of them the driver commands, and the
stage-to-stage transport of hidden states between them."""
