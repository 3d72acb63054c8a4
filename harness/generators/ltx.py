"""The ``ltx`` live generator: a diffusers LTX-2 DiT (random weights) that executes ``StartJob``
commands, r = 8 pixel frames per latent frame.

What belongs here: LTX's presets (model and resolution; plain data, no torch import:
``tiny`` and ``tiny-2.0`` for CPU tests, ``ltx-2`` and ``ltx-2.3`` at full size), the
validation of the shared :class:`~latsim.plugins.GeneratorConfig` for LTX, the generator
(:class:`LTXGenerator`, a :class:`~latsim.plugins.LiveGenerator` that also
:class:`~latsim.plugins.TimesForwards`) and its factory :func:`build` (the ``ltx`` entry of
the ``latsim.generators`` group). Importing this module imports no torch or diffusers.

The model is ``diffusers.LTX2VideoTransformer3DModel`` (LTX-2; the paper serves LTX-2.3) with
its video VAE ``AutoencoderKLLTX2Video``. LTX-2's transformer is audio+video: every forward
takes an audio token stream and cross-attends audio and video (a2v / v2a) in every block.
It can still be driven video-only and chunk-wise, with nothing patched:

- ``--generator-option audio=none`` (the default): a minimal audio stream, one silent audio
  token with a one-token audio prompt, and ``isolate_modalities=True``, which turns the a2v
  and v2a cross-attention off in every block (the switch LTX-2.3's modality guidance uses).
  The forward is then the video work plus the audio branch on one token (reading its
  ~3 B weights: a few ms per forward on an H200 at full size).
- ``audio=synced``: the joint workload of the LTX-2 pipelines: the chunk's audio latents
  (25 per second of video, ``ceil(25 * 8 K / 24)`` for ``K`` latents at 24 fps) are sampled
  alongside the video with a2v/v2a cross-attention on; audio gets no context and is not kept.

One job (as :mod:`harness.generators.wan`'s):

1. gathers up to ``context`` clean latents just before the branch position (from the
   stream's latent store) as a clean prefix in the same call: their tokens get timestep 0,
   the ``K`` noisy latents the current one (the per-token timestep path LTX-2's condition
   pipeline uses for its conditioning tokens, ``t * (1 - conditioning_mask)``). Rotary
   positions are those of the job's window (prefix first), at 24 fps;
2. conditions on a seeded random embedding per condition version, a stand-in for the
   Gemma-3 text encoder *and* LTX-2's text connectors: ``text_len`` = 1024 tokens of
   ``caption_channels`` (LTX-2.0, projected by the transformer) or of the transformer's own
   width (LTX-2.3, whose connectors project per modality);
3. samples ``K`` noise latents for ``steps`` flow-matching Euler steps
   (``FlowMatchEulerDiscreteScheduler``), one forward per step (a distilled model: no CFG,
   STG or modality guidance);
4. optionally decodes the first ``decode_group`` latents (the commit unit ``q``), counted
   inside C. LTX-2's video decoder is non-causal and has no carried cache: ``n`` latents
   decode to ``1 + 8 (n - 1)`` frames (the first latent is one frame). A job's group is
   decoded together with the latent just before the branch (in the store for every job
   after the prebuffer) and that latent's frame is dropped, so every decoded latent yields
   exactly ``r`` = 8 frames (a job at branch 0 would give ``1 + 8 (q - 1)``). The decoder
   thus runs on ``q + 1`` latents for ``q``; :meth:`LTXGenerator.new_stream` decodes nothing.

The only option is ``audio``; a non-default value is appended to the label
(``ltx:tiny@tiny,steps=4,audio=synced``).

CUDA: bfloat16 weights (built in bfloat16, so the 19 B-parameter model never exists in
float32), PyTorch SDPA attention, job time also measured with CUDA events. CPU: float32,
``torch.set_num_threads(threads or cores - 1)``. Everything runs under
``torch.inference_mode``. :meth:`LTXGenerator.forward_times` times one transformer forward
alone, optionally over a KV cache of clean context latents; see :data:`PAPER_WORKLOAD` for
the paper's LTX number it can be set against.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.generators.device import (
    device_name,
    require_packages,
    torch_device,
)
from harness.generators.tensors import TensorGenerator, check_model_options
from latsim.errors import LatsimError
from latsim.plugins.protocols import GeneratorConfig, GeneratorInfo, JobTiming

if TYPE_CHECKING:
    from latsim.controller import StartJob

#: Pixel frames per latent frame (after the first) and pixels per latent side of LTX's VAE.
TEMPORAL_SCALE = 8
SPATIAL_SCALE = 32
#: LTX's frame rate (positions are in seconds) and audio latents per second of video
#: (16 kHz, hop 160, 4x compression).
FPS = 24.0
AUDIO_LATENTS_PER_S = 16000 / 160 / 4

#: The paper's single-H200 (USP1) per-forward time of LTX-2.3 (ms), by resolution and K.
PAPER_H200_FORWARD_MS: dict[str, dict[int, float]] = {"448p": {45: 2016.2}}
#: LTX-2.3's window in the paper: 361 frames at 24 fps = 1 + 8 x 45 -> 46 latents.
LTX_WINDOW_LATENTS = 46
#: What the paper's LTX forward time corresponds to, as far as the seed summaries say.
PAPER_WORKLOAD = (
    "Table 2(b), K=45 'cached-forward', USP1 (one H200): 2016.2 ms (USP8: 507.9 ms). LTX-2.3 "
    "trained with 3 steps per K in {1, 3, 9, 15, 45}, evaluated at 832x448, 24 fps, 361 "
    "frames = 1 + 8 x 45, i.e. 46 latents of 14 x 26 = 364 tokens. Read like gpu_check's Wan "
    "rows (window-filling history), K=45 is 45 x 364 = 16380 query tokens over a KV cache of "
    "46 - 45 = 1 clean latent (16744 keys): forward_times(45, reps, context=1) at resolution "
    "448p. Not stated: whether the audio tokens were in the forward (audio=synced adds 375) "
    "and the text length (1024 here)."
)

#: ``--generator-option`` keys this generator takes, with their default and allowed values.
OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {"audio": ("none", ("none", "synced"))}


def paper_context(K: int) -> int:
    """Clean history latents the paper's LTX forward of ``K`` latents attends over."""
    return max(0, LTX_WINDOW_LATENTS - K)


