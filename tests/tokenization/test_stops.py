"""Stop handling: plan building, text matching across chunks, token stops, non-streaming."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.tokenization import (
    SampleStream,
    StopMatcher,
    StopPlan,
    StopStep,
    Tokenizer,
    apply_stops,
)

from .helpers import PROPERTY, multilingual_text

IM_END, END_THINK = 151645, 151668


def reference(pieces: Sequence[str], stops: Sequence[str], no_stop_trim: bool) -> tuple[str, str | None]:
    """SGLang's model, one step per piece: after each step the stops are checked in the
    client's order against the text so far, and the text is cut where the matched stop
    first occurs (its scheduler's stop check, then its detokenizer's trim)."""
    text = ""
    for piece in pieces:
        text += piece
        for stop in stops:
            if stop and stop in text:
                pos = text.find(stop)
                return (text[: pos + len(stop)] if no_stop_trim else text[:pos]), stop
    return text, None


def run_matcher(
    matcher: StopMatcher, pieces: Sequence[str]
) -> tuple[str, str | int | None, list[str]]:
    sent: list[str] = []
    for piece in pieces:
        step = matcher.feed(piece)
        sent.append(step.text)
        if step.stopped:
            return "".join(sent), step.matched, sent
    sent.append(matcher.finish().text)
    return "".join(sent), None, sent


def chunk(text: str, sizes: Sequence[int]) -> list[str]:
    pieces, i, k = [], 0, 0
    while i < len(text):
        size = max(1, sizes[k % len(sizes)])
        pieces.append(text[i : i + size])
        i, k = i + size, k + 1
    return pieces


ALPHABET = "ab日😀 "


@PROPERTY
@given(
    text=st.text(ALPHABET, max_size=40),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=4),
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    no_stop_trim=st.booleans(),
)
def test_matcher_equals_sglangs_step_model_for_any_chunking(
    text: str, stops: list[str], sizes: list[int], no_stop_trim: bool
) -> None:
    pieces = chunk(text, sizes)
    expected_text, expected_stop = reference(pieces, stops, no_stop_trim)
    got_text, got_stop, sent = run_matcher(StopMatcher(stops, no_stop_trim), pieces)
    assert (got_text, got_stop) == (expected_text, expected_stop)
    if not no_stop_trim:  # no piece ever sent part of a stop string that then matched
        assert all(expected_stop is None or expected_stop not in p for p in sent)


def test_stop_spanning_chunks_is_held_back_then_trimmed() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("Hello ST") == StopStep("Hello ")
    assert matcher.held_text == "ST"
    assert matcher.feed("O") == StopStep("")
    assert matcher.feed("P and more") == StopStep("", "STOP")
    assert matcher.feed("ignored") == StopStep("")  # a fired stop is final


def test_false_start_is_released() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("ST").text == ""
    assert matcher.feed("ART").text == "START"
    assert matcher.feed("S").text == ""
    assert matcher.finish() == StopStep("S")


def test_overlapping_stops_first_complete_wins() -> None:
    """Across steps the stop complete first wins; within one step, the client's order
    (SGLang checks its stop strings in order after each token)."""
    assert run_matcher(StopMatcher(["abcd", "bc"]), ["ab", "c", "d"])[:2] == ("a", "bc")
    assert run_matcher(StopMatcher(["abcd", "bc"]), ["abcd"])[:2] == ("", "abcd")
    assert run_matcher(StopMatcher(["bc", "abc"]), ["xabc"])[:2] == ("xa", "bc")
    assert run_matcher(StopMatcher(["abc", "bc"]), ["xabc"])[:2] == ("x", "abc")
    # A later-listed stop that ends earlier in the same step loses, as on SGLang.
    assert run_matcher(StopMatcher(["cd", "a"]), ["abcd"])[:2] == ("ab", "cd")


def test_stop_at_the_very_start_and_multibyte() -> None:
    assert run_matcher(StopMatcher(["<<"]), ["<<rest"])[:2] == ("", "<<")
    assert run_matcher(StopMatcher(["世界"]), ["你好世", "界。"])[:2] == ("你好", "世界")
    assert run_matcher(StopMatcher(["😀"], no_stop_trim=True), ["ok😀no"])[:2] == ("ok😀", "😀")


def test_plan_splits_stops_between_worker_and_gateway(qwen: Tokenizer) -> None:
    plan = StopPlan.build(
        qwen, stop=["<|im_end|>", "</think>", " hello", "two words", ""], stop_token_ids=[42]
    )
    hello = qwen.token_id(" hello")
    # One-token strings go to the worker too; the user's ids first.
    assert plan.stop_token_ids == (42, IM_END, END_THINK, hello)
    # Visible strings are matched on text; the skipped special token only by id.
    assert plan.stop_strings == ("</think>", " hello", "two words")
    assert plan.token_stops == {IM_END: "<|im_end|>", 42: 42}
    assert plan.matched_for_token(END_THINK) == "</think>"
    assert plan.matched_for_token(42) == 42


def test_plan_eos_and_ignore_eos(qwen: Tokenizer) -> None:
    assert StopPlan.build(qwen).token_stops == {IM_END: IM_END}
    assert StopPlan.build(qwen, ignore_eos=True).token_stops == {}
    assert StopPlan.build(qwen, eos_token_ids=[7, 8]).token_stops == {7: 7, 8: 8}
    # With special tokens kept in the text, <|im_end|> is matched as text.
    kept = StopPlan.build(qwen, stop="<|im_end|>", ignore_eos=True, skip_special_tokens=False)
    assert kept.stop_strings == ("<|im_end|>",) and kept.stop_token_ids == (IM_END,)


def test_stop_free_requests_share_one_plan_per_eos_set(qwen: Tokenizer) -> None:
    """A request without stops gets the same plan every time (built once), the plan a
    fresh build gives; another EOS set or ignore_eos gets its own."""
    plan = StopPlan.build(qwen, stop=[], stop_token_ids=())
    assert StopPlan.build(qwen) is plan and StopPlan.build(qwen, stop=None, skip_special_tokens=False) is plan
    fresh = StopPlan._build(qwen, None, None, None, False, True, False)
    assert plan == fresh and plan.token_stops == {IM_END: IM_END}
    assert StopPlan.build(qwen, ignore_eos=True) is not plan and StopPlan.build(qwen, ignore_eos=True).token_stops == {}
    assert StopPlan.build(qwen, stop_token_ids=[42]) is not plan
    other = Tokenizer.from_path(qwen.path, name="Qwen/Qwen3-0.6B")
    other.merge_eos_token_ids([7])
    assert StopPlan.build(other).token_stops == {IM_END: IM_END, 7: 7}
    assert StopPlan.build(qwen) is plan


def ids_of(qwen: Tokenizer, text: str) -> list[int]:
    return qwen.encode(text, add_special_tokens=False)


def outcome(step: StopStep) -> tuple[str, str | int | None]:
    return step.text, step.matched


def stream_all(sample: SampleStream, ids: Sequence[int], size: int = 1) -> tuple[str, object]:
    """Stream ids in chunks of ``size``; the joined text and the stop, as a client sees it."""
    texts: list[str] = []
    for i in range(0, len(ids), size):
        chunk_ids = ids[i : i + size]
        step = sample.step(chunk_ids)
        texts.append(step.text)
        if not step.stopped:
            assert step.ids_used == len(chunk_ids)
        else:
            assert step.ids_used is not None and step.ids_used <= len(chunk_ids)
            assert sample.step(ids) == StopStep("", ids_used=0)  # final
            return "".join(texts), step.matched
    last = sample.finish()
    return "".join([*texts, last.text]), last.matched


def test_eos_is_a_token_stop(qwen: Tokenizer) -> None:
    ids = [*ids_of(qwen, "Hello world"), IM_END, *ids_of(qwen, " after")]
    plan = StopPlan.build(qwen)
    assert stream_all(SampleStream(qwen, plan), ids) == ("Hello world", IM_END)
    result = apply_stops(qwen, plan, ids)
    assert outcome(result) == ("Hello world", IM_END)
    assert result.ids_used == ids.index(IM_END)  # the EOS itself is trimmed
    ignoring = StopPlan.build(qwen, ignore_eos=True)
    everything = apply_stops(qwen, ignoring, ids)
    assert outcome(everything) == ("Hello world after", None)
    assert everything.ids_used == len(ids)


def test_special_stop_string_reports_the_string(qwen: Tokenizer) -> None:
    plan = StopPlan.build(qwen, stop=["<|im_end|>"], ignore_eos=True)
    ids = [*ids_of(qwen, "Done."), IM_END]
    assert stream_all(SampleStream(qwen, plan), ids) == ("Done.", "<|im_end|>")


def test_stop_string_across_tokens_in_a_real_stream(qwen: Tokenizer) -> None:
    text = "The answer is 42. Final answer: 42"
    plan = StopPlan.build(qwen, stop=["Final answer"])
    for size in (1, 2, 5):
        sample = SampleStream(qwen, plan)
        assert stream_all(sample, ids_of(qwen, text), size) == (
            "The answer is 42. ",
            "Final answer",
        )
        assert sample.stopped and sample.matched == "Final answer"


def test_visible_stop_token_trim_and_no_trim(qwen: Tokenizer) -> None:
    ids = ids_of(qwen, "<think>\nhmm\n</think>\n\nAnswer")
    assert END_THINK in ids
    by_id = StopPlan.build(qwen, stop_token_ids=[END_THINK])
    assert outcome(apply_stops(qwen, by_id, ids)) == ("<think>\nhmm\n", END_THINK)
    kept = apply_stops(qwen, by_id, ids, no_stop_trim=True)
    assert outcome(kept) == ("<think>\nhmm\n</think>", END_THINK)
    assert kept.ids_used == ids.index(END_THINK) + 1
    by_text = StopPlan.build(qwen, stop=["</think>"])
    trimmed = apply_stops(qwen, by_text, ids)
    assert outcome(trimmed) == ("<think>\nhmm\n", "</think>")
    assert trimmed.ids_used == ids.index(END_THINK) + 1  # the token that completed it


def test_text_stop_before_a_token_stop_in_the_same_chunk(qwen: Tokenizer) -> None:
    ids = [*ids_of(qwen, "abc STOP def"), IM_END]
    plan = StopPlan.build(qwen, stop=["STOP"])
    step = SampleStream(qwen, plan).step(ids)
    assert outcome(step) == ("abc ", "STOP")
    assert qwen.decode(ids[: step.ids_used]).endswith("STOP")


def test_broken_bytes_before_a_token_stop_are_released(qwen: Tokenizer) -> None:
    partial = qwen.backend.token_to_id("ä")  # 0xE4: a character that never completes
    plan = StopPlan.build(qwen)
    result = apply_stops(qwen, plan, [*ids_of(qwen, "x"), partial, IM_END])
    assert outcome(result) == ("x\ufffd", IM_END)


@PROPERTY
@given(
    text=multilingual_text(25),
    data=st.data(),
    no_stop_trim=st.booleans(),
)
def test_streaming_and_non_streaming_agree(
    qwen: Tokenizer, text: str, data: st.DataObject, no_stop_trim: bool
) -> None:
    ids = ids_of(qwen, text)
    decoded = qwen.decode(ids)
    stops: list[str] = []
    if decoded:
        start = data.draw(st.integers(0, len(decoded) - 1))
        stops.append(decoded[start : start + data.draw(st.integers(1, 4))])
    plan = StopPlan.build(qwen, stop=stops, ignore_eos=data.draw(st.booleans()))
    size = data.draw(st.integers(1, 4))
    streamed = stream_all(SampleStream(qwen, plan, no_stop_trim=no_stop_trim), ids, size)
    assert streamed == outcome(apply_stops(qwen, plan, ids, no_stop_trim=no_stop_trim))
    visible = [s for s in stops if s in plan.stop_strings]
    if visible and not any(i in plan.token_stops for i in ids):
        assert streamed == reference(decoded, visible, no_stop_trim)


@pytest.mark.parametrize("stop", [None, [], "x"])
def test_plan_accepts_none_empty_and_a_single_string(qwen: Tokenizer, stop: object) -> None:
    plan = StopPlan.build(qwen, stop=stop)  # type: ignore[arg-type]
    assert plan.stop_strings == (("x",) if stop == "x" else ())


def _steps(sample: SampleStream, ids: Sequence[int], size: int) -> list[StopStep]:
    out = [sample.step(ids[i : i + size]) for i in range(0, len(ids), size)]
    return [*out, sample.finish()]


@PROPERTY
@given(text=multilingual_text(25), data=st.data(), no_stop_trim=st.booleans(), ignore_eos=st.booleans())
def test_without_stop_strings_the_plain_path_equals_the_matcher_path(
    qwen: Tokenizer, text: str, data: st.DataObject, no_stop_trim: bool, ignore_eos: bool
) -> None:
    """No stop string: ``step`` skips the text matcher; every step (text, stop, ids used)
    is what the general path gives, with token stops anywhere in any chunking."""
    ids = ids_of(qwen, text)
    if data.draw(st.booleans()):
        ids.insert(data.draw(st.integers(0, len(ids))), IM_END)
    plan = StopPlan.build(qwen, ignore_eos=ignore_eos, stop_token_ids=data.draw(st.sampled_from([[], [END_THINK]])))
    size = data.draw(st.integers(1, 4))
    plain = SampleStream(qwen, plan, no_stop_trim=no_stop_trim)
    general = SampleStream(qwen, plan, no_stop_trim=no_stop_trim)
    assert plain._plain
    general._plain = False
    assert _steps(plain, ids, size) == _steps(general, ids, size)


@PROPERTY
@given(text=multilingual_text(25), data=st.data(), no_stop_trim=st.booleans(), ignore_eos=st.booleans())
def test_a_joined_stream_gives_the_same_whole_answer(
    qwen: Tokenizer, text: str, data: st.DataObject, no_stop_trim: bool, ignore_eos: bool
) -> None:
    """``joined`` (a whole, not streamed answer) sends several ids to the detokenizer in one
    call: the joined text, the stop and the ids used are those of the one-id-at-a-time path,
    with token stops anywhere and in any chunking (a broken trailing character included)."""
    ids = ids_of(qwen, text)
    if data.draw(st.booleans()):
        ids = [*ids[: data.draw(st.integers(0, len(ids)))], qwen.backend.token_to_id("ä")]  # ends mid-character
    if data.draw(st.booleans()):
        ids.insert(data.draw(st.integers(0, len(ids))), IM_END)
    plan = StopPlan.build(qwen, ignore_eos=ignore_eos, stop_token_ids=data.draw(st.sampled_from([[], [END_THINK]])))
    size = data.draw(st.integers(1, 9))
    joined = SampleStream(qwen, plan, no_stop_trim=no_stop_trim, joined=True)
    general = SampleStream(qwen, plan, no_stop_trim=no_stop_trim)
    general._plain = False

    def whole(steps: list[StopStep]) -> tuple[str, object, list[int | None]]:
        return "".join(s.text for s in steps), [s.matched for s in steps], [s.ids_used for s in steps]

    assert whole(_steps(joined, ids, size)) == whole(_steps(general, ids, size))


def test_a_worker_with_a_tokenizer_gets_the_strings_as_sent_and_no_derived_ids(qwen: Tokenizer) -> None:
    """SGLang's own frontends send stop strings as the client gave them and stop ids as
    given; the gateway sends the same to a worker that matches strings, and still
    matches every string itself."""
    plan = StopPlan.build(
        qwen, stop=["<|im_end|>", " hello", "two words", "", " hello"], stop_token_ids=[42, 42],
        worker_matches_strings=True,
    )
    assert plan.worker_stop_strings == ("<|im_end|>", " hello", "two words")
    assert plan.stop_token_ids == (42,)
    assert plan.stop_strings == (" hello", "two words")
    assert plan.token_stops[IM_END] == "<|im_end|>"
    assert plan.matched_for_token(qwen.token_id(" hello")) == " hello"
    # Without a worker-side tokenizer: no strings, one-token ones as ids.
    assert StopPlan.build(qwen, stop=[" hello"]).worker_stop_strings == ()


def test_a_token_stop_counts_through_the_stop_token(qwen: Tokenizer) -> None:
    """The stop token is generated output (SGLang counts it in completion tokens) though its
    text is trimmed: ``ids_through`` includes it, ``ids_used`` does not."""
    ids = qwen.encode(" one two three", False)
    stream = SampleStream(qwen, StopPlan.build(qwen, stop_token_ids=[ids[1]], ignore_eos=True))
    step = stream.step(ids)
    assert (step.text, step.matched, step.ids_used, step.ids_through) == (" one", ids[1], 1, 2)
