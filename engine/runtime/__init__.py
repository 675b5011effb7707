"""One rank's step and the loop's bookkeeping: sequences, the scheduler and its block accounting, the runner that
runs a layer range, CUDA graphs, sampling, and the checkpoint's text side (tokenizer, end ids)."""
