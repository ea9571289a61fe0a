#!/usr/bin/env python3
"""dev/attention_lab/protocol_model.py - the barrier protocols of the Hopper forward (kernel_fwd.cuh's
hopper_fwd_kernel: one producer and NWG consumer warpgroups over the CTA's work items, which a persistent
launch's producer takes from a queue and hands to the consumers beside their Q buffer) and of the HS-64
bf16/repair key-major pass (kernel_keys64.cuh with kItemLoop: key blocks taken the same way, each handed over
in a slot beside its K/V load) played under random interleavings on the CPU, with the mbarriers' arrival
counts, phases and TMA byte counts, and the copies landing at random moments.

Why: a protocol bug in the kernel (a parity, an arrival count, a buffer reused too early) hangs the GPU or
silently reads a tile that was already overwritten; neither shows on a machine without one. The model checks,
for every launch shape below, that every schedule ends (no deadlock), that no copy into a Q, K or V buffer is
issued or lands while a consumer still reads the data it replaces (nor an item slot rewritten while read, nor
a bf(dS) staging tile of the bf16/repair key-major pass rewritten while read or read before both warpgroups
wrote it), and that no copy is left in flight. It models
the kernel's order of waits and arrivals by hand: change it with the kernel.

Usage: dev/attention_lab/protocol_model.py [--seeds N]   ends with "N passed, N failed"
"""
import argparse
import random

KEYS = 128  # keys per K/V tile


class Mbarrier:
    """count arrivals and outstanding TMA bytes complete a phase; try_wait.parity(p) is true once the phase of
    parity p has completed (the current phase's parity differs from p)."""

    def __init__(self, count):
        self.count, self.pending, self.phase, self.tx = count, count, 0, 0

    def arrive(self, expect_tx=0):
        self.tx += expect_tx
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the count in one phase"
        self._complete()

    def land(self, nbytes):
        self.tx -= nbytes
        self._complete()

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase, self.pending = self.phase + 1, self.count

    def done(self, parity):
        return (self.phase & 1) != parity


class NamedBarrier:
    """bar.sync / bar.arrive with a thread count: a phase completes when `count` threads have arrived, bar.sync
    also waits for that. Every phase must be one warpgroup's syncs and the other's arrivals, count / 2 of each:
    for the forward's turns (kTurnBarrier, owner = the syncing warpgroup) a phase of arrivals alone (one
    warpgroup arriving twice before the other syncs) would let the syncing warpgroup through out of turn; for a
    hand-off that goes either way (owner None: fp32's kTermsFreeBarrier) two hand-offs mixed in one phase would."""

    def __init__(self, count, owner=None):
        self.count, self.owner, self.phase, self.arrived = count, owner, 0, []

    def _arrive(self, kind, wg):
        self.arrived.append((kind, wg))
        if len(self.arrived) == self.count:
            half = self.count // 2
            syncing = self.owner if self.owner is not None else next((w for k, w in self.arrived if k == "sync"), 0)
            want = [("sync", syncing)] * half + [("arrive", 1 - syncing)] * half
            assert sorted(self.arrived) == sorted(want), f"named barrier {self.owner}: a phase of {self.arrived}"
            self.phase, self.arrived = self.phase + 1, []

    def arrive(self, wg):
        self._arrive("arrive", wg)

    def sync(self, wg):
        p = self.phase
        self._arrive("sync", wg)
        while self.phase == p:
            yield


