"""The sync layer's encode (outbox) and apply logic, against fakes: no NATS, no servers."""

from __future__ import annotations

from gateway.policies.base import Decision, RemoteDecision, RouteRequest, WorkerView
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.radix_tree import pack
from gateway.proto import sync_pb2
from gateway.sync.apply import Applier
from gateway.sync.outbox import Outbox, page_aligned
from gateway.sync.policy_tap import TappedPolicy
from gateway.sync.prefix_book import PrefixBook
from gateway.workers.load import WorkerLoad
from tests.sync.fakes import WORKERS, FakeRouter, FakeWorkers


def _outbox(workers: FakeWorkers, origin: str = "a", clock: list[int] | None = None) -> Outbox:
    t = clock or [1_000]
    return Outbox(origin, lambda wid: workers.get(wid).load if workers.get(wid) else None,
                  lambda wid: workers.get(wid).info.page_size, clock_ns=lambda: t[0])


def test_a_remote_decision_enters_the_tree_like_a_local_one() -> None:
    src, dst = FakeWorkers(), FakeWorkers()
    local, remote = FakeRouter(), FakeRouter()
    box = _outbox(src)
    tap = TappedPolicy(local.p, "regular", box)
    req = RouteRequest(list(range(100, 164)), model="m", request_id="r1")
    decision = tap.select(req, [WorkerView(w, w) for w in WORKERS])
    tap.on_dispatch(req, decision)
    batch = box.take()
    assert batch is not None and len(batch.decisions) == 1
    Applier("b", remote, dst).apply_bytes(batch.SerializeToString())
    probe = RouteRequest([*list(range(100, 164)), 7, 8], model="m")
    assert remote.p.tree("m").match_packed(remote.p._packed(probe))[1] == local.p.tree("m").match_packed(local.p._packed(probe))[1]
    assert remote.p.tree("m").match_packed(remote.p._packed(probe))[1][decision.worker_id] == 64


def test_only_whole_pages_are_published() -> None:
    workers = FakeWorkers(page=16)
    box = _outbox(workers)
    box.dispatched("regular", RouteRequest(list(range(40)), model="m"), Decision("w0:1", "no_match"))
    batch = box.take()
    assert batch is not None
    d = batch.decisions[0]
    assert len(d.tokens) == 4 * 32 and d.prompt_tokens == 40
    assert page_aligned(b"\0" * 40, 4) == b"\0" * 32


def test_one_batch_per_tick_carries_decisions_finishes_and_absolute_loads() -> None:
    workers = FakeWorkers()
    woken: list[int] = []
    box = Outbox("a", lambda wid: workers.get(wid).load, lambda wid: 1, on_pending=lambda: woken.append(1))
    for i in range(5):
        workers.w["w0:1"].load.acquire(10, 4)
        box.dispatched("regular", RouteRequest([i] * 10, model="m"), Decision("w0:1", "no_match"))
    box.finished("regular", RouteRequest([0] * 10, model="m"), "w0:1", 3, True)
    assert woken == [1]  # one wake-up for the whole tick
    batch = box.take()
    assert batch is not None and len(batch.decisions) == 5 and len(batch.finishes) == 1
    assert [(lo.worker_id, lo.in_flight, lo.queued_uncached_prefill_tokens) for lo in batch.loads] == [("w0:1", 5, 50)]
    assert box.take() is None  # nothing new


def test_remote_load_is_summed_into_views_and_healed_by_the_next_figures() -> None:
    src, dst = FakeWorkers(), FakeWorkers()
    box = _outbox(src)
    applier = Applier("b", FakeRouter(), dst)
    guards = [src.w["w1:1"].load.acquire(100, 8) for _ in range(3)]
    box.load_changed("w1:1")
    first = box.take()
    for g in guards[:2]:
        g.release()
    box.load_changed("w1:1")
    second = box.take()
    assert first is not None and second is not None
    applier.apply(first)
    assert dst.w["w1:1"].remote_load.in_flight == 3
    guards[2].release()
    box.load_changed("w1:1")
    third = box.take()  # the second batch is "lost": absolute figures still come out right
    assert third is not None and [lo.in_flight for lo in third.loads] == [0]
    applier.apply(third)
    assert dst.w["w1:1"].remote_load.in_flight == 0
    assert applier.stats.lost_batches == 1


