"""How the recognizer's transformer weights are saved, loaded and run: light on disk, at `spacy.load` and at
inference.

spacy-transformers keeps the transformer inside the recognizer's model bytes, as a `torch.save` of its weights,
and its `HFShim` loads them by building a randomly initialized model through `AutoModel.from_config`, then copying
the saved weights in. `CompactHFShim` does the same with less:

- the weights are saved in float16 (half the bytes, so half of each copy of them that loading holds at once: the
  file read, the recognizer's msgpack, the shim's msgpack, the loaded tensors). They are float32 again once
  loaded; a tensor whose values float16 cannot hold stays float32. A float32 weight rounded to float16 moves by
  at most 2**-11 of its value, well inside what bf16 autocast (2**-8) does to it at every forward pass.
- the model is built from its own class, looked up by the config's `model_type`, instead of through
  `AutoModel.from_config`, which first imports every model type transformers knows; and its weights are not
  initialized, since the saved ones replace them;
- the saved bytes are dropped once read, and the model takes the loaded tensors as its own.

Weights saved in float32 (by spacy-transformers' own shim) load the same way.

At inference (`predict`), spacy-transformers hands the shim every window of a batch of docs at once, padded to the
longest: windows of 128 words hold from a few to 200 word pieces, so a batch of whole notes computed some 40% more
positions than it holds pieces. `CompactHFShim.predict` runs the windows in groups of similar length, each padded
to its own longest (`PREDICT_ROWS` windows a forward pass), and gives the hidden states back in the shape and order
asked for. Training steps (`begin_update`) are unchanged.
"""

from __future__ import annotations

from io import BytesIO
from typing import Any

import srsly
import torch
from spacy.util import SimpleFrozenDict
from spacy_transformers.data_classes import HFObjects
from spacy_transformers.layers.hf_shim import HFShim
from spacy_transformers.util import make_tempdir
from thinc.api import ArgsKwargs, get_torch_default_device

FLOAT16_MAX = torch.finfo(torch.float16).max
# windows a forward pass at inference: the least padding; a word piece costs no more than in groups of 32 (AVX2)
PREDICT_ROWS = 8


class SavedModelClass:
    """The `model_cls` of `CompactHFShim`: builds the model a saved config names, with uninitialized weights."""

    @staticmethod
    def from_config(config):
        import transformers
        from transformers import AutoModel
        from transformers.modeling_utils import no_init_weights
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        model_cls = getattr(transformers, MODEL_MAPPING_NAMES.get(config.model_type, ""), None)
        if model_cls is None:  # a model type of its own (e.g. remote code): the Auto class finds it
            return AutoModel.from_config(config)
        with no_init_weights():
            return model_cls._from_config(config)


class CompactHFShim(HFShim):
    """spacy-transformers' HFShim, saving its weights in float16 and loading them without random initialization
    (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "model_cls": SavedModelClass})
        self.cuda_fp16 = bool(kwargs.get("mixed_precision", False))  # fp16 autocast on CUDA at inference, as HFShim

    def from_bytes(self, bytes_data: bytes) -> CompactHFShim:
        """HFShim.from_bytes, holding fewer copies of the weights at once: the saved bytes are dropped once read,
        and the model takes the loaded tensors as its own (`assign=True`) instead of copying them in."""
        msg = srsly.msgpack_loads(bytes_data)
        if not msg["config"]:  # saved before initialization: nothing to load
            return super().from_bytes(bytes_data)
        device = get_torch_default_device()
        state = torch.load(BytesIO(msg.pop("state")), map_location=device, weights_only=True)
        with make_tempdir() as temp_dir:
            srsly.write_json(temp_dir / "config.json", msg["config"])
            config = self.config_cls.from_pretrained(temp_dir / "config.json")
            tok_kwargs = msg["tokenizer"].pop("kwargs", {})
            for file_name, file_bytes in msg["tokenizer"].items():
                (temp_dir / file_name).write_bytes(file_bytes)
            tokenizer = self.tokenizer_cls.from_pretrained(str(temp_dir.absolute()), **tok_kwargs)
            vocab_file = None
            if hasattr(tokenizer, "vocab_file"):
                vocab_file = (temp_dir / tokenizer.vocab_files_names["vocab_file"]).read_bytes()
        model = self.model_cls.from_config(config)
        for key in list(state):  # float32 again, one tensor at a time
            state[key] = state[key].float() if state[key].dtype == torch.float16 else state[key]
        model.load_state_dict(state, assign=True)
        self._model = model.to(device)
        self._hfmodel = HFObjects(tokenizer, self._model, vocab_file, SimpleFrozenDict(), SimpleFrozenDict())
        return self

    def predict(self, inputs: ArgsKwargs) -> Any:
        """The model's output for a padded batch of windows (`inputs.kwargs`: input_ids, attention_mask, perhaps
        token_type_ids), computed in groups of windows of similar length (see the module docstring). The tensors
        of the output that have a row per window (and a column per word piece) come back in the batch's shape
        (zeros past a group's longest window: padding, which spacy-transformers does not read)."""
        kwargs = inputs.kwargs
        mask = kwargs.get("attention_mask")
        config = getattr(self._model, "config", None)
        tuples = getattr(config, "output_hidden_states", False) or getattr(config, "output_attentions", False)
        if inputs.args or mask is None or mask.shape[0] <= PREDICT_ROWS or tuples:
            return super().predict(inputs)
        lengths = mask.sum(dim=1)
        order = torch.argsort(lengths, stable=True)
        rows, width = mask.shape
        self._model.eval()
        parts = []
        try:
            with torch.inference_mode(), torch.autocast(device_type="cuda", enabled=self.cuda_fp16):
                for start in range(0, rows, PREDICT_ROWS):
                    index = order[start : start + PREDICT_ROWS]
                    longest = int(lengths[index].max())
                    group = {k: v[index, :longest] if torch.is_tensor(v) else v for k, v in kwargs.items()}
                    parts.append((index, self._model(**group)))
        finally:
            self._model.train()
        output = parts[0][1]
        for key, value in output.items():
            if torch.is_tensor(value):
                output[key] = _gather(parts, key, rows, width)
        return output

    def to_bytes(self) -> bytes:
        msg = srsly.msgpack_loads(super().to_bytes())
        if msg["state"]:
            buffer = BytesIO()
            torch.save({key: _compact(value) for key, value in self._model.state_dict().items()}, buffer)
            msg["state"] = buffer.getvalue()
        return srsly.msgpack_dumps(msg)


def _gather(parts: list, key: str, rows: int, width: int) -> torch.Tensor:
    """The tensor `key` of the whole batch from the groups' outputs `parts` ((rows of the batch, output)): a row
    per window in the batch's order; a tensor with a word-piece axis (3 dimensions) gets `width` of them, zeros
    after a group's longest."""
    first = parts[0][1][key]
    whole = first.new_zeros((rows, width, *first.shape[2:]) if first.dim() == 3 else (rows, *first.shape[1:]))
    for index, output in parts:
        value = output[key]
        if value.dim() == 3:
            whole[index, : value.shape[1]] = value
        else:
            whole[index] = value
    return whole


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """float16 for a float32 tensor whose values it can hold, else the tensor as it is."""
    if tensor.dtype != torch.float32 or (tensor.numel() and tensor.abs().max() > FLOAT16_MAX):
        return tensor
    return tensor.half()
