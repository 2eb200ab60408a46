"""sim layer (see DESIGN.md): a simulated SGLang ``--grpc-mode`` worker.

It serves ``sglang.grpc.scheduler.SglangScheduler`` over real gRPC and stands in
for a GPU in tests, the demo and benchmarks. It imports only ``gateway.proto``
and ``gateway.settings`` from the gateway: it is an independent witness.

Modules, one job each:

* ``config``       -- :class:`SimConfig`, every knob and its default.
* ``radix_cache``  -- the token-level radix KV cache and its token pool (pure).
* ``scheduler``    -- continuous batching in simulated time over that cache.
* ``sampler``      -- deterministic output tokens, logprobs and embeddings.
* ``vocab``        -- the tokenizer facts the worker needs (EOS ids, output ids,
  scripted replies, the GetTokenizer zip).
* ``kv_events``    -- KvEventBatch publishing to SubscribeKvEvents streams.
* ``pd``           -- the prefill/decode bootstrap rendezvous over loopback TCP.
* ``servicer``     -- the gRPC service: validation and protobuf conversion.
* ``worker``       -- :class:`SimWorker`: one server and its lifecycle.
* ``fleet``        -- :class:`SimFleet` (in-process) and :class:`SubprocessFleet`.
* ``cli``          -- ``token-gateway sim-worker``.

Typical use in a test::

    async with SimFleet.start(2, SimConfig().zero_cost()) as fleet:
        fleet.urls               # ["grpc://127.0.0.1:PORT", ...]
        fleet.workers[0].faults  # flip fault knobs live
"""
