"""The assertion status of each entity: the `clinical_context` component, last in the pipeline.

A clinical note names many conditions the patient does not have: "denies chest pain", "rule out MI", "mother had
breast cancer", "return if fever develops". `clinical_context` runs medspaCy's own components over the linked
entities, in this order:

1. the sentences are split with rules written for clinical layout (headings, numbered lists, lines without a
   full stop), so that a cue's scope ends where its sentence does: by default the compiled regular expressions of
   `text.sentences`, which find PyRuSH's boundaries (`sentences = "pyrush"`: medspaCy's PyRuSH itself) at a
   fiftieth of its cost; `split_report_sentences` adds the boundaries PyRuSH misses in reports;
2. the sectionizer (`medspacy_sectionizer`, with a few common headings its rules lack: `EXTRA_SECTIONS`) finds
   the section headings ("FAMILY HISTORY:") and sets `ent._.section_category` on each entity; an entity under a
   family-history heading is `is_family`, under a past-medical-history heading `is_historical`;
3. ConText (`medspacy_context`, its default rules and the NegEx/ConText cues they lack: `EXTRA_CUES`) sets
   `ent._.is_negated`, `is_uncertain`, `is_historical`, `is_family` and `is_hypothetical` from the cues around
   the entity in its sentence; a negation or an uncertainty reaches an entity over a list of conditions, not over
   more than a few other words (`gap_words`), as a nursing note's run-on lines would have it.

The attributes are medspaCy's own, so code written for medspaCy reads them. `ent._.assertion` sums them up in
one word (`assertion_status`), which `annotate` writes and the curation page shows. The component runs after
`link_filter`: the sentence boundaries it sets cannot change what the recognizer found or the linker chose.
"""

from __future__ import annotations

import re
import warnings
from bisect import bisect_left
from collections.abc import Callable
from typing import Literal

import numpy
import srsly
from spacy.attrs import IDX, SENT_START
from spacy.language import Language
from spacy.tokens import Doc, Span, Token
from spacy.vocab import Vocab

from .. import about
from ..errors import ConceptNormError, Errors
from ..text.sentences import sentence_starts

# One status per entity, the first flag set in this order: "no family history of X" is negated, "mother had X"
# family even though past, "return if X" hypothetical rather than uncertain.
FLAGS = (
    ("negated", "is_negated"),
    ("family", "is_family"),
    ("hypothetical", "is_hypothetical"),
    ("uncertain", "is_uncertain"),
    ("historical", "is_historical"),
)
AFFIRMED = "affirmed"
# words that, inside an entity, make the absence itself the finding (`holds_negation`)
OWN_NEGATIONS = frozenset(("no", "not", "n't", "unable", "absent", "nor", "without", "wo", "w/o", "cannot"))
# A negation or uncertainty modifies no entity that more than MAX_GAP_WORDS words, other than entities' and
# LIST_WORDS, keep apart from its cue (`gap_words`; six chosen on the whole-note dev: docs/benchmarks.md)
GAP_LIMITED = ("NEGATED_EXISTENCE", "POSSIBLE_EXISTENCE")
MAX_GAP_WORDS = 6
LIST_WORDS = frozenset(("or", "and", "nor", "any", "&", "/", "either", "neither"))
# How `split_sentences` splits them: the compiled rules of `text.sentences` or medspaCy's PyRuSH (see ClinicalContext)
SENTENCES = ("rules", "pyrush")
STATUSES = (*(status for status, _ in FLAGS), AFFIRMED)
# Common headings that medspaCy's default section rules lack (they list "ASSESSMENT/PLAN:" but not "PLAN:", nor the
# short forms "FamHx:", "PSHx:", "Meds:", nor general practice's "HPC:", "FMH:", "Imp:", "O/E:"): without them the
# section before runs on, and a plan under a family history would be read as family. Every heading also counts
# without its colon where `is_heading` says so.
EXTRA_SECTIONS = (
    ("HISTORY:", "history_of_present_illness"),
    ("CLINICAL HISTORY:", "history_of_present_illness"),
    ("PSH:", "past_medical_history"),
    ("SURGICAL HISTORY:", "past_medical_history"),
    ("FH:", "family_history"),
    ("FHx:", "family_history"),
    ("Plan:", "observation_and_plan"),
    ("Disposition:", "observation_and_plan"),
    ("Review of Systems:", "review_of_systems"),
    ("ROS:", "review_of_systems"),
    ("Follow-up:", "patient_instructions"),
    ("Return Precautions:", "patient_instructions"),
    ("FamHx:", "family_history"),
    ("Family Hx:", "family_history"),
    ("SocHx:", "social_history"),
    ("SHx:", "social_history"),
    ("PSHx:", "past_medical_history"),
    ("PMHx:", "past_medical_history"),
    ("SurgHx:", "past_medical_history"),
    ("MEDICAL HISTORY:", "past_medical_history"),
    ("PAST MEDICAL/SURGICAL HISTORY:", "past_medical_history"),
    ("Meds:", "medications"),
    ("MEDICATIONS:", "medications"),
    ("HPI/CC:", "history_of_present_illness"),
    ("CC/HPI:", "history_of_present_illness"),
    ("ASSESSMENT AND PLAN:", "observation_and_plan"),
    ("IMPRESSION:", "observation_and_plan"),
    ("PLANS/RECOMMENDATIONS:", "observation_and_plan"),
    ("RESULTS:", "labs_and_studies"),
    ("Labs:", "labs_and_studies"),
    ("VITALS:", "labs_and_studies"),
    ("EXAM:", "physical_exam"),
    ("ALLERGIES/ADVERSE REACTIONS:", "allergy"),
    ("INSTRUCTIONS:", "patient_education"),
    ("HPC:", "history_of_present_illness"),
    ("Hx:", "history_of_present_illness"),
    ("History of presenting complaint:", "history_of_present_illness"),
    ("PC:", "chief_complaint"),
    ("DH:", "medications"),
    ("Drug history:", "medications"),
    ("FMH:", "family_history"),
    ("Imp:", "observation_and_plan"),
    ("O/E:", "physical_exam"),
    ("Examination:", "physical_exam"),
)
# The sections whose entities take an assertion attribute (medspaCy's `DEFAULT_ATTRS`, and its "Allergies" heading,
# which its rules file under a category of its own): the reactions listed under an allergy are those a drug would
# cause.
EXTRA_SECTION_ATTRIBUTES = {"allergies": {"is_hypothetical": True}}
# Cues that medspaCy's default ConText rules lack or read otherwise, most from the NegEx and ConText trigger lists:
# (category, direction, words). `words` is a token pattern: tokens apart by spaces, alternatives by "|", "?" after
# a token that may be missing ("no significant|interval? change" matches "no change" and "no interval change"),
# "shape:dddd" a token of that shape (a year; "shape:d|shape:dd" either, never mixed with words).
# - Negation after the condition ("pneumothorax is not seen", "N/V: denies", "rash has resolved") and before it
#   ("is negative for X", "nil X", "non-tender", "was not found to have X", "never", "does not recall having any
#   X"); "EXT: no edema" and "Respiratory: Denies cough" read forward as "Fever: no" reads back; "X - but now
#   resolved", "X, but not now".
# - Pseudo-cues, which modify nothing and keep a shorter cue from matching inside them: "no change in the
#   effusion", "lives with his wife", "per her mother", "non-small cell", "including but not limited to", "without
#   relief of", "denies any changes to", "should help", "free nipple graft".
# - Uncertainty: "probable", "query", "less likely", "cannot (be) excluded", "I suspect", "he thinks he has", and
#   the reasons for a test ("to exclude X", "evaluate for X", "to determine if he has X", "screened for X", "STD
#   testing", "screen her for X"), which medspaCy reads as negation; a possible cause ("could be due to X",
#   "attributes this to X", "I am concerned he has X"); "+/-".
# - History ("status post", "previous", "years ago" either side, "when she was a baby", a past encounter: "went to the
#   emergency room for X", "at her last visit") but not the recent past ("a two-day history of", "3/7 hx of" in
#   general practice's shorthand, "Hx of X for a week", "in the past 6 months", "natural history") nor a current
#   symptom's onset ("started 3 months ago") nor "s/p", which in notes written during a stay is mostly this
#   admission's event ("admitted s/p GI bleed"), nor "old" blood, sputum or drainage; a past history's list ("hx
#   IDDM; obesity; asthma": the PAST_HISTORY category, medspaCy's "history" cue) runs past the ";" that ends
#   every other cue (the LIST pseudo-cue);
#   the present under a past-history heading (the CURRENT category, which clears `is_historical`: "newly diagnosed
#   X", "good control of his X", "has been experiencing X"); the future ("monitor for", "be aware of", "to avoid",
#   "will cause", "DVT prophylaxis", which medspaCy reads as negated; "for any pain", "can be taken for X", "red
#   flag sx", and a safety net's "if sx not improving", whose "not" negates nothing); a risk (the RISK category:
#   "the risks of surgery including X", "a risk factor for X", "side effects such as X", "S/e"); a relative after
#   the condition ("diabetes in her mother"), not one who reports or comes along ("her mother thought she felt
#   hot", "described by her mother", "her mother and she returned").
# - "but", "p/w" (presents with) and their kin end every cue's scope, not only a negation's, and ";" every one but
#   a past history's; a relative clause ("who", "which": the CLAUSE pseudo-cue) ends all but a relative's and a
#   risk's; a cause ("due to", "after": CAUSE) ends a negation's and an uncertainty's ("no joint damage due to his
#   arthritis"); a finding ("showed": FINDING) ends all but history's ("her colonoscopy 3 years ago showed
#   diverticulosis") (TERMINATING_TYPES).
# - A fourth element, where there is one, holds medspaCy's options of the rule (`max_scope`: "non-" negates the
#   word after it, not "non-blanching rash, lethargy or seizure").
# - Pseudo-cues of their own category ("given for") keep a shorter cue ("given") from matching inside them.
# - Nursing notes' shorthand: "no c/o X", "w/o X", "wo X", "with out X", "X neg", "X (-)" (negated), "sent for X", "X
#   sent", "X pending" (uncertain), "X precaution(s)", "X med prn", "keep pt free of X", "chances of X", "X risk",
#   "anticipate", "follow (closely) for X" (hypothetical), "X resolves", "X subsided", "X was relieved", "stopped
#   X", "X with resolution" (negated); "HO" (the house officer) and the family "aware", "at the bedside",
#   "adamant" modify nothing; "for further w/u of X" is no "further X". A "?" questions the word it is written
#   against ("pneumonia?"), else what follows it ("?CHF", "sob, ? tamponade"): `questions`. A clause that starts
#   with a measure after a comma or dash ends every cue ("no ectopy, BP high"); "X ... but recovered" is over
#   (negated); "without incident", "no plans for", "w/o significant change" and an absent function ("not to
#   command", "not responsive", "cannot remember") negate nothing after them. An entity whose own words say a
#   function is absent ("does not follow commands") is not negated by a cue before it (`holds_negation`).
_BE = "is|was|are|were|been|be"
_FULLY = "entirely|completely|totally|fully|definitely?"

