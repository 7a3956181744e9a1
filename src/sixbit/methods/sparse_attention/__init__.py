"""Training-free block-sparse attention for video: windows over the (frame, row, column) grid.

Registered as the method ``"sparse_attention"``: chosen by a :class:`SparseAttentionConfig` in
``ConvertConfig.methods`` (stored with the config under the method's name).
"""

from ...config.sparse_attention import SparseAttentionConfig
from .mask import TokenGrid, ladder, window_table
from .method import (
    DENSE_ABOVE,
    SparseAttentionState,
    apply_sparse_attention,
    check_sparse_attention,
    describe_sparse_attention,
    remove_sparse_attention,
    sparse_attention_of,
)
from .spec import SPEC  # registers the method

__all__ = [
    "DENSE_ABOVE", "SPEC", "SparseAttentionConfig", "SparseAttentionState", "TokenGrid", "apply_sparse_attention",
    "check_sparse_attention", "describe_sparse_attention", "ladder", "remove_sparse_attention", "sparse_attention_of", "window_table",
]
