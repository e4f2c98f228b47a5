"""The parallelism strategies: DDLBench's data/model/pipeline parallelism, ZeRO/FSDP sharding, tensor
parallelism, and ParaDL's filter/channel/spatial CNN splits with their data-parallel hybrids."""

from __future__ import annotations

from ddlbench.catalog import STRATEGIES, OptionSpec, StrategySpec

_MODULE = "ddlbench.train.strategies"
_CNN = ("cnn2d", "cnn3d")
_BALANCE = OptionSpec(
    default="flops",
    choices=("flops", "params"),
    description="how consecutive blocks are grouped into stages: equal forward FLOPs (counted on one "
    "sample) or equal parameter counts; the stage with the largest share is made as small as possible",
)
# Execution options a strategy cannot honour (Point.precision, Point.compile; ddlbench.train.execution),
# with the reason the plan gives. compile is refused wherever it is not wired in and checked by a test.
_FLAT_NCHW = "its parameters are views of flat buffers laid out NCHW, so the weights cannot stay channels_last"
_GATHERED_NCHW = (
    "FSDP2 all-gathers every parameter into a contiguous (NCHW) tensor for the forward, so the weights cannot "
    "stay channels_last"
)
_COMPILE_PIPELINE = (
    "torch.distributed.pipelining runs the stage modules' forward and backward itself (and ddlbench watches "
    "them with module hooks); compiling stages is not wired in"
)
_COMPILE_SHARDED = (
    "FSDP2 and DTensor sharding need each block compiled before it is sharded (as torchtitan does), which "
    "this strategy does not do"
)
_COMPILE_PARADL = (
    "its split layers run collectives and halo exchanges inside custom autograd functions, where torch.compile "
    "would break the graph at every split layer"
)

STRATEGIES.register(
    StrategySpec(
        name="ddp",
        builder=f"{_MODULE}.ddp:parallelize_ddp",
        description="data parallel with torch DistributedDataParallel (bucketed all-reduce overlapping backward)",
        mesh=("dp",),
        options={
            "bucket_cap_mb": OptionSpec(
                default="25", description="gradient bucket size in MiB (DDP's bucket_cap_mb); smaller overlaps more"
            )
        },
    )
)
STRATEGIES.register(
    StrategySpec(
        name="horovod",
        builder=f"{_MODULE}.horovod:parallelize_horovod",
        description="data parallel through Horovod's DistributedOptimizer (gloo controller, tensor fusion)",
        mesh=("dp",),
        options={
            "fusion_threshold_mb": OptionSpec(
                default="64", description="Horovod tensor-fusion buffer in MiB (HOROVOD_FUSION_THRESHOLD)"
            )
        },
        needs="horovod 0.28.1, built by `make horovod` (envs/horovod.sh)",
        refuses={
            "precision=fp16": "Horovod's DistributedOptimizer averages gradients inside step(), so fp16's gradient "
            "scaler would need synchronize() before unscale_() and skip_synchronize() around its step, which is "
            "not wired in",
            "compile": "Horovod's DistributedOptimizer hooks each parameter's gradient accumulator; that is not "
            "checked under torch.compile here",
        },
    )
)
STRATEGIES.register(
    StrategySpec(
        name="model_parallel",
        builder=f"{_MODULE}.model_parallel:parallelize_model_parallel",
        description="layers cut into one stage per rank, the whole batch passed stage to stage with no "
        "micro-batching (DDLBench's naive model-parallel baseline)",
        mesh=("mp",),
        options={"balance": _BALANCE},
    )
)
for _name, _schedule, _per_rank in (
    ("gpipe", "GPipe: all forwards, then all backwards (torch.distributed.pipelining ScheduleGPipe)", 1),
    ("1f1b", "1F1B / PipeDream-flush: one forward, one backward in steady state (Schedule1F1B)", 1),
    ("interleaved_1f1b", "interleaved 1F1B: two stages per rank, looped placement (ScheduleInterleaved1F1B)", 2),
):
    STRATEGIES.register(
        StrategySpec(
            name=_name,
            builder=f"{_MODULE}.pipeline:parallelize_{_name}",
            description=f"pipeline parallel, {_schedule}; the batch is cut into micro_batches",
            mesh=("pp",),
            micro_batched=True,
            stages_per_rank=_per_rank,
            options={"balance": _BALANCE},
            refuses={"compile": _COMPILE_PIPELINE},
        )
    )
