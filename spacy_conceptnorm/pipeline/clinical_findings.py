"""Clinical findings: the signs and symptoms that notes name with words no KB name is, and the condition words
that notes use in another sense.

A clinical note's review of systems and examination name findings in the clinician's words: "no murmurs, rubs
or gallops", "wheezes", "JVD", "tenderness", "pain", "difficulty swallowing", "blood in her stool", and in
shorthand, "no m/r/g", "denies n/v/d". The recognizer, trained on abstracts, misses most of them, and the KB names
them otherwise ("Heart Murmurs", "Paresthesia") or not at all. The `clinical_findings` component, after
`link_filter`, knows a short list of such findings (`CLINICAL_FINDINGS`, the phrases of `FINDING_PATTERNS` and
the items of `SHORTHAND` lists) and makes an entity of each occurrence that no entity overlaps, linked to the
concept of the KB name listed beside it (looked up in the concept_normalizer's KB by `initialize`), or NIL where
the KB has none; an entity that is an item of a shorthand list is linked so too ("cp" of "cp/sob": chest pain).

It also removes the entities that are a condition word in a note's other sense: a title ("Mrs", which names a
condition in MEDIC), the "Allergies" heading, a word that names a place, test, treatment, procedure or product with
the noun after it ("emergency room", "pulmonary function test", "shingles vaccine", "scar gel", "tumor resection"),
and a procedure's name ("carpal tunnel release", "stent placement"). The status of each
entity (negated, ...) is `clinical_context`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import srsly
from spacy.language import Language
from spacy.matcher import PhraseMatcher
from spacy.pipeline import Pipe
from spacy.tokens import Doc, Span, Token
from spacy.util import ensure_path, filter_spans

from ..errors import ConceptNormError, Errors
from . import concept_normalizer  # noqa: F401  (registers the span extensions it sets: kb_ents, kb_name, ...)
from .clinical_abbreviations import text_mapping
from .clinical_context import PatternMatcher, is_heading

NIL = "NIL"
STAGE = "clinical_findings"  # `ent._.kb_stage` of the entities it adds
# Findings of the review of systems and the examination, written for this package from common clinical usage, and
# the KB name (MEDIC) of each one's concept, or None where MEDIC has none. Matched case-blind on whole tokens. A
# word with a frequent other sense in notes is left out: "mass" (body mass), "discharge", "frequency", "urgency",
# "tired", "flare", "abnormalities".
CLINICAL_FINDINGS: dict[str, str | None] = {
    "murmur": "heart murmur",
    "murmurs": "heart murmur",
    "gallop": None,
    "gallops": None,
    "rubs": None,
    "friction rub": None,
    "wheeze": "wheezing",
    "wheezes": "wheezing",
    "wheezy": "wheezing",
    "JVD": None,
    "jugular venous distension": None,
    "jugular venous distention": None,
    "clubbing": None,
    "palpitations": None,
    "chest tightness": None,
    "distress": None,
    "respiratory distress": None,
    "congestion": None,
    "nasal congestion": None,
    "rhinorrhea": None,
    "night sweats": None,
    "diaphoresis": None,
    "malaise": None,
    "tingling": "paresthesia",
    "swelling": None,
    "tenderness": None,
    "tender": None,
    "guarding": None,
    "rebound": None,
    "bloating": None,
    "abdominal distension": None,
    "abdominal distention": None,
    "reflux": "gastroesophageal reflux",
    "thyromegaly": "goiter",
    "hepatosplenomegaly": None,
    "body aches": "myalgia",
    "dizzy": "dizziness",
    "lightheaded": "lightheadedness",
    "fatigued": "fatigue",
    "low energy": "fatigue",
    "sweaty": None,
    "secretions": None,
    "lethargic": "lethargy",
    "confused": "confusion",
    "splinting": None,
    "shivery": None,
    "fevers": "fever",
    "rashes": "rash",
    "effusion": None,
    "effusions": None,
    "bruising": None,
    "bruit": None,
    "bruits": None,
    "stiffness": None,
    "discomfort": None,
    "blurred vision": None,
    "blurry vision": None,
    "decreased appetite": None,
    "poor appetite": None,
    "weakness": None,
    "fracture": "fractures, bone",
    "fractures": "fractures, bone",
    "nodule": None,
    "nodules": None,
    "depression": "depressive disorder",
    "diabetes": "diabetes mellitus",
    "pain": "pain",
    "pains": "pain",
    "painful": "pain",
    "aches": None,
    "soreness": None,
    "itching": "pruritus",
    "itch": "pruritus",
    "redness": "erythema",
    "warmth": None,
    "numbness": "hypesthesia",
    "infection": "infection",
    "infections": "infection",
    "seizure": "seizures",
    "seizures": "seizures",
    "bleeding": "hemorrhage",
    "nausea": "nausea",
    "nauseated": "nausea",
    "feeling sick": "nausea",
    "n&v": None,
    "vomiting": "vomiting",
    "vomited": "vomiting",
    "constipated": "constipation",
    "bloated": None,
    "swollen": None,
    "distended": None,
    "distension": None,
    "distention": None,
    "enlarged": None,
    "masses": None,
    "lump": None,
    "lumps": None,
    "adenopathy": None,
    "lymphadenopathy": "lymphatic diseases",
    "exudate": None,
    "purulence": None,
    "fluctuance": None,
    "short of breath": "dyspnea",
    "flu-like symptoms": None,
    "flu like symptoms": None,
    "sob": "dyspnea",
    "heart attack": "myocardial infarction",
    "neuropathy": None,
    "lesion": None,
    "lesions": None,
    "flares": None,
    "flare-ups": None,
    "flare ups": None,
    "extra heart sounds": None,
    "odynophagia": None,
    "ptosis": None,
    "snoring": None,
    "snores": None,
    "burping": None,
    "belching": None,
    "spotting": None,
    "tinel sign": None,
    "tinel's sign": None,
    "peritoneal signs": None,
    "decels": None,
    "decelerations": None,
    "pinched nerve": None,
    "torn meniscus": None,
    "fluid in the lungs": None,
    "pursed lips": None,
    "pursed lip breathing": None,
    "tarry stools": None,
    "black stools": None,
    "lost weight": None,
    "large lymph nodes": None,
    "pvc": "ventricular premature complexes",
    "pvcs": "ventricular premature complexes",
    "hypothyroid": "hypothyroidism",
    "retinopathy": "retinal diseases",
    "whiplash": "whiplash injuries",
    "neck strain": "sprains and strains",
    "back strain": "sprains and strains",
    "lumbar strain": "sprains and strains",
    "muscle strain": "sprains and strains",
    "ligament strain": "sprains and strains",
    "acl tear": None,
    "meniscus tear": None,
    "meniscal tear": None,
    "rotator cuff tear": None,
    "instability": None,
    "impingement": None,
    "crepitus": None,
    "buckling": None,
    "dryness": None,
    "irritation": None,
    "sweating": None,
    "mucus": None,
    "phlegm": None,
    "sputum": None,
    "runny nose": None,
    "abrasion": None,
    "abrasions": None,
    "papules": None,
    "pustules": None,
    "comedones": None,
    "frailty": None,
    "fluid retention": None,
    "diastolic dysfunction": None,
    "flare-up": None,
    "flare up": None,
}

# Findings that notes write as a phrase with a few variants: token patterns (a PatternMatcher), none with a concept.
_DIFFICULTY = "difficulty difficulties trouble problems inability unable".split()
_ACTS = """swallowing swallow breathing breathe sleeping sleep speaking walking walk urinating feeding feed tolerate
concentrating waking ambulation ambulating chewing hearing seeing""".split()
_ABNORMAL = "pap labs lab ekg ecg mammogram findings finding bleeding menstrual uterine gait".split()
_RESULT = "smear finding findings bleeding results".split()
_HIGH_LOW = "elevated high low increased decreased reduced abnormal raised".split()
_LABS = [
    *"cholesterol glucose sugar sugars creatinine hemoglobin a1c tsh triglycerides testosterone potassium".split(),
    *"sodium calcium wbc platelets lfts labs lab psa bilirubin".split(),
    *("blood pressure", "blood sugar", "blood glucose", "hemoglobin a1c", "alkaline phosphatase", "alkaline phosphate"),
    *("white count", "liver enzymes", "total cholesterol"),
    "ejection fraction",
]
_LESS = "decreased diminished limited restricted reduced poor".split()
_CHANGE = "decrease increase loss".split()
_FUNCTIONS = [
    *"rom sensation flexion extension appetite feeding strength hearing vision".split(),
    *("range of motion", "range of movement", "grip strength", "wet diapers", "urine output", "breath sounds"),
]
# a body part or system, then a word that makes it a condition: "carotid disease", "abdominal issues", "bony
# abnormalities", "thyroid insufficiency", "sleep disturbance", "GI upset"
_SYSTEMS = """abdominal abdomen bony bone bones thyroid carotid heart cardiac bladder bowel sleep joint joints gi spinal
kidney renal liver hepatic lung lungs pulmonary breathing skin eye eyes vision visual hearing memory balance stomach
gastric urinary prostate vascular valve valvular muscle nerve neurologic neurological cognitive""".split()
_TROUBLE = """abnormality abnormalities issue issues insufficiency disease diseases problem problems dysfunction
disturbance disturbances damage upset""".split()
_ELEVATION = "elevation elevations".split()
_IS = "is was were are has have :".split()
_LEVEL = ["level", "levels"]
_ADVERBS = "been still slightly mildly markedly always also today".split()
_HIGH = "elevated high low raised abnormal up".split()
FINDING_PATTERNS: list[list[dict]] = [
    # "blood in her stool", "blood with stool"
    [{"LOWER": "blood"}, {"LOWER": {"IN": ["in", "with"]}}, {"LOWER": {"IN": ["her", "his", "the"]}, "OP": "?"},
     {"LOWER": {"IN": ["stool", "stools", "urine", "sputum", "vomit"]}}],
    # "difficulty swallowing", "trouble with sleeping", "unable to tolerate"
    [{"LOWER": {"IN": _DIFFICULTY}}, {"LOWER": {"IN": ["with", "to"]}, "OP": "?"}, {"LOWER": {"IN": _ACTS}}],
    # "an abnormal pap smear", "abnormal labs"
    [{"LOWER": "abnormal"}, {"LOWER": {"IN": _ABNORMAL}}, {"LOWER": {"IN": _RESULT}, "OP": "?"}],
    # "elevated blood pressure", "low TSH levels", "decreased ejection fraction"
    *([{"LOWER": {"IN": _HIGH_LOW}}, *({"LOWER": w} for w in lab.split()), {"LOWER": {"IN": _LEVEL}, "OP": "?"}]
      for lab in _LABS),
    # "her blood pressure was still elevated", "cholesterol levels were slightly elevated", "blood pressure: elevated"
    *([*({"LOWER": w} for w in lab.split()), {"LOWER": {"IN": _LEVEL}, "OP": "?"}, {"LOWER": {"IN": _IS}, "OP": "?"},
       {"LOWER": {"IN": _ADVERBS}, "OP": "*"}, {"LOWER": {"IN": _HIGH}}] for lab in _LABS),
    # "decreased range of motion", "diminished sensation"
    *([{"LOWER": {"IN": _LESS}}, *({"LOWER": w} for w in f.split())] for f in _FUNCTIONS),
    # "blood pressure elevation", "elevations in her blood pressure"
    *([*({"LOWER": w} for w in lab.split()), {"LOWER": {"IN": _ELEVATION}}] for lab in _LABS),
    *([{"LOWER": {"IN": _ELEVATION}}, {"LOWER": {"IN": ["in", "of"]}},
       {"LOWER": {"IN": ["her", "his", "the"]}, "OP": "?"}, *({"LOWER": w} for w in lab.split())] for lab in _LABS),
    # "suicidal or homicidal ideations"
    [{"LOWER": {"IN": ["suicidal", "homicidal"]}}, {"LOWER": {"IN": ["or", "and", "/"]}},
     {"LOWER": {"IN": ["suicidal", "homicidal"]}}, {"LOWER": {"IN": ["ideation", "ideations", "thoughts"]}}],
    # "carotid disease", "abdominal issues", "sleep disturbance"
    [{"LOWER": {"IN": _SYSTEMS}}, {"LOWER": {"IN": _TROUBLE}}],
    # "a decrease in appetite", "loss of appetite"
    *([{"LOWER": {"IN": _CHANGE}}, {"LOWER": {"IN": ["in", "of"]}}, *({"LOWER": w} for w in f.split())]
      for f in _FUNCTIONS),
]  # fmt: skip

# The items of the shorthand lists of the review of systems and the examination ("no m/r/g", "denies n/v/d",
# "no f/c/ns", "cp/sob"): each item of a slash list whose items are all here is a finding. A list of only "d", "c"
# and "w" is left out: "d/c" (discharge), "w/d" (warm and dry); so are the words of nursing notes written so
# (`SHORTHAND_WORDS`): "n/c" (nasal cannula), "f/c" (Foley catheter).
SHORTHAND: dict[str, str | None] = {
    "m": "heart murmur",
    "r": None,
    "g": None,
    "w": "wheezing",
    "n": "nausea",
    "v": "vomiting",
    "d": "diarrhea",
    "c": None,
    "f": "fever",
    "ns": None,
    "cp": "chest pain",
    "sob": "dyspnea",
}
SHORTHAND_AMBIGUOUS = frozenset({"d", "c", "w"})
SHORTHAND_WORDS = frozenset({("n", "c"), ("f", "c")})

# Words that are not a condition the patient has, whatever the KB says: titles, and the nouns after a condition
# word that make it the name of a place, a test, a treatment or a product.
TITLES = frozenset({"mr", "mrs", "ms", "miss", "dr"})
OTHER_SENSE_HEADS = frozenset({
    "room", "department", "dept", "vaccine", "vaccines", "vaccination", "shot", "test", "tests", "testing", "gel",
    "cream", "ointment", "massage", "treatment", "treatments", "clinic", "service", "unit", "biopsy", "biopsies",
    "specialist", "team", "medicine", "medicines", "medication", "medications",
})  # fmt: skip
# The nouns of a procedure: a condition word before one, or an entity that ends in one, names the procedure ("carpal
# tunnel release", "tumor resection", "cataract surgery"), which the annotation of notes does not count as a condition
PROCEDURES = frozenset({
    "repair", "repairs", "release", "placement", "graft", "grafting", "resection", "replacement", "surgery",
    "surgeries", "bypass", "reconstruction", "fusion", "ablation", "excision", "removal", "debridement", "transplant",
    "transplantation", "stent", "stents", "stenting",
})  # fmt: skip
HEADINGS = frozenset({"allergies", "allergy"})
# The shorthand of a note's parts, places, measures and (in nursing notes) routine care, some of them a KB's short
# name (FH, familial hypercholesterolemia; HPC, hereditary prostate cancer; LMP, NHS, BS, NTG in MEDIC): never a
# condition in a note. BM, BS, BP, LS, UO: bowel movement, bowel or breath sounds, blood pressure, lung sounds,
# urine output; NTG, NS, PRBC, TF, HEP, IVF, FS, HD: nitroglycerin, normal saline, red cells, tube feeds, heparin, IV
# fluids, fingerstick, hemodialysis; CDI, ND: clean, dry and intact, non-distended; NKDA, NSR, BL, PLS: no known
# drug allergies, normal sinus rhythm, blood, please.
NOTE_SHORTHAND = frozenset({
    "hpc", "pc", "hx", "fh", "fhx", "fmh", "pmh", "pmhx", "psh", "dh", "sh", "shx", "lmp", "nhs", "itu", "icu", "hrs",
    "ef", "hs", "bm", "bs", "bp", "ls", "uo", "ntg", "ns", "prbc", "tf", "hep", "peep", "cpt", "noc", "pts", "meds",
    "amts", "mgs", "bed", "sl", "ivf", "fs", "cdi", "hd", "bss", "pca", "fm", "nd", "db", "ob", "nkda", "nsr", "bl",
    "pls", "lung sounds",
})  # fmt: skip
# A KB's short name that in a note is a measure when a value follows it: PAD (peripheral arterial disease in MEDIC),
# the pulmonary artery diastolic pressure of "PAD 25-28", "PAD's in the 20s".
MEASURE_NAMES = frozenset({"pad"})
# What a nursing note charts that is no condition: a normal function ("passing flatus", "+flatus"; "no flatus" is a
# normal event that did not happen, which the annotation does not count either), and a specimen before the words of
# its culture or after an organism ("sputum cx", "sputum sent", "MRSA in sputum"); on the whole-note dev none of
# these is annotated (13 and 15), but "sputum" elsewhere is a finding (40).
NORMAL_FUNCTIONS = frozenset({"flatus"})
SPECIMENS = frozenset({"sputum"})
SPECIMEN_WORDS = frozenset({"cx", "culture", "cultures", "sample", "specimen", "sent", "c+s"})
# The labels of an examination's lines ("Ext: no edema", "Neuro: intact"), some of them a KB's short name (EXT,
# hereditary multiple exostoses, in MEDIC): before a colon, a label.
EXAM_LABELS = frozenset({"ext", "extr", "heent", "neuro", "psych", "gu", "msk", "abd", "resp", "cv", "pulm"})


class ClinicalFindings(Pipe):
    """Make entities of the clinical findings a doc names (see the module docstring).

    Each occurrence of a finding (the longest where two overlap) that no entity overlaps becomes an entity with
    `label`, `kb_id_` the concept of its listed KB name (NIL if none), `ent._.kb_ents` [(id, 1.0)], `kb_name` the
    listed name and `kb_stage` "clinical_findings". An entity that is an item of a shorthand list is linked so
    too: in "denies cp/sob" the "cp" is chest pain, not the cleft palate that MEDIC also names CP.
    """

    def __init__(
        self,
        nlp: Language,
        name: str = "clinical_findings",
        *,
        label: str = "Disease",
        findings: dict[str, str | None] | None = None,
    ) -> None:
        """Initialize the component.

        nlp (Language): The pipeline (its tokenizer makes the patterns).
        name (str): The component instance name.
        label (str): The label of the entities it adds.
        findings (Optional[Dict[str, Optional[str]]]): Your own findings and the KB name of each one's concept,
            added to `CLINICAL_FINDINGS` (None: no concept); "-" as the name leaves a listed finding out, e.g.
            {"crepitus": None, "depression": "-"}.
        """
        expected = 'a mapping of findings to KB names (text, null for none, or "-" to leave one out)'
        findings = text_mapping(name, "findings", findings, expected)
        self.vocab = nlp.vocab
        self.name = name
        self.label = label
        self.findings = findings
        # lower-cased finding -> KB name (matched case-blind)
        self.kb_names = {t.lower(): n for t, n in {**CLINICAL_FINDINGS, **findings}.items() if n != "-"}
        self.concepts: dict[str, str] = {}  # KB name -> concept id, found by `initialize`
        self.matcher = PhraseMatcher(nlp.vocab, attr="LOWER")
        self.matcher.add(name, list(nlp.tokenizer.pipe(self.kb_names)))
        # the patterns of words and optional words as phrases, the others (an adverb or more) as token patterns
        self.patterns = PatternMatcher(nlp.vocab)
        for index, pattern in enumerate(FINDING_PATTERNS):
            self.patterns.add(index, pattern)

    def initialize(self, get_examples: Callable[[], Iterable] | None = None, *, nlp: Language | None = None) -> None:
        """Look up the concept of each listed KB name in the KB of the pipeline's concept_normalizer (none: every
        finding is NIL).

        get_examples (Optional[Callable]): Not used (spaCy's signature).
        nlp (Optional[Language]): The pipeline.
        """
        kbs = [getattr(pipe, "kb", None) for _, pipe in (nlp.pipeline if nlp is not None else [])]
        kb = next((kb for kb in kbs if kb is not None and hasattr(kb, "concepts_for")), None)
        self.concepts = {}
        for kb_name in sorted({n for n in (*self.kb_names.values(), *SHORTHAND.values()) if n}):
            ids = kb.concepts_for(kb_name, normalized=False) if kb is not None else []
            if ids:
                self.concepts[kb_name] = ids[0]

    def __call__(self, doc: Doc) -> Doc:
        """Apply the component to a doc.

        doc (Doc): The document, its entities linked.
        RETURNS (Doc): The same doc, without the entities of another sense or of a single letter, and with the
            findings that no entity overlapped added as entities.
        """
        # a single letter is no condition ("h" of "h/o"): only as an item of a shorthand list, which is found below
        kept = [ent for ent in doc.ents if not self.other_sense(ent) and len(ent.text) > 1]
        items = shorthand_items(doc)  # read once: the findings below and the entities linked as items
        found = self.findings_in(doc, items)
        taken = [(ent.start, ent.end) for ent in kept]
        added = [
            span
            for span in filter_spans(list(found))
            if not any(span.start < e and s < span.end for s, e in taken) and not self.other_sense(span)
        ]
        # an entity that is a shorthand list's item takes the item's concept
        item_starts = {token.i for token in items}
        listed = {ent: shorthand_name(ent[0]) for ent in kept if len(ent) == 1 and ent.start in item_starts}
        relinked = {ent: kb_name for ent, kb_name in listed.items() if ent.kb_id_ != self.concept_of(kb_name)}
        if not added and not relinked and len(kept) == len(doc.ents):
            return doc
        new = [
            (Span(doc, span.start, span.end, label=span.label_ or self.label, kb_id=self.concept_of(kb_name)), kb_name)
            for span, kb_name in [*((span, found[span]) for span in added), *relinked.items()]
        ]
        doc.ents = sorted([*(ent for ent in kept if ent not in relinked), *(ent for ent, _ in new)])
        for ent, kb_name in new:
            ent._.kb_ents = [] if ent.kb_id_ == NIL else [(ent.kb_id_, 1.0)]
            ent._.kb_name = kb_name
            ent._.kb_stage = STAGE
        return doc

    def concept_of(self, kb_name: str | None) -> str:
        """The concept id of a listed KB name, found by `initialize` (NIL for None or a name the KB lacks)."""
        return self.concepts.get(kb_name, NIL) if kb_name else NIL

    def findings_in(self, doc: Doc, items: list[Token] | None = None) -> dict[Span, str | None]:
        """The findings of a doc (listed, by pattern and in shorthand lists), each with the KB name of its concept.

        doc (Doc): The document.
        items (Optional[List[Token]]): The doc's `shorthand_items`, where the caller has them (None: read here).
        RETURNS (Dict[Span, Optional[str]]): Each finding's span and KB name (None: no concept).
        """
        found: dict[Span, str | None] = {}
        for _, start, end in self.patterns(doc):
            found[Span(doc, start, end)] = None
        for _, start, end in self.matcher(doc):
            found[Span(doc, start, end)] = self.kb_names[doc[start:end].text.lower()]
        for token in shorthand_items(doc) if items is None else items:
            found[doc[token.i : token.i + 1]] = shorthand_name(token)
        return found

    def other_sense(self, span: Span) -> bool:
        """Whether an entity is a condition word in another sense: a title, a note's shorthand ("FH", "LMP") or a
        normal function it charts ("flatus"), a specimen ("sputum cx"), the "Allergies" heading, an examination
        line's label ("Ext:"), a measure before its value ("PAD 25"), the modifier of the noun after it ("emergency
        room", "shingles vaccine", "cataract surgery"), or a procedure's name ("carpal tunnel release")."""
        doc, text = span.doc, span.text.lower()
        if text in TITLES or text in NOTE_SHORTHAND or text in NORMAL_FUNCTIONS:
            return True
        if text.rstrip(":") in HEADINGS and is_heading(doc, span.start, span.end):
            return True
        if text in EXAM_LABELS and span.end < len(doc) and doc[span.end].text == ":":
            return True
        if text in MEASURE_NAMES and span.end < len(doc) and (doc[span.end].like_num or doc[span.end].lower_ == "'s"):
            return True
        if span[-1].lower_ in PROCEDURES:
            return True
        following = doc[span.end].lower_ if span.end < len(doc) else ""
        if text in SPECIMENS and (
            following in SPECIMEN_WORDS or (span.start > 0 and doc[span.start - 1].lower_ == "in")
        ):
            return True
        return following in OTHER_SENSE_HEADS or following in PROCEDURES

    def to_bytes(self, *, exclude: Iterable[str] = ()) -> bytes:
        """Serialize the concepts found by `initialize`."""
        return srsly.msgpack_dumps({"concepts": self.concepts})

    def from_bytes(self, bytes_data: bytes, *, exclude: Iterable[str] = ()) -> ClinicalFindings:
        """Load the concepts found by `initialize`."""
        self.concepts = dict(srsly.msgpack_loads(bytes_data)["concepts"])
        return self

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> None:
        """Save the concepts found by `initialize` (concepts.json)."""
        path = ensure_path(path)
        path.mkdir(parents=True, exist_ok=True)
        srsly.write_json(path / "concepts.json", self.concepts)

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> ClinicalFindings:
        """Load the concepts found by `initialize`; a missing or corrupt file is error E413, which names it."""
        file = ensure_path(path) / "concepts.json"
        try:
            concepts = srsly.read_json(file)
            if not isinstance(concepts, dict) or not all(isinstance(v, str) for v in concepts.values()):
                raise ValueError("not a mapping of KB names to concept ids")
        except (OSError, ValueError) as e:
            raise ConceptNormError(Errors.E413.format(path=file, detail=e)) from None
        self.concepts = concepts
        return self


@Language.factory(
    "clinical_findings",
    assigns=["doc.ents", "span._.kb_ents", "span._.kb_name", "span._.kb_stage"],
    default_config={"label": "Disease", "findings": {}},
)
def make_clinical_findings(nlp: Language, name: str, label: str, findings: dict[str, str | None]) -> ClinicalFindings:
    """Create a ClinicalFindings component (see its docstring for the settings)."""
    return ClinicalFindings(nlp, name, label=label, findings=findings)


def shorthand_name(token: Token) -> str | None:
    """The KB name of a shorthand item's finding ("cp" -> "chest pain"; "v." -> "vomiting"), None where it has none."""
    return SHORTHAND[token.lower_.rstrip(".")]


def shorthand_items(doc: Doc) -> list[Token]:
    """The items of a doc's shorthand lists: the words of a run "a/b[/c...]", written without spaces, whose items
    are all `SHORTHAND` items (a trailing full stop aside), not all of them `SHORTHAND_AMBIGUOUS`.

    doc (Doc): The document.
    RETURNS (List[Token]): The item tokens, in doc order.
    """
    items: list[Token] = []
    i = 0
    while i < len(doc):
        words, j = [doc[i]], i
        while j + 2 < len(doc) and doc[j + 1].text == "/" and not doc[j].whitespace_ and not doc[j + 1].whitespace_:
            words.append(doc[j + 2])
            j += 2
        keys = [t.lower_.rstrip(".") for t in words]
        listed = all(k in SHORTHAND for k in keys) and tuple(keys) not in SHORTHAND_WORDS
        if len(words) >= 2 and listed and not set(keys) <= SHORTHAND_AMBIGUOUS:
            items.extend(words)
        i = j + 1
    return items
