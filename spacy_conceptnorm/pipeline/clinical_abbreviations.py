"""Clinical abbreviations: expand the common clinical abbreviations a doc uses without defining them.

Clinical notes use abbreviations they never define ("65M with CHF and DM2 presents with SOB"). The
`clinical_abbreviations` component, after the `abbreviation_resolver`, knows a short list of common clinical
abbreviations of conditions (`CLINICAL_ABBREVIATIONS`): where the doc does not define such a short form, it expands
each occurrence as the resolver expands a defined one, and makes an entity of each occurrence that no entity
overlaps.
"""

from spacy.language import Language
from spacy.pipeline import Pipe
from spacy.tokens import Doc
from spacy.vocab import Vocab

from ..errors import ConceptNormError, Errors
from ..text.abbreviations import Abbreviation, find_abbreviations
from .abbreviation_resolver import expand_short_form, find_occurrences, without_overlaps

# Common clinical abbreviations of conditions and their usual expansion in clinical notes, written for this package
# from common clinical usage; each expansion is a name of the condition in MEDIC (CTD's disease vocabulary), so that
# the linker finds it. An abbreviation with another frequent sense is left out: in notes PE (physical exam), RA
# (room air), MS (mental status), CP, CA, ED, HA, AS, AF; in the literature DM and DM1 (myotonic dystrophy).
CLINICAL_ABBREVIATIONS: dict[str, str] = {
    "AAA": "abdominal aortic aneurysm",
    "ACS": "acute coronary syndrome",
    "AFIB": "atrial fibrillation",
    "AFib": "atrial fibrillation",
    "Afib": "atrial fibrillation",
    "afib": "atrial fibrillation",
    "A-fib": "atrial fibrillation",
    "AKI": "acute kidney injury",
    "BPH": "benign prostatic hyperplasia",
    "CAD": "coronary artery disease",
    "CHF": "congestive heart failure",
    "CKD": "chronic kidney disease",
    "COPD": "chronic obstructive pulmonary disease",
    "CVA": "stroke",
    "DM2": "type 2 diabetes mellitus",
    "DVT": "deep vein thrombosis",
    "GERD": "gastroesophageal reflux",
    "GIB": "gastrointestinal hemorrhage",
    "HCV": "hepatitis C",
    "HF": "heart failure",
    "HLD": "hyperlipidemia",
    "HTN": "hypertension",
    "IBS": "irritable bowel syndrome",
    "LBP": "low back pain",
    "LVH": "left ventricular hypertrophy",
    "MDD": "major depressive disorder",
    "MI": "myocardial infarction",
    "NSVT": "ventricular tachycardia",
    "OA": "osteoarthritis",
    "OSA": "obstructive sleep apnea",
    "PAD": "peripheral arterial disease",
    "PCOS": "polycystic ovary syndrome",
    "PID": "pelvic inflammatory disease",
    "PNA": "pneumonia",
    "PTX": "pneumothorax",
    "PUO": "fever of unknown origin",
    "PVD": "peripheral vascular disease",
    "SOB": "shortness of breath",
    "T1DM": "type 1 diabetes mellitus",
    "T2DM": "type 2 diabetes mellitus",
    "TIA": "transient ischemic attack",
    "URTI": "upper respiratory tract infections",
    "UTI": "urinary tract infection",
    "VUR": "vesico-ureteral reflux",
}


