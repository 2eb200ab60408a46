"""Prefix references on the bus (sync/prefix_book.py): a prefix is sent once then
referred to by its chain hash within an epoch; receivers rebuild the full prompt or count
what they cannot resolve."""

from __future__ import annotations

import struct

from gateway.sync.prefix_book import PrefixBook

BLOCK = 4


def wire(*tokens: int) -> bytes:
    return struct.pack(f"<{len(tokens)}I", *tokens)


PROMPT = wire(*range(1, 11))  # two full blocks of 4 and a tail of 2


def test_a_prompt_goes_whole_the_first_time_then_by_reference() -> None:
    sender = PrefixBook(BLOCK)
    assert sender.encode(PROMPT) == (0, 0, PROMPT)
    ref, count, tail = sender.encode(PROMPT + wire(11, 12))
    assert ref != 0 and count == 2 and tail == wire(9, 10, 11, 12)
    assert len(sender) == 3  # the second message's third block is learned too
    assert sender.encode(wire(1, 2)) == (0, 0, wire(1, 2))  # under one block: nothing to refer to


def test_a_receiver_rebuilds_the_prompt_from_its_own_book() -> None:
    sender, receiver = PrefixBook(BLOCK), PrefixBook(BLOCK)
    first = sender.encode(PROMPT)
    assert receiver.decode(*first, BLOCK) == PROMPT
    second = sender.encode(PROMPT + wire(11, 12))
    assert receiver.decode(*second, BLOCK) == PROMPT + wire(11, 12)
    late = PrefixBook(BLOCK)  # joined after the prefix went out
    assert late.decode(*second, BLOCK) is None and late.unresolved == 1


def test_a_new_epoch_sends_tokens_again() -> None:
    sender = PrefixBook(BLOCK)
    sender.encode(PROMPT)
    sender.new_epoch()  # a peer appeared: it may have missed the blocks
    assert sender.encode(PROMPT) == (0, 0, PROMPT)
    assert sender.encode(PROMPT)[1] == 2


def test_the_book_is_bounded_least_recently_used_first() -> None:
    book = PrefixBook(BLOCK, max_blocks=2)
    book.encode(wire(*range(1, 13)))  # three blocks
    assert len(book) == 2


def test_the_tip_extends_a_prompt_without_resending_it() -> None:
    sender, receiver = PrefixBook(BLOCK), PrefixBook(BLOCK)
    full, tip, blocks = receiver.decode_tip(*sender.encode(PROMPT), BLOCK)  # type: ignore[misc]
    assert full == PROMPT and blocks == 2 and tip != 0
    extended = receiver.decode(tip, blocks, full[4 * BLOCK * blocks :] + wire(11, 12), BLOCK)
    assert extended == PROMPT + wire(11, 12)
    other = PrefixBook(8)  # a peer with another block size: the prompt, but no tip
    assert other.decode_tip(0, 0, PROMPT + PROMPT, BLOCK) == (PROMPT + PROMPT, 0, 0)
    known = len(receiver)
    receiver.learn(wire(1, 2))  # under one block: nothing to learn
    assert len(receiver) == known == 3  # the extension's full block was learned by the decode
