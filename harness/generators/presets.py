"""Model and resolution presets of the live generator, and an analytic FLOP count.

Plain data, no torch import: the CLI validates ``--preset``/``--resolution`` with these
before loading anything heavy. ``wan-1.3b`` is Wan2.1-T2V-1.3B's transformer (dim 1536 =
12 heads x 128, 30 layers, FFN 8960, umT5 text dim 4096 with 512 tokens, patch (1, 2, 2),
16 latent channels) and the Wan2.1 VAE; ``tiny`` is the same architecture shrunk for CPU
tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from latsim.errors import LatsimError


@dataclass(frozen=True)
class VaePreset:
    """``AutoencoderKLWan`` constructor arguments that differ between presets."""

    base_dim: int
    num_res_blocks: int
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    temperal_downsample: tuple[bool, ...] = (False, True, True)

    @property
    def temporal_scale(self) -> int:
        """Pixel frames per latent frame (after the first): ``r``."""
        return 2 ** sum(self.temperal_downsample)

    @property
    def spatial_scale(self) -> int:
        return 2 ** (len(self.dim_mult) - 1)


@dataclass(frozen=True)
class ModelPreset:
    """A ``WanTransformer3DModel`` configuration plus the condition length it is fed."""

    name: str
    num_layers: int
    num_heads: int
    head_dim: int
    ffn_dim: int
    text_dim: int
    text_len: int  # tokens in the condition embedding (encoder_hidden_states)
    freq_dim: int
    vae: VaePreset
    patch: tuple[int, int, int] = (1, 2, 2)
    in_channels: int = 16
    out_channels: int = 16
    rope_max_seq_len: int = 1024

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim

    def transformer_kwargs(self) -> dict:
        """Keyword arguments for ``diffusers.WanTransformer3DModel``."""
        return {
            "patch_size": self.patch,
            "num_attention_heads": self.num_heads,
            "attention_head_dim": self.head_dim,
            "in_channels": self.in_channels,
            "out_channels": self.out_channels,
            "text_dim": self.text_dim,
            "freq_dim": self.freq_dim,
            "ffn_dim": self.ffn_dim,
            "num_layers": self.num_layers,
            "cross_attn_norm": True,
            "qk_norm": "rms_norm_across_heads",
            "eps": 1e-6,
            "rope_max_seq_len": self.rope_max_seq_len,
        }

    def vae_kwargs(self) -> dict:
        """Keyword arguments for ``diffusers.AutoencoderKLWan``."""
        return {
            "base_dim": self.vae.base_dim,
            "z_dim": self.in_channels,
            "dim_mult": list(self.vae.dim_mult),
            "num_res_blocks": self.vae.num_res_blocks,
            "attn_scales": [],
            "temperal_downsample": list(self.vae.temperal_downsample),
        }


@dataclass(frozen=True)
class Resolution:
    """Latent height and width (pixels = latent x the VAE's spatial scale, 8)."""

    name: str
    latent_h: int
    latent_w: int

    def tokens_per_frame(self, preset: ModelPreset) -> int:
        _, ph, pw = preset.patch
        return (self.latent_h // ph) * (self.latent_w // pw)


WAN_VAE = VaePreset(base_dim=96, num_res_blocks=2)

MODEL_PRESETS: dict[str, ModelPreset] = {
    "tiny": ModelPreset(
        name="tiny", num_layers=2, num_heads=4, head_dim=16, ffn_dim=256, text_dim=64,
        text_len=16, freq_dim=64, vae=VaePreset(base_dim=8, num_res_blocks=1),
    ),
    "wan-1.3b": ModelPreset(
        name="wan-1.3b", num_layers=30, num_heads=12, head_dim=128, ffn_dim=8960,
        text_dim=4096, text_len=512, freq_dim=256, vae=WAN_VAE,
    ),
}

RESOLUTIONS: dict[str, Resolution] = {
    r.name: r
    for r in (
        Resolution("tiny", 8, 8),  # 64 x 64 px: CPU tests
        Resolution("small", 16, 16),  # 128 x 128 px
        Resolution("240p", 30, 52),  # 240 x 416 px
        Resolution("480p", 60, 104),  # 480 x 832 px: Wan2.1 480p
        Resolution("720p", 90, 160),  # 720 x 1280 px
    )
}


def _lookup(table: dict, name: str, what: str):
    try:
        return table[name]
    except KeyError:
        choices = ", ".join(table)
        raise LatsimError(f"unknown {what} {name!r}; choose one of: {choices}") from None


def model_preset(name: str) -> ModelPreset:
    return _lookup(MODEL_PRESETS, name, "preset")


def resolution(name: str) -> Resolution:
    return _lookup(RESOLUTIONS, name, "resolution")


def forward_flops(
    preset: ModelPreset, res: Resolution, frames: int, per_token_timestep: bool = False,
    cached_context: int = 0,
) -> int:
    """Floating-point operations (2 per multiply-add) of one transformer forward.

    Counts every matrix product: patch embedding, the condition embedder (text projection,
    time embedding, per token when ``per_token_timestep``), per block self-attention
    (Q/K/V/O projections, scores and weighted sum over all ``N`` tokens), cross-attention
    (Q/O on ``N`` tokens, K/V on the text tokens, scores and sum) and the FFN, and the output
    projection. Norms, RoPE, softmax and elementwise work are left out (< 1 %).

    ``cached_context`` latent frames before the chunk enter as cached keys and values (a KV
    cache of the clean history): the chunk's ``N`` queries attend over them too, and
    nothing else is computed for them.
    """
    n = frames * res.tokens_per_frame(preset)
    n_kv = n + cached_context * res.tokens_per_frame(preset)
    d, f, lt = preset.dim, preset.ffn_dim, preset.text_len
    patch_in = preset.in_channels * preset.patch[0] * preset.patch[1] * preset.patch[2]
    patch_out = preset.out_channels * preset.patch[0] * preset.patch[1] * preset.patch[2]
    per_block = (
        4 * n * d * d  # self-attention projections
        + 2 * n * n_kv * d  # QK^T and AV (over the cached context too)
        + 2 * n * d * d  # cross-attention Q and O
        + 2 * lt * d * d  # cross-attention K and V on the text tokens
        + 2 * n * lt * d  # cross-attention scores and sum
        + 2 * n * d * f  # FFN up and down
    )
    t_rows = n if per_token_timestep else 1
    embed = (
        n * patch_in * d  # patch embedding (a strided conv = one matmul)
        + lt * (preset.text_dim * d + d * d)  # text projection (two linears)
        + t_rows * (preset.freq_dim * d + d * d + d * 6 * d)  # time embedding + projection
    )
    head = n * d * patch_out
    return 2 * (preset.num_layers * per_block + embed + head)