_RELATIVES = (
    "mother|father|mom|dad|mum|sister|brother|sibling|siblings|son|daughter|aunt|uncle|grandmother|grandfather|"
    "cousin|parents|children"
)
_CONTACTS = f"{_RELATIVES}|wife|husband|spouse|partner|family"
# what a relative or the house officer ("HO", which medspaCy reads as "history of") does in a nursing note
_VISITS = (
    "aware|adamant|updated|present|visited|visiting|at|in|wants|wanted|wishes|wished|requests|requested|requesting|"
    "phoned|informed|notified|paged|decided|agrees|agreed|would|spoke|declined|came|here|made"
)
# what a nursing note's clause starts with after a comma or dash: a vital sign, a result, the lungs or bowel sounds
# ("no ectopy, BP high", "NSR with no ectopy, SBP very labile"); not a body part or system that can begin a
# condition's name in a list ("denies nausea, abd pain", "no fever, GI bleeding")
_MEASURES = (
    "bp|bps|sbp|sbps|dbp|map|maps|hr|rr|ci|co|cvp|svr|pad|pas|temp|tmax|sats|sat|spo2|o2|wbc|hct|hgb|k|na|lungs|ls|bs"
)
_COUNSELED = "counsel|counseled|counselled|educated|warned|advised"
_KIN = "maternal|paternal|younger|older|elder|twin|late?"  # the "?": a relative's qualifier may be missing
_SEEN = "seen|identified|present|demonstrated|visualized|appreciated|noted|detected|evident|found|elicited|suspected"
_CHILD = "child|teenager|teen|infant|baby|toddler|kid"
_STARTED = "started|began|begun|starting|worsened|worsening about|approximately|around?"
_AGO = "year|years|yrs|month|months ago"
_SAYS = (
    "reports|reported|states|stated|found|noticed|noted|says|said|brought|witnessed|called|describes|asked|told|"
    "thought|thinks|believes|felt|feels|notes|mentions|mentioned|explains|explained|adds|added|confirms|confirmed"
)


def questions(target: Span, cue: Span, between: Span) -> bool:
    """Whether a "?" cue questions `target`: written against the word before it ("pneumonia?") it questions what
    comes before it; otherwise ("?CHF", "sob, ? tamponade", "CR-? renal consult") what follows (medspaCy's
    `on_modifies`)."""
    doc = cue.doc
    before = doc[cue.start - 1] if cue.start > 0 else None
    after_word = before is not None and not before.whitespace_ and before.text[-1].isalnum()
    return target.end <= cue.start if after_word else target.start >= cue.end


