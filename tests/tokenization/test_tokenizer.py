"""Tokenizer: encode/decode and special-token facts match transformers for Qwen3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer as BackendTokenizer

from gateway.tokenization import Tokenizer, TokenizerLoadError, backend_parts
from gateway.tokenization.backend_parts import BackendParts, merges_later, split_backend
from gateway.tokenization.fast_bpe import FastBpePlan, plan_fast_bpe
from gateway.tokenization.tokenizer import encoder_facts_at, load_facts_at

from .helpers import PROPERTY, copy_tokenizer, multilingual_text, small_byte_level_tokenizer

IM_START, IM_END, ENDOFTEXT = 151644, 151645, 151643


@PROPERTY
@given(text=st.one_of(st.text(max_size=300), multilingual_text()), special=st.booleans())
def test_encode_and_decode_match_transformers(
    qwen: Tokenizer, hf_qwen: Any, text: str, special: bool
) -> None:
    ids = qwen.encode(text, add_special_tokens=special)
    assert ids == hf_qwen.encode(text, add_special_tokens=special)
    for skip in (True, False):
        assert qwen.decode(ids, skip_special_tokens=skip) == hf_qwen.decode(
            ids, skip_special_tokens=skip
        )


def test_qwen_adds_no_bos(qwen: Tokenizer) -> None:
    assert qwen.bos_token_id is None
    assert qwen.encode("hello world", add_special_tokens=True) == qwen.encode(
        "hello world", add_special_tokens=False
    )


def test_special_tokens_in_text_become_single_ids(qwen: Tokenizer) -> None:
    ids = qwen.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids[0] == IM_START and ids[-1] == IM_END
    assert qwen.decode(ids, skip_special_tokens=True) == "user\nhi"
    assert qwen.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"


def test_encode_batch_equals_encode(qwen: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Short batches one by one holding the GIL, long ones in the library's pool: same ids."""
    from gateway.tokenization import tokenizer as tokenizer_module

    texts = ["a", "", "日本語 😀", "<|im_start|>x", "user\nhéllo wörld<|im_end|>\n"]
    for special in (False, True):
        want = [qwen.encode(t, add_special_tokens=special) for t in texts]
        assert qwen.encode_batch(texts, add_special_tokens=special) == want
        monkeypatch.setattr(tokenizer_module, "HOLD_GIL_CHARS", -1)  # every batch the pool's way
        assert qwen.encode_batch(texts, add_special_tokens=special) == want
        monkeypatch.undo()


