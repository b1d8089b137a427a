"""The dtype and rule codes: defined once in the compiled core (dcoco/dtype.h DType, dcoco/params.h Rule), exported
as _C.DType and _C.Rule; the Python side's codes are checked against them at import, and the binding rejects a
code out of range with a ValueError naming the argument."""

import pytest
import torch

from dcoco import _C
from dcoco.ops import fused
from dcoco.ops.checks import RULES

SIZES = [0, 2, 4, 8, 16, 8, 16]  # R=0: the checks run, nothing is read


def test_python_codes_are_the_cores():
    assert fused.code_mismatches({**fused._FLOAT_CODES, **fused._ID_CODES}, RULES) == []
    assert set(_C.DType.__members__) == {"float32", "bfloat16", "float16", "int32", "int64", "float64"}
    assert {n: int(v) for n, v in _C.Rule.__members__.items()} == RULES


def test_a_code_that_differs_is_named():
    wrong = fused.code_mismatches({**fused._FLOAT_CODES, torch.float16: 7, **fused._ID_CODES},
                                  {**RULES, "geometric": 5})
    assert wrong == ["dtype float16: 7 here, 2 in dcoco._C", "rule geometric: 5 here, 2 in dcoco._C"]
    missing = fused.code_mismatches(fused._FLOAT_CODES, {})
    assert "dtype int32: None here, 3 in dcoco._C" in missing and "rule greedy: None here, 0 in dcoco._C" in missing


@pytest.mark.parametrize("argument,codes", [("hidden_dtype", (9, 0, 0, 0)), ("ids_dtype", (0, 0, 0, 0)),
                                            ("logits_dtype", (0, 4, -1, 0)), ("embed_dtype", (0, 4, 0, 3))])
def test_forward_rejects_a_bad_dtype_code(argument, codes):
    h, i, lg, e = codes
    with pytest.raises(ValueError, match=f"^{argument}: expected the code of an? (float|id) dtype"):
        _C.forward(sizes=SIZES, hidden=0, hidden_dtype=h, cand_ids=0, ids_dtype=i, cand_logits=0, logits_dtype=lg,
                   embed=0, embed_dtype=e, table=0, weights=[], scores=0, ranks=0, tokens=0)


def test_select_and_table_reject_bad_codes():
    with pytest.raises(ValueError, match="^rule: expected a dcoco._C.Rule code .*got 3$"):
        _C.select(R=0, B=2, K=4, scores=0, first_logits=0, first_dtype=0, rule=3, lam=0.5, work=0, next=0, ranks=0)
    with pytest.raises(ValueError, match="^first_dtype: .*got 4$"):
        _C.select(R=0, B=2, K=4, scores=0, first_logits=0, first_dtype=4, rule=0, lam=0.5, work=0, next=0, ranks=0)
    with pytest.raises(ValueError, match="^embed_dtype: .*got 6$"):
        _C.cand_table(V=0, d=8, r=4, embed=0, embed_dtype=6, cand_proj=0, fuse_proj=0, table=0)
