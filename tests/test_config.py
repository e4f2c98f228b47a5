"""The sweep schema accepts what we ship and rejects mistakes with one message naming key, value and choices."""

from __future__ import annotations

import pytest

from ddlbench.config import load_sweep_config, sweep_config_from_mapping
from ddlbench.errors import ConfigError
from tests.conftest import REPO, job_counts, run_cli, run_snakemake

SHIPPED = sorted((REPO / "workflow" / "config").glob("*.yaml"))
VALID = {"models": ["resnet8"], "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1, 2]}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    config = load_sweep_config(path)
    assert config.models and config.nodes


def test_the_sweep_schema_is_valid_json_schema_and_rejects_what_it_should():
    import jsonschema

    from ddlbench.config.schema import sweep_schema

    jsonschema.Draft202012Validator.check_schema(sweep_schema())  # raises SchemaError on a broken schema
    with pytest.raises(ConfigError, match="no-such-model"):  # the registries' names were filled in
        sweep_config_from_mapping(VALID | {"models": ["no-such-model"]})


def test_defaults_are_filled_in():
    config = sweep_config_from_mapping(VALID)
    assert config.ranks_per_node == (1,)
    assert config.batch_size == (32,)
    assert dict(config.model_options) == {"resnet8": (("norm", "batch"),)}
    assert config.exclude == ()


# (what is wrong, the config, the key the message must name, texts the message must contain)
MISTAKES = [
    ("missing axis", {k: v for k, v in VALID.items() if k != "models"}, "", ['"models"', "required"]),
    ("unknown key", VALID | {"modles": ["resnet8"]}, "", ['"modles"', "accepted keys", "models"]),
    ("unknown model", VALID | {"models": ["resnet9"]}, "models[0]", ['"resnet9"', "resnet20", "resnet8"]),
    ("unknown dataset", VALID | {"datasets": ["imagenet_x"]}, "datasets[0]", ['"imagenet_x"', "cifar10", "mnist"]),
    ("unknown strategy", VALID | {"strategies": ["dpp"]}, "strategies[0]", ['"dpp"', "ddp", "did you mean"]),
    ("scalar instead of list", VALID | {"nodes": 2}, "nodes", ["2", "array", "[2]"]),
    ("zero nodes", VALID | {"nodes": [1, 0]}, "nodes[1]", ["0", "≥ 1"]),
    ("string instead of int", VALID | {"batch_size": ["32"]}, "batch_size[0]", ['"32"', "integer"]),
    ("empty axis", VALID | {"datasets": []}, "datasets", ["[]", "at least 1"]),
    ("duplicate value", VALID | {"nodes": [1, 1]}, "nodes", ["[1, 1]", "twice"]),
    ("no warm-up", VALID | {"warmup_steps": 0}, "warmup_steps", ["0", "≥ 1"]),
    ("oversubscribe not a flag", VALID | {"oversubscribe": "yes"}, "oversubscribe", ["yes", "boolean"]),
    ("zero measured steps", VALID | {"steps": 0}, "steps", ["0", "≥ 1"]),
    ("bad sweep name", VALID | {"name": "My Sweep"}, "name", ['"My Sweep"', "must match"]),
    ("non-positive timeout", VALID | {"timeout_s": 0}, "timeout_s", ["0", "> 0"]),
    ("exclude unknown key", VALID | {"exclude": [{"modle": "resnet8"}]}, "exclude[0]", ['"modle"', "model"]),
    ("exclude value on no axis", VALID | {"exclude": [{"nodes": 4}]}, "exclude[0].nodes", ["4", "values of `nodes`: 1, 2"]),
    ("exclude everything", VALID | {"exclude": [{"model": "resnet8"}]}, "exclude", ["removes all 2 points"]),
    ("options of an unswept model", VALID | {"model_options": {"resnet20": {"norm": "group"}}}, "model_options.resnet20", ["not in `models`", "resnet8"]),
    ("unknown model option", VALID | {"model_options": {"resnet8": {"depth": "9"}}}, "model_options.resnet8.depth", ["'depth'", "norm"]),
    ("bad model option value", VALID | {"model_options": {"resnet8": {"norm": "layer"}}}, "model_options.resnet8.norm", ["'layer'", "batch, group"]),
    ("not a mapping", ["models"], "", ["mapping"]),
    ("options of an unswept strategy", VALID | {"strategy_options": {"gpipe": {"balance": "params"}}}, "strategy_options.gpipe", ["not in `strategies`", "ddp"]),
    ("unknown strategy option", VALID | {"strategy_options": {"ddp": {"bucket": 1}}}, "strategy_options.ddp.bucket", ["'bucket'", "bucket_cap_mb"]),
    ("non-numeric strategy option", VALID | {"strategy_options": {"ddp": {"bucket_cap_mb": "big"}}}, "strategy_options.ddp.bucket_cap_mb", ["'big'", "positive number"]),
    ("negative strategy option", VALID | {"strategy_options": {"ddp": {"bucket_cap_mb": -1}}}, "strategy_options.ddp.bucket_cap_mb", ["'-1'", "positive number"]),
    ("strategy option off its choices", VALID | {"strategies": ["gpipe"], "strategy_options": {"gpipe": {"balance": "time"}}}, "strategy_options.gpipe.balance", ["'time'", "flops, params"]),
    ("data for an unswept dataset", VALID | {"data": {"mnist": "/"}}, "data.mnist", ["not in `datasets`", "cifar10"]),
    ("data path that does not exist", VALID | {"data": {"cifar10": "/no/such/cifar"}}, "data.cifar10", ["'/no/such/cifar'", "does not exist", "never downloaded"]),
    ("data folder of another format", VALID | {"data": {"cifar10": "/"}}, "data.cifar10", ["expected the CIFAR-10 binary version", "data_batch_1.bin"]),
    ("zero micro-batches", VALID | {"micro_batches": [0]}, "micro_batches[0]", ["0", "≥ 1"]),
    ("nothing can run", VALID | {"strategies": ["gpipe"], "nodes": [1]}, "strategies", ["no point of the sweep can run", "at least 2"]),
]  # fmt: skip


@pytest.mark.parametrize(("what", "raw", "key", "texts"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_mistakes_are_rejected_clearly(what, raw, key, texts):
    from ddlbench.sweep import plan_sweep

    with pytest.raises(ConfigError) as caught:
        plan_sweep(raw)
    assert caught.value.key == key
    message = str(caught.value)
    for text in texts:
        assert text in message, f"{what}: {text!r} not in {message!r}"
    assert "\n" not in message


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("models: [resnet8\nnodes: [1]\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+"):
        load_sweep_config(path)


def test_cli_reports_a_bad_config_without_traceback(write_sweep):
    path = write_sweep(**(VALID | {"nodes": [0]}))
    result = run_cli("plan", "--configfile", str(path))
    assert result.returncode == 2
    assert "nodes[0]: 0 is out of range; it must be ≥ 1" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.slow
def test_snakemake_rejects_a_bad_config_before_running_anything(write_sweep, tmp_path):
    path = write_sweep(**(VALID | {"models": ["resnet9"]}))
    result = run_snakemake("-n", "--cores", "1", "--configfile", str(path))
    assert result.returncode != 0
    assert 'ddlbench: invalid sweep config: models[0]: "resnet9" is not one of the accepted values' in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_user_configfile_replaces_the_default_rather_than_merging(write_sweep):
    """A user sweep plans exactly its own points: nothing is inherited from the shipped default."""
    path = write_sweep(**(VALID | {"nodes": [1]}))
    result = run_snakemake("-n", "--cores", "1", "--configfile", str(path))
    assert result.returncode == 0, result.stderr
    assert job_counts(result) == {"run_point": 1, "report": 1, "all": 1, "total": 3}
