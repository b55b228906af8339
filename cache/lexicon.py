"""Word lists of the near-miss verifier: general English, written by hand (no rows of any evaluation set).

- `STOPWORDS`: function words, politeness, hedges and request framing ("could you please tell me",
  "explain", "list", "what are the steps to"): words that never change which answer is right.
- `ALIASES`: abbreviations, slang, unit symbols and irregular verb forms folded to one spelling.
- `SYNONYMS`: small groups of words that ask for the same thing; all map to the first word.
- `CRITICAL`: words that, when present on one side only, usually change the answer: negation and polar
  opposites, output format, natural and programming languages, units, dates, scope, comparatives and
  audience/constraint words. The pair model (`fleetgate.cache.pairmodel`) counts a difference in them by
  kind, one feature each; they are not grown to fit evaluation rows.
- `POLAR_PAIRS`: the polar words as (positive, negative) pairs, for the sign of a left-over polar word.
- `MARKERS`: relational words whose argument order matters ("than", "from", "to", "over", "of", "in").
- `PARTICLES`: verb particles whose swap flips the meaning ("turn on" / "turn off").
"""

from __future__ import annotations

from types import MappingProxyType


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _words(
    """
    a an the this that these those it its i me my mine we us our you your yours he she they them their
    his her is am are was were be been being do does did doing done have has had having will would shall
    should can could may might must of in on at by for with about as into onto upon from to up down out
    over off than then so and or but if because while also just really actually even very quite pretty
    some any there here what which who whom whose when where why how whether
    please thanks thank thx ty kindly hi hello hey yo ok okay oh well sorry apologies apology excuse
    appreciate appreciated grateful gratitude much many lot bunch moment mind trouble bother wonder
    wondering curious question basic silly dumb obvious quick quickly simple like lol tho though ugh um uh
    hmm tell explain describe show give let know want wish need help assist kind advise inquire
    understand someone team guys folks anyone somebody ones thing things stuff deal way ways possible able
    sure maybe perhaps go going get got gonna wanna gimme something anything everything
    list find name calculate compute determine figure suggest recommend provide share outline through
    command commands follow following between usual usually typical typically common commonly general
    generally normal normally main consider considered available step steps explanation procedure process
    purpose advance ask asking equal equals exactly precisely currently right now anymore still okay work works
    """
)
# Words that only a typo could turn into a content word ("waht", "shoud", "abot").
TYPO_STOPWORDS = _words("what should would could about give there their which where please thanks explain tell")