class ClinicalAbbreviations(Pipe):
    """Expand the clinical abbreviations a doc does not define, and make entities of them.

    After `abbreviation_resolver` (whose `doc._.abbreviations` tell which short forms the doc defines; without
    it they are found here), for each short form of `CLINICAL_ABBREVIATIONS` and of your `abbreviations` that the
    doc does not define, and each occurrence of it (also with a plural "s") on token boundaries that overlaps no
    definition: an entity without a long form that holds occurrences gets `span._.long_form` ("CHF exacerbation"
    -> "congestive heart failure exacerbation"); an occurrence that no entity overlaps becomes an entity, its long
    form the listed one.
    """

    def __init__(
        self,
        vocab: Vocab,
        name: str = "clinical_abbreviations",
        *,
        label: str = "Disease",
        abbreviations: dict[str, str | None] | None = None,
    ) -> None:
        """Initialize the component.

        vocab (Vocab): The shared vocabulary.
        name (str): The component instance name.
        label (str): The label of the entities it adds.
        abbreviations (Optional[Dict[str, Optional[str]]]): Your own short forms and their long forms, added to
            `CLINICAL_ABBREVIATIONS` (one of its short forms given here takes the long form given; None leaves it
            out), e.g. {"ESRD": "end stage renal disease", "MI": None}.
        """
        expected = "a mapping of short forms to long forms (text, or null to leave one out)"
        abbreviations = text_mapping(name, "abbreviations", abbreviations, expected)
        self.vocab = vocab
        self.name = name
        self.label = label
        self.abbreviations = abbreviations
        self.long_forms = {
            short: long for short, long in {**CLINICAL_ABBREVIATIONS, **abbreviations}.items() if long is not None
        }

    def __call__(self, doc: Doc) -> Doc:
        """Apply the component to a doc.

        doc (Doc): The document, with its entities set.
        RETURNS (Doc): The same doc, with the entities added and `ent._.long_form` set.
        """
        found = doc._.abbreviations
        text = doc.text  # spaCy joins the tokens' texts anew at each `doc.text`
        defined = [Abbreviation(**a) for a in found] if found is not None else find_abbreviations(text)
        shorts = {abbreviation.short for abbreviation in defined}
        taken = [(a.short_start, a.short_end) for a in defined] + [(a.long_start, a.long_end) for a in defined]
        known = {short: long for short, long in self.long_forms.items() if short not in shorts}
        free = [o for o in find_occurrences(doc, text, known) if not any(o[0] < e and s < o[1] for s, e in taken)]
        occurrences = without_overlaps(free)
        if not occurrences:
            return doc
        ents = list(doc.ents)
        for ent in ents:
            if not ent._.long_form:
                long_form = expand_short_form(ent, text, occurrences)
                if long_form is not None:
                    ent._.long_form = long_form
        added = [
            (doc.char_span(start, end, label=self.label), long_form)
            for start, end, long_form in occurrences
            if not any(start < ent.end_char and ent.start_char < end for ent in ents)
        ]
        if added:
            doc.ents = sorted(ents + [span for span, _ in added])
            for span, long_form in added:
                span._.long_form = long_form
        return doc


@Language.factory(
    "clinical_abbreviations",
    assigns=["doc.ents", "span._.long_form"],
    default_config={"label": "Disease", "abbreviations": {}},
)
def make_clinical_abbreviations(
    nlp: Language, name: str, label: str, abbreviations: dict[str, str | None]
) -> ClinicalAbbreviations:
    """Create a ClinicalAbbreviations component (see its docstring for the settings)."""
    return ClinicalAbbreviations(nlp.vocab, name, label=label, abbreviations=abbreviations)


def text_mapping(component: str, key: str, mapping: dict | None, expected: str) -> dict[str, str | None]:
    """A component's setting that maps texts to texts or None (`clinical_abbreviations`' abbreviations,
    `clinical_findings`' findings), as a dict, checked: E410 names the first entry whose key is not text or whose
    value is neither text nor None.

    component (str): The component's name. key (str): The setting's name.
    mapping (Optional[dict]): The setting (None: empty). expected (str): What E410 says the setting must be.
    """
    mapping = dict(mapping or {})
    for text, value in mapping.items():
        if not (isinstance(text, str) and text.strip()) or not (value is None or isinstance(value, str)):
            raise ConceptNormError(
                Errors.E410.format(component=component, key=key, expected=expected, value={text: value})
            )
    return mapping
