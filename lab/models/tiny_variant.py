"""Derive a second lab model from the tiny one: same architecture and tokenizer, other weights.

The correctness diff must see a different model as different: this one answers prompts
differently from the tiny model while serving with the same settings. Run with the vLLM
image's own torch and transformers. Usage: python tiny_variant.py SOURCE_DIR OUTPUT_DIR SEED
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

SPECIAL_TOKENS = 4
WRITTEN_BY_SAVE = {"model.safetensors", "config.json", "generation_config.json"}


def derive(source: str, output: str, seed: int) -> None:
    model = LlamaForCausalLM.from_pretrained(source, torch_dtype=torch.bfloat16)
    vocab = len(json.loads((Path(source) / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0.0, 0.02)
        # As in the tiny model: greedy decoding would otherwise emit special or unused tokens.
        model.lm_head.weight[:SPECIAL_TOKENS] = 0
        model.lm_head.weight[vocab:] = 0
    model.save_pretrained(output, safe_serialization=True)
    for path in Path(source).iterdir():
        if path.name not in WRITTEN_BY_SAVE:
            shutil.copy(path, Path(output) / path.name)


if __name__ == "__main__":
    derive(sys.argv[1], sys.argv[2], int(sys.argv[3]))
