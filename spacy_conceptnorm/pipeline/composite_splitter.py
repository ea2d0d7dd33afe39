"""Composite splitting: store the parts of composite entity mentions ("breast and ovarian cancer") on the doc.

A composite mention names several concepts at once, and a name encoder cannot embed it close to either: the
`composite_splitter` component splits each entity's mention (its `span._.long_form` where the abbreviation resolver
set one) with `split_composite`, the rules of `text.composites`, and stores the parts as `span._.composite_parts`
for the `concept_normalizer` to link one by one. It leaves `doc.ents` and the tokens untouched. Its state, the
protected and known names, is saved with the pipeline.
"""

import hashlib
import json
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import srsly
from spacy.language import Language
from spacy.pipeline import Pipe
from spacy.tokens import Doc, Span
from spacy.training import Example
from spacy.util import SimpleFrozenList, ensure_path
from spacy.vocab import Vocab

from ..errors import ConceptNormError, Errors, Warnings
from ..io.files import write_json
from ..text.composites import DEFAULT_PROTECTED, split_composite


def _name_key(name: str) -> str:
    """Known names match case-insensitively and whatever the spacing."""
    return " ".join(name.casefold().split())


def _digest(state: dict) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode("utf8")).hexdigest()


def _check_strings(key: str, values: Iterable[str]) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise ConceptNormError(Errors.E501.format(key=key, value=values))
    values = list(values)
    for value in values:
        if not isinstance(value, str) or not value.strip():
            raise ConceptNormError(Errors.E501.format(key=key, value=value))
    return values


def _register_extension() -> None:
    if not Span.has_extension("composite_parts"):
        Span.set_extension("composite_parts", default=None)


_register_extension()


@Language.factory(
    "composite_splitter",
    assigns=["span._.composite_parts"],
    requires=["doc.ents"],
    default_config={"labels": [], "split_interventions": True, "protected": list(DEFAULT_PROTECTED)},
)
def make_composite_splitter(
    nlp: Language, name: str, labels: list[str], split_interventions: bool, protected: list[str]
) -> "CompositeSplitter":
    """Create a CompositeSplitter.

    nlp (Language): The pipeline.
    name (str): The component name.
    labels (List[str]): Labels of the entities to split; empty for all entities.
    split_interventions (bool): Also split drug combinations ("A plus B", "A vs B", "A + B").
    protected (List[str]): Names never split, also inside a mention.
    RETURNS (CompositeSplitter): The component.
    """
    return CompositeSplitter(
        nlp.vocab, name, labels=labels, split_interventions=split_interventions, protected=protected
    )


