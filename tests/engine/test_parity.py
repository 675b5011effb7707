"""The engine's logits match transformers' own implementation (fp32, CPU) for prefill and every decode step.

This is the engine's most important test: every family, hybrid and dense, MoE and not, tied and untied.
"""

import copy

import pytest
import torch

from engine.loader import load_model
from engine.ops.gdn import gated_delta_chunked, gated_delta_step
from tests.support.engine_checkpoints import CASES, VOCAB, TinyRunner, relative_error

TOLERANCE = 1e-4
DECODE_STEPS = 8


def _prompt(length: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("case", list(CASES))
def test_prefill_and_greedy_decode_match_transformers(case, reference_checkpoint):
    folder, reference = reference_checkpoint(case)
    runner = TinyRunner(load_model(folder))
    prompt = _prompt(11, seed=1)

    logits = runner.step({"a": prompt}, all_logits=True)
    with torch.no_grad():
        out = reference(torch.tensor([prompt]), use_cache=True)
    assert relative_error(logits, out.logits[0]) <= TOLERANCE  # every position, not only the last

    cache, ours_tokens, their_tokens = out.cache, [], []
    ours_next, their_next = int(logits[-1].argmax()), int(out.logits[0, -1].argmax())
    for _ in range(DECODE_STEPS):
        ours_tokens.append(ours_next)
        their_tokens.append(their_next)
        logits = runner.step({"a": [ours_next]})[0]
        with torch.no_grad():
            out = reference(torch.tensor([[their_next]]), cache=cache, use_cache=True)
        cache, reference_logits = out.cache, out.logits[0, -1]
        assert relative_error(logits, reference_logits) <= TOLERANCE
        ours_next, their_next = int(logits.argmax()), int(reference_logits.argmax())
    assert ours_tokens == their_tokens


@pytest.mark.parametrize("case", ["qwen3_next_moe", "llama_untied", "mistral_sliding"])
def test_chunked_prefill_matches_one_chunk(case, reference_checkpoint):
    folder, _ = reference_checkpoint(case)
    model = load_model(folder)
    prompt = _prompt(13, seed=2)  # 7 + 6: the chunk boundary falls inside a KV block and the conv window
    whole, chunked = TinyRunner(model), TinyRunner(model, seed=5)
    one = whole.step({"a": prompt})
    chunked.step({"a": prompt[:7]})
    two = chunked.step({"a": prompt[7:]})
    assert relative_error(two, one) <= TOLERANCE
    token = [int(one[0].argmax())]
    assert relative_error(chunked.step({"a": token}), whole.step({"a": token})) <= TOLERANCE


@pytest.mark.parametrize("case", ["qwen3_next_moe", "qwen3_tied"])
def test_batched_sequences_match_each_alone(case, reference_checkpoint):
    folder, _ = reference_checkpoint(case)
    model = load_model(folder)
    first, second = _prompt(9, seed=3), _prompt(5, seed=4)
    batch = TinyRunner(model)
    alone = {name: TinyRunner(model, seed=i + 7) for i, name in enumerate("ab")}

    together = batch.step({"a": first, "b": second})
    assert relative_error(together[0], alone["a"].step({"a": first})[0]) <= TOLERANCE
    assert relative_error(together[1], alone["b"].step({"b": second})[0]) <= TOLERANCE

    # A mixed step: one sequence decodes while the other prefills a further chunk.
    decode, chunk = [int(together[0].argmax())], _prompt(4, seed=6)
    mixed = batch.step({"a": decode, "b": chunk})
    assert relative_error(mixed[0], alone["a"].step({"a": decode})[0]) <= TOLERANCE
    assert relative_error(mixed[1], alone["b"].step({"b": chunk})[0]) <= TOLERANCE


def test_layer_ranges_chained_match_the_whole_model(reference_checkpoint):
    folder, _ = reference_checkpoint("qwen3_next_tied_mixed")
    prompt = _prompt(10, seed=8)
    whole = TinyRunner(load_model(folder))
    split = TinyRunner([load_model(folder, 0, 1), load_model(folder, 1, 3), load_model(folder, 3, 4)])
    assert relative_error(split.step({"a": prompt}), whole.step({"a": prompt})) <= TOLERANCE
    token = [3]
    assert relative_error(split.step({"a": token}), whole.step({"a": token})) <= TOLERANCE


@pytest.mark.parametrize("case", ["qwen3_next_moe", "llama_untied"])
def test_bfloat16_stays_within_bfloat16_noise_of_the_reference(case, reference_checkpoint):
    """Loose by nature: transformers' own sdpa and eager paths differ by ~1.2e-2 here in bf16."""
    folder, reference = reference_checkpoint(case)
    prompt = _prompt(11, seed=9)
    runner = TinyRunner(load_model(folder, dtype=torch.bfloat16))
    ours = runner.step({"a": prompt}, all_logits=True)
    with torch.no_grad():
        theirs = copy.deepcopy(reference).to(torch.bfloat16)(torch.tensor([prompt])).logits[0]
    assert ours.dtype == torch.bfloat16
    assert relative_error(ours, theirs) <= 3e-2
    assert torch.isfinite(runner.step({"a": [int(ours[-1].argmax())]})).all()


def test_chunked_delta_rule_matches_the_token_recurrence():
    """Across several 64-token chunks, from a non-zero state, with grouped value heads."""
    torch.manual_seed(0)
    tokens, key_heads, heads, key_dim, value_dim = 150, 2, 4, 8, 6
    q, k = torch.randn(tokens, key_heads, key_dim), torch.randn(tokens, key_heads, key_dim)
    v = torch.randn(tokens, heads, value_dim)
    g, beta = -torch.rand(tokens, heads) * 0.5, torch.rand(tokens, heads)
    initial = torch.randn(heads, key_dim, value_dim)

    out, final = gated_delta_chunked(q, k, v, g, beta, initial)
    state, steps = initial[None], []
    for t in range(tokens):
        step_out, state = gated_delta_step(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], state)
        steps.append(step_out[0])
    assert relative_error(out, torch.stack(steps)) <= 1e-5
    assert relative_error(final, state[0]) <= 1e-5
