"""A LoRA adapter GGUF for a model of `toki gguf gen` (standard library only):
random A and B matrices for its attention's query and value weights, as
llama.cpp's adapter loader reads them (general.type "adapter", adapter.type
"lora", adapter.lora.alpha; tensors NAME.lora_a of n_embd x r and
NAME.lora_b of r x n_embd, F32)."""
import os
import random
import struct

GGUF_F32, GGUF_STRING = 6, 8
ALIGN = 32


def _str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv_str(k, v):
    return _str(k) + struct.pack("<I", GGUF_STRING) + _str(v)


def _kv_f32(k, v):
    return _str(k) + struct.pack("<I", GGUF_F32) + struct.pack("<f", v)


def write(path, n_embd, layers, rank=4, seed=1):
    """Writes the adapter to path (atomically) and returns path."""
    rng = random.Random(seed)
    tensors = [(f"blk.{layer}.{w}.weight.lora_{ab}", dims)
               for layer in range(layers) for w in ("attn_q", "attn_v")
               for ab, dims in (("a", (n_embd, rank)), ("b", (rank, n_embd)))]
    kvs = [_kv_str("general.architecture", "llama"), _kv_str("general.type", "adapter"),
           _kv_str("adapter.type", "lora"), _kv_f32("adapter.lora.alpha", float(rank))]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    data, offset = [], 0
    for name, (ne0, ne1) in tensors:
        # name, 2 dimensions, type 0 (F32), offset into the data
        head += _str(name) + struct.pack("<IQQIQ", 2, ne0, ne1, 0, offset)
        t = struct.pack("<%df" % (ne0 * ne1), *(rng.gauss(0, 0.5) for _ in range(ne0 * ne1)))
        t += b"\0" * (-len(t) % ALIGN)
        data.append(t)
        offset += len(t)
    head += b"\0" * (-len(head) % ALIGN)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head + b"".join(data))
    os.replace(tmp, path)
    return path