EXTRA_CUES = (
    ("NEGATED_EXISTENCE", "BIDIRECTIONAL", ": no"),
    ("NEGATED_EXISTENCE", "BACKWARD", ": negative|neg|absent"),
    ("NEGATED_EXISTENCE", "FORWARD", ": negative|neg for"),
    ("NEGATED_EXISTENCE", "FORWARD", "negative", {"max_scope": 6}),
    ("NEGATED_EXISTENCE", "BIDIRECTIONAL", ": denies|denied"),
    ("NEGATED_EXISTENCE", "FORWARD", "is|was|are|were negative|neg for"),
    ("NEGATED_EXISTENCE", "BACKWARD", "were|been negative|neg"),
    ("NEGATED_EXISTENCE", "FORWARD", "non -?", {"max_scope": 1}),
    ("NEGATED_EXISTENCE", "PSEUDO", "non -? specific|small|hodgkin|hodgkins|insulin|st|q|alcoholic|invasive|smoker"),
    ("NEGATED_EXISTENCE", "FORWARD", "not|never found|shown|noted|known to have|be"),
    ("NEGATED_EXISTENCE", "FORWARD", "exclusion of"),
    ("NEGATED_EXISTENCE", "PSEUDO", "but? not limited to"),
    ("NEGATED_EXISTENCE", "PSEUDO", "can? not|n't recall|remember"),
    ("NEGATED_EXISTENCE", "BACKWARD", f"{_BE}? not|n't {_SEEN}"),
    ("NEGATED_EXISTENCE", "BACKWARD", f"{_BE}? excluded|absent"),
    ("NEGATED_EXISTENCE", "BACKWARD", "were|been ruled out"),
    ("NEGATED_EXISTENCE", "FORWARD", f"{_BE} ruled out for"),
    ("NEGATED_EXISTENCE", "BIDIRECTIONAL", "resolved"),
    ("NEGATED_EXISTENCE", "BACKWARD", "-? but|and now|since resolved|settled|gone"),
    ("NEGATED_EXISTENCE", "BACKWARD", "resolves|resolving|subsided", {"max_scope": 6}),
    ("NEGATED_EXISTENCE", "BACKWARD", "but|which|and? recovered|recover|recovering|rebounded|rebounding",
     {"max_scope": 8}),
    ("NEGATED_EXISTENCE", "BACKWARD", "but resolved|resolves|subsided", {"max_scope": 8}),
    ("NEGATED_EXISTENCE", "BACKWARD", "but not now|anymore"),
    ("NEGATED_EXISTENCE", "BACKWARD", "with|w/ resolution"),
    ("NEGATED_EXISTENCE", "BACKWARD", "was|were|been relieved"),
    ("NEGATED_EXISTENCE", "FORWARD", "stopped", {"max_scope": 1}),
    ("NEGATED_EXISTENCE", "BACKWARD", "( - )", {"max_scope": 1}),
    ("NEGATED_EXISTENCE", "PSEUDO", "sx|symptoms? not|no better|improving|improved|improve|settling|settled|worse"),
    ("NEGATED_EXISTENCE", "FORWARD", "resolution of"),
    ("NEGATED_EXISTENCE", "FORWARD", "nil|neither"),
    ("NEGATED_EXISTENCE", "FORWARD", "fail|fails|failed to demonstrate|show|reveal|identify"),
    ("NEGATED_EXISTENCE", "FORWARD", "pertinent|relevant negatives include|includes|are|:"),
    ("NEGATED_EXISTENCE", "FORWARD", "to suggest|indicate"),
    ("NEGATED_EXISTENCE", "BACKWARD", "ruled out by|with|on"),
    ("NEGATED_EXISTENCE", "PSEUDO", "not|non compliant|adherent"),
    ("NEGATED_EXISTENCE", "PSEUDO", "no|w/o|without significant|interval|definite? change|changes|increase"),
    ("NEGATED_EXISTENCE", "PSEUDO", "w / o significant|any? change|changes"),
    ("NEGATED_EXISTENCE", "PSEUDO", "not|non responsive|responding|arousable"),
    ("NEGATED_EXISTENCE", "PSEUDO", "not to|on command|commands"),
    ("NEGATED_EXISTENCE", "PSEUDO", "not only|cause"),
    ("NEGATED_EXISTENCE", "PSEUDO", "without difficulty|incident|complication|complications|event"),
    ("NEGATED_EXISTENCE", "PSEUDO", "no plan|plans to|for"),
    ("NEGATED_EXISTENCE", "PSEUDO", "gram negative"),
    ("NEGATED_EXISTENCE", "FORWARD", "no other likely|obvious|apparent? source|cause|etiology of|for"),
    ("NEGATED_EXISTENCE", "FORWARD", "never"),
    ("NEGATED_EXISTENCE", "FORWARD", "not|n't recall|remember having|experiencing|any"),
    ("NEGATED_EXISTENCE", "PSEUDO", "without|no significant|much|any? relief|improvement of|in"),
    ("NEGATED_EXISTENCE", "PSEUDO", "denies|deny|no any? change|changes in|to|of"),
    ("NEGATED_EXISTENCE", "PSEUDO", "not|n't successfully|significantly? reduce|affect|improve|relieve|help|alleviate"),
    ("NEGATED_EXISTENCE", "PSEUDO", "free nipple|flap|graft|fluid|air|wall|t4|t3"),
    ("NEGATED_EXISTENCE", "FORWARD", "no|denies|denied|without c / o"),
    ("NEGATED_EXISTENCE", "FORWARD", "w / o"),
    ("NEGATED_EXISTENCE", "FORWARD", "w/o|wo"),  # spaCy's tokenizer keeps the lower-case "w/o" and "w/" whole
    ("NEGATED_EXISTENCE", "FORWARD", "with out"),
    ("NEGATED_EXISTENCE", "BACKWARD", "neg", {"max_scope": 1}),
    ("NEGATED_EXISTENCE", "PSEUDO", "gram neg"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "possibly|probable|questionable|suspected|presumed|presumptive|query"),
    ("POSSIBLE_EXISTENCE", "BIDIRECTIONAL", "?", {"on_modifies": questions}),
    ("POSSIBLE_EXISTENCE", "BACKWARD", "possible|likely|suspected|probable ;|.|,|on|in|at"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "felt|thought|believed|presumed to be"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "likely|possibly|probably due|secondary|related to"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "may|might|could be due|secondary|related to"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "attributes|attributed|attributing this|it|them|these? to"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "concerned|worried that|he|she|they|his|her"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "suggest|suggests|suggesting|suggestive"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "would? consider|considering"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "ddx"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "suspicion|question|possibility|concern of|for"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "may|might|could also? represent|reflect|be"),
    ("POSSIBLE_EXISTENCE", "BACKWARD", "is|are also? a consideration|considerations"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "differential diagnosis|diagnoses|includes|include?"),
    ("POSSIBLE_EXISTENCE", "BACKWARD", f"{_BE} possible|suspected|likely|probable|questioned|favored|considered"),
    ("POSSIBLE_EXISTENCE", "BACKWARD", "less|more likely"),
    ("POSSIBLE_EXISTENCE", "BACKWARD", "on|in the differential"),
    ("POSSIBLE_EXISTENCE", "BIDIRECTIONAL", "versus|vs|vs."),
    # spaCy's tokenizer splits a lower-case "cannot" into "can not" and "can't" into "ca n't", not "CANNOT"
    ("POSSIBLE_EXISTENCE", "FORWARD", "cannot|can't exclude|rule"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "can|could|ca not|n't exclude|rule"),
    ("POSSIBLE_EXISTENCE", "BACKWARD", f"cannot|can't be {_FULLY} excluded|ruled"),
    ("POSSIBLE_EXISTENCE", "BACKWARD", f"can|could|ca not|n't be {_FULLY} excluded|ruled"),
    ("POSSIBLE_EXISTENCE", "BACKWARD", f"{_BE}? not excluded"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "to? exclude|evaluate|eval|assess"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "suspect|suspects"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "what|this|it appears|seems to be"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "appears|appear|seems|seem to represent"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "may|might have|represent"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "thinks|thought|believes he|she|they|it has|have|had|is|was"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "determine|confirm|check|see if|whether"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "screened|screening for"),
    ("POSSIBLE_EXISTENCE", "BACKWARD", "screening"),
    ("POSSIBLE_EXISTENCE", "BACKWARD", "testing|serology|swabs", {"max_scope": 3}),
    ("POSSIBLE_EXISTENCE", "FORWARD", "screen|test the? patient|her|him|them today? for"),
    ("POSSIBLE_EXISTENCE", "BACKWARD", "index of suspicion"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "+ /-"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "evaluate|eval|evaluation|assess|test|testing|workup for"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "work - up for"),
    ("POSSIBLE_EXISTENCE", "FORWARD", "sent|send|sending for", {"max_scope": 3}),
    ("POSSIBLE_EXISTENCE", "BACKWARD", "pending|sent", {"max_scope": 1}),
    ("HISTORICAL", "FORWARD", "pmh|previous|previously|prior|remote|known|old"),
    ("HISTORICAL", "PSEUDO", "year|years|month|months|week|weeks|day|days|yr|yrs|mo -? old"),
    ("HISTORICAL", "PSEUDO", "year|years|month|months|week|weeks|day|days history|hx of"),
    ("HISTORICAL", "PSEUDO", "day|days|week|weeks history|hx"),
    ("HISTORICAL", "PSEUDO", "shape:d/d|shape:d/dd|shape:dd/dd history|hx of?"),
    ("HISTORICAL", "PSEUDO", "previously|otherwise well|healthy"),
    ("HISTORICAL", "PSEUDO", "from|than|since|to prior|previous"),
    ("HISTORICAL", "FORWARD", "status post"),
    ("PAST_HISTORY", "FORWARD", "history|hx|hist|ho"),
    ("PAST_HISTORY", "FORWARD", "hx|history ( + ) for?"),
    ("HISTORICAL", "PSEUDO", "prior to"),
    ("HISTORICAL", "PSEUDO", "natural history"),
    ("HISTORICAL", "PSEUDO", "old blood|bloody|clot|clots|drainage|sputum|secretions|thrombus|dressing"),
    ("HISTORICAL", "PSEUDO", "in|over|during the past|last few|several? days|weeks|months"),
    ("HISTORICAL", "PSEUDO", "in|over|during the past|last shape:d days|weeks|months"),
    ("HISTORICAL", "PSEUDO", "in|over|during the past|last shape:dd days|weeks|months"),
    ("HISTORICAL", "BACKWARD", "in the past"),
    ("HISTORICAL", "BIDIRECTIONAL", "year|years|yrs|month|months ago"),
    ("HISTORICAL", "BIDIRECTIONAL", "at that|which time"),
    ("HISTORICAL", "FORWARD", "was|were last seen"),
    ("HISTORICAL", "BIDIRECTIONAL", "at|during her|his|their|the last|previous|prior visit|appointment"),
    ("HISTORICAL", "FORWARD", "went|was|were taken? to the? emergency|er|ed|hospital|urgent room|department|care? for"),
    ("HISTORICAL", "BACKWARD", "at age|aged"),
    ("HISTORICAL", "BACKWARD", f"as a|an {_CHILD}"),
    ("HISTORICAL", "BIDIRECTIONAL", f"when he|she|they was|were a|an? {_CHILD}|young"),
    ("HISTORICAL", "BIDIRECTIONAL", "when he|she|they was|were shape:d|shape:dd"),
    ("HISTORICAL", "PSEUDO", f"{_STARTED} shape:d|shape:dd {_AGO}"),
    ("HISTORICAL", "PSEUDO", f"{_STARTED} a few|couple|several of? {_AGO}"),
    ("CURRENT", "FORWARD", "newly|new diagnosed|dx|diagnosis|onset"),
    ("CURRENT", "FORWARD", "control of"),
    ("CURRENT", "BACKWARD", "for a|one|two|three|few|couple of? day|days|week|hours"),
    ("CURRENT", "BACKWARD", "for the? past|last shape:d days|hours"),
    ("CURRENT", "FORWARD", "has|have been experiencing|having|feeling|noticing"),
    ("HISTORICAL", "BACKWARD", "in high|middle? school|college|childhood"),
    ("HISTORICAL", "BIDIRECTIONAL", "last year"),
    ("HISTORICAL", "BACKWARD", "for shape:d years|yrs|decades"),
    ("HISTORICAL", "BACKWARD", "for shape:dd years|yrs|decades"),
    ("HISTORICAL", "BACKWARD", "for many|several years"),
    ("HISTORICAL", "BIDIRECTIONAL", "in [? *? *? shape:dddd"),
    ("HISTORICAL", "BACKWARD", "( diagnosed|dx|since|in? shape:dddd"),
    ("HYPOTHETICAL", "FORWARD", "monitor|monitored|monitoring|watch|observe for"),
    ("HYPOTHETICAL", "FORWARD", "follow closely? for"),
    ("HYPOTHETICAL", "PSEUDO", "monitor|monitored|monitoring|watch|observe for improvement|resolution|response"),
    ("RISK", "FORWARD", "at? increased|high|higher? risk|risks factor|factors? of|for|include|includes|including"),
    ("RISK", "FORWARD", "risk|risks associated with"),
    ("RISK", "FORWARD", "complications include|including"),
    ("RISK", "FORWARD", "side effects|outcomes|complications such as|like|include|including|of"),
    ("HYPOTHETICAL", "FORWARD", "in case of"),
    ("HYPOTHETICAL", "FORWARD", "with|if|any|for further|recurrent|repeat"),
    ("HYPOTHETICAL", "FORWARD", "avoid|avoiding"),
    ("HYPOTHETICAL", "FORWARD", "should"),
    ("HYPOTHETICAL", "PSEUDO", "should continue|take|follow|have|receive|get|start|stop|avoid|see|undergo|be|not|also"),
    ("HYPOTHETICAL", "PSEUDO", "should help|improve|decrease|reduce|relieve|resolve|alleviate"),
    ("HYPOTHETICAL", "FORWARD", f"{_COUNSELED} the|his|her? patient|pt|{_CONTACTS}? re|regarding|about|on|of"),
    ("HYPOTHETICAL", "FORWARD", "may|might|can|could|will also? worsen|cause|precipitate|trigger"),
    ("HYPOTHETICAL", "FORWARD", "be aware of"),
    ("HYPOTHETICAL", "FORWARD", "for any"),
    ("HYPOTHETICAL", "FORWARD", "red flag|flags sx|symptoms|signs"),
    ("HYPOTHETICAL", "FORWARD", "safety netting|netted|net"),
    ("RISK", "FORWARD", "s / e"),
    ("RISK", "BACKWARD", "risk", {"max_scope": 1}),
    ("RISK", "FORWARD", "chance|chances of"),
    ("HYPOTHETICAL", "BACKWARD", "precautions|precaution", {"max_scope": 1}),
    ("HYPOTHETICAL", "BACKWARD", "prn", {"max_scope": 7}),
    ("HYPOTHETICAL", "FORWARD", "keep pt|patient|him|her? free of"),
    ("HYPOTHETICAL", "PSEUDO", "for further w / u"),
    ("HYPOTHETICAL", "PSEUDO", "for further workup|management|monitoring|care|treatment"),
    ("HYPOTHETICAL", "PSEUDO", "for further work - up"),
    ("HYPOTHETICAL", "FORWARD", "anticipate|anticipated|anticipating|expect|expected that?"),
    ("HYPOTHETICAL", "FORWARD", "any signs|symptoms or? signs|symptoms? of"),
    ("HYPOTHETICAL", "FORWARD", "can|may|could be used|taken for"),
    ("HYPOTHETICAL", "FORWARD", "can|could|may|might|will result in|lead to"),
    ("HYPOTHETICAL", "BIDIRECTIONAL", "prevent|prevention|preventing"),
    ("HYPOTHETICAL", "BIDIRECTIONAL", "prophylaxis|ppx"),
    ("FAMILY", "FORWARD", "fh|fhx"),
    ("FAMILY", "BIDIRECTIONAL", f"in his|her|their|the|a? {_KIN} {_RELATIVES}"),
    ("FAMILY", "FORWARD", "family history is|was? positive|significant|notable for"),
    ("FAMILY", "PSEUDO", "family physician|doctor|practitioner|medicine|members|meeting"),
    ("FAMILY", "PSEUDO", f"lives|living|lived|per|with with? his|her|their|the? {_CONTACTS}"),
    ("FAMILY", "PSEUDO", f"{_CONTACTS} {_SAYS}"),
    ("FAMILY", "PSEUDO", f"patient|pt and|or|& his|her? {_CONTACTS}"),
    ("FAMILY", "PSEUDO", "the|this|our child|baby|infant"),
    ("FAMILY", "PSEUDO", f"by|to his|her|their|the {_CONTACTS}"),
    ("FAMILY", "PSEUDO", f"{_CONTACTS} and|& friends|she|he|i"),
    ("FAMILY", "PSEUDO", f"{_CONTACTS} {_VISITS}"),
    ("HISTORICAL", "PSEUDO", f"ho {_VISITS}"),
    ("TERMINATE", "TERMINATE", "but|however|although|though|except|yet"),
    ("LIST", "PSEUDO", ";"),
    ("CLAUSE", "PSEUDO", "which|who"),
    ("CAUSE", "PSEUDO", "due|secondary|owing to"),
    ("CAUSE", "PSEUDO", "after"),
    ("TERMINATE", "TERMINATE", "presented|reports|reported|complains|complained|endorses|brought|admitted"),
    ("FINDING", "PSEUDO", "shows|showed|demonstrates|demonstrated|reveals|revealed"),
    ("TERMINATE", "TERMINATE", "now|currently|here"),
    ("TERMINATE", "TERMINATE", "residual|given|following|+|positive|patient|pt"),
    ("TERMINATE", "TERMINATE", "in the? setting of"),
    ("PSEUDO", "PSEUDO", "given for|to|as|in|at|by|with|iv|po"),
    ("TERMINATE", "TERMINATE", "p|c / w|o"),
    ("TERMINATE", "TERMINATE", f",|- {_MEASURES}"),
    ("TERMINATE", "TERMINATE", ",|- u / o"),
)  # fmt: skip
# A negation's scope ends at a cue of uncertainty and the other way round: "negative for strep pharyngitis, likely
# viral pharyngitis", "possible pneumonia, no effusion"; a relative clause ends them and history's and the
# future's, not a relative's: "his father, who had an MI".
TERMINATING_TYPES = {
    "NEGATED_EXISTENCE": ["POSSIBLE_EXISTENCE", "CLAUSE", "CAUSE", "FINDING", "LIST"],
    "POSSIBLE_EXISTENCE": ["NEGATED_EXISTENCE", "CLAUSE", "CAUSE", "FINDING", "LIST"],
    "HISTORICAL": ["CLAUSE", "CURRENT", "LIST"],
    "PAST_HISTORY": ["CLAUSE", "CURRENT"],
    "HYPOTHETICAL": ["CLAUSE", "FINDING", "LIST"],
    "FAMILY": ["FINDING", "LIST"],
    "RISK": ["LIST"],
}
# The attributes of the cues' categories that medspaCy lacks: a risk is hypothetical, and its scope runs to the end of
# the sentence, past the relative clauses of a consent paragraph ("the risks including infection, which may require
# ..., stroke or death"); what is current is not historical, whatever its section.
EXTRA_CATEGORIES = {
    "RISK": {"is_hypothetical": True},
    "CURRENT": {"is_historical": False},
    "PAST_HISTORY": {"is_historical": True},
}
# medspaCy's default rules that the cues above replace (by literal)
REPLACED_CUES = (": no", "resolved", "to exclude", "evaluate for", "test for", "prophylaxis", "source for", "history")


