"""engine/serve/openai_api.py's Choice: stop strings matched on the decoded text, one byte per token here, so every
stop string spans tokens; text that could begin a stop string is held back until the next tokens decide."""

from engine.control.protocol import RequestHandle
from engine.serve.openai_api import Choice


def _choice(*stops: str) -> Choice:
    return Choice(0, RequestHandle(1, [0]), lambda ids: bytes(ids).decode(errors="replace"), stops)


def _feed(choice: Choice, text: str) -> list[str]:
    """What the client is sent as each token (byte) arrives, then at the end."""
    return [choice.push([byte]) for byte in text.encode()] + [choice.flush()]


def test_the_text_ends_before_the_stop_string_and_the_tokens_at_its_end():
    choice = _choice("END")
    pieces = _feed(choice, "abENDcd")
    assert "".join(pieces) == "ab" and choice.stopped and choice.finish_reason == "stop"
    assert bytes(choice.token_ids) == b"abEND"  # the token that completed it counts; those after do not


def test_text_that_may_begin_a_stop_string_is_held_until_decided():
    choice = _choice("END")
    assert _feed(choice, "aENx") == ["a", "", "", "ENx", ""]  # "E", "EN" held; "ENx" is not "END": sent
    assert not choice.stopped and bytes(choice.token_ids) == b"aENx"


def test_held_text_is_sent_when_generation_ends():
    choice = _choice("END")
    assert _feed(choice, "aEN") == ["a", "", "", "EN"]


def test_the_earliest_of_several_stop_strings_wins():
    choice = _choice("zz", "b")
    assert "".join(_feed(choice, "azzb")) == "a"
    choice = _choice("zz", "b")
    assert "".join(_feed(choice, "abzz")) == "a"


def test_a_stop_string_inside_one_multibyte_character_waits_for_it_whole():
    choice = _choice("é!")
    assert "".join(_feed(choice, "xé!y")) == "x" and choice.stopped


def test_text_offsets_count_the_characters_sent_before_each_token():
    choice = _choice()
    _feed(choice, "aéb")
    assert choice.offsets == [0, 1, 1, 2]  # é's two bytes both start where é does


def test_text_offsets_count_the_text_held_back_before_a_token():
    choice = _choice("END")
    _feed(choice, "aEb")
    assert choice.offsets == [0, 1, 2]  # "b" starts after the held "E", sent with it
