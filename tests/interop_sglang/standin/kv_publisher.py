"""An engine's own KV-event publishers (SGLang's or vLLM's), one per data-parallel rank, driven from stdin.

    .interop-venv/bin/python -m tests.interop_sglang.standin.kv_publisher \\
        --endpoint tcp://127.0.0.1:34050 --replay tcp://127.0.0.1:34060 --ranks 2
    .interop-vllm-venv/bin/python -m tests.interop_sglang.standin.kv_publisher --engine vllm ...

Makes the engine's ``ZmqEventPublisher`` (its class, its sockets, its replay buffer) for each
rank through its ``EventPublisherFactory``, as SGLang's scheduler and vLLM's engine core make
them, prints ``ready``, then publishes one ``KVEventBatch`` per JSON line read:
``{"rank": R, "stored": [[hashes], parent, [ids]]}`` (block size 2), ``{"rank": R, "removed":
[hashes]}`` or ``{"rank": R, "cleared": true}``; prints ``published R SEQ`` after each. Ends at
the end of stdin. Runs in that engine's interop virtualenv.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def _publishers(engine: str, endpoint: str, replay: str, ranks: int) -> tuple[Any, list[Any]]:
    """The engine's ``kv_events`` module and one publisher per rank, from the config each engine takes."""
    config = {"publisher": "zmq", "endpoint": endpoint, "replay_endpoint": replay, "topic": "kv"}
    if engine == "vllm":
        from vllm.config import KVEventsConfig
        from vllm.distributed import kv_events as vllm_events

        made = KVEventsConfig(enable_kv_cache_events=True, **config)
        return vllm_events, [vllm_events.EventPublisherFactory.create(made, rank) for rank in range(ranks)]
    from sglang.srt.disaggregation import kv_events as sglang_events

    text = json.dumps(config)  # SGLang's scheduler hands the factory its flag's JSON text
    return sglang_events, [sglang_events.EventPublisherFactory.create(text, rank) for rank in range(ranks)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=("sglang", "vllm"), default="sglang")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--replay", required=True)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    k, pubs = _publishers(args.engine, args.endpoint, args.replay, args.ranks)
    vllm = args.engine == "vllm"
    medium: dict[str, Any] = {"medium": "GPU"} if vllm else {}  # vLLM's events name the cache they describe
    sent = [0] * args.ranks
    print("ready", flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        rank = order["rank"]
        if "stored" in order:
            hashes, parent, ids = order["stored"]
            event = k.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=ids, block_size=2,
                                  lora_id=None, **medium, **({"lora_name": None} if vllm else {}))
        elif "removed" in order:
            event = k.BlockRemoved(block_hashes=order["removed"], **medium)
        else:
            event = k.AllBlocksCleared()
        # vLLM's engine core names its rank in each batch; SGLang's scheduler leaves it out here.
        extra = {"data_parallel_rank": rank} if vllm else {}
        pubs[rank].publish(k.KVEventBatch(ts=time.time(), events=[event], **extra))
        print(f"published {rank} {sent[rank]}", flush=True)
        sent[rank] += 1
    for pub in pubs:
        pub.shutdown()


if __name__ == "__main__":
    main()
