"""Build a tiny random-weight Llama model with a locally trained tokenizer.

Nothing is downloaded: the tokenizer is a byte-level BPE trained here on generated text and the
weights are random (seeded), so the same command gives the same model on every machine.

    python -m servewitness.testing.tiny_model OUTDIR [--dtype float32|bfloat16] [--force]

Model: LlamaForCausalLM, hidden 256, intermediate 512, 2 layers, 4 attention heads (head_dim 64),
max_position_embeddings 512, untied embeddings, vocabulary = the tokenizer's size (2000).
The heavy imports (torch, transformers, tokenizers) happen inside `build()`, never at import time.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
from pathlib import Path

VOCAB_SIZE = 2000
_MARKER = "verifier-tiny-model.json"
_SPEC_VERSION = 1


def _corpus(rng: random.Random) -> list[str]:
    words = [
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
        for _ in range(3000)
    ]
    words += [
        "alpha", "beta", "gamma", "delta", "model", "runner", "decode", "prefill", "token",
        "cache", "kernel", "graph", "tensor", "block", "layer", "hidden", "server", "engine",
        "worker", "hello", "world", "the", "a", "of", "and", "to", "in", "is", "it",
    ]  # fmt: skip

    def sentence() -> str:
        n = rng.randint(5, 20)
        body = " ".join(
            rng.choice(words) + (str(rng.randint(0, 99)) if rng.random() < 0.2 else "")
            for _ in range(n)
        )
        return body + rng.choice([".", "!", "?", ","])

    return [sentence() for _ in range(20000)]


def is_built(out: Path, dtype: str) -> bool:
    """True when OUT holds a model this module built with the same spec and dtype."""
    try:
        meta = json.loads((out / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(meta == {"spec": _SPEC_VERSION, "dtype": dtype})


def build(out: Path, dtype: str = "float32") -> None:
    """Write tokenizer and model files into OUT (created if needed)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    torch.manual_seed(0)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(rng), trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=512,
    )
    fast.save_pretrained(str(out))
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=bos,
        eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("<pad>"),
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        torch_dtype=dtype,
    )
    model = LlamaForCausalLM(cfg).to(torch_dtype)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / _MARKER).write_text(json.dumps({"spec": _SPEC_VERSION, "dtype": dtype}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m servewitness.testing.tiny_model",
        description="Build a tiny random-weight Llama model and tokenizer (no downloads).",
    )
    parser.add_argument("out", type=Path, help="output directory")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--force", action="store_true", help="rebuild even if already built")
    args = parser.parse_args(argv)
    if not args.force and is_built(args.out, args.dtype):
        print(f"tiny model already built in {args.out}")
        return 0
    try:
        build(args.out, args.dtype)
    except ImportError as e:
        print(
            f"tiny_model: {e}; this Python ({sys.executable}) needs torch, transformers "
            "and tokenizers",
            file=sys.stderr,
        )
        return 3
    print(f"tiny model written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
