"""What graph memory saved buys: KV-cache blocks and tokens, computed as vLLM 0.33 sizes its KV cache.

vLLM takes the graph captures' memory off the KV cache's budget before sizing it
(`Worker.determine_available_memory`: the budget less `profile_cudagraph_memory()`'s
estimate), then `num_blocks = available_memory // bytes_per_block` and a block holds
`block_size` tokens (`vllm/v1/core/kv_cache_planning.py`). So bytes a patch saves in the
estimate become `saved // bytes_per_block` more blocks, `block_size` tokens each. A block's
bytes are `block_size` tokens times the layout's bytes per token, the sum over the layers
that own a cache of each one's bytes per token (`page_size_bytes` in
`vllm/v1/kv_cache_interface.py`, padding left out).

The layouts, each with where it comes from:

- the replica (`replica_layout`): it has no attention, so it is given the cache of a plain
  full-attention layer per decoder layer, K and V of `num_kv_heads * head_size = hidden_size`
  values each in the model dtype (vLLM's `FullAttentionSpec`: `2 * head_size * dtype_size`
  per head and token): `2 * hidden_size * dtype_size` bytes per token per layer, vLLM's
  default block size of 16 tokens (`CacheConfig.DEFAULT_BLOCK_SIZE`);
- DeepSeek-V4.1-Flash (`DEEPSEEK_V41_FLASH`), an assumption: no V4.1-Flash config ships with
  vLLM 0.33 (`transformers_utils/configs/deepseek_v41.py` copies the checkpoint's keys). Assumed:
  4 kv-source layers (layers 2, 8, 14 and 20, the index sources with a compressor in
  `models/deepseek_v41/amd/mono/README.md`), each with a full-length compressed cache
  (compress ratio 1: one state per token) of the SM100 MXFP8 record, 528 bytes
  (`models/deepseek_v41/attention.py`: `swa_bytes_per_token = 528 if self.kv_mxfp8`; the PR
  measured on GB200), plus its fp8 indexer K cache, 132 bytes (128 fp8 + 4 fp32 scale):
  660 bytes per token per kv source, blocks of 64 tokens (FlashMLA's kernel block). Left out:
  every layer's sliding-window cache, a fixed cost per request (40 layers x window 128 x 528
  bytes, `SWA_BYTES_PER_REQUEST`), which `swa_requests` counts instead. An order of magnitude;
- DeepSeek-V3's MLA (`DEEPSEEK_V3_MLA`), the cross-check: 61 layers, one latent per token of
  kv_lora_rank 512 + rope 64 = 576 values in bf16 (1152 bytes), replicated on every TP rank,
  blocks of 64 tokens (FlashMLA).

Per GPU: an MLA latent is replicated over tensor-parallel ranks, and each data-parallel rank
holds its own cache, so bytes saved per GPU buy that GPU's blocks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kit.errors import KitError, check_one_of
from kit.units import GIB

VLLM_DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
FLASHMLA_BLOCK_SIZE = 64  # FlashMLA's kernel block size
PR_SAVED_BYTES = round(5.18 * GIB)  # PR 63155: 5.18 GiB of graph pool on DeepSeek-V4.1-Flash, GB200, per GPU
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}
V41_FLASH_LAYERS, V41_WINDOW, V41_MXFP8_RECORD, V41_INDEXER_K = 40, 128, 528, 132
SWA_BYTES_PER_REQUEST = V41_FLASH_LAYERS * V41_WINDOW * V41_MXFP8_RECORD


@dataclass(frozen=True)
class KVLayout:
    """A KV cache's cost: bytes per token in each of the layers that own a cache, and the block size."""

    name: str
    bytes_per_token_per_layer: int
    num_layers: int
    block_size: int
    source: str  # where the layout comes from, in one line

    def __post_init__(self) -> None:
        if min(self.bytes_per_token_per_layer, self.num_layers, self.block_size) < 1:
            raise KitError(f"KV layout {self.name!r}: bytes, layers and block size must be positive")

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_token_per_layer * self.num_layers

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def to_json(self) -> dict:
        return {**asdict(self), "bytes_per_token": self.bytes_per_token, "bytes_per_block": self.bytes_per_block}


def attention_bytes_per_token_per_layer(num_kv_heads: int, head_size: int, dtype_bytes: int) -> int:
    """A full-attention layer's K and V for one token (vLLM's `FullAttentionSpec` page, per token)."""
    return 2 * num_kv_heads * head_size * dtype_bytes


