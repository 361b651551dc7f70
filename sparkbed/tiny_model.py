"""
Make the test bed's model: a tiny Llama with random weights, a byte-level BPE tokenizer trained on
a few sentences, and a chat template. Nothing comes from a hub.

    python sparkbed/tiny_model.py OUT_DIR
"""

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Two DGX Spark nodes serve one model in tensor parallel over a RoCE fabric.",
    '{"name": "spark", "nodes": 2, "fabric": "enp1s0f0np0", "mtu": 4200}',
    "def add(a, b):\n    return a + b\n",
    "Hello! How can I help you today? Write a short poem about the sea.",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]


def main(out: Path) -> None:
    torch.manual_seed(1234)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id, tie_word_embeddings=False, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
