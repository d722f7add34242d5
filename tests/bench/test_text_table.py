"""The benchmarks' plain-text tables: each column padded to its widest cell."""

from structspec.bench.text_table import aligned


def test_columns_are_padded_to_their_widest_cell_on_either_side():
    rows = [["arm", "n"], ["server/plain", "29"], ["x", "3"]]
    assert aligned(rows).splitlines() == ["arm           n ", "server/plain  29", "x             3 "]
    assert aligned(rows, sep=" | ", right=True).splitlines() == ["         arm |  n", "server/plain | 29",
                                                                 "           x |  3"]