class CompositeSplitter(Pipe):
    """Store the parts of composite entities ("breast and ovarian cancer") as `span._.composite_parts`.

    For each entity of `doc.ents` (with one of `labels`, if given) the extension is a list of two or more part
    texts when the mention is split, else None. The value lives in `doc.user_data`, so it is kept by
    `DocBin(store_user_data=True)` and `nlp.pipe(n_process=...)`, which give it back as a tuple (msgpack): read
    it as a sequence. An entity whose `span._.long_form` is set (by the abbreviation resolver) is split by its
    long form. `doc.ents` and the tokens do not change.
    """

    def __init__(
        self,
        vocab: Vocab,
        name: str = "composite_splitter",
        *,
        labels: Iterable[str] = SimpleFrozenList(),
        split_interventions: bool = True,
        protected: Iterable[str] = DEFAULT_PROTECTED,
        is_known_name: Callable[[str], bool] | None = None,
    ) -> None:
        """Initialize the component.

        vocab (Vocab): The shared vocabulary.
        name (str): The component name.
        labels (Iterable[str]): Labels of the entities to split; empty for all entities.
        split_interventions (bool): Also split drug combinations ("A plus B", "A vs B", "A + B").
        protected (Iterable[str]): Names never split, also inside a mention.
        is_known_name (Optional[Callable[[str], bool]]): Tells whether a text is a knowledge base name, in
            addition to the names given to `initialize` or `set_known_names`. Not saved with the pipeline.
        """
        if not isinstance(split_interventions, bool):
            raise ConceptNormError(Errors.E502.format(value=split_interventions))
        _register_extension()
        self.vocab = vocab
        self.name = name
        self._labels = tuple(_check_strings("labels", labels))
        self.split_interventions = split_interventions
        self.protected = tuple(_check_strings("protected", protected))
        self.known_names: set[str] = set()
        self.is_known_name = is_known_name

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels of the entities to split; empty for all entities."""
        return self._labels

    def __call__(self, doc: Doc) -> Doc:
        """Set `span._.composite_parts` on the entities of a document.

        doc (Doc): The document, with entities.
        RETURNS (Doc): The same document.
        """
        for ent in doc.ents:
            if self._labels and ent.label_ not in self._labels:
                continue
            try:
                parts = self.split(self._mention_text(ent))
            except Exception as e:  # one odd mention is linked whole rather than stop the batch
                warnings.warn(Warnings.W980.format(text=ent.text[:100], error=f"{type(e).__name__}: {e}"), stacklevel=2)
                parts = []
            ent._.composite_parts = parts if len(parts) >= 2 else None
        return doc

    def split(self, text: str) -> list[str]:
        """Split one mention with this component's settings.

        text (str): The mention.
        RETURNS (List[str]): The parts; `[text]` if there is nothing to split.
        """
        is_known = self._is_known if (self.known_names or self.is_known_name is not None) else None
        return split_composite(
            text, protected=self.protected, is_known_name=is_known, split_interventions=self.split_interventions
        )

    def initialize(
        self,
        get_examples: Callable[[], Iterable[Example]] | None = None,
        *,
        nlp: Language | None = None,
        known_names: Iterable[str] | None = None,
    ) -> None:
        """Initialize the component, replacing the known names.

        get_examples (Optional[Callable[[], Iterable[Example]]]): Not used.
        nlp (Optional[Language]): The pipeline. Not used.
        known_names (Optional[Iterable[str]]): Knowledge base names, never split and preferred as parts.
        """
        self.set_known_names(known_names or [])

    def set_known_names(self, names: Iterable[str]) -> None:
        """Replace the known names (matched case-insensitively).

        names (Iterable[str]): Knowledge base names.
        """
        self.known_names = {_name_key(name) for name in _check_strings("known_names", names)}

    def _is_known(self, text: str) -> bool:
        if _name_key(text) in self.known_names:
            return True
        return self.is_known_name is not None and bool(self.is_known_name(text))

    @staticmethod
    def _mention_text(ent: Span) -> str:
        if Span.has_extension("long_form"):
            long_form = ent._.long_form
            if isinstance(long_form, Span):
                long_form = long_form.text
            if isinstance(long_form, str) and long_form.strip():
                return long_form
        return ent.text

    def _state(self) -> dict:
        return {"protected": list(self.protected), "known_names": sorted(self.known_names)}

    def _set_state(self, data: dict, source: str) -> None:
        if not isinstance(data, dict) or not {"protected", "known_names"} <= data.keys():
            raise ConceptNormError(Errors.E503.format(path=source, detail="expected protected and known_names"))
        self.protected = tuple(_check_strings("protected", data["protected"]))
        self.set_known_names(data["known_names"])

    def to_bytes(self, *, exclude: Iterable[str] = SimpleFrozenList()) -> bytes:
        """Serialize the protected and known names to a bytestring.

        exclude (Iterable[str]): Not used.
        RETURNS (bytes): The serialized component.
        """
        return srsly.json_dumps(self._state()).encode("utf8")

    def from_bytes(self, bytes_data: bytes, *, exclude: Iterable[str] = SimpleFrozenList()) -> "CompositeSplitter":
        """Load the protected and known names from a bytestring.

        bytes_data (bytes): The data, from `to_bytes`.
        exclude (Iterable[str]): Not used.
        RETURNS (CompositeSplitter): The component.
        """
        self._set_state(srsly.json_loads(bytes_data), "bytes")
        return self

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = SimpleFrozenList()) -> None:
        """Save the protected and known names to a directory, as names.json.

        path (Union[str, Path]): The directory, created if missing.
        exclude (Iterable[str]): Not used.
        """
        state = self._state()
        write_json(ensure_path(path) / "names.json", {**state, "sha256": _digest(state)})  # atomic

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = SimpleFrozenList()) -> "CompositeSplitter":
        """Load the protected and known names from a directory written by `to_disk`.

        path (Union[str, Path]): The directory.
        exclude (Iterable[str]): Not used.
        RETURNS (CompositeSplitter): The component.
        """
        file = ensure_path(path) / "names.json"
        if not file.exists():
            raise ConceptNormError(Errors.E503.format(path=file, detail="file not found"))
        try:
            data = srsly.read_json(file)
        except ValueError as err:
            raise ConceptNormError(Errors.E503.format(path=file, detail=err)) from err
        except OSError as err:  # a directory or an unreadable file in its place
            raise ConceptNormError(Errors.E503.format(path=file, detail=err.strerror)) from None
        digest = data.pop("sha256", None) if isinstance(data, dict) else None
        if digest is None or digest != _digest(data):
            raise ConceptNormError(Errors.E503.format(path=file, detail="the content does not match its sha256"))
        self._set_state(data, str(file))
        return self