def token_pattern(words: str) -> list[dict]:
    """The spaCy token pattern of a cue's `words` (see EXTRA_CUES), matched on the lower-case text."""
    pattern = []
    for token in words.split(" "):
        optional = token.endswith("?") and token != "?"
        alternatives = (token[:-1] if optional else token).split("|")
        shapes = [a.removeprefix("shape:") for a in alternatives if a.startswith("shape:")]
        if shapes and len(shapes) < len(alternatives):
            raise ValueError(f"A token of a cue is either shapes or words, not both: {token!r} in {words!r}")
        attr = {"SHAPE": {"IN": shapes}} if shapes else {"LOWER": {"IN": alternatives}}
        within = {"IS_SENT_START": False} if pattern else {}  # a cue does not reach over a sentence's start
        pattern.append({**attr, **within, **({"OP": "?"} if optional else {})})
    return pattern


class PatternMatcher:
    """spaCy's Matcher for token patterns, the patterns of words and optional words written out as phrases.

    spaCy's Matcher starts every token pattern at every token and calls a Python predicate there for each one that
    gives a word as a set; so medspaCy's matcher took 5.9 of the 7.8 s of `clinical_context` over the 42 whole
    notes of the dev set (AVX2), and its own Matcher 0.8 of the 0.95 s of `clinical_findings` over 62. A pattern
    of words and optional words is written out here as phrases for a PhraseMatcher, which looks each token up once;
    a phrase match is kept only where the pattern would have matched (a word that may not start a sentence does
    not). Other patterns stay token patterns.

    vocab (Vocab): The pipeline's vocab.
    """

    MAX_PHRASES = 10_000  # a pattern written out into more phrases than this stays a token pattern

    def __init__(self, vocab: Vocab) -> None:
        from spacy.matcher import Matcher, PhraseMatcher

        self.vocab = vocab
        self.matcher = Matcher(vocab)
        self.phrases = PhraseMatcher(vocab, attr="LOWER")
        # a phrase key -> (its pattern's index, which of its words may not start a sentence)
        self.keys: dict[int, tuple[int, tuple[bool, ...]]] = {}

    def add(self, index: int, pattern: list[dict]) -> None:
        """Add a token pattern, whose matches `__call__` gives with `index`."""
        written = written_out(pattern, self.MAX_PHRASES)
        if written is None:
            self.matcher.add(str(index), [pattern])
            return
        # each phrase as the LOWER hashes of its words, as spaCy's own unpickling adds them: making a Doc of each
        # of the 8,269 phrases of the ConText cues took 0.6 s of loading `clinical_context` (AVX2); now 0.07 s
        for fixed, phrases in written.items():
            self.add_phrases(index, fixed, [[self.vocab.strings.add(w) for w in words] for words in phrases])

    def add_phrases(self, index: int, fixed: tuple[bool, ...], phrases: list) -> None:
        """Add phrases matched with `index`, whose words flagged in `fixed` may not start a sentence.

        phrases (List[Union[Doc, List[int]]]): Docs, or the LOWER hashes of their words.
        """
        key = f"{index}|{''.join('1' if f else '0' for f in fixed)}"
        self.keys[self.vocab.strings.add(key)] = (index, fixed)
        self.phrases.add(key, phrases)

    def __call__(self, doc: Doc) -> list[tuple[int, int, int]]:
        """The matches in `doc`, every one as spaCy's Matcher gives them: (index, start, end), in the order of the
        doc (by start, end, index)."""
        strings = doc.vocab.strings
        matches = [(int(strings[key]), start, end) for key, start, end in self.matcher(doc)]
        for key, start, end in self.phrases(doc):
            index, fixed = self.keys[key]
            if not any(f and doc[start + i].is_sent_start for i, f in enumerate(fixed)):
                matches.append((index, start, end))
        matches.sort(key=lambda match: (match[1], match[2], match[0]))
        return matches


