"""A stand-in for a vLLM engine's KV event publisher, for interop tests.

It binds a PUB socket and a replay ROUTER socket with pyzmq and publishes
MessagePack batches packed with the msgpack module, in the layouts vLLM has
used: positional arrays (vLLM until mid 2026, SGLang) and maps keyed by field
name (vLLM since PR 42892), with integer and byte-string block hashes.

Usage: vllm_publisher.py PUB_PORT REPLAY_PORT TOPIC BLOCK_SIZE [REPLAY_SHAPE]

REPLAY_SHAPE is "seq" (the default: replies [seq, payload], as SGLang and
vLLM before 2026 send), "topic" (replies [topic, seq, payload] and the end
marker ["", -1, ""], as vLLM's ZmqEventPublisher._service_replay sends in
2026) or "epoch" (replies as "seq", and the live messages' topic frame ends
with "\x00sgl-kv-epoch=" and the publisher's epoch, as SGLang's
ZmqEventPublisher sends them when it has a snapshot_endpoint: _live_topic
in python/sglang/srt/disaggregation/kv_events.py). The "epoch_restart"
step then stands for a new engine process, a new epoch and an empty replay
buffer, whose numbers follow on from the old one's.

The "newest" steps send events as vLLM's 2026 kv_events.py encodes them:
tagged maps, the tag first and fields in declaration order, defaults
omitted, with event_version, typed extra keys ({"type": "lora", "name": ...}
and the like), group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window,
locality, ownership and session_id.

The "hybrid" steps send what vLLM's kv_events.py sends for a model mixing
attention types (a KV-cache group per type, group_idx and kv_cache_spec_kind
on BlockStored, group_idx alone on BlockRemoved), a cache salt in
extra_keys, and an event_version newer than the reader knows. The "sglang"
step sends what SGLang's kv_events.py sends: a salted BlockStored as its
positional BlockStoredWithMetadata (the seven fields, then {"cache_salt":
...}) and as its tagged map (cache_salt and session_id fields); the
"sglang_layout" steps send its positional events in the layout KV-aware
routers read by position (see Engine.sglang_layout). msgspec,
which both engines encode with, is not needed: the msgpack module packs the
same bytes for these layouts (an array_like struct is an array of its
fields in declaration order, a tagged map struct a map with "type" first,
then the fields in order, those at their default omitted).

It prints "ready" once bound, then runs the steps named on stdin, one per
line, printing "done STEP" after each, and answers replay requests
meanwhile. It exits on "quit" or at the end of its input.
"""

import hashlib
import sys
import time
import uuid

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def tokens(base, blocks, block_size):
    return list(range(base, base + blocks * block_size))


