"""CPU-runnable parts of the full-size rig emulation: the random host image and the device-memory figures."""

import os

import pytest
import torch

from engine.config import ModelConfig
from engine.loader import build_model
from engine.memory.checksum import arrival_checksum
from engine.memory.device import ALLOCATOR_CONF, MemoryReader, prefer_expandable_segments
from engine.memory.host_image import HostImage
from solvers.census import CONFIG_DIR


def test_a_random_image_holds_every_parameter_of_the_model_verified():
    config = ModelConfig.from_pretrained(CONFIG_DIR / "demo-hybrid-16.json")
    image = HostImage.random(config, seed=3, rungs=[(7, 5, 4)])
    model = build_model(config, device="meta")
    params = dict(model.named_parameters(remove_duplicate=False))
    assert set(image.entries) == set(params)
    assert image.bytes == sum(p.numel() * p.element_size() for p in params.values())
    assert image.buffer.is_shared()
    for name, param in params.items():
        tensor = image.tensor(name)
        assert tensor.shape == param.shape and tensor.dtype == param.dtype
        image.verify(name, tensor.clone())  # the checksum of every tensor is its own
    weights = image.tensor("layers.0.mlp.experts.gate_up_proj").float()
    assert torch.isfinite(weights).all() and 0.015 < weights.std() < 0.025  # transformers' initialisation scale
    assert {key[1] for key in image.rungs} == {0, 1, 2}
    again = HostImage.random(config, seed=3)
    assert all(again.entries[n].crc32 == e.crc32 for n, e in image.entries.items())  # seeded: the same image


def test_device_memory_is_read_on_cuda_only():
    assert MemoryReader(torch.device("cpu")).read() is None


def test_ranks_ask_for_expandable_segments_unless_the_operator_chose(monkeypatch):
    monkeypatch.delenv(ALLOCATOR_CONF, raising=False)
    assert prefer_expandable_segments() == "expandable_segments:True" == os.environ[ALLOCATOR_CONF]
    monkeypatch.setenv(ALLOCATOR_CONF, "max_split_size_mb:128")
    assert prefer_expandable_segments() == "max_split_size_mb:128" == os.environ[ALLOCATOR_CONF]


def test_the_arrival_checksum_sees_a_flipped_bit_a_swap_and_the_tail():
    buffer = torch.randint(0, 256, ((3 << 22) * 4 + 3,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    reference = arrival_checksum(buffer)
    assert arrival_checksum(buffer.clone()) == reference
    for position, bit in ((0, 1), (5 << 22, 128), (buffer.numel() - 1, 4)):  # first word, a later chunk, the tail
        flipped = buffer.clone()
        flipped[position] ^= bit
        assert arrival_checksum(flipped) != reference
    words = buffer.clone()[:(3 << 22) * 4].view(torch.int32)
    words[[7, 9]] = words[[9, 7]]  # two words of one chunk swapped
    assert arrival_checksum(torch.cat((words.view(torch.uint8), buffer[-3:]))) != reference
    chunks = buffer.clone()
    chunks[:4 << 22], chunks[4 << 22:8 << 22] = buffer[4 << 22:8 << 22].clone(), buffer[:4 << 22].clone()
    assert arrival_checksum(chunks) != reference  # two whole chunks swapped
    with pytest.raises(ValueError, match="flat uint8"):
        arrival_checksum(buffer[:8].view(torch.int16))