def test_short_and_long_texts_get_the_same_ids_on_either_encode_path(
    qwen: Tokenizer, hf_qwen: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short texts are encoded holding the GIL, long ones by encode_batch_fast: same ids."""
    from gateway.tokenization import tokenizer as tokenizer_module

    long_text = "<|im_start|>user\n" + "héllo wörld 日本語 😀 code() " * 120
    short_text = long_text[:300]
    assert len(short_text) <= tokenizer_module.HOLD_GIL_CHARS < len(long_text)
    for special in (True, False):
        by_path = {t: qwen.encode(t, add_special_tokens=special) for t in (short_text, long_text)}
        monkeypatch.setattr(tokenizer_module, "HOLD_GIL_CHARS", 10**9)  # everything the GIL-held way
        for t, ids in by_path.items():
            assert qwen.encode(t, add_special_tokens=special) == ids == hf_qwen.encode(t, add_special_tokens=special)
            assert qwen.encode_batch([t], add_special_tokens=special) == [ids]
        monkeypatch.setattr(tokenizer_module, "HOLD_GIL_CHARS", -1)  # everything the batch way
        for t, ids in by_path.items():
            assert qwen.encode(t, add_special_tokens=special) == ids
            assert qwen.encode_batch([t], add_special_tokens=special) == [ids]
        monkeypatch.undo()


class _Recording:
    """A backend that records the name of every method called on it."""

    def __init__(self, backend: BackendTokenizer) -> None:
        self._backend, self.calls = backend, []  # type: list[str]

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self._backend, name)


def test_long_id_lists_are_decoded_with_the_gil_released_and_the_same_text(
    qwen: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``decode`` holds the GIL throughout (0.4 s for a million ids); a list past
    ``HOLD_GIL_IDS`` goes through ``decode_batch``, which releases it: the same text,
    special tokens kept or skipped, ids that split a character included."""
    import random

    from gateway.tokenization import tokenizer as tokenizer_module

    rng = random.Random(7)
    specials = sorted(qwen.special_token_ids)
    ids = [rng.choice(specials) if rng.random() < 0.02 else rng.randrange(151_643) for _ in range(3 * tokenizer_module.HOLD_GIL_IDS)]
    ids += qwen.encode("日本語 😀", add_special_tokens=False)[:-1]  # ends inside a character
    recording = _Recording(qwen.backend)
    monkeypatch.setattr(qwen, "backend", recording)
    for skip in (True, False):
        recording.calls.clear()
        text = qwen.decode(ids, skip_special_tokens=skip)
        assert recording.calls == ["decode_batch"]
        assert text == recording._backend.decode(ids, skip_special_tokens=skip)
        recording.calls.clear()
        short = ids[: tokenizer_module.HOLD_GIL_IDS]
        assert qwen.decode(short, skip_special_tokens=skip) == recording._backend.decode(short, skip_special_tokens=skip)
        assert recording.calls == ["decode"]


def test_facts_match_transformers(qwen: Tokenizer, hf_qwen: Any) -> None:
    assert qwen.vocab_size == len(hf_qwen) == 151669
    assert qwen.eos_token_ids == {hf_qwen.eos_token_id} == {IM_END}
    assert qwen.model_max_length == hf_qwen.model_max_length == 131072
    assert qwen.special_token_ids == set(hf_qwen.all_special_ids) | {
        i for i, t in hf_qwen.added_tokens_decoder.items() if t.special
    }
    assert qwen.special_tokens_map == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    ids = qwen.encode("Hello, 世界", add_special_tokens=False)
    assert qwen.convert_ids_to_tokens(ids) == hf_qwen.convert_ids_to_tokens(ids)
    assert qwen.id_to_piece(IM_START) == "<|im_start|>"
    assert qwen.id_to_piece(10**9) is None


def test_token_id_is_set_only_for_exactly_one_token(qwen: Tokenizer) -> None:
    assert qwen.token_id("<|im_end|>") == IM_END
    assert qwen.token_id("</think>") == 151668
    assert qwen.token_id(" hello") == qwen.encode(" hello", add_special_tokens=False)[0]
    assert qwen.token_id("hello world") is None
    assert qwen.token_id("") is None
    assert qwen.token_id("😀") == 141334  # a whole emoji can be one byte-level token
    assert qwen.token_id("👩‍👩‍👧‍👦") is None  # several tokens


def test_eos_from_generation_config_and_worker(qwen_dir: Path, tmp_path: Path) -> None:
    folder = copy_tokenizer(qwen_dir, tmp_path / "qwen")
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [IM_END, ENDOFTEXT]})
    )
    tok = Tokenizer.from_path(folder)
    assert tok.eos_token_ids == {IM_END, ENDOFTEXT}
    tok.merge_eos_token_ids([151662])
    assert tok.eos_token_ids == {IM_END, ENDOFTEXT, 151662}


def test_loads_from_a_tokenizer_json_file(qwen_dir: Path) -> None:
    tok = Tokenizer.from_path(qwen_dir / "tokenizer.json")
    assert tok.eos_token_ids == {IM_END}  # configs are read from beside the file
    assert tok.chat_template_names == ("default",)


def test_explicit_add_bos_token_is_honoured(qwen_dir: Path, tmp_path: Path) -> None:
    """With add_bos_token in tokenizer_config, ids equal transformers told the same flag."""
    from transformers import AutoTokenizer

    folder = copy_tokenizer(qwen_dir, tmp_path / "bos")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(add_bos_token=True, bos_token="<|endoftext|>")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_path(folder)
    reference = AutoTokenizer.from_pretrained(folder, add_bos_token=True)
    for text in ["hi there", "日本", ""]:
        assert tok.encode(text, add_special_tokens=True) == reference.encode(text)
        assert tok.encode(text, add_special_tokens=False) == reference.encode(
            text, add_special_tokens=False
        )
    assert tok.encode("hi", add_special_tokens=True)[0] == ENDOFTEXT == tok.bos_token_id


def test_truncation_and_padding_in_tokenizer_json_are_ignored(
    qwen_dir: Path, tmp_path: Path
) -> None:
    folder = copy_tokenizer(qwen_dir, tmp_path / "trunc")
    data = json.loads((folder / "tokenizer.json").read_text())
    data["truncation"] = {
        "direction": "Right",
        "max_length": 4,
        "strategy": "LongestFirst",
        "stride": 0,
    }
    (folder / "tokenizer.json").write_text(json.dumps(data))
    tok = Tokenizer.from_path(folder)
    assert len(tok.encode("one two three four five six seven", add_special_tokens=False)) == 7


def test_load_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="does not exist"):
        Tokenizer.from_path(tmp_path / "missing")
    with pytest.raises(TokenizerLoadError, match=r"no tokenizer\.json"):
        Tokenizer.from_path(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match="cannot parse"):
        Tokenizer.from_path(tmp_path)