def test_heartbeat_restates_everything_and_silence_or_goodbye_forgets() -> None:
    src, dst = FakeWorkers(), FakeWorkers()
    now = [100.0]
    box = _outbox(src)
    applier = Applier("b", FakeRouter(), dst, peer_timeout_s=3.0, clock=lambda: now[0])
    src.w["w0:1"].load.acquire(5, 5)
    full = box.take(full=WORKERS)
    assert full is not None and full.full_loads
    applier.apply(full)
    assert dst.w["w0:1"].remote_load.in_flight == 1 and len(applier.peers) == 1
    now[0] += 5
    assert applier.expire() == ["a"]
    assert dst.w["w0:1"].remote_load.in_flight == 0
    applier.apply(full)
    bye = box.take(goodbye=True)
    assert bye is not None
    applier.apply(bye)
    assert dst.w["w0:1"].remote_load.in_flight == 0 and not applier.peers


def test_own_foreign_and_unknown_messages_are_skipped() -> None:
    workers = FakeWorkers()
    router = FakeRouter()
    lags: list[float] = []
    applier = Applier("a", router, workers, clock_ns=lambda: 3_000_000, on_lag=lags.extend)
    own = sync_pb2.Batch(origin="a", seq=1)
    own.decisions.add(worker_id="w0:1", model="m", pool="regular", tokens=b"\1\0\0\0")
    applier.apply(own)
    applier.apply_bytes(b"\xff\xff not protobuf")
    other = sync_pb2.Batch(origin="z", seq=1)
    other.decisions.add(worker_id="gone:1", model="m", pool="regular", tokens=b"\1\0\0\0", decided_unix_ns=1_000_000)
    other.decisions.add(worker_id="w0:1", model="other-model", pool="regular", tokens=b"\1\0\0\0", decided_unix_ns=1_000_000)
    applier.apply(other)
    st = applier.stats
    assert (st.own, st.bad, st.skipped, st.decisions) == (1, 1, 2, 0)
    assert lags == [0.002, 0.002]
    assert router.p.tree("m").worker_tokens("w0:1") == 0


def test_published_prefill_is_the_uncached_part_and_heartbeats_send_only_changes() -> None:
    workers = FakeWorkers()
    box = _outbox(workers)
    req = RouteRequest(list(range(100)), model="m", request_id="r")
    workers.w["w0:1"].load.acquire(100, 10)
    box.dispatched("regular", req, Decision("w0:1", "cache_hit", predicted_cached_tokens=75))
    batch = box.take()
    assert batch is not None and [(lo.in_flight, lo.queued_uncached_prefill_tokens) for lo in batch.loads] == [(1, 25)]
    beat = box.take(scan=WORKERS)
    assert beat is not None and not beat.loads  # nothing changed: a bare sign of life
    workers.w["w0:1"].load = WorkerLoad(in_flight=1, running_decode_tokens=10)  # first token: prefill -> decode
    beat = box.take(scan=WORKERS)
    assert beat is not None and [(lo.queued_uncached_prefill_tokens, lo.running_decode_tokens) for lo in beat.loads] == [(0, 10)]
    box.finished("regular", req, "w0:1", 75, True)
    workers.w["w0:1"].load = WorkerLoad()
    done = box.take()
    assert done is not None and [(lo.worker_id, lo.in_flight) for lo in done.loads] == [("w0:1", 0)]


def test_views_add_remote_load_and_the_cost_counts_remote_prefill_once() -> None:
    from gateway.workers.worker import Worker, WorkerInfo
    from tests.fake_transport import FakeTransport

    w = Worker("grpc://w0:1", FakeTransport("grpc://w0:1"), WorkerInfo(model="m"))  # type: ignore[arg-type]
    w.load.acquire(100, 0)
    w.remote_load = WorkerLoad(in_flight=2, queued_prefill_tokens=30, running_decode_tokens=8)
    v = w.view()
    assert (v.in_flight, v.queued_prefill_tokens, v.remote_prefill_tokens, v.running_decode_tokens) == (3, 100, 30, 8)
    policy = CacheAwarePolicy(eviction_interval_s=0)
    assert policy.queued_uncached(v) == 130


