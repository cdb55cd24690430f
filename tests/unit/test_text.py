"""Streaming text helpers: stop strings and incremental UTF-8."""

from __future__ import annotations

from hearth.shared.requests import StopMatcher, Utf8Decoder


def test_stop_string_split_across_tokens_is_held_then_cut():
    m = StopMatcher(["</end>"])
    out, stopped = m.feed("hello </e")
    assert (out, stopped) == ("hello ", False)
    out, stopped = m.feed("nd> tail")
    assert (out, stopped) == ("", True)


def test_held_text_is_released_when_it_stops_matching():
    m = StopMatcher(["STOP"])
    assert m.feed("ST") == ("", False)
    assert m.feed("ay") == ("STay", False)
    assert m.feed("S") == ("", False)
    assert m.flush() == "S"


def test_no_stops_passes_everything():
    assert StopMatcher([]).feed("abc") == ("abc", False)


def test_utf8_decoder_holds_partial_characters():
    text = "Grüße 🔥 ok"
    data = text.encode()
    d = Utf8Decoder()
    out = "".join(d.feed(data[i:i + 1]) for i in range(len(data)))
    assert out + d.flush() == text
    d = Utf8Decoder()
    assert d.feed("🔥".encode()[:3]) == ""
    assert d.feed("🔥".encode()[3:]) == "🔥"
