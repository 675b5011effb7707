"""engine/runtime/sampler.py's penalties and logprobs: the expected logits computed by hand from each definition.

OpenAI's presence and frequency penalties count generated tokens only; vLLM's (HF's) repetition penalty divides a
positive logit and multiplies a negative one of every token seen in the prompt or the output. Logprobs are the
log-softmax of what was sampled from: after penalties, temperature and the top-k/top-p cut.
"""

import math

import pytest
import torch

from engine.errors import EngineRequestError
from engine.runtime.sampler import Sampler, SamplingParams, StepLogits, penalize
from engine.runtime.sequence import Sequence

LOGITS = [2.0, -1.0, 0.5, 3.0, -2.0, 1.0]


def _seq(seq_id: int, prompt: list[int], output: list[int], **params) -> Sequence:
    return Sequence(seq_id, prompt, SamplingParams(**params), output_ids=list(output))


def test_each_penalty_changes_the_logits_as_its_definition_says():
    prompt, output = [4, 1], [3, 3, 0]
    seqs = [_seq(0, prompt, output, presence_penalty=0.5), _seq(1, prompt, output, frequency_penalty=0.25),
            _seq(2, prompt, output, repetition_penalty=2.0), _seq(3, prompt, output)]
    got = penalize(torch.tensor([LOGITS] * 4), seqs)
    # presence: once for each generated token (0 and 3), whatever its count; the prompt's 1 and 4 are untouched
    assert got[0].tolist() == [1.5, -1.0, 0.5, 2.5, -2.0, 1.0]
    # frequency: once per time generated (3 twice, 0 once)
    assert got[1].tolist() == [1.75, -1.0, 0.5, 2.5, -2.0, 1.0]
    # repetition: seen in the prompt (1, 4) or the output (0, 3): positive / 2, negative * 2; 2 and 5 unseen
    assert got[2].tolist() == [1.0, -2.0, 0.5, 1.5, -4.0, 1.0]
    assert got[3].tolist() == LOGITS  # a row without penalties is left exactly as it was


def test_the_penalties_combine_in_vllms_order():
    seq = _seq(0, [2], [2, 2], presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0)
    got = penalize(torch.tensor([LOGITS]), [seq])[0]
    assert got[2].item() == 0.5 / 2 - 2 * 0.25 - 0.5  # repetition first, then frequency, then presence


def test_a_greedy_row_takes_the_argmax_of_its_penalized_logits():
    logits = torch.tensor([LOGITS])
    plain = Sampler().sample(logits, [_seq(0, [1], [3])])
    penalized = Sampler().sample(logits, [_seq(0, [1], [3], frequency_penalty=2.0)])
    assert plain == [3] and penalized == [0]  # 3 - 2 = 1 < 2: the next best, 0, wins


def test_penalties_apply_row_by_row_in_one_batch():
    logits = torch.tensor([LOGITS, LOGITS])
    seqs = [_seq(0, [1], [3], frequency_penalty=2.0), _seq(1, [1], [3])]
    assert Sampler().sample(logits, seqs) == [0, 3]


def test_logprobs_are_the_log_softmax_of_the_penalized_greedy_row():
    seq = _seq(0, [1], [3], frequency_penalty=1.5, logprobs=2)
    token = Sampler().sample(torch.tensor([LOGITS]), [seq])[0]
    expected = torch.log_softmax(torch.tensor([2.0, -1.0, 0.5, 1.5, -2.0, 1.0]), dim=-1)  # token 3: 3 - 1.5
    (entry,) = seq.logprobs
    assert entry.token_id == token == 0
    assert entry.logprob == pytest.approx(expected[0].item())
    assert [t for t, _ in entry.top] == [0, 3]
    assert [lp for _, lp in entry.top] == pytest.approx([expected[0].item(), expected[3].item()])


def test_sampled_logprobs_follow_temperature_and_the_top_k_cut():
    seq = _seq(0, [1], [], temperature=0.5, top_k=2, seed=3, logprobs=3)
    token = Sampler().sample(torch.tensor([LOGITS]), [seq])[0]
    kept = torch.tensor([LOGITS[0], LOGITS[3]]) / 0.5  # top-2: tokens 3 and 0
    expected = dict(zip([0, 3], torch.log_softmax(kept, dim=-1).tolist(), strict=True))
    (entry,) = seq.logprobs
    assert token in expected and entry.logprob == pytest.approx(expected[token])
    assert [t for t, _ in entry.top[:2]] == [3, 0] and entry.top[2][1] == -math.inf  # the cut's tokens: -inf
    assert sum(math.exp(lp) for _, lp in entry.top) == pytest.approx(1.0)


def test_logprobs_leave_the_draw_unchanged():
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    with_logprobs = [_seq(i, [1], [], temperature=1.0, seed=7, logprobs=5) for i in range(3)]
    without = [_seq(i, [1], [], temperature=1.0, seed=7) for i in range(3)]
    assert Sampler().sample(logits, with_logprobs) == Sampler().sample(logits, without)
    assert all(len(seq.logprobs) == 1 and len(seq.logprobs[0].top) == 5 for seq in with_logprobs)


def test_a_penalized_greedy_row_gets_its_whole_logits_from_the_step():
    """The step hands the sampler whole rows only where `needs_row` says; a greedy row without penalties or logprobs
    is its argmax alone."""
    assert not SamplingParams().needs_row
    assert all(SamplingParams(**fields).needs_row for fields in (
        {"presence_penalty": 0.1}, {"frequency_penalty": -0.1}, {"repetition_penalty": 1.1}, {"logprobs": 0},
        {"temperature": 1.0}))
    step = StepLogits.take(torch.tensor([LOGITS, LOGITS]), [False, True])
    assert list(step.rows) == [1]


@pytest.mark.parametrize("fields, message", [
    ({"presence_penalty": 2.5}, "presence_penalty must be a number from -2 to 2"),
    ({"frequency_penalty": -2.1}, "frequency_penalty"), ({"frequency_penalty": float("nan")}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a number above 0"),
    ({"repetition_penalty": 2.5}, "repetition_penalty"), ({"presence_penalty": True}, "presence_penalty"),
    ({"logprobs": 21}, "logprobs must be None or an integer from 0 to 20"), ({"logprobs": -1}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
])
def test_out_of_range_penalties_and_logprobs_are_refused(fields, message):
    with pytest.raises(EngineRequestError, match=message):
        SamplingParams(**fields)