def test_prefix_references_rebuild_the_same_prompt_and_unknown_ones_are_skipped() -> None:
    def wire(ids: list[int]) -> bytes:
        return b"".join(i.to_bytes(4, "little") for i in ids)

    a, b = PrefixBook(block_tokens=4), PrefixBook(block_tokens=4)
    system = list(range(1, 17))  # 4 blocks
    first, second = wire([*system, 90, 91]), wire([*system, 95, 96, 97, 98, 99])
    ref, count, tail = a.encode(first)
    assert count == 0 and tail == first  # nothing on the bus yet: all tokens
    assert b.decode(ref, count, tail, 4) == first
    ref, count, tail = a.encode(second)
    assert count == 4 and tail == wire([95, 96, 97, 98, 99])  # the system prompt by reference
    assert b.decode(ref, count, tail, 4) == second
    late = PrefixBook(block_tokens=4)  # joined after the first message
    assert late.decode(ref, count, tail, 4) is None and late.unresolved == 1
    a.new_epoch()  # a new peer appeared: send tokens again
    assert a.encode(second)[1] == 0


def test_blocks_encoding_end_to_end_through_outbox_and_applier() -> None:
    src, dst = FakeWorkers(), FakeWorkers()
    remote = FakeRouter()
    book_a, book_b = PrefixBook(block_tokens=16), PrefixBook(block_tokens=16)
    box = Outbox("a", lambda wid: src.get(wid).load, lambda wid: 1, book=book_a)
    applier = Applier("b", remote, dst, book=book_b)
    system = list(range(500, 564))
    sizes = []
    for q in range(4):
        prompt = [*system, *range(1000 * (q + 1), 1000 * (q + 1) + 16)]
        box.dispatched("regular", RouteRequest(prompt, model="m"), Decision("w1:1", "no_match"))
        batch = box.take()
        assert batch is not None
        sizes.append(len(batch.decisions[0].tokens))
        applier.apply(batch)
        tree = remote.p.tree("m")
        assert tree.match_packed(remote.p._packed(RouteRequest(prompt, model="m")))[1]["w1:1"] == 80
    assert sizes == [320, 64, 64, 64]  # 80 tokens, then only the 16 new ones
    assert applier.stats.unresolved == 0 and applier.stats.decisions == 4


def test_references_resolve_through_blocks_learned_from_earlier_tails() -> None:
    def wire(ids: range) -> bytes:
        return b"".join(i.to_bytes(4, "little") for i in ids)

    a, b = PrefixBook(block_tokens=4), PrefixBook(block_tokens=4)
    grown = [wire(range(1, 1 + n)) for n in (24, 32, 40)]  # each prompt extends the previous one
    counts = []
    for prompt in grown:
        ref, count, tail = a.encode(prompt)
        counts.append(count)
        assert b.decode(ref, count, tail, 4) == prompt
    assert counts == [0, 6, 8] and b.unresolved == 0


def _served(tap: TappedPolicy, prompt: list[int], rid: str) -> tuple[RouteRequest, Decision]:
    req = RouteRequest(prompt, model="m", request_id=rid)
    decision = tap.select(req, [WorkerView(w, w) for w in WORKERS])
    tap.on_dispatch(req, decision)
    return req, decision


def _depth(router: FakeRouter, ids: list[int], worker_id: str) -> int:
    return router.p.tree("m").match_packed(router.p._packed(RouteRequest(ids, model="m")))[1].get(worker_id, 0)


def test_a_learned_output_in_its_decisions_batch_is_merged_into_it() -> None:
    src, dst = FakeWorkers(), FakeWorkers()
    local, remote = FakeRouter(), FakeRouter()
    box = _outbox(src)
    tap = TappedPolicy(local.p, "regular", box)
    prompt, output = list(range(100, 164)), list(range(900, 940))
    req, decision = _served(tap, prompt, "r1")
    tap.on_output(req, decision.worker_id, output)
    tap.on_finish(req, decision.worker_id, 0, True)
    batch = box.take()
    assert batch is not None and len(batch.decisions) == 1  # one message entry, one remote insert
    d = batch.decisions[0]
    assert len(d.tokens) == 4 * (len(prompt) + len(output)) and d.prompt_tokens == len(prompt)
    f = batch.finishes[0]
    assert f.decision == d.id and not f.worker_id and not f.model  # the finish names its decision
    assert box.figures(decision.worker_id) == (0, 0, 0, 0)  # nothing left in flight
    applier = Applier("b", remote, dst)
    applier.apply_bytes(batch.SerializeToString())
    probe = [*prompt, *output, 1, 2]
    assert _depth(local, probe, decision.worker_id) == _depth(remote, probe, decision.worker_id) == len(prompt) + len(output)
    assert applier.stats.decisions == 1 and applier.stats.finishes == 1 and applier.stats.unresolved_finishes == 0


