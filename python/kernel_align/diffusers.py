"""An attention processor for diffusers' Qwen-Image transformer that replaces the four
per-head RMSNorms and the RoPE of each block with one ``qk_norm_rope`` call, and the joint
attention with ``kernel_align.attention``.

    from kernel_align.diffusers import KernelAlignQwenImageAttnProcessor
    transformer.set_attn_processor(KernelAlignQwenImageAttnProcessor())

or the whole model at once (the processor and the batch-invariant mode), reversibly:

    from kernel_align.diffusers import under_contract
    with under_contract(transformer):
        ...

Everything else is diffusers' ``QwenDoubleStreamAttnProcessor2_0`` (diffusers 0.42.1):
the projections and the output projections. The joint attention over ``[text, image]``
is the contract's (docs/contract.md section 11): with ``encoder_hidden_states_mask``, a
sample's bytes do not depend on how far the other prompts pad it.
diffusers normalises and rotates each stream and then concatenates ``[text, image]``;
this processor concatenates first and runs the fused op over the joint sequence, whose
first ``text_len`` positions are the text (the op's convention), with diffusers' own
rotary frequencies as the cos/sin tables. The result is what diffusers computes,
bitwise wherever torch's ``mean`` in diffusers' RMSNorm happens to sum in the
contract's order (most rows) and within the reduction tolerance class elsewhere; and a
sample's bytes no longer depend on the rest of the batch.
"""

from __future__ import annotations

import torch
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

from . import functional, sequence_parallel
from .batch_invariant import batch_invariant
from .positions import timestep_embedding

__all__ = ["KernelAlignQwenImageAttnProcessor", "under_contract", "ContractSwitch"]

_NORMS = ("norm_added_q", "norm_added_k", "norm_q", "norm_k")  # text q, text k, image q, image k


def _norm_weights(attn) -> tuple[list[torch.Tensor], float]:
    """The four RMSNorm weights in the fused op's order, and their common eps."""
    weights, eps, dtypes = [], set(), set()
    for name in _NORMS:
        norm = getattr(attn, name, None)
        if not isinstance(norm, RMSNorm) or norm.weight is None or norm.bias is not None:
            raise ValueError(
                f"KernelAlignQwenImageAttnProcessor: attention module's '{name}': expected a "
                f"diffusers RMSNorm with a weight and no bias (qk_norm='rms_norm'), found "
                f"{type(norm).__name__ if norm is not None else None}"
            )
        weights.append(norm.weight)
        eps.add(norm.eps)
        dtypes.add(norm.weight.dtype)
    if len(eps) != 1 or len(dtypes) != 1:
        raise ValueError("KernelAlignQwenImageAttnProcessor: the four QK norms: expected one "
                         f"eps and one weight dtype, found {sorted(eps)} and "
                         f"{sorted(map(str, dtypes))}")
    return weights, eps.pop()


def _output_dtype(x_dtype: torch.dtype, w_dtype: torch.dtype) -> torch.dtype:
    # diffusers' RMSNorm: an fp16/bf16 weight makes the output that dtype; otherwise
    # x * rsqrt(var) (fp32) * weight promotes; apply_rotary_emb_qwen keeps it.
    if w_dtype in (torch.float16, torch.bfloat16):
        return w_dtype
    return torch.promote_types(torch.promote_types(x_dtype, torch.float32), w_dtype)


