"""Typed requests: a command's options made from a request model (moment.cli.requests), the service's
bodies derived from the same models (moment.requests.derive), so each default is declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pytest
import typer
from pydantic import BaseModel, Field, ValidationError
from typer.testing import CliRunner

from moment.errors import MomentError
from moment.placement.requests import PlaceRequest
from moment.planner.requests import PlanRequest
from moment.requests import Cli, derive, narrow


class _Demo(BaseModel):
    name: Annotated[str, Cli(("--name", "-n"), metavar="WHO")] = Field(description="who to greet")
    times: int = Field(2, description="how often")
    loud: Annotated[bool, Cli(("--loud/--quiet",))] = Field(False, description="shout")
    tags: Annotated[list[str], Cli(("--tag",), type=list[str] | None, default=None)] = Field(
        default_factory=list, description="repeatable")
    limit: Annotated[int | None, Cli(show_default=False)] = Field(None, description="at most this many")
    secret: Annotated[str, Cli(cli=False)] = "s"


def _app(seen: dict[str, Any]) -> typer.Typer:
    from moment.cli.requests import given, request_options

    app = typer.Typer()

    @app.command()
    @request_options(_Demo)
    def hello(json_out: bool = typer.Option(False, "--json", help="as JSON"), **options: Any) -> None:
        seen.update(req=_Demo(**given(options)), json=json_out)

    return app


def test_options_come_from_the_fields():
    seen: dict[str, Any] = {}
    app = _app(seen)
    r = CliRunner().invoke(app, ["-n", "x", "--tag", "a", "--tag", "b", "--quiet", "--limit", "3", "--json"])
    assert r.exit_code == 0, r.output
    req = seen["req"]
    assert (req.name, req.times, req.loud, req.tags, req.limit, req.secret) == ("x", 2, False, ["a", "b"], 3, "s")
    # what the CLI leaves at None is left to the model (not set); the others arrive with their values
    assert seen["json"] and req.model_fields_set == {"name", "times", "tags", "loud", "limit"}
    seen.clear()
    assert CliRunner().invoke(app, ["--name", "y", "--loud"]).exit_code == 0
    assert seen["req"].loud and seen["req"].tags == [] and seen["req"].model_fields_set == {"name", "times", "loud"}
    helptext = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    for part in ("--name", "-n", "WHO", "who to greet", "--times", "default: 2", "--loud", "--quiet", "--tag",
                 "--limit", "--json"):
        assert part in helptext, part
    assert "--secret" not in helptext
    assert CliRunner().invoke(app, []).exit_code != 0  # --name is required, as its field is


def test_service_defaults_are_the_library_ones():
    from moment.service.schemas import PlaceJobRequest, PlanRequest as ServicePlan

    for name in ("gpus", "ssds", "gpu_model", "ssd_model", "maxflow_backend", "data", "replay"):
        assert ServicePlan.model_fields[name].default == PlanRequest.model_fields[name].default, name
    job = PlaceJobRequest(dataset="d", layout="l")
    lib = PlaceRequest(dataset="d", out="l")
    for name in ("profile", "gpus", "ssds", "gpu_model", "ssd_model", "epochs", "policy", "verify", "seed"):
        assert getattr(job, name) == getattr(lib, name), name
    assert job.fanouts == [25, 10]
    with pytest.raises(ValidationError):  # the service keeps its limits
        PlaceJobRequest(dataset="d", layout="l", ssds=257)
    back = narrow(PlaceRequest, job, dataset=Path("/data/d"), out=Path("/data/l"))
    assert back.dataset == Path("/data/d") and back.fanouts is None and back.ssds == 8


def test_fanouts_as_the_cli_spells_them_or_a_list():
    assert PlaceRequest(dataset="d", out="o", fanouts="25,10").fanouts == [25, 10]
    assert PlaceRequest(dataset="d", out="o", fanouts=[5]).fanouts == [5]
    with pytest.raises(MomentError, match="--fanouts must be comma-separated integers"):
        PlaceRequest(dataset="d", out="o", fanouts="25,x")


def test_derive_adds_limits_and_keeps_defaults():
    Strict = derive(_Demo, "Strict", exclude=("secret",), limits={"times": {"ge": 1, "le": 3}},
                    describe={"times": "how often, 1-3"})
    assert Strict(name="a").times == 2
    assert Strict.model_fields["times"].description == "how often, 1-3" and "secret" not in Strict.model_fields
    with pytest.raises(ValidationError):
        Strict(name="a", times=4)


class _More(BaseModel):
    times: int = Field(5, description="not this one: _Demo's comes first")
    extra: int | None = Field(None, description="only here")


def test_options_of_several_models():
    """`request_options(A, B)`: B's fields A lacks are options too, a field both have is A's."""
    from moment.cli.requests import given, request_options

    seen: dict[str, Any] = {}
    app = typer.Typer()

    @app.command()
    @request_options(_Demo, _More)
    def hello(**options: Any) -> None:
        seen.update(options)

    assert CliRunner().invoke(app, ["-n", "x", "--extra", "3"]).exit_code == 0
    assert given(seen) == {"name": "x", "times": 2, "loud": False, "extra": 3}
    helptext = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "only here" in helptext and "not this one" not in helptext


def test_pack_and_cluster_requests():
    from moment.placement.requests import PackRequest
    from moment.planner.requests import ClusterPlanRequest, PlanRequest as Plan
    from moment.service.schemas import ClusterPlanRequest as ServiceCluster
    from moment.topology.cluster import ClusterSpec

    req = PackRequest(layout="L", fanouts="5,3")
    assert (req.fanouts, req.ranks, req.epochs, req.seed, req.batch_size) == ([5, 3], 1, 1, 0, None)
    assert PackRequest(layout="L").fanouts == [25, 10]
    # the cluster form shares the workload knobs of one machine's request
    for name in ("feature_dim", "gb_per_gpu", "gpu_cache_share", "cpu_cache_share"):
        assert ClusterPlanRequest.model_fields[name].description == Plan.model_fields[name].description
    assert isinstance(ClusterPlanRequest(cluster="c.yaml").cluster, Path)
    spec = {"servers": [{"profile": "paper-machine-b", "inventory": "4xA100"}],
            "network": {"nic": "CX6-Dx-100GbE", "switch_gbit": 100}}
    assert isinstance(ClusterPlanRequest(cluster=spec).cluster, ClusterSpec)
    body = ServiceCluster(cluster=spec, remote_fraction=0.5, diagram=True)
    with pytest.raises(ValidationError):  # the service keeps its limits
        ServiceCluster(cluster=spec, remote_fraction=1.5)
    back = narrow(ClusterPlanRequest, body)
    assert back.remote_fraction == 0.5 and isinstance(back.cluster, ClusterSpec)


def test_advise_and_compare_bodies_are_the_library_requests():
    from moment.cli.requests import request_params
    from moment.cost.requests import AdviseRequest, model_names
    from moment.planner.requests import CompareRequest
    from moment.service.schemas import AdviseRequest as ServiceAdvise
    from moment.service.schemas import CompareRequest as ServiceCompare

    body, lib = ServiceAdvise(budget=1000), AdviseRequest(profile="p", budget=1000)
    for name in ("top", "years", "pue", "utilisation", "machine_watts", "max_gpus", "data"):
        assert getattr(body, name) == getattr(lib, name), name
    # the servers comparison is the CLI's alone; the workload knobs the service's alone
    assert not {"machines_max", "nic", "nics", "switch_gbit"} & set(ServiceAdvise.model_fields)
    options = request_params(AdviseRequest)
    assert "feature_dim" not in options and "machines_max" in options
    with pytest.raises(ValidationError):
        ServiceAdvise(budget=1000, top=21)
    back = narrow(AdviseRequest, body, profile="p")
    assert back.models is None and back.model_fields_set == {"budget", "profile"}
    assert model_names("A100-PCIe-40GB, P5510") == ["A100-PCIe-40GB", "P5510"] and model_names([]) is None
    with pytest.raises(MomentError, match="--models ','"):
        model_names(",")
    cmp_body, cmp_lib = ServiceCompare(profiles=["a"]), CompareRequest(profiles=["a"])
    for name in ("gpus", "ssds", "gpu_model", "ssd_model", "inventories", "overrides", "data"):
        assert getattr(cmp_body, name) == getattr(cmp_lib, name), name
    with pytest.raises(ValidationError):
        ServiceCompare(profiles=[])


def test_a_field_marked_argument_is_positional():
    class Args(BaseModel):
        names: Annotated[list[str], Cli(argument=True)] = Field(description="the names")

    seen: dict[str, Any] = {}
    from moment.cli.requests import given, request_options

    app = typer.Typer()

    @app.command()
    @request_options(Args)
    def show(**options: Any) -> None:
        seen["req"] = Args(**given(options))

    assert CliRunner().invoke(app, ["a", "b"]).exit_code == 0 and seen["req"].names == ["a", "b"]


def test_fidelity_commands_take_their_options_from_their_requests():
    from moment.cli import fidelity_cmds  # noqa: F401 - registers the commands
    from moment.cli import app
    from moment.io.probing import ProbeRequest
    from moment.planner.requests import CalibrateRequest, SimulateRequest

    commands = {c.name: c.callback for c in app.registered_commands}
    for name, model in (("simulate", SimulateRequest), ("calibrate", CalibrateRequest), ("probe", ProbeRequest)):
        params = set(commands[name].__signature__.parameters)
        assert params == set(model.model_fields) | {"json_out"}, name


def test_simulate_and_probe_bodies_are_derived_with_the_service_limits():
    from moment.io.probing import ProbeRequest
    from moment.planner.requests import SimulateRequest
    from moment.service.schemas import ProbeJobRequest, SimulateRequest as ServiceSimulate

    body = ServiceSimulate(placement="paper-c")
    lib = SimulateRequest(placement="paper-c")
    for name in ("gpus", "ssds", "steps", "uniform", "seed", "data"):
        assert getattr(body, name) == getattr(lib, name), name
    assert "layout" not in ServiceSimulate.model_fields  # a path: the command line's alone
    with pytest.raises(ValidationError):
        ServiceSimulate(placement="paper-c", steps=0)
    back = narrow(SimulateRequest, ServiceSimulate(placement="paper-c", gpus=2))
    assert back.gpus == 2 and back.ssds == 8 and back.placement == "paper-c"

    job = ProbeJobRequest()
    assert job.size_mib == 256 and ProbeRequest().size_mib == 1024  # the service's own scratch size
    assert job.queue_depth == ProbeRequest().queue_depth and job.ssd_dirs == {"ssd0": "ssd0"}
    assert set(ProbeJobRequest.model_fields) == {"ssd_dirs", "size_mib", "queue_depth"}  # names, never paths
    assert narrow(ProbeRequest, job, size_mib=job.size_mib).size_mib == 256


def test_a_truth_value_is_never_a_number_in_a_request():
    """`PlanRequest(gpus=True)` planned 1 GPU: the library's requests follow the machine models' one rule (a number
    field refuses true/false, naming the field), and so do the service's bodies derived from them."""
    from moment.requests import NoTruthValueForANumber
    from moment.service.schemas import PlanRequest as Body
    from moment.topology.model import Link

    with pytest.raises(MomentError, match="gpus: true is a truth value, not a number"):
        PlanRequest(gpus=True)
    with pytest.raises(MomentError, match="epochs: false is a truth value, not a number"):
        PlaceRequest(dataset="d", out="o", epochs=False)
    with pytest.raises(ValidationError, match="gb_per_gpu: true is a truth value"):
        Body.model_validate({"gb_per_gpu": True})
    assert PlanRequest(gpus=3).gpus == 3 and all(issubclass(m, NoTruthValueForANumber) for m in (PlanRequest, Body, Link))
