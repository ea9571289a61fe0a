#!/usr/bin/env python3
"""Key tiles per CTA of a persistent forward over 132 CTAs: the busiest CTA against the mean, when CTA x takes
items x, x + 132, ... (stride) and when each item goes to the CTA with the least work so far (queue). Items:
tile_order.cuh's longest-first order in sections of heads, each item's length its key tiles (attn_query_item)."""
import heapq


def items(T, heads, rows, section, key_tile=128):
    q_tiles = -(-T // rows)
    per = heads if section <= 0 or section > heads else section
    out = []
    for first in range(0, heads, per):
        n = min(per, heads - first)
        for rank in range(q_tiles):
            q0 = (q_tiles - 1 - rank) * rows
            out += [(min(q0 + rows, T) - 1) // key_tile + 1] * n
    return out


def stride(lengths, ctas):
    load = [0] * ctas
    for w, n in enumerate(lengths):
        load[w % ctas] += n
    return load


def queue(lengths, ctas):
    heap, load = [(0, c) for c in range(ctas)], [0] * ctas
    for n in lengths:
        t, c = heapq.heappop(heap)
        load[c] += n
        heapq.heappush(heap, (t + n, c))
    return load


print("T heads rows section: busiest CTA / mean, stride and queue")
for T, heads, rows, section in [(1024, 384, 192, 96), (1024, 256, 192, 96), (1024, 320, 192, 96),
                                (2048, 64, 192, 0), (4096, 32, 128, 24), (8192, 16, 128, 0)]:
    L = items(T, heads, rows, section)
    mean = sum(L) / 132
    print(T, heads, rows, section, "%.3f %.3f" % (max(stride(L, 132)) / mean, max(queue(L, 132)) / mean))
