"""The recognizer's transformer weights: saved in float16, loaded as float32 without random initialization."""

import pytest
import srsly
import torch
from spacy_transformers.layers.hf_shim import HFShim
from spacy_transformers.span_getters import configure_strided_spans

from spacy_conceptnorm.ml.recognizer import transformer_model
from spacy_conceptnorm.ml.recognizer_weights import CompactHFShim


def _model(tiny_bert):
    model = transformer_model(str(tiny_bert), configure_strided_spans(32, 24), cpu_precision="fp32")
    model.initialize()
    return model


def _weights(model) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in model.transformer.state_dict().items()}


def test_weights_are_saved_in_float16_and_load_as_float32(tiny_bert):
    model = _model(tiny_bert)
    original = _weights(model)
    assert isinstance(model.layers[0].shims[0], CompactHFShim)
    ours, theirs = model.to_bytes(), _saved_by_spacy_transformers(model)
    assert len(ours) < 0.6 * len(theirs)  # the tiny BERT's weights are most of the bytes: half as many

    loaded = _weights(_model(tiny_bert).from_bytes(ours))
    assert loaded.keys() == original.keys()
    for key, value in original.items():
        assert loaded[key].dtype == value.dtype
        # exactly the float16 rounding of each weight (torch's own conversion, round to nearest even)
        expected = value.half().float() if value.dtype == torch.float32 else value
        assert torch.equal(loaded[key], expected), key
    matrices = [key for key, value in original.items() if value.dim() == 2]
    assert len(matrices) >= 6  # float16 did round each random weight matrix: the comparison above is not vacuous
    assert all(not torch.equal(loaded[key], original[key]) for key in matrices)


def test_weights_saved_by_spacy_transformers_load_unchanged(tiny_bert):
    model = _model(tiny_bert)
    original = _weights(model)
    loaded = _weights(_model(tiny_bert).from_bytes(_saved_by_spacy_transformers(model)))
    assert all(torch.equal(loaded[key], value) for key, value in original.items())


def test_a_tensor_float16_cannot_hold_stays_float32(tiny_bert):
    model = _model(tiny_bert)
    weight = model.transformer.embeddings.word_embeddings.weight
    with torch.no_grad():
        weight[0, 0] = 1e6  # float16's largest value is 65504
    loaded = _model(tiny_bert).from_bytes(model.to_bytes()).transformer.embeddings.word_embeddings.weight
    assert loaded[0, 0].item() == 1e6 and torch.equal(loaded, weight.detach())


def test_loading_initializes_no_weights(tiny_bert, monkeypatch):
    from transformers import BertPreTrainedModel

    data = _model(tiny_bert).to_bytes()

    def refuse(*args, **kwargs):
        raise AssertionError("random initialization while loading saved weights")

    monkeypatch.setattr(BertPreTrainedModel, "_init_weights", refuse)
    monkeypatch.setattr(torch.nn.init, "normal_", refuse)
    loaded = _model_uninitialized(tiny_bert).from_bytes(data)
    assert loaded.transformer.embeddings.word_embeddings.weight.dtype == torch.float32


def _model_uninitialized(tiny_bert):
    return transformer_model(str(tiny_bert), configure_strided_spans(32, 24), cpu_precision="fp32")


def _with_hf_shim(model):
    """The model's shim as spacy-transformers' own HFShim (what it writes: float32 weights)."""
    shim = model.layers[0].shims[0]
    plain = HFShim(shim._hfmodel)
    plain._model = shim._model
    return plain


def _saved_by_spacy_transformers(model) -> bytes:
    """The model's bytes as spacy-transformers' own HFShim writes them."""
    ours = model.layers[0].shims[0]
    model.layers[0].shims[0] = _with_hf_shim(model)
    try:
        return model.to_bytes()
    finally:
        model.layers[0].shims[0] = ours


@pytest.mark.parametrize("key", ["config", "tokenizer"])
def test_the_saved_message_keeps_spacy_transformers_layout(tiny_bert, key):
    model = _model(tiny_bert)
    msg = srsly.msgpack_loads(model.layers[0].shims[0].to_bytes())
    assert msg[key] == srsly.msgpack_loads(_with_hf_shim(model).to_bytes())[key]