# ---------------------------------------------------------------- presets


@dataclass(frozen=True)
class VaePreset:
    """``AutoencoderKLLTX2Video`` arguments of one preset (encoder built but never run)."""

    block_out_channels: tuple[int, ...]
    layers_per_block: tuple[int, ...]
    decoder_block_out_channels: tuple[int, ...]
    decoder_layers_per_block: tuple[int, ...]
    upsample_type: tuple[str, ...]
    upsample_residual: tuple[bool, ...]
    upsample_factor: tuple[int, ...]
    decoder_spatial_padding_mode: str = "zeros"
    patch_size: int = 4

    @property
    def temporal_scale(self) -> int:
        """Pixel frames per latent frame (after the first): ``r``."""
        return 2 ** sum("temporal" in kind for kind in self.upsample_type)

    @property
    def spatial_scale(self) -> int:
        return self.patch_size * 2 ** sum(
            kind in ("spatial", "spatiotemporal") for kind in self.upsample_type)

    def kwargs(self, latent_channels: int) -> dict[str, Any]:
        """Keyword arguments for ``diffusers.AutoencoderKLLTX2Video``."""
        n_up = len(self.decoder_block_out_channels)
        return {
            "in_channels": 3, "out_channels": 3, "latent_channels": latent_channels,
            "block_out_channels": self.block_out_channels,
            "layers_per_block": self.layers_per_block,
            "decoder_block_out_channels": self.decoder_block_out_channels,
            "decoder_layers_per_block": self.decoder_layers_per_block,
            "spatio_temporal_scaling": (True,) * (len(self.layers_per_block) - 1),
            "decoder_spatio_temporal_scaling": (True,) * n_up,
            "decoder_inject_noise": (False,) * (n_up + 1),
            "downsample_type": ("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
            "upsample_type": self.upsample_type,
            "upsample_residual": self.upsample_residual,
            "upsample_factor": self.upsample_factor,
            "timestep_conditioning": False,
            "patch_size": self.patch_size, "patch_size_t": 1,
            "encoder_causal": True, "decoder_causal": False,
            "encoder_spatial_padding_mode": "zeros",
            "decoder_spatial_padding_mode": self.decoder_spatial_padding_mode,
            "spatial_compression_ratio": self.spatial_scale,
            "temporal_compression_ratio": self.temporal_scale,
        }


@dataclass(frozen=True)
class ModelPreset:
    """An ``LTX2VideoTransformer3DModel`` configuration plus the prompt length it is fed.

    ``version`` "2.3" turns on what LTX-2.3 adds to 2.0: per-head gated attention, prompt
    cross-attention modulation (timestep-dependent K/V), no prompt projection in the
    transformer (the connectors give video- and audio-width embeddings) and STG-capable
    attention processors. The FFN is diffusers' fixed 4 x width GELU MLP.
    """

    name: str
    version: str  # "2.0" or "2.3"
    num_layers: int
    num_heads: int
    head_dim: int
    audio_heads: int
    audio_head_dim: int
    caption_channels: int  # the text encoder's width (Gemma-3-12B: 3840)
    text_len: int  # prompt tokens after the connectors (1024: padding becomes registers)
    vae: VaePreset
    in_channels: int = 128
    audio_in_channels: int = 128  # 8 audio VAE channels x 16 mel bins

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def audio_dim(self) -> int:
        return self.audio_heads * self.audio_head_dim

    @property
    def ffn_dim(self) -> int:
        return 4 * self.dim

    @property
    def v23(self) -> bool:
        return self.version == "2.3"

    @property
    def text_dim(self) -> int:
        """Width of the video prompt embedding the transformer takes."""
        return self.dim if self.v23 else self.caption_channels

    @property
    def audio_text_dim(self) -> int:
        return self.audio_dim if self.v23 else self.caption_channels

    def transformer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``diffusers.LTX2VideoTransformer3DModel``."""
        v23 = self.v23
        return {
            "in_channels": self.in_channels, "out_channels": self.in_channels,
            "patch_size": 1, "patch_size_t": 1,
            "num_attention_heads": self.num_heads, "attention_head_dim": self.head_dim,
            "cross_attention_dim": self.dim,
            "vae_scale_factors": (TEMPORAL_SCALE, SPATIAL_SCALE, SPATIAL_SCALE),
            "audio_in_channels": self.audio_in_channels,
            "audio_out_channels": self.audio_in_channels,
            "audio_num_attention_heads": self.audio_heads,
            "audio_attention_head_dim": self.audio_head_dim,
            "audio_cross_attention_dim": self.audio_dim,
            "num_layers": self.num_layers, "caption_channels": self.caption_channels,
            "rope_type": "split", "rope_double_precision": True,
            "gated_attn": v23, "cross_attn_mod": v23,
            "audio_gated_attn": v23, "audio_cross_attn_mod": v23,
            "use_prompt_embeddings": not v23, "perturbed_attn": v23,
        }


@dataclass(frozen=True)
class Resolution:
    """Latent height and width (pixels = latent x 32); one token per latent pixel (patch 1)."""

    name: str
    latent_h: int
    latent_w: int

    @property
    def pixels(self) -> tuple[int, int]:
        return self.latent_h * SPATIAL_SCALE, self.latent_w * SPATIAL_SCALE

    @property
    def tokens_per_frame(self) -> int:
        return self.latent_h * self.latent_w


#: LTX-2.0's video VAE (diffusers' converter, ``--version 2.0``).
LTX2_VAE = VaePreset(
    block_out_channels=(256, 512, 1024, 2048), layers_per_block=(4, 6, 6, 2, 2),
    decoder_block_out_channels=(256, 512, 1024), decoder_layers_per_block=(5, 5, 5, 5),
    upsample_type=("spatiotemporal",) * 3, upsample_residual=(True,) * 3,
    upsample_factor=(2, 2, 2), decoder_spatial_padding_mode="reflect",
)
#: LTX-2.3's video VAE (``--version 2.3``): a temporal and a spatial upsampler instead of the
#: last spatio-temporal one.
LTX23_VAE = VaePreset(
    block_out_channels=(256, 512, 1024, 1024), layers_per_block=(4, 6, 4, 2, 2),
    decoder_block_out_channels=(256, 512, 512, 1024), decoder_layers_per_block=(4, 6, 4, 2, 2),
    upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"),
    upsample_residual=(False,) * 4, upsample_factor=(2, 2, 1, 2),
)

MODEL_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        # LTX-2.3's architecture shrunk for CPU tests (same 8x / 32x VAE compression).
        ModelPreset(
            name="tiny", version="2.3", num_layers=2, num_heads=4, head_dim=16,
            audio_heads=4, audio_head_dim=8, caption_channels=64, text_len=16,
            in_channels=16, audio_in_channels=16,
            vae=VaePreset(
                block_out_channels=(8, 16, 32, 32), layers_per_block=(1, 1, 1, 1, 1),
                decoder_block_out_channels=(8, 16, 16, 32),
                decoder_layers_per_block=(1, 1, 1, 1, 1),
                upsample_type=LTX23_VAE.upsample_type,
                upsample_residual=LTX23_VAE.upsample_residual,
                upsample_factor=LTX23_VAE.upsample_factor,
            ),
        ),
        # The same, LTX-2.0's architecture (prompt projection, no gates, residual upsamplers).
        ModelPreset(
            name="tiny-2.0", version="2.0", num_layers=2, num_heads=4, head_dim=16,
            audio_heads=4, audio_head_dim=8, caption_channels=48, text_len=16,
            in_channels=16, audio_in_channels=16,
            vae=VaePreset(
                block_out_channels=(8, 16, 32, 64), layers_per_block=(1, 1, 1, 1, 1),
                decoder_block_out_channels=(8, 16, 32), decoder_layers_per_block=(1, 1, 1, 1),
                upsample_type=LTX2_VAE.upsample_type,
                upsample_residual=LTX2_VAE.upsample_residual,
                upsample_factor=LTX2_VAE.upsample_factor, decoder_spatial_padding_mode="reflect",
            ),
        ),
        # Lightricks/LTX-2 and LTX-2.3: 48 layers, 32 heads x 128 (4096), FFN 16384, audio
        # 32 heads x 64 (2048), Gemma-3-12B prompts (3840 wide, 1024 tokens); 19.0 B params.
        ModelPreset(
            name="ltx-2", version="2.0", num_layers=48, num_heads=32, head_dim=128,
            audio_heads=32, audio_head_dim=64, caption_channels=3840, text_len=1024,
            vae=LTX2_VAE,
        ),
        ModelPreset(
            name="ltx-2.3", version="2.3", num_layers=48, num_heads=32, head_dim=128,
            audio_heads=32, audio_head_dim=64, caption_channels=3840, text_len=1024,
            vae=LTX23_VAE,
        ),
    )
}

RESOLUTIONS: dict[str, Resolution] = {
    r.name: r
    for r in (
        Resolution("tiny", 4, 4),  # 128 x 128 px: CPU tests
        Resolution("small", 8, 8),  # 256 x 256 px
        Resolution("448p", 14, 26),  # 448 x 832 px: the paper's LTX-2.3 deployment
        Resolution("480p", 15, 26),  # 480 x 832 px
        Resolution("720p", 22, 40),  # 704 x 1280 px (LTX needs multiples of 32)
    )
}


def _lookup(table: dict, name: str, what: str) -> Any:
    try:
        return table[name]
    except KeyError:
        raise LatsimError(f"unknown {what} {name!r} for generator ltx; choose one of: "
                          f"{', '.join(table)}") from None


def model_preset(name: str) -> ModelPreset:
    return _lookup(MODEL_PRESETS, name, "preset")


def resolution(name: str) -> Resolution:
    return _lookup(RESOLUTIONS, name, "resolution")


def audio_tokens(K: int) -> int:
    """Audio latents covering ``K`` video latents (8 K frames at 24 fps)."""
    return math.ceil(AUDIO_LATENTS_PER_S * TEMPORAL_SCALE * K / FPS)


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class LTXConfig:
    """The LTX reading of the shared generator options, validated (no torch needed)."""

    preset: str = "tiny"
    resolution: str = "tiny"
    steps: int = 4
    context: int = 0
    decode: bool = False
    device: str = "cpu"
    seed: int = 0
    threads: int | None = None
    audio: str = "none"

    def __post_init__(self) -> None:
        model_preset(self.preset)
        resolution(self.resolution)
        check_model_options(self.steps, self.context, self.device, self.threads)
        allowed = OPTIONS["audio"][1]
        if self.audio not in allowed:
            raise LatsimError(f"generator ltx option audio={self.audio!r}; choose one of: "
                              f"{', '.join(allowed)}")


def ltx_config(config: GeneratorConfig) -> LTXConfig:
    """The LTX configuration of the shared generator options (``--generator ltx``)."""
    if config.cost is not None:
        raise LatsimError("generator ltx measures its job time; --cost is for the sleep "
                          "generator")
    options = {key: default for key, (default, _) in OPTIONS.items()}
    for key, value in config.options:
        if key not in OPTIONS:
            raise LatsimError(f"generator ltx has no option {key!r}; its options: "
                              f"{', '.join(OPTIONS)}")
        options[key] = value
    return LTXConfig(config.preset or "tiny", config.resolution or "tiny", config.steps,
                     config.context, config.decode, config.device, config.seed,
                     config.threads, options["audio"])


# ---------------------------------------------------------------- the generator


@dataclass
class StreamState:
    """One stream's state in the generator: its latents by position (the context and the
    decode overlap of later jobs) and its decoded pixels where kept."""

    K: int
    store: dict[int, Any] = field(default_factory=dict)  # position -> latent (1, C, 1, H, W)
    keep_frames: bool = False
    frames: dict[int, Any] = field(default_factory=dict)  # position -> decoded (1, 3, f, H, W)


class LTXGenerator(TensorGenerator):
    """Random-weight LTX-2 DiT (+ optional video VAE) executing one job at a time.

    Not thread-safe: one worker thread calls :meth:`run_job`; :meth:`reset_stream` and
    :meth:`warmup` are called before the worker starts.
    """

    def __init__(self, config: LTXConfig) -> None:
        from diffusers import (
            AutoencoderKLLTX2Video,
            FlowMatchEulerDiscreteScheduler,
            LTX2VideoTransformer3DModel,
        )

        self.config = config
        self.preset: ModelPreset = model_preset(config.preset)
        self.res: Resolution = resolution(config.resolution)
        torch, self.device, self.dtype, self.threads = torch_device(config.device,
                                                                    config.threads)
        self._torch = torch
        self._check_weights_fit(LTX2VideoTransformer3DModel, AutoencoderKLLTX2Video)
        torch.manual_seed(config.seed)
        with self._building():
            model = LTX2VideoTransformer3DModel(**self.preset.transformer_kwargs())
        self.model = _freeze(model).eval()
        self.scheduler = FlowMatchEulerDiscreteScheduler()
        self.vae = None
        if config.decode:
            with self._building():
                vae = AutoencoderKLLTX2Video(**self.preset.vae.kwargs(self.preset.in_channels))
            self.vae = _freeze(vae).eval()
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self._embeddings: dict[int, tuple[Any, Any]] = {}
        self._stream = StreamState(0)  # the stream of callers that name none

    @contextlib.contextmanager
    def _building(self) -> Iterator[None]:
        """Create modules on the device directly in the compute dtype."""
        torch = self._torch
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                yield
        finally:
            torch.set_default_dtype(previous)

    def _check_weights_fit(self, model_cls: Any, vae_cls: Any) -> None:
        """A one-line error, before any allocation, if the weights cannot fit."""
        torch = self._torch
        with torch.device("meta"):
            n = sum(p.numel() for p in model_cls(**self.preset.transformer_kwargs()).parameters())
            if self.config.decode:
                vae = vae_cls(**self.preset.vae.kwargs(self.preset.in_channels))
                n += sum(p.numel() for p in vae.parameters())
        need = n * (2 if self.dtype == torch.bfloat16 else 4)
        free = _free_bytes(torch, self.device)
        if free is not None and need > 0.9 * free:
            raise LatsimError(
                f"preset {self.preset.name} needs about {need / 2**30:.1f} GiB of "
                f"{str(self.dtype).removeprefix('torch.')} weights, more than the "
                f"{free / 2**30:.1f} GiB free on {self.config.device}; use --preset tiny or "
                "--device cuda"
            )

    # ------------------------------------------------------------ shapes and inputs

    def embedding(self, version: int) -> tuple[Any, Any]:
        """The (video, audio) prompt embeddings of ``version`` (seeded; the same version, the
        same tensors). Without audio the audio prompt is one token."""
        emb = self._embeddings.get(version)
        if emb is None:
            if len(self._embeddings) > 8:
                self._embeddings.clear()
            seed = 1_000_003 * (self.config.seed + 1) + version
            video = self._randn((1, self.preset.text_len, self.preset.text_dim), seed)
            audio_len = self.preset.text_len if self._synced else 1
            audio = self._randn((1, audio_len, self.preset.audio_text_dim), seed + 500_009)
            emb = self._embeddings[version] = (video, audio)
        return emb

    @property
    def _synced(self) -> bool:
        return self.config.audio == "synced"

    def _audio_inputs(self, K: int, seed: int) -> tuple[Any, Any]:
        """Noise audio latents for a chunk of ``K`` latents and their positions."""
        n = audio_tokens(K) if self._synced else 1
        audio = self._randn((1, n, self.preset.audio_in_channels), seed)
        coords = self.model.audio_rope.prepare_audio_coords(1, n, self.device)
        return audio, coords

    def _video_coords(self, frames: int) -> Any:
        return self.model.rope.prepare_video_coords(
            1, frames, self.res.latent_h, self.res.latent_w, self.device, fps=FPS)

    def _forward(self, x: Any, audio: Any, ts: Any, t: Any, emb: tuple[Any, Any],
                 video_coords: Any, audio_coords: Any) -> tuple[Any, Any]:
        """One transformer forward on packed tokens: (video velocity, audio velocity)."""
        return self.model(
            hidden_states=x, audio_hidden_states=audio,
            encoder_hidden_states=emb[0], audio_encoder_hidden_states=emb[1],
            timestep=ts, audio_timestep=t, sigma=t,
            video_coords=video_coords, audio_coords=audio_coords,
            isolate_modalities=not self._synced, use_cross_timestep=self.preset.v23,
            return_dict=False,
        )

    @staticmethod
    def _pack(latents: Any) -> Any:
        """(1, C, F, H, W) -> (1, F H W, C): patch size 1, tokens in (f, h, w) order."""
        return latents.flatten(2).transpose(1, 2)

    def _unpack(self, tokens: Any, frames: int) -> Any:
        return tokens.transpose(1, 2).reshape(self.latent_shape(frames))

    # ------------------------------------------------------------ stream state

    def new_stream(self, K: int, keep_frames: bool = False) -> StreamState:
        """A new stream's state: positions ``0..K-1`` hold seeded random latents (the
        prebuffer). LTX's decoder carries no cache, so nothing is decoded here. With
        ``keep_frames`` the decoded pixels of each job stay on the state."""
        stream = StreamState(K, keep_frames=keep_frames)
        for pos in range(K):
            stream.store[pos] = self._randn(self.latent_shape(1), 7_919 * (pos + 1))
        return stream

    def run_job(self, job: StartJob, decode_group: int = 1,
                stream: StreamState | None = None) -> JobTiming:
        """Sample positions ``job.branch .. job.branch + job.length - 1`` and store them in
        ``stream`` (default: the stream of :meth:`reset_stream`)."""
        torch = self._torch
        stream = stream or self._stream
        store = stream.store
        K = job.length
        # Set-up outside the timed region, as the Wan generator's: seeded noise (drawn on the
        # CPU, the same on every device) and the prompt embeddings are on the device, and the
        # sampler's step index is set (no host sync looking it up on its first step).
        x = self._pack(self._randn(self.latent_shape(K), 104_729 * (job.job_id + 17)))
        audio, audio_coords = self._audio_inputs(K, 15_485_863 + job.job_id)
        emb = self.embedding(job.version)
        self.scheduler.set_timesteps(self.config.steps, device=self.device)
        self.scheduler.set_begin_index(0)
        sigmas = self.scheduler.sigmas
        with self._clock() as clock, torch.inference_mode():
            n_ctx = self._context_length(store, job)
            ctx = (
                self._pack(torch.cat([store[p] for p in range(job.branch - n_ctx, job.branch)],
                                     dim=2))
                if n_ctx
                else None
            )
            n_ctx_tokens = n_ctx * self.res.tokens_per_frame
            video_coords = self._video_coords(n_ctx + K)
            for i, t in enumerate(self.scheduler.timesteps):
                t1 = t.expand(1)
                if ctx is None:
                    inp, ts = x, t1
                else:
                    inp = torch.cat([ctx, x], dim=1)
                    ts = torch.cat([torch.zeros(n_ctx_tokens, device=self.device),
                                    t.expand(x.shape[1])]).unsqueeze(0)
                v, v_audio = self._forward(inp, audio, ts, t1, emb, video_coords, audio_coords)
                if n_ctx:
                    v = v[:, n_ctx_tokens:]
                if self._synced:
                    audio = (audio + (sigmas[i + 1] - sigmas[i]) * v_audio).to(audio.dtype)
                x = self.scheduler.step(v, t, x, return_dict=False)[0]
            latents = self._unpack(x, K)
            for i in range(K):
                store[job.branch + i] = latents[:, :, i : i + 1]
            self._forget_stale(stream, job)
            decoded_latents = decoded_frames = 0
            if self.vae is not None and decode_group > 0:
                decoded_latents = min(decode_group, K)
                decoded_frames = self._decode(stream, job.branch, decoded_latents)
        return JobTiming(job.job_id, job.kind, K, job.branch, job.version, n_ctx,
                         clock.t_start, clock.t_end, clock.device_s, decoded_latents,
                         decoded_frames)

    def decode_latents(self, z: Any) -> Any:
        """Decode (1, C, n, H, W) latents alone: (1, 3, 1 + 8 (n - 1), 32 H, 32 W) pixels."""
        assert self.vae is not None
        return self.vae.decoder(z, None, causal=False)

    def _decode(self, stream: StreamState, first: int, n: int) -> int:
        """Decode positions ``first .. first + n - 1`` of ``stream`` with the latent before
        them as overlap (its frame dropped); returns the frames produced. Keeps the pixels by
        position where the stream asks for them."""
        store = stream.store
        group = [store[p] for p in range(first, first + n)]
        overlap = store.get(first - 1)
        out = self.decode_latents(self._torch.cat(([overlap] if overlap is not None else [])
                                                  + group, dim=2))
        if overlap is not None:
            out = out[:, :, 1:]
        if stream.keep_frames:
            start = 0
            for i in range(n):
                count = TEMPORAL_SCALE if overlap is not None or i else 1
                stream.frames[first + i] = out[:, :, start : start + count]
                start += count
        return int(out.shape[2])

    def describe(self) -> GeneratorInfo:
        c = self.config
        label = f"ltx:{c.preset}@{c.resolution},steps={c.steps}"
        if c.audio != OPTIONS["audio"][0]:
            label += f",audio={c.audio}"
        return GeneratorInfo(
            "ltx", label, c.device, device_name(c.device),
            str(self.dtype).removeprefix("torch."), self.preset.vae.temporal_scale,
            {"preset": c.preset, "resolution": c.resolution, "steps": c.steps,
             "context": c.context, "decode": c.decode, "seed": c.seed, "audio": c.audio,
             "n_params": self.n_params, "family": "LTX-2", "version": self.preset.version,
             "tokens_per_frame": self.res.tokens_per_frame, "text_len": self.preset.text_len,
             "fps": FPS},
            self.threads)

    def forward_times(self, K: int, reps: int, context: int = 0, *,
                      warmup: int = 3) -> list[float]:
        """Milliseconds of each of ``reps`` transformer forwards over ``K`` noisy latents at
        the generator's resolution, after ``warmup`` untimed ones; CUDA forwards are timed
        with events (synchronized). With ``context`` the forward is a *cached* one: the
        chunk's tokens attend over a KV cache of ``context`` clean latents before them
        (synthetic keys and values, allocated outside the timing), as ``gpu_check``'s Wan
        rows, and the chunk gets the rotary positions after them. Every input is on the
        device before the first timed forward. See :data:`PAPER_WORKLOAD`."""
        if K <= 0 or reps <= 0 or context < 0 or warmup < 0:
            raise LatsimError(f"forward_times needs K, reps > 0 and context, warmup >= 0; "
                              f"got K={K}, reps={reps}, context={context}, warmup={warmup}")
        self._check_activations(K, context)
        torch = self._torch
        cuda = self.device.type == "cuda"
        x = self._pack(self._randn(self.latent_shape(K), 1234 + K))
        audio, audio_coords = self._audio_inputs(K, 4321 + K)
        emb = self.embedding(1)
        t = torch.tensor([500.0], device=self.device)
        n_ctx = context * self.res.tokens_per_frame
        video_coords = self._video_coords(context + K)[:, :, n_ctx:]
        times = []
        with torch.inference_mode(), self._kv_cache(K, context):
            for i in range(warmup + reps):
                if cuda:
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    self._forward(x, audio, t, t, emb, video_coords, audio_coords)
                    end.record()
                    end.synchronize()
                    elapsed = start.elapsed_time(end)
                else:
                    t0 = time.perf_counter()
                    self._forward(x, audio, t, t, emb, video_coords, audio_coords)
                    elapsed = (time.perf_counter() - t0) * 1e3
                if i >= warmup:
                    times.append(elapsed)
        return times

    @contextlib.contextmanager
    def _kv_cache(self, K: int, context: int) -> Iterator[None]:
        """While open, every block's video self-attention reads a KV cache of ``context``
        clean latents before the chunk (random keys and values). Restores the model."""
        if context <= 0:
            yield
            return
        torch = self._torch
        tpf = self.res.tokens_per_frame
        n_ctx, n = context * tpf, (context + K) * tpf
        heads, head_dim = self.preset.num_heads, self.preset.head_dim
        gen = torch.Generator(device=self.device).manual_seed(4321 + context)
        blocks = list(self.model.transformer_blocks)
        originals = [block.attn1.processor for block in blocks]
        try:
            for block in blocks:
                key, value = (torch.randn((1, n, heads, head_dim), generator=gen,
                                          device=self.device, dtype=self.dtype)
                              for _ in range(2))
                block.attn1.processor = _CachedSelfAttention(torch, key, value, n_ctx)
            yield
        finally:
            for block, processor in zip(blocks, originals, strict=True):
                block.attn1.processor = processor

    # ------------------------------------------------------------ warm-up and limits

    def check_fits(self, K: int) -> None:
        """Up-front memory check for chunk size ``K`` plus the context (a rough estimate).
        LTX's rotary positions are continuous (seconds), so no frame count is out of range."""
        if K <= 0:
            raise LatsimError(f"K must be a positive number of latents, got {K}")
        self._check_activations(K + self.config.context, self.config.context)

    def _check_activations(self, frames: int, context: int) -> None:
        tokens = frames * self.res.tokens_per_frame
        dim, itemsize = self.preset.dim, 2 if self.dtype == self._torch.bfloat16 else 4
        # live activations of one block: hidden, q/k/v/out, FFN hidden (x2 for temporaries);
        # with context, the per-token modulation (9 x dim per token, and its copies)
        need = 2 * tokens * (6 * dim + self.preset.ffn_dim) * itemsize
        if context:
            need += 3 * tokens * 10 * dim * itemsize
        free = _free_bytes(self._torch, self.device)
        if free is not None and need > 0.9 * free:
            raise LatsimError(
                f"{frames} latents need about {need / 2**30:.1f} GiB of activations with "
                f"preset {self.preset.name} at {self.res.name}, more than the "
                f"{free / 2**30:.1f} GiB free on {self.config.device}; use a smaller --K or "
                "--resolution"
            )


