"""A tiny random-weight causal LM, saved like a real checkpoint, for tests and CPU smoke runs.

Nothing is downloaded: a byte-level BPE tokenizer is trained in-process on this package's own text
(the built-in task sources, the prompt template, the offline strategies' code) so prompts tokenize to
a few hundred tokens, and a 2-layer Llama with hidden size 64 is initialised from a seed. Both are
written with `save_pretrained`, with a ChatML chat template, so every stage loads the result by path
exactly as it would load a 7B model.

    cuda-l1 train tiny-model --out runs/tiny/model
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cuda_l1.settings import setting

# ChatML: the rendered prompt (with the generation prompt) is a prefix of prompt + answer, which is
# what TRL needs to find where the completion starts; <|im_end|> ends every turn and is the EOS.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


@dataclass
class TinyModelConfig:
    """Shape of the tiny model."""

    vocab_size: int = setting(2048, "BPE vocabulary (special tokens included)")
    hidden_size: int = setting(64, "model width")
    intermediate_size: int = setting(128, "MLP width")
    num_layers: int = setting(2, "decoder layers")
    num_heads: int = setting(4, "attention heads")
    num_kv_heads: int = setting(2, "key/value heads (grouped-query attention, as in current coder models)")
    max_positions: int = setting(8192, "context length (prompts with two exemplars run to a few thousand tokens)")
    seed: int = setting(0, "weight initialisation seed")


def corpus() -> list[str]:
    """Text the tokenizer is trained on: what prompts and answers in this project are made of."""
    from cuda_l1.contrastive import build_prompt
    from cuda_l1.strategies import STRATEGIES
    from cuda_l1.tasks import load_builtin

    texts = []
    for task in load_builtin():
        for message in build_prompt(task.source, [], [], task_name=task.name):
            texts.append(message["content"])
        for strategy in STRATEGIES.values():
            texts.append(strategy.generate(task))
    return texts


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (any text round-trips) wrapped for transformers, with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|pad|>",
                                        bos_token=None, unk_token=None, padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(out_dir: str | Path, config: TinyModelConfig | None = None) -> Path:
    """Write a tiny random Llama and its tokenizer to `out_dir`; returns the directory."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = config or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus(), config.vocab_size)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|pad|>")
    model_config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, max_position_embeddings=config.max_positions,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos, pad_token_id=pad,
    )
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(model_config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, do_sample=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
