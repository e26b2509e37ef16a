"""A consumer of a vLLM-style KV event stream, for interop tests.

It subscribes with pyzmq to a PUB socket, asks the replay (ROUTER) socket
for batches it missed, decodes every payload with the msgpack module, checks
it against the positional layout of vLLM's KVEventBatch, BlockStored,
BlockRemoved and AllBlocksCleared, and prints one JSON line per event.

Usage: vllm_subscriber.py PUB_ADDR REPLAY_ADDR TOPIC

It asks for a replay from batch 0 at once (printing a ReplayEnd line at
its end), and again whenever a sequence number is skipped. It exits on "quit" on stdin, at the end of its input, or
after a minute. A malformed message ends it with an error.
"""

import json
import sys
import time

import msgpack
import zmq


def check(cond, what, value):
    if not cond:
        raise SystemExit(f"malformed {what}: {value!r}")


def is_hash(h):
    return isinstance(h, (int, bytes))


def decode(seq, payload):
    batch = msgpack.unpackb(payload, raw=False)
    check(isinstance(batch, list) and 2 <= len(batch) <= 3, "batch", batch)
    check(isinstance(batch[0], float), "ts", batch[0])
    check(isinstance(batch[1], list), "events", batch[1])
    if len(batch) == 3:
        check(batch[2] is None or isinstance(batch[2], int), "data_parallel_rank", batch[2])
    for ev in batch[1]:
        check(isinstance(ev, list) and ev and isinstance(ev[0], str), "event", ev)
        tag, out = ev[0], {"seq": seq, "type": ev[0]}
        if tag == "BlockStored":
            check(len(ev) >= 7, "BlockStored", ev)
            hashes, parent, tokens, block_size, lora_id, medium = ev[1:7]
            check(isinstance(hashes, list) and all(is_hash(h) for h in hashes), "block_hashes", hashes)
            check(parent is None or is_hash(parent), "parent_block_hash", parent)
            check(isinstance(tokens, list) and all(isinstance(t, int) for t in tokens), "token_ids", tokens)
            check(isinstance(block_size, int) and len(tokens) == len(hashes) * block_size, "block_size", block_size)
            check(lora_id is None or isinstance(lora_id, int), "lora_id", lora_id)
            check(medium is None or isinstance(medium, str), "medium", medium)
            out.update(block_hashes=hashes, parent=parent, token_ids=tokens, block_size=block_size, medium=medium)
            # The fields vLLM appended later, in its positional order.
            lora_name, extra_keys, group_idx, kind = (ev[7:11] + [None] * 4)[:4]
            check(lora_name is None or isinstance(lora_name, str), "lora_name", lora_name)
            check(extra_keys is None or isinstance(extra_keys, list) and len(extra_keys) == len(hashes)
                  and all(k is None or isinstance(k, list) for k in extra_keys), "extra_keys", extra_keys)
            check(group_idx is None or isinstance(group_idx, int) and group_idx >= 0, "group_idx", group_idx)
            check(kind is None or isinstance(kind, str), "kv_cache_spec_kind", kind)
            # vLLM's generate_block_hash_extra_keys: the LoRA name in every
            # block's keys, then, in the first block's, the cache salt.
            salt = None
            if extra_keys and extra_keys[0]:
                keys = extra_keys[0][1:] if lora_name and extra_keys[0][0] == lora_name else extra_keys[0]
                check(len(keys) == 1 and isinstance(keys[0], str), "first block's extra keys", extra_keys[0])
                salt = keys[0]
            out.update(lora_name=lora_name, cache_salt=salt, group_idx=group_idx, kv_cache_spec_kind=kind)
        elif tag == "BlockRemoved":
            check(len(ev) >= 2, "BlockRemoved", ev)
            check(isinstance(ev[1], list) and all(is_hash(h) for h in ev[1]), "block_hashes", ev[1])
            out.update(block_hashes=ev[1], medium=ev[2] if len(ev) > 2 else None)
        elif tag != "AllBlocksCleared":
            raise SystemExit(f"unknown event {tag!r}")
        print(json.dumps(out), flush=True)


def main():
    pub_addr, replay_addr, topic = sys.argv[1], sys.argv[2], sys.argv[3]
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    sub.connect(pub_addr)
    replay = ctx.socket(zmq.DEALER)
    replay.connect(replay_addr)

    last = -1

    def replay_from(start):
        """Applies the batches from start on, up to the end marker."""
        nonlocal last
        replay.send_multipart([b"", start.to_bytes(8, "big")])
        while replay.poll(5000):
            frames = replay.recv_multipart()
            check(len(frames) == 3 and frames[0] == b"", "replay message", frames)
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == -1:
                check(frames[2] == b"", "end of replay", frames)
                print(json.dumps({"type": "ReplayEnd"}), flush=True)
                return
            if seq > last:
                decode(seq, frames[2])
                last = seq
        raise SystemExit("replay timed out")

    replay_from(0)
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    deadline = time.time() + 60
    while time.time() < deadline:
        for sock, _ in poller.poll(100):
            if sock is sub:
                frames = sub.recv_multipart()
                check(len(frames) == 3 and len(frames[1]) == 8, "message", frames)
                check(frames[0] == topic.encode(), "topic", frames[0])
                seq = int.from_bytes(frames[1], "big")
                if seq > last + 1:
                    replay_from(last + 1)
                if seq > last:
                    decode(seq, frames[2])
                    last = seq
            else:
                line = sys.stdin.readline()
                if not line or line.strip() == "quit":
                    return


if __name__ == "__main__":
    main()