class KernelAlignQwenImageAttnProcessor(QwenDoubleStreamAttnProcessor2_0):
    """diffusers' Qwen-Image double-stream attention with kernel-align's fused QK norm +
    RoPE (norm mode "diffusers", interleaved pairs, layout bshd). CPU tensors, and CUDA
    tensors where the extension has its CUDA kernels (kernel_align.HAS_CUDA).

    Built without arguments (diffusers' constructor) and installed with
    ``transformer.set_attn_processor(KernelAlignQwenImageAttnProcessor())``. Under
    ``torch.no_grad()`` (and when the output dtype is the projections') the fused op runs
    in place on the processor's own fresh concatenations; the caller's tensors are never
    modified.
    """

    def __call__(
        self,
        attn,
        hidden_states: torch.FloatTensor,  # image stream
        encoder_hidden_states: torch.FloatTensor = None,  # text stream
        encoder_hidden_states_mask: torch.FloatTensor = None,
        attention_mask: torch.FloatTensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.FloatTensor:
        """One attention block's joint attention, as ``QwenDoubleStreamAttnProcessor2_0``.

        Args:
            attn: the block's diffusers ``Attention`` module; its ``norm_added_q``,
                ``norm_added_k``, ``norm_q`` and ``norm_k`` must be diffusers ``RMSNorm``s
                with a weight, no bias, one eps and one weight dtype.
            hidden_states: the image stream, ``[B, S_img, C]``.
            encoder_hidden_states: the text stream, ``[B, S_txt, C]`` (required).
            encoder_hidden_states_mask: optional ``[B, S_txt]`` mask of the text tokens;
                the joint ``[text, image]`` mask is built from it.
            attention_mask: must be None (pass encoder_hidden_states_mask instead).
            image_rotary_emb: ``(image_freqs, text_freqs)``, diffusers' complex RoPE
                frequencies ``[S_img, D/2]`` and ``[S_txt, D/2]`` (required).

        Returns:
            ``(img_attn_output, txt_attn_output)``: ``[B, S_img, C]`` and ``[B, S_txt, C]``
            after the output projections.

        Raises:
            ValueError: encoder_hidden_states or image_rotary_emb missing, an
                attention_mask given, norms that are not weighted RMSNorms sharing eps and
                weight dtype, and whatever ``kernel_align.qk_norm_rope`` refuses.
        """
        if encoder_hidden_states is None:
            raise ValueError("KernelAlignQwenImageAttnProcessor requires encoder_hidden_states "
                             "(text stream)")
        if attention_mask is not None:
            raise ValueError(
                "KernelAlignQwenImageAttnProcessor does not accept an external attention_mask. "
                "Pass encoder_hidden_states_mask to let the processor build the joint mask."
            )
        if image_rotary_emb is None:
            raise ValueError("KernelAlignQwenImageAttnProcessor requires image_rotary_emb: "
                             "the fused op always applies RoPE")

        # The joint [text, image] tokens' key-padding mask, [B, S]: the image tokens all
        # take part.
        joint_mask = None
        if encoder_hidden_states_mask is not None:
            seq_img = hidden_states.shape[1]
            image_mask = torch.ones((hidden_states.shape[0], seq_img), dtype=torch.bool,
                                    device=hidden_states.device)
            joint_mask = torch.cat([encoder_hidden_states_mask.to(torch.bool), image_mask], dim=1)

        seq_txt = encoder_hidden_states.shape[1]
        head_dim = attn.inner_dim // attn.heads

        # Joint [text, image] projections, [B, S, H, D]; the fused op normalises the
        # first seq_txt positions with the text weights and the rest with the image ones.
        def joint(img_proj, txt_proj):
            return torch.cat([txt_proj(encoder_hidden_states).unflatten(-1, (-1, head_dim)),
                              img_proj(hidden_states).unflatten(-1, (-1, head_dim))], dim=1)

        joint_query = joint(attn.to_q, attn.add_q_proj)
        joint_key = joint(attn.to_k, attn.add_k_proj)
        joint_value = joint(attn.to_v, attn.add_v_proj)

        weights, eps = _norm_weights(attn)
        img_freqs, txt_freqs = image_rotary_emb
        # diffusers' complex frequencies as fp32 cos/sin views (strided, no copy).
        freqs = torch.view_as_real(torch.cat([txt_freqs, img_freqs]).to(torch.complex64))
        cos, sin = freqs[..., 0], freqs[..., 1]
        out_dtype = _output_dtype(joint_query.dtype, weights[0].dtype)
        kwargs = dict(text_len=seq_txt, text_q_weight=weights[0], text_k_weight=weights[1],
                      image_q_weight=weights[2], image_k_weight=weights[3], eps=eps,
                      mode="diffusers", pairing="interleaved", layout="bshd")
        needs_grad = torch.is_grad_enabled() and (
            joint_query.requires_grad or joint_key.requires_grad
            or any(w.requires_grad for w in weights))
        if needs_grad or out_dtype != joint_query.dtype:
            joint_query, joint_key = functional.qk_norm_rope(joint_query, joint_key, cos, sin,
                                                             out_dtype=out_dtype, **kwargs)
        else:
            # Inference: the concatenations above are fresh tensors, rotate them in place.
            functional.qk_norm_rope_(joint_query, joint_key, cos, sin, **kwargs)

        # Under the contract: a sample's bytes do not depend on the padding of the
        # others' prompts (padded tokens' rows are +0 where SDPA attends them to the valid
        # keys; no valid token reads them).
        joint_hidden_states = sequence_parallel.joint_attention(joint_query, joint_key,
                                                                joint_value, joint_mask)

        joint_hidden_states = joint_hidden_states.flatten(2, 3)
        joint_hidden_states = joint_hidden_states.to(joint_query.dtype)

        txt_attn_output = joint_hidden_states[:, :seq_txt, :]
        img_attn_output = joint_hidden_states[:, seq_txt:, :]

        img_attn_output = attn.to_out[0](img_attn_output.contiguous())
        if len(attn.to_out) > 1:
            img_attn_output = attn.to_out[1](img_attn_output)  # dropout

        txt_attn_output = attn.to_add_out(txt_attn_output.contiguous())

        return img_attn_output, txt_attn_output


_BLOCK_NORMS = ("img_norm1", "img_norm2", "txt_norm1", "txt_norm2")


class _TokenRuns:
    """Edit's per-token modulation (diffusers' ``_modulate`` with an index): token l of
    sample b takes the modulation chunk of set ``index[b, l]`` (0: the sample's own, 1: the
    reference images', the second half of the batch of chunks). Its runs of one set are
    contiguous (the target's tokens, then the references'), so each run is one call of the
    library's op with that set's ``[B, D]`` vectors, and the runs are joined along the
    tokens: every token gets its op's bytes, as with one set, and the sums of the
    backward run over each run's own tokens. ``groups`` holds (rows of the batch, [(begin,
    end, set), ...]): the whole batch when every sample has the same index (as diffusers
    builds it for one image shape), else a sample at a time."""

    def __init__(self, index: torch.Tensor):
        index = torch.as_tensor(index)
        rows = [slice(None)] if bool((index == index[:1]).all()) else [
            slice(b, b + 1) for b in range(index.shape[0])]
        self.groups = []
        for row in rows:
            r = index[row][0]
            cuts = (torch.nonzero(r[1:] != r[:-1]).flatten() + 1).tolist()
            bounds = [0, *cuts, r.shape[0]]
            sets = r[bounds[:-1]].tolist()
            self.groups.append((row, [(a, e, int(k)) for a, e, k in
                                      zip(bounds[:-1], bounds[1:], sets)]))

    def apply(self, op, x, chunks, *others):
        """op(x[run], chunk_k[rows] for each chunk, *other[run]) per run, joined; a chunk is
        ``[2B, D]``, set k its k-th half."""
        half = chunks[0].shape[0] // 2
        rows_out = []
        for row, runs in self.groups:
            rows_out.append(torch.cat([
                op(x[row, a:e], *(c[k * half:(k + 1) * half][row] for c in chunks),
                   *(t[row, a:e] for t in others))
                for a, e, k in runs], dim=1))
        return rows_out[0] if len(rows_out) == 1 else torch.cat(rows_out, dim=0)


def _gated(x, gate, y):
    """``x + gate * y``: one ``adaln_gate_residual`` call for a sample's gate ``[B, D]``; for
    Edit's per-token gates, one per run of tokens of one modulation set (_TokenRuns)."""
    if isinstance(gate, tuple):
        runs, gate = gate
        return runs.apply(lambda x_, g, y_: functional.adaln_gate_residual(x_, g, y_), x,
                          (gate,), y)
    return functional.adaln_gate_residual(x, gate, y)


def _block_forward_under_contract(block):
    """``QwenImageTransformerBlock.forward`` with the library's ops in the model's own
    order: each LayerNorm + modulation one ``adaln_modulation`` call (Edit's per-token
    modulation index: one per run of tokens of one modulation set), each gated residual one
    ``adaln_gate_residual`` call (the same), the attention through the block's processor
    and every Linear (the modulations, the MLPs) through the batch-invariant mode."""
    def modulate(x, norm, mod_params, runs):
        shift, scale, gate = mod_params.chunk(3, dim=-1)
        if runs is None:
            return functional.adaln_modulation(x, scale, shift, eps=norm.eps), gate
        modulated = runs.apply(
            lambda x_, scale_, shift_: functional.adaln_modulation(x_, scale_, shift_,
                                                                   eps=norm.eps),
            x, (scale, shift))
        return modulated, (runs, gate)

    def forward(hidden_states, encoder_hidden_states, encoder_hidden_states_mask, temb,
                image_rotary_emb=None, joint_attention_kwargs=None, modulate_index=None):
        runs = None if modulate_index is None else _TokenRuns(modulate_index)
        img_mod1, img_mod2 = block.img_mod(temb).chunk(2, dim=-1)
        if block.zero_cond_t:
            temb = torch.chunk(temb, 2, dim=0)[0]
        txt_mod1, txt_mod2 = block.txt_mod(temb).chunk(2, dim=-1)

        img_modulated, img_gate1 = modulate(hidden_states, block.img_norm1, img_mod1, runs)
        txt_modulated, txt_gate1 = modulate(encoder_hidden_states, block.txt_norm1, txt_mod1,
                                            None)
        img_attn_output, txt_attn_output = block.attn(
            hidden_states=img_modulated,
            encoder_hidden_states=txt_modulated,
            encoder_hidden_states_mask=encoder_hidden_states_mask,
            image_rotary_emb=image_rotary_emb,
            **(joint_attention_kwargs or {}),
        )
        hidden_states = _gated(hidden_states, img_gate1, img_attn_output)
        encoder_hidden_states = _gated(encoder_hidden_states, txt_gate1, txt_attn_output)

        img_modulated2, img_gate2 = modulate(hidden_states, block.img_norm2, img_mod2, runs)
        hidden_states = _gated(hidden_states, img_gate2, block.img_mlp(img_modulated2))
        txt_modulated2, txt_gate2 = modulate(encoder_hidden_states, block.txt_norm2, txt_mod2,
                                             None)
        encoder_hidden_states = _gated(encoder_hidden_states, txt_gate2,
                                       block.txt_mlp(txt_modulated2))

        # diffusers' clip against fp16 overflow.
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states
    return forward


def _continuous_under_contract(module):
    """``AdaLayerNormContinuous.forward(x, conditioning_embedding)`` (the model's
    ``norm_out``, a LayerNorm without affine) with its LayerNorm and modulation as one
    adaln_modulation call: diffusers' ``norm(x) * (1 + scale)[:, None] + shift[:, None]``
    is the block's ``_modulate`` expression, with the chunks in the order (scale, shift)."""
    def forward(x, conditioning_embedding):
        emb = module.linear(module.silu(conditioning_embedding).to(x.dtype))
        scale, shift = torch.chunk(emb, 2, dim=1)
        return functional.adaln_modulation(x, scale, shift, eps=module.norm.eps)
    return forward


def _timesteps_under_contract(module):
    """``Timesteps.forward(timesteps)`` as ``kernel_align.timestep_embedding`` with the
    module's configuration: diffusers' fp32 recipe, every step correctly rounded."""
    def forward(timesteps):
        return timestep_embedding(timesteps, module.num_channels,
                                  flip_sin_to_cos=bool(module.flip_sin_to_cos),
                                  downscale_freq_shift=module.downscale_freq_shift,
                                  scale=module.scale)
    return forward


def _rms_norm_under_contract(module):
    """A diffusers ``RMSNorm`` (with a weight) as one ``qk_rmsnorm`` call in its
    ``diffusers`` mode: the norm's own roundings, the row's sum by the contract's tree."""
    def forward(x):
        return functional.qk_rmsnorm(x, module.weight, eps=module.eps, mode="diffusers",
                                     out_dtype=_output_dtype(x.dtype, module.weight.dtype))
    return forward


def _is_affine_free_layer_norm(norm) -> bool:
    return isinstance(norm, torch.nn.LayerNorm) and norm.weight is None


class ContractSwitch:
    """What ``under_contract(model)`` changed: ``restore()`` (or leaving its ``with``
    block) puts the model's attention processors and block norms back and ends its
    batch-invariant mode. Idempotent."""

    def __init__(self, model, processors):
        """Enters the batch-invariant mode for ``model``, whose previous attention
        processors ``processors`` (name -> processor) ``restore()`` sets back, and puts
        every block's LayerNorm + modulation, the output's ``norm_out`` (``adaln_modulation``),
        the text path's ``txt_norm`` (``qk_rmsnorm``) and the timestep embedding
        (``timestep_embedding``) under the contract."""
        self.model = model
        self._processors = processors
        from diffusers.models.embeddings import Timesteps
        from diffusers.models.normalization import AdaLayerNormContinuous
        from diffusers.models.transformers.transformer_qwenimage import (
            QwenImageTransformerBlock,
        )

        # Modules whose forward the switch replaced (an instance attribute, which restore()
        # removes): every block (the one this was written for: its four LayerNorms
        # affine-free), the output's AdaLayerNormContinuous where it is the affine-free
        # LayerNorm the model builds, the text path's RMSNorm and the timestep embedding's
        # Timesteps.
        self._forwards = []
        for block in getattr(model, "transformer_blocks", ()):
            if isinstance(block, QwenImageTransformerBlock) and all(
                    _is_affine_free_layer_norm(getattr(block, name, None))
                    for name in _BLOCK_NORMS):
                block.forward = _block_forward_under_contract(block)
                self._forwards.append(block)
        norm_out = getattr(model, "norm_out", None)
        if (isinstance(norm_out, AdaLayerNormContinuous)
                and _is_affine_free_layer_norm(getattr(norm_out, "norm", None))):
            norm_out.forward = _continuous_under_contract(norm_out)
            self._forwards.append(norm_out)
        txt_norm = getattr(model, "txt_norm", None)
        if (isinstance(txt_norm, RMSNorm) and txt_norm.weight is not None
                and getattr(txt_norm, "bias", None) is None):
            txt_norm.forward = _rms_norm_under_contract(txt_norm)
            self._forwards.append(txt_norm)
        time_proj = getattr(getattr(model, "time_text_embed", None), "time_proj", None)
        if isinstance(time_proj, Timesteps):
            time_proj.forward = _timesteps_under_contract(time_proj)
            self._forwards.append(time_proj)
        self._mode = batch_invariant()
        self._mode.__enter__()
        self._active = True

    def restore(self) -> None:
        """Puts back the processors and norms the model had and leaves the batch-invariant
        mode (torch's kernels are back unless another context or set_batch_invariant holds
        it)."""
        if not self._active:
            return
        self._active = False
        self.model.set_attn_processor(self._processors)
        for module in self._forwards:
            module.__dict__.pop("forward", None)
        self._mode.__exit__(None, None, None)

    def __enter__(self) -> "ContractSwitch":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def under_contract(model) -> ContractSwitch:
    """Puts a diffusers ``QwenImageTransformer2DModel`` (Qwen-Image and Qwen-Image-Edit)
    under the contract: every block's attention runs ``KernelAlignQwenImageAttnProcessor``
    (fused QK norm + RoPE, joint attention over the prompt's valid tokens), and the
    batch-invariant mode (``kernel_align.batch_invariant``) runs every Linear under the
    contract's tree, so a sample's bytes do not depend on its batch or on how far its
    prompt is padded. Every block runs the library's ops in the model's order (each
    LayerNorm + modulation one ``adaln_modulation`` call, each gated residual one
    ``adaln_gate_residual`` call; with Edit's per-token modulation index, one call per run of
    tokens of one modulation set), the output's ``norm_out`` (``AdaLayerNormContinuous``) is one
    ``adaln_modulation`` call, the text path's ``txt_norm`` one ``qk_rmsnorm`` call, and
    the timestep embedding's sinusoids are ``timestep_embedding``'s (correctly rounded).
    Returns the switch; ``restore()`` or ``with under_contract(model): ...`` undoes it.

    Raises:
        TypeError: ``model`` is not a ``QwenImageTransformer2DModel``.
    """
    from diffusers import QwenImageTransformer2DModel

    if not isinstance(model, QwenImageTransformer2DModel):
        kind = type(model)
        raise TypeError("kernel_align.diffusers.under_contract: argument 'model': expected a "
                        "diffusers QwenImageTransformer2DModel, found "
                        f"{kind.__module__}.{kind.__qualname__}")
    processors = dict(model.attn_processors)
    model.set_attn_processor(KernelAlignQwenImageAttnProcessor())
    return ContractSwitch(model, processors)
