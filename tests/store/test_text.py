"""Any text round-trips through either store (``structspec.store.text``): NUL, lone surrogates and the marker
itself, in every column that holds callers' or the model's text; a flush carrying such text holds nothing back."""

from __future__ import annotations

from structspec.stats.counters import Series
from structspec.store.text import MARK, decode, encode
from tests.store.test_store import NOW, key

ODD = ["a\x00b", "\x00", "x\ud800y", MARK, MARK + "plain", "\\u0000 \"quoted\" é"]


def test_encode_is_reversible_and_leaves_storable_text_as_it_is() -> None:
    for text in ODD + ["", "plain", "é{}\n", "a" + MARK]:
        stored = encode(text)
        assert decode(stored) == text and "\x00" not in stored
        stored.encode("utf-8")  # no lone surrogate left
    assert encode("plain é") == "plain é" and encode("a" + MARK) == "a" + MARK
    assert encode("a\x00b") != "a\x00b"


async def test_odd_text_round_trips_and_the_counters_behind_it_land(backend) -> None:
    s = await backend.open()
    rec = s.stats.recorder("m")
    texts = iter(ODD * 2)
    assert rec.record_rejection("inv@1", "ngram", 1, [1, 2], [5, 6, 7], 1, 9, True, lambda ids: next(texts))
    s.append_history("m", "scope\x00|inv@1", "a\x00b", NOW)
    await s.put_schema("inv", '{"description":"a\\u0000b"}', "h", "a\x00b " + MARK, "api", NOW)
    await s.flush()  # the sample and the history, on PostgreSQL refused before: NUL is no valid text there
    rec.record_request("inv@1", 3, 3, 0, "stop", 5.0)
    await s.flush()
    assert (await s.read_counters(since=NOW - 60))[key("m", "inv@1", Series.REQUESTS)] == 1
    assert s.backlog().unwritten == {"counters": 0, "history": 0, "samples": 0, "traffic": 0, "policy_changes": 0}
    await s.close()

    s2 = await backend.open()  # read back from the store, not from memory
    (sample,) = await s2.read_rejected_drafts("m")
    assert (sample.context_text, sample.draft_text, sample.rejected_text, sample.target_text) == tuple(ODD[:4])
    assert await s2.load_history("m", 8, 8) == [("scope\x00|inv@1", "a\x00b")]
    rec2 = await s2.get_schema("inv")
    assert rec2 is not None and rec2.description == "a\x00b " + MARK
    await s2.close()
