"""Tokenization layer: tokenizers, chat templates, streaming detokenization, stops, caches.

Pure and synchronous (no asyncio, no sockets of its own); callers run long inputs in
a thread pool and do worker RPCs themselves (see ``registry`` for the GetTokenizer
flow). Importing this package is cheap: transformers is imported only when a chat
template is first compiled.
"""

from gateway.tokenization.chat_template import ChatTemplate, normalize_messages
from gateway.tokenization.detokenizer import IncrementalDetokenizer
from gateway.tokenization.errors import (
    Attempt,
    ChatTemplateBudgetError,
    ChatTemplateError,
    TokenizationError,
    TokenizerArchiveError,
    TokenizerLoadError,
    TokenizerNotFound,
)
from gateway.tokenization.prefix_cache import PrefixCacheStats, PrefixTokenCache
from gateway.tokenization.registry import (
    ResolvedTokenizer,
    TokenizerRegistry,
    cache_dirname,
)
from gateway.tokenization.stops import (
    SampleStream,
    StopMatcher,
    StopPlan,
    StopStep,
    apply_stops,
)
from gateway.tokenization.tokenizer import TOKENIZER_FILES, Tokenizer

# The routing layer's name for the multi-turn cache: one class, two names.
ChatPromptCache = PrefixTokenCache

__all__ = [
    "TOKENIZER_FILES",
    "Attempt",
    "ChatPromptCache",
    "ChatTemplate",
    "ChatTemplateBudgetError",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "PrefixCacheStats",
    "PrefixTokenCache",
    "ResolvedTokenizer",
    "SampleStream",
    "StopMatcher",
    "StopPlan",
    "StopStep",
    "TokenizationError",
    "Tokenizer",
    "TokenizerArchiveError",
    "TokenizerLoadError",
    "TokenizerNotFound",
    "TokenizerRegistry",
    "apply_stops",
    "cache_dirname",
    "normalize_messages",
]
