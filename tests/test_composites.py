"""Tests of the composite mention splitter. The mentions marked NCBI are CompositeMentions of the NCBI-disease
corpus, copied verbatim."""

import pytest
import spacy
from spacy.tokens import DocBin, Span

from spacy_conceptnorm.errors import ConceptNormError
from spacy_conceptnorm.pipeline.composite_splitter import CompositeSplitter
from spacy_conceptnorm.text.composites import split_composite

SPLITS = [
    # shared head (NCBI)
    ("breast and ovarian cancer", ["breast cancer", "ovarian cancer"]),
    ("breast or ovarian cancer", ["breast cancer", "ovarian cancer"]),
    ("breast and/or ovarian cancer", ["breast cancer", "ovarian cancer"]),
    ("Duchenne and Becker muscular dystrophy", ["Duchenne muscular dystrophy", "Becker muscular dystrophy"]),
    ("male and female breast cancer", ["male breast cancer", "female breast cancer"]),
    ("syndromic and non-syndromic hearing loss", ["syndromic hearing loss", "non-syndromic hearing loss"]),
    ("hereditary and non hereditary retinoblastoma", ["hereditary retinoblastoma", "non hereditary retinoblastoma"]),
    ("retinal and the pineal tumours", ["retinal tumours", "pineal tumours"]),
    ("partial or complete deficiency of Hmgic", ["partial deficiency of Hmgic", "complete deficiency of Hmgic"]),
    # lower-case words before the first conjunct are shared (NCBI)
    ("sporadic breast and ovarian cancers", ["sporadic breast cancers", "sporadic ovarian cancers"]),
    ("progressive gait and limb ataxia", ["progressive gait ataxia", "progressive limb ataxia"]),
    ("stage II and III colorectal carcinomas", ["stage II colorectal carcinomas", "stage III colorectal carcinomas"]),
    # parallel conjuncts
    ("type 1 and type 2 diabetes", ["type 1 diabetes", "type 2 diabetes"]),
    ("subtotal C6 and complete C6 deficiency", ["subtotal C6 deficiency", "complete C6 deficiency"]),  # NCBI
    # lists; a plural head is kept as written (NCBI)
    (
        "colorectal, endometrial, and ovarian cancers",
        ["colorectal cancers", "endometrial cancers", "ovarian cancers"],
    ),
    (
        "Saethre-Chotzen, Crouzon, and Pfeiffer syndromes",
        ["Saethre-Chotzen syndromes", "Crouzon syndromes", "Pfeiffer syndromes"],
    ),
    (
        "pancreatic, basal cell, colonic, breast, and cervical carcinomas",
        [
            "pancreatic carcinomas",
            "basal cell carcinomas",
            "colonic carcinomas",
            "breast carcinomas",
            "cervical carcinomas",
        ],
    ),
    ("colorectal, or other, cancers", ["colorectal cancers", "other cancers"]),
    ("A, B, and C tumors", ["A tumors", "B tumors", "C tumors"]),
    # slashes (NCBI)
    ("Duchenne/Becker muscular dystrophy", ["Duchenne muscular dystrophy", "Becker muscular dystrophy"]),
    ("cleft lip/palate", ["cleft lip", "cleft palate"]),
    ("C6/C7 deficiency", ["C6 deficiency", "C7 deficiency"]),
    # nothing after the last conjunct: the words before the first one are shared (NCBI)
    ("colorectal adenomas and carcinoma", ["colorectal adenomas", "colorectal carcinoma"]),
    ("spinocerebellar ataxias 1 and 2", ["spinocerebellar ataxias 1", "spinocerebellar ataxias 2"]),
    ("Wilms tumor and aniridia", ["Wilms tumor", "aniridia"]),  # ... unless they are a name
    # head first (NCBI, but "ovary")
    ("cancer of the breast and ovary", ["cancer of the breast", "cancer of the ovary"]),
    ("clefts to the lip and/or palate", ["clefts to the lip", "clefts to the palate"]),
    (
        "cysts in the kidney, pancreas, and epididymis",
        ["cysts in the kidney", "cysts in the pancreas", "cysts in the epididymis"],
    ),
    (
        "Combined genetic deficiency of C6 and C7",
        ["Combined genetic deficiency of C6", "Combined genetic deficiency of C7"],
    ),
    (
        "Haploinsufficiency of the transcription factors FOXC1 and FOXC2",
        [
            "Haploinsufficiency of the transcription factors FOXC1",
            "Haploinsufficiency of the transcription factors FOXC2",
        ],
    ),
    # parts are split again (NCBI)
    (
        "aplasia or hypoplasia of the thymus and parathyroid glands",
        [
            "aplasia of the thymus",
            "hypoplasia of the thymus",
            "aplasia of the parathyroid glands",
            "hypoplasia of the parathyroid glands",
        ],
    ),
    # parenthesis and suspended hyphen (NCBI)
    ("complement deficiencies (C2 and C7)", ["complement deficiencies C2", "complement deficiencies C7"]),
    (
        "RCC- and von Hippel-Lindau disease-associated tumors",
        ["RCC-associated tumors", "von Hippel-Lindau disease-associated tumors"],
    ),
    # clinical-trial interventions
    ("combination of ribociclib and capecitabine", ["ribociclib", "capecitabine"]),
    ("combination of ribociclib + capecitabine", ["ribociclib", "capecitabine"]),
    ("ribociclib plus letrozole", ["ribociclib", "letrozole"]),
    ("placebo vs. aspirin", ["placebo", "aspirin"]),
    ("sorafenib versus placebo", ["sorafenib", "placebo"]),
    ("cisplatin in combination with gemcitabine", ["cisplatin", "gemcitabine"]),
    ("Adjuvanted influenza vaccine combine with CpG7909", ["Adjuvanted influenza vaccine", "CpG7909"]),
    ("epoetin alfa or beta", ["epoetin alfa", "epoetin beta"]),
]

