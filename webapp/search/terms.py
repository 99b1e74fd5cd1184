"""The words a search looks for: what both databases' full-text indexes agree to search by."""

import re
from enum import Enum

TERM = re.compile(r"[^\W_]+")
MAX_TERMS = 16
# A word held by more than this share of a table's rows, and by more than COMMON_ROWS of them, is left out of a
# search by any of the words (informative).
COMMON_SHARE = 0.05
COMMON_ROWS = 1_000
# Words nearly every text has: they would match most rows and rank nothing. Exactly PostgreSQL's 'english'
# stop words (FTS5 has no such list): a query of them only would find nothing there (an empty tsquery) and
# everything here, so both databases leave them out before searching.
STOP_WORDS = frozenset(
    "a about above after again against all am an and any are as at be because been before being below between "
    "both but by can did do does doing don down during each few for from further had has have having he her "
    "here hers herself him himself his how i if in into is it its itself just me more most my myself no nor "
    "not now of off on once only or other our ours ourselves out over own s same she should so some such t "
    "than that the their theirs them themselves then there these they this those through to too under until "
    "up very was we were what when where which while who whom why will with you your yours yourself "
    "yourselves".split()
)


class Match(Enum):
    ANY_WORD = "any"  # recall: any of the words, the best matches first
    ALL_PREFIXES = "all"  # the ledger's search box: every word, as a word or the start of one


def terms(text: str) -> list[str]:
    """The searchable words of text (letters and digits, no stop words), lowercased, at most MAX_TERMS."""
    return [w for w in TERM.findall(text.casefold()) if w not in STOP_WORDS][:MAX_TERMS]


def informative(words: list[str], rows: int, documents: dict[str, int]) -> list[str]:
    """The words worth searching by, of a search by any of them over a table of `rows` rows, `documents` of which
    hold each word: all but those held by more than COMMON_SHARE of the rows and more than COMMON_ROWS; the
    rarest word when every one is that common. Such a word weighs little in a row's rank (BM25 weighs a word by
    how rare it is) and costs the most, as the search reads every row that holds it: one word of ten, held by a
    third of 100,000 memories, took 20 of the 22 ms of a search (bench.prompt_memory)."""
    common = {w for w in words if documents.get(w, 0) > max(COMMON_SHARE * rows, COMMON_ROWS)}
    kept = [w for w in words if w not in common]
    return kept or [min(words, key=lambda w: documents.get(w, 0))]
