"""Which (strategy, model, dataset, ranks) combinations make sense, decided at plan time from the
catalog's facts, so a sweep skips them with a reason instead of failing at run time."""

from __future__ import annotations

import math

from ddlbench.catalog import DATASETS, MODELS, STRATEGIES
from ddlbench.catalog.layer_table import SplitKind, predict_split_share
from ddlbench.point import PRECISIONS, Point

# A filter, channel or spatial point (or its dp hybrid) must split at least this share of its model's
# forward FLOPs to run and be compared under its strategy's name. With a share s split over p ranks, each
# rank still computes (1 - s) + s/p of the model: the split can speed the compute up by at most 1/(1 - s)
# however many ranks it has (Amdahl), so below one half it cannot even halve a rank's work, and what the
# point measures is mostly the whole model run alike on every rank plus the split's messages. (resnet8 over
# 3 ranks splits 0 of 10 layers; spatial resnet50 on ImageNet over 8 ranks runs 4 of 18 blocks on slabs,
# 19 % of its FLOPs.) The ranks report the share they really split as `split_flops_share` in their facts.
MIN_SPLIT_FLOPS_SHARE = 0.5
_SPLIT_KINDS: dict[str, SplitKind] = {"fp": "filter", "cp": "channel", "sp": "spatial"}


def why_skipped(point: Point) -> str | None:
    """None when the point can run; otherwise one sentence saying why it cannot."""
    model, dataset, strategy = MODELS.get(point.model), DATASETS.get(point.dataset), STRATEGIES.get(point.strategy)
    world, split = point.world_size, point.split
    if model.input_kind != dataset.input_kind:
        return f"{point.model} takes {model.input_kind} input; {point.dataset} gives {dataset.input_kind}"
    if model.family not in strategy.families:
        return f"{point.strategy} splits {' and '.join(strategy.families)} models; {point.model} is {model.family}"
    if point.channels_last and model.family != "cnn2d":
        return f"channels_last is a layout of 2-D CNNs; {point.model} is {model.family}"
    refused = _refused_execution(point)
    if refused:
        return refused
    if strategy.split_dim is not None:
        if strategy.data_parallel:
            if split < 2:
                return f"{point.strategy} needs split >= 2 ranks per replica; split is {split}"
            if world % split:
                return f"{world} ranks do not divide into replicas of split={split}"
            if world // split < 2:
                return (
                    f"{point.strategy} with split={split} on {world} ranks leaves one replica; "
                    f"that is {_pure_name(point.strategy)}, or lower split"
                )
        elif world < 2:
            return f"{point.strategy} cuts the model over ranks and needs at least 2; this point has 1"
    if strategy.stages_per_rank:
        stages = split * strategy.stages_per_rank
        if stages > model.blocks:
            return f"{stages} pipeline stages exceed the {model.blocks} blocks {point.model} can be cut into"
    elif strategy.split_dim == "mp" and split > model.blocks:
        return f"{split} model-parallel stages exceed the {model.blocks} blocks {point.model} can be cut into"
    if strategy.micro_batched and point.batch_size % point.micro_batches:
        return f"batch_size {point.batch_size} does not divide into {point.micro_batches} micro-batches"
    if strategy.micro_batched:
        # what torch 2.13's schedules check when they are built (torch.distributed.pipelining.schedules)
        schedule = point.resolved_strategy_options().get("schedule", point.strategy)
        if schedule == "1f1b" and point.micro_batches < split:
            return f"1F1B needs at least as many micro-batches as stages: {point.micro_batches} < {split}"
        if strategy.stages_per_rank == 2:
            rounds = max(1, point.micro_batches // split)  # ScheduleInterleaved1F1B's number_of_rounds
            if point.micro_batches % rounds:
                return (
                    f"interleaved 1F1B runs micro-batches in rounds of max(1, micro_batches // ranks) = {rounds}; "
                    f"micro_batches ({point.micro_batches}) is not a multiple of it"
                )
    if strategy.split_dim == "tp":
        heads, d_model = model.shape.get("heads", 0), model.shape.get("d_model", 0)
        if heads % split or (4 * d_model) % split:
            return f"tensor parallelism over {split} ranks needs {split} to divide the {heads} heads of {point.model}"
    if strategy.split_dim == "sp":
        extent = dataset.sample_shape[1]  # height, or depth for volumes
        if extent % split:
            return f"spatial split over {split} ranks needs {split} to divide the input's first axis ({extent})"
    if strategy.split_dim in _SPLIT_KINDS:
        return _too_little_split(point, _SPLIT_KINDS[strategy.split_dim], split if strategy.data_parallel else world)
    return None


def _refused_execution(point: Point) -> str | None:
    """Why the point's strategy cannot honour its precision or compile setting (StrategySpec.refuses), or None."""
    refuses = STRATEGIES.get(point.strategy).refuses
    why = refuses.get(f"precision={point.precision}")
    if why:
        accepted = ", ".join(p for p in PRECISIONS if f"precision={p}" not in refuses)
        return f"{point.strategy} cannot run precision={point.precision}: {why}; accepted precisions: {accepted}"
    if point.channels_last and "channels_last" in refuses:
        return f"{point.strategy} cannot run channels_last=true: {refuses['channels_last']}; set it to false"
    if point.compile and "compile" in refuses:
        compiling = [name for name in STRATEGIES.names() if "compile" not in STRATEGIES.get(name).refuses]
        return (
            f"{point.strategy} cannot run compile=true: {refuses['compile']}; set compile to false, or use one "
            f"of {', '.join(compiling)}"
        )
    return None


def _too_little_split(point: Point, kind: SplitKind, parts: int) -> str | None:
    """Why a ParaDL split of this point splits too small a share of the model's FLOPs, or None."""
    share = predict_split_share(point.model, point.dataset, point.model_options, kind, parts)
    if share.flops_share >= MIN_SPLIT_FLOPS_SHARE:
        return None
    layout = f"with split={parts}" if STRATEGIES.get(point.strategy).data_parallel else f"over {parts} ranks"
    what = (
        f"runs {share.split} of the {share.of} blocks of {point.model} on slabs"
        if kind == "spatial"
        else f"splits {share.split} of the {share.of} convolution and linear layers of {point.model}"
    )
    return (
        f"{point.strategy} {layout} {what}, {_percent(share.flops_share)} of its forward FLOPs on {point.dataset}, "
        f"below the {_percent(MIN_SPLIT_FLOPS_SHARE)} a point needs to be compared as {point.strategy}"
    )


def _percent(fraction: float) -> str:
    return f"{math.floor(100 * fraction)} %"  # rounded down: 49.96 % is below 50 % and must not read as 50 %


def _pure_name(hybrid: str) -> str:
    pure = {"dp_pp": "a pipeline (gpipe/1f1b)", "dp_tp": "tensor", "dp_spatial": "spatial", "dp_filter": "filter"}
    return pure.get(hybrid, "the pure strategy")