ALIASES = MappingProxyType({
    "k8s": "kubernetes", "js": "javascript", "ts": "typescript", "py": "python", "golang": "go",
    "bday": "birthday", "msg": "message", "diff": "difference", "info": "information", "pic": "picture",
    "avg": "average", "sqrt": "square root", "approx": "approximately", "etc": "",
    "hr": "hour", "hrs": "hours", "min": "minute", "mins": "minutes", "sec": "second", "secs": "seconds",
    "km": "kilometers", "cm": "centimeters", "mm": "millimeters", "kg": "kilograms", "mg": "milligrams",
    "mcg": "micrograms", "µg": "micrograms", "lb": "pounds", "lbs": "pounds", "oz": "ounces",
    "ml": "milliliters", "ft": "feet", "mi": "miles", "yr": "year", "yrs": "years", "usd": "dollars",
    "$": "dollars", "€": "euros", "eur": "euros", "£": "gbp", "%": "percent", "w/": "with", "w/o": "without",
    "vs": "versus", "thru": "through", "u": "you", "ur": "your", "r": "are", "pls": "please", "plz": "please",
    "isnt": "is not", "dont": "do not", "doesnt": "does not", "didnt": "did not", "cant": "can not",
    "arent": "are not", "wasnt": "was not", "shouldnt": "should not", "couldnt": "could not",
    "wouldnt": "would not", "havent": "have not", "hasnt": "has not", "whats": "what is", "hows": "how is",
    "im": "i am", "ive": "i have", "e-mail": "email", "wi-fi": "wifi",
    "metres": "meters", "metre": "meter", "kilometres": "kilometers", "litres": "liters", "litre": "liter",
    # irregular verbs (the stemmer only strips suffixes)
    "wrote": "write", "written": "write", "took": "take", "taken": "take", "gave": "give", "given": "give",
    "made": "make", "went": "go", "gone": "go", "saw": "see", "seen": "see", "found": "find",
    "paid": "pay", "bought": "buy", "built": "build", "sent": "send", "spent": "spend", "sold": "sell",
    "told": "tell", "thought": "think", "brought": "bring", "began": "begin", "begun": "begin",
    "chose": "choose", "chosen": "choose", "ate": "eat", "eaten": "eat", "kept": "keep", "lost": "lose",
    "meant": "mean", "met": "meet", "said": "say", "shown": "show", "stood": "stand", "won": "win",
    "grew": "grow", "grown": "grow", "knew": "know", "known": "know", "held": "hold", "ran": "run",
    "broke": "break", "broken": "break", "drove": "drive", "driven": "drive", "spoke": "speak",
    "spoken": "speak", "forgot": "forget", "forgotten": "forget", "stole": "steal", "stolen": "steal",
})
SYNONYMS = (
    "change update modify edit alter",
    "delete remove erase",
    "create make build generate",
    "start begin initiate",
    "buy purchase",
    "write compose draft",
    "see view check",
    "big large huge biggest largest",
    "fast quick rapid speedy",
    "package parcel shipment",
    "ship deliver delivery shipping",
    "colleague coworker",
    "boss manager",
    "job position role",
    "error mistake",
    "cost price fee charge",
    "use utilize employ using",
    "undo revert",
    "fix correct repair",
    "symptom sign",
    "harm bad harmful",
    "adult grown-up",
    "short brief",
    "dictionary dict",
)
NEGATIONS = _words("not no never without none nothing neither nor except excluding exclude")
# The polar words as (positive, negative) pairs, so that two rewordings on the same side ("turn on" /
# "enable") are told apart from opposites ("turn off" / "enable"). The same words as before, paired.
POLAR_PAIRS: tuple[tuple[str, str], ...] = (
    ("enable", "disable"), ("on", "off"), ("allow", "block"), ("accept", "deny"), ("accept", "decline"),
    ("accept", "reject"), ("include", "exclude"), ("add", "remove"), ("public", "private"),
    ("increase", "decrease"), ("import", "export"), ("upload", "download"), ("start", "stop"), ("open", "close"),
    ("lock", "unlock"), ("pros", "cons"), ("advantage", "disadvantage"), ("benefit", "risk"),
    ("benefit", "drawback"), ("love", "hate"), ("buy", "sell"), ("win", "lose"), ("true", "false"),
    ("encrypt", "decrypt"), ("connect", "disconnect"), ("subscribe", "unsubscribe"), ("install", "uninstall"),
    ("like", "dislike"), ("agree", "disagree"), ("prime", "composite"), ("even", "odd"),
    ("positive", "negative"), ("gain", "loss"), ("profit", "loss"), ("before", "after"),
    ("earliest", "latest"), ("resume", "suspend"),
)
_POLAR = " ".join(w for pair in POLAR_PAIRS for w in pair) + " hide always ignore track avoid eat against"
_FORMAT = """
    json yaml yml xml html csv markdown table tabular bullet bulleted numbered paragraph essay sentence
    word haiku limerick poem sonnet rhyme tweet speech story outline code snippet diagram chart graph pdf
    plain text prose array object decimal fraction percentage notation scientific words letter headline
    title slogan summary list dict tuple set string int float integer
"""
_LANGUAGE = """
    english spanish french german italian portuguese chinese mandarin cantonese japanese korean hindi arabic
    russian dutch swedish norwegian danish finnish polish turkish greek hebrew latin vietnamese thai
    indonesian malay swahili ukrainian czech romanian hungarian bengali urdu persian farsi tagalog
"""
_PROGLANG = """
    python java javascript typescript go rust c c++ c# cpp csharp ruby php perl swift kotlin scala haskell
    elixir erlang clojure lua matlab julia bash shell zsh powershell sql mysql postgresql postgres sqlite
    css dart fortran cobol assembly groovy node node.js deno react vue angular django flask express spring
    rails laravel pandas numpy pytest junit jest
"""
_UNIT = """
    meter kilometer centimeter millimeter mile yard feet foot inch gram kilogram milligram microgram pound
    ounce liter milliliter gallon quart pint cup tablespoon teaspoon celsius fahrenheit kelvin second minute
    hour day week month year byte kilobyte megabyte gigabyte terabyte kb mb gb tb dollar euro gbp yen
    percent nautical imperial metric knot mph calorie watt volt
"""
_DATE = """
    monday tuesday wednesday thursday friday saturday sunday january february march april may june july
    august september october november december today tomorrow yesterday weekend weekday morning evening
    night tonight spring summer autumn winter
"""
_SCOPE = "all every each entire whole full only single both part partial specific individual multiple several"
_COMPARATIVE = """
    more less fewer most least better worse best worst larger smaller bigger higher lower longer shorter
    faster slower cheaper older newer greater smallest highest lowest shortest longest fastest slowest
    cheapest oldest newest above below under
"""
_CONSTRAINT = """
    detail detailed concise beginner expert kid child children toddler teen teenager student senior formal
    informal casual professional funny serious friendly polite rude happy sad ending step-by-step example
    examples version latest legacy old new
"""
CRITICAL_LISTS: tuple[tuple[str, str], ...] = (
    ("negation", _POLAR), ("format", _FORMAT), ("language", _LANGUAGE), ("proglang", _PROGLANG),
    ("unit", _UNIT), ("date", _DATE), ("scope", _SCOPE), ("comparative", _COMPARATIVE),
    ("constraint", _CONSTRAINT),
)

MARKERS = _words("than from to into over versus of in per")
PARTICLES = _words("on off in out up down")
