"""SGLang's own KV-event publishers, one per attention-DP rank, driven from stdin.

    .interop-venv/bin/python -m tests.interop_sglang.standin.kv_publisher \\
        --endpoint tcp://*:34050 --replay tcp://*:34060 --ranks 2

Makes ``ZmqEventPublisher`` (SGLang's class, its sockets, its replay buffer) for each rank
through ``EventPublisherFactory`` as SGLang's scheduler does, prints ``ready``, then publishes
one ``KVEventBatch`` per JSON line read: ``{"rank": R, "stored": [[hashes], parent, [ids]]}``
(block size 2), ``{"rank": R, "removed": [hashes]}`` or ``{"rank": R, "cleared": true}``;
prints ``published R SEQ`` after each. Ends at the end of stdin.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> None:
    from sglang.srt.disaggregation import kv_events as k

    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--replay", required=True)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    config = json.dumps({"publisher": "zmq", "endpoint": args.endpoint, "replay_endpoint": args.replay, "topic": "kv"})
    pubs = [k.EventPublisherFactory.create(config, rank) for rank in range(args.ranks)]
    sent = [0] * args.ranks
    print("ready", flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        rank = order["rank"]
        if "stored" in order:
            hashes, parent, ids = order["stored"]
            event = k.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=ids, block_size=2, lora_id=None)
        elif "removed" in order:
            event = k.BlockRemoved(block_hashes=order["removed"])
        else:
            event = k.AllBlocksCleared()
        pubs[rank].publish(k.KVEventBatch(ts=time.time(), events=[event]))
        print(f"published {rank} {sent[rank]}", flush=True)
        sent[rank] += 1
    for pub in pubs:
        pub.shutdown()


if __name__ == "__main__":
    main()