STRATEGIES.register(
    StrategySpec(
        name="fsdp",
        builder=f"{_MODULE}.sharded:parallelize_fsdp",
        description="fully sharded data parallel (FSDP2 fully_shard per block; ZeRO-3: parameters, gradients "
        "and optimizer state sharded, parameters gathered for each block's forward and backward)",
        mesh=("dp",),
        materialises_shards=True,
        refuses={"compile": _COMPILE_SHARDED, "channels_last": _GATHERED_NCHW},
    )
)
STRATEGIES.register(
    StrategySpec(
        name="zero2",
        builder=f"{_MODULE}.sharded:parallelize_zero2",
        description="ZeRO stage 2: every rank keeps all parameters; gradients are reduce-scattered and each "
        "rank keeps optimizer state for, and updates, only its shard, then all-gathers the parameters",
        mesh=("dp",),
        options={
            "bucket_cap_mb": OptionSpec(
                default="25",
                description="gradient bucket size in MiB; each bucket is reduce-scattered, and its full "
                "gradients freed, as soon as backward has produced it",
            )
        },
        refuses={"channels_last": _FLAT_NCHW},
    )
)
STRATEGIES.register(
    StrategySpec(
        name="tensor",
        builder=f"{_MODULE}.tensor:parallelize_tensor",
        description="tensor parallel (Megatron-style, DTensor): attention heads and the MLP's hidden units "
        "split over ranks, column- then row-wise",
        mesh=("tp",),
        materialises_shards=True,
        families=("transformer",),
        refuses={"compile": _COMPILE_SHARDED},
    )
)
STRATEGIES.register(
    StrategySpec(
        name="filter",
        builder=f"{_MODULE}.paradl:parallelize_filter",
        description="ParaDL filter parallelism: each rank computes a slice of every layer's output channels "
        "(filters); activations are all-gathered after each split layer",
        mesh=("fp",),
        families=_CNN,
        refuses={"compile": _COMPILE_PARADL},
    )
)
STRATEGIES.register(
    StrategySpec(
        name="channel",
        builder=f"{_MODULE}.paradl:parallelize_channel",
        description="ParaDL channel parallelism: each rank convolves a slice of every layer's input channels; "
        "the partial outputs are summed with an all-reduce",
        mesh=("cp",),
        families=_CNN,
        refuses={"compile": _COMPILE_PARADL},
    )
)
STRATEGIES.register(
    StrategySpec(
        name="spatial",
        builder=f"{_MODULE}.spatial:parallelize_spatial",
        description="ParaDL spatial parallelism: activations cut along their first spatial axis (height, or "
        "depth for volumes), halo rows exchanged with neighbours before each convolution and pooling; "
        "gathered where the axis no longer divides",
        mesh=("sp",),
        families=_CNN,
        refuses={"compile": _COMPILE_PARADL},
    )
)
STRATEGIES.register(
    StrategySpec(
        name="dp_pp",
        builder=f"{_MODULE}.pipeline:parallelize_dp_pp",
        description="hybrid data × pipeline on a 2-D mesh: replicas of a `split`-stage pipeline",
        mesh=("dp", "pp"),
        micro_batched=True,
        stages_per_rank=1,
        options={
            "schedule": OptionSpec(default="1f1b", choices=("1f1b", "gpipe"), description="the pipeline schedule"),
            "balance": _BALANCE,
        },
        refuses={"compile": _COMPILE_PIPELINE},
    )
)
STRATEGIES.register(
    StrategySpec(
        name="dp_tp",
        builder=f"{_MODULE}.tensor:parallelize_dp_tp",
        description="hybrid data × tensor on a 2-D mesh: replicas of a `split`-way tensor-parallel transformer",
        mesh=("dp", "tp"),
        materialises_shards=True,
        families=("transformer",),
        refuses={"compile": _COMPILE_SHARDED},
    )
)
STRATEGIES.register(
    StrategySpec(
        name="dp_spatial",
        builder=f"{_MODULE}.spatial:parallelize_dp_spatial",
        description="ParaDL's ds hybrid: data parallel across groups, spatial parallel over `split` ranks within",
        mesh=("dp", "sp"),
        families=_CNN,
        refuses={"compile": _COMPILE_PARADL},
    )
)
STRATEGIES.register(
    StrategySpec(
        name="dp_filter",
        builder=f"{_MODULE}.paradl:parallelize_dp_filter",
        description="ParaDL's df hybrid: data parallel across groups, filter parallel over `split` ranks within",
        mesh=("dp", "fp"),
        families=_CNN,
        refuses={"compile": _COMPILE_PARADL},
    )
)
