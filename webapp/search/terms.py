"""The words a search looks for: what both databases' full-text indexes agree to search by."""

import re
from enum import Enum

TERM = re.compile(r"[^\W_]+")
MAX_TERMS = 16
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