UNCHANGED = [
    "hereditary nonpolyposis colorectal cancer",
    "Wiskott-Aldrich syndrome",
    "ataxia-telangiectasia",
    "Smith-Lemli-Opitz syndrome",
    "breast-ovarian cancer",  # NCBI
    "dystonias 1-12",  # NCBI
    "Classic (complete) lecithin  cholesterol acyltransferase (LCAT) deficiency",  # NCBI
    "Colorectal Neoplasms, Hereditary Nonpolyposis",
    "DNA/RNA",
    "HIV/AIDS",
    "CD4+ T cell deficiency",
    "severe combined immunodeficiency",
    "pre- and postoperative pain",  # unknown completion of "pre-"
    "and",
    "cancer and",
    "",
]


@pytest.mark.parametrize("text,parts", SPLITS)
def test_split_composite(text, parts):
    assert split_composite(text) == parts


@pytest.mark.parametrize("text", UNCHANGED)
def test_split_composite_unchanged(text):
    assert split_composite(text) == [text]


def test_protected_names():
    assert split_composite("hand, foot and mouth disease") == ["hand, foot and mouth disease"]
    assert split_composite("Hand, Foot and Mouth Disease") == ["Hand, Foot and Mouth Disease"]
    assert split_composite("hand, foot and mouth disease", protected=[]) == [
        "hand disease",
        "foot disease",
        "mouth disease",
    ]
    # A protected name inside a mention is one conjunct.
    assert split_composite("hand, foot and mouth disease and herpangina") == [
        "hand, foot and mouth disease",
        "herpangina",
    ]
    assert split_composite("acute graft versus host disease") == ["acute graft versus host disease"]
    assert split_composite("Wilms tumor and aniridia", protected=["wilms tumor and aniridia"]) == [
        "Wilms tumor and aniridia"
    ]


def test_known_names():
    known = {"hereditary breast and ovarian cancer", "breast neoplasms", "squamous cell neoplasms"}

    def is_known(text):
        return text.lower() in known

    assert split_composite("Hereditary breast and ovarian cancer", is_known_name=is_known) == [
        "Hereditary breast and ovarian cancer"
    ]
    # Rules alone take a one-word last conjunct; the knowledge base shows "squamous cell" is one.
    assert split_composite("breast and squamous cell neoplasms") == ["breast cell neoplasms", "squamous cell neoplasms"]
    assert split_composite("breast and squamous cell neoplasms", is_known_name=is_known) == [
        "breast neoplasms",
        "squamous cell neoplasms",
    ]