def test_a_plan_made_from_the_files_is_installed_as_the_fast_encoder(tmp_path: Path) -> None:
    folder = small_byte_level_tokenizer(tmp_path / "small")
    plan, bound = encoder_facts_at(str(folder))
    tok = Tokenizer.from_path(folder)
    assert plan is not None and bound is not None and not tok.fast_bpe_ready and not tok.encoders_built()
    assert tok.install_encoders(plan, bound) is not None and tok.fast_bpe_ready and tok.encoders_built()
    assert tok.length_bound == bound
    assert tok.encode("abc abcab", add_special_tokens=False) == [257, 32, 257, 256]
    other = Tokenizer.from_path(folder)
    assert other.install_encoders(None, None) is None  # none applies: the HF encoder serves, nothing is built
    assert other.fast_bpe_ready and other.fast_bpe is None and other.length_bound is None
    assert other.encode("abc abcab", add_special_tokens=False) == [257, 32, 257, 256]



def test_a_child_sends_the_file_in_parts_with_the_plan_of_the_tokenizer_they_make(tmp_path: Path) -> None:
    folder = small_byte_level_tokenizer(tmp_path / "small")
    parts, plan, bound = load_facts_at(str(folder / "tokenizer.json"))
    assert parts is not None and (plan, bound) == encoder_facts_at(str(folder))
    tok = Tokenizer.from_path(folder, parse=lambda _: parts.build())
    assert tok.install_encoders(plan, bound) is not None
    assert tok.encode("abc abcab", add_special_tokens=False) == [257, 32, 257, 256]


def test_a_parse_given_makes_the_backend(tmp_path: Path) -> None:
    folder = small_byte_level_tokenizer(tmp_path / "small")
    asked: list[Path] = []

    def parse(json_file: Path) -> BackendTokenizer:
        asked.append(json_file)
        raise ValueError("unreadable")

    with pytest.raises(TokenizerLoadError, match="unreadable"):
        Tokenizer.from_path(folder, parse=parse)
    assert asked == [folder / "tokenizer.json"]


