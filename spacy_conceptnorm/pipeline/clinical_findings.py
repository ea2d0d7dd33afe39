"""Clinical findings: the signs and symptoms that notes name with words no KB name is.

A clinical note's review of systems and examination name findings in the clinician's words: "no murmurs, rubs
or gallops", "wheezes", "JVD", "tenderness", "tingling". The recognizer, trained on abstracts, misses most of them,
and the KB names them otherwise ("Heart Murmurs", "Paresthesia") or not at all. The `clinical_findings`
component, after `link_filter`, knows a short list of such findings (`CLINICAL_FINDINGS`) and makes an entity of
each occurrence that no entity overlaps, linked to the concept of the KB name listed beside it (looked up in the
concept_normalizer's KB by `initialize`), or NIL where the KB has none. The status of each (negated, ...) is
`clinical_context`'s, as for any entity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import srsly
from spacy.language import Language
from spacy.matcher import PhraseMatcher
from spacy.pipeline import Pipe
from spacy.tokens import Doc, Span
from spacy.util import ensure_path, filter_spans

from ..errors import ConceptNormError, Errors
from . import concept_normalizer  # noqa: F401  (registers the span extensions it sets: kb_ents, kb_name, ...)

NIL = "NIL"
STAGE = "clinical_findings"  # `ent._.kb_stage` of the entities it adds
# Findings of the review of systems and the examination, written for this package from common clinical usage, and
# the KB name (MEDIC) of each one's concept, or None where MEDIC has none. Matched case-blind on whole tokens. A
# word with a frequent other sense in notes is left out: "mass" (body mass), "lesion", "discharge", "frequency",
# "urgency", "tired".
CLINICAL_FINDINGS: dict[str, str | None] = {
    "murmur": "heart murmur",
    "murmurs": "heart murmur",
    "gallop": None,
    "gallops": None,
    "rubs": None,
    "friction rub": None,
    "wheeze": "wheezing",
    "wheezes": "wheezing",
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
}


class ClinicalFindings(Pipe):
    """Make entities of the clinical findings a doc names (see the module docstring).

    Each occurrence of a finding (the longest where two overlap) that no entity overlaps becomes an entity with
    `label`, `kb_id_` the concept of its listed KB name (NIL if none), `ent._.kb_ents` [(id, 1.0)], `kb_name` the
    listed name and `kb_stage` "clinical_findings".
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
        findings = dict(findings or {})
        for text, kb_name in findings.items():
            if not (isinstance(text, str) and text.strip()) or not (kb_name is None or isinstance(kb_name, str)):
                expected = 'a mapping of findings to KB names (text, null for none, or "-" to leave one out)'
                raise ConceptNormError(
                    Errors.E410.format(component=name, key="findings", expected=expected, value={text: kb_name})
                )
        self.vocab = nlp.vocab
        self.name = name
        self.label = label
        self.findings = findings
        # lower-cased finding -> KB name (matched case-blind)
        self.kb_names = {t.lower(): n for t, n in {**CLINICAL_FINDINGS, **findings}.items() if n != "-"}
        self.concepts: dict[str, str] = {}  # KB name -> concept id, found by `initialize`
        self.matcher = PhraseMatcher(nlp.vocab, attr="LOWER")
        self.matcher.add(name, list(nlp.tokenizer.pipe(self.kb_names)))

    def initialize(self, get_examples: Callable[[], Iterable] | None = None, *, nlp: Language | None = None) -> None:
        """Look up the concept of each listed KB name in the KB of the pipeline's concept_normalizer (none: every
        finding is NIL).

        get_examples (Optional[Callable]): Not used (spaCy's signature).
        nlp (Optional[Language]): The pipeline.
        """
        kbs = [getattr(pipe, "kb", None) for _, pipe in (nlp.pipeline if nlp is not None else [])]
        kb = next((kb for kb in kbs if kb is not None and hasattr(kb, "concepts_for")), None)
        self.concepts = {}
        for kb_name in sorted({n for n in self.kb_names.values() if n}):
            ids = kb.concepts_for(kb_name, normalized=False) if kb is not None else []
            if ids:
                self.concepts[kb_name] = ids[0]

    def __call__(self, doc: Doc) -> Doc:
        """Apply the component to a doc.

        doc (Doc): The document, its entities linked.
        RETURNS (Doc): The same doc, with the findings that no entity overlapped added as entities.
        """
        taken = [(ent.start, ent.end) for ent in doc.ents]
        found = filter_spans([Span(doc, start, end) for _, start, end in self.matcher(doc)])
        added = [span for span in found if not any(span.start < e and s < span.end for s, e in taken)]
        if not added:
            return doc
        new = []
        for span in added:
            kb_name = self.kb_names[span.text.lower()]
            concept_id = self.concepts.get(kb_name, NIL) if kb_name else NIL
            new.append((Span(doc, span.start, span.end, label=self.label, kb_id=concept_id), kb_name))
        doc.ents = sorted([*doc.ents, *(ent for ent, _ in new)])
        for ent, kb_name in new:
            ent._.kb_ents = [] if ent.kb_id_ == NIL else [(ent.kb_id_, 1.0)]
            ent._.kb_name = kb_name
            ent._.kb_stage = STAGE
        return doc

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
