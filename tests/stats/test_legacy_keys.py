"""Which stored keys an engine claims (``stats.legacy_keys``), and where their rows go."""

from __future__ import annotations

from structspec.stats.legacy_keys import Claim, claims, is_tool_key


def test_a_bare_names_rows_were_the_plain_formats_v3_and_its_history_of_unknown_format():
    assert claims(["gemma", "gemma+draft:ab12", "other"], "gemma", "f00d", "plain-v4") == [
        Claim("gemma", "gemma@f00d+plain-v3", "gemma@f00d+plain-v4", "gemma@f00d+format-unknown"),
        Claim("gemma+draft:ab12", "gemma@f00d+plain-v3+draft:ab12", "gemma@f00d+plain-v4", "gemma@f00d+format-unknown"),
    ]


def test_a_chat_templates_rows_keep_their_format():
    assert claims(["smol+chat-v2:0123abcd+draft:9f"], "smol", "beef", "chat-v2:0123abcd") == [
        Claim("smol+chat-v2:0123abcd+draft:9f", "smol@beef+chat-v2:0123abcd+draft:9f", "smol@beef+chat-v2:0123abcd",
              "smol@beef+chat-v2:0123abcd")]
    # another template's: its statistics and tool history stay under that template's format
    (c,) = claims(["smol+chat-v2:99999999"], "smol", "beef", "chat-v2:0123abcd")
    assert (c.statistics, c.tool_history) == ("smol@beef+chat-v2:99999999", "smol@beef+chat-v2:99999999")


def test_keys_that_carry_an_identity_or_belong_to_another_name_are_not_claimed():
    stored = ["gemma@f00d+plain-v4", "gemma@aaaa+plain-v4", "gemma-it", "gemma+extra", "gemma+draft:xyz"]
    assert claims(stored, "gemma", "f00d", "plain-v4") == []
    assert claims(["gemma"], "gemma", "", "plain-v4") == []  # no identity: nothing claimed


def test_tool_history_keys_scoped_or_not():
    assert is_tool_key("tools:ab12") and is_tool_key("3f2a|tools:ab12")
    assert not is_tool_key("contact@1") and not is_tool_key("3f2a|contact@1")
