"""Write a random-weights llama GGUF that llama-server loads and serves.

Sizes: 256-dim x 4 layers decodes ~1300 tok/s on 2 CPU cores; 768 x 8 ~60 tok/s.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

# <unk> <s> </s> and the 256 byte tokens: a random model sampling a byte >= 0x80
# makes the server hold text back until the UTF-8 sequence completes, so a client
# sees tokens in bursts. Ban these (llama-server `logit_bias`) to stream one by one.
NON_TEXT_TOKEN_IDS = tuple(range(3 + 256))


def write_tiny_llama(path: str, n_embd: int = 256, n_layer: int = 4, n_ctx: int = 2048, seed: int = 0) -> str:
    """Write the model to `path` (atomically) and return the path."""
    import gguf

    rng = np.random.default_rng(seed)
    n_head = max(1, n_embd // 64)
    n_ff = n_embd * 4 // 64 * 64 or 64
    tokens: list[bytes] = [b"<unk>", b"<s>", b"</s>"]
    types = [2, 3, 3]
    tokens += [f"<0x{i:02X}>".encode() for i in range(256)]
    types += [6] * 256
    words = [bytes([c]) for c in range(ord("a"), ord("z") + 1)] + [
        b"\xe2\x96\x81" + w for w in (b"the", b"a", b"of", b"and", b"to")
    ]
    tokens += words
    types += [1] * len(words)
    n_vocab = len(tokens)

    tmp = f"{path}.{os.getpid()}.tmp"
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name("tiny-random-llama")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def t(name: str, *shape: int, scale: float = 0.02) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    t("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(p + n + ".weight", n_embd, n_embd)
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("path")
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    print(write_tiny_llama(a.path, a.embd, a.layers))


if __name__ == "__main__":
    main()
