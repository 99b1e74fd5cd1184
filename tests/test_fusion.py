"""Search fuses ranked lists it is given as signals (issue 34): each list's z-scores times its weight; a third kind
of evidence is one more Signal, with no change to fused."""

from webapp.search.fusion import DRAWN_FROM_WEIGHT, SOURCES_COUNTED, Signal, drawn_from, fused
from webapp.search.signals.meaning import DENSE_WEIGHT, MIN_SIMILARITY


def fuse(signals: list[Signal], k: int) -> list[int]:
    """The k best ids of the fused ranking."""
    return [i for i, _ in fused(signals)[:k]]


def test_words_and_meaning_fuse_as_two_weighted_signals():
    words = [(1, 9.0), (2, 5.0), (3, 1.0)]
    meaning = [(3, 0.9), (4, 0.8), (5, MIN_SIMILARITY / 2)]  # 5: found by meaning alone, and not close enough

    ranked = fuse([Signal(words), Signal(meaning, DENSE_WEIGHT, alone_at_least=MIN_SIMILARITY)], k=10)

    assert ranked[0] in (1, 3) and set(ranked) == {1, 2, 3, 4}


def test_a_third_signal_moves_what_it_vouches_for_up():
    words = [(1, 9.0), (2, 8.0), (3, 7.0)]
    without = fuse([Signal(words)], k=3)
    with_sources = fuse([Signal(words), Signal([(3, 5.0), (1, 0.0)], weight=3.0)], k=3)

    assert without == [1, 2, 3]
    assert with_sources[0] == 3


def test_a_row_below_its_floor_counts_when_another_signal_found_it():
    weak = [(7, 0.01), (8, 0.01)]

    assert fuse([Signal([(7, 1.0)]), Signal(weak, alone_at_least=0.5)], k=5) == [7]


def test_the_turns_a_memory_came_from_score_its_best_memorys_match():
    memories = [(10, 2.0), (11, 1.0), (12, 0.5)]
    sources = {
        10: [100],
        11: [100, 101],
        12: [200, 201, 202, 203, 204],
    }  # 12: a whole chunk, too many to count

    signal = drawn_from(memories, sources)

    assert signal.hits == [(100, 2.0), (101, 1.0)]
    assert signal.weight == DRAWN_FROM_WEIGHT
    assert SOURCES_COUNTED < len(sources[12])