def items(T, heads, rows):
    """the forward's work items in their longest-first order (fwd_item, one section of heads): (q0, key tiles)"""
    q_tiles = -(-T // rows)
    for w in range(q_tiles * heads):
        q0 = (q_tiles - 1 - w // heads) * rows
        yield q0, (min(q0 + rows, T) - 1) // KEYS + 1


class Rendezvous:
    """bar.sync of every consumer thread on one named barrier: a phase completes when `count` threads arrived"""

    def __init__(self, count):
        self.count, self.phase, self.arrived = count, 0, 0

    def sync(self):
        p = self.phase
        self.arrived += 1
        if self.arrived == self.count:
            self.phase, self.arrived = self.phase + 1, 0
        while self.phase == p:
            yield


def claims(every, cta, queued, rng):
    """a CTA's items, then None: its first (every[cta]), then (a persistent launch, `queued`) any number of random
    items, any assignment the other CTAs' timing can leave it"""
    yield every[cta]
    while queued and rng.random() < 0.7:
        yield every[rng.randrange(len(every))]
    yield None


def wait(bar, parity):
    while not bar.done(parity):
        yield


class World:
    """what the model threads of one CTA share: which data each buffer holds (owner[kind][buffer]), who reads it
    (reading[(kind, buffer)]: model threads) and the copies issued, not landed ((barrier, kind, buffer, data))"""

    def __init__(self):
        self.owner, self.reading, self.in_flight = {}, {}, []


class Ring:
    """n buffers of one kind, each with a full barrier (one arrival + the copy's bytes) and an empty barrier (every
    consumer thread): use u of the ring takes buffer u % n in phase u // n, as the kernels' stage counters do."""

    def __init__(self, world, kind, n, consumers):
        self.w, self.kind, self.n = world, kind, n
        self.full = [Mbarrier(1) for _ in range(n)]
        self.empty = [Mbarrier(consumers) for _ in range(n)]
        world.owner[kind] = [None] * n

    def issue(self, u):
        """the producer: waits until use u - n was released, then issues the copy of use u"""
        b = u % self.n
        if u >= self.n:
            yield from wait(self.empty[b], (u // self.n - 1) & 1)
        assert not self.w.reading.get((self.kind, b)), f"a copy into {self.kind} buffer {b} issued while it is read"
        self.full[b].arrive(expect_tx=1)
        self.w.in_flight.append((self.full[b], self.kind, b, u))

    def acquire(self, me, u):
        """a consumer thread waits for use u's copy and starts reading it"""
        b = u % self.n
        yield from wait(self.full[b], (u // self.n) & 1)
        assert self.w.owner[self.kind][b] == u, f"{self.kind} buffer {b} holds {self.w.owner[self.kind][b]}, not {u}"
        self.w.reading.setdefault((self.kind, b), set()).add(me)

    def release(self, me, u):
        self.w.reading[(self.kind, u % self.n)].discard(me)
        self.empty[u % self.n].arrive()

    def read(self, me, u):
        """acquire, read for a while, release"""
        yield from self.acquire(me, u)
        yield
        self.release(me, u)

    def close(self, u, slot, value):
        """the producer: waits until use u - n was released, writes `value` into slot[b] (the item_of word beside
        the buffer) and arrives on full[b] without a copy"""
        b = u % self.n
        if u >= self.n:
            yield from wait(self.empty[b], (u // self.n - 1) & 1)
        assert not self.w.reading.get((self.kind, b)), f"{self.kind} buffer {b}'s slot rewritten while it is read"
        slot[b] = (u, value)
        self.full[b].arrive()

    def landed(self, u):
        """wait until use u's copy landed"""
        yield from wait(self.full[u % self.n], (u // self.n) & 1)

    def skip(self, u):
        """release use u unread, after its copy landed (so the release cannot count toward the previous use)"""
        yield from self.landed(u)
        self.empty[u % self.n].arrive()


def play(live, world, rng):
    """Runs the model threads (generators that yield while they wait) in a random order, landing the copies in
    flight at random moments: a copy into a buffer someone still reads, a failed assertion, a state where no
    thread can move, or copies left over are the failure returned; None when every thread ran to its end."""
    idle = 0
    while live:
        if world.in_flight and rng.random() < 0.3:  # a copy lands
            bar, kind, buf, data = world.in_flight.pop(rng.randrange(len(world.in_flight)))
            if world.reading.get((kind, buf)):
                return f"a copy into {kind} buffer {buf} landed while {sorted(world.reading[(kind, buf)])} read it"
            world.owner[kind][buf] = data
            bar.land(1)
            idle = 0
            continue
        i = rng.randrange(len(live))
        try:
            next(live[i])
        except StopIteration:
            live.pop(i)
        except AssertionError as e:
            return str(e)
        idle += 1
        if idle > 100000:
            return "deadlock: no thread can move and no copy is in flight"
    return "copies left in flight at exit" if world.in_flight else None


def run_cta(cta, grid, T, heads, nwg, stages, qbufs, rng, overlap=True, turns=True, threads_per_wg=4):
    """one CTA of the forward; each warpgroup is threads_per_wg model threads (arrival counts scaled to match).
    overlap: the kernel's kOverlap order (K(kt) read beside V(kt - 1); fp32 at HS 64 reads tile by tile).
    turns: the kernel's kTurns (two overlapping warpgroups; not fp32).
    The CTA's items: its first, then (a persistent launch, grid below the item count) as many as the work queue
    hands it, each claimed once a Q buffer is free (the model takes a random number of random items: any
    assignment the other CTAs' timing can leave it), written beside the buffer (item_of) and read by the
    consumers after its q_full; the end is an arrival without a copy. With two overlapping warpgroups (HS 128)
    they take turns to issue each iteration's GEMMs (kTurnBarrier): warpgroup 1 gives warpgroup 0 the first
    turn, and a warpgroup whose rows all lie past T runs the loop's waits, turns and releases without its reads.
    Returns None or the failure."""
    rows = 64 * nwg
    consumers = nwg * threads_per_wg
    world = World()
    q, k, v = Ring(world, "q", qbufs, consumers), Ring(world, "k", stages, consumers), Ring(world, "v", stages,
                                                                                          consumers)
    every = list(items(T, heads, rows))
    queued = grid < len(every)
    item_of = [None] * qbufs
    turns = turns and nwg == 2 and overlap
    turn = [NamedBarrier(2 * threads_per_wg, w) for w in range(2)]

    def producer():  # an item's Q, K(0), then K(kt) and V(kt - 1), then the last V (produce_tile)
        seq = 0
        for use, item in enumerate(claims(every, cta, queued, rng)):
            if item is None:
                yield from q.close(use, item_of, None)
                return
            if use >= qbufs:  # the buffer's previous use released, then its item_of written, then the copy
                yield from wait(q.empty[use % qbufs], (use // qbufs - 1) & 1)
            item_of[use % qbufs] = (use, item)
            yield from q.issue(use)
            n = item[1]
            yield from k.issue(seq)
            for kt in range(1, n):
                yield from k.issue(seq + kt)
                yield from v.issue(seq + kt - 1)
            yield from v.issue(seq + n - 1)
            seq += n

    def take_turn(wg):  # bar.sync on its own turn barrier, then bar.arrive on the other's
        yield from turn[wg].sync(wg)
        turn[1 - wg].arrive(wg)

    def consumer(wg, me):
        seq = 0
        if turns and wg == 1:
            turn[0].arrive(wg)
        for use in range(1 << 30):
            b = use % qbufs
            yield from wait(q.full[b], (use // qbufs) & 1)
            yield  # the read of item_of may come any time before the thread's q_empty arrival
            assert item_of[b] is not None and item_of[b][0] == use, f"item_of[{b}] holds use {item_of[b]}, not {use}"
            if item_of[b][1] is None:
                return
            q0, n = item_of[b][1]
            r0 = q0 + 64 * wg
            n_tiles = (min(r0 + 64, T) - 1) // KEYS + 1 if r0 < T else 0
            if n_tiles > 0:
                yield from q.acquire(me, use)
                if overlap:  # S(0) alone; S(kt) beside P(kt-1) V(kt-1), K released first; the last P V
                    yield from k.read(me, seq)
                    for kt in range(1, n_tiles):
                        yield from k.acquire(me, seq + kt)
                        yield from v.acquire(me, seq + kt - 1)
                        if turns:
                            yield from take_turn(wg)
                        yield
                        k.release(me, seq + kt)
                        yield
                        v.release(me, seq + kt - 1)
                    yield from v.read(me, seq + n_tiles - 1)
                else:
                    for kt in range(n_tiles):
                        yield from k.read(me, seq + kt)
                        yield from v.read(me, seq + kt)
                q.release(me, use)
            else:  # rows all past T: Q released unread, after its copy landed
                yield from q.skip(use)
            if turns and n_tiles == 0:  # the overlapped loop's waits, turns and releases without its reads
                assert n > 0
                yield from k.skip(seq)
                for kt in range(1, n):
                    yield from k.landed(seq + kt)
                    yield from v.landed(seq + kt - 1)
                    yield from take_turn(wg)
                    k.empty[(seq + kt) % k.n].arrive()
                    v.empty[(seq + kt - 1) % v.n].arrive()
                yield from v.skip(seq + n - 1)
            else:
                assert not turns or n_tiles == n, "two warpgroups that take turns read all of an item's tiles or none"
                for kt in range(n_tiles, n):  # release_tile
                    yield from k.skip(seq + kt)
                    yield from v.skip(seq + kt)
            seq += n

    live = [producer()] + [consumer(wg, (wg, i)) for wg in range(nwg) for i in range(threads_per_wg)]
    return play(live, world, rng)


def key_items(T, heads, step_rows):
    """the HS-64 key-major pass's work items in their longest-first order (keymajor_queue_item, one section of
    heads): the number of query steps of step_rows rows of each 128-key block, from the block's own to the last"""
    blocks, steps = -(-T // KEYS), -(-T // step_rows)
    for w in range(blocks * heads):
        yield steps - w // heads * KEYS // step_rows  # key block w // heads (rank-major, one section)


def run_keys_cta(cta, grid, T, heads, step_rows, kv_bufs, rng, threads_per_wg=4, stages=2, ds_tiles=0,
                 dq_turns=False):
    """one CTA of the key-major pass over work items (hopper_bwd_common.cuh's keymajor_produce_items and the consumers'
    item loop of keys64_pass): two consumer warpgroups of threads_per_wg model threads each; K and V in
    kv_bufs buffers (kv_full[b]: one arrival + the copy; kv_empty[b]: every consumer thread, after the item's last
    step), the item written to item_slot[b] before the kv_full[b] arrival, the Q/dO stages one ring over the CTA's
    items. With one K/V buffer the producer fills an item's first stages before it waits for the previous item's K
    and V to be released; with two it loads an item's K and V first (the buffer's last item ended before the previous
    one began). The CTA's items: its first, then (grid below the item count) any number of random items; the end is an
    item of no steps with a plain kv_full arrival. ds_tiles (bf16/repair: 2): each warpgroup stages its bf(dS) into
    its half of the step's staging tile (step % ds_tiles), every consumer thread syncs on one named barrier, the
    stage is released, and each thread reads the tile's both halves for its dQ rows; a half rewritten while read, or
    read before this step's write, is the failure. The item ends with a sync on the same barrier (the give-up
    check). dq_turns (fp32): each warpgroup stages its own terms (after, at a step after the other warpgroup's
    turn, the hand-off barrier), every consumer thread syncs, and the warpgroup whose turn it is (the step's
    parity) reads both warpgroups' terms, then hands the barrier off. Returns None or the failure."""
    consumers = 2 * threads_per_wg
    world = World()
    kv = Ring(world, "kv", kv_bufs, consumers)
    qdo = Ring(world, "qdo", stages, consumers)
    every = list(key_items(T, heads, step_rows))
    queued = grid < len(every)
    slot = [None] * kv_bufs
    consumers_bar = Rendezvous(consumers)
    ds_step = [[None, None] for _ in range(ds_tiles)]  # the step whose bf(dS) each warpgroup's half holds
    terms_free = NamedBarrier(consumers)  # the hand-off of kTermsFreeBarrier, either way
    wg_gemm = [Rendezvous(threads_per_wg) for _ in range(2)]  # a warpgroup's wgmma: complete once all issued it
    terms_step = [None, None]  # dq_turns: the step whose dS terms each warpgroup's tiles hold

    def producer():
        seq = 0
        for use, n in enumerate(claims(every, cta, queued, rng)):
            steps = 0 if n is None else n
            b = use % kv_bufs
            kv_at = 0 if use == 0 or kv_bufs > 1 else min(stages, steps)
            for i in range(steps + 1):
                if i == kv_at:
                    if use >= kv_bufs:  # kv_empty of the buffer's last item, then the slot, then the copy (or the end)
                        yield from wait(kv.empty[b], (use // kv_bufs - 1) & 1)
                    assert not world.reading.get(("slot", b)), f"item_slot[{b}] rewritten while a consumer reads it"
                    if n is None:
                        yield from kv.close(use, slot, None)
                        return
                    slot[b] = (use, n)
                    yield from kv.issue(use)
                if i == steps:
                    break
                yield from qdo.issue(seq + i)
            seq += steps

    def consumer(me):
        seq = 0
        for use in range(1 << 30):
            b = use % kv_bufs
            yield from wait(kv.full[b], (use // kv_bufs) & 1)
            assert slot[b] is not None and slot[b][0] == use, f"item_slot[{b}] holds {slot[b]}, not use {use}"
            if slot[b][1] is None:
                return
            world.reading.setdefault(("slot", b), set()).add(me)  # read again for the epilogue's head
            n = slot[b][1]
            yield from kv.acquire(me, use)
            for i in range(n):
                assert world.owner["kv"][b] == use, f"K/V of use {world.owner['kv'][b]} read in a step of use {use}"
                if ds_tiles:
                    step, wg = seq + i, me[0]
                    tile = ("ds", step % ds_tiles)
                    yield from qdo.acquire(me, step)
                    yield  # S^T, dP^T, P, dS
                    readers = world.reading.get(tile)
                    assert not readers, f"staging tile {tile[1]} rewritten while {sorted(readers)} read it"
                    ds_step[tile[1]][wg] = step
                    yield from consumers_bar.sync()
                    qdo.release(me, step)  # after the dV/dK GEMMs' wait
                    world.reading.setdefault(tile, set()).add(me)
                    held = ds_step[tile[1]]
                    assert held == [step, step], f"staging tile {tile[1]} holds steps {held} at step {step}"
                    yield  # the dQ GEMM's A loads
                    assert ds_step[tile[1]] == [step, step], f"staging tile {tile[1]} rewritten during step {step}"
                    world.reading[tile].discard(me)
                elif dq_turns:
                    step, wg = seq + i, me[0]
                    yield from qdo.acquire(me, step)
                    yield  # S^T, dP^T
                    if step > 0 and ((step - 1) & 1) != wg:  # the other warpgroup read these tiles at step - 1
                        yield from terms_free.sync(wg)
                    readers = world.reading.get(("terms", wg))
                    assert not readers, f"warpgroup {wg}'s terms rewritten while {sorted(readers)} read them"
                    terms_step[wg] = step
                    yield from consumers_bar.sync()
                    qdo.release(me, step)  # after the dV/dK GEMMs' wait
                    if (step & 1) == wg:
                        for w in (0, 1):
                            world.reading.setdefault(("terms", w), set()).add(me)
                        assert terms_step == [step, step], f"the terms hold steps {terms_step} at step {step}"
                        yield  # the dQ GEMMs' A loads
                        assert terms_step == [step, step], f"the terms rewritten during step {step}'s dQ loads"
                        for w in (0, 1):
                            world.reading[("terms", w)].discard(me)
                        yield from wg_gemm[wg].sync()  # wgmma_wait<0>: the collective GEMMs read every thread's A
                        terms_free.arrive(wg)
                else:
                    yield from qdo.read(me, seq + i)
                yield  # the dQ GEMM still reads K after the stage's release
                assert world.owner["kv"][b] == use, f"K/V of use {world.owner['kv'][b]} read by the dQ GEMM of {use}"
            yield
            world.reading[("slot", b)].discard(me)
            kv.release(me, use)
            if ds_tiles or dq_turns:
                yield from consumers_bar.sync()  # consumers_sync_any: whether the CTA gave up
            seq += n

    live = [producer()] + [consumer((wg, i)) for wg in range(2) for i in range(threads_per_wg)]
    return play(live, world, rng)


def run_rows_cta(cta, grid, T, heads, pipelined, rng, threads_per_wg=4, stages=2, qbufs=2):
    """one CTA of the HS-64 row pass over work items (kernel_rows.cuh's rows_produce_items and the consumers' item
    loop of rows_pass, kItemLoop): two consumer warpgroups of threads_per_wg model threads; Q/dO in qbufs buffers,
    each with item_full (the producer's arrival after writing item_of[b]), q_full (one arrival + the copy) and
    q_empty (every consumer thread, after the item's outputs); the K/V stages one ring over the CTA's items.
    pipelined (gproj): tile kt is released after the wait for tile kt + 1 (its last half's DSK/PK GEMMs go with the
    next half's S/dP); else each tile is released after it is read. The producer ends by waiting for its last
    item's release. Items: 128 query rows each (key tiles = the row tile's index + 1), the CTA's first, then any
    number of random ones. Returns None or the failure."""
    consumers = 2 * threads_per_wg
    world = World()
    q = Ring(world, "q", qbufs, consumers)
    kv = Ring(world, "kv", stages, consumers)
    item_full = [Mbarrier(1) for _ in range(qbufs)]
    q_tiles = -(-T // KEYS)
    every = [q_tiles - w // heads for w in range(q_tiles * heads)]  # key tiles of the longest-first items
    queued = grid < len(every)
    item_of = [None] * qbufs

    def producer():
        seq = 0
        use = 0
        for use, n in enumerate(claims(every, cta, queued, rng)):
            b = use % qbufs
            if use >= qbufs:
                yield from wait(q.empty[b], (use // qbufs - 1) & 1)
            assert not world.reading.get(("slot", b)), f"item_of[{b}] rewritten while a consumer reads it"
            item_of[b] = (use, n)
            item_full[b].arrive()
            if n is None:
                break
            yield from q.issue(use)
            for kt in range(n):
                yield from kv.issue(seq + kt)
            seq += n
        last = use - 1  # the last item's release, then the end
        yield from wait(q.empty[last % qbufs], (last // qbufs) & 1)

    def consumer(me):
        seq = 0
        for use in range(1 << 30):
            b = use % qbufs
            yield from wait(item_full[b], (use // qbufs) & 1)
            assert item_of[b] is not None and item_of[b][0] == use, f"item_of[{b}] holds {item_of[b]}, not use {use}"
            n = item_of[b][1]
            if n is None:
                return
            world.reading.setdefault(("slot", b), set()).add(me)  # read again for the outputs' head
            yield  # the row state's loads
            yield from q.acquire(me, use)
            for kt in range(n):
                yield from kv.acquire(me, seq + kt)
                if pipelined and kt > 0:
                    kv.release(me, seq + kt - 1)
                yield
                if not pipelined:
                    kv.release(me, seq + kt)
            if pipelined:
                kv.release(me, seq + n - 1)
            yield  # the outputs
            world.reading[("slot", b)].discard(me)
            q.release(me, use)
            seq += n

    live = [producer()] + [consumer((wg, i)) for wg in range(2) for i in range(threads_per_wg)]
    return play(live, world, rng)


def sweep(label, shapes, n_items, run, seeds):
    """runs every CTA of each launch (T, heads, grid) under `seeds` random schedules: (passed, failed)"""
    passed = failed = 0
    for T in shapes:
        for heads in (1, 3, 6):
            for grid in (1, 2, 5, 10 ** 6):  # persistent launches, and one CTA per item
                for seed in range(seeds):
                    rng = random.Random(seed)
                    errors = [e for cta in range(min(grid, n_items(T, heads)))
                              for e in [run(cta, grid, T, heads, rng)] if e]
                    if errors:
                        failed += 1
                        print(f"FAIL {label} T {T} heads {heads} grid {grid} seed {seed}: {errors[0]}")
                    else:
                        passed += 1
    return passed, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="random schedules per launch shape (default 3)")
    args = ap.parse_args()
    results = []
    # the forward: HS 128 (turns; fp32 without); HS 64; HS 64 fp32 (tile by tile)
    for nwg, overlap, turns in ((2, True, True), (2, True, False), (3, True, False), (3, False, False)):
        results.append(sweep(f"forward NWG {nwg} overlap {overlap} turns {turns}",
                             (1, 50, 64, 65, 77, 128, 129, 191, 192, 193, 256, 257, 320, 383, 385, 1000, 1024, 2048),
                             lambda T, heads: -(-T // (64 * nwg)) * heads,
                             lambda cta, grid, T, heads, rng: run_cta(cta, grid, T, heads, nwg, 2, 2, rng, overlap,
                                                                      turns),
                             args.seeds))
    # the HS-64 key-major pass: bf16/repair (128-query steps, one K/V buffer, two Q/dO stages), gproj (64, two, three),
    # fp32 (64, two, two)
    # (bf16/repair with the staging tiles of both warpgroups' bf(dS) by step parity; fp32 with its dQ turns)
    for mode, step_rows, kv_bufs, stages, ds, turns in (("bf16/repair", 128, 1, 2, 2, False),
                                                        ("gproj", 64, 2, 3, 0, False), ("fp32", 64, 2, 2, 0, True)):
        results.append(sweep(f"key-major HS 64 {mode}", (1, 77, 128, 129, 256, 385, 1000, 1024, 2048),
                             lambda T, heads: -(-T // KEYS) * heads,
                             lambda cta, grid, T, heads, rng: run_keys_cta(cta, grid, T, heads, step_rows, kv_bufs,
                                                                           rng, stages=stages, ds_tiles=ds,
                                                                           dq_turns=turns),
                             args.seeds))
    # the HS-64 row pass: gproj (pipelined halves), fp32
    for mode, pipelined in (("gproj", True), ("fp32", False)):
        results.append(sweep(f"row pass HS 64 {mode}", (1, 77, 128, 129, 256, 385, 1000, 1024, 2048),
                             lambda T, heads: -(-T // KEYS) * heads,
                             lambda cta, grid, T, heads, rng: run_rows_cta(cta, grid, T, heads, pipelined, rng),
                             args.seeds))
    passed, failed = sum(r[0] for r in results), sum(r[1] for r in results)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
