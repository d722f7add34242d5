"""Stop strings: the cut of a final text and what a stream may show of a growing one."""

from __future__ import annotations

import random

import pytest

from structspec.engine.stop import StopFilter, cut_at_stop


def test_cut_at_the_first_of_several_stop_strings():
    assert cut_at_stop("alpha END beta STOP", ["STOP", "END"]) == ("alpha ", True)
    assert cut_at_stop("nothing here", ["STOP"]) == ("nothing here", False)
    assert cut_at_stop("", ["x"]) == ("", False)


@pytest.mark.parametrize("seed", range(40))
def test_a_stream_never_shows_a_stop_string_and_adds_up_to_the_cut_text(seed):
    rng = random.Random(seed)
    stops = rng.sample(["\n###", "END", "ab", "aab", "xyz"], k=rng.randint(1, 3))
    text = "".join(rng.choice(["a", "b", "E", "N", "D", "\n", "#", "x", "y", "z", " ", "é"]) for _ in range(60))
    cut, _ = cut_at_stop(text, stops)
    shown_filter = StopFilter(stops)
    shown, i = "", 0
    while i < len(text):  # deltas of 1-5 characters, as tokens commit
        n = rng.randint(1, 5)
        piece = shown_filter.feed(text[i:i + n])
        shown += piece
        assert cut.startswith(shown)  # never past the cut, so never a stop string's part after it
        i += n
    shown += shown_filter.finish(cut)
    assert shown == cut


def test_held_back_text_is_shown_once_it_cannot_become_a_stop_string():
    f = StopFilter(["END"])
    assert f.feed("the E") == "the "  # "E" may start END
    assert f.feed("x") == "Ex"
    assert f.feed(" EN") == " "
    assert f.feed("D and more") == ""
    assert f.finish("the Ex ") == ""


def test_a_markdown_heading_is_shown_once_it_cannot_become_a_turn_heading():
    """The plain format's stops share their start (``\\n### ``) with a Markdown heading: that start is held back
    only until the text differs from every turn heading."""
    from structspec.chat_template import PlainPrompts

    f = StopFilter(PlainPrompts.text_stop)
    assert f.feed("Findings:\n###") == "Findings:"
    assert f.feed(" Res") == "\n### Res"
    assert f.feed("ults\n- dry\n### Us") == "ults\n- dry"
    assert f.feed("er:\nmore") == ""
    assert f.finish("Findings:\n### Results\n- dry") == ""
