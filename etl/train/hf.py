"""Packed batch -> ``model(**kw)`` keywords of a transformers causal LM, packed == unpacked.

transformers keeps the documents of a packed row apart only when told how: with the default
``use_cache=True`` (also in ``train()`` mode, transformers 5.x) a call with ``input_ids`` and
reset ``position_ids`` attends across documents (a tiny Qwen2 on 160-token packs: logits off by
up to 0.26, an example's summed loss by 0.18). `hf_inputs` gives each attention implementation
the input it reads; `pair_hf_inputs` does the same for preference batches (padded pairs, or
prefix-shared packed pairs masked by `etl.loader.pairs.attention`). transformers is never
imported here: the model is only asked for its config, dtype and device.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from etl.columns import COMPLETION_MASK, IGNORE_INDEX, IMAGE_GRID_THW, INPUT_IDS
from etl.errors import EtlError, EtlWarning
from etl.loader.attention import document_block_mask, document_sdpa_mask
from etl.loader.collate import PIXEL_VALUES
from etl.loader.pairs.attention import pair_block_mask, pair_sdpa_mask
from etl.loader.pairs.pack import PAIR_IDS, PART_IDS

# Implementations that take a mask (or none, then transformers masks from position_ids) and
# those that take the varlen keywords of flash-attn (same keywords for versions 2 and 3).
_MASKED = ("sdpa", "eager", "flex_attention")
_VARLEN = ("flash_attention_2", "flash_attention_3")
_FULL, _SLIDING = "full_attention", "sliding_attention"
# Models whose 3-D positions `mrope_positions` gives (transformers' `get_rope_index` of both
# places an image alike; Qwen3-VL's differs and is not done here).
_MROPE = ("qwen2_vl", "qwen2_5_vl")


def hf_inputs(batch: Mapping[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """Keywords for ``model(**kw)`` so a packed batch trains as its examples would alone.

    Gives ``input_ids``, ``labels`` (the model shifts them itself), ``position_ids`` (0 at every
    document start), ``use_cache=False`` and the attention input of the model's
    ``config._attn_implementation``:

    - ``sdpa``: a boolean (B, 1, W, W) block-diagonal causal mask (True = attend). Dense: W^2
      bytes a row (4 MB at W = 2048) and SDPA's math or memory-efficient kernel, never the flash
      one; right for CPU and moderate W.
    - ``eager``: the same mask, additive (0 or the dtype's minimum, as eager adds it to the
      scores): 4 or 8 bytes per cell.
    - ``flex_attention``: a `BlockMask` (`document_block_mask`): skips the blocks between
      documents, but FlexAttention's backward needs CUDA (torch 2.13 on CPU raises
      NotImplementedError in ``backward``; the forward works): train on CPU with ``sdpa``.
    - ``flash_attention_2``/``_3``: ``cu_seq_lens_q/k`` and ``max_length_q/k`` over the
      flattened B x W tokens (as ``DataCollatorWithFlattening`` gives), no mask: no padding
      work and no mask memory; needs flash-attn on CUDA and half precision.

    A model with sliding-window or chunked layers (``config.layer_types`` other than
    ``full_attention``, or a ``sliding_window``) gets no mask under sdpa, eager or flex: an
    explicit mask would replace its windows, so transformers builds its own masks, which
    follow ``position_ids`` (a new document wherever a position does not follow the previous
    one) when there is no mask and no cache.

    Shapes: a ``target="labels"`` batch passes as it is (W = T). An x/y batch gets W = T + 1:
    ``input_ids`` = x plus one column (y's last label, the token after x), ``labels`` = one
    ignored column plus y, so the model's shift (logits[i] scored against labels[i + 1]) scores
    logits[i] against y[i] and keeps the last label of a full row; nothing attends to the
    extra column (causal) and its own logits are never scored. Padding is a document of its
    own, never a label.

    ``labels`` carry the loss mask (``loss_mask``), not ``loss_weight``: with weighted data,
    score ``logits`` yourself. The model's ``loss`` is the mean over the batch's trained labels.

    A batch with images (``pixel_values``, ``image_grid_thw``) for a Qwen2-VL or Qwen2.5-VL model
    also passes those two and, as ``position_ids``, (4, B, W): the 1-D positions above (what
    transformers masks from, as its generate does) over the 3-D mRoPE positions of
    `mrope_positions`, restarting in every document. Without 3-D positions transformers 5
    silently falls back to 1-D ones. flash-attn's varlen keywords would also reach the vision
    tower (a duplicate keyword there): load a vision-language model with ``sdpa`` for packed rows.

    Args:
        batch: a packed batch of `ParquetLoader` (``packing=...``) or `collate_packed`: x/y or
            input_ids/labels, ``loss_mask``, ``segment_ids``, ``position_ids``; tensors or arrays.
        model: a transformers causal LM (its ``config``, ``dtype`` and ``device`` are read;
            tensors are moved to its device).

    Returns:
        Keywords for ``model(**kw)``.

    Raises:
        EtlError: the batch is not packed, or the implementation is not one of the above.
    """
    config, impl = _implementation(model)
    device, dtype = _device_dtype(model)
    ids, labels, seg, pos = (t.to(device, non_blocking=True) for t in _widened(batch))
    kw: dict[str, Any] = {"input_ids": ids, "labels": labels, "position_ids": pos, "use_cache": False}
    if PIXEL_VALUES in batch:
        kw |= _vision(batch, config, impl, ids, seg, pos)
    if impl in _VARLEN:
        return kw | _varlen(seg)
    if not _full_attention_only(config):
        return kw  # transformers' own masks, made from position_ids (see above)
    if impl == "flex_attention":
        if model.training and device.type == "cpu":
            warnings.warn("flex_attention on CPU: the forward works, the backward raises "
                          "(torch 2.13); train on CUDA, or load the model with "
                          "attn_implementation='sdpa' (same result)", EtlWarning, stacklevel=2)
        return kw | {"attention_mask": document_block_mask(seg)}
    mask = document_sdpa_mask(seg)
    if impl == "eager":  # eager adds the mask to the scores: 0 or the dtype's minimum
        mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(
            ~mask, torch.finfo(dtype).min)
    return kw | {"attention_mask": mask}


def _implementation(model: torch.nn.Module) -> tuple[Any, str]:
    """The model's config and attention implementation, checked."""
    config = getattr(model, "config", None) or getattr(getattr(model, "module", None), "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl not in _MASKED + _VARLEN:
        raise EtlError(
            f"hf_inputs needs a transformers model whose config._attn_implementation is one of "
            f"{', '.join(_MASKED + _VARLEN)}; got {impl!r}. Load it with "
            "from_pretrained(..., attn_implementation='sdpa') (or from_config(...)), "
            "or call model.set_attn_implementation('sdpa')"
        )
    return config, impl


def _device_dtype(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    """Where the inputs go and the dtype of the eager mask: the first parameter's."""
    param = next(model.parameters(), None)
    if param is None:
        return torch.device("cpu"), torch.float32
    return param.device, param.dtype


def _full_attention_only(config: Any) -> bool:
    """True when every layer attends to the whole past (no window, no chunk); a vision-language
    model's layers are its text config's."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(config, "layer_types", None) or [_FULL]
    windowed = getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None)
    return not windowed and all(t == _FULL for t in types)


def _widened(batch: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
    """(B, W) input_ids, labels (-100 where not trained), segment_ids, position_ids."""
    missing = [k for k in ("segment_ids", "position_ids", "loss_mask") if k not in batch]
    shifted = "x" in batch and "y" in batch
    if missing or not (shifted or ("input_ids" in batch and "labels" in batch)):
        raise EtlError(
            f"hf_inputs needs a packed batch (x/y or input_ids/labels, loss_mask, segment_ids, "
            f"position_ids); this one has {sorted(batch)}. Pass packing='bfd' (or ffd, "
            "sequential, stream) to ParquetLoader, or collate with collate_packed"
        )
    get = {k: torch.as_tensor(batch[k]) for k in ("segment_ids", "position_ids", "loss_mask")}
    seg, pos = get["segment_ids"].long(), get["position_ids"].long()
    if not shifted:
        ids, labels = torch.as_tensor(batch["input_ids"]), torch.as_tensor(batch["labels"])
        return ids.long(), labels.long().where(get["loss_mask"].bool(), IGNORE_INDEX), seg, pos
    x, y = torch.as_tensor(batch["x"]).long(), torch.as_tensor(batch["y"]).long()
    y = y.where(get["loss_mask"].bool(), IGNORE_INDEX)
    last = y[:, -1:].where(y[:, -1:] >= 0, x[:, -1:])  # an ignored label: any real id will do
    return (
        torch.cat([x, last], 1),
        torch.cat([torch.full_like(y[:, :1], IGNORE_INDEX), y], 1),
        torch.cat([seg, seg[:, -1:]], 1),  # the extra token joins the last document
        torch.cat([pos, pos[:, -1:] + 1], 1),
    )


def _vision(batch: Mapping[str, Any], config: Any, impl: str, ids: torch.Tensor, seg: torch.Tensor,
            pos: torch.Tensor) -> dict[str, Any]:
    """``pixel_values``, ``image_grid_thw`` and (4, B, W) ``position_ids`` of an image batch."""
    kind, vision = getattr(config, "model_type", None), getattr(config, "vision_config", None)
    if kind not in _MROPE or vision is None:
        raise EtlError(f"the batch has images; hf_inputs gives their positions to {', '.join(_MROPE)} models, "
                       f"not {kind!r}: load e.g. Qwen2_5_VLForConditionalGeneration")
    if impl in _VARLEN:
        raise EtlError(f"{impl} with images: its varlen keywords would reach the vision tower too; load the "
                       "model with attn_implementation='sdpa' (document masks, same result)")
    grids = torch.as_tensor(batch[IMAGE_GRID_THW]).long().to(ids.device)
    positions = torch.cat([pos[None], mrope_positions(ids, seg, grids, image_token_id=config.image_token_id,
                                                      merge=vision.spatial_merge_size)])
    if not len(grids):  # rows of text only: the vision tower cannot take 0 images (torch.cat of none)
        return {"position_ids": positions}
    return {PIXEL_VALUES: torch.as_tensor(batch[PIXEL_VALUES]).to(ids.device, non_blocking=True),
            IMAGE_GRID_THW: grids, "position_ids": positions}


def mrope_positions(ids: torch.Tensor, seg: torch.Tensor, grids: torch.Tensor, *, image_token_id: int,
                    merge: int) -> torch.Tensor:
    """(3, B, W) int64 positions of transformers' Qwen2-VL ``get_rope_index``, each document of a
    row counted from 0 as if alone: a text token advances all three by 1; an image's tokens (one
    run of ``image_token_id`` per ``grids`` row, in order) sit at start + (t, row, column) of its
    merged grid, and the text after it starts max(h, w) / merge later.

    Vectorized over the B x W tokens (a cumsum, a running max, gathers): no loop per document,
    image or token; one host sync (the image runs, checked against ``grids``).

    Raises:
        EtlError: image runs that do not match ``grids`` (another image token or merge size).
    """
    rows, width = ids.shape
    at = torch.arange(rows * width, device=ids.device)
    img, row_start, row_end = (ids == image_token_id).reshape(-1), at % width == 0, at % width == width - 1
    starts = img & (row_start | ~img.roll(1))
    first, last = starts.nonzero().squeeze(1), (img & (row_end | ~img.roll(-1))).nonzero().squeeze(1)
    llh, llw = grids[:, 1] // merge, grids[:, 2] // merge
    if len(first) != len(grids) or not torch.equal(last - first + 1, grids[:, 0] * llh * llw):
        raise EtlError(f"the batch has {len(first)} runs of image token {image_token_id} for {len(grids)} images, "
                       "or runs of other lengths than their grids give: the model's image_token_id or "
                       "spatial_merge_size is not the data's (its manifest's images block)")
    step = (~img).long()
    step[last] = torch.maximum(llh, llw)  # after the image; its own tokens do not advance
    before = step.cumsum(0) - step
    flat_seg = seg.reshape(-1)
    doc = row_start.clone()
    doc[1:] |= flat_seg[1:] != flat_seg[:-1]
    base = before - before[torch.where(doc, at, 0).cummax(0).values]  # from 0 in every document
    if not len(grids):
        return base.expand(3, -1).reshape(3, rows, width)
    k = (starts.long().cumsum(0) - 1).clamp(min=0)  # the image of each image token
    r, cells, cols = at - first[k], (llh * llw)[k], llw[k]
    offset = torch.stack([r // cells, r % cells // cols, r % cols]) * img
    return (base + offset).reshape(3, rows, width)


def _varlen(seg: torch.Tensor) -> dict[str, Any]:
    """flash-attn varlen keywords: a sequence per run of equal (row, segment), padding included."""
    start = torch.ones_like(seg, dtype=torch.bool)
    start[:, 1:] = seg[:, 1:] != seg[:, :-1]
    bounds = torch.cat([start.reshape(-1).nonzero().squeeze(1),
                        torch.tensor([seg.numel()], device=seg.device)]).to(torch.int32)
    longest = int(bounds.diff().max())  # flash-attn takes a Python int (one sync per batch)
    return {"cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds,
            "max_length_q": longest, "max_length_k": longest}


def _window_layers(config: Any) -> dict[str, int | None]:
    """Layer type -> its window: full layers None; raises on layer types it cannot mask."""
    types = set(getattr(config, "layer_types", None) or [_FULL])
    window = getattr(config, "sliding_window", None)
    if getattr(config, "attention_chunk_size", None) or types - {_FULL, _SLIDING}:
        raise EtlError(f"prefix-shared packing masks full and sliding-window layers, not {sorted(types)} "
                       "(chunked attention): use padded preference batches (packing=None)")
    if _SLIDING in types and not window:
        raise EtlError("the model has sliding_attention layers but no config.sliding_window")
    return {t: window if t == _SLIDING else None for t in types}


def pair_hf_inputs(batch: Mapping[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """Keywords for ``model(**kw)`` of a transformers causal LM, for either preference layout.

    - padded (`collate_pairs`): ``input_ids`` and the 2D ``attention_mask``, as TRL calls it.
    - packed (`collate_pairs_packed`): ``input_ids``, ``position_ids`` and a custom mask per the
      model's ``config._attn_implementation``: ``sdpa`` a boolean (B, 1, S, S) mask; ``eager``
      the same, additive (0 or the dtype's minimum); ``flex_attention`` a `BlockMask` (CUDA for
      the backward: on CPU train with ``sdpa``, same result). A model with sliding-window
      layers gets ``{layer type: mask}`` (transformers takes a dict) with the window in positions.
      flash-attn's varlen kernels cannot skip the chosen tokens for the rejected ones:
      load the model with ``sdpa`` or ``flex_attention``.

    Both add ``use_cache=False`` and no labels: score the logits with
    `etl.train.dpo.completion_logps`.

    Raises:
        EtlError: a batch of neither layout, or an implementation the layout cannot use.
    """
    config, impl = _implementation(model)
    device, dtype = _device_dtype(model)
    ids = torch.as_tensor(batch[INPUT_IDS]).long().to(device, non_blocking=True)
    if PAIR_IDS not in batch:
        if "attention_mask" not in batch or COMPLETION_MASK not in batch:
            raise EtlError(f"pair_hf_inputs needs a preference batch (collate_pairs or collate_pairs_packed); "
                           f"this one has {sorted(batch)}")
        return {INPUT_IDS: ids, "attention_mask": torch.as_tensor(batch["attention_mask"]).to(device),
                "use_cache": False}
    if impl not in ("sdpa", "eager", "flex_attention"):
        raise EtlError(f"prefix-shared packed pairs need a custom attention mask; {impl} takes none: load the "
                       "model with attn_implementation='sdpa' (or 'flex_attention' on CUDA), or use padded "
                       "preference batches (packing=None)")
    pair, part, pos = (torch.as_tensor(batch[k]).to(device, non_blocking=True)
                       for k in (PAIR_IDS, PART_IDS, "position_ids"))
    pos = pos.long()
    masks = {}
    for layer_type, window in _window_layers(config).items():
        if impl == "flex_attention":
            masks[layer_type] = pair_block_mask(pair, part, position_ids=pos, window=window)
            continue
        mask = pair_sdpa_mask(pair, part, position_ids=pos, window=window)
        if impl == "eager":  # eager adds the mask to the scores
            mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, torch.finfo(dtype).min)
        masks[layer_type] = mask
    attention = masks[_FULL] if list(masks) == [_FULL] else masks
    return {INPUT_IDS: ids, "position_ids": pos, "attention_mask": attention, "use_cache": False}
