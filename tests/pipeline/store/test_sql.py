"""The shared SQL: rows come back as the records that went in (JSON columns, nulls)."""

from __future__ import annotations

import orjson

from gateway.pipeline.store.sql import _item, _response


def test_rows_become_records() -> None:
    row = ("resp_1", "k", 12.5, None, "conv_1", orjson.dumps({"a": "é"}).decode(), "[]", '{"msg_1": [1, 2]}', None)
    rec = _response(row)
    assert (rec.id, rec.owner, rec.created_at, rec.previous_response_id, rec.conversation_id) == ("resp_1", "k", 12.5, None, "conv_1")
    assert rec.body == {"a": "é"} and rec.input_items == [] and rec.output_token_ids == {"msg_1": [1, 2]} and rec.heartbeat is None
    item = _item((7, "msg_1", "conv_1", "k", 3, '{"type": "message"}', None))
    assert (item.seq, item.id, item.item, item.token_ids) == (7, "msg_1", {"type": "message"}, None)