class CueMatcher:
    """The cues of ConText rules in a doc, as medspaCy's matcher finds them (by a `PatternMatcher`): the longest of
    overlapping matches.

    vocab (Vocab): The pipeline's vocab.
    tokenizer (Callable[[str], Doc]): Tokenizes the literals of rules without a pattern (medspaCy's way).
    rules (List[ConTextRule]): The rules, in order.
    """

    def __init__(self, vocab: Vocab, tokenizer: Callable[[str], Doc], rules: list) -> None:
        from medspacy.common.util import prune_overlapping_matches

        self.prune = prune_overlapping_matches
        self.rules = list(rules)
        self.patterns = PatternMatcher(vocab)
        for index, rule in enumerate(self.rules):
            if rule.on_match is not None or isinstance(rule.pattern, str):
                raise ConceptNormError(Errors.E625.format(rule=rule.literal))
            if rule.pattern is None:
                self.patterns.add_phrases(index, (), [tokenizer(rule.literal.lower())])
            else:
                self.patterns.add(index, rule.pattern)

    def __call__(self, doc: Doc) -> list[tuple[object, int, int]]:
        """The cues found in `doc`: (rule, start, end) in the order of the doc."""
        return [(self.rules[index], start, end) for index, start, end in self.prune(self.patterns(doc))]