@pytest.fixture(scope="module")
def qwen_parts(qwen_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BackendParts, FastBpePlan, Tokenizer]:
    """Qwen3 with BOS added (the post-processor rebuilt from the config): its folder, its
    parts, its fast encoder's plan, and the files parsed whole."""
    folder = copy_tokenizer(qwen_dir, tmp_path_factory.mktemp("deferred"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(add_bos_token=True, bos_token="<|endoftext|>")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    full = Tokenizer.from_path(folder)
    split = split_backend((folder / "tokenizer.json").read_text(encoding="utf-8"))
    plan = plan_fast_bpe(full.backend)
    assert split is not None and plan is not None
    return folder, split[0], plan, full


def _deferred(qwen_parts: tuple[Path, BackendParts, FastBpePlan, Tokenizer]) -> Tokenizer:
    """The tokenizer loaded as a joining model's is: without its merges, the fast encoder from the plan."""
    folder, parts, plan, _ = qwen_parts
    tok = Tokenizer.from_path(folder, parse=lambda _: merges_later(parts))
    assert tok.install_encoders(plan, None) is not None
    return tok


def test_a_tokenizer_without_its_merges_encodes_ascii_and_latin_without_building_them(
    qwen_parts: tuple[Path, BackendParts, FastBpePlan, Tokenizer],
) -> None:
    tok, full = _deferred(qwen_parts), qwen_parts[3]
    for text in ["Hello, world! It's 12:45.", "L'été à Zürich, naïve café", "<|im_start|>user\nhi<|im_end|>\n"]:
        assert tok.encode(text, add_special_tokens=False) == full.encode(text, add_special_tokens=False)
    # the parsers' look-ups while a model joins, full-width and special ones included
    for tag in ["<think>", "</tool_call>", "hello", " world", "[TOOL_CALLS]", "<\uff5ctool\u2581calls\u2581begin\uff5c>", "◁think▷", "東京 x"]:
        assert tok.token_id(tag) == full.token_id(tag), tag
    assert tok.decode(full.encode("Zürich 東京", add_special_tokens=True)) == "Zürich 東京"
    assert tok.backend not in backend_parts._WHOLE  # nothing needed the merges yet
    assert tok.encode("東京", add_special_tokens=False) == full.encode("東京", add_special_tokens=False)
    assert tok.backend in backend_parts._WHOLE  # a text tiktoken does not take did


def test_build_merges_builds_a_put_off_tokenizer_once_and_leaves_a_whole_one_alone(
    qwen_parts: tuple[Path, BackendParts, FastBpePlan, Tokenizer],
) -> None:
    tok, full = _deferred(qwen_parts), qwen_parts[3]
    assert tok.backend not in backend_parts._WHOLE
    tok.build_merges()  # what serve does for the models it knows before its first request
    built = backend_parts._WHOLE[tok.backend]
    tok.build_merges()
    assert backend_parts._WHOLE[tok.backend] is built
    assert tok.encode("東京", add_special_tokens=False) == full.encode("東京", add_special_tokens=False)
    full.build_merges()  # a tokenizer parsed whole has nothing put off
    assert full.backend not in backend_parts._WHOLE


@pytest.fixture(scope="module")
def deferred_qwen(qwen_parts: tuple[Path, BackendParts, FastBpePlan, Tokenizer]) -> tuple[Tokenizer, Tokenizer]:
    return _deferred(qwen_parts), qwen_parts[3]


@PROPERTY
@given(text=multilingual_text())
def test_a_tokenizer_without_its_merges_gets_every_id_of_the_whole_one(
    deferred_qwen: tuple[Tokenizer, Tokenizer], text: str
) -> None:
    tok, full = deferred_qwen
    for special in (False, True):
        assert tok.encode(text, add_special_tokens=special) == full.encode(text, add_special_tokens=special)
    assert tok.encode_batch([text, "日本"], add_special_tokens=True) == full.encode_batch([text, "日本"], add_special_tokens=True)
    assert tok.special_text.plain().encode(text, add_special_tokens=False).ids == full.special_text.plain().encode(
        text, add_special_tokens=False
    ).ids
    assert tok.encode("hi", add_special_tokens=True)[0] == ENDOFTEXT
    assert tok.token_id(text) == full.token_id(text)


class _Elsewhere:
    """A stand-in for the helper process: the whole tokenizer's ids, and every call kept."""

    def __init__(self, full: Tokenizer) -> None:
        self.full, self.calls = full, []  # type: ignore[var-annotated]

    def __call__(self, texts: Any, add_special_tokens: bool, plain: bool) -> list[list[int]]:
        self.calls.append((list(texts), add_special_tokens, plain))
        if plain:
            return [self.full.special_text.plain().encode(t, add_special_tokens=False).ids for t in texts]
        return [self.full.encode(t, add_special_tokens=add_special_tokens) for t in texts]


def test_texts_tiktoken_does_not_take_go_whole_to_the_process_that_holds_the_merges(
    qwen_parts: tuple[Path, BackendParts, FastBpePlan, Tokenizer],
) -> None:
    tok, full = _deferred(qwen_parts), qwen_parts[3]
    other = _Elsewhere(full)
    backend_parts.encode_elsewhere(tok.backend, other)
    assert tok.merges_elsewhere and backend_parts.deferred_parts(tok.backend) is not None
    ascii_text, mixed = "Hello, world! It's 12:45.", "Hello 東京 and слово 😀 and more words"
    assert tok.encode(ascii_text, add_special_tokens=False) == full.encode(ascii_text, add_special_tokens=False)
    assert other.calls == [] and not tok.encodes_elsewhere(ascii_text)
    assert tok.encodes_elsewhere(mixed)
    for special in (False, True):
        assert tok.encode(mixed, add_special_tokens=special) == full.encode(mixed, add_special_tokens=special)
    assert other.calls == [([mixed], False, False), ([mixed], True, False)]  # whole, once each: not span by span
    other.calls.clear()
    texts = [ascii_text, mixed, "naïve café", "東京"]
    assert tok.encode_batch(texts, add_special_tokens=False) == full.encode_batch(texts, add_special_tokens=False)
    assert other.calls == [([mixed, "東京"], False, False)]  # one round trip for the batch's others
    other.calls.clear()
    assert tok.special_text.plain_ids(["<|im_end|>", "x"]) == full.special_text.plain_ids(["<|im_end|>", "x"])
    assert other.calls == [(["<|im_end|>", "x"], False, True)]
    tok.build_merges()  # serve's start-up build leaves it to the other process
    assert tok.token_id("東京") == full.token_id("東京")
    assert tok.backend not in backend_parts._WHOLE  # never built here
    assert tok.decode(full.encode(mixed, add_special_tokens=False)) == mixed


def test_a_whole_tokenizer_never_asks_elsewhere(qwen_parts: tuple[Path, BackendParts, FastBpePlan, Tokenizer]) -> None:
    tok, full = _deferred(qwen_parts), qwen_parts[3]
    tok.build_merges()
    other = _Elsewhere(full)
    backend_parts.encode_elsewhere(tok.backend, other)  # too late: built here already
    backend_parts.encode_elsewhere(full.backend, other)  # parsed whole: nothing put off
    for t in (tok, full):
        assert not t.merges_elsewhere and not t.encodes_elsewhere("東京")
        assert t.encode("東京 x", add_special_tokens=False) == full.encode("東京 x", add_special_tokens=False)
    assert other.calls == []
