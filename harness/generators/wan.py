"""The live generator: a diffusers Wan DiT (random weights) that executes ``StartJob`` commands.

Live, the generator *is* the cost model (DESIGN §3): a job's duration is whatever sampling
``K`` latents takes. One job:

1. gathers up to ``context`` clean latents just before the branch position (from the
   stream's latent store: played or cached output) as prefix context in the same call; the
   context tokens get timestep 0, the ``K`` noisy latents the current timestep (diffusers'
   per-token timestep path of ``WanTransformer3DModel``);
2. conditions on a seeded random embedding per condition version (``encoder_hidden_states``
   of ``text_len`` x ``text_dim``: a stand-in for the umT5 prompt embedding);
3. samples ``K`` noise latents for ``steps`` flow-matching Euler steps
   (``FlowMatchEulerDiscreteScheduler``);
4. optionally decodes the first output group (``decode_group`` latents: the commit unit
   ``q``) with ``AutoencoderKLWan``, counted inside C as in the paper. The decoder's causal
   cache is carried across jobs, so every latent after the first decodes to ``r`` = 4 frames.
   After a replan the carried cache belongs to the discarded branch; the frame count and the
   work are right, the pixels (random weights anyway) are not. Later latents of a job are
   assumed to be decoded off the critical path and are not run.

CUDA: bfloat16 weights, PyTorch SDPA attention, job time also measured with CUDA events.
CPU: float32, ``torch.set_num_threads(cores - 1)`` so one core stays free for the driver.
Everything runs under ``torch.inference_mode``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from harness.generators.device import (
    device_name,
    require_packages,
    torch_device,
)
from harness.generators.presets import ModelPreset, Resolution, model_preset, resolution
from harness.generators.tensors import TensorGenerator, check_model_options
from latsim.controller import StartJob
from latsim.errors import LatsimError
from latsim.plugins import GeneratorConfig, GeneratorInfo, JobTiming


@dataclass(frozen=True)
class WanConfig:
    """What to build and how a job runs."""

    preset: str = "tiny"
    resolution: str = "tiny"
    steps: int = 4
    context: int = 0  # clean prefix latents fed with each job (at most what exists)
    decode: bool = False
    device: str = "cpu"
    seed: int = 0
    threads: int | None = None  # CPU intra-op threads; default: cores - 1 (at least 1)
    flow_shift: float = 3.0

    def __post_init__(self) -> None:
        model_preset(self.preset)
        resolution(self.resolution)
        check_model_options(self.steps, self.context, self.device, self.threads)


@dataclass
class StreamState:
    """One stream's state in the generator: its latents by position (the context of later
    jobs), the VAE's causal cache for its decode, and its decoded pixels where kept."""

    K: int
    store: dict[int, Any] = field(default_factory=dict)  # position -> latent (1, C, 1, H, W)
    feat_map: Any = None  # the VAE decoder's causal cache of this stream
    vae_first: bool = True
    keep_frames: bool = False
    frames: dict[int, Any] = field(default_factory=dict)  # position -> decoded (1, 3, f, H, W)


