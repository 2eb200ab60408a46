"""tiktoken as the encoder where its ids equal HF tokenizers' (the real Qwen3 tokenizer)."""

from __future__ import annotations

import pickle
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from gateway.tokenization import Tokenizer, fast_bpe
from gateway.tokenization.fast_bpe import (
    _SAMPLE,
    FastBpe,
    build_fast_bpe,
    byte_decoder,
    plan_fast_bpe,
)
from gateway_lab.bench.workloads import GspConfig, Vocab, gsp

from .helpers import FRAGMENTS, PROPERTY

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@pytest.fixture(scope="module")
def fresh(qwen_dir: Path) -> Tokenizer:
    """A Qwen3 tokenizer of this module's own (the session one keeps the HF encoder)."""
    return Tokenizer.from_path(qwen_dir)


@pytest.fixture(scope="module")
def fast(fresh: Tokenizer) -> FastBpe:
    built = fresh.fast_bpe
    assert built is not None, "Qwen3's byte-level BPE is tiktoken's: the encoder must apply"
    return built


def _hf(tok: Tokenizer, text: str) -> list[int]:
    ids: list[int] = tok.backend.encode(text, add_special_tokens=False).ids
    return ids


ASCII = string.printable.replace("\x0b", "").replace("\x0c", "")  # printable ASCII, tab, LF, CR
ADDED = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|endoftext|>", "<|im_start"]


@PROPERTY
@given(parts=st.lists(st.one_of(st.text(alphabet=ASCII, max_size=80), st.sampled_from(ADDED)), max_size=12))
def test_ascii_texts_with_added_tokens_match_hf(fresh: Tokenizer, fast: FastBpe, parts: list[str]) -> None:
    text = "".join(parts)
    assert fast.encode(text) == _hf(fresh, text)
    assert fresh.encode(text, add_special_tokens=True) == _hf(fresh, text)


def test_gsp_prompts_and_chat_renders_match_hf(fresh: Tokenizer, fast: FastBpe) -> None:
    config = GspConfig(groups=2, prompts_per_group=2, system_tokens=512, question_tokens=64, text_prompts=True)
    for spec in gsp(config, Vocab.from_tokenizer_dir(), 3):
        assert spec.prompt is not None
        assert fast.encode(spec.prompt) == _hf(fresh, spec.prompt)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": spec.prompt[:700]}]
        chat = fresh.apply_chat_template(messages, add_generation_prompt=True)
        assert fast.encode(chat) == _hf(fresh, chat)
        assert fresh.encode_batch([chat, spec.prompt], add_special_tokens=False) == [_hf(fresh, chat), _hf(fresh, spec.prompt)]


@pytest.mark.parametrize("text", [*FRAGMENTS, "caf\u00e9", "tab\x0bvertical", "form\x0cfeed", "nul\x00byte", "\x1f"])
def test_other_texts_match_hf(fresh: Tokenizer, fast: FastBpe, text: str) -> None:
    assert fast.encode(text) == _hf(fresh, text)  # word runs of other characters go to the HF encoder
    assert fresh.encode(text, add_special_tokens=False) == _hf(fresh, text)
    assert fresh.encode_batch([text, "plain"], add_special_tokens=False) == [_hf(fresh, text), _hf(fresh, "plain")]


# Letters, digits, spaces and marks where the two encoders' Unicode tables or NFC could matter.
OTHER = "ÀÖØöøÿĀž\u017f\u00d7÷ªµƀßŜİ\u0131ĸŉ'éèüßøĝĠġΑβЖж東京語\u0301\u0308\u00a0\u2028\u3000\u200b٣४😀\x0b\x0c\x85"


@PROPERTY
@given(
    parts=st.lists(
        st.one_of(
            st.text(alphabet=ASCII, max_size=40), st.text(alphabet=ASCII + OTHER, max_size=40),
            st.sampled_from([" ", " a", "a ", "é ", " é", "e\u0301 b", "x \u0301y", "'s", "'\u017f", "'ß", "ġ\u0308 x"]),
            st.sampled_from(ADDED),
        ),
        max_size=14,
    )
)  # fmt: skip
def test_any_text_with_added_tokens_matches_hf(fresh: Tokenizer, fast: FastBpe, parts: list[str]) -> None:
    text = "".join(parts)
    assert fast.encode(text) == _hf(fresh, text)
    assert fresh.encode(text, add_special_tokens=True) == _hf(fresh, text)


