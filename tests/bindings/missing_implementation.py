"""An engine release that lacks one alternative implementation: verl 0.5.0 has
``vocab_parallel_entropy`` but not ``vocab_parallel_entropy_with_chunking``. The op itself is bound (the
faithful entropy); its ``chunked`` implementation imports a module this "release" does not have, so the
findings of regime ``chunked@...`` are ``unavailable`` for that implementation, the others are checked."""

from rlconform.harness.catalog.binding import Binding, Implementation, Lazy
from rlconform.harness.core import faithful as F

binding = Binding(
    name="missing_implementation", version="0.5.0",
    ops={"entropy": F.entropy},
    implementations={"entropy": {"chunked": Implementation(
        Lazy("rlconform_no_such_engine.torch_functional:entropy_from_logits_with_chunking"), ranks=(2,),
        chunk_arg="chunk_size", doc="absent in this release")}},
)