class WanGenerator(TensorGenerator):
    """Random-weight Wan DiT (+ optional VAE) executing one job at a time.

    Not thread-safe: one worker thread calls :meth:`run_job`; :meth:`reset_stream` and
    :meth:`warmup` are called before the worker starts.
    """

    def __init__(self, config: WanConfig) -> None:
        from diffusers import (
            AutoencoderKLWan,
            FlowMatchEulerDiscreteScheduler,
            WanTransformer3DModel,
        )

        self.config = config
        self.preset: ModelPreset = model_preset(config.preset)
        self.res: Resolution = resolution(config.resolution)
        torch, self.device, self.dtype, self.threads = torch_device(config.device,
                                                                    config.threads)
        self._torch = torch
        torch.manual_seed(config.seed)
        with torch.device(self.device):
            model = WanTransformer3DModel(**self.preset.transformer_kwargs())
        self.model = _cast(model, self.dtype, model._keep_in_fp32_modules).eval()
        self.scheduler = FlowMatchEulerDiscreteScheduler(shift=config.flow_shift)
        self.vae = None
        if config.decode:
            with torch.device(self.device):
                vae = AutoencoderKLWan(**self.preset.vae_kwargs())
            self.vae = _cast(vae, self.dtype, ()).eval()
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self._embeddings: dict[int, Any] = {}
        self._stream = StreamState(0)  # the stream of callers that name none

    # ------------------------------------------------------------ stream state

    def embedding(self, version: int) -> Any:
        """The condition embedding of ``version`` (seeded; the same version, the same tensor)."""
        emb = self._embeddings.get(version)
        if emb is None:
            if len(self._embeddings) > 8:
                self._embeddings.clear()
            shape = (1, self.preset.text_len, self.preset.text_dim)
            emb = self._randn(shape, 1_000_003 * (self.config.seed + 1) + version)
            self._embeddings[version] = emb
        return emb

    def new_stream(self, K: int, keep_frames: bool = False) -> StreamState:
        """A new stream's state: positions ``0..K-1`` hold the version-0 prebuffer; its own
        VAE causal cache is primed by decoding the last prebuffered latent. With
        ``keep_frames`` the decoded pixels of each job stay on the state (for a server that
        sends them)."""
        stream = StreamState(K, keep_frames=keep_frames)
        for pos in range(K):
            stream.store[pos] = self._randn(self.latent_shape(1), 7_919 * (pos + 1))
        if self.vae is not None:
            self.vae.clear_cache()
            stream.feat_map = self.vae._feat_map
            with self._torch.inference_mode():
                self._decode(stream.store[K - 1], stream, keep=False)
            self._sync()
        return stream

    def run_job(self, job: StartJob, decode_group: int = 1,
                stream: StreamState | None = None) -> JobTiming:
        """Sample positions ``job.branch .. job.branch + job.length - 1`` and store them in
        ``stream`` (default: the stream of :meth:`reset_stream`)."""
        torch = self._torch
        stream = stream or self._stream
        store = stream.store
        K = job.length
        # Set-up outside the timed region: the seeded noise and the condition embedding
        # (drawn on the CPU, the same on every device) are on the device, and the sampler's
        # step index is set, so its first step does not look the index up with a host sync
        # (nonzero().item()).
        x = self._randn(self.latent_shape(K), 104_729 * (job.job_id + 17))
        ehs = self.embedding(job.version)
        self.scheduler.set_timesteps(self.config.steps, device=self.device)
        self.scheduler.set_begin_index(0)
        with self._clock() as clock, torch.inference_mode():
            n_ctx = self._context_length(store, job)
            ctx = (
                torch.cat([store[p] for p in range(job.branch - n_ctx, job.branch)], dim=2)
                if n_ctx
                else None
            )
            tpf = self.res.tokens_per_frame(self.preset)
            for t in self.scheduler.timesteps:
                if ctx is None:
                    inp, ts = x, t.expand(1)
                else:
                    inp = torch.cat([ctx, x], dim=2)
                    ts = torch.cat(
                        [torch.zeros(n_ctx * tpf, device=self.device), t.expand(K * tpf)]
                    ).unsqueeze(0)
                v = self.model(inp, ts, ehs, return_dict=False)[0]
                if n_ctx:
                    v = v[:, :, n_ctx:]
                x = self.scheduler.step(v, t, x, return_dict=False)[0]
            for i in range(K):
                store[job.branch + i] = x[:, :, i : i + 1]
            self._forget_stale(stream, job)
            decoded_latents = decoded_frames = 0
            if self.vae is not None and decode_group > 0:
                decoded_latents = min(decode_group, K)
                decoded_frames = self._decode(x[:, :, :decoded_latents], stream,
                                              first_position=job.branch)
        return JobTiming(job.job_id, job.kind, K, job.branch, job.version, n_ctx,
                         clock.t_start, clock.t_end, clock.device_s, decoded_latents,
                         decoded_frames)

    def _decode(self, z: Any, stream: StreamState, first_position: int = 0,
                keep: bool = True) -> int:
        """Decode latents in order with the stream's carried causal cache; returns frames
        produced. Keeps the pixels by position where the stream asks for them."""
        vae = self.vae
        assert vae is not None
        x = vae.post_quant_conv(z)
        frames = 0
        for i in range(x.shape[2]):
            vae._conv_idx = [0]
            out = vae.decoder(x[:, :, i : i + 1], feat_cache=stream.feat_map,
                              feat_idx=vae._conv_idx, first_chunk=stream.vae_first)
            stream.vae_first = False
            frames += int(out.shape[2])
            if keep and stream.keep_frames:
                stream.frames[first_position + i] = out
        return frames

    def describe(self) -> GeneratorInfo:
        c = self.config
        return GeneratorInfo(
            "wan", f"{c.preset}@{c.resolution},steps={c.steps}", c.device,
            device_name(c.device), str(self.dtype).removeprefix("torch."),
            self.preset.vae.temporal_scale,
            {"preset": c.preset, "resolution": c.resolution, "steps": c.steps,
             "context": c.context, "decode": c.decode, "seed": c.seed,
             "flow_shift": c.flow_shift, "n_params": self.n_params},
            self.threads)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self._torch.cuda.synchronize()

    def check_fits(self, K: int) -> None:
        """Up-front memory and position checks for chunk size ``K`` (a rough estimate)."""
        frames = K + self.config.context
        if frames > self.preset.rope_max_seq_len:
            raise LatsimError(
                f"K={K} plus {self.config.context} context latents exceed the model's "
                f"{self.preset.rope_max_seq_len} frame positions"
            )
        tokens = frames * self.res.tokens_per_frame(self.preset)
        itemsize = 2 if self.dtype == self._torch.bfloat16 else 4
        # live activations of one block: hidden, q/k/v/out, FFN hidden (x2 for temporaries)
        need = 2 * tokens * (6 * self.preset.dim + self.preset.ffn_dim) * itemsize
        if self.device.type == "cuda":
            free, _ = self._torch.cuda.mem_get_info()
        else:
            try:
                free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            except (ValueError, OSError):
                return
        if need > 0.9 * free:
            raise LatsimError(
                f"K={K} needs about {need / 2**30:.1f} GiB of activations with preset "
                f"{self.preset.name} at {self.res.name}, more than the {free / 2**30:.1f} GiB "
                f"free on {self.config.device}; use a smaller --K or --resolution"
            )


def wan_config(config: GeneratorConfig) -> WanConfig:
    """The Wan configuration of the shared generator options (``--generator wan``)."""
    if config.cost is not None:
        raise LatsimError("generator wan measures its job time: --cost is for the sleep "
                          "generator")
    if config.options:
        raise LatsimError(f"generator wan takes no --generator-option, got "
                          f"{', '.join(key for key, _ in config.options)}")
    return WanConfig(config.preset or "tiny", config.resolution or "tiny", config.steps,
                     config.context, config.decode, config.device, config.seed,
                     config.threads)


def build(config: GeneratorConfig) -> WanGenerator:
    """The ``wan`` entry of the ``latsim.generators`` group."""
    wan = wan_config(config)
    require_packages("generator wan")
    return WanGenerator(wan)


def _cast(module: Any, dtype: Any, keep_fp32: Any) -> Any:
    """Cast parameters to ``dtype`` except those diffusers keeps in float32 (as
    ``from_pretrained(torch_dtype=...)`` does); no gradients."""
    keep = set(keep_fp32 or ())
    for name, param in module.named_parameters():
        param.requires_grad_(False)
        if not keep.intersection(name.split(".")):
            param.data = param.data.to(dtype)
    return module
