"""Chat-template renders kept per conversation shape, replayed with the new contents.

Most requests to a model differ from earlier ones only in their message texts: the
same roles, the same system-prompt slot, the same tools and options. The template's
render then differs only where it wrote those texts, and where it looked at them.
``render_probe`` runs the template once with the texts held symbolically and returns
a ``Variant``: the pieces the render wrote and every observation of a text that chose
its path. Replaying a variant (checking those observations on the new texts and
joining the pieces with them) gives the render's exact text at a fraction of its cost.

The key of a shape is everything the template sees except the message ``content``
strings, spelled out exactly (``repr`` of plain JSON data is unambiguous: a string is
quoted, ``...`` marks where a content was, and numbers, booleans and null keep their
types). Two renders of one key differ only in their contents, so a variant whose
observations all agree gives the same text as the render would. A shape is probed on
its second sighting (a one-off shape costs only its key), at most ``MAX_PROBES`` times
(each probe adds the variant of a path the earlier ones did not take), and the whole
table starts over when it holds ``MAX_KEYS`` shapes.

Only the real render learns, and only from renders that succeeded: a request that
fails keeps failing through the real render. A probe whose pieces do not reproduce
the real text (never expected) turns the memo off for the template.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gateway.tokenization.render_probe import ProbeTemplate, Variant

log = logging.getLogger(__name__)

MAX_KEYS = 1024
"""Shapes kept (seen or learned); the table is emptied when full."""

MAX_VARIANTS = 4
"""Paths kept per shape."""

MAX_PROBES = 6
"""Probes per shape, whether they gave a variant or not."""

MAX_KEY_CHARS = 16384
"""A shape whose key is longer (large tools or documents) is not kept."""

Shape = tuple[str, list[str], list[dict[str, Any]]]
"""(key, the contents in order, the messages with ``...`` where each content was)."""


class RenderMemo:
    """The variants of one chat template, by shape."""

    def __init__(self, source: str, environment: Callable[[], Any]) -> None:
        try:
            self._probe: ProbeTemplate | None = ProbeTemplate(source, environment())
        except Exception as exc:  # a template the probe cannot follow renders as before
            log.debug("chat template not memoized: %s", exc)
            self._probe = None
        self._variants: dict[str, list[Variant]] = {}
        self._seen: dict[str, int] = {}
        self.hits = 0
        self.probes = 0

    @property
    def enabled(self) -> bool:
        return self._probe is not None

    def shape(self, chat: list[dict[str, Any]], extra: tuple[Any, ...]) -> Shape | None:
        """The shape of a render of ``chat`` (plain data) with ``extra`` (the template's
        other inputs, plain data), or None when it is not kept."""
        if self._probe is None:
            return None
        contents: list[str] = []
        slots: list[dict[str, Any]] = []
        for message in chat:
            content = message.get("content")
            if type(content) is str:
                contents.append(content)
                message = message.copy()
                message["content"] = ...
            slots.append(message)
        return self.shape_of(contents, slots, extra)

    def shape_of(self, contents: list[str], slots: list[dict[str, Any]], extra: tuple[Any, ...]) -> Shape | None:
        """``shape`` from a chat already split: its string contents in order and its
        messages with ``...`` where each was (a caller that copies the messages anyway
        splits them in the same pass)."""
        if self._probe is None:
            return None
        try:
            key = repr((slots, extra))
        except ValueError:  # an integer too long to spell
            return None
        if len(key) > MAX_KEY_CHARS:
            return None
        return key, contents, slots

    def render(self, shape: Shape) -> str | None:
        """The render's text for this shape's contents, when a kept variant answers it."""
        variants = self._variants.get(shape[0])
        if variants is not None:
            contents = shape[1]
            for variant in variants:
                text = variant.render(contents)
                if text is not None:
                    self.hits += 1
                    return text
        return None

    def learn(self, shape: Shape, context: dict[str, Any], text: str) -> None:
        """Note a real render of ``shape`` (``context``: what the template was called with
        but its messages; ``text``: what it wrote); probe it from its second sighting."""
        probe = self._probe
        if probe is None:
            return
        key, contents, slots = shape
        seen = self._seen.get(key, 0)
        if seen > MAX_PROBES:
            return
        if len(self._seen) >= MAX_KEYS and seen == 0:
            self._seen.clear()
            self._variants.clear()
        self._seen[key] = seen + 1
        if seen == 0:
            return
        self.probes += 1
        try:
            variant = probe.probe(contents, {**context, "messages": slots}, text)
        except AssertionError:
            log.warning("a chat template's memo did not reproduce its render; the template renders in full from now on")
            self._probe = None
            self._variants.clear()
            return
        if variant is not None:
            variants = self._variants.setdefault(key, [])
            if len(variants) < MAX_VARIANTS:
                variants.append(variant)
