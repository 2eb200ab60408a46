"""The simulated model's folder: the tokenizer files plus the model files a real one has."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.model_dir import model_folder
from gateway_lab.sim.vocab import default_tokenizer_path, load_vocab


def test_the_folder_has_the_tokenizer_and_both_model_files(tmp_path: Path) -> None:
    vocab = load_vocab()
    config = SimConfig(context_length=4096)
    folder = model_folder(config, vocab, root=tmp_path)
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    model = json.loads((folder / "config.json").read_text())
    assert model["max_position_embeddings"] == 4096 and model["architectures"] == ["Qwen3ForCausalLM"]
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == list(vocab.eos_ids)
    assert {k: generation[k] for k in ("temperature", "top_p", "top_k")} == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert model_folder(config, vocab, root=tmp_path) == folder  # built once per content
    other = model_folder(SimConfig(context_length=8192, sampling_defaults=""), vocab, root=tmp_path)
    assert other != folder and "temperature" not in json.loads((other / "generation_config.json").read_text())


def test_a_folder_that_has_both_files_is_used_as_it_is(tmp_path: Path) -> None:
    source = tmp_path / "model"
    shutil.copytree(default_tokenizer_path(), source)
    (source / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    (source / "generation_config.json").write_text(json.dumps({"eos_token_id": 151645}))
    vocab = load_vocab(str(source))
    assert model_folder(SimConfig(), vocab, root=tmp_path / "out") == source.resolve()
