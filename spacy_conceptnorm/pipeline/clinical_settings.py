"""The settings for clinical notes: what `assemble --clinical` and `evaluate-assertion --clinical-recall` turn on.

A pipeline trained and calibrated on PubMed abstracts misses conditions that clinical notes name plainly. The
`clinical_abbreviations` component (undefined clinical abbreviations: "CHF", "SOB") changes nothing on abstracts
and is in the pipeline of configs/pipeline.cfg; these settings add it where a pipeline lacks it, and add
`clinical_findings` (the signs and symptoms notes name with words no KB name is: "murmurs", "JVD"). Three settings
of the other components recover more; each changes what the pipeline finds on abstracts, so none is on by default
(docs/clinical.md gives their effect on clinical notes and on NCBI-disease):

- `dictionary_matcher` `merge = "names"`: a recognizer entity that holds KB names and is not one itself gives way
  to them ("complaints of SHORTNESS OF BREATH" -> "SHORTNESS OF BREATH");
- `concept_normalizer` `long_form = "long"`: an abbreviation is linked by its long form alone ("DM2" -> type 2
  diabetes mellitus, not the myotonic dystrophy that "DM2" also names);
- `link_filter` `keep_exact_names = true`: a KB name found in the text and linked to its concept is kept at the
  recognizer's threshold, not the dictionary's, which was calibrated on abstracts.
"""

from __future__ import annotations

from spacy.language import Language

from ..errors import ConceptNormError, Errors
from . import clinical_abbreviations, clinical_findings  # noqa: F401  (register the factories added here)
from .link_filter import check_confidence

# The `link_filter`'s threshold for the entities of a recognizer trained on clinical notes (`use_recognizer`):
# most signs and symptoms it finds have no MEDIC concept and a low confidence (docs/clinical.md).
CLINICAL_RECOGNIZER_MIN_CONFIDENCE = 0.1

# factory -> setting -> value
CLINICAL_SETTINGS: dict[str, dict[str, object]] = {
    "dictionary_matcher": {"merge": "names"},
    "concept_normalizer": {"long_form": "long"},
    "link_filter": {"keep_exact_names": True},
}


def clinical_overrides(components: dict) -> dict[str, object]:
    """The config overrides ("components.NAME.SETTING": value) that turn the settings on in a pipeline config.

    components (dict): The config's [components] section.
    RETURNS (Dict[str, object]): The overrides, for the components made by the factories of `CLINICAL_SETTINGS`.
    """
    return {
        f"components.{name}.{key}": value
        for name, block in components.items()
        for key, value in CLINICAL_SETTINGS.get(block.get("factory"), {}).items()
    }


def add_clinical_abbreviations(nlp: Language) -> str | None:
    """Add a `clinical_abbreviations` component where the pipeline has none: after its `abbreviation_resolver`,
    else before its `concept_normalizer`, else last.

    nlp (Language): The pipeline.
    RETURNS (Optional[str]): The name of the component added; None if it had one.
    """
    factories = {name: nlp.get_pipe_meta(name).factory for name in nlp.pipe_names}
    if "clinical_abbreviations" in factories.values():
        return None
    after = [name for name, factory in factories.items() if factory == "abbreviation_resolver"]
    before = [name for name, factory in factories.items() if factory == "concept_normalizer"]
    if after:
        return nlp.add_pipe("clinical_abbreviations", after=after[0]).name
    return nlp.add_pipe("clinical_abbreviations", before=before[0] if before else None).name


def add_clinical_findings(nlp: Language) -> str | None:
    """Add a `clinical_findings` component where the pipeline has none: after its `link_filter`, else after its
    `concept_normalizer`, else last (before a `clinical_context`, which reads every entity).

    nlp (Language): The pipeline.
    RETURNS (Optional[str]): The name of the component added; None if it had one.
    """
    factories = {name: nlp.get_pipe_meta(name).factory for name in nlp.pipe_names}
    if "clinical_findings" in factories.values():
        return None
    for factory in ("link_filter", "concept_normalizer"):
        after = [name for name, f in factories.items() if f == factory]
        if after:
            return nlp.add_pipe("clinical_findings", after=after[-1]).name
    before = [name for name, f in factories.items() if f == "clinical_context"]
    return nlp.add_pipe("clinical_findings", before=before[0] if before else None).name


def use_recognizer(nlp: Language, source: Language, min_confidence: float = CLINICAL_RECOGNIZER_MIN_CONFIDENCE) -> None:
    """Replace the pipeline's `ner` by the `ner` of `source`, a pipeline trained to recognize the conditions of
    clinical notes (configs/ner_clinical_trf.cfg), with its own copy of the transformer or tok2vec it listens to;
    its entities are held to `min_confidence` in the `link_filter`, where the pipeline has one.

    nlp (Language): The pipeline, with a component named `ner`.
    source (Language): The trained pipeline, with a `ner` (and the `transformer` or `tok2vec` it listens to).
    min_confidence (float): The `link_filter`'s `min_confidence`.
    """
    for which, pipeline in (("clinical", nlp), ("recognizer's", source)):
        if "ner" not in pipeline.pipe_names:
            raise ConceptNormError(Errors.E627.format(which=which, names=pipeline.pipe_names))
    check_confidence("link_filter", "min_confidence", min_confidence)
    for name in ("transformer", "tok2vec"):
        if name in source.pipe_names and "ner" in getattr(source.get_pipe(name), "listening_components", []):
            source.replace_listeners(name, "ner", ["model.tok2vec"])
    position = nlp.pipe_names.index("ner")
    nlp.remove_pipe("ner")
    following = nlp.pipe_names[position : position + 1]
    nlp.add_pipe("ner", source=source, before=following[0] if following else None)
    for name in nlp.pipe_names:
        if nlp.get_pipe_meta(name).factory == "link_filter":
            set_setting(nlp, name, "min_confidence", min_confidence)


def set_setting(nlp: Language, name: str, key: str, value: object) -> None:
    """Set one setting of a component of a loaded pipeline, in the component (its `cfg` where it keeps it there) and
    in `nlp.config`, so that a pipeline saved after it keeps it.

    nlp (Language): The pipeline.
    name (str): The component's name.
    key (str): The setting, as the component's factory takes it.
    value (object): Its value.
    """
    component = nlp.get_pipe(name)
    if isinstance(getattr(component, "cfg", None), dict) and key in component.cfg:
        component.cfg[key] = value
    else:
        setattr(component, key, value)
    nlp.get_pipe_config(name)[key] = value  # the object `nlp.config` is built from


def use_clinical_settings(nlp: Language) -> list[str]:
    """Turn the settings on in a loaded pipeline (in its components and in `nlp.config`), and add
    `clinical_abbreviations` and `clinical_findings` where it has none (the latter initialized: it looks up its
    concepts in the KB). A pipeline saved after this call keeps them.

    nlp (Language): The pipeline.
    RETURNS (List[str]): The names of the components changed or added.
    """
    abbreviations = add_clinical_abbreviations(nlp)
    findings = add_clinical_findings(nlp)
    if findings:
        nlp.get_pipe(findings).initialize(lambda: [], nlp=nlp)
    changed = [name for name in (abbreviations, findings) if name]
    for name in nlp.pipe_names:
        settings = CLINICAL_SETTINGS.get(nlp.get_pipe_meta(name).factory, {})
        for key, value in settings.items():
            set_setting(nlp, name, key, value)
        if settings:
            changed.append(name)
    return changed
