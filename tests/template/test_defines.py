import pytest
import torch

from cutedsl_inductor.compile.dtypes import cutlass_dtype_name
from cutedsl_inductor.template.defines import gen_defines


def test_each_supported_type_renders_as_typed_constexpr():
    text = gen_defines({"THREADS": 256, "SCALE": 1.5, "FAST": True, "MODE": "rowwise",
                        "DTYPE": torch.bfloat16})
    assert text.splitlines() == [
        "THREADS: cutlass.Constexpr = 256",
        "SCALE: cutlass.Constexpr = 1.5",
        "FAST: cutlass.Constexpr = True",
        "MODE: cutlass.Constexpr = 'rowwise'",
        "DTYPE: cutlass.Constexpr = cutlass.BFloat16",
    ]


def test_non_finite_float_is_valid_python():
    text = gen_defines({"NEG_INF": float("-inf")})
    namespace = {"cutlass": type("cutlass", (), {"Constexpr": object})}
    exec(text, namespace)
    assert namespace["NEG_INF"] == float("-inf")


def test_unsupported_value_names_the_parameter():
    with pytest.raises(TypeError, match="TILE=\\[128, 128\\]"):
        gen_defines({"TILE": [128, 128]})


@pytest.mark.parametrize("dtype,name", [(torch.float16, "cutlass.Float16"),
                                        (torch.float32, "cutlass.Float32"),
                                        (torch.int32, "cutlass.Int32")])
def test_dtype_mapping(dtype, name):
    assert cutlass_dtype_name(dtype) == name


def test_dtype_without_cutlass_type_is_an_error():
    with pytest.raises(TypeError, match="complex64"):
        cutlass_dtype_name(torch.complex64)


@pytest.mark.parametrize("name", ["Z = 1\nimport os; os.system('true')\nW", "A B", "1ST",
                                  "class", "", "T-1"])
def test_a_parameter_name_that_is_not_an_identifier_is_refused(name):
    with pytest.raises(ValueError, match="is not a Python identifier"):
        gen_defines({name: 1})