def test_split_interventions_off():
    assert split_composite("ribociclib plus letrozole", split_interventions=False) == ["ribociclib plus letrozole"]
    assert split_composite("A + B", split_interventions=False) == ["A + B"]


def test_split_composite_bad_arguments():
    with pytest.raises(ConceptNormError):
        split_composite(None)
    with pytest.raises(ConceptNormError):
        split_composite("breast and ovarian cancer", protected="hand, foot and mouth disease")
    with pytest.raises(ConceptNormError):
        split_composite("breast and ovarian cancer", protected=[" "])


def make_doc(nlp, text, ents):
    """A doc of `text` with entities given as (mention, label); each mention occurs once in the text."""
    doc = nlp.make_doc(text)
    spans = [doc.char_span(text.index(mention), text.index(mention) + len(mention), label) for mention, label in ents]
    doc.ents = spans
    return doc


TEXT = "Germline BRCA1 mutations cause breast and ovarian cancer but not Wiskott-Aldrich syndrome or C6/C7 deficiency."
ENTS = [("breast and ovarian cancer", "Disease"), ("Wiskott-Aldrich syndrome", "Disease"), ("C6/C7 deficiency", "Rare")]


def as_list(parts):
    return None if parts is None else list(parts)


@pytest.fixture
def nlp():
    nlp = spacy.blank("en")
    nlp.add_pipe("composite_splitter")
    return nlp


def test_component(nlp):
    doc = make_doc(nlp, TEXT, ENTS)
    tokens = [t.text for t in doc]
    ents = [(e.start, e.end, e.label_) for e in doc.ents]
    doc = nlp(doc)
    assert [e._.composite_parts for e in doc.ents] == [
        ["breast cancer", "ovarian cancer"],
        None,
        ["C6 deficiency", "C7 deficiency"],
    ]
    assert [t.text for t in doc] == tokens
    assert [(e.start, e.end, e.label_) for e in doc.ents] == ents


def test_component_labels():
    nlp = spacy.blank("en")
    splitter = nlp.add_pipe("composite_splitter", config={"labels": ["Disease"]})
    assert splitter.labels == ("Disease",)
    doc = nlp(make_doc(nlp, TEXT, ENTS))
    assert doc.ents[0]._.composite_parts == ["breast cancer", "ovarian cancer"]
    assert doc.ents[2]._.composite_parts is None


def test_component_known_names(nlp):
    nlp.config["initialize"]["components"]["composite_splitter"] = {"known_names": ["Breast and Ovarian Cancer"]}
    nlp.initialize()
    assert nlp.get_pipe("composite_splitter").known_names == {"breast and ovarian cancer"}
    doc = nlp(make_doc(nlp, TEXT, ENTS))
    assert doc.ents[0]._.composite_parts is None
    nlp.get_pipe("composite_splitter").initialize()  # forgets the names
    assert nlp(make_doc(nlp, TEXT, ENTS)).ents[0]._.composite_parts == ["breast cancer", "ovarian cancer"]


@pytest.fixture
def long_form_extension():
    """Register `span._.long_form` as the abbreviation resolver does, restoring any existing one after."""
    saved = Span.get_extension("long_form")
    Span.set_extension("long_form", default=None, force=True)
    yield
    Span.remove_extension("long_form")
    if saved is not None:
        default, method, getter, setter = saved
        Span.set_extension("long_form", default=default, method=method, getter=getter, setter=setter)


def test_component_splits_long_form(nlp, long_form_extension):
    doc = make_doc(nlp, "Risk of HBOC in carriers.", [("HBOC", "Disease")])
    doc.ents[0]._.long_form = "hereditary breast and ovarian cancer"
    doc = nlp(doc)
    assert doc.ents[0]._.composite_parts == ["hereditary breast cancer", "hereditary ovarian cancer"]


def test_docbin_round_trip(nlp):
    doc = nlp(make_doc(nlp, TEXT, ENTS))
    data = DocBin(docs=[doc], store_user_data=True).to_bytes()
    (loaded,) = DocBin(store_user_data=True).from_bytes(data).get_docs(nlp.vocab)
    # msgpack gives the lists back as tuples
    assert [as_list(e._.composite_parts) for e in loaded.ents] == [e._.composite_parts for e in doc.ents]