def test_mostly_ascii_texts_send_only_their_other_words_to_hf(fresh: Tokenizer, fast: FastBpe, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    real = fast._other
    assert real is not None

    def spy(text: str) -> list[int]:
        sent.append(text)
        return real(text)

    monkeypatch.setattr(fast, "_other", spy)
    text = "<|im_start|>user\nIntact may sur name jordan prend this true return 東京 var t lip dam?<|im_end|>\n"
    assert fast.encode(text) == _hf(fresh, text)
    assert sent == [" return 東京 var"]
    sent.clear()
    latin = "<|im_start|>user\nL'été à Zürich, Łódź ġġġġ capacitãł, naïve café<|im_end|>\n"
    assert fast.latin and fast.encode(latin) == _hf(fresh, latin)
    assert sent == []  # Latin-1 and Latin Extended-A letters are tiktoken's too


@PROPERTY
@given(text=st.text(alphabet=[chr(c) for c in range(0xC0, 0x180)] + list("aAsStTdDlLmM' 0123.,\n-"), max_size=60))
def test_latin_letters_match_hf(fresh: Tokenizer, fast: FastBpe, text: str) -> None:
    assert fast.encode(text) == _hf(fresh, text)


def test_the_tokenizer_uses_it_only_once_built(qwen_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = Tokenizer.from_path(qwen_dir)
    assert not tok.fast_bpe_ready
    assert tok.encode("hello world", add_special_tokens=False) == _hf(tok, "hello world")
    assert tok.fast_bpe is not None and tok.fast_bpe_ready

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the HF encoder ran for an ASCII text")

    monkeypatch.setattr(tok, "backend", type("B", (), {"encode": refuse, "encode_batch_fast": refuse})())
    assert tok.encode("hello world " * 400, add_special_tokens=True) == tok.fast_bpe.encode("hello world " * 400)
    assert tok.encode_batch(["a b", "c d" * 2000], add_special_tokens=False) == [[64, 293], tok.fast_bpe.encode("c d" * 2000)]


def _byte_level(merges: list[tuple[str, str]], extra: list[str], *, split: str = QWEN_SPLIT) -> BackendTokenizer:
    alphabet = sorted(byte_decoder(), key=lambda c: byte_decoder()[c])
    vocab = {c: i for i, c in enumerate(alphabet)}
    for token in extra:
        vocab[token] = len(vocab)
    tok = BackendTokenizer(models.BPE(vocab, merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    return tok


def test_a_small_rank_ordered_vocabulary_is_taken() -> None:
    tok = _byte_level([("a", "b"), ("ab", "c")], ["ab", "abc"])
    fast = build_fast_bpe(tok)
    assert fast is not None
    assert fast.encode("abc abcab") == tok.encode("abc abcab", add_special_tokens=False).ids


def test_a_plan_is_plain_data_that_builds_the_same_encoder() -> None:
    tok = _byte_level([("a", "b"), ("ab", "c")], ["ab", "abc"])
    plan = plan_fast_bpe(tok)
    assert plan is not None
    fast = pickle.loads(pickle.dumps(plan)).build(tok)  # what a child process hands back
    direct = build_fast_bpe(tok)
    assert fast is not None and direct is not None
    for text in ("abc abcab", "x abc, 12 ab!", "L'été abc"):
        assert fast.encode(text) == direct.encode(text) == tok.encode(text, add_special_tokens=False).ids


def test_a_plan_builds_nothing_for_another_tokenizer(fresh: Tokenizer) -> None:
    plan = plan_fast_bpe(_byte_level([("a", "b"), ("ab", "c")], ["ab", "abc"]))
    assert plan is not None and plan.build(fresh.backend) is None  # its ids would be another model's


def test_a_plan_builds_for_its_tokenizer_known_by_its_vocabulary_alone(fresh: Tokenizer) -> None:
    """A joining model's tokenizer is built without its merges (``backend_parts.merges_later``):
    the plan's own ids of the sample, spelled by that vocabulary, tell it is the same one."""
    tok = _byte_level([("a", "b"), ("ab", "c")], ["ab", "abc"])
    plan = plan_fast_bpe(tok)
    assert plan is not None and plan.sample == tuple(tok.encode(_SAMPLE, add_special_tokens=False).ids)
    vocabulary_only = _byte_level([], ["ab", "abc"])
    assert vocabulary_only.encode("abc", add_special_tokens=False).ids != tok.encode("abc", add_special_tokens=False).ids
    asked: list[str] = []

    def other(text: str) -> list[int]:
        asked.append(text)
        return list(tok.encode(text, add_special_tokens=False).ids)

    fast = plan.build(vocabulary_only, other)
    assert fast is not None and fast.encode("abc abcab") == tok.encode("abc abcab", add_special_tokens=False).ids
    assert fast.encode("abc 東京") == tok.encode("abc 東京", add_special_tokens=False).ids and asked == ["abc 東京"]
    qwen_vocabulary = Tokenizer(BackendTokenizer(models.BPE(dict(fresh.backend.get_vocab()), [])))
    assert plan.build(qwen_vocabulary.backend, other) is None  # another vocabulary spells other bytes


def test_merges_out_of_rank_order_are_refused() -> None:
    # HF merges "bc" first (merge 0); tiktoken merges the lower-ranked token "ab" first.
    tok = _byte_level([("b", "c"), ("a", "b")], ["ab", "bc"])
    assert tok.encode("abc", add_special_tokens=False).tokens == ["a", "bc"]
    assert build_fast_bpe(tok) is None


def test_a_token_without_its_merge_is_refused() -> None:
    # "abc" is in the vocabulary but no merge makes it: HF never forms it, tiktoken's
    # whole-piece lookup would; the token self-check sees the difference.
    tok = _byte_level([("a", "b")], ["ab", "abc"])
    assert build_fast_bpe(tok) is None


def test_other_pipelines_are_refused() -> None:
    tok = _byte_level([("a", "b")], ["ab"])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    assert build_fast_bpe(tok) is None
    tok = _byte_level([("a", "b")], ["ab"])
    tok.normalizer = normalizers.Lowercase()
    assert build_fast_bpe(tok) is None
    wordpiece = BackendTokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert build_fast_bpe(wordpiece) is None


# Added tokens that are prefixes of each other and overlap, raw (special) and normalized:
# HF cuts the raw ones first, then the normalized ones, each pass leftmost, then longest.
OVERLAPPING = ["<a>", "<a>b", "<a>bc", "b>", "<b", "x<b>y", "[[", "[[[", "]]"]


def _with_overlapping_added_tokens() -> tuple[BackendTokenizer, FastBpe]:
    tok = _byte_level([("a", "b"), ("ab", "c")], ["ab", "abc"])
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in OVERLAPPING[:4]])
    tok.add_tokens([AddedToken(t, normalized=True) for t in OVERLAPPING[4:]])
    fast = build_fast_bpe(tok)
    assert fast is not None
    return tok, fast


@PROPERTY
@given(parts=st.lists(st.one_of(st.text(alphabet="<>[]abcxy \n", max_size=12), st.sampled_from(OVERLAPPING)), max_size=12))
def test_overlapping_added_tokens_are_cut_leftmost_longest_as_in_hf(parts: list[str]) -> None:
    tok, fast = _OVERLAPPING
    text = "".join(parts)
    assert fast.encode(text) == tok.encode(text, add_special_tokens=False).ids


def test_overlapping_added_tokens_examples() -> None:
    tok, fast = _OVERLAPPING
    ids = {t: tok.token_to_id(t) for t in OVERLAPPING}
    for text in ["<a>bc", "<a>b", "<a>", "x<a>b>", "x<b>y<a>bc>", "[[[[", "[[[[[", "]]]", "<<a>>", "<a>bcb>", ""]:
        assert fast.encode(text) == tok.encode(text, add_special_tokens=False).ids, text
    assert fast.encode("<a>bcb>") == [ids["<a>bc"], ids["b>"]]
    assert fast.encode("<b>") == [tok.token_to_id("<"), ids["b>"]]  # the raw pass ("b>") before the normalized one ("<b")
    assert fast.encode("[[[[[") == [ids["[[["], ids["[["]]


_OVERLAPPING = _with_overlapping_added_tokens()


def test_warming_builds_once_per_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gateways that share one parsed tokenizer (several in one process) build its encoder
    and length bound once; warm_encoders leaves both ready (the catalog calls it at load)."""
    from gateway.tokenization import tokenizer as tokenizer_module

    calls: list[str] = []
    monkeypatch.setattr(tokenizer_module, "build_fast_bpe", lambda backend: calls.append("fast") or "encoder")
    monkeypatch.setattr(tokenizer_module, "length_bound", lambda backend: calls.append("bound") or "bound")
    backend = BackendTokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    first, second = Tokenizer(backend), Tokenizer(backend)
    assert not first.fast_bpe_ready and not first.length_bound_ready
    first.warm_encoders()
    second.warm_encoders()
    assert first.fast_bpe_ready and second.length_bound_ready
    assert (second.fast_bpe, second.length_bound) == ("encoder", "bound")
    assert sorted(calls) == ["bound", "fast"]
    Tokenizer(BackendTokenizer(models.WordPiece({"[UNK]": 0}, unk_token="[UNK]"))).warm_encoders()
    assert sorted(calls) == ["bound", "bound", "fast", "fast"]  # another backend builds its own


def test_a_plan_pickles_with_its_ranks_packed(qwen: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan crosses from the child process as flat byte strings and comes back equal, its
    ranks dict rebuilt in steps (no single long unpickle of 150k entries)."""
    from gateway.tokenization import fast_bpe

    plan = fast_bpe.plan_fast_bpe(qwen.backend)
    assert plan is not None
    monkeypatch.setattr(fast_bpe, "_UNPACK_STEP", 1000)
    packed = plan.__reduce__()[1][1]
    assert [type(p) for p in packed] == [bytes, bytes, bytes]  # three objects to unpickle, not 150k
    back = pickle.loads(pickle.dumps(plan))
    assert back == plan and list(back.ranks.items()) == list(plan.ranks.items())
    assert back.build(qwen.backend) is not None


def test_the_table_holds_only_tokens_made_of_bytes_the_encoder_is_given(qwen: Tokenizer) -> None:
    """tiktoken sees printable ASCII and Latin letters only: tokens with other bytes could never
    be looked up, and are left out of its table (which builds faster for it)."""
    from gateway.tokenization.fast_bpe import _LATIN_SAMPLE, _SAMPLE, _TAKEN_BYTES

    plan = plan_fast_bpe(qwen.backend)
    assert plan is not None and plan.latin
    assert all(not raw.translate(None, _TAKEN_BYTES) for raw in plan.ranks)
    assert 0 < len(plan.ranks) < qwen.vocab_size
    assert bytes(range(256)).translate(None, _TAKEN_BYTES)  # some bytes are left out
    fast = plan.build(qwen.backend)
    assert fast is not None
    for text in (_SAMPLE, _LATIN_SAMPLE, "Ça va? naïve Zürich 東京 слово 😀 ok"):
        assert fast.encode(text) == qwen.backend.encode(text, add_special_tokens=False).ids



@pytest.fixture(scope="module")
def own(fresh: Tokenizer) -> FastBpe:
    """An encoder of these tests' own: they read and fill its piece memo."""
    built = build_fast_bpe(fresh.backend)
    assert built is not None
    return built


def test_short_pieces_between_added_tokens_are_encoded_once(fresh: Tokenizer, own: FastBpe, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat's boilerplate pieces come from the memo: the same ids as HF's, every time,
    and an answer its caller changed changes no later answer."""
    own._pieces.clear()
    calls: list[str] = []
    ordinary = own._ordinary
    monkeypatch.setattr(own, "_ordinary", lambda text: calls.append(text) or ordinary(text))
    text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    first = own.encode(text)
    assert first == _hf(fresh, text)
    assert first is not None
    first.append(-1)
    assert own.encode(text) == _hf(fresh, text)
    assert calls == ["system\nBe brief.", "\n", "user\nHi there", "assistant\n"]  # the second "\n" and the whole second text: from the memo


def test_long_pieces_are_not_kept_and_a_full_memo_starts_over(fresh: Tokenizer, own: FastBpe) -> None:
    own._pieces.clear()
    long = "word " * (fast_bpe.PIECE_MEMO_CHARS // 5 + 1)
    assert own.encode(f"<|im_start|>{long}<|im_end|>") == _hf(fresh, f"<|im_start|>{long}<|im_end|>")
    assert long not in own._pieces
    limit = fast_bpe.PIECE_MEMO_ENTRIES
    for i in range(limit + 3):
        text = f"<|im_start|>piece {i}<|im_end|>"
        assert own.encode(text) == _hf(fresh, text)
        assert len(own._pieces) <= limit
    assert own._pieces == {f"piece {i}": tuple(_hf(fresh, f"piece {i}")) for i in range(limit, limit + 3)}