class _CachedSelfAttention:
    """Video self-attention of one block over a KV cache: ``key``/``value`` are
    (1, n_ctx + n_chunk, heads, head_dim) buffers whose first ``n_ctx`` rows hold the cached
    context; each forward writes the chunk's own keys and values into the rest and attends
    over the whole buffer. Projections, norms, RoPE and gating as diffusers'
    ``LTX2AudioVideoAttnProcessor``."""

    def __init__(self, torch: Any, key: Any, value: Any, n_ctx: int) -> None:
        from diffusers.models.transformers import transformer_ltx2

        self.torch, self.key, self.value, self.n_ctx = torch, key, value, n_ctx
        self._rope = {"interleaved": transformer_ltx2.apply_interleaved_rotary_emb,
                      "split": transformer_ltx2.apply_split_rotary_emb}

    # The parameter names are what LTX2Attention.forward passes (it warns about others).
    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, query_rotary_emb: Any = None,
                 key_rotary_emb: Any = None, perturbation_mask: Any = None,
                 all_perturbed: Any = None) -> Any:
        query = attn.norm_q(attn.to_q(hidden_states))
        key = attn.norm_k(attn.to_k(hidden_states))
        value = attn.to_v(hidden_states)
        if query_rotary_emb is not None:
            rope = self._rope[attn.rope_type]
            query, key = rope(query, query_rotary_emb), rope(key, query_rotary_emb)
        self.key[:, self.n_ctx:] = key.unflatten(2, (attn.heads, -1))
        self.value[:, self.n_ctx:] = value.unflatten(2, (attn.heads, -1))
        out = self.torch.nn.functional.scaled_dot_product_attention(
            query.unflatten(2, (attn.heads, -1)).transpose(1, 2), self.key.transpose(1, 2),
            self.value.transpose(1, 2))
        out = out.transpose(1, 2)
        if attn.to_gate_logits is not None:
            out = out * (2.0 * self.torch.sigmoid(attn.to_gate_logits(hidden_states))).unsqueeze(-1)
        out = out.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


def _freeze(module: Any) -> Any:
    """No gradients (the module is built in its compute dtype already)."""
    for param in module.parameters():
        param.requires_grad_(False)
    return module


def _free_bytes(torch: Any, device: Any) -> int | None:
    """Free memory of ``device`` (None where it cannot be told)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def build(config: GeneratorConfig) -> LTXGenerator:
    """The ``ltx`` entry of the ``latsim.generators`` group."""
    ltx = ltx_config(config)
    require_packages("generator ltx")
    return LTXGenerator(ltx)
