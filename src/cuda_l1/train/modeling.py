"""Loading the policy (any Hugging Face causal LM by path), LoRA settings, and saving a final model
that the next stage, `vllm serve` or `from_pretrained` can load without knowing how it was trained."""

from __future__ import annotations

from pathlib import Path

from cuda_l1.errors import UserError
from cuda_l1.train.config_files import LoraSection, ModelSection

_DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_model_path(section: ModelSection, where: str = "model.path") -> str:
    path = section.path.strip()
    if not path:
        raise UserError(f"{where} is empty: give the directory of a Hugging Face causal LM "
                        "(e.g. one written by save_pretrained, or `cuda-l1 train tiny-model --out DIR`).")
    local = Path(path).expanduser()
    if (path.startswith((".", "/", "~")) or local.exists()) and not any(
            (local / name).exists() for name in ("config.json", "adapter_config.json")):
        raise UserError(f"{where}: {path} has no config.json (nor a PEFT adapter_config.json); expected a "
                        "save_pretrained model directory.")
    return path


def _dtype_keyword() -> str:
    """transformers renamed `torch_dtype` to `dtype` (4.56); use the name the installed version knows."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def model_kwargs(section: ModelSection) -> dict:
    """Keyword arguments for AutoModelForCausalLM.from_pretrained (also TRL's model_init_kwargs)."""
    if section.dtype not in _DTYPES:
        raise UserError(f"model.dtype is one of {', '.join(_DTYPES)} (got {section.dtype!r}).")
    kwargs: dict = {_dtype_keyword(): section.dtype, "trust_remote_code": section.trust_remote_code}
    if section.attn_implementation:
        kwargs["attn_implementation"] = section.attn_implementation
    return kwargs


def load_tokenizer(path: str, padding_side: str = "left", trust_remote_code: bool = False):
    """The tokenizer, with a pad token (decoder-only batches are left-padded for generation)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"the tokenizer in {path} has no chat template; prompts are chat conversations. Use an "
                        "instruct/chat checkpoint or add a chat_template to its tokenizer_config.json.")
    return tokenizer


def load_model(section: ModelSection, path: str | None = None):
    from transformers import AutoModelForCausalLM

    path = path or check_model_path(section)
    return AutoModelForCausalLM.from_pretrained(path, **model_kwargs(section))


def lora_config(section: LoraSection):
    """A PEFT LoraConfig, or None for full fine-tuning."""
    if not section.enabled:
        return None
    try:
        from peft import LoraConfig
    except ImportError:
        raise UserError("[lora] enabled needs peft: pip install 'cuda-l1[train]'.") from None
    targets: str | list[str] = section.target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    return LoraConfig(r=section.r, lora_alpha=section.alpha, lora_dropout=section.dropout,
                      target_modules=targets, task_type="CAUSAL_LM")


def _merge_adapter(model: ModelSection, adapter_dir: Path, final_dir: Path, tokenizer) -> None:
    from peft import PeftModel

    merged = PeftModel.from_pretrained(load_model(model), str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(final_dir)
    tokenizer.save_pretrained(final_dir)


def save_trained(trainer, model: ModelSection, lora: LoraSection, tokenizer, out_dir: str | Path) -> Path:
    """Write a trainer's model as OUT/final (LoRA: OUT/adapter, merged into OUT/final unless merge is off).

    Returns the directory later stages should load. Every rank must call this: save_model is
    collective under DeepSpeed ZeRO-3 (it gathers the shards) and FSDP.
    """
    out = Path(out_dir)
    final = out / "final"
    if lora.enabled:
        trainer.save_model(str(out / "adapter"))
        if not lora.merge:
            final = out / "adapter"  # the adapter is the result; transformers loads it with PEFT installed
        elif trainer.accelerator.is_main_process:
            _merge_adapter(model, out / "adapter", final, tokenizer)
    else:
        trainer.save_model(str(final))
        if trainer.accelerator.is_main_process:
            tokenizer.save_pretrained(final)
    trainer.accelerator.wait_for_everyone()
    return final


def free_accelerator_memory() -> None:
    """Release cached device memory between generation and training (vLLM and the trainer share GPUs)."""
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass
