"""`model: hf` — a Hugging Face transformers model built from the library's own config class at
random init, measured as a registered model (workers/models/registered.py; docs/models.md,
"Models people already have").

    x (n, d_in) → tokens (n, T, k)         the image rows (or patches), as the built-in
                                           transformer makes them (workers/models/transformer.py)
    → embed: Linear(k, width)  (n, T, d)   given to the model as inputs_embeds
    → model: GPT2Model / BertModel / LlamaModel, depth blocks of width d, `heads` heads,
             MLP hidden mlp_ratio·d, T positions, no dropout, a one-entry vocabulary (unused)
    → mean over the T tokens → head: Linear(d, C) → logits (n, C)

The taps are the blocks (`model.h.{i}` for GPT-2, `model.encoder.layer.{i}` for BERT,
`model.layers.{i}` for LLaMA); each returns the hidden states (n, T, d) (a tuple's first
element where a version returns a tuple), so every tap also gets the token metrics
(token_isometry_gap, token_cosine: workers/token_metrics.py), as the built-in transformer's.

The model comes from `ModelClass(ConfigClass(...))` — `from_config`'s path, never
`from_pretrained` — with HF_HUB_OFFLINE=1 set before transformers is imported, so no code path
reaches the hub. Its weights are transformers' own initialization (GPT-2: N(0, 0.02), the
residual projections scaled by 1/√(2·depth)) drawn from torch's global generator, which the
registered-model path seeds per trial; attention is the "eager" implementation (the same
arithmetic on every device and dtype), whose attention modules return their weights
(n, heads, T, S): each block declares those of its last forward (`isosweep_attention()`,
docs/probe.md), so a trial records attention_entropy per block as the built-in transformer's.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import torch
from torch import Tensor

from service.errors import InvalidInput
from service.library_models import HF_ARCHS, HFParams
from workers.models.transformer import to_tokens, token_shape


def backbone(params: HFParams, *, depth: int, width: int, tokens: int) -> torch.nn.Module:
    """The transformers model of `params.config` with the trial's sizes, at random init."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers (and huggingface_hub) read it
    import transformers

    config_cls, model_cls, _ = HF_ARCHS[params.config]
    hidden = params.mlp_ratio * width
    sizes: dict[str, Any] = {
        "gpt2": dict(n_layer=depth, n_embd=width, n_head=params.heads, n_inner=hidden,
                     n_positions=tokens, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
        "bert": dict(num_hidden_layers=depth, hidden_size=width, num_attention_heads=params.heads,
                     intermediate_size=hidden, max_position_embeddings=tokens,
                     type_vocab_size=1, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, pad_token_id=0),
        "llama": dict(num_hidden_layers=depth, hidden_size=width, num_attention_heads=params.heads,
                      num_key_value_heads=params.heads, intermediate_size=hidden,
                      max_position_embeddings=tokens, attention_dropout=0.0),
    }[params.config]  # fmt: skip
    config = getattr(transformers, config_cls)(
        vocab_size=1, bos_token_id=None, eos_token_id=None, use_cache=False,
        initializer_range=params.initializer_range, **sizes, **params.config_args,
    )  # fmt: skip
    config._attn_implementation = "eager"
    kwargs = {"add_pooling_layer": False} if params.config == "bert" else {}
    model = getattr(transformers, model_cls)(config, **kwargs)
    # the vocabulary is never read (the tokens come as inputs_embeds): a weight no loss reaches
    # would have no gradient, so it is not kept
    model.set_input_embeddings(NoVocabulary())
    declare_attention(model, params.config, depth)
    return model


# each architecture's attention module within a block (eager: it returns (output, weights))
ATTENTION = {"gpt2": "attn", "bert": "attention.self", "llama": "self_attn"}
WEIGHTS = "_isosweep_weights"


def _keep_weights(module: torch.nn.Module, args: tuple, output: Any) -> None:
    weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
    setattr(module, WEIGHTS, None if weights is None else weights.detach())


def _weights_of(attention: torch.nn.Module) -> Tensor | None:
    return getattr(attention, WEIGHTS, None)


def declare_attention(model: torch.nn.Module, arch: str, depth: int) -> None:
    """Each block of `model` says its attention weights of the forward just run."""
    blocks = HF_ARCHS[arch][2]
    for i in range(depth):
        block = model.get_submodule(f"{blocks}.{i}")
        attention = block.get_submodule(ATTENTION[arch])
        attention.register_forward_hook(_keep_weights)
        block.isosweep_attention = partial(_weights_of, attention)


class NoVocabulary(torch.nn.Module):
    """Where the model keeps its token-id embedding: isosweep gives it inputs_embeds only."""

    def forward(self, ids: Tensor) -> Tensor:
        raise InvalidInput("model 'hf' takes inputs_embeds, not token ids", field="model")


class HFClassifier(torch.nn.Module):
    """Tokens of the dataset's images, embedded, through the transformers model, mean-pooled,
    classified (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, *, token_dim: int, width: int, n_classes: int,
                 dataset: str, patch_size: int | None) -> None:  # fmt: skip
        super().__init__()
        self.embed = torch.nn.Linear(token_dim, width)
        self.model = model
        self.head = torch.nn.Linear(width, n_classes)
        self.dataset, self.patch_size = dataset, patch_size

    def forward(self, x: Tensor) -> Tensor:
        tokens = to_tokens(x, self.dataset, self.patch_size)  # (n, T, k)
        h = self.model(inputs_embeds=self.embed(tokens)).last_hidden_state  # (n, T, d)
        return self.head(h.mean(dim=1))  # (n, C)


def build(params: HFParams, *, d_in: int, n_classes: int, config: Any) -> torch.nn.Module:
    """The registered factory of `model: hf` (service.models.LIBRARY)."""
    try:
        t, k = token_shape(config.dataset, params.patch_size)
    except InvalidInput as exc:  # the built-in transformer's message, this family's field
        message = exc.message.removeprefix("patch_size: ")
        raise InvalidInput(message, field="model_params.patch_size") from None
    model = backbone(params, depth=config.depth, width=config.width, tokens=t)
    return HFClassifier(
        model, token_dim=k, width=config.width, n_classes=n_classes,
        dataset=config.dataset, patch_size=params.patch_size,
    )  # fmt: skip
