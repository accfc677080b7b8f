"""Readable text for expressions (used by repr, schedule printing and error messages).

The printer lives in expr.py, beside the nodes whose repr calls it; this module is the name the
layers above print through.
"""

from ansor.te.expr import expr_to_str

__all__ = ["expr_to_str"]