def written_out(pattern: list[dict], most: int) -> dict[tuple[bool, ...], list[tuple[str, ...]]] | None:
    """The phrases (word tuples) that a token pattern of lower-case words matches, grouped by which of their words
    may not start a sentence; None for a pattern with other attributes or operators, or more than `most` phrases.

    pattern (List[dict]): A spaCy token pattern.
    most (int): The most phrases written out.
    """
    phrases: list[tuple[tuple[str, ...], tuple[bool, ...]]] = [((), ())]
    for token in pattern:
        value, op = token.get("LOWER"), token.get("OP")
        if set(token) - {"LOWER", "OP", "IS_SENT_START"} or op not in (None, "?") or token.get("IS_SENT_START", False):
            return None
        words = [value] if isinstance(value, str) else value.get("IN") if isinstance(value, dict) else None
        if not words or set(value if isinstance(value, dict) else {}) - {"IN"}:
            return None
        fixed = "IS_SENT_START" in token
        grown = [(p + (w.lower(),), f + (fixed,)) for p, f in phrases for w in words]
        phrases = grown + (phrases if op == "?" else [])
        if len(phrases) > most:
            return None
    grouped: dict[tuple[bool, ...], list[tuple[str, ...]]] = {}
    for words, fixed in phrases:
        if words:
            grouped.setdefault(fixed, []).append(words)
    return grouped


INSTALL = 'pip install "spacy-conceptnorm[assertion]" && pip install --no-deps medspacy==1.3.1 PyRuSH==1.0.13'
# What a saved pipeline with `clinical_context` declares in its meta.json, and so `spacy package` in its wheel's
# requirements. medspaCy and PyRuSH declare spacy<3.8 on Python < 3.12: there they are left out (a wheel that pulled
# them in would downgrade spaCy), and loading without them raises E620 with the `--no-deps` command of INSTALL.
MEDSPACY_REQUIREMENTS = ('medspacy==1.3.1; python_version >= "3.12"', 'PyRuSH==1.0.13; python_version >= "3.12"')

if not Span.has_extension("assertion"):
    Span.set_extension("assertion", default=None)


def assertion_status(ent: Span) -> str:
    """The entity's status in one word: the first of negated, family, hypothetical, uncertain, historical whose
    medspaCy flag is set (`ent._.is_negated`, ...), else affirmed."""
    for status, attr in FLAGS:
        if Span.has_extension(attr) and ent._.get(attr):
            return status
    return AFFIRMED


def medspacy_available() -> bool:
    """Whether medspaCy's components can be imported (the `assertion` extra and medspaCy are installed)."""
    try:
        import medspacy  # noqa: F401
    except ImportError:
        return False
    return True


def add_clinical_context(nlp: Language, required: bool = False) -> bool:
    """Add a `clinical_context` last where the pipeline has none and medspaCy is installed, and declare what it
    needs in the pipeline's meta (`requirements`, which `spacy package` writes into the wheel).

    nlp (Language): The pipeline.
    required (bool): Add it even without medspaCy, so that its absence raises E620 with the install commands.
    RETURNS (bool): Whether the pipeline now has a `clinical_context`.
    """
    if "clinical_context" not in nlp.pipe_names and (required or medspacy_available()):
        nlp.add_pipe("clinical_context")
    if "clinical_context" not in nlp.pipe_names:
        return False
    declared = nlp.meta.setdefault("requirements", [])
    names = {requirement_name(r) for r in declared}
    ours = (f"{about.__title__}[assertion]>={about.__version__}", *MEDSPACY_REQUIREMENTS)
    declared.extend(r for r in ours if requirement_name(r) not in names)
    return True


def requirement_name(requirement: str) -> str:
    """The distribution a requirement names ("medspacy" of 'medspacy==1.3.1; python_version >= "3.12"')."""
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")


MEDSPACY_DECODERS = ("modifiers", "modifier", "context_graph", "section")


