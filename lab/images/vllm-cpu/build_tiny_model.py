"""Build the lab's tiny generation model: deterministic, about 110 KB, servable by vLLM on CPU.

A one-layer Llama (hidden 64, 2 heads of head_dim 32, 1 KV head) with a character-level
tokenizer over printable ASCII and a chat template. No model hub is reachable, so the lab
stages this as its weights. Usage: python build_tiny_model.py OUTPUT_DIR
"""

import string
import sys

import torch
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build(output_dir: str) -> None:
    characters = [c for c in string.printable if c.isprintable() or c == "\n"]
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + characters)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
    )
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        # Greedy decoding would otherwise emit special tokens and end replies early.
        model.lm_head.weight[: len(SPECIAL_TOKENS)] = 0
        model.lm_head.weight[len(vocab):] = 0
    model.save_pretrained(output_dir, safe_serialization=True)
    fast.save_pretrained(output_dir)


if __name__ == "__main__":
    build(sys.argv[1])
