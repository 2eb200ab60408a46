"""OpenAI Conversations end to end with the official ``openai`` client: the conversation
and its items, and responses that read and extend it."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.http.conftest import Stack


def _scripted(text: str) -> str:
    return f"please answer <<sim-reply>>{text}<</sim-reply>>"


async def test_conversation_crud_and_items(stack: Stack) -> None:
    c = stack.client
    conv = await c.conversations.create(
        metadata={"topic": "demo"}, items=[{"type": "message", "role": "user", "content": "first"}],
    )
    assert conv.id.startswith("conv_") and conv.object == "conversation" and conv.metadata == {"topic": "demo"}
    assert (await c.conversations.retrieve(conv.id)).metadata == {"topic": "demo"}
    updated = await c.conversations.update(conv.id, metadata={"topic": "changed"})
    assert updated.metadata == {"topic": "changed"}
    added = await c.conversations.items.create(conv.id, items=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "second"}]},
        {"type": "message", "role": "user", "content": "third"},
    ])
    assert [i.id for i in added.data] == [added.first_id, added.last_id]
    page = await c.conversations.items.list(conv.id, order="asc")
    texts = [i.content[0].text for i in page.data]  # type: ignore[union-attr]
    assert texts == ["first", "second", "third"]
    newest = await c.conversations.items.list(conv.id, limit=1)  # default order: newest first
    assert newest.data[0].content[0].text == "third" and newest.has_more  # type: ignore[union-attr]
    walked = [i.content[0].text async for i in c.conversations.items.list(conv.id, limit=1, order="asc")]  # type: ignore[union-attr]
    assert walked == ["first", "second", "third"]  # the SDK's auto-pagination follows after=last_id
    one = await c.conversations.items.retrieve(added.data[0].id, conversation_id=conv.id)
    assert one.content[0].text == "second"  # type: ignore[union-attr]
    after = await c.conversations.items.delete(added.data[0].id, conversation_id=conv.id)
    assert after.id == conv.id
    with pytest.raises(openai.NotFoundError, match="not found"):
        await c.conversations.items.retrieve(added.data[0].id, conversation_id=conv.id)
    deleted = await c.conversations.delete(conv.id)
    assert deleted.deleted and deleted.id == conv.id
    with pytest.raises(openai.NotFoundError, match="not found"):
        await c.conversations.retrieve(conv.id)


async def test_responses_read_and_extend_the_conversation(stack: Stack) -> None:
    c = stack.client
    conv = await c.conversations.create()
    first = await c.responses.create(model=stack.model, conversation=conv.id, input=_scripted("One."))
    second = await c.responses.create(model=stack.model, conversation=conv.id, input=_scripted("Two."))
    assert (first.output_text, second.output_text) == ("One.", "Two.")
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the first turn is in the second's prompt
    items = await c.conversations.items.list(conv.id, order="asc")
    assert [(i.type, getattr(i, "role", None)) for i in items.data] == [
        ("message", "user"), ("message", "assistant"), ("message", "user"), ("message", "assistant"),
    ]
    assert items.data[3].content[0].text == "Two."  # type: ignore[union-attr]