def spans_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether the token spans `a` and `b` ((start, end)) overlap."""
    return a[0] < b[1] and b[0] < a[1]


def fix_medspacy_scope_overlap() -> None:
    """Make ConText's modifiers see that two token spans overlap when one holds the other. medspaCy 1.3.1's
    `tuple_overlaps` says they do not, so that once a cue's scope has been cut by one terminator, a second one
    whose scope is the whole sentence is ignored: in "She complains of photophobia; meningitis cannot be excluded",
    "cannot be excluded" reached back past ";" to the photophobia."""
    from medspacy.context import context_modifier

    context_modifier.tuple_overlaps = spans_overlap


def strict_medspacy_decoders() -> None:
    """Make medspaCy's msgpack decoders decode only what its encoders wrote. They are registered process-wide
    with srsly and take any dict with a "modifier", "modifiers", "section" or "context_graph" key for one of
    theirs: loading a pipeline whose files hold such a dict (the word "modifier" in the TF-IDF vocabulary of the
    lexical index) fails once medspaCy is imported. Here a dict is theirs only if that key is its only key and
    holds a dict or a list, as their encoders write it."""
    for name, decoder in list(srsly.msgpack_decoders.get_all().items()):
        if name in MEDSPACY_DECODERS and not getattr(decoder, "strict", False):
            srsly.msgpack_decoders.register(name, func=_strict(name, decoder))


def _strict(name: str, decoder: Callable) -> Callable:
    def strict(obj: object, chain: Callable | None = None) -> object:
        if isinstance(obj, dict) and len(obj) == 1 and isinstance(obj.get(name), (dict, list)):
            return decoder(obj, chain=chain)
        return obj if chain is None else chain(obj)

    strict.strict = True
    return strict


def serializable(doc: Doc) -> None:
    """Drop what medspaCy sets but cannot write and read back, so that the doc can be serialized (as docs from
    `nlp.pipe(n_process=2)` and in a DocBin are): its ConText graph, which holds spans, and the text before the
    first heading as a section without a rule, whose decoding fails. `ent._.modifiers` and the sections of the
    headings stay; a token before the first heading has no section, and so a `section_category` of None, as
    before."""
    doc._.context_graph = None
    if Doc.has_extension("sections") and any(section.rule is None for section in doc._.sections or []):
        doc._.sections = [section for section in doc._.sections if section.rule is not None]
        for token in doc:
            if token._.section is not None and token._.section.rule is None:
                token._.section = None


def is_list_marker(token: Token, after: Token) -> bool:
    """Whether `token` marks an item of a list: "-", "*", "•", or a number of one or two digits before "." or ")"."""
    numbered = token.is_digit and len(token) <= 2 and after.text in (".", ")")
    return token.text in ("-", "*", "\u2022") or numbered or (token.text == "#" and after.is_digit)


def set_sentence_starts(doc: Doc, starts: list[int]) -> None:
    """Set the sentence boundaries of `doc` (every token's `is_sent_start`) from the character offsets where its
    sentences start: a sentence starts at the first token at or after each offset, and nowhere else."""
    if not len(doc):
        return
    idx = doc.to_array(IDX)
    first = numpy.searchsorted(idx, numpy.asarray(starts, dtype=idx.dtype))
    values = numpy.full(len(doc), -1, dtype="int64")
    values[first[first < len(doc)]] = 1
    values[0] = 1
    doc.from_array([SENT_START], values.view("uint64").reshape(-1, 1))


def split_rules_sentences(doc: Doc) -> Doc:
    """Split the sentences of `doc` with `text.sentences.sentence_starts`, which finds PyRuSH's boundaries."""
    set_sentence_starts(doc, sentence_starts(doc.text))
    return doc


def split_report_sentences(doc: Doc) -> None:
    """Start a sentence where PyRuSH misses one in a report's layout:

    - after a full stop that ends a word of three letters or more and is followed by a word in capitals: PyRuSH
      keeps "FAT STRANDING. NO ABSCESS. SCATTERED DIVERTICULOSIS" of an ALL-CAPS report as one sentence, so that
      "NO" would reach the findings after it;
    - at a list marker ("2.", "-") that begins a line or follows a full stop: an item of a numbered or bulleted
      list is a sentence of its own, so that "... LESS LIKELY.\n2. VASOGENIC EDEMA" does not make the edema
      uncertain.
    """
    for token in doc[1:-1]:
        before, after = doc[token.i - 1], doc[token.i + 1]
        if token.text == "." and token.whitespace_ and before.is_alpha and len(before) >= 3:
            if after.is_alpha and after.is_upper:
                after.is_sent_start = True
        elif is_list_marker(token, after):
            line_start = before.is_space and "\n" in before.text
            if line_start or (before.text == "." and before.whitespace_):
                token.is_sent_start = True


def set_section_attributes(doc: Doc, mapping: dict[str, dict[str, bool]]) -> None:
    """Give the entities under a heading its section's assertion attributes (`mapping`: category -> attributes,
    medspaCy's `DEFAULT_ATTRS`), up to the first blank line below the heading: a note often goes on about the
    patient in a new paragraph without a heading ("FAMILY HISTORY: Mother with X.\n\nToday she complains of Y")."""
    blank_lines = [t.i for t in doc if t.is_space and t.text.count("\n") > 1]  # one scan of the doc, not one an entity
    for ent in doc.ents:
        section = ent._.section
        if section is None or section.category not in mapping:
            continue
        body = section.body_start  # the blank lines between a heading and its first line do not end it
        while body < ent.start and doc[body].is_space:
            body += 1
        first_blank = bisect_left(blank_lines, body)
        if first_blank == len(blank_lines) or blank_lines[first_blank] >= ent.start:
            for attr, value in mapping[section.category].items():
                ent._.set(attr, value)


def context_rules(default_path: str) -> list:
    """medspaCy's default ConText rules (read from `default_path`), less `REPLACED_CUES`, and `EXTRA_CUES`."""
    from medspacy.context import ConTextRule

    extra = [
        ConTextRule(w, cat, pattern=token_pattern(w), direction=d, **(options[0] if options else {}))
        for cat, d, w, *options in EXTRA_CUES
    ]
    return [r for r in ConTextRule.from_json(default_path) if r.literal not in REPLACED_CUES] + extra


def section_rules(default_path: str) -> list:
    """medspaCy's default section rules (read from `default_path`) and `EXTRA_SECTIONS`, ours replacing a
    default rule with the same heading, and each heading with a colon also without it ("FAMILY HISTORY" on a line
    of its own, as many notes write their headings; `is_heading` tells where such a heading counts)."""
    from medspacy.section_detection import SectionRule

    extra = [SectionRule(literal, category) for literal, category in EXTRA_SECTIONS]
    ours = {rule.literal for rule in extra}
    rules = [r for r in SectionRule.from_json(default_path) if r.literal not in ours] + extra
    seen = {rule.literal.lower() for rule in rules}
    bare = {r.literal[:-1].strip(): r.category for r in rules if r.literal.endswith(":")}
    return rules + [SectionRule(literal, category) for literal, category in bare.items() if literal.lower() not in seen]


def is_heading(doc: Doc, start: int, end: int) -> bool:
    """Whether the section rule matched at `doc[start:end]` is a heading: one that ends with a colon anywhere (a note
    exported with its line breaks flattened keeps its "FAMILY HISTORY:"), one without only where it starts a line
    and either ends the line, is followed by " -" ("PMHx - Asthma") or is written in capitals. medspaCy's rules
    match case-blind, so that "Allergies" and "Plan" would otherwise split "She denies any allergies" and start a
    section in the middle of a sentence."""
    if doc[end - 1].text == ":" or (end < len(doc) and doc[end].text == ":"):
        return True
    starts_line = start == 0 or "\n" in doc[start - 1].text or "\n" in doc[start - 1].whitespace_
    if starts_line and end < len(doc) and doc[end].text == "-":
        return True
    ends_line = end == len(doc) or "\n" in doc[end].text or "\n" in doc[end - 1].whitespace_
    return starts_line and (ends_line or doc[start:end].text.isupper())


class ClinicalContext:
    """Set medspaCy's assertion attributes and `ent._.assertion` on every entity (see the module docstring)."""

    def __init__(self, nlp: Language, name: str = "clinical_context", *, split_sentences: bool = True,
                 sections: bool = True, sentences: str = "rules") -> None:  # fmt: skip
        """Initialize the component.

        nlp (Language): The pipeline.
        name (str): The component's name.
        split_sentences (bool): Split the sentences (False: keep those a parser or senter earlier in the pipeline
            set; ConText needs sentence boundaries either way).
        sections (bool): Detect the sections and apply their attributes (`ent._.section_category`).
        sentences (str): How to split them: "rules" (default), the compiled rules of `text.sentences`, or "pyrush",
            medspaCy's PyRuSH, which finds the same boundaries but for a few missed ones, some 50 times slower.
        """
        if sentences not in SENTENCES:
            raise ConceptNormError(Errors.E624.format(component=name, value=sentences, choices=", ".join(SENTENCES)))
        try:
            from loguru import logger
            from medspacy.context import ConText
            from medspacy.section_detection import Sectionizer
            from medspacy.section_detection.sectionizer import DEFAULT_ATTRS
            from PyRuSH import PyRuSHSentencizer  # needed either way: medspaCy's own __init__ imports it
        except ImportError as e:
            raise ConceptNormError(Errors.E620.format(component=name, error=e, install=INSTALL)) from None
        strict_medspacy_decoders()
        fix_medspacy_scope_overlap()
        logger.disable("PyRuSH")  # it logs every sentence split at DEBUG level, to stderr by default
        # medspaCy's matchers warn on every doc that their token matcher is empty when all rules are phrases
        warnings.filterwarnings("ignore", message=r"\[W036\]", module=r"medspacy\.")
        self.name = name
        self.split_sentences = split_sentences
        self.sections = sections
        self.sentencizer = None
        if split_sentences:
            pyrush = sentences == "pyrush"
            self.sentencizer = PyRuSHSentencizer(nlp, name=f"{name}.pyrush") if pyrush else split_rules_sentences
        self.sectionizer = None
        if sections:
            # a heading starts a sentence (PyRuSH joins "2. GOUT\nFAMILY HISTORY: ..." for want of a full stop);
            # the sections' attributes are set by `set_section_attributes`, each only up to a blank line
            self.sectionizer = Sectionizer(
                nlp, name=f"{name}.sectionizer", rules=None, apply_sentence_boundary=split_sentences, span_attrs=None,
                require_start_line=True,
            )  # fmt: skip
            # its filter of the matches that start a line, where `require_start_line` applies it: `is_heading`
            self.sectionizer.filter_start_lines = lambda doc, matches: [m for m in matches if is_heading(doc, *m[1:3])]
            self.section_attributes = {**DEFAULT_ATTRS, **EXTRA_SECTION_ATTRIBUTES}
            self.sectionizer.add(section_rules(self.sectionizer.DEFAULT_RULES_FILEPATH))
        self.context = ConText(nlp, name=f"{name}.context", rules=None, terminating_types=TERMINATING_TYPES)
        self.context.context_attributes_mapping = {**self.context.context_attributes_mapping, **EXTRA_CATEGORIES}
        self.context.add(context_rules(self.context.DEFAULT_RULES_FILEPATH))  # the rules get its settings
        self.cues = CueMatcher(nlp.vocab, nlp.tokenizer, self.context.rules)

    def __call__(self, doc: Doc) -> Doc:
        """Apply the component.

        doc (Doc): The document, its entities linked.
        RETURNS (Doc): The same doc, with sentence boundaries (split_sentences) and the assertion attributes set.
        """
        if self.sentencizer is not None:
            doc = self.sentencizer(doc)
            split_report_sentences(doc)
        elif not doc.has_annotation("SENT_START"):
            raise ConceptNormError(Errors.E621.format(component=self.name))
        if self.sectionizer is not None:
            doc = self.sectionizer(doc)
            set_section_attributes(doc, self.section_attributes)
        self.apply_context(doc)
        serializable(doc)
        for ent in doc.ents:
            ent._.assertion = assertion_status(ent)
        return doc

    def apply_context(self, doc: Doc) -> None:
        """Apply medspaCy's ConText to the entities of `doc`: its `ConText.__call__` (medspaCy 1.3.1) with the cues
        found by `CueMatcher`."""
        from medspacy.context import ConTextGraph, ConTextModifier

        context = self.context
        graph = ConTextGraph(prune_on_modifier_overlap=context.prune_on_target_overlap)  # sic, as ConText does
        graph.targets = doc.ents
        graph.modifiers = [
            ConTextModifier(rule, start, end, doc, max_scope=context.max_scope) for rule, start, end in self.cues(doc)
        ]
        graph.update_scopes()
        graph.apply_modifiers()
        # a negation does not modify an entity that holds its own (`holds_negation`), nor a negation or an
        # uncertainty one that other words keep apart from it (`gap_words`)
        in_entities = {i for ent in doc.ents for i in range(ent.start, ent.end)}
        edges = [
            (target, modifier)
            for target, modifier in graph.edges
            if not (modifier.category == "NEGATED_EXISTENCE" and holds_negation(target))
            and not (modifier.category in GAP_LIMITED and gap_words(target, modifier, in_entities) > MAX_GAP_WORDS)
        ]
        for target, modifier in edges:
            target._.modifiers += (modifier,)
        context.set_context_attributes(edges)


def gap_words(target: Span, modifier: object, in_entities: set[int]) -> int:
    """The words between a cue and an entity it modifies that are neither an entity's nor a list's (a punctuation
    mark, "or", "and", "any": LIST_WORDS). A negation or an uncertainty reaches over a list of conditions ("denies
    fever, chills, night sweats or weight loss"), not over the other words of a nursing note's run-on line ("not
    tolerating bipap well per resp at 2am and then became lethargic": the lethargy is no negated finding).

    target (Span): The entity.
    modifier (ConTextModifier): The cue.
    in_entities (Set[int]): The indices of the doc's tokens that are in an entity.
    RETURNS (int): How many words between them belong to neither.
    """
    doc = target.doc
    start, end = modifier.modifier_span
    gap = range(end, target.start) if target.start >= end else range(target.end, start)
    return sum(not (i in in_entities or doc[i].is_punct or doc[i].is_space or doc[i].lower_ in LIST_WORDS) for i in gap)


def holds_negation(ent: Span) -> bool:
    """Whether the entity's own words say a function is absent ("unable to void", "does not follow commands", "no
    gag reflex"): the absence is the finding, which a negation before it ("no movement of extremities, does not
    follow commands") does not undo."""
    return any(token.lower_ in OWN_NEGATIONS for token in ent)


@Language.factory(
    "clinical_context",
    default_config={"split_sentences": True, "sections": True, "sentences": "rules"},
    assigns=["token.is_sent_start", "span._.assertion", "span._.is_negated", "span._.section_category"],
)
def make_clinical_context(
    nlp: Language, name: str, split_sentences: bool, sections: bool, sentences: Literal["rules", "pyrush"]
) -> ClinicalContext:
    """Create a `clinical_context` component (the `assertion` extra and medspaCy are needed)."""
    return ClinicalContext(nlp, name, split_sentences=split_sentences, sections=sections, sentences=sentences)