def test_a_later_learned_output_travels_as_an_extension_of_its_decision() -> None:
    for book in (False, True):
        src, dst = FakeWorkers(), FakeWorkers()
        local, remote = FakeRouter(), FakeRouter()
        box = Outbox("a", lambda wid, src=src: src.get(wid).load, lambda wid: 1, book=PrefixBook(16) if book else None)
        applier = Applier("b", remote, dst, book=PrefixBook(16) if book else None)
        tap = TappedPolicy(local.p, "regular", box)
        prompt, output = list(range(100, 200)), list(range(900, 940))  # 100 tokens: 6 blocks and a tail
        req, decision = _served(tap, prompt, "r1")
        first = box.take()
        assert first is not None
        applier.apply(first)
        tap.on_finish(req, decision.worker_id, 0, True)
        tap.on_output(req, decision.worker_id, output)
        batch = box.take()
        assert batch is not None and len(batch.decisions) == 1
        ext = batch.decisions[0]
        assert ext.extends == first.decisions[0].id and not ext.worker_id and not ext.model and not ext.pool
        assert len(ext.tokens) == 4 * len(output)  # only the output's pages travel
        applier.apply_bytes(batch.SerializeToString())
        probe = [*prompt, *output, 5]
        assert _depth(remote, probe, decision.worker_id) == _depth(local, probe, decision.worker_id) == 140
        assert applier.stats.extensions == 1 and applier.stats.unresolved == 0 and applier.stats.finishes == 1
        if book:  # the output's blocks are on the bus now: the next turn refers to them
            nxt = [*prompt, *output, *range(3000, 3020)]
            box.dispatched("regular", RouteRequest(nxt, model="m", request_id="r2"), Decision(decision.worker_id, "no_match"))
            again = box.take()
            assert again is not None and again.decisions[0].prefix_blocks == 8
            applier.apply(again)
            assert applier.stats.unresolved == 0 and _depth(remote, nxt, decision.worker_id) == 160


def test_an_extension_or_finish_of_an_unknown_decision_is_counted_and_dropped() -> None:
    src = FakeWorkers()
    local, late = FakeRouter(), FakeRouter()
    box = _outbox(src)
    tap = TappedPolicy(local.p, "regular", box)
    prompt, output = list(range(100, 164)), list(range(900, 940))
    req, decision = _served(tap, prompt, "r1")
    assert box.take() is not None  # the decision went out before this receiver joined
    tap.on_output(req, decision.worker_id, output)
    tap.on_finish(req, decision.worker_id, 0, True)
    batch = box.take()
    assert batch is not None
    applier = Applier("late", late, FakeWorkers())
    applier.apply(batch)
    st = applier.stats
    assert (st.unresolved, st.unresolved_finishes, st.decisions, st.finishes) == (1, 1, 0, 0)
    assert late.p.tree("m").node_count == 0  # nothing half-applied
    # the next decision from the same origin resolves as usual
    box.dispatched("regular", RouteRequest(list(range(300, 340)), model="m", request_id="r2"), Decision("w1:1", "no_match"))
    nxt = box.take()
    assert nxt is not None
    applier.apply(nxt)
    assert st.decisions == 1 and _depth(late, list(range(300, 340)), "w1:1") == 40


def test_an_output_without_a_known_decision_goes_out_whole() -> None:
    src, dst = FakeWorkers(), FakeWorkers()
    local, remote = FakeRouter(), FakeRouter()
    box = _outbox(src)
    tap = TappedPolicy(local.p, "regular", box)
    prompt, output = list(range(100, 164)), list(range(900, 940))
    req = RouteRequest(prompt, model="m", request_id="never-dispatched-here")
    tap.on_output(req, "w1:1", output)
    tap.on_finish(req, "w1:1", 0, True)
    batch = box.take()
    assert batch is not None
    d, f = batch.decisions[0], batch.finishes[0]
    assert not d.extends and d.worker_id == "w1:1" and d.prompt_tokens == 0 and len(d.tokens) == 4 * 104
    assert not f.decision and f.worker_id == "w1:1" and f.model == "m"
    applier = Applier("b", remote, dst)
    applier.apply(batch)
    assert _depth(remote, [*prompt, *output], "w1:1") == 104 and applier.stats.finishes == 1


