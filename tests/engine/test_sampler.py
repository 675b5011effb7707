import pytest
import torch

from engine.errors import EngineRequestError
from engine.runtime.sampler import SEED_MAX, Sampler, SamplingParams
from engine.runtime.sequence import Sequence


def _seqs(params: list[SamplingParams], seq_ids: list[int]) -> list[Sequence]:
    return [Sequence(seq_id, [0], param) for param, seq_id in zip(params, seq_ids, strict=True)]


def test_greedy_takes_the_argmax():
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 0.0, 1.0]])
    assert Sampler().sample(logits, _seqs([SamplingParams()] * 2, [0, 1])) == [1, 0]


def test_top_k_one_is_greedy_at_any_temperature():
    logits = torch.randn(4, 50)
    params = [SamplingParams(temperature=2.0, top_k=1)] * 4
    assert Sampler().sample(logits, _seqs(params, [0, 1, 2, 3])) == logits.argmax(dim=-1).tolist()


def test_top_p_keeps_only_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.05, 0.05]]))
    sampler = Sampler()
    draws = {sampler.sample(logits, _seqs([SamplingParams(temperature=1.0, top_p=0.8, seed=None)], [i]))[0]
             for i in range(200)}
    assert draws == {0, 1}


def test_a_seeded_request_samples_the_same_whatever_its_neighbours():
    torch.manual_seed(0)
    row = torch.randn(1, 64)
    params = SamplingParams(temperature=1.0, seed=1234)
    alone = [Sampler().sample(row, _seqs([params], [7]))[0] for _ in range(3)]
    noisy = []
    for _ in range(3):
        batch = torch.cat([torch.randn(1, 64), row, torch.randn(1, 64)])
        noisy.append(Sampler().sample(batch, _seqs([SamplingParams(temperature=1.0)] + [params] * 2, [1, 7, 9]))[1])
    assert alone == noisy and len(set(alone)) == 1


def test_a_seed_gives_a_sequence_of_draws_not_one_draw_repeated():
    sampler = Sampler()
    row = torch.zeros(1, 1000)
    draws = [sampler.sample(row, _seqs([SamplingParams(temperature=1.0, seed=5)], [3]))[0] for _ in range(5)]
    assert len(set(draws)) > 1


@pytest.mark.parametrize("fields, message", [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"top_k": -2}, "top_k"), ({"seed": "x"}, "seed"), ({"max_tokens": True}, "max_tokens"),
    ({"seed": SEED_MAX + 1}, "seed must be an integer from 0 to 18446744073709551615"), ({"seed": -1}, "seed"),
    ({"temperature": 1e-45}, "temperature must be 0 .greedy. or between 1e-05 and 2"),
    ({"temperature": 2.5}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": True}, "temperature"),
])
def test_bad_sampling_parameters_are_refused(fields, message):
    with pytest.raises(EngineRequestError, match=message):
        SamplingParams(**fields)


@pytest.mark.parametrize("seed", [0, 2**63, SEED_MAX])
def test_every_accepted_seed_seeds_a_generator(seed):
    drawn = Sampler().sample(torch.zeros(1, 8), _seqs([SamplingParams(temperature=1.0, seed=seed)], [0]))
    assert 0 <= drawn[0] < 8


@pytest.mark.parametrize("temperature", [1e-5, 2.0])
def test_the_temperature_bounds_sample(temperature):
    logits = torch.randn(1, 50) * 30
    assert Sampler().sample(logits, _seqs([SamplingParams(temperature=temperature, seed=1)], [0]))[0] in range(50)


def _unchecked(**fields) -> SamplingParams:
    """SamplingParams past their validation: what a request could hold before seed and temperature were bounded."""
    params = SamplingParams()
    for name, value in fields.items():
        object.__setattr__(params, name, value)
    return params


@pytest.mark.parametrize("hostile", [{"temperature": 1.0, "seed": 2**64}, {"temperature": 1e-45}])
def test_a_row_whose_sampling_raises_fails_alone(hostile):
    torch.manual_seed(0)
    logits = torch.randn(3, 64)
    good = SamplingParams(temperature=1.0, seed=11)
    alone = Sampler().sample(logits[2:], _seqs([good], [2]))
    drawn = Sampler().sample_rows(logits, _seqs([SamplingParams(), _unchecked(**hostile), good], [0, 1, 2]))
    assert drawn[0] == int(logits[0].argmax()) and drawn[2] == alone[0]  # the neighbours drew as without it
    assert isinstance(drawn[1], Exception)
    with pytest.raises(type(drawn[1])):
        Sampler().sample(logits, _seqs([SamplingParams(), _unchecked(**hostile), good], [0, 1, 2]))