def replica_layout(
    hidden_size: int, num_layers: int, dtype: str, block_size: int = VLLM_DEFAULT_BLOCK_SIZE
) -> KVLayout:
    """The replica given a full-attention cache per layer: K and V of `hidden_size` values each, in its dtype."""
    check_one_of(dtype, DTYPE_BYTES, "dtype")
    per_layer = attention_bytes_per_token_per_layer(1, hidden_size, DTYPE_BYTES[dtype])
    return KVLayout(
        "replica",
        per_layer,
        num_layers,
        block_size,
        f"assumed: full attention per layer, K and V of {hidden_size} {dtype} values, "
        f"{num_layers} layers, vLLM's default block size {block_size}",
    )


DEEPSEEK_V41_FLASH = KVLayout(
    "DeepSeek-V4.1-Flash (assumed)",
    V41_MXFP8_RECORD + V41_INDEXER_K,
    4,
    FLASHMLA_BLOCK_SIZE,
    "assumed: kv sources 2, 8, 14, 20 (vllm models/deepseek_v41/amd/mono/README.md), compress ratio 1, "
    "SM100 MXFP8 record 528 B + fp8 indexer K 132 B (models/deepseek_v41/attention.py); "
    "sliding-window caches left out",
)
DEEPSEEK_V3_MLA = KVLayout(
    "DeepSeek-V3 MLA (bf16)",
    (512 + 64) * DTYPE_BYTES["bfloat16"],
    61,
    FLASHMLA_BLOCK_SIZE,
    "DeepSeek-V3: 61 layers, MLA latent kv_lora_rank 512 + rope 64 in bf16 (vllm mla_attention.py), FlashMLA blocks",
)


def kv_cache_bought(saved_bytes: int, layout: KVLayout) -> dict:
    """Whole blocks (and their tokens) `saved_bytes` more of KV budget holds; negative when the budget shrank."""
    sign = -1 if saved_bytes < 0 else 1
    blocks = sign * (abs(int(saved_bytes)) // layout.bytes_per_block)
    return {"bytes": int(saved_bytes), "blocks": blocks, "tokens": blocks * layout.block_size}


def swa_requests(saved_bytes: int, bytes_per_request: int = SWA_BYTES_PER_REQUEST) -> int:
    """How many more requests' sliding windows `saved_bytes` holds (DeepSeek-V4.1-Flash: 40 layers x 128 x 528 B)."""
    return max(int(saved_bytes), 0) // bytes_per_request


def kv_cache_section(
    estimates: dict[str, int], layout: KVLayout, baseline: str = "unpatched", saved_bytes: int = PR_SAVED_BYTES
) -> dict:
    """The `kv_cache` part of the alternatives JSON.

    `estimates` are the replica's profile estimates (`capture_model(profile_only=True)`) per
    scenario; each scenario frees `estimates[baseline] - estimates[scenario]` of KV budget.
    DeepSeek-V4.1-Flash and DeepSeek-V3 are priced at `saved_bytes`, the PR's 5.18 GiB.
    """
    if baseline not in estimates:
        raise KitError(f"no {baseline} estimate to measure the others against")
    base = estimates[baseline]
    return {
        "replica": {
            "layout": layout.to_json(),
            "profile_estimate_bytes": {name: int(b) for name, b in estimates.items()},
            "freed": {name: kv_cache_bought(base - b, layout) for name, b in estimates.items() if name != baseline},
        },
        "deepseek_v41_flash": {
            "layout": DEEPSEEK_V41_FLASH.to_json(),
            "saved_bytes": int(saved_bytes),
            "saved_source": "PR 63155: 5.18 GiB per GPU on DeepSeek-V4.1-Flash, GB200 (prefill DP4, sizes up to 16384)",
            **kv_cache_bought(saved_bytes, DEEPSEEK_V41_FLASH),
            "swa_bytes_per_request": SWA_BYTES_PER_REQUEST,
            "or_swa_requests": swa_requests(saved_bytes),
        },
        "deepseek_v3_mla": {
            "layout": DEEPSEEK_V3_MLA.to_json(),
            "saved_bytes": int(saved_bytes),
            **kv_cache_bought(saved_bytes, DEEPSEEK_V3_MLA),
        },
    }