def test_multiprocessing(nlp):
    docs = [make_doc(nlp, TEXT, ENTS) for _ in range(4)]
    expected = [[e._.composite_parts for e in doc.ents] for doc in nlp.pipe(docs)]
    docs = [make_doc(nlp, TEXT, ENTS) for _ in range(4)]
    assert [[as_list(e._.composite_parts) for e in doc.ents] for doc in nlp.pipe(docs, n_process=2)] == expected


def test_to_disk_from_disk(tmp_path):
    nlp = spacy.blank("en")
    splitter = nlp.add_pipe(
        "composite_splitter", config={"protected": ["Wilms tumor and aniridia"], "split_interventions": False}
    )
    nlp.initialize()
    splitter.set_known_names(["Hereditary Breast and Ovarian Cancer"])
    nlp.to_disk(tmp_path / "pipeline")
    assert not list((tmp_path / "pipeline" / "composite_splitter").glob("*.tmp"))
    loaded = spacy.load(tmp_path / "pipeline")
    restored = loaded.get_pipe("composite_splitter")
    assert restored.protected == ("Wilms tumor and aniridia",)
    assert restored.known_names == {"hereditary breast and ovarian cancer"}
    assert restored.split_interventions is False
    for text in ["Wilms tumor and aniridia", "hereditary breast and ovarian cancer", "A plus B", "C6/C7 deficiency"]:
        assert restored.split(text) == splitter.split(text)
    assert restored.split("C6/C7 deficiency") == ["C6 deficiency", "C7 deficiency"]


def test_to_bytes_from_bytes(nlp):
    splitter = nlp.get_pipe("composite_splitter")
    splitter.set_known_names(["breast and ovarian cancer"])
    other = CompositeSplitter(nlp.vocab, protected=[]).from_bytes(splitter.to_bytes())
    assert other.known_names == splitter.known_names
    assert other.protected == splitter.protected


def test_from_disk_corrupt(nlp, tmp_path):
    (tmp_path / "names.json").write_text('{"protected": "not a list", "known_names": []}')
    with pytest.raises(ConceptNormError):
        nlp.get_pipe("composite_splitter").from_disk(tmp_path)
    with pytest.raises(ConceptNormError):
        nlp.get_pipe("composite_splitter").from_disk(tmp_path / "missing")
    (tmp_path / "names.json").write_text('{"protected": [], "known_names": []}')  # no sha256
    with pytest.raises(ConceptNormError, match=r"E503.*sha256"):
        nlp.get_pipe("composite_splitter").from_disk(tmp_path)


def test_a_directory_in_place_of_the_saved_names_is_named(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("composite_splitter")
    nlp.initialize()
    nlp.to_disk(tmp_path / "pipeline")
    names = tmp_path / "pipeline" / "composite_splitter" / "names.json"
    names.unlink()
    names.mkdir()
    with pytest.raises(ConceptNormError, match=r"\[E503\]") as e:
        spacy.load(tmp_path / "pipeline")
    assert str(names) in str(e.value)


@pytest.mark.parametrize(
    "config",
    [{"labels": ["Disease", ""]}, {"protected": ["hand, foot and mouth disease", "  "]}],
)
def test_bad_config(config):
    nlp = spacy.blank("en")
    with pytest.raises(ConceptNormError):
        nlp.add_pipe("composite_splitter", config=config)


def test_bad_arguments():
    vocab = spacy.blank("en").vocab
    with pytest.raises(ConceptNormError):
        CompositeSplitter(vocab, labels="Disease")
    with pytest.raises(ConceptNormError):
        CompositeSplitter(vocab, split_interventions="yes")
    with pytest.raises(ConceptNormError):
        CompositeSplitter(vocab).initialize(known_names=["breast cancer", None])


def test_doc_without_entities_is_left_alone(nlp):
    text = "Germline mutations cause breast and ovarian cancer."
    doc = nlp(text)  # a composite in the text, but no entity
    assert doc.ents == () and [t.text for t in doc] == [t.text for t in nlp.make_doc(text)]
    span = doc[3:7]
    assert span.text == "breast and ovarian cancer" and span._.composite_parts is None  # only entities are split
    doc.ents = [Span(doc, 3, 7, "Disease")]
    assert nlp.get_pipe("composite_splitter")(doc).ents[0]._.composite_parts == ["breast cancer", "ovarian cancer"]
