import json
import pickle

import pytest
import torch

from cutedsl_inductor.compile.cache.disk_cache import manifest_fields
from cutedsl_inductor.compile.compiler import compile_key, entry_name, target_arch
from cutedsl_inductor.compile.records import KernelSource, Params
from cutedsl_inductor.compile.specs import ScalarSpec, Sym, TensorSpec
from cutedsl_inductor.exc import RecordError, format_params
from cutedsl_inductor.runtime.loader import kernel_key

SPECS = (TensorSpec("bfloat16", (Sym("s0", 8), 64), (64, 1), 16), ScalarSpec())


def test_params_keep_their_order_and_compare_and_hash_as_a_dict():
    params = Params.of({"TILE": 128, "DTYPE": torch.float16, "NAME": "x"})
    assert list(params) == ["TILE", "DTYPE", "NAME"]
    assert params["DTYPE"] is torch.float16 and params.get("MISSING") is None
    reordered = Params.of({"NAME": "x", "TILE": 128, "DTYPE": torch.float16})
    assert params == reordered == {"DTYPE": torch.float16, "NAME": "x", "TILE": 128}
    assert hash(params) == hash(reordered)
    assert params != Params.of({"TILE": 64, "DTYPE": torch.float16, "NAME": "x"})
    assert str(params) == format_params(dict(params)) == "TILE=128, DTYPE=torch.float16, NAME='x'"
    assert Params.of(params) is params and Params.of(None) == {}
    assert dict(**params) == dict(params)  # what Jinja's **params gets


def test_params_and_kernel_sources_round_trip_through_pickle():
    kernel = KernelSource.of("cutedsl_t_0123", "source text", list(SPECS), "t",
                             {"TILE": 128, "DTYPE": torch.bfloat16})
    again = pickle.loads(pickle.dumps(kernel))
    assert again == kernel and hash(again) == hash(kernel)
    assert list(again.params) == ["TILE", "DTYPE"] and again.specs == SPECS


@pytest.mark.parametrize("params,field,value", [
    ({1: 2}, "name", 1),
    ({"not a name": 2}, "name", "not a name"),
])
def test_params_refuse_a_name_a_template_cannot_read(params, field, value):
    with pytest.raises(RecordError) as info:
        Params.of(params)
    assert str(info.value).startswith(f"Params: {field}={value!r} is refused: ")


def test_params_refuse_a_name_given_twice():
    with pytest.raises(RecordError, match=r"Params: names=\['A', 'A'\] is refused"):
        Params((("A", 1), ("A", 2)))


def test_a_kernel_source_refuses_what_is_not_its_fields():
    with pytest.raises(RecordError, match="KernelSource: specs=<class 'list'> is refused"):
        KernelSource("k", "s", list(SPECS))
    with pytest.raises(RecordError, match="KernelSource: specs='bfloat16' is refused"):
        KernelSource("k", "s", ("bfloat16",))
    with pytest.raises(RecordError, match=r"KernelSource: params=\{'A': 1\} is refused"):
        KernelSource("k", "s", SPECS, "t", {"A": 1})


def test_the_record_changes_no_compile_key():
    """The key hashes the source, entry, specs and knobs as before: the record adds
    nothing, and a list or a tuple of specs keys alike."""
    kernel = KernelSource.of("cutedsl_t_0123", "source text", list(SPECS), "t", {"A": 1})
    assert kernel_key(kernel) == compile_key("source text", entry_name("cutedsl_t_0123"),
                                             list(SPECS), target_arch())
    assert kernel_key(kernel) == kernel_key(KernelSource.of(kernel.name, kernel.source,
                                                            SPECS, "other", {"B": 2}))


def test_a_description_makes_the_manifest_fields_the_dictionary_made():
    """Sealed manifests hold these fields: the same names, order and values as the
    dictionary the record replaced (``{"kernel": ..., ..., "params": reprs}``)."""
    kernel = KernelSource.of("k", "s", SPECS, "t", {"TILE": 128, "DTYPE": torch.float16})
    fields = manifest_fields(kernel.describe("/tmp/k.py").at("sm_90a"))
    assert json.dumps(fields) == json.dumps({
        "kernel": "k", "template": "t", "arch": "sm_90a", "path": "/tmp/k.py",
        "signature": "bfloat16[s0, 64](stride 64, 1), int64",
        "params": {"TILE": "128", "DTYPE": "torch.float16"}})
    assert manifest_fields(KernelSource.of("k", "s", ()).describe(None))["arch"] is None