def test_batches_keep_every_decision_before_its_finish_and_extension() -> None:
    """Decisions, outputs and finishes of many requests spread over batches of every size:
    the other side applies each decision, its output and its finish exactly once, the
    decision first, and its tree ends up as if it had been told each one directly."""
    src, dst = FakeWorkers(page=4), FakeWorkers(page=4)
    local, remote, expect = FakeRouter(), FakeRouter(), FakeRouter()
    for r in (local, remote, expect):
        r.p.on_workers_changed([WorkerView(w, w, page_size=4) for w in WORKERS])
    box = Outbox("a", lambda wid: src.get(wid).load, lambda wid: 4, book=PrefixBook(8))
    applier = Applier("b", remote, dst, book=PrefixBook(8))
    tap = TappedPolicy(local.p, "regular", box)
    seen: list[tuple[str, int]] = []
    orig = remote.p.on_remote

    def spy(event: object) -> object:
        seen.append((type(event).__name__, len(getattr(event, "tokens", b"")) // 4))
        return orig(event)  # type: ignore[arg-type]

    remote.p.on_remote = spy  # type: ignore[method-assign]
    open_reqs: list[tuple[RouteRequest, Decision]] = []
    rng = __import__("random").Random(7)
    for i in range(300):
        open_reqs.append(_served(tap, [1, 2, 3, 4, *range(1000 + 50 * i, 1000 + 50 * i + 12 + i % 9)], f"r{i}"))
        while open_reqs and rng.random() < 0.5:
            req, dec = open_reqs.pop(rng.randrange(len(open_reqs)))
            out = list(range(9000, 9000 + rng.randrange(0, 12)))
            tap.on_output(req, dec.worker_id, out)
            tap.on_finish(req, dec.worker_id, 0, True)
            n = len(req.token_ids)
            for seq in (req.token_ids[: n // 4 * 4], [*req.token_ids, *out][: (n + len(out)) // 4 * 4]):
                expect.p.on_remote(RemoteDecision(dec.worker_id, "m", pack(seq)))
        if rng.random() < 0.3:
            batch = box.take()
            if batch is not None:
                applier.apply_bytes(batch.SerializeToString())
    for req, dec in open_reqs:
        tap.on_finish(req, dec.worker_id, 0, True)
    batch = box.take()
    assert batch is not None
    applier.apply_bytes(batch.SerializeToString())
    st = applier.stats
    assert st.unresolved == st.unresolved_finishes == st.skipped == 0
    assert st.finishes == 300
    kinds = [k for k, _ in seen]
    assert kinds.count("RemoteDecision") + kinds.count("RemoteExtension") == st.decisions
    assert kinds.count("RemoteExtension") == st.extensions > 0
    assert kinds.count("RemoteFinish") == 0  # cache_aware learns nothing from them: none built
    for req, dec in open_reqs:  # the unfinished ones
        expect.p.on_remote(RemoteDecision(dec.worker_id, "m", pack(req.token_ids[: len(req.token_ids) // 4 * 4])))
    assert remote.p.tree("m").total_tokens == expect.p.tree("m").total_tokens
    for w in WORKERS:
        assert remote.p.tree("m").worker_tokens(w) == expect.p.tree("m").worker_tokens(w)


def test_no_output_is_published_when_the_policy_does_not_learn_it() -> None:
    src = FakeWorkers()
    router = FakeRouter()
    router.p.learn_output = False
    box = _outbox(src)
    tap = TappedPolicy(router.p, "regular", box)
    req = RouteRequest(list(range(100, 164)), model="m", request_id="r1")
    tap.on_output(req, WORKERS[0], list(range(900, 940)))
    assert box.take() is None


def test_an_output_that_completes_no_page_is_not_published() -> None:
    src = FakeWorkers(page=16)
    router = FakeRouter()
    box = _outbox(src)
    tap = TappedPolicy(router.p, "regular", box)
    req = RouteRequest(list(range(100, 164)), model="m", request_id="r1")  # 4 pages
    tap.on_output(req, WORKERS[0], list(range(900, 908)))  # 72 tokens: still 4 whole pages
    assert box.take() is None
    tap.on_output(req, WORKERS[0], list(range(900, 916)))  # 80 tokens: a fifth page
    batch = box.take()
    assert batch is not None and len(batch.decisions) == 1 and len(batch.decisions[0].tokens) == 4 * 80


def test_lag_is_measured_per_decision_from_its_own_stamp_and_not_for_extensions() -> None:
    """The decision-to-tree lag a receiver reports is its clock minus each decision's own
    decision time (so a decision merged with its output keeps its original stamp), and an
    extension, which is not a decision, adds no sample."""
    src, dst = FakeWorkers(), FakeWorkers()
    local, remote = FakeRouter(), FakeRouter()
    t = [1_000_000_000]
    box = _outbox(src, clock=t)
    lags: list[float] = []
    applier = Applier("b", remote, dst, clock_ns=lambda: t[0], on_lag=lags.extend)
    tap = TappedPolicy(local.p, "regular", box)
    req, decision = _served(tap, list(range(100, 164)), "r1")
    t[0] += 3_000_000  # 3 ms later the output is learned, still in the same batch
    tap.on_output(req, decision.worker_id, list(range(900, 916)))
    first = box.take()
    t[0] += 2_000_000  # delivered 2 ms after the batch went out
    assert first is not None
    applier.apply(first)
    assert lags == [0.005]
    req2, decision2 = _served(tap, list(range(300, 364)), "r2")
    applier.apply(box.take())  # type: ignore[arg-type]
    tap.on_output(req2, decision2.worker_id, list(range(900, 916)))
    t[0] += 1_000_000
    ext = box.take()
    assert ext is not None and ext.decisions[0].extends
    applier.apply(ext)
    assert lags == [0.005, 0.0] and applier.stats.extensions == 1


def _nodes(router: FakeRouter) -> list[tuple[int, int, tuple[int, ...], list[tuple[str, int]]]]:
    return sorted((n.start, n.end, n.tokens, sorted(n.workers.items())) for n in router.p.tree("m").nodes())


def test_the_applied_tree_equals_one_told_every_sequence_whole_stamps_included() -> None:
    """Decisions, learned outputs (merged, or extensions continued from the decision's mark)
    and finishes of many requests, over batches of every size, into trees small enough to
    evict inline all the time (so many marks go stale and the whole sequence is inserted
    instead): the receiving tree holds exactly the nodes, stamps and heap entries of a tree
    told each batch's sequences whole, one plain insert each, in the batch's order."""
    import random

    src, dst = FakeWorkers(page=4), FakeWorkers(page=4)
    local, remote, expect = FakeRouter(), FakeRouter(), FakeRouter()
    views = [WorkerView(w, w, page_size=4, kv_capacity_tokens=160) for w in WORKERS]
    for r in (local, remote, expect):
        r.p.on_workers_changed(views)
    box = Outbox("a", lambda wid: src.get(wid).load, lambda wid: 4, book=PrefixBook(8))
    applier = Applier("b", remote, dst, book=PrefixBook(8))
    ref_book, ref_known = PrefixBook(8), {}

    def deliver() -> None:
        batch = box.take()
        if batch is None:
            return
        raw = batch.SerializeToString()
        applier.apply_bytes(raw)
        for d in sync_pb2.Batch.FromString(raw).decisions:  # the reference: whole sequences, in order
            if d.extends:
                wid, wire = ref_known[d.extends]
                wire += d.tokens
            else:
                wid = d.worker_id
                wire = ref_book.decode(d.prefix_hash, d.prefix_blocks, d.tokens, d.block_tokens or 8)
                assert wire is not None
            ref_known[d.id] = (wid, wire)
            if wire:
                expect.p.on_remote(RemoteDecision(wid, "m", wire))

    outcomes: list[bool] = []
    tree_extend = remote.p.tree("m").extend

    def spy(*a: object) -> object:
        out = tree_extend(*a)  # type: ignore[arg-type]
        outcomes.append(out is not None)
        return out

    remote.p.tree("m").extend = spy  # type: ignore[method-assign]
    tap = TappedPolicy(local.p, "regular", box)
    rng = random.Random(11)
    open_reqs: list[tuple[RouteRequest, Decision]] = []
    for i in range(600):
        shared = [1, 2, 3, 4, 5, 6, 7, 8] * rng.randrange(0, 3)  # some prompts share whole blocks
        open_reqs.append(_served(tap, [*shared, *range(1000 + 50 * i, 1000 + 50 * i + 2 + i % 13)], f"r{i}"))
        while open_reqs and rng.random() < 0.5:
            req, dec = open_reqs.pop(rng.randrange(len(open_reqs)))
            tap.on_output(req, dec.worker_id, list(range(9000, 9000 + rng.randrange(0, 14))))
            tap.on_finish(req, dec.worker_id, 0, True)
        if rng.random() < 0.3:
            deliver()
        if i % 97 == 0:
            assert _nodes(remote) == _nodes(expect)
    for req, dec in open_reqs:
        tap.on_finish(req, dec.worker_id, 0, True)
    deliver()
    st = applier.stats
    assert st.unresolved == st.unresolved_finishes == st.skipped == 0 and st.finishes == 600
    assert st.extensions > 100
    got, want = remote.p.tree("m"), expect.p.tree("m")
    got.validate()
    assert _nodes(remote) == _nodes(expect)
    assert got.clock == want.clock and got.stats() == want.stats()
    assert got.stats().total_tokens <= 2 * 160  # it evicted all along
    assert outcomes.count(False) > 20 and outcomes.count(True) > 50  # marks went stale, and many did not


def test_an_extension_whose_mark_went_stale_inserts_the_whole_sequence() -> None:
    """The decision's prompt was evicted from the receiving tree before its output came:
    the extension puts prompt and output back, as a whole insert would."""
    src, dst = FakeWorkers(), FakeWorkers()
    local, remote = FakeRouter(), FakeRouter()
    box = _outbox(src)
    applier = Applier("b", remote, dst)
    tap = TappedPolicy(local.p, "regular", box)
    req, dec = _served(tap, list(range(100, 120)), "r1")
    applier.apply_bytes(box.take().SerializeToString())  # type: ignore[union-attr]
    assert _depth(remote, list(range(100, 120)), dec.worker_id) == 20
    remote.p.tree("m").remove_worker(dec.worker_id)
    remote.p.tree("m").set_worker(dec.worker_id)
    tap.on_output(req, dec.worker_id, [7, 8, 9])
    applier.apply_bytes(box.take().SerializeToString())  # type: ignore[union-attr]
    assert applier.stats.extensions == 1 and applier.stats.unresolved == 0
    assert _depth(remote, [*range(100, 120), 7, 8, 9], dec.worker_id) == 23
    remote.p.tree("m").validate()


def _old_schema() -> type:
    """``Batch`` as an origin built before the whole queued prompts, the host set and relayed
    KV events were sent has it (the same file without those fields)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FileDescriptorProto()
    sync_pb2.DESCRIPTOR.CopyToProto(fd)
    fd.name, fd.package = "old_sync.proto", "old_sync"
    del fd.dependency[:]  # common.proto came with the relayed KV events
    kept_messages = [m for m in fd.message_type if m.name != "KvEvents"]
    del fd.message_type[:]
    fd.message_type.extend(kept_messages)
    gone = {"WorkerLoad": {"queued_prompt_tokens"}, "Batch": {"host_set", "kv_events"}}
    for message in fd.message_type:
        if message.name in gone:
            kept = [f for f in message.field if f.name not in gone[message.name]]
            assert len(kept) == len(message.field) - len(gone[message.name])
            del message.field[:]
            message.field.extend(kept)
        for f in message.field:  # type references into the renamed package
            if f.type_name.startswith(".token_gateway.sync."):
                f.type_name = ".old_sync." + f.type_name.rsplit(".", 1)[1]
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("old_sync.Batch"))


def test_an_older_origins_loads_are_read_and_an_older_receiver_reads_ours() -> None:
    old_batch = _old_schema()
    old = old_batch(origin="old", seq=1)
    old.loads.add(worker_id="w0:1", in_flight=2, queued_uncached_prefill_tokens=300, running_decode_tokens=16)
    dst = FakeWorkers()
    applier = Applier("me", FakeRouter(), dst)
    applier.apply_bytes(old.SerializeToString())
    load = dst.w["w0:1"].remote_load
    assert (load.in_flight, load.queued_prefill_tokens, load.running_decode_tokens) == (2, 300, 16)
    assert dst.w["w0:1"].peer_queued_prompt_tokens == 0  # unknown: its queued requests count as before
    new = sync_pb2.Batch(origin="new", seq=1, host_set="set-1")
    new.kv_events.add(worker_id="w0:1").batch.sequence_number = 5  # skipped by an older receiver
    new.loads.add(worker_id="w0:1", in_flight=1, queued_uncached_prefill_tokens=50, queued_prompt_tokens=2176)
    read = old_batch.FromString(new.SerializeToString())
    assert (read.origin, read.loads[0].in_flight, read.loads[0].queued_uncached_prefill_tokens) == ("new", 1, 50)