class Engine:
    def __init__(self, pub_port, replay_port, topic, block_size, replay_shape="seq"):
        self.replay_topic = replay_shape == "topic"
        self.epoch = uuid.uuid4().hex if replay_shape == "epoch" else None
        ctx = zmq.Context.instance()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.bind(f"tcp://127.0.0.1:{pub_port}")
        self.replay = ctx.socket(zmq.ROUTER)
        self.replay.bind(f"tcp://127.0.0.1:{replay_port}")
        self.topic = topic.encode()
        self.bs = block_size
        self.seq = 0
        self.buffer = []  # (seq, payload), oldest first

    # --- wire ---------------------------------------------------------

    def publish(self, events, send=True, keep=True, as_map=False):
        if isinstance(events, dict):
            batch = events
        elif as_map:
            batch = {"ts": time.time(), "events": events, "data_parallel_rank": 0}
        else:
            batch = [time.time(), events, 0]
        payload = msgpack.packb(batch, use_bin_type=True)
        seq = self.seq
        self.seq += 1
        if keep:
            self.buffer.append((seq, payload))
        if send:
            topic = self.topic
            if self.epoch is not None:
                topic += b"\x00sgl-kv-epoch=" + self.epoch.encode()
            self.pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])

    def serve_replay(self):
        frames = self.replay.recv_multipart()
        if len(frames) != 3:
            return
        client, _, start = frames
        start = int.from_bytes(start, "big")
        head = [client, b""]
        for seq, payload in self.buffer:
            if seq >= start:
                topic = [self.topic] if self.replay_topic else []
                self.replay.send_multipart(head + topic + [seq.to_bytes(8, "big"), payload])
        self.replay.send_multipart(head + ([b""] if self.replay_topic else []) + [END_SEQ, b""])

    # --- block hashes -------------------------------------------------

    def int_hashes(self, toks, negative=False, salt=""):
        """Chained 64-bit integer hashes, signed like Python's hash(), from
        a root of the cache salt's."""
        out, parent = [], hashlib.sha256(salt.encode()).digest() if salt else b""
        for i in range(0, len(toks), self.bs):
            d = hashlib.sha256(parent + repr(toks[i : i + self.bs]).encode()).digest()
            v = int.from_bytes(d[:8], "big")
            if negative:
                v = -(v >> 1) - 1
            out.append(v)
            parent = d
        return out

    def bytes_hashes(self, toks):
        """Chained 32-byte SHA-256 digests, as vLLM's sha256 hashing sends."""
        out, parent = [], b""
        for i in range(0, len(toks), self.bs):
            parent = hashlib.sha256(parent + repr(toks[i : i + self.bs]).encode()).digest()
            out.append(parent)
        return out

    def stored(self, hashes, toks, start, end, **extra):
        """A positional BlockStored of blocks [start, end)."""
        parent = hashes[start - 1] if start > 0 else None
        ev = ["BlockStored", hashes[start:end], parent, toks[start * self.bs : end * self.bs], self.bs]
        ev.append(extra.get("lora_id"))
        ev.append(extra.get("medium", "GPU"))
        for k in ("lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "unknown"):
            if k in extra:
                ev.append(extra[k])
        return ev

    def stored_map(self, hashes, toks, start, end):
        """A BlockStored encoded as a map, as vLLM does since PR 42892."""
        n = end - start
        return {
            "type": "BlockStored",
            "block_hashes": hashes[start:end],
            "parent_block_hash": hashes[start - 1] if start > 0 else None,
            "token_ids": toks[start * self.bs : end * self.bs],
            "block_size": self.bs,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "extra_keys": [None] * n,
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }

    def stored_newest(self, hashes, toks, start, end, **extra):
        """A BlockStored as vLLM's 2026 kv_events.py encodes it."""
        ev = {
            "type": "BlockStored",
            "block_hashes": hashes[start:end],
            "parent_block_hash": hashes[start - 1] if start > 0 else None,
            "token_ids": toks[start * self.bs : end * self.bs],
            "block_size": self.bs,
            "lora_id": extra.pop("lora_id", None),
            "medium": extra.pop("medium", "GPU"),
            "lora_name": extra.pop("lora_name", None),
        }
        ev.update(extra)
        return ev

    # --- steps --------------------------------------------------------

    def step(self, name):
        bs = self.bs
        a, b, c = tokens(1000, 3, bs), tokens(2000, 3, bs), tokens(3000, 2, bs)
        n, q, lo, s = tokens(4000, 2, bs), tokens(5000, 2, bs), tokens(6000, 2, bs), tokens(7000, 2, bs)
        d, e = tokens(8000, 2, bs), tokens(9000, 1, bs)
        ha, hb, hc = self.int_hashes(a), self.bytes_hashes(b), self.int_hashes(c)
        hn = self.int_hashes(n, negative=True)
        if name == "warm":
            self.publish([])
        elif name == "store":
            # vLLM 0.9-0.10: integer hashes, medium from 0.10.
            self.publish([self.stored(ha, a, 0, 2)])
            # Later fields, and one this script's reader has never heard of.
            self.publish([self.stored(ha, a, 2, 3, lora_name=None, extra_keys=[None], group_idx=0,
                                      kv_cache_spec_kind="full_attention", unknown={"x": [1, 2]})])
            # vLLM since PR 42892: events as maps, byte-string hashes.
            self.publish([self.stored_map(hb, b, 0, 2), self.stored_map(hb, b, 2, 3)])
            # vLLM 0.9: no medium field; Python hash() values are negative.
            self.publish([self.stored(hn, n, 0, 2)[:6]])
            # Not indexed: CPU tier, salted hashes. Indexed under an adapter.
            self.publish([
                self.stored(self.int_hashes(q), q, 0, 2, medium="CPU"),
                self.stored(self.int_hashes(s), s, 0, 2, lora_name=None, extra_keys=[["tenant-salt"], None]),
                self.stored(self.int_hashes(lo), lo, 0, 2, lora_id=7, lora_name="ad1", extra_keys=[["ad1"], ["ad1"]]),
                ["SomeFutureEvent", 1, 2, 3],
            ])
        elif name == "gap":
            # Lost on the way (but kept for replay): removals, one as a map.
            self.publish([["BlockRemoved", [ha[2]], "GPU"],
                          {"type": "BlockRemoved", "block_hashes": [hb[1]], "medium": "GPU", "group_idx": 0}],
                         send=False)
            self.publish([self.stored(hc, c, 0, 2)])
        elif name == "restart":
            # A new engine process: an empty cache, sequence numbers from 0.
            self.seq, self.buffer = 0, []
            self.publish([self.stored(self.int_hashes(d), d, 0, 2)])
        elif name == "epoch_restart":
            # A new engine process, its numbers following on.
            self.epoch, self.buffer = uuid.uuid4().hex, []
            self.publish([self.stored(self.int_hashes(d), d, 0, 2)])
        elif name == "lost":
            # A batch the replay buffer no longer holds.
            self.publish([["AllBlocksCleared"]], send=False, keep=False)
            self.publish([self.stored(self.int_hashes(e), e, 0, 1)])
        elif name == "cleared":
            self.publish([["AllBlocksCleared"]], as_map=True)
        elif name in ("newest", "newest_gap"):
            self.newest(name)
        elif name in ("hybrid", "hybrid_evict"):
            self.hybrid(name)
        elif name == "sglang":
            self.sglang()
        elif name in ("sglang_layout", "sglang_layout_evict"):
            self.sglang_layout(name)

    def newest(self, name):
        bs = self.bs
        f, g, lo = tokens(10000, 2, bs), tokens(11000, 2, bs), tokens(12000, 2, bs)
        r, w, u = tokens(13000, 2, bs), tokens(14000, 2, bs), tokens(15000, 1, bs)
        hf, hg, hlo = self.bytes_hashes(f), self.int_hashes(g), self.bytes_hashes(lo)
        if name == "newest":
            full = {"group_idx": 0, "kv_cache_spec_kind": "full_attention"}
            self.publish([
                # Every field vLLM added in 2026, an unknown one last.
                self.stored_newest(hf, f, 0, 2, event_version=1, extra_keys=[None, None], **full,
                                   locality="LOCAL", session_id="req-1", future={"x": [1]}),
                # Typed extra keys holding only the adapter: indexed under it.
                self.stored_newest(hlo, lo, 0, 2, lora_id=3, lora_name="ad1", **full,
                                   extra_keys=[[{"type": "lora", "name": "ad1"}]] * 2),
                # Not indexed: a remote copy, a sliding-window group, a cache salt.
                self.stored_newest(self.int_hashes(r), r, 0, 2, locality="REMOTE", ownership="kvcr"),
                self.stored_newest(self.int_hashes(w), w, 0, 2, group_idx=1, kv_cache_spec_kind="sliding_window",
                                   kv_cache_spec_sliding_window=128),
                self.stored_newest(self.int_hashes(u), u, 0, 1, extra_keys=[[{"type": "cache_salt", "salt": "t"}]]),
                # A class this reader does not know, with fields it could not read.
                {"type": "BlockMigrated", "block_hashes": [[1]], "block_size": -1, "destination": "peer"},
            ])
            # vLLM's batch as a map too (EventBatch without array_like).
            self.publish({"ts": time.time(), "events": [self.stored_newest(hg, g, 0, 2)], "data_parallel_rank": 0})
        else:
            # Lost live, so replayed: a removal in the newest shape.
            self.publish([{"type": "BlockRemoved", "block_hashes": [hf[1]], "medium": "GPU", "group_idx": 0}],
                         send=False)
            self.publish([{"type": "BlockRemoved", "block_hashes": [hg[1]], "medium": "GPU",
                           "locality": "LOCAL"}])


    def hybrid(self, name):
        """A model with a sliding-window group 0, a full-attention group 1
        and a Mamba group 2, as vLLM's hybrid KV-cache manager publishes it:
        every group stores the blocks under the same hashes."""
        bs = self.bs
        h, st, v = tokens(20000, 2, bs), tokens(21000, 2, bs), tokens(22000, 1, bs)
        hh = self.bytes_hashes(h)
        groups = [(0, "sliding_window", {"kv_cache_spec_sliding_window": 4 * bs}), (1, "full_attention", {}), (2, "mamba", {})]
        if name == "hybrid":
            self.publish([
                self.stored_newest(hh, h, 0, 2, extra_keys=[None, None], group_idx=g, kv_cache_spec_kind=k, **more)
                for g, k, more in groups
            ] + [
                # A cache salt, in the first block's extra keys.
                self.stored_newest(self.int_hashes(st, salt="tenant"), st, 0, 2, extra_keys=[["tenant"], None],
                                   group_idx=1, kv_cache_spec_kind="full_attention"),
                # A version this reader does not know: not indexed.
                self.stored_newest(self.int_hashes(v), v, 0, 1, event_version=2, group_idx=1,
                                   kv_cache_spec_kind="full_attention"),
            ])
        else:
            # The window slides past the first block; the sliding-window and
            # Mamba groups evict it. BlockRemoved carries no kind.
            self.publish([{"type": "BlockRemoved", "block_hashes": [hh[0]], "medium": "GPU", "group_idx": 0},
                          {"type": "BlockRemoved", "block_hashes": [hh[0]], "medium": "GPU", "group_idx": 2}])
            self.publish([{"type": "BlockRemoved", "block_hashes": [hh[1]], "medium": "GPU", "group_idx": 1}])

    def sglang(self):
        """Salted blocks as SGLang publishes them: its engine hashes start
        from a root of the salt's (sgl-project/sglang#30827)."""
        bs = self.bs
        p, m = tokens(30000, 3, bs), tokens(31000, 3, bs)
        hp, hm = self.int_hashes(p, salt="tenant"), self.int_hashes(m, salt="tenant")
        meta = {"cache_salt": "tenant"}
        # Positional, before #37482: BlockStored then BlockStoredWithMetadata.
        self.publish([
            ["BlockStored", hp[:2], None, p[: 2 * bs], bs, None, "GPU", meta],
            ["BlockStored", hp[2:], hp[1], p[2 * bs :], bs, None, "GPU", meta],
        ])
        # Tagged maps, since #37482: medium None omitted, cache_salt and
        # session_id fields.
        stored = lambda start, end, parent: {
            "type": "BlockStored", "block_hashes": hm[start:end], "parent_block_hash": parent,
            "token_ids": m[start * bs : end * bs], "block_size": bs, "lora_id": None,
            "cache_salt": "tenant", "session_id": "s1"}
        self.publish([stored(0, 2, None), stored(2, 3, hm[1])])

    def sglang_layout(self, name):
        """SGLang's positional events in the layout KV-aware routers read by
        position (TestBlockStoredWireFormat in SGLang's
        test/registered/unit/disaggregation/test_kv_events.py): BlockStored
        as its 13 fields (block_hashes, parent_block_hash, token_ids,
        block_size, lora_id, medium, lora_name, extra_keys, group_idx,
        kv_cache_spec_kind, kv_cache_spec_sliding_window, locality,
        ownership), a salt tagged "dynamo-cache-salt:" in extra_keys and,
        salted, BlockStoredWithMetadata's {"cache_salt": ...} 14th;
        BlockRemoved as its 7 (block_hashes, medium, group_idx,
        kv_cache_spec_kind, kv_cache_spec_sliding_window, locality,
        ownership)."""
        bs = self.bs
        k, x = tokens(32000, 3, bs), tokens(33000, 2, bs)
        hk, hx = self.int_hashes(k, salt="tenant"), self.int_hashes(x)

        def stored(h, t, start, end, salt=None, locality=None):
            extra = [["dynamo-cache-salt:" + salt]] if salt else None
            ev = ["BlockStored", h[start:end], h[start - 1] if start else None, t[start * bs : end * bs], bs,
                  None, "GPU", None, extra, None, None, None, locality, None]
            if salt:
                ev.append({"cache_salt": salt})
            return ev

        if name == "sglang_layout":
            self.publish([
                stored(hk, k, 0, 2, salt="tenant"),
                stored(hk, k, 2, 3, salt="tenant"),
                # Not the engine's own memory: not indexed.
                stored(hx, x, 0, 2, locality="REMOTE"),
            ])
        else:
            self.publish([
                ["BlockRemoved", [hk[2]], "GPU", None, None, None, None, None],
                # A remote copy's eviction leaves the local block.
                ["BlockRemoved", [hk[1]], "GPU", None, None, None, "REMOTE", None],
            ])


def main():
    pub_port, replay_port, topic, bs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    eng = Engine(pub_port, replay_port, topic, bs, *sys.argv[5:6])
    poller = zmq.Poller()
    poller.register(eng.replay, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    print("ready", flush=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        for sock, _ in poller.poll(100):
            if sock is eng.replay:
                eng.serve_replay()
                continue
            line = sys.stdin.readline()
            if not line or line.strip() == "quit":
                return
            step = line.strip()
            eng.step(step)
            print("done", step, flush=True)


if __name__ == "__main__":
    main()
