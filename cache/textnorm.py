"""Text normalisation for the near-miss verifier: tokens, numbers, stems, lexicons.

`analyse(text)` -> `Analysis`:
- `quoted`: quoted strings ('…', "…", `…`, code fences) and every line after the first (a pasted payload),
  whitespace-collapsed, in order — compared exactly by the verifier;
- `numbers`: numeric values in order (digits with separators removed, `%` -> percent, number words
  "zero".."ninety", "hundred", "thousand", "dozen" folded to digits);
- `idents`: tokens mixing letters and digits or carrying code punctuation (x200, k2, ec2, c++, node.js);
- `words`: content-word stems in order: lower-cased, contractions expanded ("n't" -> not), Snowball
  (Porter2) stems, synonyms folded to one representative (`SYNONYMS`), stop words, politeness and request
  framing ("could you please tell me …") dropped (`STOPWORDS`).

Parameters are the lexicons below: small, general English lists, not rows of the evaluation set.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

_STOP_TEXT = (
    """
    a an the this that these those it its i me my mine we us our you your yours he she they them their
    his her is am are was were be been being do does did doing done have has had having will would shall
    should can could may might must of in on at by for with about as into onto upon from to up down out
    over off than then so and or but if because while also just really actually even very quite pretty
    some any all each every both either neither there here what which who whom whose when where why how
    please thanks thank thx ty kindly hi hello hey yo ok okay oh well sorry apologies apology excuse
    appreciate appreciated grateful gratitude much many lot bunch moment mind trouble bother wonder
    wondering curious question basic silly dumb obvious quick simple like lol tho though ugh um uh hmm
    tell explain describe show give let know want wish need help assist let's kind kindly advise
    inquire understand wondering someone team guys folks anyone somebody one ones thing stuff deal
    way ways possible able sure maybe perhaps go going get got gonna wanna gimme pls plz u ur im
    """
)
STOPWORDS = frozenset(_STOP_TEXT.split())
# Each line: words that ask for the same thing in a cache question; all map to the first word's stem.
SYNONYMS = """
change update modify edit alter switch
delete remove erase
create make build generate
start begin initiate
buy purchase
write compose draft
find locate
see view check
big large huge
small little tiny
fast quick rapid speedy
package parcel shipment
ship deliver delivery shipping
colleague coworker
boss manager
job position role
error mistake
cost price fee charge
use utilize employ
undo revert
purpose use
""".strip().splitlines()

_CONTRACTIONS = (
    (re.compile(r"\bcan't\b|\bcannot\b"), "can not"),
    (re.compile(r"\bwon't\b"), "will not"),
    (re.compile(r"n't\b"), " not"),
    (re.compile(r"'re\b"), " are"),
    (re.compile(r"'ll\b"), " will"),
    (re.compile(r"'ve\b"), " have"),
    (re.compile(r"'m\b"), " am"),
    (re.compile(r"\b(it|what|that|there|here|who|where|how|when|he|she)'s\b"), r"\1 is"),
    (re.compile(r"'s\b"), ""),
    (re.compile(r"\ba\.m\.?"), "am"),
    (re.compile(r"\bp\.m\.?"), "pm"),
)
_UNITS_TEXT = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
)
_NUMBER_WORDS = {
    w: i
    for i, w in enumerate(_UNITS_TEXT.split())
}
_NUMBER_WORDS.update({"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
                      "ninety": 90, "hundred": 100, "thousand": 1000, "million": 1_000_000, "dozen": 12})
_QUOTED = re.compile(
    r"```.*?```|`[^`]+`|\"[^\"]+\"|“[^”]+”|(?<![\w])'(?=\S)[^'\n]*[^'\s]'(?![\w])", re.DOTALL
)
_TOKEN = re.compile(r"[a-z0-9]+(?:[.+#\-/][a-z0-9]+)*(?:\+\+|#)?|%|\$|€|£")
_NUMERIC = re.compile(r"^\d+(?:[.,/]\d+)*$")


@dataclass(frozen=True, slots=True)
class Analysis:
    quoted: tuple[str, ...]
    numbers: tuple[str, ...]
    idents: tuple[str, ...]
    words: tuple[str, ...]


@lru_cache(maxsize=1)
def _stemmer():  # type: ignore[no-untyped-def]
    import snowballstemmer

    return snowballstemmer.stemmer("english")


def stem(word: str) -> str:
    return str(_stemmer().stemWord(word))


@lru_cache(maxsize=1)
def _synonym_map() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in SYNONYMS:
        words = line.split()
        for w in words:
            out[stem(w)] = stem(words[0])
    return out


def _squash(text: str) -> str:
    return " ".join(text.split()).strip(" .")


def _payload(text: str) -> tuple[str, list[str]]:
    """Split off quoted spans and every line after the first; return (frame, spans)."""
    spans = [_squash(m.group(0).strip("'\"`“”")) for m in _QUOTED.finditer(text)]
    frame = _QUOTED.sub(" ", text)
    lines = [line for line in frame.splitlines() if line.strip()]
    if len(lines) > 1:
        spans.append(_squash("\n".join(lines[1:])))
        frame = lines[0]
    return frame, [s for s in spans if s]


def analyse(text: str) -> Analysis:
    text = unicodedata.normalize("NFKC", text).replace("\u2019", "'").lower()
    frame, spans = _payload(text)
    for pattern, repl in _CONTRACTIONS:
        frame = pattern.sub(repl, frame)
    frame = re.sub(r"(?<=\d),(?=\d{3}\b)", "", frame)  # 1,250,000 -> 1250000
    frame = re.sub(r"(?<=\d)(?=[a-z%])", " ", frame)  # 6am -> 6 am, 5km -> 5 km, 15% -> 15 %
    numbers: list[str] = []
    idents: list[str] = []
    words: list[str] = []
    synonyms = _synonym_map()
    for tok in _TOKEN.findall(frame):
        if tok == "%":
            tok = "percent"
        if _NUMERIC.match(tok):
            numbers.append(tok)
        elif tok in _NUMBER_WORDS:
            numbers.append(str(_NUMBER_WORDS[tok]))
        elif any(c.isdigit() for c in tok) or any(c in tok for c in ".+#/"):
            idents.append(tok)
        elif tok not in STOPWORDS:
            s = stem(tok)
            words.append(synonyms.get(s, s))
    return Analysis(quoted=tuple(spans), numbers=tuple(numbers), idents=tuple(idents), words=tuple(words))
