"""A binding with an op that needs CUDA (issue 27 §2): ``entropy`` is the dtype-faithful entropy declared
``needs={"entropy": "cuda"}`` (as verl's Triton kernel is), so on a CPU run its findings must be
``unavailable: needs CUDA`` — reported, never skipped. ``masked_mean`` is the ``nan_times_mask`` mutant's
(Σ(values·mask)/Σ mask: NaN at a masked position leaks), so the same narrowed run also has a finding that
fails, whose status must not depend on whether ``--device cpu`` is given."""

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F
from rlconform.harness.mutants.nan_times_mask import masked_mean

binding = Binding(name="needs_cuda", ops={"masked_mean": masked_mean, "entropy": F.entropy},
                  needs={"entropy": "cuda"})
