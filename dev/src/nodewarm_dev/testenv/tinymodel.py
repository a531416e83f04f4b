#!/usr/bin/env python
"""Make a tiny Llama model in the Hugging Face layout, locally: nothing is downloaded.

The serving tests, the demo and the benches need a model real vLLM can boot on this CPU in a minute or two. This
writes one into a directory: a byte-level BPE tokenizer trained with ``tokenizers`` on a fixed text (saved
through ``PreTrainedTokenizerFast``, so ``tokenizer.json`` + ``tokenizer_config.json`` + special tokens), and a
``LlamaForCausalLM`` with random weights from a fixed seed, saved with ``save_pretrained(safe_serialization=True)``
(``config.json``, ``generation_config.json``, ``model.safetensors``). About 5 MB at the defaults.

It needs ``transformers`` and ``torch``, which the serving environment (``.venv-serving``, the stand-in for the
serving image) has, so it runs there as a subprocess: ``python tinymodel.py DIR [--layers N] [--shards N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# A fixed corpus so the tokenizer (and thus every file) is the same on every run.
_CORPUS = [
    "nodewarm makes a freshly scaled-up GPU node serve vLLM in seconds instead of minutes.",
    "The weights are pulled from S3 to the node's NVMe and the compile cache is restored before pods land.",
    "Karpenter launches the node, the agent warms it, and the controller lifts the startup taint.",
    "The quick brown fox jumps over the lazy dog. 0123456789 hello world, once upon a time.",
] * 50


def make(dest: str, *, layers: int = 4, hidden: int = 256, heads: int = 4, kv_heads: int = 2,
         vocab: int = 512, max_positions: int = 2048, shards: int = 1, seed: int = 0) -> dict:
    """Write the model into ``dest`` (created) and return a short description of it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(dest, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(dest)

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_positions, bos_token_id=fast.bos_token_id,
                         eos_token_id=fast.eos_token_id, torch_dtype="bfloat16", tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    # max_shard_size splits the weights into several safetensors files, as a real model ships them.
    shard = f"{max(1, total // shards // 1024 + 1)}KB" if shards > 1 else "10GB"
    model.save_pretrained(dest, safe_serialization=True, max_shard_size=shard)
    files = sorted(f for f in os.listdir(dest) if f.endswith(".safetensors"))
    return {"dir": os.path.abspath(dest), "parameters_bytes": total, "safetensors": files,
            "vocab": tok.get_vocab_size(), "layers": layers, "hidden": hidden}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", help="directory to write the model into (created)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--shards", type=int, default=1, help="number of safetensors files to split the weights into")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(json.dumps(make(a.dest, layers=a.layers, hidden=a.hidden, shards=a.shards, seed=a.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
