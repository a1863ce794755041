"""A binding with an op and an implementation that need CUDA: ``entropy`` is the
dtype-faithful entropy declared ``needs={"entropy": "cuda"}``, and ``token_logprobs@naive`` an
:class:`Implementation` declared ``needs="cuda"`` (as verl's Triton kernel is, ``fused_linear_token_stats@triton``),
so on a CPU run their findings must be ``unavailable: needs CUDA`` — reported, never skipped — while
``token_logprobs`` itself runs. ``masked_mean`` is the ``nan_times_mask`` mutant's (Σ(values·mask)/Σ mask: NaN
at a masked position leaks), so the same narrowed run also has a finding that fails, whose status must not
depend on whether ``--device cpu`` is given."""

from rlconform.harness.catalog.binding import Binding, Implementation
from rlconform.harness.core import faithful as F
from rlconform.harness.mutants.nan_times_mask import masked_mean

binding = Binding(name="needs_cuda", ops={"masked_mean": masked_mean, "entropy": F.entropy,
                                          "token_logprobs": F.token_logprobs},
                  needs={"entropy": "cuda"},
                  implementations={"token_logprobs": {"naive": Implementation(F.token_logprobs, needs="cuda")}})
